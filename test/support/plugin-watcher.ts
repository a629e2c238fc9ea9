// A stand-in for the kubelet's plugin watcher and DRA plugin manager, over real gRPC with
// the kubelet's own protos (src/api/dra.ts). Modelled on the kubelet's pluginmanager and
// cm/dra/plugin code (kubernetes/kubernetes, read for facts): it watches a plugins_registry directory
// for unix sockets whose names do not start with '.' (and walks what is there at start), dials each
// one, calls GetInfo (1 s in the kubelet), looks up the handler by PluginInfo.type (only "DRAPlugin"
// here), takes an empty endpoint as the registration socket itself, validates supported_versions (the
// first entry of the plugin's list that the kubelet speaks is chosen; an empty list or no overlap is
// refused), refuses a second registration of the same endpoint for one driver, and reports the
// outcome with NotifyRegistrationStatus(true) or (false, "RegisterPlugin error -- …" in the
// kubelet's words). The file's removal is deregistration; a new socket under the same name registers
// again. Several plugins of one driver may be registered (rolling update): calls go to the newest.
// A registered driver gets a DraClient (NodePrepareResources / NodeUnprepareResources, 45 s, to the
// endpoint it named, in the version chosen) and, as the kubelet does with ResourceHealthStatus on,
// a NodeWatchResources stream whose latest list is kept (re-opened after `healthRetryMs` if it
// fails or ends, 5 s in the kubelet). Which health service: a 1.34–1.36 kubelet (`healthVersions`
// ['v1alpha1'], the default) opens v1alpha1's for every plugin, listed or not; a 1.37 kubelet (['v1',
// 'v1alpha1']) opens the first of its versions the plugin lists in supported_versions (v1 before v1alpha1),
// and none when the plugin lists neither (the kubelet's pickHealthService). It keeps what the kubelet's
// health cache keeps (cm/dra/healthinfo.go): per device its last reported health and message, the time
// the report was *received* (the report's own last_updated_time is not used) and the timeout the report
// states (0: 30 s); `kubeletHealth()` answers as the kubelet fills a pod's allocatedResourcesStatus — Unknown
// once the last report received is older than its timeout — and `staleReports` records every report that
// came after its device had already turned Unknown that way. With `slices` set it also does
// what the kubelet does to ResourceSlices: at start it deletes every slice of its node, and `wipeDelayMs`
// (30 s in the kubelet) after a driver's last plugin went away it deletes that driver's slices, unless one
// registered again.
// A socket whose GetInfo fails (its server not answering yet, on a loaded node) is tried again while it
// stays, from 500 ms doubling to 8 s, as the kubelet's reconciler does (its backoff goes on to 2 min); each
// failed try is a rejection. Not modelled: sub-directories of the registry, the kubelet's 1 s reconcile
// loop (this reacts to each inotify event at once), gRPC connection monitoring of the DRA endpoint (the kubelet also
// starts the wipe delay when no plugin of a driver is *connected*, not only when it deregistered),
// CSI and device-plugin handlers.
import * as grpc from '@grpc/grpc-js';
import { EventEmitter } from 'node:events';
import { watch } from 'node:fs';
import type { FSWatcher } from 'node:fs';
import { lstat, readdir } from 'node:fs/promises';
import { basename, join } from 'node:path';
import {
  DRA_HEALTH_SERVICE_NAMES,
  DRA_PLUGIN_TYPE,
  HealthStatus,
  DRA_SERVICE_NAMES,
  draHealthService,
  draPluginService,
  pluginRegistrationService,
} from '../../src/api/dra.ts';
import type {
  Claim,
  DeviceHealth,
  DraHealthVersion,
  DraVersion,
  NodePrepareResourcesResponse,
  NodeUnprepareResourcesResponse,
  NodeWatchResourcesResponse,
  PluginInfo,
} from '../../src/api/dra.ts';
import { onEvent, waitFor } from './wait.ts';

/** What the kubelet does to ResourceSlices (the API server stand-in implements it). */
export interface SliceJanitor {
  /** Deletes the node's slices, of one driver or (driver undefined) of every driver; returns how many. */
  deleteNodeSlices(nodeName: string, driver?: string): number;
}

export interface WatcherOptions {
  /** The services this kubelet speaks, in the kubelet's terms (default both, as 1.34–1.37). */
  versions?: readonly DraVersion[];
  /** Open the health stream of every registered plugin (default true: 1.36, ResourceHealthStatus on). */
  health?: boolean;
  /**
   * The health services this kubelet speaks, preferred first: ['v1alpha1'] (default) as 1.34–1.36, or
   * ['v1', 'v1alpha1'] as 1.37 (see pickHealthVersion).
   */
  healthVersions?: readonly DraHealthVersion[];
  /** Wait before re-opening a health stream that failed or ended (default 5000, the kubelet's). */
  healthRetryMs?: number;
  /** Deadline of GetInfo and NotifyRegistrationStatus each (default 2 s; the kubelet's are 1 s and 5 s). */
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
  /** The health service whose stream is opened (null: none). */
  healthVersion: DraHealthVersion | null;
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

/** A device's health as the kubelet shows it in a pod's allocatedResourcesStatus. */
export type KubeletDeviceHealth = 'Healthy' | 'Unhealthy' | 'Unknown';

/** The kubelet's default when a report states no timeout (health_check_timeout_seconds 0). */
export const KUBELET_HEALTH_TIMEOUT_MS = 30_000;

/** What the kubelet's health cache keeps of one device's last report. */
interface CachedHealth {
  health: KubeletDeviceHealth;
  message: string;
  /** When the report came (Date.now()), not the report's own last_updated_time. */
  receivedMs: number;
  timeoutMs: number;
}

/** A report of a device that came after the previous one had gone stale (the device was Unknown meanwhile). */
export interface StaleReport {
  driver: string;
  /** pool/device. */
  device: string;
  /** How old the previous report was when this one came. */
  ageMs: number;
  timeoutMs: number;
}

const WIRE_HEALTH: Record<number, KubeletDeviceHealth> = {
  [HealthStatus.HEALTHY]: 'Healthy',
  [HealthStatus.UNHEALTHY]: 'Unhealthy',
};

interface Registered {
  reg: DriverRegistration;
  client: DraClient;
  /**
   * The socket file's identity when it registered (inode and change time: a socket bound again at
   * once may reuse the inode number): a new file under the same name registers again.
   */
  identity: string;
  health: grpc.ClientReadableStream<NodeWatchResourcesResponse> | undefined;
  retry?: NodeJS.Timeout;
}

/** Dials a unix socket with its own connection (closed with close()). */
function dial(path: string): grpc.Client {
  return new grpc.Client(`unix://${path}`, grpc.credentials.createInsecure(), { 'grpc.use_local_subchannel_pool': 1 });
}

/** One call; waitForReady waits (up to the deadline) for a server still between bind() and listen(). */
function unary<Req, Res>(
  client: grpc.Client,
  m: grpc.MethodDefinition<Req, Res>,
  req: Req,
  timeoutMs: number,
  waitForReady = false,
): Promise<Res> {
  return new Promise<Res>((resolve, reject) => {
    client.makeUnaryRequest(
      m.path,
      m.requestSerialize,
      m.responseDeserialize,
      req,
      new grpc.Metadata({ waitForReady }),
      { deadline: Date.now() + timeoutMs },
      (err, res) => (err || res === undefined ? reject(err ?? new Error(`${m.path}: no response`)) : resolve(res)),
    );
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

  /** Opens the health stream on the same connection (<version>.DRAResourceHealth/NodeWatchResources). */
  watchHealth(version: DraHealthVersion): grpc.ClientReadableStream<NodeWatchResourcesResponse> {
    const m = draHealthService(version).NodeWatchResources;
    return this.client.makeServerStreamRequest(m.path, m.requestSerialize, m.responseDeserialize, {});
  }

  close(): void {
    this.client.close();
  }
}

/**
 * The kubelet's checks on GetInfo's answer (plugin manager, then the DRA handler's ValidatePlugin):
 * the version chosen, or the error text it sends with NotifyRegistrationStatus(false).
 */
export function validatePluginInfo(
  info: PluginInfo,
  socket: string,
  versions: readonly DraVersion[],
): { version: DraVersion; endpoint: string } | { error: string } {
  if (info.type !== DRA_PLUGIN_TYPE)
    return { error: `RegisterPlugin error -- no handler registered for plugin type: ${info.type} at socket ${socket}` };
  const endpoint = info.endpoint === '' ? socket : info.endpoint;
  const invalid = (why: string): { error: string } => ({
    error:
      `RegisterPlugin error -- plugin validation failed with err: invalid supported ` +
      `gRPC versions of DRA driver plugin ${info.name} at endpoint ${endpoint}: ${why}`,
  });
  if (info.supported_versions.length === 0)
    return invalid('empty list of supported gRPC services (aka supported versions)');
  for (const offered of info.supported_versions) {
    const v = versions.find((k) => DRA_SERVICE_NAMES[k] === offered);
    if (v !== undefined) return { version: v, endpoint };
  }
  const goQuote = (l: readonly string[]): string => `[${l.map((x) => JSON.stringify(x)).join(' ')}]`;
  return invalid(
    `none of services supported by the plugin (${goQuote(info.supported_versions)}) are ` +
      `supported by the kubelet (${goQuote(versions.map((v) => DRA_SERVICE_NAMES[v]))})`,
  );
}

/**
 * The health service a kubelet speaking `versions` opens for a plugin: one that speaks only v1alpha1
 * (1.34–1.36) opens it whatever the plugin lists; one that speaks v1 (1.37) opens the first of its versions
 * the plugin lists, or none.
 */
export function pickHealthVersion(info: PluginInfo, versions: readonly DraHealthVersion[]): DraHealthVersion | null {
  if (!versions.includes('v1')) return versions.includes('v1alpha1') ? 'v1alpha1' : null;
  return versions.find((v) => info.supported_versions.includes(DRA_HEALTH_SERVICE_NAMES[v])) ?? null;
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
  /** Per driver, per pool/device: the kubelet's health cache (see kubeletHealth). */
  private readonly healthCache = new Map<string, Map<string, CachedHealth>>();
  /** Reports that came after their device's previous one had gone stale. */
  readonly staleReports: StaleReport[] = [];
  /** Health streams that failed or ended (a driver without the service answers UNIMPLEMENTED). */
  readonly healthErrors: { driver: string; code: grpc.status | undefined; message: string }[] = [];
  private readonly versions: readonly DraVersion[];
  private readonly opts: WatcherOptions;
  private readonly callTimeoutMs: number;
  private fsw: FSWatcher | undefined;
  /** By registration socket path. */
  private readonly bySocket = new Map<string, Registered>();
  /** Per socket path, the chain of checks so that events on one path are handled in order. */
  private readonly pending = new Map<string, Promise<void>>();
  private readonly wipeTimers = new Map<string, NodeJS.Timeout>();
  /** GetInfo tried again, per socket: the timer and the next delay. */
  private readonly retries = new Map<string, { timer: NodeJS.Timeout; nextMs: number }>();
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
    // inotify's create and delete come as 'rename'; 'change' (a chmod, say) is ignored, as by the kubelet.
    w.fsw = watch(dir, (event, name) => {
      if (event === 'rename' && typeof name === 'string') w.check(name);
    });
    w.fsw.on('error', (err) => w.emit('watch-error', err));
    for (const name of await readdir(dir)) w.check(name);
    return w;
  }

  /** The DRA client of a registered driver (the newest registration of that name). */
  client(driver: string): DraClient {
    const r = this.current(driver);
    if (r === undefined)
      throw new Error(
        `plugin watcher stand-in: no driver ${driver} registered ` +
          `(registered: ${[...this.bySocket.values()].map((x) => x.reg.name).join(', ') || 'none'})`,
      );
    return r.client;
  }

  registered(driver: string): DriverRegistration | undefined {
    return this.current(driver)?.reg;
  }

  private current(driver: string): Registered | undefined {
    let best: Registered | undefined;
    for (const r of this.bySocket.values())
      if (r.reg.name === driver && (best === undefined || r.reg.at > best.reg.at)) best = r;
    return best;
  }

  private check(name: string): void {
    if (name.startsWith('.')) return;
    const path = join(this.dir, name);
    const prev = this.pending.get(path) ?? Promise.resolve();
    const next = prev
      .then(() => this.reconcile(path))
      .catch((err: unknown) => {
        this.emit('watch-error', err);
      });
    this.pending.set(path, next);
  }

  /** GetInfo failed on this socket: look at it again after the backoff, if it is still the same file then. */
  private retryLater(socket: string, identity: string): void {
    const nextMs = this.retries.get(socket)?.nextMs ?? 500;
    const timer = setTimeout(() => {
      void lstat(socket, { bigint: true })
        .then((st) => {
          if (!this.stopped && `${st.ino}:${st.ctimeNs}` === identity) this.check(basename(socket));
        })
        .catch(() => undefined);
    }, nextMs);
    this.retries.set(socket, { timer, nextMs: Math.min(nextMs * 2, 8000) });
  }

  private async reconcile(path: string): Promise<void> {
    if (this.stopped) return;
    const st = await lstat(path, { bigint: true }).catch(() => undefined);
    const have = this.bySocket.get(path);
    if (st === undefined || !st.isSocket()) {
      const retry = this.retries.get(path);
      if (retry !== undefined) clearTimeout(retry.timer);
      this.retries.delete(path);
      if (have !== undefined) this.deregister(path, have);
      return;
    }
    const identity = `${st.ino}:${st.ctimeNs}`;
    if (have !== undefined && have.identity === identity) return; // the same socket, already registered
    // A try under way or due: this one is it (the backoff goes on from where it was until one succeeds).
    const retry = this.retries.get(path);
    if (retry !== undefined) clearTimeout(retry.timer);
    if (have !== undefined) this.deregister(path, have);
    await this.register(path, identity);
  }

  private async register(socket: string, identity: string): Promise<void> {
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
        this.rejected.push({
          socket,
          info: undefined,
          reason: `GetInfo on ${socket} failed: ${(err as Error).message}`,
          notified: false,
        });
        this.emit('rejected', socket);
        this.retryLater(socket, identity);
        return;
      }
      const verdict = validatePluginInfo(info, socket, this.versions);
      let problem = 'error' in verdict ? verdict.error : undefined;
      if (
        !('error' in verdict) &&
        [...this.bySocket.values()].some((r) => r.reg.name === info.name && r.reg.endpoint === verdict.endpoint)
      ) {
        problem =
          `RegisterPlugin error -- plugin registration failed with err: ` +
          `endpoint ${verdict.endpoint} already registered for DRA driver plugin ${info.name}`;
      }
      if (problem !== undefined || 'error' in verdict) {
        const reason = problem ?? 'unreachable';
        let notified = false;
        try {
          await unary(
            reg,
            svc.NotifyRegistrationStatus,
            { plugin_registered: false, error: reason },
            this.callTimeoutMs,
          );
          notified = true;
        } catch {
          // the plugin is gone or does not answer; the kubelet only logs this
        }
        this.rejected.push({ socket, info, reason, notified });
        this.emit('rejected', socket);
        return;
      }
      const endpoint = verdict.endpoint;
      const client = new DraClient(endpoint, verdict.version);
      const registration: DriverRegistration = {
        name: info.name,
        endpoint,
        socket,
        version: verdict.version,
        healthVersion: pickHealthVersion(info, this.opts.healthVersions ?? ['v1alpha1']),
        info,
        at: 0,
      };
      const entry: Registered = { reg: registration, client, identity, health: undefined };
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
      this.retries.delete(socket);
      this.registrations.push(registration);
      if (this.opts.health ?? true) this.openHealth(entry);
      this.emit('registered', registration);
    } finally {
      reg.close();
    }
  }

  private openHealth(entry: Registered): void {
    const version = entry.reg.healthVersion;
    if (this.stopped || this.bySocket.get(entry.reg.socket) !== entry || version === null) return;
    const stream = entry.client.watchHealth(version);
    entry.health = stream;
    const name = entry.reg.name;
    let retried = false;
    const retry = (err?: grpc.ServiceError): void => {
      if (retried || entry.health !== stream) return;
      retried = true;
      this.healthErrors.push({ driver: name, code: err?.code, message: err?.details ?? 'the stream ended' });
      this.emit('health-ended', name, err);
      entry.retry = setTimeout(() => this.openHealth(entry), this.opts.healthRetryMs ?? 5000);
    };
    stream.on('data', (msg: NodeWatchResourcesResponse) => {
      const h = this.health.get(name);
      this.health.set(name, { devices: msg.devices, messages: (h?.messages ?? 0) + 1 });
      this.cacheHealth(name, msg.devices, Date.now());
      this.emit('health', name, msg.devices);
    });
    stream.on('error', (err: grpc.ServiceError) => retry(err));
    stream.on('end', () => retry());
  }

  /**
   * The kubelet's update of its health cache from one message: each device reported is stored with the
   * time it came and its stated timeout; a device of the cache not in the message turns Unknown once its
   * last report is older than its timeout (the kubelet's rule for devices a plugin stopped reporting).
   */
  private cacheHealth(driver: string, devices: readonly DeviceHealth[], nowMs: number): void {
    let cache = this.healthCache.get(driver);
    if (cache === undefined) {
      cache = new Map();
      this.healthCache.set(driver, cache);
    }
    const reported = new Set<string>();
    for (const d of devices) {
      const key = `${d.device?.pool_name ?? ''}/${d.device?.device_name ?? ''}`;
      reported.add(key);
      const prev = cache.get(key);
      if (prev !== undefined && nowMs - prev.receivedMs > prev.timeoutMs)
        this.staleReports.push({ driver, device: key, ageMs: nowMs - prev.receivedMs, timeoutMs: prev.timeoutMs });
      const secs = Number(d.health_check_timeout_seconds);
      cache.set(key, {
        health: WIRE_HEALTH[d.health] ?? 'Unknown',
        message: d.message,
        receivedMs: nowMs,
        timeoutMs: secs > 0 ? secs * 1000 : KUBELET_HEALTH_TIMEOUT_MS,
      });
    }
    for (const [key, c] of cache) {
      if (!reported.has(key) && c.health !== 'Unknown' && nowMs - c.receivedMs > c.timeoutMs)
        cache.set(key, { ...c, health: 'Unknown', message: '', receivedMs: nowMs });
    }
  }

  /**
   * A device's health as the kubelet would put it in a pod's status at `nowMs`: Unknown when nothing was
   * reported of it, or its last report came more than its stated timeout ago (then without a message).
   */
  kubeletHealth(
    driver: string,
    pool: string,
    device: string,
    nowMs = Date.now(),
  ): { health: KubeletDeviceHealth; message: string } {
    const c = this.healthCache.get(driver)?.get(`${pool}/${device}`);
    if (c === undefined || nowMs - c.receivedMs > c.timeoutMs) return { health: 'Unknown', message: '' };
    return { health: c.health, message: c.message };
  }

  /** Every device the kubelet's cache holds for the driver, by pool/device, as kubeletHealth answers at nowMs. */
  kubeletHealthAll(driver: string, nowMs = Date.now()): Map<string, KubeletDeviceHealth> {
    const out = new Map<string, KubeletDeviceHealth>();
    for (const key of this.healthCache.get(driver)?.keys() ?? []) {
      const [pool = '', device = ''] = key.split('/');
      out.set(key, this.kubeletHealth(driver, pool, device, nowMs).health);
    }
    return out;
  }

  private closeEntry(r: Registered): void {
    const stream = r.health;
    r.health = undefined;
    stream?.cancel();
    if (r.retry !== undefined) clearTimeout(r.retry);
    r.client.close();
  }

  private deregister(socket: string, r: Registered): void {
    this.bySocket.delete(socket);
    this.closeEntry(r);
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

  waitForHealthErrors(
    n: number,
    timeoutMs = 10_000,
  ): Promise<{ driver: string; code: grpc.status | undefined; message: string }> {
    return this.waitFor(() => this.healthErrors[n - 1], 'health-ended', timeoutMs, `health stream failure #${n}`);
  }

  /** Resolves with the driver's health list once it satisfies pred. */
  waitForHealth(driver: string, pred: (d: DeviceHealth[]) => boolean, timeoutMs = 10_000): Promise<DeviceHealth[]> {
    return this.waitFor(
      () => {
        const h = this.health.get(driver);
        return h !== undefined && pred(h.devices) ? h.devices : undefined;
      },
      'health',
      timeoutMs,
      `a matching health list from ${driver}`,
    );
  }

  private waitFor<T>(probe: () => T | undefined, event: string, timeoutMs: number, what: string): Promise<T> {
    return waitFor(probe, {
      on: onEvent(this, event),
      deadlineMs: timeoutMs,
      what: () =>
        `plugin watcher stand-in: no ${what} (registered ${this.registrations.length}, ` +
        `rejected ${JSON.stringify(this.rejected.map((r) => r.reason))})`,
    });
  }

  async stop(): Promise<void> {
    this.stopped = true;
    this.fsw?.close();
    await Promise.all(this.pending.values());
    for (const r of this.retries.values()) clearTimeout(r.timer);
    this.retries.clear();
    for (const t of this.wipeTimers.values()) clearTimeout(t);
    this.wipeTimers.clear();
    for (const r of this.bySocket.values()) this.closeEntry(r);
    this.bySocket.clear();
    this.removeAllListeners();
  }
}
