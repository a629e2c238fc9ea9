// Watches the kubelet's socket directory. When our socket is removed or replaced, or the kubelet's
// socket is (re)created, it asks for re-registration at once (inotify through fs.watch). A watch on
// the directory's parent moves that watch to a re-created directory (an inotify watch stays on the
// directory it was opened on). A slow timer checks the same things, because inotify can miss events.
// SocketDirView, one per process (the resource manager owns it, however many resources share the
// directory), checks every second that this process still sees the directory it started with (see
// viewProblem below): a systemd service's private mount of it does not survive its deletion.
import { constants as fsConstants, watch } from 'node:fs';
import { access, readFile, realpath, stat } from 'node:fs/promises';
import type { FSWatcher } from 'node:fs';
import { basename, dirname, join } from 'node:path';
import { errorText } from '../system/log.ts';
import { fileIdentity } from './socket-identity.ts';
import type { Logger } from '../system/log.ts';

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
  private timer: NodeJS.Timeout | undefined;
  private stopped = false;
  private view: DirView | undefined;
  private checking = false;
  private gone = false;
  /** The directory with symlinks resolved (as the mount table names it), once seen. */
  private realDir: string | undefined;

  constructor(deps: DirViewDeps) {
    this.deps = deps;
    this.dir = deps.dir;
  }

  get started(): boolean {
    return this.timer !== undefined;
  }

  start(): void {
    if (this.timer !== undefined || this.stopped) return;
    void this.check();
    this.timer = setInterval(() => void this.check(), this.deps.intervalMs ?? 1000);
    this.timer.unref();
  }

  stop(): void {
    this.stopped = true;
    if (this.timer !== undefined) clearInterval(this.timer);
  }

  /** Looks now rather than at the next tick (a caller about to report a missing directory asks first). */
  checkNow(): Promise<void> {
    return this.check();
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

  /** Records the directory as first seen, then reports (once) when this process lost it. */
  private async check(): Promise<void> {
    if (this.stopped || this.gone || this.checking) return;
    this.checking = true;
    try {
      let st: { dev: number; ino: number; nlink: number } | null = null;
      try {
        st = await stat(this.dir);
      } catch (err) {
        if ((err as NodeJS.ErrnoException).code !== 'ENOENT') throw err;
      }
      const now = st === null ? null : { identity: `${st.dev}:${st.ino}`, nlink: st.nlink };
      if (this.view === undefined) {
        if (now === null) return;
        this.realDir = await realpath(this.dir).catch(() => undefined);
        this.view = { identity: now.identity, mounted: await this.mounted(), writable: await this.writable() };
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
        this.view = { identity: now.identity, mounted: await this.mounted(), writable: await this.writable() };
      }
    } catch (err) {
      this.deps.log.debug('socket directory view check failed', { dir: this.dir, error: errorText(err) });
    } finally {
      this.checking = false;
    }
  }
}

function closeQuietly(w: FSWatcher): void {
  w.removeAllListeners();
  w.on('error', () => undefined);
  w.close();
}

export class SocketDirWatcher {
  private readonly deps: WatcherDeps;
  private readonly dir: string;
  /** The watch on the socket directory, and the directory it is on (device:inode). */
  private watcher: FSWatcher | undefined;
  private watchedDir: string | undefined;
  /** The watch on the directory's parent, which sees the directory itself deleted and re-created. */
  private parentWatcher: FSWatcher | undefined;
  private opening = false;
  private timer: NodeJS.Timeout | undefined;
  private stopped = false;
  private watchProblem: string | undefined;

  constructor(deps: WatcherDeps) {
    this.deps = deps;
    this.dir = dirname(deps.kubeletSocket);
  }

  /** Resolves once the first attempt to watch the directory is over (watching or not). */
  opened: Promise<void> = Promise.resolve();

  start(): void {
    this.watchParent();
    this.opened = this.openWatch();
    this.timer = setInterval(() => void this.check('periodic check'), this.deps.checkIntervalMs);
    this.timer.unref();
  }

  stop(): void {
    this.stopped = true;
    if (this.timer !== undefined) clearInterval(this.timer);
    this.closeWatch();
    if (this.parentWatcher !== undefined) {
      closeQuietly(this.parentWatcher);
      this.parentWatcher = undefined;
    }
  }

  private closeWatch(): void {
    if (this.watcher !== undefined) {
      closeQuietly(this.watcher);
      this.watcher = undefined;
      this.watchedDir = undefined;
    }
  }

  /**
   * Watches the parent directory for the socket directory's own name: an inotify watch stays on the
   * directory it was opened on, so once that is deleted and re-created (a process without systemd's
   * private mount carries on) it hears nothing more; this one says when to watch the new directory.
   */
  private watchParent(): void {
    if (this.stopped || this.parentWatcher !== undefined) return;
    const name = basename(this.dir);
    try {
      const parent = dirname(this.dir);
      const w = watch(parent, { persistent: false }, (_event, filename) => {
        const entry = filename?.toString();
        if (entry === undefined || entry === name) void this.followDirectory();
        else if (entry === basename(parent)) {
          // The parent itself deleted (its watch is dead): the periodic check watches it again.
          closeQuietly(w);
          if (this.parentWatcher === w) this.parentWatcher = undefined;
          void this.followDirectory();
        }
      });
      w.on('error', () => {
        closeQuietly(w);
        if (this.parentWatcher === w) this.parentWatcher = undefined;
      });
      this.parentWatcher = w;
    } catch (err) {
      // Without it a re-created directory is found by the periodic check; the directory's own
      // watch (reported below) is what matters.
      this.deps.log.debug("cannot watch the socket directory's parent", {
        dir: dirname(this.dir),
        error: errorText(err),
      });
    }
  }

  /** Device and inode of the socket directory; null when it does not exist. */
  private async dirIdentity(): Promise<string | null> {
    try {
      const st = await stat(this.dir);
      return `${st.dev}:${st.ino}`;
    } catch (err) {
      if ((err as NodeJS.ErrnoException).code === 'ENOENT' || (err as NodeJS.ErrnoException).code === 'ENOTDIR')
        return null;
      throw err;
    }
  }

  /** The socket directory itself was deleted or created: move the watch to the one there now. */
  private async followDirectory(): Promise<void> {
    if (this.stopped) return;
    try {
      const now = await this.dirIdentity();
      if (now !== null && now === this.watchedDir) return;
      this.closeWatch();
      if (now === null) return;
      const quiet = this.watchProblem !== undefined; // then openWatch says it watches again
      await this.openWatch();
      if (this.watcher !== undefined) {
        if (!quiet) this.deps.log.info('the socket directory was re-created; watching the new one', { dir: this.dir });
        await this.check('socket directory re-created');
      }
    } catch (err) {
      this.deps.log.debug('cannot look at the socket directory', { dir: this.dir, error: errorText(err) });
    }
  }

  private async openWatch(): Promise<void> {
    if (this.stopped || this.watcher !== undefined || this.opening) return;
    this.opening = true;
    const kubeletName = basename(this.deps.kubeletSocket);
    const pluginName = basename(this.deps.pluginSocket);
    const dirName = basename(this.dir);
    try {
      // Read before the watch is opened: if the directory is replaced in between, the identity is
      // the old one and the parent's watch moves the watch again (read after, a watch on the old
      // directory could pass for one on the new).
      const identity = await this.dirIdentity();
      if (this.stopped || this.watcher !== undefined) return;
      if (identity === null) throw Object.assign(new Error(`${this.dir} does not exist`), { code: 'ENOENT' });
      const w = watch(this.dir, { persistent: false }, (_event, filename) => {
        const name = filename?.toString();
        if (name === kubeletName) void this.kubeletEvent();
        else if (name === pluginName) void this.check('plugin socket changed');
        else if (name === dirName) {
          // The watched directory itself was deleted (inotify's IN_DELETE_SELF): this watch is dead.
          // Not judged by device:inode, which a directory re-created at once may reuse.
          if (this.watcher === w) this.closeWatch();
          void this.followDirectory();
        } else if (name === undefined || name === null) void this.check('directory changed');
        else if (name.endsWith('.sock')) void this.otherEvent(name);
      });
      w.on('error', (err) => {
        this.deps.log.warn('lost the watch on the socket directory; the periodic check will restore it', {
          dir: this.dir,
          error: errorText(err),
        });
        this.closeWatch();
      });
      this.watcher = w;
      this.watchedDir = identity;
      if (this.watchProblem !== undefined) this.deps.log.info('watching the socket directory again', { dir: this.dir });
      this.watchProblem = undefined;
    } catch (err) {
      const problem = errorText(err);
      if (problem !== this.watchProblem) {
        // A missing directory is the registration's to report (it cannot serve there either), once.
        const level = (err as NodeJS.ErrnoException).code === 'ENOENT' ? 'debug' : 'warn';
        this.deps.log[level]('cannot watch the socket directory; relying on the periodic check', {
          dir: this.dir,
          error: problem,
        });
        this.watchProblem = problem;
      }
    } finally {
      this.opening = false;
    }
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
    this.watchParent();
    if (this.watcher === undefined) await this.openWatch();
    else await this.followDirectory();
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
