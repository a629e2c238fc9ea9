// A stand-in for the kubelet's device manager: serves Registration on <dir>/kubelet.sock over real
// gRPC, validates RegisterRequests as the kubelet does, dials the plugin back, calls
// GetDevicePluginOptions, keeps a ListAndWatch stream open, and can call the other RPCs. Its dial back
// is the kubelet's: it blocks until the plugin's socket accepts, retrying about once a second, for at
// most 10 s (then the Register fails). restart() does what a graceful kubelet restart does: the old
// kubelet removes kubelet.sock as it stops, the new one deletes every other file in the directory
// (but the checkpoint), then serves kubelet.sock again; stopKubelet() and startKubelet() are its halves.
// A Register for a resource name another endpoint holds makes the new endpoint the resource's, as
// the kubelet does (pkg/kubelet/cm/devicemanager: PluginConnected replaces the endpoint; the old
// plugin's client is not closed): the old plugin's ListAndWatch updates still land on the resource,
// and when its stream ends the kubelet marks the resource's devices Unhealthy and stops the
// resource's endpoint (the new one), which then refuses Allocate until a plugin registers again.
// (A Register from the same endpoint closes that endpoint's old client.) servePodResources() also
// serves the PodResources API (v1 List) on its own socket, answering with the pods the test sets in `pods`.
import * as grpc from '@grpc/grpc-js';
import { EventEmitter } from 'node:events';
import { readdir, rm } from 'node:fs/promises';
import { join } from 'node:path';
import { devicePluginService, registrationService } from '../../src/api/proto.ts';
import { podResourcesService } from '../../src/api/podresources.ts';
import type { ListPodResourcesResponse, PodResources } from '../../src/api/podresources.ts';
import type * as M from '../../src/api/messages.ts';
import { onEvent, waitFor } from './wait.ts';

export const CHECKPOINT_FILE = 'kubelet_internal_checkpoint';

export interface Registration {
  request: M.RegisterRequest;
  /** performance.now() when Register arrived, and when the kubelet socket was last created. */
  at: number;
  socketCreatedAt: number;
  /** Milliseconds the dial back to the plugin's socket waited for it to accept. */
  dialMs: number;
}

/** The kubelet's dial timeout for a registering plugin's socket (its Register fails after it). */
export const DIAL_TIMEOUT_MS = 10000;

interface PluginClient {
  resource: string;
  endpoint: string;
  client: grpc.Client;
  stream: grpc.ClientReadableStream<M.ListAndWatchResponse> | undefined;
  devices: M.Device[] | undefined;
  options: M.DevicePluginOptions;
  updates: number;
}

const RESOURCE_NAME =
  /^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*)\/([A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?)$/;

/** The kubelet's checks on a RegisterRequest; returns the problem or null. */
export function validateRegisterRequest(r: M.RegisterRequest): string | null {
  if (r.version !== 'v1beta1') return `invalid version ${JSON.stringify(r.version)}; supported: v1beta1`;
  const m = RESOURCE_NAME.exec(r.resource_name);
  if (m === null || r.resource_name.length > 253)
    return `invalid resource name ${JSON.stringify(r.resource_name)}: not an extended resource name`;
  const domain = m[1] ?? '';
  if (domain === 'kubernetes.io' || domain.endsWith('.kubernetes.io'))
    return `invalid resource name ${r.resource_name}: the kubernetes.io domain is reserved`;
  if (r.endpoint.length === 0 || r.endpoint.includes('/'))
    return `invalid endpoint ${JSON.stringify(r.endpoint)}: expected a file name in the socket directory`;
  return null;
}

export class KubeletStandIn extends EventEmitter {
  readonly dir: string;
  readonly socketPath: string;
  readonly registrations: Registration[] = [];
  readonly rejected: { request: M.RegisterRequest; reason: string }[] = [];
  private server: grpc.Server | undefined;
  private plugins = new Map<string, PluginClient>();
  /** Clients of endpoints another endpoint replaced for their resource, still streaming. */
  private superseded = new Set<PluginClient>();
  /** Each resource's device list as the kubelet holds it (any of its plugins' streams updates it). */
  private views = new Map<string, M.Device[]>();
  /** Resources whose endpoint is stopped (Allocate refused) until a plugin registers again. */
  private stoppedEndpoints = new Set<string>();
  private socketCreatedAt = 0;
  private podServer: grpc.Server | undefined;
  /**
   * When set, the next Registers are answered only once it resolves, after the kubelet has connected
   * to the plugin and opened its ListAndWatch stream (the kubelet's client runs on its own, so a
   * plugin can see the stream before the answer).
   */
  holdRegister: ((req: M.RegisterRequest) => Promise<void>) | undefined;
  /** What PodResources List answers (set by the test). */
  pods: PodResources[] = [];
  podListCalls = 0;

  private constructor(dir: string) {
    super();
    this.dir = dir;
    this.socketPath = join(dir, 'kubelet.sock');
  }

  static async start(dir: string, opts: { wipe?: boolean } = {}): Promise<KubeletStandIn> {
    const k = new KubeletStandIn(dir);
    if (opts.wipe ?? true) await k.wipe();
    await k.serve();
    return k;
  }

  private async wipe(): Promise<void> {
    for (const name of await readdir(this.dir)) {
      if (name !== CHECKPOINT_FILE) await rm(join(this.dir, name), { force: true, recursive: true });
    }
  }

  private async serve(): Promise<void> {
    const server = new grpc.Server();
    server.addService(registrationService(), {
      Register: (call: grpc.ServerUnaryCall<M.RegisterRequest, M.Empty>, cb: grpc.sendUnaryData<M.Empty>) => {
        void this.onRegister(call.request, cb);
      },
    });
    await new Promise<void>((resolve, reject) => {
      server.bindAsync(`unix://${this.socketPath}`, grpc.ServerCredentials.createInsecure(), (err) =>
        err ? reject(err) : resolve(),
      );
    });
    this.server = server;
    this.socketCreatedAt = performance.now();
  }

  private async onRegister(req: M.RegisterRequest, cb: grpc.sendUnaryData<M.Empty>): Promise<void> {
    const at = performance.now();
    const problem = validateRegisterRequest(req);
    if (problem !== null) {
      this.rejected.push({ request: req, reason: problem });
      cb({ code: grpc.status.INVALID_ARGUMENT, details: problem });
      this.emit('rejected', problem);
      return;
    }
    const old = this.plugins.get(req.resource_name);
    if (old !== undefined && old.endpoint === req.endpoint) {
      this.closePlugin(old);
      this.views.delete(req.resource_name);
    } else if (old !== undefined) {
      this.superseded.add(old);
    }
    // Like the kubelet, one connection per plugin registration, really closed when replaced. Its dial
    // blocks until connected, for at most 10 s, retrying with gRPC's backoff (1 s, then × 1.6).
    const client = new grpc.Client(`unix://${join(this.dir, req.endpoint)}`, grpc.credentials.createInsecure(), {
      'grpc.use_local_subchannel_pool': 1,
      'grpc.initial_reconnect_backoff_ms': 1000,
    });
    const svc = devicePluginService();
    try {
      const dialStart = performance.now();
      await new Promise<void>((resolve, reject) => {
        client.waitForReady(Date.now() + DIAL_TIMEOUT_MS, (err) =>
          err ? reject(new Error(`dial timed out after ${DIAL_TIMEOUT_MS} ms`)) : resolve(),
        );
      });
      const dialMs = performance.now() - dialStart;
      const options = await new Promise<M.DevicePluginOptions>((resolve, reject) => {
        client.makeUnaryRequest(
          svc.GetDevicePluginOptions.path,
          svc.GetDevicePluginOptions.requestSerialize,
          svc.GetDevicePluginOptions.responseDeserialize,
          {},
          new grpc.Metadata(),
          { deadline: Date.now() + 5000 },
          (err, res) => (err || res === undefined ? reject(err ?? new Error('no response')) : resolve(res)),
        );
      });
      const plugin: PluginClient = {
        resource: req.resource_name,
        endpoint: req.endpoint,
        client,
        stream: undefined,
        devices: undefined,
        options,
        updates: 0,
      };
      this.plugins.set(req.resource_name, plugin);
      this.stoppedEndpoints.delete(req.resource_name);
      const hold = this.holdRegister;
      if (hold !== undefined) {
        this.openStream(plugin);
        await hold(req);
      }
      this.registrations.push({ request: req, at, socketCreatedAt: this.socketCreatedAt, dialMs });
      cb(null, {});
      this.emit('registered', req);
      if (hold === undefined) this.openStream(plugin);
    } catch (err) {
      client.close();
      const details = `cannot reach the plugin at ${req.endpoint}: ${(err as Error).message}`;
      this.rejected.push({ request: req, reason: details });
      cb({ code: grpc.status.UNAVAILABLE, details });
    }
  }

  private openStream(p: PluginClient): void {
    const svc = devicePluginService();
    const stream = p.client.makeServerStreamRequest(
      svc.ListAndWatch.path,
      svc.ListAndWatch.requestSerialize,
      svc.ListAndWatch.responseDeserialize,
      {},
    );
    p.stream = stream;
    stream.on('data', (msg: M.ListAndWatchResponse) => {
      p.devices = msg.devices;
      p.updates++;
      if (this.plugins.get(p.resource) === p || this.superseded.has(p)) this.views.set(p.resource, msg.devices);
      this.emit('devices', p.resource, msg.devices);
    });
    const ended = (): void => {
      // The kubelet marks the resource's devices unhealthy until the plugin registers again.
      if (this.plugins.get(p.resource) === p) this.emit('stream-broken', p.resource);
      else if (this.superseded.delete(p)) {
        // A replaced endpoint's stream ending disconnects the resource: its devices Unhealthy, its
        // (current) endpoint stopped.
        this.closePlugin(p);
        this.stoppedEndpoints.add(p.resource);
        const view = this.views.get(p.resource);
        if (view !== undefined)
          this.views.set(
            p.resource,
            view.map((d) => ({ ...d, health: 'Unhealthy' })),
          );
        this.emit('stream-broken', p.resource);
        this.emit('devices', p.resource, this.views.get(p.resource));
      }
    };
    stream.on('error', ended);
    stream.on('end', ended);
  }

  private closePlugin(p: PluginClient): void {
    p.stream?.cancel();
    p.client.close();
  }

  /**
   * The kubelet's end of a resource's ListAndWatch stream breaks (its socket stays): the plugin must
   * register again.
   */
  cutStream(resource = 'nvidia.com/gpu'): void {
    const p = this.plugins.get(resource);
    if (p === undefined) throw new Error(`no plugin registered for ${resource}`);
    this.plugins.delete(resource);
    this.views.delete(resource);
    this.closePlugin(p);
  }

  /** The resource's device list as the kubelet holds it. */
  devices(resource = 'nvidia.com/gpu'): M.Device[] | undefined {
    return this.views.get(resource);
  }

  /** The endpoint the kubelet sends this resource's calls to (a socket file name), if any. */
  endpoint(resource = 'nvidia.com/gpu'): string | undefined {
    return this.plugins.get(resource)?.endpoint;
  }

  /** Whether the resource's endpoint is stopped (Allocate refused until a plugin registers again). */
  endpointStopped(resource = 'nvidia.com/gpu'): boolean {
    return this.stoppedEndpoints.has(resource);
  }

  updates(resource = 'nvidia.com/gpu'): number {
    return this.plugins.get(resource)?.updates ?? 0;
  }

  pluginOptions(resource = 'nvidia.com/gpu'): M.DevicePluginOptions | undefined {
    return this.plugins.get(resource)?.options;
  }

  /** Resolves when `registrations.length` reaches n (or rejects after timeoutMs). */
  waitForRegistrations(n: number, timeoutMs = 10000): Promise<Registration> {
    return this.waitFor(
      () => (this.registrations.length >= n ? this.registrations[n - 1] : undefined),
      'registered',
      timeoutMs,
      `registration #${n}`,
    );
  }

  /** Resolves with the device list once it satisfies pred. */
  waitForDevices(
    pred: (d: M.Device[]) => boolean,
    resource = 'nvidia.com/gpu',
    timeoutMs = 10000,
  ): Promise<M.Device[]> {
    return this.waitFor(
      () => {
        const d = this.devices(resource);
        return d !== undefined && pred(d) ? d : undefined;
      },
      'devices',
      timeoutMs,
      'a matching device list',
    );
  }

  private waitFor<T>(probe: () => T | undefined, event: string, timeoutMs: number, what: string): Promise<T> {
    return waitFor(probe, {
      on: onEvent(this, event),
      deadlineMs: timeoutMs,
      what: () =>
        `kubelet stand-in: no ${what} (registrations ${this.registrations.length}, ` +
        `rejected ${JSON.stringify(this.rejected.map((r) => r.reason))})`,
    });
  }

  private unary<Req, Res>(
    resource: string,
    name: 'Allocate' | 'GetPreferredAllocation' | 'PreStartContainer' | 'GetDevicePluginOptions',
    req: Req,
  ): Promise<Res> {
    const p = this.plugins.get(resource);
    if (p === undefined) return Promise.reject(new Error(`no plugin registered for ${resource}`));
    if (this.stoppedEndpoints.has(resource))
      return Promise.reject(new Error(`endpoint ${p.endpoint} for ${resource} has been stopped`));
    const m = devicePluginService()[name] as unknown as grpc.MethodDefinition<Req, Res>;
    return new Promise<Res>((resolve, reject) => {
      p.client.makeUnaryRequest(
        m.path,
        m.requestSerialize,
        m.responseDeserialize,
        req,
        new grpc.Metadata(),
        { deadline: Date.now() + 10000 },
        (err, res) => (err || res === undefined ? reject(err ?? new Error('no response')) : resolve(res)),
      );
    });
  }

  allocate(req: M.AllocateRequest, resource = 'nvidia.com/gpu'): Promise<M.AllocateResponse> {
    return this.unary(resource, 'Allocate', req);
  }

  preferred(req: M.PreferredAllocationRequest, resource = 'nvidia.com/gpu'): Promise<M.PreferredAllocationResponse> {
    return this.unary(resource, 'GetPreferredAllocation', req);
  }

  preStart(req: M.PreStartContainerRequest, resource = 'nvidia.com/gpu'): Promise<M.PreStartContainerResponse> {
    return this.unary(resource, 'PreStartContainer', req);
  }

  /** What a kubelet restart looks like to a plugin: its socket goes, every file goes, kubelet.sock comes back. */
  async restart(opts: { downMs?: number } = {}): Promise<void> {
    await this.stopKubelet();
    if (opts.downMs) await new Promise((r) => setTimeout(r, opts.downMs));
    await this.startKubelet();
  }

  /** A kubelet stopping gracefully: plugin connections closed, kubelet.sock removed; other files stay. */
  async stopKubelet(): Promise<void> {
    await this.shutdown();
    await rm(this.socketPath, { force: true });
  }

  /** A kubelet starting: every file but the checkpoint deleted, then kubelet.sock served. */
  async startKubelet(): Promise<void> {
    await this.wipe();
    await this.serve();
  }

  private async shutdown(): Promise<void> {
    for (const p of [...this.plugins.values(), ...this.superseded]) this.closePlugin(p);
    this.plugins.clear();
    this.superseded.clear();
    this.views.clear();
    this.stoppedEndpoints.clear();
    this.server?.forceShutdown();
    this.server = undefined;
  }

  /** Serves the PodResources API (v1 PodResourcesLister.List) on `socketPath`, answering with `pods`. */
  async servePodResources(socketPath: string): Promise<void> {
    const server = new grpc.Server();
    server.addService(podResourcesService(), {
      List: (
        _call: grpc.ServerUnaryCall<unknown, ListPodResourcesResponse>,
        cb: grpc.sendUnaryData<ListPodResourcesResponse>,
      ) => {
        this.podListCalls++;
        cb(null, { pod_resources: this.pods });
      },
    });
    await new Promise<void>((resolve, reject) => {
      server.bindAsync(`unix://${socketPath}`, grpc.ServerCredentials.createInsecure(), (err) =>
        err ? reject(err) : resolve(),
      );
    });
    this.podServer = server;
  }

  async stop(): Promise<void> {
    this.podServer?.forceShutdown();
    this.podServer = undefined;
    await this.shutdown();
    this.removeAllListeners();
  }
}
