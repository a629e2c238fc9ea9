// The resource manager: makes the served resources match a planned node (planner.ts). A resource with devices
// gets a server and a registration (ResourceRuntime); one that is no longer planned is stopped and
// its socket removed; every other one gets the new state, so its open ListAndWatch streams see the
// new list at once. It re-registers only when asked to for a changed device set (a config reload,
// as NVIDIA's plugin does on SIGHUP); re-discovery and health changes travel on the open streams.
// Allocate and GetPreferredAllocation answer from the state they see; an ID that has just vanished
// is refused naming it. The topology policy is rebuilt only when the GPUs changed, and warmed up
// only once registered (its JIT warm-up would otherwise hold up the first registration).
import { dirname } from 'node:path';
import { indexDevices } from '../core/allocate.ts';
import type { AllocateSettings, DeviceIndex } from '../core/allocate.ts';
import type { AdvertisedDevice, Gpu } from '../core/devices.ts';
import { lowestFirstChooser } from '../core/preferred.ts';
import type { GpuChooser } from '../core/preferred.ts';
import type { ResourceDiff } from '../core/resource-diff.ts';
import type { PlannedResource, SharedAllocationPolicy } from '../core/sharing.ts';
import { resourceHealth } from '../core/snapshot.ts';
import type { NodeSnapshot } from '../core/snapshot.ts';
import type { SnapshotDiff } from '../core/snapshot-diff.ts';
import { PreferredPolicy, buildScoreMatrix } from '../core/topology/index.ts';
import { liveNvlinks } from '../core/snapshot-signals.ts';
import { SocketDirView } from '../kubelet/watcher.ts';
import { errorText } from '../system/log.ts';
import type { Logger } from '../system/log.ts';
import type { RegistrationRecorder, RpcRecorder } from '../core/metrics.ts';
import type { NodeSettings } from '../node/consumer.ts';
import { TimerOwner } from '../system/timers.ts';
import { ResourceRuntime } from './resource.ts';
import type { ServerFactory } from './resource.ts';
import type { AppliedPlan, PlanListener } from './planner.ts';
import type { PluginState } from './service.ts';

/** How answers are given, from the options (not from the node). */
export interface ServeSettings {
  readonly allocate: Omit<AllocateSettings, 'failRequestsGreaterThanOne' | 'resourceName' | 'newUuid' | 'mps'>;
  readonly sharedPolicy: SharedAllocationPolicy;
}

/** The configuration in force as the resource manager reads it: the node's, and how answers are given. */
export interface ServedSettings extends NodeSettings {
  readonly serve: ServeSettings;
}

export interface ManagerContext {
  readonly kubeletSocket: string;
  readonly socketCheckIntervalMs: number;
  readonly log: Logger;
  /** Starts a resource's server (default: the DevicePlugin service on its unix socket, server.ts). */
  readonly serverFactory?: ServerFactory;
  /** This process no longer sees the socket directory (see kubelet/watcher.ts SocketDirView). */
  onDirectoryGone(dir: string, why: string): void;
  /** The recorder of a resource's RPCs and registrations (metrics); none by default. */
  recorder?(resource: string): RpcRecorder & RegistrationRecorder;
}

/** Vanished IDs remembered per resource, for the error message (oldest forgotten first). */
const MAX_VANISHED = 4096;
/** How long after a registration a new topology policy is warmed up (see warmUpLater). */
const WARM_UP_DELAY_MS = 100;

export class ResourceManager implements PlanListener<ServedSettings> {
  readonly name = 'device plugin resources';
  private readonly ctx: ManagerContext;
  private readonly runtimes = new Map<string, ResourceRuntime>();
  private readonly vanished = new Map<string, Map<string, string>>();
  private chooser: GpuChooser = lowestFirstChooser;
  /** A topology policy not warmed up yet; the 'warm up' timer will. */
  private cold: PreferredPolicy | null = null;
  private readonly timers = new TimerOwner();
  private registeredOnce = false;
  private snapshot: NodeSnapshot | null = null;
  /**
   * Each planned device list's index, kept while the list and the GPUs are the same objects (a health change keeps
   * both).
   */
  private readonly indexes = new WeakMap<
    readonly AdvertisedDevice[],
    { readonly gpus: readonly Gpu[]; readonly index: DeviceIndex }
  >();
  /** Set by stop(): a scan that lands during shutdown starts nothing (no socket left behind). */
  private stopped = false;
  /** One check for every resource that this process still sees the socket directory; from the first resource served. */
  private readonly dirView: SocketDirView;
  private readonly registeredListeners: ((all: boolean) => void)[] = [];
  private readonly lostListeners: (() => void)[] = [];

  constructor(ctx: ManagerContext) {
    this.ctx = ctx;
    this.dirView = new SocketDirView({
      dir: dirname(ctx.kubeletSocket),
      onDirectoryGone: (dir, why) => this.ctx.onDirectoryGone(dir, why),
      log: ctx.log,
    });
  }

  /** After each registration; `all`: every served resource has registered at least once. */
  onRegistered(fn: (all: boolean) => void): void {
    this.registeredListeners.push(fn);
  }

  /** A resource's registration stopped counting until it registers again (allRegisteredNow() is false). */
  onRegistrationLost(fn: () => void): void {
    this.lostListeners.push(fn);
  }

  get resources(): readonly string[] {
    return [...this.runtimes.keys()];
  }

  allRegistered(): boolean {
    return this.runtimes.size > 0 && [...this.runtimes.values()].every((rt) => rt.registered);
  }

  /** Each served resource and whether it is registered at this moment. */
  registrationStates(): { name: string; registered: boolean }[] {
    return [...this.runtimes].map(([name, rt]) => ({ name, registered: rt.registeredNow }));
  }

  /** Every served resource is registered at this moment (none lost its registration since). */
  allRegisteredNow(): boolean {
    return this.runtimes.size > 0 && [...this.runtimes.values()].every((rt) => rt.registeredNow);
  }

  /**
   * Serves the plan. `change` is diff(previous snapshot, snapshot), `resourceChange` what changed of
   * the resources; `reregister` asks resources whose device set changed to register again (with this reason).
   */
  async apply({
    snapshot: next,
    plan,
    change,
    resourceChange,
    settings: { serve: settings },
    reregister,
  }: AppliedPlan<ServedSettings>): Promise<void> {
    if (this.stopped) return;
    if (change.gpuSetChanged || change.topologyChanged || this.snapshot === null)
      this.chooser = this.buildChooser(next);
    this.snapshot = next;
    this.remember(change, resourceChange, plan.planProblem);
    const planned = new Map(plan.resources.map((r) => [r.name, r]));
    for (const [name, rt] of [...this.runtimes]) {
      if (planned.has(name)) continue;
      this.ctx.log.info('resource no longer advertised', { resource: name });
      this.runtimes.delete(name);
      this.vanished.delete(name);
      await rt.stop();
    }
    if (this.stopped) return;
    const setChanged = new Set(
      [...resourceChange.updated].filter((u) => u.appeared.length + u.vanished.length > 0).map((u) => u.name),
    );
    for (const r of plan.resources) {
      const state = this.stateFor(next, r, settings);
      const rt = this.runtimes.get(r.name);
      if (rt !== undefined) {
        rt.update(state);
        if (reregister !== null && setChanged.has(r.name)) rt.reregister(reregister);
      } else if (r.devices.length > 0) {
        const started = new ResourceRuntime(r.name, state, {
          kubeletSocket: this.ctx.kubeletSocket,
          socketCheckIntervalMs: this.ctx.socketCheckIntervalMs,
          log: this.ctx.log,
          ...(this.ctx.serverFactory === undefined ? {} : { serverFactory: this.ctx.serverFactory }),
          onRegistered: () => {
            this.registeredOnce = true;
            this.warmUpLater();
            const all = this.allRegistered();
            for (const fn of this.registeredListeners) fn(all);
          },
          onRegistrationLost: () => {
            for (const fn of this.lostListeners) fn();
          },
          ...(this.ctx.recorder === undefined ? {} : { recorder: this.ctx.recorder(r.name) }),
        });
        this.runtimes.set(r.name, started);
        this.dirView.start();
        started.start();
      }
    }
  }

  private buildChooser(s: NodeSnapshot): GpuChooser {
    if (s.gpus.length === 0) return lowestFirstChooser;
    try {
      const scores = buildScoreMatrix(liveNvlinks(s), (i, j) => s.pcie[i]?.[j] ?? -1);
      let nvlinkPairs = 0;
      for (let i = 0; i < scores.size; i++)
        for (let j = i + 1; j < scores.size; j++) if (scores.nvlinks(i, j) > 0) nvlinkPairs++;
      this.ctx.log.info('topology read', { gpus: scores.size, nvlink_pairs: nvlinkPairs });
      this.cold = new PreferredPolicy(scores, { warmUp: false });
      this.warmUpLater();
      return this.cold;
    } catch (err) {
      this.ctx.log.error('cannot build the topology policy; GetPreferredAllocation picks the lowest-numbered GPUs', {
        error: errorText(err),
      });
      return lowestFirstChooser;
    }
  }

  /**
   * Warms up the topology policy (several milliseconds of JIT) a little after a registration:
   * GetPreferredAllocation is only asked once registered, and done before, it would hold up the
   * registration at start. A request that comes first gets the same answer, a little later.
   */
  private warmUpLater(): void {
    if (this.cold === null || !this.registeredOnce || this.timers.has('warm up')) return;
    this.timers.after('warm up', WARM_UP_DELAY_MS, () => {
      const policy = this.cold;
      this.cold = null;
      policy?.warmUp();
    });
  }

  /** IDs that left each resource, and why, so a request naming one is told. */
  private remember(change: SnapshotDiff, resources: ResourceDiff, planProblem: string | null): void {
    const removedGpus = new Set(change.gpusRemoved);
    for (const u of [...resources.updated, ...resources.removed]) {
      if (u.vanished.length === 0 && u.appeared.length === 0) continue;
      const m = this.vanished.get(u.name) ?? new Map<string, string>();
      for (const id of u.appeared) m.delete(id);
      const why =
        removedGpus.size > 0
          ? `its GPU left the node (${[...removedGpus].join(', ')})`
          : (planProblem ?? 'the configuration no longer advertises it');
      for (const id of u.vanished) {
        m.delete(id);
        m.set(id, why);
      }
      while (m.size > MAX_VANISHED) m.delete(m.keys().next().value as string);
      this.vanished.set(u.name, m);
    }
  }

  private indexFor(devices: readonly AdvertisedDevice[], gpus: readonly Gpu[]): DeviceIndex {
    const known = this.indexes.get(devices);
    if (known !== undefined && known.gpus === gpus) return known.index;
    const index = indexDevices(devices, gpus);
    this.indexes.set(devices, { gpus, index });
    return index;
  }

  private stateFor(s: NodeSnapshot, r: PlannedResource, settings: ServeSettings): PluginState {
    return {
      gpus: s.gpus,
      devices: r.devices,
      index: this.indexFor(r.devices, s.gpus),
      health: resourceHealth(s, r),
      chooser: this.chooser,
      sharedPolicy: settings.sharedPolicy,
      allocateSettings: {
        ...settings.allocate,
        failRequestsGreaterThanOne: r.failRequestsGreaterThanOne,
        resourceName: r.name,
        mps: r.mps === true,
        ...('problem' in s.migCapabilities ? {} : { migCapabilities: s.migCapabilities }),
      },
      vanished: this.vanished.get(r.name) ?? new Map(),
    };
  }

  async stop(): Promise<void> {
    this.stopped = true;
    this.timers.dispose();
    this.dirView.stop();
    const all = [...this.runtimes.values()];
    this.runtimes.clear();
    await Promise.all(all.map((rt) => rt.stop()));
  }
}
