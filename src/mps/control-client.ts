// The MPS control client: one command written to the stdin of `nvidia-cuda-mps-control` run without
// arguments, in the environment that names the control daemon's pipe and log directories.
// Used by the control daemon unit (to set the default limits) and by the plugin (to ask whether a
// daemon answers). The program runs as a child process: nothing here blocks the event loop, and a
// daemon that hangs is answered by a timeout that kills the client.
import { spawn } from 'node:child_process';
import { findDriverProgram } from '../system/driver-program.ts';

/** The program's file name (NVIDIA's). */
export const MPS_CONTROL_PROGRAM = 'nvidia-cuda-mps-control';

/** Where one control daemon lives. */
export interface MpsDaemonDirs {
  /** CUDA_MPS_PIPE_DIRECTORY: its `control` socket. */
  readonly pipeDir: string;
  /** CUDA_MPS_LOG_DIRECTORY: its control.log. */
  readonly logDir: string;
}

/** The environment the control program (daemon or client) runs in. */
export function mpsEnvironment(
  dirs: MpsDaemonDirs,
  visibleDevices?: readonly string[],
  base: NodeJS.ProcessEnv = process.env,
): NodeJS.ProcessEnv {
  // The control program reads CUDA_VISIBLE_DEVICES; a client run gets none, so it is never inherited.
  const { CUDA_VISIBLE_DEVICES: _inherited, ...rest } = base;
  const env: NodeJS.ProcessEnv = {
    ...rest,
    CUDA_MPS_PIPE_DIRECTORY: dirs.pipeDir,
    CUDA_MPS_LOG_DIRECTORY: dirs.logDir,
  };
  return visibleDevices === undefined ? env : { ...env, CUDA_VISIBLE_DEVICES: visibleDevices.join(',') };
}

/** A command that did not get an answer: which command, which daemon, and why. */
export class MpsControlError extends Error {
  override name = 'MpsControlError';
  readonly command: string;
  readonly pipeDir: string;
  readonly reason: string;
  constructor(command: string, pipeDir: string, reason: string) {
    super(`MPS control command ${JSON.stringify(command)} for the daemon at ${pipeDir}: ${reason}`);
    this.command = command;
    this.pipeDir = pipeDir;
    this.reason = reason;
  }
}

/** The control program: under the driver root's usual binary folders first, then on PATH. */
export function findMpsControl(
  driverRoot: string,
  path: string | undefined = process.env.PATH,
): Promise<{ path: string } | { looked: string[] }> {
  return findDriverProgram(MPS_CONTROL_PROGRAM, driverRoot, path);
}

export interface MpsCommandOptions {
  /** Kill the client and fail after this long (default 5000 ms). */
  readonly timeoutMs?: number;
  /** Base environment (default process.env). */
  readonly env?: NodeJS.ProcessEnv;
}

/**
 * Runs one command through the control client and returns its answer (stdout, trimmed). Throws
 * MpsControlError when the client cannot run, exits non-zero (its stderr is the reason: "Cannot find
 * MPS control daemon process" when none runs), or does not finish within the timeout.
 */
export function mpsCommand(
  program: string,
  dirs: MpsDaemonDirs,
  command: string,
  options: MpsCommandOptions = {},
): Promise<string> {
  const timeoutMs = options.timeoutMs ?? 5000;
  return new Promise((resolve, reject) => {
    const child = spawn(program, [], {
      env: mpsEnvironment(dirs, undefined, options.env),
      stdio: ['pipe', 'pipe', 'pipe'],
    });
    let out = '';
    let err = '';
    let settled = false;
    const finish = (result: { answer: string } | { reason: string }): void => {
      if (settled) return;
      settled = true;
      clearTimeout(timer);
      if ('answer' in result) resolve(result.answer);
      else reject(new MpsControlError(command, dirs.pipeDir, result.reason));
    };
    const timer = setTimeout(() => {
      child.kill('SIGKILL');
      finish({ reason: `no answer within ${timeoutMs} ms` });
    }, timeoutMs);
    child.stdout.setEncoding('utf8').on('data', (d: string) => {
      out += d;
    });
    child.stderr.setEncoding('utf8').on('data', (d: string) => {
      err += d;
    });
    child.on('error', (e) => finish({ reason: `cannot run ${program}: ${e.message}` }));
    child.on('close', (code, signal) => {
      if (code === 0) finish({ answer: out.trim() });
      else
        finish({
          reason:
            `${program} ${signal !== null ? `was killed by ${signal}` : `exited with status ${code}`}` +
            `${err.trim() ? `: ${err.trim()}` : out.trim() ? `: ${out.trim()}` : ''}`,
        });
    });
    child.stdin.on('error', () => {
      /* the client may exit before reading; its status says why */
    });
    child.stdin.end(`${command}\n`);
  });
}
