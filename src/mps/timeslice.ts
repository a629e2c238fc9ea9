// Time-slicing's host side: one GPU's interval set by running nvidia-smi as NVIDIA's DRA driver does
// (`nvidia-smi compute-policy -i <uuid> --set-timeslice <n>`). The program runs as a child process, so
// nothing here blocks the event loop, and one that hangs (as nvidia-smi does on a GPU that stopped
// answering) is killed at a timeout. Which GPUs get which interval is decided in core/dra-timeslice.ts.
import { spawn } from 'node:child_process';
import { type TimeSliceChange, type TimeSliceInterval, timeSliceArgs, timeSliceNumber } from '../core/dra-timeslice.ts';
import type { Logger } from '../system/log.ts';
import { findDriverProgram } from '../system/driver-program.ts';

export interface TimeSliceOptions {
  /** The nvidia-smi to run (a path). */
  readonly nvidiaSmi: string;
  readonly log: Logger;
  /** Kill nvidia-smi and fail after this long (default 10000 ms). */
  readonly timeoutMs?: number;
  /** Its environment (default process.env). */
  readonly env?: NodeJS.ProcessEnv;
}

/** A GPU whose interval could not be set: which GPU, which command, and why (nvidia-smi's own words). */
export class TimeSliceError extends Error {
  override name = 'TimeSliceError';
  readonly gpuUuid: string;
  readonly interval: TimeSliceInterval;
  /** The program and its arguments. */
  readonly command: readonly string[];
  /** Its exit status; null when it was killed or never ran. */
  readonly status: number | null;
  /** What it wrote to stderr (or to stdout when stderr was empty), trimmed. */
  readonly output: string;
  constructor(
    gpuUuid: string,
    interval: TimeSliceInterval,
    command: readonly string[],
    status: number | null,
    reason: string,
    output: string,
  ) {
    super(
      `setting time-slice ${interval} on GPU ${gpuUuid} failed: \`${command.join(' ')}\` ${reason}` +
        `${output ? `: ${output}` : ''}`,
    );
    this.gpuUuid = gpuUuid;
    this.interval = interval;
    this.command = command;
    this.status = status;
    this.output = output;
  }
}

type Outcome = { status: number | null; reason: string; stdout: string; stderr: string };

function runProgram(program: string, args: readonly string[], timeoutMs: number, env: NodeJS.ProcessEnv) {
  return new Promise<Outcome>((resolve) => {
    const child = spawn(program, args, { env, stdio: ['ignore', 'pipe', 'pipe'] });
    let stdout = '';
    let stderr = '';
    let settled = false;
    const finish = (status: number | null, reason: string): void => {
      if (settled) return;
      settled = true;
      clearTimeout(timer);
      resolve({ status, reason, stdout: stdout.trim(), stderr: stderr.trim() });
    };
    const timer = setTimeout(() => {
      child.kill('SIGKILL');
      finish(null, `did not finish within ${timeoutMs} ms and was killed`);
    }, timeoutMs);
    child.stdout.setEncoding('utf8').on('data', (d: string) => {
      stdout += d;
    });
    child.stderr.setEncoding('utf8').on('data', (d: string) => {
      stderr += d;
    });
    child.on('error', (e) => finish(null, `could not run: ${e.message}`));
    child.on('close', (code, signal) =>
      finish(code, signal !== null ? `was killed by ${signal}` : `exited with status ${code}`),
    );
  });
}

/** Sets one GPU's time-slice interval; throws TimeSliceError (GPU, command, nvidia-smi's words) when it fails. */
export async function applyTimeSlice(
  gpu: { readonly uuid: string },
  interval: TimeSliceInterval,
  opts: TimeSliceOptions,
): Promise<void> {
  const args = timeSliceArgs(gpu.uuid, interval);
  const command = [opts.nvidiaSmi, ...args];
  const outcome = await runProgram(opts.nvidiaSmi, args, opts.timeoutMs ?? 10_000, opts.env ?? process.env);
  if (outcome.status !== 0) {
    throw new TimeSliceError(
      gpu.uuid,
      interval,
      command,
      outcome.status,
      outcome.reason,
      outcome.stderr || outcome.stdout,
    );
  }
  opts.log.info('time-slice set', { gpu: gpu.uuid, interval, value: timeSliceNumber(interval) });
}

/** Runs the changes one after another; the first that fails stops the rest and is thrown. */
export async function applyTimeSliceChanges(
  changes: readonly TimeSliceChange[],
  opts: TimeSliceOptions,
): Promise<void> {
  for (const change of changes) {
    await applyTimeSlice({ uuid: change.gpuUuid }, change.to, opts);
  }
}

export const NVIDIA_SMI = 'nvidia-smi';

/** nvidia-smi under the driver root, then on PATH; the bare name when neither has it (its run then fails saying so). */
export async function findNvidiaSmi(driverRoot: string, path: string | undefined = process.env.PATH): Promise<string> {
  const found = await findDriverProgram(NVIDIA_SMI, driverRoot, path);
  return 'path' in found ? found.path : NVIDIA_SMI;
}
