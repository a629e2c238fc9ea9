// The log of an applied change (live-node.ts): what an operator needs to see of the node, once —
// GPUs and MIG devices found, gone or back, the driver answering again, pending MIG mode changes.
// What a mode makes of the node (the device-plugin resources, DRA's devices) is that mode's to log.
// Log keys: `gpu` a GPU's index, `uuid` its UUID, `mig` a MIG device's UUID.
import type { MigDevice } from '../core/mig.ts';
import { pendingModeChanges } from '../core/mig-strategies.ts';
import { healthCounts } from '../core/snapshot.ts';
import { isEmptyDiff } from '../core/snapshot-diff.ts';
import type { NodeSnapshot } from '../core/snapshot.ts';
import type { SnapshotDiff } from '../core/snapshot-diff.ts';
import type { Logger } from '../system/log.ts';

/** The log of a change: what an operator needs to see of the node, once. */
export function describeChange(
  log: Logger,
  prev: NodeSnapshot | null,
  next: NodeSnapshot,
  change: SnapshotDiff,
  reason: string,
): void {
  if (prev === null) describeFirst(log, next);
  else describeNext(log, prev, next, change, reason);
  const pendingBefore = new Set(prev === null ? [] : pendingModeChanges(prev.gpus, prev.mig));
  for (const line of pendingModeChanges(next.gpus, next.mig))
    if (!pendingBefore.has(line)) log.warn('MIG mode change pending', { change: line });
  if (reason === 'reload') {
    log.info('looked at the node again', {
      reason,
      gpus: next.gpus.length,
      driver: next.driverVersion ?? 'not answering',
      changes: isEmptyDiff(change) ? 'none' : 'applied',
    });
  }
  if (next.driverVersion !== null && next.gpus.length === 0 && (prev === null || prev.gpus.length > 0)) {
    log.warn('no GPUs found; waiting for some to appear (re-discovery and SIGHUP look again)');
  }
}

function migFields(s: NodeSnapshot, d: MigDevice | undefined, uuid: string): Record<string, unknown> {
  const parent = d === undefined ? undefined : s.gpus[d.parent];
  return {
    gpu: parent?.index,
    uuid: parent?.uuid,
    mig: uuid,
    mig_index: d?.index,
    profile: d?.profile,
    gi: d?.gi,
    ci: d?.ci,
  };
}

/** The first snapshot: every GPU and MIG device found. */
function describeFirst(log: Logger, next: NodeSnapshot): void {
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
  for (const d of next.mig.devices)
    log.info('MIG device found', { ...migFields(next, d, d.uuid), memory_mib: Math.round(d.memoryBytes / 1048576) });
}

/** A later snapshot: the driver, GPUs and MIG devices that came or went, and the counts when health moved. */
function describeNext(log: Logger, prev: NodeSnapshot, next: NodeSnapshot, change: SnapshotDiff, reason: string): void {
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
  for (const uuid of change.migAdded)
    log.info('MIG device found', {
      ...migFields(
        next,
        next.mig.devices.find((x) => x.uuid === uuid),
        uuid,
      ),
      reason,
    });
  // The counts are of GPUs and MIG devices: an MPS daemon's transition (the same health) has its own line.
  if (change.healthChanged.length + change.gpusAdded.length + change.gpusRemoved.length > 0) {
    const c = healthCounts(next);
    const mig = c.mig.total === 0 ? {} : { healthy_mig: c.mig.healthy, total_mig: c.mig.total };
    log.info('device counts', { healthy: c.gpus.healthy, total: c.gpus.total, ...mig });
  }
}
