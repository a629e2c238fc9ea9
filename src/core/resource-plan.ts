// The device-plugin resources planned from a node snapshot (snapshot.ts) and the settings in force:
// the device-plugin mode's step, never the node model's. Pure: plain data in, plain data out.
//
// Rules:
// * A start (nothing planned yet for GPUs) whose settings do not fit the GPUs fails: planSnapshot
//   throws what the plan throws.
// * A config that no longer fits the GPUs later (a time-slicing list naming a GPU that left) does not
//   stop the node: the previous resources are kept for the GPUs still there, and planProblem says why.
// * A node that stops fitting --mig-strategy=single after start is reported and withdrawn (no
//   resources), never half-advertised.
// * Without the driver at start there are no GPUs to check the config against: nothing is advertised
//   but what no GPU makes (nvidia.com/gpu, empty); the first scan with GPUs plans (and refuses).
// * While the driver does not answer, the GPUs last seen are planned as before (their devices are
//   advertised Unhealthy, the snapshot's health says so).
// * An MPS resource's replicas are advertised Unhealthy until its control daemon answers
//   (snapshot-health.ts): a planned MPS resource the snapshot holds no daemon state for is not asked yet.
import { migCapabilitiesProblem, planForNode } from './config-fit.ts';
import { deviceUnit } from './devices.ts';
import type { AdvertisedDevice, Gpu } from './devices.ts';
import { NO_MIG } from './mig.ts';
import { MigStrategyError } from './mig-strategies.ts';
import type { MigLayout } from './mig.ts';
import { planMpsDaemons } from './mps.ts';
import type { MpsDaemonPlan } from './mps.ts';
import type { PlannedResource } from './sharing.ts';
import { MPS_DAEMON_NOT_ASKED, resourceHealth } from './snapshot-health.ts';
import type { MpsDaemonState } from './snapshot-health.ts';
import type { NodeSnapshot, PlanSettings } from './snapshot.ts';

/** What the device-plugin mode advertises for a snapshot. */
export interface ResourcePlan {
  readonly resources: readonly PlannedResource[];
  /** Why the settings could not be planned against these GPUs (the previous resources were kept), or null. */
  readonly planProblem: string | null;
  /** What the MIG plan left out, one line each (skipped GPUs, sub-instances). */
  readonly migNotes: readonly string[];
}

/** A snapshot with the plan made for it. */
export interface PlannedNode {
  readonly snapshot: NodeSnapshot;
  readonly plan: ResourcePlan;
}

/**
 * The previous plan, kept for the GPUs of `gpus` (by UUID); devices of GPUs that left are dropped,
 * and so are MIG devices no longer in `mig` (by MIG UUID).
 */
export function carryPlan(
  previous: readonly PlannedResource[],
  gpus: readonly Gpu[],
  mig: MigLayout = NO_MIG,
): PlannedResource[] {
  const pos = new Map(gpus.map((g, i) => [g.uuid, i]));
  const migs = new Set(mig.devices.map((d) => d.uuid));
  const out: PlannedResource[] = [];
  for (const r of previous) {
    const devices: AdvertisedDevice[] = [];
    for (const d of r.devices) {
      const at = pos.get(d.uuid);
      if (at === undefined || (d.mig !== undefined && !migs.has(d.mig))) continue;
      devices.push({ ...d, gpu: at });
    }
    if (devices.length > 0) out.push({ ...r, devices });
  }
  return out;
}

/**
 * Whether two snapshots plan alike: the same GPUs, MIG layout, facts and MIG capabilities (a health,
 * signal or MPS daemon change keeps them all), so the plan made for one is the other's.
 */
export function samePlanInputs(a: NodeSnapshot, b: NodeSnapshot): boolean {
  return (
    a.driverVersion === b.driverVersion &&
    a.gpus === b.gpus &&
    a.mig === b.mig &&
    a.facts === b.facts &&
    a.migCapabilities === b.migCapabilities
  );
}

/**
 * The plan for `snapshot` under `settings`, `previous` being the node and plan in force (null at
 * start). Throws what planForNode throws (or the MIG capability problem) only when nothing was ever
 * planned for GPUs (no previous plan, or only ones without GPUs): then it is a start that fails.
 */
export function planSnapshot(
  snapshot: NodeSnapshot,
  settings: PlanSettings,
  previous: PlannedNode | null,
): ResourcePlan {
  if (snapshot.driverVersion === null && previous === null) return planWithoutGpus(settings);
  let planned: { resources: PlannedResource[]; notes: string[] };
  try {
    planned = planForNode(snapshot.gpus, snapshot.mig, settings, snapshot.facts?.gpus);
  } catch (err) {
    if (previous === null || previous.snapshot.gpus.length === 0) throw err;
    const problem = err instanceof Error ? err.message : String(err);
    // A node that stopped fitting --mig-strategy=single is withdrawn, not half-advertised.
    if (err instanceof MigStrategyError) return { resources: [], planProblem: problem, migNotes: [] };
    return {
      resources: carryPlan(previous.plan.resources, snapshot.gpus, snapshot.mig),
      planProblem: problem,
      migNotes: [],
    };
  }
  const problem = migCapabilitiesProblem(planned, settings, snapshot.migCapabilities);
  if (problem !== null && previous === null) throw new Error(problem);
  return { resources: planned.resources, planProblem: problem, migNotes: planned.notes };
}

/**
 * The plan of a start without the driver: what no GPU makes (nvidia.com/gpu, empty), or nothing when the config names
 * GPUs.
 */
function planWithoutGpus(settings: PlanSettings): ResourcePlan {
  try {
    const { resources, notes } = planForNode([], NO_MIG, settings);
    return { resources, planProblem: null, migNotes: notes };
  } catch {
    return { resources: [], planProblem: null, migNotes: [] };
  }
}

/**
 * Whether new settings may be put in force on this node (a config reload): throws what planForNode
 * throws, except that the node does not fit the MIG strategy (not the new settings' fault).
 */
export function checkReload(snapshot: NodeSnapshot, settings: PlanSettings): void {
  try {
    planForNode(snapshot.gpus, snapshot.mig, settings, snapshot.facts?.gpus);
  } catch (err) {
    if (!(err instanceof MigStrategyError)) throw err;
  }
}

/**
 * The daemon state of each planned MPS resource, by resource name (one the snapshot holds none for is not asked yet).
 */
export function mpsDaemonsOf(node: PlannedNode): ReadonlyMap<string, MpsDaemonState> {
  const out = new Map<string, MpsDaemonState>();
  for (const r of node.plan.resources)
    if (r.mps === true) out.set(r.name, node.snapshot.mpsDaemons.get(r.name) ?? MPS_DAEMON_NOT_ASKED);
  return out;
}

/** Healthy of total of one advertised resource. */
export interface ResourceCount {
  readonly name: string;
  readonly devices: number;
  readonly healthy: number;
}

/** Per advertised resource with devices; a MIG device counts with its own health, not its parent's. */
export function resourceCounts(node: PlannedNode): ResourceCount[] {
  const mpsDaemons = mpsDaemonsOf(node);
  const s = { health: node.snapshot.health, mpsDaemons };
  return node.plan.resources
    .filter((r) => r.devices.length > 0)
    .map((r) => {
      const rh = resourceHealth(s, r);
      const healthy = r.devices.filter((d) => (rh.get(deviceUnit(d)) ?? 'Unhealthy') === 'Healthy').length;
      return { name: r.name, devices: r.devices.length, healthy };
    });
}

/** One MPS resource as the state file and the metrics show it: its daemon's state and its limits. */
export interface AdvertisedMps {
  readonly resource: string;
  readonly state: MpsDaemonState;
  readonly plan: MpsDaemonPlan;
}

/**
 * What a mode advertises per resource, as the STATUS line, the state file and the metrics show it
 * (the device-plugin mode's plan; DRA mode advertises no device-plugin resources).
 */
export interface AdvertisedView {
  readonly resources: readonly ResourceCount[];
  readonly planProblem: string | null;
  /** The control daemon of each MPS resource, by resource name. */
  readonly mpsDaemons: ReadonlyMap<string, MpsDaemonState>;
  /** Each MPS resource with replicas: its daemon's state and the limits planned for it (core/mps.ts). */
  readonly mps: readonly AdvertisedMps[];
}

export const NOTHING_ADVERTISED: AdvertisedView = { resources: [], planProblem: null, mpsDaemons: new Map(), mps: [] };

/** The view of a planned node (NOTHING_ADVERTISED before the first plan). */
export function advertisedView(node: PlannedNode | null): AdvertisedView {
  if (node === null) return NOTHING_ADVERTISED;
  const daemons = mpsDaemonsOf(node);
  return {
    resources: resourceCounts(node),
    planProblem: node.plan.planProblem,
    mpsDaemons: daemons,
    mps: planMpsDaemons(node.plan.resources, node.snapshot.gpus).map((plan) => ({
      resource: plan.resource,
      state: daemons.get(plan.resource) ?? MPS_DAEMON_NOT_ASKED,
      plan,
    })),
  };
}
