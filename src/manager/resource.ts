// One advertised resource at run time: its socket, gRPC server, registration loop and socket
// directory watcher (the check that this process still sees the directory is the manager's, one for all). Made when a snapshot diff adds the resource, updated in place when its list
// changes, stopped (socket removed) when a diff removes it.
import { basename, dirname, join } from 'node:path';
import { API_VERSION } from '../api/messages.ts';
import { KubeletConnection } from '../kubelet/registration.ts';
import { Registrar } from '../kubelet/registrar.ts';
import { fileIdentity } from '../kubelet/socket-identity.ts';
import { SocketDirWatcher } from '../kubelet/watcher.ts';
import { PluginServer } from '../plugin/server.ts';
import { DevicePluginHandlers, PLUGIN_OPTIONS } from '../plugin/service.ts';
import type { PluginState } from '../plugin/service.ts';
import type { Logger } from '../system/log.ts';
import type { RegistrationRecorder, RpcRecorder } from '../core/metrics.ts';

/** Socket file of a resource: gpu-device-plugin-<name without the vendor domain>.sock */
export function socketFileName(resource: string): string {
  return `gpu-device-plugin-${resource.slice(resource.indexOf('/') + 1)}.sock`;
}

/** A served socket: what a server factory returns (the gRPC PluginServer by default). */
export interface ServedSocket {
  /** Stops serving; removeSocket: also unlink the socket file (only when it is still ours). */
  stop(removeSocket: boolean): Promise<void>;
}

/** Starts serving a resource's handlers on a unix socket. */
export type ServerFactory = (socketPath: string, handlers: DevicePluginHandlers) => Promise<ServedSocket>;

export const grpcServerFactory: ServerFactory = (socketPath, handlers) => PluginServer.start(socketPath, handlers);

export interface ResourceContext {
  readonly kubeletSocket: string;
  /** Starts the server (default: the gRPC PluginServer). */
  readonly serverFactory?: ServerFactory;
  /** Awaited before a resource serves (and so before it registers): where a readiness check sits (MPS, say). */
  beforeServe?(resource: string): Promise<void>;
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
  private registeredNowFlag = false;
  /** The connection to the kubelet for the attempt under way, connecting while we make sure we serve. */
  private pending: { readonly kubelet: string | null; readonly connection: KubeletConnection } | undefined;

  constructor(name: string, state: PluginState, ctx: ResourceContext) {
    this.name = name;
    this.ctx = ctx;
    this.socketPath = join(dirname(ctx.kubeletSocket), socketFileName(name));
    this.log = ctx.log.child({ resource: name });
    this.handlers = new DevicePluginHandlers(state, this.log, ctx.recorder);
    this.registrar = new Registrar({
      log: this.log,
      ...(ctx.recorder === undefined ? {} : { recorder: ctx.recorder }),
      ensureServing: async () => {
        // The kubelet socket as it is now, and a connection to it that is set up while we serve.
        this.dropPending();
        const kubelet = await fileIdentity(ctx.kubeletSocket);
        this.pending = { kubelet, connection: KubeletConnection.open(ctx.kubeletSocket) };
        await this.ensureServing();
      },
      register: async () => {
        // The kubelet socket as it is just before the RPC (what a later change is judged against):
        // if it changed while we made sure we serve (a kubelet restarting deletes our socket, then
        // makes its own anew), the early connection went to the old one, so connect to the new one.
        const kubelet = await fileIdentity(ctx.kubeletSocket);
        let pending = this.pending;
        this.pending = undefined;
        if (pending === undefined || pending.kubelet !== kubelet) {
          pending?.connection.close();
          pending = { kubelet, connection: KubeletConnection.open(ctx.kubeletSocket) };
        }
        this.attemptedKubelet = kubelet;
        try {
          await pending.connection.register({
            version: API_VERSION,
            endpoint: basename(this.socketPath),
            resource_name: name,
            options: PLUGIN_OPTIONS,
          }, 10000);
        } finally {
          pending.connection.close();
        }
      },
      upToDate: async () => (await this.stillOurs()) && (await fileIdentity(ctx.kubeletSocket)) === this.attemptedKubelet,
      onRegistered: () => {
        this.registeredFlag = true;
        this.registeredNowFlag = true;
        ctx.onRegistered(name);
      },
      onUnregistered: () => {
        this.registeredNowFlag = false;
        ctx.onRegistrationLost?.(name);
      },
    });
    this.watcher = new SocketDirWatcher({
      kubeletSocket: ctx.kubeletSocket,
      pluginSocket: this.socketPath,
      servedIdentity: () => (this.server === undefined ? null : this.served),
      attemptedKubelet: () => this.attemptedKubelet,
      onChange: (reason) => this.registrar.kick(reason),
      checkIntervalMs: ctx.socketCheckIntervalMs,
      log: this.log,
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

  get registrations(): number {
    return this.registrar.registrationCount;
  }

  start(): void {
    this.watcher.start();
    this.registrar.kick('start');
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

  private async ensureServing(): Promise<void> {
    if (this.server !== undefined && (await this.stillOurs())) return;
    if (this.server !== undefined) {
      // Stop the old server first: closing a unix listener unlinks its path, which must not be the new one.
      this.handlers.endStreams();
      await this.server.stop(false);
      this.server = undefined;
      this.served = null;
    }
    await this.ctx.beforeServe?.(this.name);
    const server = await (this.ctx.serverFactory ?? grpcServerFactory)(this.socketPath, this.handlers);
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
    this.watcher.stop();
    this.registrar.stop();
    this.dropPending();
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
