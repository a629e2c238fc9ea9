// The log of an applied change (live-node.ts): what an operator needs to see of it, once — GPUs and
// MIG devices found, gone or back, lists changed, the driver answering again, a plan that stops or
// starts fitting. Log keys: `gpu` a GPU's index, `uuid` its UUID, `mig` a MIG device's UUID.
import { pendingModeChanges } from '../core/mig.ts';
import { describePlan } from '../core/sharing.ts';
import { healthCounts, isEmptyDiff } from '../core/snapshot.ts';
import type { NodeSnapshot, SnapshotDiff } from '../core/snapshot.ts';
import type { Logger } from '../system/log.ts';

/**
 * The log of a change: what an operator needs to see, once. `resources` false: nothing serves the
 * planned device-plugin resources (DRA mode publishes its devices itself), so they are not logged.
 */
export function describeChange(
  log: Logger,
  prev: NodeSnapshot | null,
  next: NodeSnapshot,
  change: SnapshotDiff,
  reason: string,
  resources = true,
): void {
  if (prev === null) {
    for (const g of next.gpus) {
      log.info('GPU found', {
        gpu: g.index,
        uuid: g.uuid,
        name: g.name,
        bus: g.busId,
        numa: g.numaNode,
        memory_mib: Math.round(g.memoryBytes / 1048576),
      });
    }
    for (const d of next.mig.devices) {
      log.info('MIG device found', {
        gpu: next.gpus[d.parent]?.index,
        uuid: next.gpus[d.parent]?.uuid,
        mig: d.uuid,
        mig_index: d.index,
        profile: d.profile,
        gi: d.gi,
        ci: d.ci,
        memory_mib: Math.round(d.memoryBytes / 1048576),
      });
    }
    if (resources && next.driverVersion !== null && next.gpus.length > 0)
      log.info('advertising', { resources: describePlan(next.resources) });
  } else {
    if (change.driverChanged && next.driverVersion !== null) {
      log.info('the NVIDIA driver answers', {
        driver: next.driverVersion,
        before: prev.driverVersion ?? 'not answering',
        reason,
      });
    }
    for (const uuid of change.gpusRemoved)
      log.warn('GPU left the node; its devices are withdrawn', {
        gpu: prev.gpus.find((g) => g.uuid === uuid)?.index,
        uuid,
        reason,
      });
    for (const uuid of change.gpusAdded) {
      const g = next.gpus.find((x) => x.uuid === uuid);
      log.info(uuid in prev.departed ? 'GPU is back' : 'GPU appeared', {
        gpu: g?.index,
        uuid,
        name: g?.name,
        bus: g?.busId,
        health: next.health.get(uuid),
        reason,
      });
    }
    for (const uuid of change.migRemoved) log.info('MIG device gone; withdrawn', { mig: uuid, reason });
    for (const uuid of change.migAdded) {
      const d = next.mig.devices.find((x) => x.uuid === uuid);
      const parent = d === undefined ? undefined : next.gpus[d.parent];
      log.info('MIG device found', {
        gpu: parent?.index,
        uuid: parent?.uuid,
        mig: uuid,
        mig_index: d?.index,
        profile: d?.profile,
        gi: d?.gi,
        ci: d?.ci,
        reason,
      });
    }
    for (const r of change.added)
      if (resources && prev.resources.length > 0)
        log.info('resource advertised', { resource: r.name, devices: r.devices.length, reason });
    for (const u of resources ? change.updated : []) {
      if (u.appeared.length + u.vanished.length === 0) continue;
      log.info('device list changed', {
        resource: u.name,
        devices: u.devices.length,
        appeared: u.appeared.length,
        vanished: u.vanished.length,
        reason,
      });
    }
    // The counts are of GPUs and MIG devices: an MPS daemon's transition (the same health map) has its own line.
    if (
      (change.updated.some((u) => u.healthChanged.length > 0) && prev.health !== next.health) ||
      change.gpusAdded.length + change.gpusRemoved.length > 0
    ) {
      const c = healthCounts(next);
      const mig = c.mig.total === 0 ? {} : { healthy_mig: c.mig.healthy, total_mig: c.mig.total };
      log.info('device counts', { healthy: c.gpus.healthy, total: c.gpus.total, ...mig });
    }
  }
  const pendingBefore = new Set(prev === null ? [] : pendingModeChanges(prev.gpus, prev.mig));
  for (const line of pendingModeChanges(next.gpus, next.mig))
    if (!pendingBefore.has(line)) log.warn('MIG mode change pending', { change: line });
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
  if (reason === 'reload') {
    log.info('looked at the node again', {
      reason,
      gpus: next.gpus.length,
      driver: next.driverVersion ?? 'not answering',
      changes: isEmptyDiff(change) ? 'none' : 'applied',
    });
  }
  if (
    next.driverVersion !== null &&
    next.gpus.length > 0 &&
    next.resources.length === 0 &&
    next.planProblem === null &&
    (prev === null || prev.resources.length > 0)
  ) {
    log.warn('nothing to advertise: no GPU or MIG device fits the MIG strategy', {
      gpus: next.gpus.length,
      mig_devices: next.mig.devices.length,
    });
  }
  if (next.driverVersion !== null && next.gpus.length === 0 && (prev === null || prev.gpus.length > 0)) {
    log.warn('no GPUs found; waiting for some to appear (re-discovery and SIGHUP look again)');
  }
}
