// The program's exit codes, one meaning each, for the operator, scripts and systemd (the unit stops
// restarting on EXIT_CONFIG: RestartPreventExitStatus=2).
//   0  a clean stop; --version, --help, a subcommand that found nothing wrong
//   1  the plugin could not start or stop cleanly, or a check failed (systemd restarts the service)
//   2  a configuration error: an option, environment variable or config file entry is invalid, or
//      the configuration does not fit the node (a GPU the config file names is not there, a MIG
//      strategy the GPUs' layout does not allow); nothing is retried
//   3  another gpu-device-plugin already serves the socket directory (the line names its PID)
import { AlreadyRunningError } from '../system/instance-lock.ts';
import { errorText, exitProcess } from '../system/log.ts';
import type { Logger } from '../system/log.ts';
import { notifyBeforeExit } from '../system/service-status.ts';
import { MigStrategyError } from '../core/mig-strategies.ts';
import { SharingError } from '../core/sharing.ts';
import { ConfigError, OptionError } from './errors.ts';

const EXIT_FAILURE = 1;
const EXIT_CONFIG = 2;
const EXIT_ALREADY_RUNNING = 3;

/** The exit code of a start that failed with err. */
function exitCodeFor(err: unknown): number {
  if (err instanceof OptionError || err instanceof SharingError || err instanceof MigStrategyError) return EXIT_CONFIG;
  if (err instanceof AlreadyRunningError) return EXIT_ALREADY_RUNNING;
  return EXIT_FAILURE;
}

/**
 * A start failure as the operator should read it: a config file's section that does not fit the node names
 * the file.
 */
export function startError(err: unknown, configFile: string | null): unknown {
  return err instanceof SharingError && configFile !== null
    ? new ConfigError(`config file ${configFile}: ${err.message}`)
    : err;
}

/** A start that failed: said once, to the log and to systemd (STATUS=), and the exit code says what kind. */
export function cannotStart(err: unknown, log: Logger, service?: { failed(err: unknown, what: string): void }): never {
  log.error('cannot start', { error: errorText(err) });
  const code = exitCodeFor(err);
  service?.failed(err, code === EXIT_CONFIG ? 'configuration error' : 'cannot start');
  return exitProcess(code);
}

/** Another plugin holds the socket directory: one line naming it, to the log and to systemd, and exit 3. */
export function refuseSecondInstance(err: AlreadyRunningError, log: Logger): never {
  log.error(err.message);
  notifyBeforeExit(`STATUS=${err.message}`);
  return exitProcess(EXIT_ALREADY_RUNNING);
}

/** Options that cannot be parsed: said on stderr (there is no logger yet) and to systemd, exit 2. */
export function badOptions(err: unknown): void {
  process.stderr.write(`gpu-device-plugin: ${errorText(err)}\n`);
  notifyBeforeExit(`STATUS=configuration error: ${errorText(err)}`);
  process.exitCode = EXIT_CONFIG;
}
