// The DRA kubelet plugin (issue 21, the kubelet side): a consumer of the node model that serves the
// kubelet's plugin registration on <registryDir>/<driver>-reg.sock and the DRAPlugin service (v1 and
// v1beta1) with the DRAResourceHealth stream (v1alpha1) on <pluginsDir>/<driver>/dra.sock.
//
// Registration: the kubelet's plugin watcher finds the registration socket, calls GetInfo and then
// NotifyRegistrationStatus; a socket of ours deleted (a kubelet wiping its directories, someone's
// rm) is served again at once (inotify on the directories and their parents, and a periodic check
// because inotify can miss events), dra.sock before the registration socket, so the kubelet that
// registers us finds the endpoint it was given. Listeners hear every registration (the slice
// publisher republishes then: the kubelet deletes slices at its start) and every loss.
//
// NodePrepareResources, per claim, one call per claim UID at a time: a claim already prepared (in the
// checkpoint, this boot) gets the same answer without asking the API server; otherwise the claim is
// read through the injected ClaimReader, its allocation checked against this node's devices now
// (core/dra-claims.ts), recorded PrepareStarted, its devices mapped to the CDI IDs of the NVIDIA
// Container Toolkit's spec, recorded PrepareCompleted, and only then answered. Errors are per claim,
// in the answer's map. NodeUnprepareResources forgets the claim (an unknown one is a success).
import * as grpc from '@grpc/grpc-js';
import { mkdir, stat } from 'node:fs/promises';
import { watch } from 'node:fs';
import type { FSWatcher } from 'node:fs';
import { basename, dirname, join } from 'node:path';
import {
  DRA_HEALTH_SERVICE_NAME,
  DRA_PLUGIN_TYPE,
  DRA_SERVICE_NAMES,
  HealthStatus,
  draHealthService,
  draPluginService,
  pluginRegistrationService,
} from '../api/dra.ts';
import type {
  Claim,
  DraDevice,
  NodePrepareResourceResponse,
  NodePrepareResourcesRequest,
  NodePrepareResourcesResponse,
  NodeUnprepareResourceResponse,
  NodeUnprepareResourcesRequest,
  NodeUnprepareResourcesResponse,
  NodeWatchResourcesRequest,
  NodeWatchResourcesResponse,
  PluginInfo,
  RegistrationStatus,
} from '../api/dra.ts';
import { allocatedDevices, cdiDeviceId, deviceHealthList, sameHealth } from '../core/dra-claims.ts';
import type { DraDeviceHealth, DraNodeDevice, PreparedDevice } from '../core/dra-claims.ts';
import { draDevices } from '../core/dra-devices.ts';
import type { NodeSnapshot } from '../core/snapshot.ts';
import type { AppliedSnapshot, NodeConsumer } from '../manager/consumer.ts';
import { errorText } from '../system/log.ts';
import type { Logger } from '../system/log.ts';
import { CDI_SPEC_DIRS, readCdiSpecs } from './cdi.ts';
import { BOOT_ID_FILE, CheckpointStore, readBootId } from './checkpoint.ts';
import { UnixSocketServer } from '../kubelet/socket-server.ts';

/** Reads a ResourceClaim from the API server (i21-slices' REST client implements it): the object's JSON. */
export interface ClaimReader {
  getResourceClaim(namespace: string, name: string): Promise<unknown>;
}

/** The devices this node offers through DRA now, named as its ResourceSlice names them. */
export type DeviceLister = (applied: AppliedSnapshot) => readonly DraNodeDevice[];

/**
 * The devices core/dra-devices.ts publishes for the snapshot (the slice publisher's list, by the MIG
 * strategy in force), with what prepare and the health stream need of each.
 */
export const publishedDevices: DeviceLister = (applied) => {
  const { snapshot, settings } = applied;
  return draDevices(snapshot, settings.plan.migStrategy ?? 'none').devices.flatMap((d): DraNodeDevice[] => {
    const gpu = snapshot.gpus[d.gpu];
    if (gpu === undefined) return [];
    const base = { name: d.name, gpuUuid: gpu.uuid, gpuIndex: gpu.index, minor: gpu.minor };
    return [d.mig === undefined ? base : { ...base, mig: { uuid: d.mig.uuid, index: d.mig.index } }];
  });
};

export interface DraKubeletPluginOptions {
  /** The DRA driver name (gpu.nvidia.com by default in the options). */
  readonly driver: string;
  /** This node's name: the pool every device of ours is in. */
  readonly nodeName: string;
  /** The kubelet's plugin watcher directory (/var/lib/kubelet/plugins_registry). */
  readonly registryDir: string;
  /** The kubelet's plugins directory (/var/lib/kubelet/plugins): dra.sock goes in <pluginsDir>/<driver>/. */
  readonly pluginsDir: string;
  readonly claims: ClaimReader;
  /** Default publishedDevices: the same list the slice publisher publishes. */
  readonly devices?: DeviceLister;
  /** Where CDI specs are looked for (default /etc/cdi, /var/run/cdi). */
  readonly cdiDirs?: readonly string[];
  /**
   * Default <pluginsDir>/<driver>/gpu-device-plugin-checkpoint.json: not NVIDIA's DRA driver's
   * checkpoint.json beside it, so a node moved between the two drivers keeps each one's file.
   */
  readonly checkpointPath?: string;
  /** Default /proc/sys/kernel/random/boot_id. */
  readonly bootIdPath?: string;
  /** The periodic socket check (inotify can miss events); default 5000 ms. */
  readonly checkIntervalMs?: number;
  /**
   * Awaited before a failure to serve the sockets is reported: the composition looks whether this
   * process lost its view of the directories (and then exits with that reason instead).
   */
  readonly beforeServeProblem?: () => Promise<void>;
  /** Wall clock, ms since the epoch (the health stream's times); default Date.now. */
  readonly now?: () => number;
  readonly log: Logger;
}

const SERVE = { missingDirHint: 'is the kubelet installed and started?' };

export const CHECKPOINT_FILE = 'gpu-device-plugin-checkpoint.json';

/** The services announced in GetInfo, in the order the kubelet picks from. */
export const SUPPORTED_VERSIONS: readonly string[] = [
  DRA_SERVICE_NAMES.v1,
  DRA_SERVICE_NAMES.v1beta1,
  DRA_HEALTH_SERVICE_NAME,
];

export type RegistrationListener = (reason: string) => void;

const HEALTH_ON_WIRE = { Healthy: HealthStatus.HEALTHY, Unhealthy: HealthStatus.UNHEALTHY } as const;

/** An fs.watch on one directory, with the directory's identity when it was opened. */
interface DirWatch {
  readonly watcher: FSWatcher;
  readonly identity: string;
}

function closeQuietly(w: FSWatcher): void {
  w.removeAllListeners();
  w.on('error', () => undefined);
  w.close();
}

async function dirIdentity(dir: string): Promise<string | null> {
  try {
    const st = await stat(dir);
    return st.isDirectory() ? `${st.dev}:${st.ino}` : null;
  } catch {
    return null;
  }
}

export class DraKubeletPlugin implements NodeConsumer {
  readonly name = 'dra-kubelet-plugin';
  readonly driver: string;
  readonly registrationSocket: string;
  readonly endpoint: string;
  readonly checkpointPath: string;
  private readonly opts: DraKubeletPluginOptions;
  private readonly log: Logger;
  private readonly pluginDir: string;
  private readonly now: () => number;
  private store: CheckpointStore | undefined;
  private regServer: UnixSocketServer | undefined;
  private draServer: UnixSocketServer | undefined;
  private snapshot: NodeSnapshot | null = null;
  private nodeDevices: readonly DraNodeDevice[] = [];
  private health: DraDeviceHealth[] = [];
  private startedAt = 0;
  private readonly streams = new Set<
    grpc.ServerWritableStream<NodeWatchResourcesRequest, NodeWatchResourcesResponse>
  >();
  private readonly watches = new Map<string, DirWatch>();
  private readonly perClaim = new Map<string, Promise<unknown>>();
  private readonly registeredListeners: RegistrationListener[] = [];
  private readonly lostListeners: RegistrationListener[] = [];
  private readonly claimsListeners: (() => void)[] = [];
  private timer: NodeJS.Timeout | undefined;
  private started: Promise<void> | undefined;
  private stopped = false;
  /** One reconcile at a time; `again` asks for one more after the one running. */
  private reconciling: Promise<void> | undefined;
  private again = false;
  private registeredFlag = false;
  private registrationCount = 0;
  private lastProblem: string | undefined;

  constructor(opts: DraKubeletPluginOptions) {
    this.opts = opts;
    this.driver = opts.driver;
    this.log = opts.log.child({ driver: opts.driver });
    this.now = opts.now ?? Date.now;
    this.pluginDir = join(opts.pluginsDir, opts.driver);
    this.registrationSocket = join(opts.registryDir, `${opts.driver}-reg.sock`);
    this.endpoint = join(this.pluginDir, 'dra.sock');
    this.checkpointPath = opts.checkpointPath ?? join(this.pluginDir, CHECKPOINT_FILE);
  }

  /** After every registration the kubelet confirms (NotifyRegistrationStatus true). */
  onRegistered(fn: RegistrationListener): void {
    this.registeredListeners.push(fn);
  }

  /** A registration stopped counting: our registration socket went, or the kubelet refused us. */
  onRegistrationLost(fn: RegistrationListener): void {
    this.lostListeners.push(fn);
  }

  /** Registered now (the kubelet's last word was yes, and our registration socket is the one it saw). */
  get registered(): boolean {
    return this.registeredFlag;
  }

  get registrations(): number {
    return this.registrationCount;
  }

  /** The claims the checkpoint holds (for `info`). */
  preparedClaims(): {
    uid: string;
    namespace: string;
    name: string;
    state: string;
    devices: string[];
    since?: string;
  }[] {
    const s = this.store;
    if (s === undefined) return [];
    return s.uids().flatMap((uid) => {
      const r = s.get(uid);
      return r === undefined
        ? []
        : [
            {
              uid,
              namespace: r.namespace,
              name: r.name,
              state: r.state,
              devices: r.devices.map((d) => d.device),
              ...(r.preparedAt === undefined ? {} : { since: r.preparedAt }),
            },
          ];
    });
  }

  /** After the checkpoint's claims changed (a prepare or unprepare written), and once it was read at start. */
  onClaimsChanged(fn: () => void): void {
    this.claimsListeners.push(fn);
  }

  private claimsChanged(): void {
    for (const fn of this.claimsListeners) fn();
  }

  async apply(applied: AppliedSnapshot): Promise<void> {
    this.snapshot = applied.snapshot;
    this.nodeDevices = (this.opts.devices ?? publishedDevices)(applied);
    if (this.started === undefined) {
      this.startedAt = Math.floor(this.now() / 1000);
      this.started = this.start();
    }
    this.updateHealth();
    await this.started;
  }

  private async start(): Promise<void> {
    const bootId = await readBootId(this.opts.bootIdPath ?? BOOT_ID_FILE);
    // The plugin directory is made when the sockets are served (reconcileOnce): a start without a
    // kubelet's directories goes on, and serves once they appear.
    this.store = await CheckpointStore.open(this.checkpointPath, bootId, this.log);
    if (this.store.size > 0)
      this.log.info('prepared DRA claims from the checkpoint', {
        claims: this.store.size,
        checkpoint: this.checkpointPath,
      });
    this.claimsChanged();
    this.timer = setInterval(() => this.kick(), this.opts.checkIntervalMs ?? 5000);
    this.timer.unref();
    await this.reconcile();
  }

  // ---- serving and registration ----

  /** Something changed in a watched directory, or the periodic check: make sure we serve. */
  private kick(): void {
    if (this.stopped) return;
    if (this.reconciling !== undefined) {
      this.again = true;
      return;
    }
    void this.reconcile();
  }

  private reconcile(): Promise<void> {
    if (this.reconciling !== undefined) {
      this.again = true;
      return this.reconciling;
    }
    const run = (async () => {
      do {
        this.again = false;
        await this.reconcileOnce();
      } while (this.again && !this.stopped);
    })().finally(() => {
      this.reconciling = undefined;
    });
    this.reconciling = run;
    return run;
  }

  private async reconcileOnce(): Promise<void> {
    if (this.stopped) return;
    try {
      await this.refreshWatches();
      // dra.sock first: the kubelet dials the endpoint it is given as soon as it registered us.
      if ((await dirIdentity(this.pluginDir)) === null && (await dirIdentity(this.opts.pluginsDir)) !== null) {
        await mkdir(this.pluginDir, { recursive: true, mode: 0o750 });
        if (this.draServer !== undefined)
          this.log.info('the DRA plugin directory was deleted; created it again', { dir: this.pluginDir });
        // Its checkpoint went with it: write what this process knows (the claims prepared are still prepared).
        if (this.store !== undefined && this.store.size > 0) await this.store.persist();
      }
      if (this.draServer === undefined || !(await this.draServer.stillOurs())) {
        const had = this.draServer !== undefined;
        await this.draServer?.stop();
        this.draServer = undefined;
        if (this.stopped) return;
        this.draServer = await UnixSocketServer.start(this.endpoint, this.draServices(), SERVE);
        if (had) this.log.info('dra.sock was removed; serving it again', { socket: this.endpoint });
      }
      if (this.regServer === undefined || !(await this.regServer.stillOurs())) {
        const had = this.regServer !== undefined;
        await this.regServer?.stop();
        this.regServer = undefined;
        if (had)
          this.lost(
            'our registration socket was removed (the kubelet wiped its plugin directory, or someone removed it)',
          );
        if (this.stopped) return;
        this.regServer = await UnixSocketServer.start(
          this.registrationSocket,
          [{ definition: pluginRegistrationService(), implementation: this.registrationImpl() }],
          SERVE,
        );
        this.log.debug('serving the plugin registration', { socket: this.registrationSocket });
      }
      if (this.lastProblem !== undefined)
        this.log.info('serving the DRA sockets again', {
          registration: this.registrationSocket,
          endpoint: this.endpoint,
        });
      this.lastProblem = undefined;
      await this.refreshWatches();
    } catch (err) {
      const problem = errorText(err);
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

  /** Watches the two socket directories and their parents (which see a directory deleted and re-created). */
  private async refreshWatches(): Promise<void> {
    const interesting = new Set([
      basename(this.registrationSocket),
      basename(this.endpoint),
      basename(this.opts.registryDir),
      basename(this.opts.pluginsDir),
      this.driver,
    ]);
    const dirs = [
      ...new Set([this.opts.registryDir, this.pluginDir, dirname(this.opts.registryDir), this.opts.pluginsDir]),
    ];
    for (const dir of dirs) {
      if (this.stopped) return;
      const id = await dirIdentity(dir);
      const have = this.watches.get(dir);
      if (have !== undefined && have.identity === id) continue;
      if (have !== undefined) {
        closeQuietly(have.watcher);
        this.watches.delete(dir);
      }
      if (id === null) continue;
      try {
        const w = watch(dir, { persistent: false }, (_event, name) => {
          const n = name?.toString();
          if (n === undefined || interesting.has(n)) this.kick();
        });
        w.on('error', () => {
          closeQuietly(w);
          if (this.watches.get(dir)?.watcher === w) this.watches.delete(dir);
          this.kick();
        });
        this.watches.set(dir, { watcher: w, identity: id });
      } catch (err) {
        this.log.debug('cannot watch a DRA directory; the periodic check covers it', { dir, error: errorText(err) });
      }
    }
  }

  private lost(reason: string): void {
    if (!this.registeredFlag) return;
    this.registeredFlag = false;
    this.log.info('DRA registration lost', { reason });
    for (const fn of this.lostListeners) fn(reason);
  }

  private registrationImpl(): grpc.UntypedServiceImplementation {
    return {
      GetInfo: (_call: grpc.ServerUnaryCall<unknown, PluginInfo>, cb: grpc.sendUnaryData<PluginInfo>) => {
        cb(null, {
          type: DRA_PLUGIN_TYPE,
          name: this.driver,
          endpoint: this.endpoint,
          supported_versions: [...SUPPORTED_VERSIONS],
        });
      },
      NotifyRegistrationStatus: (
        call: grpc.ServerUnaryCall<RegistrationStatus, object>,
        cb: grpc.sendUnaryData<object>,
      ) => {
        const s = call.request;
        cb(null, {});
        if (s.plugin_registered) {
          this.registeredFlag = true;
          this.registrationCount++;
          this.log.info('registered with the kubelet', {
            endpoint: this.endpoint,
            registrations: this.registrationCount,
          });
          for (const fn of this.registeredListeners) fn('the kubelet registered the DRA plugin');
        } else {
          this.log.error("the kubelet refused the DRA plugin's registration", {
            error: s.error,
            offered: SUPPORTED_VERSIONS,
          });
          this.lost(`the kubelet refused the registration: ${s.error}`);
        }
      },
    };
  }

  // ---- the DRAPlugin and health services ----

  private draServices(): { definition: grpc.ServiceDefinition; implementation: grpc.UntypedServiceImplementation }[] {
    const impl: grpc.UntypedServiceImplementation = {
      NodePrepareResources: (
        call: grpc.ServerUnaryCall<NodePrepareResourcesRequest, NodePrepareResourcesResponse>,
        cb: grpc.sendUnaryData<NodePrepareResourcesResponse>,
      ) => {
        this.prepare(call.request.claims ?? []).then(
          (r) => cb(null, r),
          (err: unknown) => cb({ code: grpc.status.INTERNAL, details: `NodePrepareResources: ${errorText(err)}` }),
        );
      },
      NodeUnprepareResources: (
        call: grpc.ServerUnaryCall<NodeUnprepareResourcesRequest, NodeUnprepareResourcesResponse>,
        cb: grpc.sendUnaryData<NodeUnprepareResourcesResponse>,
      ) => {
        this.unprepare(call.request.claims ?? []).then(
          (r) => cb(null, r),
          (err: unknown) => cb({ code: grpc.status.INTERNAL, details: `NodeUnprepareResources: ${errorText(err)}` }),
        );
      },
    };
    const healthImpl: grpc.UntypedServiceImplementation = {
      NodeWatchResources: (call: grpc.ServerWritableStream<NodeWatchResourcesRequest, NodeWatchResourcesResponse>) =>
        this.watchHealth(call),
    };
    return [
      { definition: draPluginService('v1'), implementation: impl },
      { definition: draPluginService('v1beta1'), implementation: impl },
      { definition: draHealthService(), implementation: healthImpl },
    ];
  }

  /** Runs `fn` after every earlier call for the same claim UID has finished. */
  private serialised<T>(uid: string, fn: () => Promise<T>): Promise<T> {
    const prev = this.perClaim.get(uid) ?? Promise.resolve();
    const next = prev.then(fn, fn);
    const tail = next.catch(() => undefined);
    this.perClaim.set(uid, tail);
    void tail.then(() => {
      if (this.perClaim.get(uid) === tail) this.perClaim.delete(uid);
    });
    return next;
  }

  async prepare(claims: readonly Claim[]): Promise<NodePrepareResourcesResponse> {
    const out: Record<string, NodePrepareResourceResponse> = {};
    await Promise.all(
      claims.map(async (c) => {
        const r = await this.serialised(c.uid, () => this.prepareOne(c)).catch((err: unknown) => ({
          devices: [],
          error: `claim ${c.namespace}/${c.name} (uid ${c.uid}): ${errorText(err)}`,
        }));
        out[c.uid] = r;
        if (r.error !== '')
          this.log.warn('cannot prepare a DRA claim', {
            claim: `${c.namespace}/${c.name}`,
            uid: c.uid,
            error: r.error,
          });
      }),
    );
    return { claims: out };
  }

  private async prepareOne(c: Claim): Promise<NodePrepareResourceResponse> {
    const fail = (error: string): NodePrepareResourceResponse => ({ devices: [], error });
    if (c.uid === '' || c.name === '' || c.namespace === '')
      return fail(
        `the claim ${JSON.stringify(c)} lacks a uid, name or namespace: the kubelet names each claim by all three`,
      );
    const store = this.store;
    if (store === undefined)
      return fail('the DRA plugin has not started yet (no node snapshot applied); the kubelet will try again');
    const done = store.get(c.uid);
    if (done?.state === 'PrepareCompleted') return { devices: done.devices.map(wire), error: '' };
    let json: unknown;
    try {
      json = await this.opts.claims.getResourceClaim(c.namespace, c.name);
    } catch (err) {
      return fail(`cannot read ResourceClaim ${c.namespace}/${c.name} from the API server: ${errorText(err)}`);
    }
    const devices = this.nodeDevices;
    const verdict = allocatedDevices(json, c, this.driver, this.opts.nodeName, devices);
    if ('error' in verdict) return fail(verdict.error);
    const record = { namespace: c.namespace, name: c.name };
    try {
      await store.put(c.uid, {
        ...record,
        state: 'PrepareStarted',
        devices: verdict.devices.map((d) => ({
          requests: d.requests,
          pool: d.pool,
          device: d.device,
          cdiDeviceIds: [],
        })),
      });
    } catch (err) {
      return fail(`cannot record claim ${c.namespace}/${c.name} in the checkpoint: ${errorText(err)}`);
    }
    const dirs = this.opts.cdiDirs ?? CDI_SPEC_DIRS;
    const specs = verdict.devices.length === 0 ? [] : await readCdiSpecs(dirs);
    const prepared: PreparedDevice[] = [];
    const problems: string[] = [];
    for (const d of verdict.devices) {
      const dev = devices.find((x) => x.name === d.device);
      if (dev === undefined) continue; // allocatedDevices checked it is there
      const cdi = cdiDeviceId(dev, specs, dirs);
      if ('error' in cdi) problems.push(`device ${d.device}: ${cdi.error}`);
      else prepared.push({ requests: d.requests, pool: d.pool, device: d.device, cdiDeviceIds: [cdi.id] });
    }
    if (problems.length > 0) return fail(`claim ${c.namespace}/${c.name}: ${problems.join('; ')}`);
    try {
      await store.put(c.uid, {
        ...record,
        state: 'PrepareCompleted',
        devices: prepared,
        preparedAt: new Date(this.now()).toISOString(),
      });
    } catch (err) {
      return fail(`cannot record claim ${c.namespace}/${c.name} in the checkpoint: ${errorText(err)}`);
    }
    this.claimsChanged();
    this.log.info('prepared a DRA claim', {
      claim: `${c.namespace}/${c.name}`,
      uid: c.uid,
      devices: prepared.map((d) => d.device),
      cdi: prepared.flatMap((d) => d.cdiDeviceIds),
    });
    return { devices: prepared.map(wire), error: '' };
  }

  async unprepare(claims: readonly Claim[]): Promise<NodeUnprepareResourcesResponse> {
    const out: Record<string, NodeUnprepareResourceResponse> = {};
    await Promise.all(
      claims.map(async (c) => {
        out[c.uid] = await this.serialised(c.uid, async () => {
          const store = this.store;
          if (store === undefined)
            return {
              error: 'the DRA plugin has not started yet (no node snapshot applied); the kubelet will try again',
            };
          try {
            if (await store.remove(c.uid)) {
              this.log.info('unprepared a DRA claim', { claim: `${c.namespace}/${c.name}`, uid: c.uid });
              this.claimsChanged();
            }
            return { error: '' };
          } catch (err) {
            return {
              error: `cannot remove claim ${c.namespace}/${c.name} (uid ${c.uid}) from the checkpoint: ${errorText(err)}`,
            };
          }
        });
      }),
    );
    return { claims: out };
  }

  // ---- health ----

  private healthMessage(): NodeWatchResourcesResponse {
    return {
      devices: this.health.map((h) => ({
        device: { pool_name: this.opts.nodeName, device_name: h.device },
        health: HEALTH_ON_WIRE[h.health],
        last_updated_time: h.lastUpdated,
        health_check_timeout_seconds: 0,
        message: h.message,
      })),
    };
  }

  private updateHealth(): void {
    if (this.snapshot === null) return;
    const next = deviceHealthList(this.snapshot, this.nodeDevices, this.startedAt);
    if (sameHealth(next, this.health)) return;
    this.health = next;
    const msg = this.healthMessage();
    for (const s of this.streams) s.write(msg);
  }

  private watchHealth(call: grpc.ServerWritableStream<NodeWatchResourcesRequest, NodeWatchResourcesResponse>): void {
    if (this.stopped) {
      call.end();
      return;
    }
    this.streams.add(call);
    const drop = (): void => {
      this.streams.delete(call);
    };
    call.on('cancelled', drop);
    call.on('close', drop);
    call.on('error', drop);
    call.write(this.healthMessage());
  }

  // ---- stop ----

  async stop(): Promise<void> {
    this.stopped = true;
    if (this.timer !== undefined) clearInterval(this.timer);
    for (const w of this.watches.values()) closeQuietly(w.watcher);
    this.watches.clear();
    await this.started?.catch(() => undefined);
    await this.reconciling?.catch(() => undefined);
    // End each stream with an OK status, and let that reach the kubelet before the server goes
    // (a forced shutdown would cut it); a stream whose peer does not read is not waited on past 1 s.
    await Promise.all(
      [...this.streams].map(
        (s) =>
          new Promise<void>((resolve) => {
            const t = setTimeout(resolve, 1000);
            t.unref();
            const done = (): void => {
              clearTimeout(t);
              resolve();
            };
            s.once('finish', done);
            s.once('close', done);
            s.end();
          }),
      ),
    );
    this.streams.clear();
    await Promise.all([...this.perClaim.values()]);
    await this.regServer?.stop();
    await this.draServer?.stop();
    this.regServer = undefined;
    this.draServer = undefined;
  }
}

function wire(d: PreparedDevice): DraDevice {
  return {
    request_names: [...d.requests],
    pool_name: d.pool,
    device_name: d.device,
    cdi_device_ids: [...d.cdiDeviceIds],
  };
}
