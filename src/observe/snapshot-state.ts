// The one adapter from the daemon's node snapshot (core/snapshot.ts) and the manager's registrations
// to the published state (core/daemon-state.ts): what the kubelet was told of each device and why,
// since when. When the snapshot's shape changes, only this file follows it.
import type { DaemonState, DeviceState, ResourceState } from '../core/daemon-state.ts';
import { xidMeaning } from '../core/health.ts';
import type { GpuHealthState } from '../core/health.ts';
import { healthCounts } from '../core/snapshot.ts';
import type { NodeSnapshot } from '../core/snapshot.ts';
import type { SinceTracker } from './state-file.ts';

export interface StateContext {
  readonly pid: number;
  readonly version: string;
  readonly startedAt: string;
  /** Now, ISO 8601. */
  readonly now: string;
  readonly options: Readonly<Record<string, string>>;
  readonly registrations: readonly { readonly name: string; readonly registered: boolean }[];
  readonly since: SinceTracker;
}

/** Why a device is advertised unhealthy, from its health state (and whether the driver answers). */
export function unhealthyReason(state: GpuHealthState | undefined, driverUp: boolean): string {
  if (!driverUp) return 'the NVIDIA driver does not answer';
  if (state === undefined) return 'unknown';
  if (state.lost) return 'lost: NVML reports the GPU gone (GPU_IS_LOST; XID 79: fallen off the bus)';
  if (state.lastXid !== null) return `XID ${state.lastXid}: ${xidMeaning(state.lastXid)}${state.permanent ? ' (health recovery does not undo it)' : ''}`;
  if (state.permanent) return 'double-bit ECC error';
  return 'unhealthy';
}

export function daemonStateFromSnapshot(s: NodeSnapshot | null, ctx: StateContext): DaemonState {
  const devices: DeviceState[] = [];
  const driverUp = s?.driverVersion !== null && s !== null;
  if (s !== null) {
    const g = s.gpus.length;
    s.gpus.forEach((gpu, i) => {
      const health = s.health[i] ?? 'Unhealthy';
      devices.push({
        kind: 'gpu', index: String(gpu.index), uuid: gpu.uuid, health,
        ...(health === 'Unhealthy' ? { reason: unhealthyReason(s.healthStates[i], driverUp) } : {}),
        since: ctx.since.since(`device ${gpu.uuid}`, health, ctx.now),
      });
    });
    s.mig.devices.forEach((d, k) => {
      const parent = s.gpus[d.parent];
      const health = s.health[g + k] ?? 'Unhealthy';
      devices.push({
        kind: 'mig', index: `${parent?.index ?? d.parent}:${d.index}`, uuid: d.uuid, ...(parent === undefined ? {} : { parentUuid: parent.uuid }), health,
        ...(health === 'Unhealthy' ? { reason: unhealthyReason(s.migHealthStates[k], driverUp) } : {}),
        since: ctx.since.since(`device ${d.uuid}`, health, ctx.now),
      });
    });
  }
  const counts = new Map((s === null ? [] : healthCounts(s).resources).map((r) => [r.name, r]));
  const resources: ResourceState[] = ctx.registrations.map((r) => ({
    name: r.name,
    registered: r.registered,
    since: ctx.since.since(`resource ${r.name}`, String(r.registered), ctx.now),
    devices: counts.get(r.name)?.devices ?? 0,
    healthy: counts.get(r.name)?.healthy ?? 0,
  }));
  return {
    pid: ctx.pid,
    version: ctx.version,
    startedAt: ctx.startedAt,
    publishedAt: ctx.now,
    driverVersion: s?.driverVersion ?? null,
    devices,
    resources,
    planProblem: s?.planProblem ?? null,
    options: ctx.options,
  };
}
