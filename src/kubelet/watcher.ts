// Watches the kubelet's socket directory. When our socket is removed or replaced, or the kubelet's
// socket is (re)created, it asks for re-registration at once (inotify through fs.watch). A slow timer
// checks the same things, because inotify can miss events (and the watch dies with the directory).
import { watch } from 'node:fs';
import { stat } from 'node:fs/promises';
import type { FSWatcher } from 'node:fs';
import { basename, dirname } from 'node:path';
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
  onChange(reason: string): void;
  /**
   * The socket directory we see was deleted (link count 0). Only a mount namespace shows that — a
   * systemd unit with ProtectSystem=strict binds the directory at start, so after `kubeadm reset`
   * re-creates it the service keeps the dead one and can never be reached again.
   */
  onDirectoryGone?(dir: string): void;
  checkIntervalMs: number;
  log: Logger;
}

export class SocketDirWatcher {
  private readonly deps: WatcherDeps;
  private readonly dir: string;
  private watcher: FSWatcher | undefined;
  private timer: NodeJS.Timeout | undefined;
  private stopped = false;
  private watchProblem: string | undefined;

  constructor(deps: WatcherDeps) {
    this.deps = deps;
    this.dir = dirname(deps.kubeletSocket);
  }

  start(): void {
    this.openWatch();
    this.timer = setInterval(() => void this.check('periodic check'), this.deps.checkIntervalMs);
    this.timer.unref();
  }

  stop(): void {
    this.stopped = true;
    if (this.timer !== undefined) clearInterval(this.timer);
    this.closeWatch();
  }

  private closeWatch(): void {
    if (this.watcher !== undefined) {
      this.watcher.removeAllListeners();
      this.watcher.on('error', () => undefined);
      this.watcher.close();
      this.watcher = undefined;
    }
  }

  private openWatch(): void {
    if (this.stopped || this.watcher !== undefined) return;
    const kubeletName = basename(this.deps.kubeletSocket);
    const pluginName = basename(this.deps.pluginSocket);
    try {
      const w = watch(this.dir, { persistent: false }, (_event, filename) => {
        const name = filename?.toString();
        if (name === kubeletName) void this.kubeletEvent();
        else if (name === pluginName) void this.check('plugin socket changed');
        else if (name === undefined || name === null) void this.check('directory changed');
      });
      w.on('error', (err) => {
        this.deps.log.warn('lost the watch on the socket directory; the periodic check will restore it', { dir: this.dir, error: errorText(err) });
        this.closeWatch();
      });
      this.watcher = w;
      if (this.watchProblem !== undefined) this.deps.log.info('watching the socket directory again', { dir: this.dir });
      this.watchProblem = undefined;
    } catch (err) {
      const problem = errorText(err);
      if (problem !== this.watchProblem) {
        this.deps.log.warn('cannot watch the socket directory; relying on the periodic check', { dir: this.dir, error: problem });
        this.watchProblem = problem;
      }
    }
  }

  /** The kubelet socket appeared or went: re-register when it exists and is not the one we used. */
  private async kubeletEvent(): Promise<void> {
    try {
      const id = await fileIdentity(this.deps.kubeletSocket);
      if (id !== null && id !== this.deps.attemptedKubelet()) this.deps.onChange('kubelet socket created');
    } catch (err) {
      this.deps.log.debug('cannot stat the kubelet socket', { error: errorText(err) });
    }
  }

  async check(reason: string): Promise<void> {
    if (this.stopped) return;
    if (this.watcher === undefined) this.openWatch();
    try {
      const dirStat = await stat(this.dir).catch(() => null);
      if (dirStat !== null && dirStat.nlink === 0 && this.deps.onDirectoryGone !== undefined) {
        this.deps.onDirectoryGone(this.dir);
        return;
      }
      const served = this.deps.servedIdentity();
      const ours = await fileIdentity(this.deps.pluginSocket);
      if (served !== null && ours !== served) {
        this.deps.onChange(ours === null ? 'plugin socket removed' : 'plugin socket replaced');
        return;
      }
      const kubelet = await fileIdentity(this.deps.kubeletSocket);
      if (kubelet !== null && kubelet !== this.deps.attemptedKubelet()) this.deps.onChange(`kubelet socket changed (${reason})`);
    } catch (err) {
      this.deps.log.debug('socket check failed', { error: errorText(err) });
    }
  }
}
