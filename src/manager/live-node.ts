// The live node: one path for every change. A scan (start, SIGHUP, re-discovery, the driver going or
// coming back), a config reload and a health change each make a new snapshot (core/snapshot.ts);
// its diff against the current one goes to the resource manager, and the health monitor starts over
// on a new GPU list when the GPUs changed. Changes are applied one at a time, in order.
import type { Health } from '../core/devices.ts';
import { planResources } from '../core/sharing.ts';
import { describePlan } from '../core/sharing.ts';
import { buildSnapshot, diff, isEmptyDiff, withHealthStates } from '../core/snapshot.ts';
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

const countHealthy = (h: readonly Health[]): number => h.filter((x) => x === 'Healthy').length;

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
      if (states.length !== prev.gpus.length) return;
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
      if (prev !== null) planResources(prev.gpus, plan.deviceIdStrategy, plan.sharing);
      this.deps.plan = plan;
      this.deps.serve = serve;
      if (prev === null) return '';
      const same: NodeScan | null = prev.driverVersion === null ? null : { driverVersion: prev.driverVersion, gpus: prev.gpus, nvlinks: prev.nvlinks, pcie: prev.pcie };
      const next = buildSnapshot(same, plan, prev, this.deps.recoveryEnabled);
      await this.apply(prev, next, reason, reason);
      return describePlan(next.resources);
    });
  }

  private withMonitorHealth(): NodeSnapshot | null {
    const prev = this.current;
    if (prev === null) return null;
    const states = this.deps.monitor.states();
    return states.length === prev.gpus.length ? withHealthStates(prev, states) : prev;
  }

  private async apply(prev: NodeSnapshot | null, next: NodeSnapshot, reason: string, reregister: string | null): Promise<void> {
    const change = diff(prev, next);
    this.describe(prev, next, change, reason);
    if (change.gpuSetChanged) this.deps.monitor.rebase(next.gpus, next.healthStates);
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
      for (const u of change.updated) {
        if (u.appeared.length + u.vanished.length === 0) continue;
        log.info('device list changed', { resource: u.name, devices: u.devices.length, appeared: u.appeared.length, vanished: u.vanished.length, reason });
      }
      if (change.updated.some((u) => u.healthChanged.length > 0) || change.gpusAdded.length + change.gpusRemoved.length > 0) {
        log.info('device counts', { healthy: countHealthy(next.health), total: next.gpus.length });
      }
    }
    if (next.planProblem !== null && next.planProblem !== prev?.planProblem) {
      log.error('the config no longer fits the GPUs; the resources are kept for the GPUs still here', { error: next.planProblem });
    } else if (next.planProblem === null && prev?.planProblem) {
      log.info('the config fits the GPUs again', { resources: describePlan(next.resources) });
    }
    if (reason === 'reload') {
      log.info('looked at the node again', { reason, gpus: next.gpus.length, driver: next.driverVersion ?? 'not answering', changes: isEmptyDiff(change) ? 'none' : 'applied' });
    }
    if (next.driverVersion !== null && next.gpus.length === 0 && (prev === null || prev.gpus.length > 0)) {
      log.warn('no GPUs found; waiting for some to appear (re-discovery and SIGHUP look again)');
    }
  }
}
