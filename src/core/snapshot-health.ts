// The health view of a node snapshot (snapshot.ts): each unit's health (a GPU's or a MIG device's,
// by UUID, with why and since when), what is advertised (Unhealthy for all while the driver is down),
// the MPS daemons' states and what they do to their replicas' health, and the healthy-of-total counts
// of GPUs and MIG devices that STATUS, the log and the metrics show (per resource: resource-plan.ts). Pure.
//
// MPS (core/mps.ts): each MPS resource's control daemon has a state, by resource name (answering or
// not, why, since when). Its replicas are advertised Unhealthy while the daemon does not answer — from
// the resource's first snapshot until the daemon's first answer, too — and with their GPU's own health
// once it answers; the GPU's own health is never touched by it.
import { countHealthyGpus, deviceUnit } from './devices.ts';
import type { Gpu, GpuHealth, Health } from './devices.ts';
import { freshHealthState } from './health-tracker.ts';
import type { GpuHealthState } from './health-tracker.ts';
import type { MigLayout } from './mig.ts';
import type { PlannedResource } from './sharing.ts';

/** The MPS daemons' states of a snapshot, by resource name. */
export interface MpsDaemonStates {
  readonly mpsDaemons: ReadonlyMap<string, MpsDaemonState>;
}

/** One unit's (GPU's or MIG device's) health: the tracker's state (core/health-tracker.ts), why, and since when. */
export interface UnitHealth {
  readonly state: GpuHealthState;
  /** Why it is what it is: the transition's reason (null: nothing ever happened to it). */
  readonly reason: string | null;
  /** When that transition happened, in the caller's clock (ms since the epoch); null with reason null. */
  readonly since: number | null;
}

/** The health of a unit nothing has happened to. */
export function freshUnitHealth(): UnitHealth {
  return { state: freshHealthState(), reason: null, since: null };
}

/** Whether an MPS resource's control daemon answers, why (the client's reason when not), since when. */
export interface MpsDaemonState {
  readonly answering: boolean;
  /** Not answering: the control client's reason (or that it was not asked yet); answering: null. */
  readonly reason: string | null;
  /** When it last changed, in the caller's clock (ms since the epoch); null: never asked yet. */
  readonly since: number | null;
  /**
   * The GPU or MIG UUIDs it serves, when its devices are not a device-plugin resource's replicas (a DRA
   * claim's daemon): a daemon that stopped answering makes these devices Unhealthy in DRA's views.
   */
  readonly units?: readonly string[];
}

/** The units (GPU or MIG UUIDs) whose DRA claim daemon was asked and does not answer, with the daemon and why. */
export function unitsOfSilentClaimDaemons(
  snapshot: MpsDaemonStates,
): Map<string, { readonly daemon: string; readonly reason: string }> {
  const out = new Map<string, { daemon: string; reason: string }>();
  for (const [daemon, st] of snapshot.mpsDaemons) {
    // Not asked yet is not silence: a claim's daemon answered its agent before the claim was prepared.
    if (st.answering || st.since === null || st.units === undefined) continue;
    for (const u of st.units) if (!out.has(u)) out.set(u, { daemon, reason: st.reason ?? 'no answer' });
  }
  return out;
}

/** A daemon nobody has asked yet: not answering, so its replicas wait Unhealthy. */
export const MPS_DAEMON_NOT_ASKED: MpsDaemonState = { answering: false, reason: 'not asked yet', since: null };

/** The MPS resources whose daemon does not answer (their devices are advertised Unhealthy). */
export function silentMpsDaemons(snapshot: MpsDaemonStates): { resource: string; state: MpsDaemonState }[] {
  return [...snapshot.mpsDaemons].filter(([, st]) => !st.answering).map(([resource, state]) => ({ resource, state }));
}

/**
 * The health a resource's devices are advertised with: the snapshot's, except for
 * an MPS resource whose daemon does not answer: its replicas are Unhealthy.
 */
export function resourceHealth(
  snapshot: MpsDaemonStates & { readonly health: GpuHealth },
  resource: PlannedResource,
): GpuHealth {
  if (resource.mps !== true) return snapshot.health;
  const daemon = snapshot.mpsDaemons.get(resource.name) ?? MPS_DAEMON_NOT_ASKED;
  if (daemon.answering) return snapshot.health;
  // Only the replicas are the daemon's clients: a whole GPU listed under the same name (MPS on some
  // GPUs, not renamed) is no client of it and keeps its own health.
  const out = new Map(snapshot.health);
  for (const d of resource.devices) if (d.replica !== undefined) out.set(deviceUnit(d), 'Unhealthy');
  return out;
}

/**
 * What is advertised: every unit's own health, Unhealthy where a critical health signal of its GPU
 * is bad (`signalled`, snapshot-signals.ts), or Unhealthy for all while the driver is down.
 */
export function advertisedHealth(
  gpuHealth: ReadonlyMap<string, UnitHealth>,
  migHealth: ReadonlyMap<string, UnitHealth>,
  driverUp: boolean,
  signalled: ReadonlySet<string> = new Set(),
): GpuHealth {
  const out = new Map<string, Health>();
  const of = (uuid: string, h: UnitHealth): Health => (driverUp && !signalled.has(uuid) ? h.state.health : 'Unhealthy');
  for (const [uuid, h] of gpuHealth) out.set(uuid, of(uuid, h));
  for (const [uuid, h] of migHealth) out.set(uuid, of(uuid, h));
  return out;
}

/** Healthy of total: what STATUS, the log and the metrics say of a snapshot's GPUs and MIG devices. */
export interface HealthCounts {
  readonly gpus: { readonly healthy: number; readonly total: number };
  readonly mig: { readonly healthy: number; readonly total: number };
}

export function healthCounts(snapshot: {
  readonly gpus: readonly Gpu[];
  readonly mig: MigLayout;
  readonly health: GpuHealth;
}): HealthCounts {
  const of = (uuid: string): Health => snapshot.health.get(uuid) ?? 'Unhealthy';
  return {
    gpus: { healthy: countHealthyGpus(snapshot.gpus.map((g) => of(g.uuid))), total: snapshot.gpus.length },
    mig: { healthy: countHealthyGpus(snapshot.mig.devices.map((d) => of(d.uuid))), total: snapshot.mig.devices.length },
  };
}
