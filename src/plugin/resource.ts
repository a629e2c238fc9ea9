// One advertised resource at run time: its socket, gRPC server, registration loop and socket
// directory watcher (the check that this process still sees the directory is the manager's, one for
// all). Made when a snapshot diff adds the resource, updated in place when its list changes, stopped
// (socket removed) when a diff removes it.
import { basename, dirname, join } from 'node:path';
import { API_VERSION } from '../api/messages.ts';
import { KubeletConnection } from '../kubelet/registration.ts';
import { Registrar } from '../kubelet/registrar.ts';
import { fileIdentity } from '../kubelet/socket-identity.ts';
import { SocketDirWatcher } from '../kubelet/watcher.ts';
import { serveDevicePlugin } from './server.ts';
import { DevicePluginHandlers, PLUGIN_OPTIONS } from './service.ts';
import type { PluginState } from './service.ts';
import { errorText } from '../system/log.ts';
import type { Logger } from '../system/log.ts';
import { CoalescingQueue, TimerOwner } from '../system/timers.ts';
import type { RegistrationRecorder, RpcRecorder } from '../core/metrics.ts';

/** Socket file of a resource: gpu-device-plugin-<name without the vendor domain>.sock */
export function socketFileName(resource: string): string {
  return `${SOCKET_PREFIX}${resource.slice(resource.indexOf('/') + 1)}.sock`;
}
const SOCKET_PREFIX = 'gpu-device-plugin-';

/**
 * How long after another plugin's socket went this resource registers again. When a plugin whose
 * endpoint was replaced by ours (NVIDIA's, for the same resource name) disconnects, the kubelet
 * marks the resource's devices Unhealthy and stops the resource's endpoint, which is ours: Allocate
 * is refused until we register again. The kubelet sees that plugin's stream end at about the time
 * its socket goes; registering at once could land before, and be stopped in turn.
 */
const OTHER_PLUGIN_SETTLE_MS = 1000;

/** A served socket: what a server factory returns (the gRPC server of plugin/server.ts by default). */
export interface ServedSocket {
  /** Stops serving; removeSocket: also unlink the socket file (only when it is still ours). */
  stop(removeSocket: boolean): Promise<void>;
}

/** Starts serving a resource's handlers on a unix socket. */
export type ServerFactory = (socketPath: string, handlers: DevicePluginHandlers) => Promise<ServedSocket>;

export const grpcServerFactory: ServerFactory = (socketPath, handlers) => serveDevicePlugin(socketPath, handlers);

export interface ResourceContext {
  readonly kubeletSocket: string;
  /** Starts the server (default: plugin/server.ts's gRPC server). */
  readonly serverFactory?: ServerFactory;
  readonly socketCheckIntervalMs: number;
  readonly log: Logger;
  /** After every successful registration of this resource. */
  onRegistered(name: string): void;
  /** A registration of this resource stopped counting (the kubelet or our socket changed). */
  onRegistrationLost?(name: string): void;
  /** Counts this resource's RPCs and registrations (metrics); none by default. */
  recorder?: RpcRecorder & RegistrationRecorder;
}

export class ResourceRuntime {
  readonly name: string;
  readonly socketPath: string;
  readonly handlers: DevicePluginHandlers;
  private readonly ctx: ResourceContext;
  private readonly log: Logger;
  private readonly registrar: Registrar;
  private readonly watcher: SocketDirWatcher;
  private server: ServedSocket | undefined;
  /** Identity of the socket file our current server made. */
  private served: string | null = null;
  /** Identity of the kubelet socket we last tried to register through. */
  private attemptedKubelet: string | null = null;
  private registeredFlag = false;
  private stopped = false;
  /** The 'other plugin' timer (see otherPluginGone). */
  private readonly timers = new TimerOwner();
  private registeredNowFlag = false;
  /** The connection to the kubelet for the attempt under way, connecting while we make sure we serve. */
  private pending: { readonly kubelet: string | null; readonly connection: KubeletConnection } | undefined;
  /**
   * The last Register sent: GetDevicePluginOptions calls answered when it was sent, and whether a
   * server the kubelet had reached since was replaced (the kubelet's stream to it is then cut, and
   * the registration does not stand, even though the socket is served again).
   */
  private lastRegister: { readonly optionsCalls: number; reachedReplaced: boolean } | undefined;
  /** Serving is made sure of one at a time (the watcher and the registration loop both ask). */
  private readonly serving = new CoalescingQueue<void>(
    () => this.ensureServingNow(),
    () => undefined,
  );

  constructor(name: string, state: PluginState, ctx: ResourceContext) {
    this.name = name;
    this.ctx = ctx;
    this.socketPath = join(dirname(ctx.kubeletSocket), socketFileName(name));
    this.log = ctx.log.child({ resource: name });
    this.handlers = new DevicePluginHandlers(state, this.log, ctx.recorder);
    this.registrar = this.makeRegistrar();
    this.watcher = this.makeWatcher();
    this.handlers.onLastStreamClosed = () => this.kubeletStreamClosed();
  }

  /** The registration loop, wired to this resource's serving, Register and registration flags. */
  private makeRegistrar(): Registrar {
    return new Registrar({
      log: this.log,
      ...(this.ctx.recorder === undefined ? {} : { recorder: this.ctx.recorder }),
      ensureServing: () => this.connectWhileServing(),
      register: () => this.sendRegister(),
      upToDate: () => this.registrationUpToDate(),
      onRegistered: () => {
        this.registeredFlag = true;
        this.registeredNowFlag = true;
        this.ctx.onRegistered(this.name);
      },
      onUnregistered: () => {
        this.registeredNowFlag = false;
        this.ctx.onRegistrationLost?.(this.name);
      },
    });
  }

  /** The socket directory watcher, wired to serve again and to the registration loop. */
  private makeWatcher(): SocketDirWatcher {
    return new SocketDirWatcher({
      kubeletSocket: this.ctx.kubeletSocket,
      pluginSocket: this.socketPath,
      servedIdentity: () => (this.server === undefined ? null : this.served),
      attemptedKubelet: () => this.attemptedKubelet,
      onChange: (reason, ours) => this.socketDirChanged(reason, ours),
      onKubeletGone: (reason) => this.registrar.lost(reason),
      onOtherSocketRemoved: (file) => this.otherPluginGone(file),
      checkIntervalMs: this.ctx.socketCheckIntervalMs,
      log: this.log,
    });
  }

  /** The kubelet socket as it is now, and a connection to it that is set up while we serve. */
  private async connectWhileServing(): Promise<void> {
    this.dropPending();
    const kubelet = await fileIdentity(this.ctx.kubeletSocket);
    this.pending = { kubelet, connection: KubeletConnection.open(this.ctx.kubeletSocket) };
    await this.ensureServing();
  }

  /** Sends Register to the kubelet, through the connection made while we served if it is still the kubelet there. */
  private async sendRegister(): Promise<void> {
    const ctx = this.ctx;
    // The kubelet socket as it is just before the RPC (what a later change is judged against):
    // if it changed while we made sure we serve (a kubelet restarting deletes our socket, then
    // makes its own anew), the early connection went to the old one, so connect to the new one.
    const kubelet = await fileIdentity(ctx.kubeletSocket);
    // Our socket as it is after that: a starting kubelet deletes the other files before it makes
    // its socket, so once its socket is read, our socket checked now stays until the Register
    // (checked before, it could be deleted in between, and the kubelet's dial would wait for it).
    if (kubelet !== null) await this.ensureServing();
    let pending = this.pending;
    this.pending = undefined;
    if (pending === undefined || pending.kubelet !== kubelet) {
      pending?.connection.close();
      pending = { kubelet, connection: KubeletConnection.open(ctx.kubeletSocket) };
    }
    this.attemptedKubelet = kubelet;
    if (kubelet === null) {
      pending.connection.close();
      throw new Error(`no kubelet socket at ${ctx.kubeletSocket} (is the kubelet running?)`);
    }
    this.lastRegister = { optionsCalls: this.handlers.optionsCalls, reachedReplaced: false };
    try {
      await pending.connection.register(
        {
          version: API_VERSION,
          endpoint: basename(this.socketPath),
          resource_name: this.name,
          options: PLUGIN_OPTIONS,
        },
        10000,
      );
    } finally {
      pending.connection.close();
    }
  }

  /** The last registration still stands: its server was not replaced, the socket is ours, the kubelet the same. */
  private async registrationUpToDate(): Promise<boolean> {
    return (
      this.lastRegister?.reachedReplaced !== true &&
      (await this.stillOurs()) &&
      (await fileIdentity(this.ctx.kubeletSocket)) === this.attemptedKubelet
    );
  }

  /** The watcher saw our socket or the kubelet's change. */
  private socketDirChanged(reason: string, ours: boolean): void {
    // Our socket gone or replaced: serve it again at once, also while a Register is in flight.
    // That Register's kubelet may be dialling it right now (a restarting kubelet deletes our
    // socket, then serves its own): its dial retries about once a second for 10 s, so it finds
    // the socket served again instead of failing the Register after 10 s.
    if (ours) this.serveAgain(reason);
    this.registrar.kick(reason);
  }

  /**
   * The kubelet's stream gone while its socket stays: it marks our devices unhealthy until we
   * register again. With its socket gone or new, the kubelet is restarting: the registration is
   * lost, and the new kubelet's socket (or our socket's removal) kicks the next attempt.
   */
  private kubeletStreamClosed(): void {
    void fileIdentity(this.ctx.kubeletSocket)
      .catch(() => null)
      .then((kubelet) => {
        if (this.registrar.current !== 'registered') return;
        if (kubelet !== null && kubelet === this.attemptedKubelet)
          this.registrar.kick('the kubelet closed its ListAndWatch stream');
        else this.registrar.lost('the kubelet closed its ListAndWatch stream and its socket went');
      });
  }

  /**
   * Another plugin's socket went: register again a little later (see OTHER_PLUGIN_SETTLE_MS), if the
   * kubelet we registered with is still the one there (a restarting kubelet deletes every socket,
   * and its successor gets a registration anyway).
   */
  private otherPluginGone(file: string): void {
    if (file.startsWith(SOCKET_PREFIX) || this.registrar.current !== 'registered' || this.timers.has('other plugin'))
      return;
    const kubelet = this.attemptedKubelet;
    this.timers.after('other plugin', OTHER_PLUGIN_SETTLE_MS, () => {
      void fileIdentity(this.ctx.kubeletSocket)
        .catch(() => null)
        .then((now) => {
          if (
            this.registrar.current !== 'registered' ||
            now === null ||
            now !== kubelet ||
            this.attemptedKubelet !== kubelet
          )
            return;
          this.registrar.kick(`another plugin's socket went (${file})`);
        });
    });
  }

  /** Registered at least once. */
  get registered(): boolean {
    return this.registeredFlag;
  }

  /** Registered now: since the last registration, nothing asked for another. */
  get registeredNow(): boolean {
    return this.registeredNowFlag;
  }

  start(): void {
    this.watcher.start();
    // The first Register only once the directory watch is open: a socket deleted right after the
    // registration is then seen at once, not at the next periodic check (on a loaded machine the
    // registration could otherwise come before the watch's first stat, and the deletion be seen 5 s late).
    void this.watcher.opened.then(() => this.registrar.kick('start'));
  }

  /** New state for the answers; the list goes to open streams only if it changed. */
  update(state: PluginState): void {
    this.handlers.update(state);
  }

  /** Register again (the kubelet then opens a fresh stream and reads the list from its first message). */
  reregister(reason: string): void {
    this.registrar.kick(reason);
  }

  private dropPending(): void {
    this.pending?.connection.close();
    this.pending = undefined;
  }

  private async stillOurs(): Promise<boolean> {
    return this.server !== undefined && this.served !== null && (await fileIdentity(this.socketPath)) === this.served;
  }

  /** Serves our socket again now (its errors are the next registration attempt's to report). */
  private serveAgain(reason: string): void {
    this.ensureServing().catch((err: unknown) =>
      this.log.debug('cannot serve again yet', { reason, error: errorText(err) }),
    );
  }

  /** Makes sure our socket is there and served; one at a time. */
  private ensureServing(): Promise<void> {
    return this.serving.request(undefined);
  }

  private async ensureServingNow(): Promise<void> {
    if (this.stopped) return;
    if (this.server !== undefined && (await this.stillOurs())) return;
    if (this.server !== undefined) {
      // The kubelet of the last Register reached this server: its stream is cut now.
      if (this.lastRegister !== undefined && this.handlers.optionsCalls > this.lastRegister.optionsCalls)
        this.lastRegister.reachedReplaced = true;
      // Stop the old server first: closing a unix listener unlinks its path, which must not be the new one.
      this.handlers.endStreams();
      await this.server.stop(false);
      this.server = undefined;
      this.served = null;
    }
    const server = await (this.ctx.serverFactory ?? grpcServerFactory)(this.socketPath, this.handlers);
    if (this.stopped) {
      await server.stop(true);
      return;
    }
    const identity = await fileIdentity(this.socketPath);
    if (identity === null) {
      await server.stop(false);
      throw new Error(`${this.socketPath} vanished right after it was created`);
    }
    this.server = server;
    this.served = identity;
    this.log.debug('serving', { socket: this.socketPath });
  }

  /** Stops registering and serving; removes our socket file if it is still ours. */
  async stop(): Promise<void> {
    this.stopped = true;
    this.timers.dispose();
    this.watcher.stop();
    this.registrar.stop();
    this.dropPending();
    await this.serving.close();
    this.handlers.endStreams();
    const server = this.server;
    this.server = undefined;
    if (server !== undefined) {
      const ours = this.served !== null && (await fileIdentity(this.socketPath).catch(() => null)) === this.served;
      await server.stop(ours);
    }
    this.served = null;
  }
}
