// A stand-in for the kubelet's plugin watcher and DRA plugin manager (issue 21), over real gRPC with
// the kubelet's own protos (src/api/dra.ts). It watches a plugins_registry directory for `*.sock`
// files (and walks what is there at start, as the kubelet does), dials each one, calls GetInfo,
// checks the answer as the kubelet's DRA handler does (type "DRAPlugin", a driver name, a
// supported_versions list that names a service the kubelet speaks: the first of the plugin's list it
// knows wins), and reports the outcome with NotifyRegistrationStatus(true) or (false, error). The
// file's removal is deregistration; a socket created again under the same name registers again.
// A registered driver gets a DraClient (NodePrepareResources / NodeUnprepareResources to the
// endpoint it named, in the version chosen) and, if it announced "v1alpha1.DRAResourceHealth", a
// NodeWatchResources stream whose latest list is kept. With `slices` set it also does what the
// kubelet does to ResourceSlices: at start it deletes every slice of its node, and `wipeDelayMs`
// (30 s in the kubelet) after a driver's deregistration it deletes that driver's slices unless the
// driver registered again in between.
import * as grpc from '@grpc/grpc-js';
import { EventEmitter } from 'node:events';
import { watch } from 'node:fs';
import type { FSWatcher } from 'node:fs';
import { lstat, readdir } from 'node:fs/promises';
import { isAbsolute, join } from 'node:path';
import { DRA_HEALTH_SERVICE_NAME, DRA_PLUGIN_TYPE, DRA_SERVICE_NAMES, draHealthService, draPluginService, pluginRegistrationService } from '../../src/api/dra.ts';
import type {
  Claim,
  DeviceHealth,
  DraVersion,
  NodePrepareResourcesResponse,
  NodeUnprepareResourcesResponse,
  NodeWatchResourcesResponse,
  PluginInfo,
} from '../../src/api/dra.ts';

/** What the kubelet does to ResourceSlices (the API server stand-in implements it). */
export interface SliceJanitor {
  /** Deletes the node's slices, of one driver or (driver undefined) of every driver; returns how many. */
  deleteNodeSlices(nodeName: string, driver?: string): number;
}

export interface WatcherOptions {
  /** The services this kubelet speaks, in the kubelet's terms (default both, as 1.34–1.37). */
  versions?: readonly DraVersion[];
  /** Open the health stream when the driver announces it (default true, as 1.36 with the gate on). */
  health?: boolean;
  /** Deadline of GetInfo and NotifyRegistrationStatus each (default 2 s). */
  callTimeoutMs?: number;
  /** The kubelet's part in ResourceSlice clean-up; off unless set. */
  slices?: { janitor: SliceJanitor; nodeName: string; wipeDelayMs?: number };
}

export interface DriverRegistration {
  name: string;
  endpoint: string;
  /** The registration socket it came from. */
  socket: string;
  version: DraVersion;
  info: PluginInfo;
  /** performance.now() when NotifyRegistrationStatus(true) was answered. */
  at: number;
}

export interface RejectedPlugin {
  socket: string;
  info: PluginInfo | undefined;
  reason: string;
  /** Whether NotifyRegistrationStatus(false, reason) reached the plugin. */
  notified: boolean;
}

interface Registered {
  reg: DriverRegistration;
  client: DraClient;
  /** The socket's identity when it registered: a new file under the same name registers again. */
  ino: number;
  health: grpc.ClientReadableStream<NodeWatchResourcesResponse> | undefined;
}

/** Dials a unix socket with its own connection (closed with close()). */
function dial(path: string): grpc.Client {
  return new grpc.Client(`unix://${path}`, grpc.credentials.createInsecure(), { 'grpc.use_local_subchannel_pool': 1 });
}

/** One call; waitForReady waits (up to the deadline) for a server still between bind() and listen(). */
function unary<Req, Res>(client: grpc.Client, m: grpc.MethodDefinition<Req, Res>, req: Req, timeoutMs: number, waitForReady = false): Promise<Res> {
  return new Promise<Res>((resolve, reject) => {
    client.makeUnaryRequest(m.path, m.requestSerialize, m.responseDeserialize, req, new grpc.Metadata({ waitForReady }), { deadline: Date.now() + timeoutMs },
      (err, res) => (err || res === undefined ? reject(err ?? new Error(`${m.path}: no response`)) : resolve(res)));
  });
}

/** The kubelet's DRA client of one driver: NodePrepareResources / NodeUnprepareResources over real gRPC. */
export class DraClient {
  readonly endpoint: string;
  readonly version: DraVersion;
  private readonly client: grpc.Client;
  /** The kubelet's timeout for both calls. */
  static readonly CALL_TIMEOUT_MS = 45_000;

  constructor(endpoint: string, version: DraVersion) {
    this.endpoint = endpoint;
    this.version = version;
    this.client = dial(endpoint);
  }

  prepare(claims: Claim[], timeoutMs = DraClient.CALL_TIMEOUT_MS): Promise<NodePrepareResourcesResponse> {
    return unary(this.client, draPluginService(this.version).NodePrepareResources, { claims }, timeoutMs);
  }

  unprepare(claims: Claim[], timeoutMs = DraClient.CALL_TIMEOUT_MS): Promise<NodeUnprepareResourcesResponse> {
    return unary(this.client, draPluginService(this.version).NodeUnprepareResources, { claims }, timeoutMs);
  }

  /** Opens the health stream on the same connection (v1alpha1.DRAResourceHealth/NodeWatchResources). */
  watchHealth(): grpc.ClientReadableStream<NodeWatchResourcesResponse> {
    const m = draHealthService().NodeWatchResources;
    return this.client.makeServerStreamRequest(m.path, m.requestSerialize, m.responseDeserialize, {});
  }

  close(): void {
    this.client.close();
  }
}

/** The kubelet DRA handler's checks on GetInfo's answer: the version chosen, or the problem. */
export function validatePluginInfo(info: PluginInfo, socket: string, versions: readonly DraVersion[]): { version: DraVersion } | { error: string } {
  if (info.type !== DRA_PLUGIN_TYPE) {
    return { error: `no handler registered for plugin type: ${JSON.stringify(info.type)} at socket ${socket} (this kubelet handles ${JSON.stringify(DRA_PLUGIN_TYPE)})` };
  }
  if (info.name === '') return { error: `plugin at ${socket}: empty driver name in PluginInfo.name` };
  if (info.supported_versions.length === 0) {
    return { error: `plugin ${info.name}: empty list of supported gRPC services (supported_versions); expected one of ${versions.map((v) => DRA_SERVICE_NAMES[v]).join(', ')}` };
  }
  for (const offered of info.supported_versions) {
    const v = versions.find((k) => DRA_SERVICE_NAMES[k] === offered);
    if (v !== undefined) return { version: v };
  }
  return { error: `plugin ${info.name}: none of the offered gRPC services ${JSON.stringify(info.supported_versions)} is supported; this kubelet speaks ${versions.map((v) => DRA_SERVICE_NAMES[v]).join(', ')}` };
}

export class PluginWatcherStandIn extends EventEmitter {
  readonly dir: string;
  readonly registrations: DriverRegistration[] = [];
  readonly rejected: RejectedPlugin[] = [];
  readonly deregistrations: { name: string; socket: string }[] = [];
  /** Slices the kubelet deleted: at start (driver undefined) and after a driver stayed away. */
  readonly wipes: { driver: string | undefined; deleted: number }[] = [];
  /** The latest health list per driver, and how many stream messages came. */
  readonly health = new Map<string, { devices: DeviceHealth[]; messages: number }>();
  private readonly versions: readonly DraVersion[];
  private readonly opts: WatcherOptions;
  private readonly callTimeoutMs: number;
  private fsw: FSWatcher | undefined;
  /** By registration socket path. */
  private readonly bySocket = new Map<string, Registered>();
  /** Per socket path, the chain of checks so that events on one path are handled in order. */
  private readonly pending = new Map<string, Promise<void>>();
  private readonly wipeTimers = new Map<string, NodeJS.Timeout>();
  private stopped = false;

  private constructor(dir: string, opts: WatcherOptions) {
    super();
    this.dir = dir;
    this.opts = opts;
    this.versions = opts.versions ?? ['v1', 'v1beta1'];
    this.callTimeoutMs = opts.callTimeoutMs ?? 2000;
  }

  /** Starts watching `dir` (which must exist), as a kubelet start does. */
  static async start(dir: string, opts: WatcherOptions = {}): Promise<PluginWatcherStandIn> {
    const w = new PluginWatcherStandIn(dir, opts);
    if (opts.slices !== undefined) {
      w.wipes.push({ driver: undefined, deleted: opts.slices.janitor.deleteNodeSlices(opts.slices.nodeName) });
    }
    w.fsw = watch(dir, (_event, name) => {
      if (typeof name === 'string') w.check(name);
    });
    w.fsw.on('error', (err) => w.emit('watch-error', err));
    for (const name of await readdir(dir)) w.check(name);
    return w;
  }

  /** The DRA client of a registered driver (the newest registration of that name). */
  client(driver: string): DraClient {
    const r = this.current(driver);
    if (r === undefined) throw new Error(`plugin watcher stand-in: no driver ${driver} registered (registered: ${[...this.bySocket.values()].map((x) => x.reg.name).join(', ') || 'none'})`);
    return r.client;
  }

  registered(driver: string): DriverRegistration | undefined {
    return this.current(driver)?.reg;
  }

  private current(driver: string): Registered | undefined {
    let best: Registered | undefined;
    for (const r of this.bySocket.values()) if (r.reg.name === driver && (best === undefined || r.reg.at > best.reg.at)) best = r;
    return best;
  }

  private check(name: string): void {
    if (!name.endsWith('.sock') || name.startsWith('.')) return;
    const path = join(this.dir, name);
    const prev = this.pending.get(path) ?? Promise.resolve();
    const next = prev.then(() => this.reconcile(path)).catch((err: unknown) => {
      this.emit('watch-error', err);
    });
    this.pending.set(path, next);
  }

  private async reconcile(path: string): Promise<void> {
    if (this.stopped) return;
    const st = await lstat(path).catch(() => undefined);
    const have = this.bySocket.get(path);
    if (st === undefined || !st.isSocket()) {
      if (have !== undefined) this.deregister(path, have);
      return;
    }
    if (have !== undefined && have.ino === st.ino) return; // the same socket, already registered
    if (have !== undefined) this.deregister(path, have);
    await this.register(path, st.ino);
  }

  private async register(socket: string, ino: number): Promise<void> {
    const reg = dial(socket);
    try {
      const svc = pluginRegistrationService();
      let info: PluginInfo;
      // The socket file exists from bind(); the server may answer a moment later (the kubelet's
      // reconciler tries again each second while the file is there): wait for it up to the deadline.
      try {
        info = await unary(reg, svc.GetInfo, {}, this.callTimeoutMs, true);
      } catch (err) {
        if (this.stopped) return;
        this.rejected.push({ socket, info: undefined, reason: `GetInfo on ${socket} failed: ${(err as Error).message}`, notified: false });
        this.emit('rejected', socket);
        return;
      }
      const verdict = validatePluginInfo(info, socket, this.versions);
      let problem = 'error' in verdict ? verdict.error : undefined;
      const endpoint = info.endpoint === '' ? socket : info.endpoint;
      if (problem === undefined && !isAbsolute(endpoint)) {
        problem = `plugin ${info.name}: endpoint ${JSON.stringify(info.endpoint)} is not an absolute socket path`;
      }
      if (problem !== undefined || !('version' in verdict)) {
        const reason = problem ?? 'no version';
        let notified = false;
        try {
          await unary(reg, svc.NotifyRegistrationStatus, { plugin_registered: false, error: reason }, this.callTimeoutMs);
          notified = true;
        } catch {
          // the plugin is gone or does not answer; the kubelet only logs this
        }
        this.rejected.push({ socket, info, reason, notified });
        this.emit('rejected', socket);
        return;
      }
      const client = new DraClient(endpoint, verdict.version);
      const registration: DriverRegistration = { name: info.name, endpoint, socket, version: verdict.version, info, at: 0 };
      const entry: Registered = { reg: registration, client, ino, health: undefined };
      this.bySocket.set(socket, entry);
      const timer = this.wipeTimers.get(info.name);
      if (timer !== undefined) {
        clearTimeout(timer);
        this.wipeTimers.delete(info.name);
      }
      try {
        await unary(reg, svc.NotifyRegistrationStatus, { plugin_registered: true, error: '' }, this.callTimeoutMs);
      } catch (err) {
        // The kubelet logs a failed notification and keeps the registration.
        this.emit('notify-error', socket, err);
      }
      registration.at = performance.now();
      this.registrations.push(registration);
      if ((this.opts.health ?? true) && info.supported_versions.includes(DRA_HEALTH_SERVICE_NAME)) this.openHealth(entry);
      this.emit('registered', registration);
    } finally {
      reg.close();
    }
  }

  private openHealth(entry: Registered): void {
    const stream = entry.client.watchHealth();
    entry.health = stream;
    const name = entry.reg.name;
    stream.on('data', (msg: NodeWatchResourcesResponse) => {
      const h = this.health.get(name);
      this.health.set(name, { devices: msg.devices, messages: (h?.messages ?? 0) + 1 });
      this.emit('health', name, msg.devices);
    });
    stream.on('error', (err: grpc.ServiceError) => {
      if (err.code !== grpc.status.CANCELLED) this.emit('health-ended', name, err);
    });
    stream.on('end', () => this.emit('health-ended', name));
  }

  private deregister(socket: string, r: Registered): void {
    this.bySocket.delete(socket);
    r.health?.cancel();
    r.client.close();
    this.deregistrations.push({ name: r.reg.name, socket });
    const s = this.opts.slices;
    if (s !== undefined && this.current(r.reg.name) === undefined) {
      const driver = r.reg.name;
      const timer = setTimeout(() => {
        this.wipeTimers.delete(driver);
        this.wipes.push({ driver, deleted: s.janitor.deleteNodeSlices(s.nodeName, driver) });
        this.emit('wiped', driver);
      }, s.wipeDelayMs ?? 30_000);
      this.wipeTimers.set(driver, timer);
    }
    this.emit('deregistered', r.reg.name);
  }

  /** Drivers whose slices will be deleted when their wipe delay runs out. */
  pendingWipes(): string[] {
    return [...this.wipeTimers.keys()];
  }

  waitForRegistrations(n: number, timeoutMs = 10_000): Promise<DriverRegistration> {
    return this.waitFor(() => this.registrations[n - 1], 'registered', timeoutMs, `registration #${n}`);
  }

  waitForRejections(n: number, timeoutMs = 10_000): Promise<RejectedPlugin> {
    return this.waitFor(() => this.rejected[n - 1], 'rejected', timeoutMs, `rejection #${n}`);
  }

  waitForDeregistrations(n: number, timeoutMs = 10_000): Promise<{ name: string; socket: string }> {
    return this.waitFor(() => this.deregistrations[n - 1], 'deregistered', timeoutMs, `deregistration #${n}`);
  }

  /** Resolves with the driver's health list once it satisfies pred. */
  waitForHealth(driver: string, pred: (d: DeviceHealth[]) => boolean, timeoutMs = 10_000): Promise<DeviceHealth[]> {
    return this.waitFor(() => {
      const h = this.health.get(driver);
      return h !== undefined && pred(h.devices) ? h.devices : undefined;
    }, 'health', timeoutMs, `a matching health list from ${driver}`);
  }

  private waitFor<T>(probe: () => T | undefined, event: string, timeoutMs: number, what: string): Promise<T> {
    const now = probe();
    if (now !== undefined) return Promise.resolve(now);
    return new Promise<T>((resolve, reject) => {
      const onEvent = (): void => {
        const v = probe();
        if (v !== undefined) {
          clearTimeout(timer);
          this.off(event, onEvent);
          resolve(v);
        }
      };
      const timer = setTimeout(() => {
        this.off(event, onEvent);
        reject(new Error(`plugin watcher stand-in: no ${what} within ${timeoutMs} ms (registered ${this.registrations.length}, rejected ${JSON.stringify(this.rejected.map((r) => r.reason))})`));
      }, timeoutMs);
      this.on(event, onEvent);
    });
  }

  async stop(): Promise<void> {
    this.stopped = true;
    this.fsw?.close();
    await Promise.all(this.pending.values());
    for (const t of this.wipeTimers.values()) clearTimeout(t);
    this.wipeTimers.clear();
    for (const r of this.bySocket.values()) {
      r.health?.cancel();
      r.client.close();
    }
    this.bySocket.clear();
    this.removeAllListeners();
  }
}
