// The program's exit codes, one meaning each, for the operator, scripts and systemd (the unit stops
// restarting on EXIT_CONFIG: RestartPreventExitStatus=2).
//   0  a clean stop; --version, --help, a subcommand that found nothing wrong
//   1  the plugin could not start or stop cleanly, or a check failed (systemd restarts the service)
//   2  a configuration error: an option, environment variable or config file entry is invalid, or
//      the config file does not fit the node (a GPU it names is not there); nothing is retried
//   3  another gpu-device-plugin already serves the socket directory (the line names its PID)
import { AlreadyRunningError } from '../system/instance-lock.ts';
import { SharingError } from '../core/sharing.ts';
import { OptionError } from './config.ts';

export const EXIT_OK = 0;
export const EXIT_FAILURE = 1;
export const EXIT_CONFIG = 2;
export const EXIT_ALREADY_RUNNING = 3;

/** The exit code of a start that failed with err. */
export function exitCodeFor(err: unknown): number {
  if (err instanceof OptionError || err instanceof SharingError) return EXIT_CONFIG;
  if (err instanceof AlreadyRunningError) return EXIT_ALREADY_RUNNING;
  return EXIT_FAILURE;
}
