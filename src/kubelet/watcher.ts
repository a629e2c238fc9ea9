// Watches the kubelet's device-plugin socket directory (SocketDirWatcher, one per resource). When our
// socket is removed or replaced, or the kubelet's socket is (re)created, it asks for re-registration
// at once (inotify, through dir-watch.ts, which follows a re-created directory). A slow timer checks
// the same things, because inotify can miss events.
// SocketDirView, one per process and directory (the resource manager owns one however many resources
// share the directory; DRA mode one per directory it serves in), checks every second that this
// process still sees the directory it started with (see viewProblem below): a systemd service's
// private mount of it does not survive its deletion.
import { constants as fsConstants } from 'node:fs';
import { access, readFile, realpath, stat } from 'node:fs/promises';
import { basename, dirname, join } from 'node:path';
import { errorText } from '../system/log.ts';
import type { Logger } from '../system/log.ts';
import { CoalescingQueue, TimerOwner } from '../system/timers.ts';
import { DirectoryWatch } from './dir-watch.ts';
import type { DirEvent } from './dir-watch.ts';
import { fileIdentity } from './socket-identity.ts';

export interface WatcherDeps {
  kubeletSocket: string;
  pluginSocket: string;
  /** Identity of the socket we serve on, or null when not serving. */
  servedIdentity(): string | null;
  /** Identity of the kubelet socket we last tried to register through, or null before any try. */
  attemptedKubelet(): string | null;
  /** Something changed that asks for registering again; `ours`: our socket is gone or replaced. */
  onChange(reason: string, ours: boolean): void;
  /** The kubelet socket is gone (the kubelet stopped): whatever registration stood is lost. */
  onKubeletGone(reason: string): void;
  /** Another socket in the directory (another plugin's, `name` ending in .sock) was removed. */
  onOtherSocketRemoved?(name: string): void;
  checkIntervalMs: number;
  log: Logger;
}

export interface DirViewDeps {
  /** The socket directory. */
  dir: string;
  /**
   * This process can no longer serve in the socket directory, and only a restart can fix it: the
   * directory was deleted and this process's mount namespace lost it (`why` says how we know). See
   * viewProblem(). Reported once.
   */
  onDirectoryGone(dir: string, why: string): void;
  /** Interval of the check; default 1000 ms. */
  intervalMs?: number;
  log: Logger;
}

/** What was seen of the socket directory the first time it existed. */
interface DirView {
  /** device:inode */
  identity: string;
  /** A mount point of its own in this mount namespace (ReadWritePaths= makes one). */
  mounted: boolean;
  /** Not on a read-only mount. */
  writable: boolean;
}

/** Mount points in a mountinfo text (5th field; space, tab, newline and backslash octal-escaped). */
export function mountPoints(mountinfo: string): Set<string> {
  const out = new Set<string>();
  for (const line of mountinfo.split('\n')) {
    const field = line.split(' ')[4];
    if (field !== undefined)
      out.add(field.replace(/\\([0-7]{3})/g, (_m, oct: string) => String.fromCharCode(parseInt(oct, 8))));
  }
  return out;
}

/**
 * Why this process can no longer use the socket directory, or null while it can. `now` is the
 * directory as seen now (null: it does not exist), `start` as first seen; `mountedNow` and
 * `writableNow` are asked only when they matter.
 *
 * systemd's `ReadWritePaths=DIR` (with ProtectSystem=strict) bind-mounts DIR onto itself in the
 * service's mount namespace, over a read-only root. When DIR is deleted on the host the kernel drops
 * that mount: the service then sees whatever stands at DIR through the read-only root (nothing, or
 * the re-created directory with a normal link count), and every listen there fails with EROFS.
 * A kubelet restart only deletes files in DIR, which changes none of this.
 */
export async function viewProblem(
  start: DirView,
  now: { identity: string; nlink: number } | null,
  mountedNow: () => Promise<boolean>,
  writableNow: () => Promise<boolean>,
): Promise<string | null> {
  if (now !== null && now.nlink === 0) return 'the directory this process sees was deleted (link count 0)';
  // Not gated on a changed identity: a directory re-created at once may get the same inode number.
  if (start.mounted && !(await mountedNow())) {
    return now === null
      ? "the directory was deleted, and its mount in this process's mount namespace went with it"
      : "the directory was deleted and re-created, and its mount in this process's mount namespace went with it";
  }
  if (now !== null && start.writable && !(await writableNow()))
    return 'the directory is now on a read-only mount for this process (EROFS)';
  return null;
}

/** Reports (once) when this process lost the socket directory it first saw; one per process. */
export class SocketDirView {
  private readonly deps: DirViewDeps;
  private readonly dir: string;
  private readonly timers = new TimerOwner();
  /** One look at a time; a request meanwhile is answered by the next look. */
  private readonly checks = new CoalescingQueue<void>(
    () => this.check(),
    () => undefined,
  );
  private stopped = false;
  private view: DirView | undefined;
  private gone = false;
  /** The directory with symlinks resolved (as the mount table names it), once seen. */
  private realDir: string | undefined;

  constructor(deps: DirViewDeps) {
    this.deps = deps;
    this.dir = deps.dir;
  }

  get started(): boolean {
    return this.timers.has('check');
  }

  start(): void {
    if (this.started || this.stopped) return;
    void this.checks.request();
    this.timers.every('check', this.deps.intervalMs ?? 1000, () => void this.checks.request());
  }

  stop(): void {
    this.stopped = true;
    this.timers.dispose();
    void this.checks.close();
  }

  /** Looks now rather than at the next tick (a caller about to report a missing directory asks first). */
  checkNow(): Promise<void> {
    return this.checks.request();
  }

  private async mounted(): Promise<boolean> {
    const points = mountPoints(await readFile('/proc/self/mountinfo', 'utf8'));
    return points.has(this.dir) || (this.realDir !== undefined && points.has(this.realDir));
  }

  private async writable(): Promise<boolean> {
    try {
      await access(this.dir, fsConstants.W_OK);
      return true;
    } catch (err) {
      return (err as NodeJS.ErrnoException).code !== 'EROFS';
    }
  }

  private async seenNow(): Promise<{ identity: string; nlink: number } | null> {
    try {
      const st = await stat(this.dir);
      return { identity: `${st.dev}:${st.ino}`, nlink: st.nlink };
    } catch (err) {
      if ((err as NodeJS.ErrnoException).code !== 'ENOENT') throw err;
      return null;
    }
  }

  private async record(identity: string): Promise<void> {
    this.view = { identity, mounted: await this.mounted(), writable: await this.writable() };
  }

  /** Records the directory as first seen, then reports (once) when this process lost it. */
  private async check(): Promise<void> {
    if (this.stopped || this.gone) return;
    try {
      const now = await this.seenNow();
      if (this.view === undefined) {
        if (now === null) return;
        this.realDir = await realpath(this.dir).catch(() => undefined);
        await this.record(now.identity);
        return;
      }
      const why = await viewProblem(
        this.view,
        now,
        () => this.mounted(),
        () => this.writable(),
      );
      if (why !== null && !this.stopped) {
        this.gone = true;
        this.deps.onDirectoryGone(this.dir, why);
      } else if (now !== null && now.identity !== this.view.identity) {
        // Re-created where this process still sees it properly (no private mount of it): use it.
        await this.record(now.identity);
      }
    } catch (err) {
      this.deps.log.debug('socket directory view check failed', { dir: this.dir, error: errorText(err) });
    }
  }
}

export class SocketDirWatcher {
  private readonly deps: WatcherDeps;
  private readonly dir: string;
  private readonly watch: DirectoryWatch;
  private readonly timers = new TimerOwner();
  private stopped = false;

  constructor(deps: WatcherDeps) {
    this.deps = deps;
    this.dir = dirname(deps.kubeletSocket);
    this.watch = new DirectoryWatch({ dir: this.dir, onEvent: (e) => this.dirEvent(e), log: deps.log });
  }

  /** Resolves once the first attempt to watch the directory is over (watching or not). */
  opened: Promise<void> = Promise.resolve();

  start(): void {
    this.opened = this.watch.start();
    this.timers.every('check', this.deps.checkIntervalMs, () => void this.check('periodic check'));
  }

  stop(): void {
    this.stopped = true;
    this.timers.dispose();
    this.watch.stop();
  }

  private dirEvent(e: DirEvent): void {
    if (e.kind === 'deleted') return;
    if (e.kind === 'recreated') {
      void this.check('socket directory re-created');
      return;
    }
    const name = e.name;
    if (name === basename(this.deps.kubeletSocket)) void this.kubeletEvent();
    else if (name === basename(this.deps.pluginSocket)) void this.check('plugin socket changed');
    else if (name === undefined) void this.check('directory changed');
    else if (name.endsWith('.sock')) void this.otherEvent(name);
  }

  /** Another plugin's socket appeared or went: said when it went. */
  private async otherEvent(name: string): Promise<void> {
    try {
      if ((await fileIdentity(join(this.dir, name))) === null && !this.stopped) this.deps.onOtherSocketRemoved?.(name);
    } catch (err) {
      this.deps.log.debug('cannot stat a socket in the socket directory', { socket: name, error: errorText(err) });
    }
  }

  /** The kubelet socket appeared or went: re-register when it exists and is not the one we used. */
  private async kubeletEvent(): Promise<void> {
    try {
      const id = await fileIdentity(this.deps.kubeletSocket);
      if (id === null) this.deps.onKubeletGone('kubelet socket removed');
      else if (id !== this.deps.attemptedKubelet()) this.deps.onChange('kubelet socket created', false);
    } catch (err) {
      this.deps.log.debug('cannot stat the kubelet socket', { error: errorText(err) });
    }
  }

  async check(reason: string): Promise<void> {
    if (this.stopped) return;
    await this.watch.refresh();
    try {
      const served = this.deps.servedIdentity();
      const ours = await fileIdentity(this.deps.pluginSocket);
      if (served !== null && ours !== served) {
        this.deps.onChange(ours === null ? 'plugin socket removed' : 'plugin socket replaced', true);
        return;
      }
      const kubelet = await fileIdentity(this.deps.kubeletSocket);
      if (kubelet === null) this.deps.onKubeletGone(`kubelet socket removed (${reason})`);
      else if (kubelet !== this.deps.attemptedKubelet())
        this.deps.onChange(`kubelet socket changed (${reason})`, false);
    } catch (err) {
      this.deps.log.debug('socket check failed', { error: errorText(err) });
    }
  }
}
