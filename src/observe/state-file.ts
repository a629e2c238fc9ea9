// The daemon's state file for `gpu-device-plugin info` (content: core/daemon-state.ts): root-only
// (0600), in the service's runtime directory ($RUNTIME_DIRECTORY, /run/gpu-device-plugin under the
// unit), replaced atomically on every publish, removed at stop. A write that fails is logged once,
// tried again (1 s doubling to 60 s) with the newest state until it works, and never stops the daemon;
// the directory is made again whenever it is missing (someone removed it), not only the first time.
// `info` finds the file the same way (GPU_DEVICE_PLUGIN_STATE_FILE, else the runtime directory) and
// trusts it only while the pid in it is alive.
import { mkdir, readFile } from 'node:fs/promises';
import { dirname, join } from 'node:path';
import { parseStateDocument, stateDocument } from '../core/daemon-state.ts';
import type { DaemonState } from '../core/daemon-state.ts';
import { AtomicFile } from '../system/atomic-file.ts';
import type { Logger } from '../system/log.ts';
import { errorText } from '../system/log.ts';
import { TimerOwner } from '../system/timers.ts';

/** Read by defaultStateFile (written out there, so the man page's source scan sees it). */
export const STATE_FILE_ENV = 'GPU_DEVICE_PLUGIN_STATE_FILE';
export const DEFAULT_RUNTIME_DIRECTORY = '/run/gpu-device-plugin';

/**
 * Where the state file is: GPU_DEVICE_PLUGIN_STATE_FILE, else state.json in $RUNTIME_DIRECTORY, else in
 * /run/gpu-device-plugin.
 */
export function defaultStateFile(env: Readonly<Record<string, string | undefined>>): string {
  const given = env.GPU_DEVICE_PLUGIN_STATE_FILE;
  if (given !== undefined && given !== '') return given;
  const runtime = (env.RUNTIME_DIRECTORY ?? '').split(':')[0];
  return join(runtime !== undefined && runtime !== '' ? runtime : DEFAULT_RUNTIME_DIRECTORY, 'state.json');
}

/** A failed write of the state file is tried again after this, doubling up to STATE_RETRY_MAX_MS. */
export const STATE_RETRY_FIRST_MS = 1000;
export const STATE_RETRY_MAX_MS = 60_000;

export class StateFile {
  private readonly file: AtomicFile;
  private readonly log: Logger;
  private readonly timers = new TimerOwner();
  private failing = false;
  private closed = false;
  private retryMs = STATE_RETRY_FIRST_MS;
  /** The newest state published (what a retry writes). */
  private latest: DaemonState | undefined;
  private writing: Promise<void> = Promise.resolve();

  constructor(path: string, log: Logger) {
    this.file = new AtomicFile(path, 0o600);
    this.log = log;
  }

  get path(): string {
    return this.file.path;
  }

  /**
   * Replaces the file with this state; never throws (a failure is logged once, until a write works again,
   * and the newest state is tried again later).
   */
  publish(state: DaemonState): Promise<void> {
    this.latest = state;
    this.writing = this.write();
    return this.writing;
  }

  /** Resolves when the write started last (by a publish or a retry) has ended. */
  settled(): Promise<void> {
    return this.writing;
  }

  private async write(): Promise<void> {
    const state = this.latest;
    // After remove() (the daemon stops) nothing brings the file back.
    if (this.closed || state === undefined) return;
    try {
      // Run by hand there is no RuntimeDirectory=, and someone may have removed it: make the directory as
      // systemd would (root-only); a no-op when it is there.
      await mkdir(dirname(this.file.path), { recursive: true, mode: 0o700 });
      await this.file.write(stateDocument(state));
      if (this.failing) this.log.info('state file written again', { file: this.file.path });
      this.failing = false;
      this.retryMs = STATE_RETRY_FIRST_MS;
      this.timers.clear('retry');
    } catch (err) {
      if (!this.failing)
        this.log.warn(
          "cannot publish the state for `gpu-device-plugin info`; it will show NVML's view instead; trying again",
          { file: this.file.path, error: errorText(err) },
        );
      this.failing = true;
      this.timers.after('retry', this.retryMs, () => {
        this.writing = this.write();
      });
      this.retryMs = Math.min(this.retryMs * 2, STATE_RETRY_MAX_MS);
    }
  }

  async remove(): Promise<void> {
    this.closed = true;
    this.timers.dispose();
    await this.file.remove().catch(() => undefined);
  }
}

/** When each thing (a device's health, a resource's registration) took its present value. */
export class SinceTracker {
  private readonly seen = new Map<string, { value: string; since: string }>();

  /** The time `key` took `value`: `now` when it differs from the last value seen. */
  since(key: string, value: string, now: string): string {
    const was = this.seen.get(key);
    if (was !== undefined && was.value === value) return was.since;
    this.seen.set(key, { value, since: now });
    return now;
  }
}

/** Whether process `pid` exists (EPERM: it does, owned by someone else). */
export function pidAlive(pid: number): boolean {
  if (!Number.isInteger(pid) || pid <= 0) return false;
  try {
    process.kill(pid, 0);
    return true;
  } catch (err) {
    return (err as NodeJS.ErrnoException).code === 'EPERM';
  }
}

export type StateRead =
  | { readonly kind: 'running'; readonly path: string; readonly state: DaemonState }
  | { readonly kind: 'stale'; readonly path: string; readonly pid: number }
  | { readonly kind: 'absent'; readonly path: string }
  | { readonly kind: 'unreadable'; readonly path: string; readonly error: string };

/** The running daemon's published state, or why there is none. */
export async function readDaemonState(path: string): Promise<StateRead> {
  let text: string;
  try {
    text = await readFile(path, 'utf8');
  } catch (err) {
    const code = (err as NodeJS.ErrnoException).code;
    if (code === 'ENOENT') return { kind: 'absent', path };
    return {
      kind: 'unreadable',
      path,
      error: `${errorText(err)}${code === 'EACCES' ? ' (the file is root-only: run info as root)' : ''}`,
    };
  }
  const parsed = parseStateDocument(text);
  if ('problem' in parsed) return { kind: 'unreadable', path, error: `${path}: ${parsed.problem}` };
  const pid = parsed.state.pid;
  if (pid === process.pid || !pidAlive(pid)) return { kind: 'stale', path, pid };
  return { kind: 'running', path, state: parsed.state };
}
