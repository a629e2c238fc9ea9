// The daemon's state file for `gpu-device-plugin info` (content: core/daemon-state.ts): root-only
// (0600), in the service's runtime directory ($RUNTIME_DIRECTORY, /run/gpu-device-plugin under the
// unit), replaced atomically on every publish, removed at stop. A write that fails is logged once
// and never stops the daemon. `info` finds the file the same way (GPU_DEVICE_PLUGIN_STATE_FILE, else
// the runtime directory) and trusts it only while the pid in it is alive.
import { mkdir, readFile } from 'node:fs/promises';
import { dirname, join } from 'node:path';
import { parseStateDocument, stateDocument } from '../core/daemon-state.ts';
import type { DaemonState } from '../core/daemon-state.ts';
import { AtomicFile } from '../system/atomic-file.ts';
import type { Logger } from '../system/log.ts';
import { errorText } from '../system/log.ts';

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

export class StateFile {
  private readonly file: AtomicFile;
  private readonly log: Logger;
  private failing = false;
  private dirMade = false;
  private closed = false;

  constructor(path: string, log: Logger) {
    this.file = new AtomicFile(path, 0o600);
    this.log = log;
  }

  get path(): string {
    return this.file.path;
  }

  /** Replaces the file with this state; never throws (a failure is logged once, until a write works again). */
  async publish(state: DaemonState): Promise<void> {
    // After remove() (the daemon stops) nothing brings the file back.
    if (this.closed) return;
    try {
      // Run by hand there is no RuntimeDirectory=: make the directory as systemd would (root-only).
      if (!this.dirMade) await mkdir(dirname(this.file.path), { recursive: true, mode: 0o700 });
      this.dirMade = true;
      await this.file.write(stateDocument(state));
      if (this.failing) this.log.info('state file written again', { file: this.file.path });
      this.failing = false;
    } catch (err) {
      if (!this.failing)
        this.log.warn("cannot publish the state for `gpu-device-plugin info`; it will show NVML's view instead", {
          file: this.file.path,
          error: errorText(err),
        });
      this.failing = true;
    }
  }

  async remove(): Promise<void> {
    this.closed = true;
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
