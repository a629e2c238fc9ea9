// An inotify watch (fs.watch) on one socket directory that follows the directory when it is deleted
// and re-created: an inotify watch stays on the directory it was opened on, so a second watch, on the
// directory's parent, says when to watch the new one. Its owner hears every entry that changed and
// every time the directory went or came, and calls refresh() from its own periodic check (inotify can
// miss events; a watch that could not be opened, or whose parent went, is opened again there).
// Used by the device-plugin resources' socket watcher (watcher.ts) and by the DRA plugin's sockets.
import { watch } from 'node:fs';
import type { FSWatcher } from 'node:fs';
import { stat } from 'node:fs/promises';
import { basename, dirname } from 'node:path';
import { errorText } from '../system/log.ts';
import type { Logger } from '../system/log.ts';
import { CoalescingQueue } from '../system/timers.ts';

/** What changed: an entry of the directory (name unknown when inotify did not say), or the directory itself. */
export type DirEvent =
  | { readonly kind: 'entry'; readonly name: string | undefined }
  | { readonly kind: 'recreated' }
  | { readonly kind: 'deleted' };

export interface DirectoryWatchDeps {
  readonly dir: string;
  onEvent(e: DirEvent): void;
  readonly log: Logger;
}

/** How a sync looks at the directory: `open` a watch if there is none; `follow` a replaced directory too. */
type SyncMode = 'open' | 'follow';

function closeQuietly(w: FSWatcher): void {
  w.removeAllListeners();
  w.on('error', () => undefined);
  w.close();
}

/** Device and inode of a directory; null when it does not exist (or is no directory). */
async function dirIdentity(dir: string): Promise<string | null> {
  try {
    const st = await stat(dir);
    return st.isDirectory() ? `${st.dev}:${st.ino}` : null;
  } catch (err) {
    const code = (err as NodeJS.ErrnoException).code;
    if (code === 'ENOENT' || code === 'ENOTDIR') return null;
    throw err;
  }
}

export class DirectoryWatch {
  readonly dir: string;
  private readonly deps: DirectoryWatchDeps;
  /** The watch on the directory, and the directory it is on (device:inode). */
  private watcher: FSWatcher | undefined;
  private watchedDir: string | undefined;
  /** The watch on the directory's parent, which sees the directory itself deleted and re-created. */
  private parentWatcher: FSWatcher | undefined;
  /** Opening and moving the watch: one look at a time, requests meanwhile folded into one more. */
  private readonly syncs: CoalescingQueue<SyncMode>;
  private stopped = false;
  private watchProblem: string | undefined;

  constructor(deps: DirectoryWatchDeps) {
    this.deps = deps;
    this.dir = deps.dir;
    this.syncs = new CoalescingQueue<SyncMode>(
      (mode) => this.sync(mode),
      (a, b) => (a === 'follow' || b === 'follow' ? 'follow' : 'open'),
    );
  }

  /** Whether the directory is watched now. */
  get watching(): boolean {
    return this.watcher !== undefined;
  }

  /** Watches the parent and the directory; resolves once the first try to watch the directory is over. */
  start(): Promise<void> {
    this.watchParent();
    return this.syncs.request('open');
  }

  /** The periodic check: watches whatever is not watched, and moves the watch to a re-created directory. */
  refresh(): Promise<void> {
    this.watchParent();
    return this.syncs.request(this.watcher === undefined ? 'open' : 'follow');
  }

  stop(): void {
    this.stopped = true;
    void this.syncs.close();
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

  private follow(): void {
    if (!this.stopped) void this.syncs.request('follow');
  }

  /** Watches the parent directory for the directory's own name (deleted, created, renamed). */
  private watchParent(): void {
    if (this.stopped || this.parentWatcher !== undefined) return;
    const name = basename(this.dir);
    const parent = dirname(this.dir);
    try {
      const w = watch(parent, { persistent: false }, (_event, filename) => {
        const entry = filename?.toString();
        if (entry === undefined || entry === name) this.follow();
        else if (entry === basename(parent)) {
          // The parent itself deleted (its watch is dead): the periodic check watches it again.
          this.dropParent(w);
          this.follow();
        }
      });
      w.on('error', () => this.dropParent(w));
      this.parentWatcher = w;
    } catch (err) {
      // Without it a re-created directory is found by the periodic check; the directory's own
      // watch (reported by sync) is what matters.
      this.deps.log.debug("cannot watch the socket directory's parent", { dir: parent, error: errorText(err) });
    }
  }

  private dropParent(w: FSWatcher): void {
    closeQuietly(w);
    if (this.parentWatcher === w) this.parentWatcher = undefined;
  }

  /** Opens the watch, or moves it to the directory there now; says when the directory went or came. */
  private async sync(mode: SyncMode): Promise<void> {
    if (this.stopped) return;
    try {
      if (mode === 'open' && this.watcher === undefined) {
        await this.openWatch();
        return;
      }
      const now = await dirIdentity(this.dir);
      if (now !== null && now === this.watchedDir) return;
      this.closeWatch();
      if (now === null) {
        this.deps.onEvent({ kind: 'deleted' });
        return;
      }
      const quiet = this.watchProblem !== undefined; // then openWatch says it watches again
      await this.openWatch();
      if (this.watcher === undefined || this.stopped) return;
      if (!quiet) this.deps.log.info('the socket directory was re-created; watching the new one', { dir: this.dir });
      this.deps.onEvent({ kind: 'recreated' });
    } catch (err) {
      this.deps.log.debug('cannot look at the socket directory', { dir: this.dir, error: errorText(err) });
    }
  }

  private async openWatch(): Promise<void> {
    try {
      // Read before the watch is opened: if the directory is replaced in between, the identity is
      // the old one and the parent's watch moves the watch again (read after, a watch on the old
      // directory could pass for one on the new).
      const identity = await dirIdentity(this.dir);
      if (this.stopped || this.watcher !== undefined) return;
      if (identity === null) throw Object.assign(new Error(`${this.dir} does not exist`), { code: 'ENOENT' });
      this.watcher = this.watchDirectory();
      this.watchedDir = identity;
      if (this.watchProblem !== undefined) this.deps.log.info('watching the socket directory again', { dir: this.dir });
      this.watchProblem = undefined;
    } catch (err) {
      const problem = errorText(err);
      if (problem === this.watchProblem) return;
      // A missing directory is the serving's to report (it cannot serve there either), once.
      const level = (err as NodeJS.ErrnoException).code === 'ENOENT' ? 'debug' : 'warn';
      this.deps.log[level]('cannot watch the socket directory; relying on the periodic check', {
        dir: this.dir,
        error: problem,
      });
      this.watchProblem = problem;
    }
  }

  private watchDirectory(): FSWatcher {
    const dirName = basename(this.dir);
    const w = watch(this.dir, { persistent: false }, (_event, filename) => {
      const name = filename?.toString();
      if (name === dirName) {
        // The watched directory itself was deleted (inotify's IN_DELETE_SELF): this watch is dead.
        // Not judged by device:inode, which a directory re-created at once may reuse.
        if (this.watcher === w) this.closeWatch();
        this.follow();
      } else this.deps.onEvent({ kind: 'entry', name: name ?? undefined });
    });
    w.on('error', (err) => {
      this.deps.log.warn('lost the watch on the socket directory; the periodic check will restore it', {
        dir: this.dir,
        error: errorText(err),
      });
      if (this.watcher === w) this.closeWatch();
    });
    return w;
  }
}
