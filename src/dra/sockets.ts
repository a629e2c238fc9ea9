// The DRA plugin's two sockets, kept served: dra.sock (<pluginsDir>/<driver>/, the DRAPlugin and
// health services) and the registration socket (<registryDir>/<driver>-reg.sock). A socket of ours
// deleted (a kubelet wiping its directories, someone's rm) is served again at once: the directories
// are watched (kubelet/dir-watch.ts, which follows a directory deleted and re-created), and a periodic
// check covers what inotify misses. dra.sock is served before the registration socket, so the kubelet
// that registers us finds the endpoint it was given. One pass at a time; changes during a pass fold
// into one more. A socket that cannot be served yet (the kubelet's directories missing) is said once
// and tried again on the next change; a process that lost its view of the directories is told apart
// by the composition (beforeServeProblem), and then exits instead.
import { mkdir, stat } from 'node:fs/promises';
import { basename, join } from 'node:path';
import { DirectoryWatch } from '../kubelet/dir-watch.ts';
import type { DirEvent } from '../kubelet/dir-watch.ts';
import { UnixSocketServer } from '../kubelet/socket-server.ts';
import type { ServiceBinding } from '../kubelet/socket-server.ts';
import { errorText } from '../system/log.ts';
import type { Logger } from '../system/log.ts';
import { CoalescingQueue, TimerOwner } from '../system/timers.ts';

export interface DraSocketsOptions {
  readonly driver: string;
  /** The kubelet's plugin watcher directory (/var/lib/kubelet/plugins_registry). */
  readonly registryDir: string;
  /** The kubelet's plugins directory (/var/lib/kubelet/plugins): dra.sock goes in <pluginsDir>/<driver>/. */
  readonly pluginsDir: string;
  /** The services of dra.sock. */
  readonly endpointServices: () => readonly ServiceBinding[];
  /** The services of the registration socket. */
  readonly registrationServices: () => readonly ServiceBinding[];
  /** Our registration socket went: whatever registration stood is lost. */
  readonly onRegistrationSocketLost: (reason: string) => void;
  /** The plugin directory was made again (the checkpoint in it went with it). */
  readonly onPluginDirMade: () => Promise<void>;
  /** After each pass (a change in a watched directory, or the periodic check); its errors are its own. */
  readonly afterPass?: () => Promise<void>;
  /** Awaited before a failure to serve is reported (see above). */
  readonly beforeServeProblem?: () => Promise<void>;
  /** The periodic check; default 5000 ms. */
  readonly checkIntervalMs?: number;
  readonly log: Logger;
}

const SERVE = { missingDirHint: 'is the kubelet installed and started?' };

async function isDirectory(dir: string): Promise<boolean> {
  return stat(dir).then(
    (s) => s.isDirectory(),
    () => false,
  );
}

export class DraSockets {
  readonly registrationSocket: string;
  readonly endpoint: string;
  /** <pluginsDir>/<driver>: dra.sock and the checkpoint. */
  readonly pluginDir: string;
  private readonly opts: DraSocketsOptions;
  private readonly log: Logger;
  private readonly watches: DirectoryWatch[];
  private readonly timers = new TimerOwner();
  private readonly passes = new CoalescingQueue<void>(
    () => this.pass(),
    () => undefined,
  );
  private regServer: UnixSocketServer | undefined;
  private draServer: UnixSocketServer | undefined;
  private stopped = false;
  private lastProblem: string | undefined;

  constructor(opts: DraSocketsOptions) {
    this.opts = opts;
    this.log = opts.log;
    this.pluginDir = join(opts.pluginsDir, opts.driver);
    this.registrationSocket = join(opts.registryDir, `${opts.driver}-reg.sock`);
    this.endpoint = join(this.pluginDir, 'dra.sock');
    const interesting: Record<string, string> = {
      [opts.registryDir]: basename(this.registrationSocket),
      [opts.pluginsDir]: opts.driver,
      [this.pluginDir]: basename(this.endpoint),
    };
    this.watches = Object.entries(interesting).map(
      ([dir, name]) => new DirectoryWatch({ dir, onEvent: (e) => this.dirEvent(e, name), log: opts.log }),
    );
  }

  /** Watches the directories and serves both sockets (what cannot be served yet is tried again on a change). */
  async start(): Promise<void> {
    await Promise.all(this.watches.map((w) => w.start()));
    this.timers.every('check', this.opts.checkIntervalMs ?? 5000, () => this.kick());
    await this.passes.request();
  }

  private dirEvent(e: DirEvent, name: string): void {
    if (e.kind !== 'entry' || e.name === undefined || e.name === name) this.kick();
  }

  /** Something changed in a watched directory, or the periodic check: make sure we serve. */
  private kick(): void {
    if (!this.stopped) void this.passes.request();
  }

  /** No pass, watch or check after this; resolves once the pass under way has finished. */
  async quiesce(): Promise<void> {
    this.stopped = true;
    this.timers.dispose();
    for (const w of this.watches) w.stop();
    await this.passes.close();
  }

  /** Stops both servers (open streams are cut), removing the socket files that are still ours. */
  async close(): Promise<void> {
    await this.regServer?.stop();
    await this.draServer?.stop();
    this.regServer = undefined;
    this.draServer = undefined;
  }

  private async pass(): Promise<void> {
    if (this.stopped) return;
    try {
      await Promise.all(this.watches.map((w) => w.refresh()));
      await this.makePluginDir();
      // dra.sock first: the kubelet dials the endpoint it is given as soon as it registered us.
      await this.serveEndpoint();
      await this.serveRegistration();
      if (this.lastProblem !== undefined)
        this.log.info('serving the DRA sockets again', {
          registration: this.registrationSocket,
          endpoint: this.endpoint,
        });
      this.lastProblem = undefined;
    } catch (err) {
      await this.serveProblem(errorText(err));
    }
    await this.opts.afterPass?.();
  }

  /** The plugin directory, made again when the kubelet's plugins directory is there and it is not. */
  private async makePluginDir(): Promise<void> {
    if ((await isDirectory(this.pluginDir)) || !(await isDirectory(this.opts.pluginsDir))) return;
    await mkdir(this.pluginDir, { recursive: true, mode: 0o750 });
    if (this.draServer !== undefined)
      this.log.info('the DRA plugin directory was deleted; created it again', { dir: this.pluginDir });
    await this.opts.onPluginDirMade();
  }

  private async serveEndpoint(): Promise<void> {
    if (this.draServer !== undefined && (await this.draServer.stillOurs())) return;
    const had = this.draServer !== undefined;
    await this.draServer?.stop();
    this.draServer = undefined;
    if (this.stopped) return;
    this.draServer = await UnixSocketServer.start(this.endpoint, this.opts.endpointServices(), SERVE);
    if (had) this.log.info('dra.sock was removed; serving it again', { socket: this.endpoint });
  }

  private async serveRegistration(): Promise<void> {
    if (this.regServer !== undefined && (await this.regServer.stillOurs())) return;
    const had = this.regServer !== undefined;
    await this.regServer?.stop();
    this.regServer = undefined;
    if (had)
      this.opts.onRegistrationSocketLost(
        'our registration socket was removed (the kubelet wiped its plugin directory, or someone removed it)',
      );
    if (this.stopped) return;
    this.regServer = await UnixSocketServer.start(this.registrationSocket, this.opts.registrationServices(), SERVE);
    this.log.debug('serving the plugin registration', { socket: this.registrationSocket });
  }

  private async serveProblem(problem: string): Promise<void> {
    // A process that lost its view of the directories (systemd's bind mounts after the kubelet
    // deleted them) is about to exit: that is what to say, not a retry that will never come.
    await this.opts.beforeServeProblem?.();
    if (this.stopped) return;
    // Said once per problem; the directories' watches and the periodic check try again.
    if (problem !== this.lastProblem)
      this.log.warn('cannot serve the DRA sockets yet; trying again when the directories change', { error: problem });
    this.lastProblem = problem;
  }
}
