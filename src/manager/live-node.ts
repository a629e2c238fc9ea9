// The live node: one path for every change. A scan (start, SIGHUP, re-discovery, the driver going or
// coming back), a config reload and a health change each make a new snapshot (core/snapshot.ts);
// its diff against the current one goes to the resource manager, and the health monitor starts over
// on a new GPU list when the GPUs changed. Changes are applied one at a time, in order.
import { planForNode } from '../core/config-fit.ts';
import { MigStrategyError, healthUnits, pendingModeChanges } from '../core/mig.ts';
import { describePlan } from '../core/sharing.ts';
import { buildSnapshot, diff, healthCounts, healthUnitCount, isEmptyDiff, unitHealthStates, withHealthStates } from '../core/snapshot.ts';
import type { NodeScan, NodeSnapshot, PlanSettings, SnapshotDiff } from '../core/snapshot.ts';
import type { HealthMonitor } from '../plugin/health.ts';
import { errorText } from '../system/log.ts';
import type { Logger } from '../system/log.ts';
import type { ResourceManager, ServeSettings } from './manager.ts';

export interface LiveNodeDeps {
  readonly log: Logger;
  readonly manager: ResourceManager;
  readonly monitor: HealthMonitor;
  /** Recovery on: a GPU that comes back after leaving starts healthy (see core/snapshot.ts). */
  readonly recoveryEnabled: boolean;
  plan: PlanSettings;
  serve: ServeSettings;
  /** After every applied snapshot. */
  onApplied?(snapshot: NodeSnapshot, change: SnapshotDiff): void;
}


export class LiveNode {
  private readonly deps: LiveNodeDeps;
  private readonly log: Logger;
  private current: NodeSnapshot | null = null;
  private queue: Promise<void> = Promise.resolve();
  private applied = 0;

  constructor(deps: LiveNodeDeps) {
    this.deps = deps;
    this.log = deps.log;
  }

  get snapshot(): NodeSnapshot | null {
    return this.current;
  }

  /** Snapshots applied so far. */
  get appliedCount(): number {
    return this.applied;
  }

  private enqueue<T>(job: () => Promise<T>): Promise<T> {
    const run = this.queue.then(job);
    this.queue = run.then(() => undefined, () => undefined);
    return run;
  }

  /** What a scan read (null: the driver does not answer). The first one throws if the config does not fit the node. */
  scanned(scan: NodeScan | null, reason: string): Promise<void> {
    return this.enqueue(async () => {
      const prev = this.withMonitorHealth();
      const next = buildSnapshot(scan, this.deps.plan, prev, this.deps.recoveryEnabled);
      await this.apply(prev, next, reason, null);
    });
  }

  /** The health monitor reported a transition. */
  healthChanged(): void {
    void this.enqueue(async () => {
      const prev = this.current;
      if (prev === null) return;
      const states = this.deps.monitor.states();
      if (states.length !== healthUnitCount(prev)) return;
      await this.apply(prev, withHealthStates(prev, states), 'health changed', null);
    }).catch((err: unknown) => this.log.error('cannot apply a health change', { error: errorText(err) }));
  }

  /**
   * New settings from a config reload. Throws (and changes nothing) when they cannot be planned
   * against the GPUs now present; resources whose device set changed register again.
   */
  reconfigure(plan: PlanSettings, serve: ServeSettings, reason: string): Promise<string> {
    return this.enqueue(async () => {
      const prev = this.withMonitorHealth();
      if (prev !== null) {
        try {
          planForNode(prev.gpus, prev.mig, plan);
        } catch (err) {
          // Whether the node fits the MIG strategy is not the new file's fault.
          if (!(err instanceof MigStrategyError)) throw err;
        }
      }
      this.deps.plan = plan;
      this.deps.serve = serve;
      if (prev === null) return '';
      const caps = prev.migCapabilities;
      const same: NodeScan | null = prev.driverVersion === null ? null : {
        driverVersion: prev.driverVersion, gpus: prev.gpus, nvlinks: prev.nvlinks, pcie: prev.pcie, mig: prev.mig,
        migCapabilities: 'problem' in caps ? caps : new Map([...caps].map(([k, nodes]) => [prev.mig.devices[k]?.uuid ?? '', nodes])),
      };
      const next = buildSnapshot(same, plan, prev, this.deps.recoveryEnabled);
      await this.apply(prev, next, reason, reason);
      return describePlan(next.resources);
    });
  }

  private withMonitorHealth(): NodeSnapshot | null {
    const prev = this.current;
    if (prev === null) return null;
    const states = this.deps.monitor.states();
    return states.length === healthUnitCount(prev) ? withHealthStates(prev, states) : prev;
  }

  private async apply(prev: NodeSnapshot | null, next: NodeSnapshot, reason: string, reregister: string | null): Promise<void> {
    const change = diff(prev, next);
    this.describe(prev, next, change, reason);
    if (change.gpuSetChanged || change.migChanged) this.deps.monitor.rebase(next.gpus, unitHealthStates(next), healthUnits(next.gpus.length, next.mig));
    this.current = next;
    this.applied++;
    await this.deps.manager.apply(next, change, this.deps.serve, reregister);
    this.deps.onApplied?.(next, change);
  }

  /** The log of a change: what an operator needs to see, once. */
  private describe(prev: NodeSnapshot | null, next: NodeSnapshot, change: SnapshotDiff, reason: string): void {
    const log = this.log;
    if (prev === null) {
      for (const g of next.gpus) {
        log.info('GPU found', { index: g.index, uuid: g.uuid, name: g.name, bus: g.busId, numa: g.numaNode, memory_mib: Math.round(g.memoryBytes / 1048576) });
      }
      for (const d of next.mig.devices) {
        log.info('MIG device found', { gpu: next.gpus[d.parent]?.index, index: d.index, uuid: d.uuid, profile: d.profile, gi: d.gi, ci: d.ci, memory_mib: Math.round(d.memoryBytes / 1048576) });
      }
      if (next.driverVersion !== null && next.gpus.length > 0) log.info('advertising', { resources: describePlan(next.resources) });
    } else {
      if (change.driverChanged && next.driverVersion !== null) {
        log.info('the NVIDIA driver answers', { driver: next.driverVersion, before: prev.driverVersion ?? 'not answering', reason });
      }
      for (const uuid of change.gpusRemoved) log.warn('GPU left the node; its devices are withdrawn', { uuid, reason });
      for (const uuid of change.gpusAdded) {
        const g = next.gpus.find((x) => x.uuid === uuid);
        const i = next.gpus.findIndex((x) => x.uuid === uuid);
        log.info(uuid in prev.departed ? 'GPU is back' : 'GPU appeared', { index: g?.index, uuid, name: g?.name, bus: g?.busId, health: next.health[i], reason });
      }
      for (const uuid of change.migRemoved) log.info('MIG device gone; withdrawn', { uuid, reason });
      for (const uuid of change.migAdded) {
        const d = next.mig.devices.find((x) => x.uuid === uuid);
        log.info('MIG device found', { gpu: d === undefined ? undefined : next.gpus[d.parent]?.index, index: d?.index, uuid, profile: d?.profile, gi: d?.gi, ci: d?.ci, reason });
      }
      for (const r of change.added) if (prev.resources.length > 0) log.info('resource advertised', { resource: r.name, devices: r.devices.length, reason });
      for (const u of change.updated) {
        if (u.appeared.length + u.vanished.length === 0) continue;
        log.info('device list changed', { resource: u.name, devices: u.devices.length, appeared: u.appeared.length, vanished: u.vanished.length, reason });
      }
      if (change.updated.some((u) => u.healthChanged.length > 0) || change.gpusAdded.length + change.gpusRemoved.length > 0) {
        const c = healthCounts(next);
        const mig = c.mig.total === 0 ? {} : { healthy_mig: c.mig.healthy, total_mig: c.mig.total };
        log.info('device counts', { healthy: c.gpus.healthy, total: c.gpus.total, ...mig });
      }
    }
    const pendingBefore = new Set(prev === null ? [] : pendingModeChanges(prev.gpus, prev.mig));
    for (const line of pendingModeChanges(next.gpus, next.mig)) if (!pendingBefore.has(line)) log.warn('MIG mode change pending', { change: line });
    const notesBefore = new Set(prev?.migNotes ?? []);
    for (const note of next.migNotes) if (!notesBefore.has(note)) log.warn('MIG', { note });
    if (next.planProblem !== null && next.planProblem !== prev?.planProblem) {
      if (next.planProblem.startsWith('--mig-strategy=')) log.error('the node no longer fits the MIG strategy; its devices are withdrawn until it does', { error: next.planProblem });
      else log.error('the config no longer fits the GPUs; the resources are kept for the GPUs still here', { error: next.planProblem });
    } else if (next.planProblem === null && prev?.planProblem) {
      log.info('the config fits the GPUs again', { resources: describePlan(next.resources) });
    }
    if (reason === 'reload') {
      log.info('looked at the node again', { reason, gpus: next.gpus.length, driver: next.driverVersion ?? 'not answering', changes: isEmptyDiff(change) ? 'none' : 'applied' });
    }
    if (next.driverVersion !== null && next.gpus.length > 0 && next.resources.length === 0 && next.planProblem === null && (prev === null || prev.resources.length > 0)) {
      log.warn('nothing to advertise: no GPU or MIG device fits the MIG strategy', { gpus: next.gpus.length, mig_devices: next.mig.devices.length });
    }
    if (next.driverVersion !== null && next.gpus.length === 0 && (prev === null || prev.gpus.length > 0)) {
      log.warn('no GPUs found; waiting for some to appear (re-discovery and SIGHUP look again)');
    }
  }
}
