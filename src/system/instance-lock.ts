// One plugin per socket directory. Two plugins serving one kubelet directory re-register each other
// in turn (each one's registration replaces the other's socket for the kubelet), so a second process
// started there — the natural way to troubleshoot is to run it by hand with --log-level=debug while
// the service is up — refuses to start, naming the running one.
//
// The lock is flock(2) on the socket directory itself, held on an open descriptor of it:
// - the kernel drops it when the holder exits, however it exits (a crash never leaves it stale);
// - it belongs to the directory's inode, so the service (its own mount namespace, PrivateTmp=,
//   PrivateNetwork=, where abstract sockets and /tmp are private) and a process run by hand on the
//   host see the same lock; no file is created, so the kubelet's clean-up of every file in the
//   directory but kubelet.sock at its start cannot remove it;
// - the holder's PID is read from /proc/locks (flock has no F_GETLK), by the directory's device and
//   inode.
// A directory that is missing at start, or deleted and re-created, is locked once it appears (checked
// every second); a plugin that finds the new directory held by another one stops.
import { closeSync, constants as fsConstants, fstatSync, openSync } from 'node:fs';
import { readFile } from 'node:fs/promises';
import { errorText } from './log.ts';
import type { Logger } from './log.ts';
import { loadKoffi } from './native.ts';
import type { Koffi } from './native.ts';

const LOCK_EX = 2;
const LOCK_NB = 4;
const EWOULDBLOCK = 11;

/** Another plugin holds the directory; the message names it (and its PID when /proc/locks shows it). */
export class AlreadyRunningError extends Error {
  override name = 'AlreadyRunningError';
  readonly pid: number | null;
  /** hint: how to run this one elsewhere (default: a --kubelet-socket in another directory). */
  constructor(dir: string, pid: number | null, hint = 'give this one a --kubelet-socket in another directory') {
    const who = pid === null ? 'another gpu-device-plugin process' : `another gpu-device-plugin (PID ${pid})`;
    super(
      `${who} already serves the socket directory ${dir}; stop it ` +
        `first (the service: systemctl stop gpu-device-plugin), or ${hint}`,
    );
    this.pid = pid;
  }
}

type Flock = (fd: number, op: number) => number;
let flockFn: Flock | undefined;
function flock(koffi: Koffi): Flock {
  flockFn ??= koffi.load('libc.so.6').func('int flock(int fd, int operation)') as Flock;
  return flockFn;
}

/** A device number as /proc/locks writes it: major:minor in hex (two digits at least). */
export function procLocksDevice(dev: bigint): string {
  const major = ((dev >> 8n) & 0xfffn) | ((dev >> 32n) & 0xfffff000n);
  const minor = (dev & 0xffn) | ((dev >> 12n) & 0xffffff00n);
  const hex = (n: bigint): string => n.toString(16).padStart(2, '0');
  return `${hex(major)}:${hex(minor)}`;
}

/**
 * The PID holding a FLOCK write lock on the inode `ino` of device `dev` in a /proc/locks text, or null.
 * Lines look like `3: FLOCK  ADVISORY  WRITE 1234 08:01:5678 0 EOF` (waiters, `3: -> FLOCK …`, are
 * skipped). The device is matched when it is the one stat gave; some file systems (overlayfs) show
 * another one there, so an inode that only one lock names is taken too.
 */
export function lockHolder(procLocks: string, dev: bigint, ino: bigint): number | null {
  const exact: number[] = [];
  const byInode: number[] = [];
  const device = procLocksDevice(dev);
  for (const line of procLocks.split('\n')) {
    const m = /^\d+:\s+FLOCK\s+\S+\s+WRITE\s+(\d+)\s+([0-9a-f]+:[0-9a-f]+):(\d+)\s/.exec(line);
    if (m === null || BigInt(m[3] ?? '-1') !== ino) continue;
    const pid = Number(m[1]);
    byInode.push(pid);
    if (m[2] === device) exact.push(pid);
  }
  if (exact.length > 0) return exact[0] ?? null;
  return byInode.length === 1 ? (byInode[0] ?? null) : null;
}

export type LockAttempt =
  | { state: 'held'; identity: string }
  | { state: 'missing' }
  | { state: 'busy'; error: AlreadyRunningError };

export class InstanceLock {
  private readonly koffi: Koffi;
  private readonly dir: string;
  private fd: number | undefined;
  private identity: string | undefined;
  private timer: NodeJS.Timeout | undefined;
  private readonly hint: string | undefined;

  constructor(koffi: Koffi, dir: string, hint?: string) {
    this.koffi = koffi;
    this.dir = dir;
    this.hint = hint;
  }

  /** Whether this process holds the lock on the directory as it is now. */
  get held(): boolean {
    return this.fd !== undefined;
  }

  /** Tries once to lock the directory as it is now (a lock on an older one of the same path is let go). */
  async tryLock(): Promise<LockAttempt> {
    let fd: number;
    try {
      fd = openSync(this.dir, fsConstants.O_RDONLY | fsConstants.O_DIRECTORY);
    } catch (err) {
      if ((err as NodeJS.ErrnoException).code === 'ENOENT') return { state: 'missing' };
      throw err;
    }
    const st = fstatSync(fd, { bigint: true });
    const identity = `${st.dev}:${st.ino}`;
    if (identity === this.identity && this.fd !== undefined) {
      closeSync(fd);
      return { state: 'held', identity };
    }
    if (flock(this.koffi)(fd, LOCK_EX | LOCK_NB) !== 0) {
      const errno = this.koffi.errno();
      closeSync(fd);
      if (errno !== EWOULDBLOCK) throw new Error(`flock(${this.dir}) failed with errno ${errno}`);
      const pid = lockHolder(await readFile('/proc/locks', 'utf8').catch(() => ''), st.dev, st.ino);
      return { state: 'busy', error: new AlreadyRunningError(this.dir, pid, this.hint) };
    }
    if (this.fd !== undefined) closeSync(this.fd);
    this.fd = fd;
    this.identity = identity;
    return { state: 'held', identity };
  }

  /**
   * Keeps the lock on whatever directory stands at the path: locks it when it appears (missing at
   * start, or deleted and re-created); onBusy when another plugin has it first.
   */
  follow(onBusy: (err: AlreadyRunningError) => void, intervalMs = 1000): void {
    if (this.timer !== undefined) return;
    let checking = false;
    this.timer = setInterval(() => {
      if (checking) return;
      checking = true;
      void this.tryLock()
        .then(
          (r) => {
            if (r.state === 'busy') {
              this.release();
              onBusy(r.error);
            }
          },
          () => undefined,
        )
        .finally(() => {
          checking = false;
        });
    }, intervalMs);
    this.timer.unref();
  }

  release(): void {
    if (this.timer !== undefined) clearInterval(this.timer);
    this.timer = undefined;
    if (this.fd !== undefined) closeSync(this.fd);
    this.fd = undefined;
    this.identity = undefined;
  }
}

/**
 * The daemon's lock on its socket directory, taken at start: the lock (kept from then on on whatever
 * directory stands at the path, onBusy when another plugin took a new one first), the
 * AlreadyRunningError when another plugin holds it, or null when the native module cannot be loaded
 * (the start then fails on that, saying so).
 */
export async function lockSocketDirectory(
  dir: string,
  log: Logger,
  onBusy: (err: AlreadyRunningError) => void,
  hint?: string,
): Promise<InstanceLock | AlreadyRunningError | null> {
  let koffi: Koffi;
  try {
    koffi = loadKoffi();
  } catch {
    return null;
  }
  const lock = new InstanceLock(koffi, dir, hint);
  let r: LockAttempt;
  try {
    r = await lock.tryLock();
  } catch (err) {
    log.warn('cannot lock the socket directory; a second plugin started there would not be refused', {
      dir,
      error: errorText(err),
    });
    return null;
  }
  if (r.state === 'busy') return r.error;
  lock.follow(onBusy);
  return lock;
}
