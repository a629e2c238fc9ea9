// The device-plugin mode's log of an applied change: what is advertised, once — the plan at start,
// resources added, device lists changed, MIG devices the plan leaves out, a plan that stops or starts
// fitting the GPUs. The node's own lines (GPUs, MIG devices, the driver) are node/describe.ts's.
import type { ResourceDiff } from '../core/resource-diff.ts';
import type { PlannedNode, ResourcePlan } from '../core/resource-plan.ts';
import { describePlan } from '../core/sharing.ts';
import type { NodeSnapshot } from '../core/snapshot.ts';
import type { Logger } from '../system/log.ts';

export function describeResources(
  log: Logger,
  prevNode: PlannedNode | null,
  nextNode: PlannedNode,
  change: ResourceDiff,
  reason: string,
): void {
  const prev = prevNode?.plan ?? null;
  const next = nextNode.plan;
  if (prev === null) {
    if (nextNode.snapshot.driverVersion !== null && nextNode.snapshot.gpus.length > 0)
      log.info('advertising', { resources: describePlan(next.resources) });
  } else {
    for (const r of change.added)
      if (prev.resources.length > 0)
        log.info('resource advertised', { resource: r.name, devices: r.devices.length, reason });
    for (const u of change.updated) {
      if (u.appeared.length + u.vanished.length === 0) continue;
      log.info('device list changed', {
        resource: u.name,
        devices: u.devices.length,
        appeared: u.appeared.length,
        vanished: u.vanished.length,
        reason,
      });
    }
  }
  describePlanFit(log, prev, next, nextNode.snapshot);
}

/** MIG devices the plan leaves out, and a plan that stops or starts fitting the node. */
function describePlanFit(log: Logger, prev: ResourcePlan | null, next: ResourcePlan, s: NodeSnapshot): void {
  const notesBefore = new Set(prev?.migNotes ?? []);
  for (const note of next.migNotes) if (!notesBefore.has(note)) log.warn('MIG', { note });
  if (next.planProblem !== null && next.planProblem !== prev?.planProblem) {
    if (next.planProblem.startsWith('--mig-strategy='))
      log.error('the node no longer fits the MIG strategy; its devices are withdrawn until it does', {
        error: next.planProblem,
      });
    else
      log.error('the config no longer fits the GPUs; the resources are kept for the GPUs still here', {
        error: next.planProblem,
      });
  } else if (next.planProblem === null && prev?.planProblem) {
    log.info('the config fits the GPUs again', { resources: describePlan(next.resources) });
  }
  if (
    s.driverVersion !== null &&
    s.gpus.length > 0 &&
    next.resources.length === 0 &&
    next.planProblem === null &&
    (prev === null || prev.resources.length > 0)
  ) {
    log.warn('nothing to advertise: no GPU or MIG device fits the MIG strategy', {
      gpus: s.gpus.length,
      mig_devices: s.mig.devices.length,
    });
  }
}
