// A node snapshot and the device-plugin plan made for it, in one object, for unit tests of what the
// daemon derives from a scan: the node model's step (core/snapshot.ts buildSnapshot) and the
// device-plugin mode's (core/resource-plan.ts planSnapshot) in turn, as the live node and the
// planner (src/plugin/planner.ts) take them.
import { diffResources, isEmptyResourceDiff } from '../../src/core/resource-diff.ts';
import type { ResourceDiff } from '../../src/core/resource-diff.ts';
import { planSnapshot, resourceCounts } from '../../src/core/resource-plan.ts';
import type { PlannedNode, ResourceCount, ResourcePlan } from '../../src/core/resource-plan.ts';
import { buildSnapshot, healthCounts } from '../../src/core/snapshot.ts';
import type { HealthCounts, NodeScan, NodeSnapshot, PlanSettings } from '../../src/core/snapshot.ts';
import { diff, isEmptyDiff } from '../../src/core/snapshot-diff.ts';
import type { SnapshotDiff } from '../../src/core/snapshot-diff.ts';

/** A snapshot with its plan's fields beside its own, and both as the planner holds them (`node`). */
export type Planned = NodeSnapshot & ResourcePlan & { readonly node: PlannedNode };

/** A snapshot and the plan made for it. */
export function plannedNode(snapshot: NodeSnapshot, plan: ResourcePlan): Planned {
  return { ...snapshot, ...plan, node: { snapshot, plan } };
}

/** The snapshot after a scan, planned: throws what the plan throws at start. */
export function planned(
  scan: NodeScan | null,
  settings: PlanSettings,
  previous: Planned | null,
  recoveryEnabled: boolean,
): Planned {
  const snapshot = buildSnapshot(scan, previous?.node.snapshot ?? null, recoveryEnabled);
  return plannedNode(snapshot, planSnapshot(snapshot, settings, previous?.node ?? null));
}

/** A changed snapshot (a health change: core/snapshot.ts withHealth) under the plan `from` had. */
export function withPlan(snapshot: NodeSnapshot, from: Planned): Planned {
  return plannedNode(snapshot, from.node.plan);
}

/** What changed of the node and of its resources. */
export function changes(previous: Planned | null, next: Planned): SnapshotDiff & ResourceDiff {
  return {
    ...diff(previous?.node.snapshot ?? null, next.node.snapshot),
    ...diffResources(previous?.node ?? null, next.node),
  };
}

/** Nothing changed of the node or of its resources. */
export function noChange(d: SnapshotDiff & ResourceDiff): boolean {
  return isEmptyDiff(d) && isEmptyResourceDiff(d);
}

/** Healthy of total of the GPUs, MIG devices and resources. */
export function counts(p: Planned): HealthCounts & { readonly resources: readonly ResourceCount[] } {
  return { ...healthCounts(p.node.snapshot), resources: resourceCounts(p.node) };
}
