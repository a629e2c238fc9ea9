// What changed between two node snapshots (snapshot.ts): the GPUs that came, went or changed; the
// units (GPUs and MIG devices) whose advertised health changed; the driver and the MIG layout. GPU
// facts are compared whole. What changed of the device-plugin resources is resource-diff.ts's. Pure.
import type { NodeSnapshot } from './snapshot.ts';
import { liveNvlinks } from './snapshot-signals.ts';

export interface SnapshotDiff {
  /** UUIDs of GPUs that appeared, left, or stayed with other facts (index, bus, memory...). */
  readonly gpusAdded: readonly string[];
  readonly gpusRemoved: readonly string[];
  readonly gpusChanged: readonly string[];
  /** The GPUs (UUIDs in order) or their facts differ: topology and health watching start over. */
  readonly gpuSetChanged: boolean;
  /** The NVLinks in service differ (gpuSetChanged, or a link a health signal saw go down or come back). */
  readonly topologyChanged?: boolean;
  /** The driver version differs (also when the driver stopped or started answering). */
  readonly driverChanged: boolean;
  /** The MIG layout or a MIG mode differs: MIG health watching starts over on the new devices. */
  readonly migChanged: boolean;
  /** MIG devices (UUIDs) that appeared and vanished. */
  readonly migAdded: readonly string[];
  readonly migRemoved: readonly string[];
  /** GPU and MIG UUIDs in both snapshots whose advertised health differs. */
  readonly healthChanged: readonly string[];
}

// The same object is the same JSON: a health-only snapshot shares everything else with the one before.
const sameJson = (a: unknown, b: unknown): boolean => a === b || JSON.stringify(a) === JSON.stringify(b);

/** Units in both whose advertised health differs. */
function healthChanges(previous: NodeSnapshot | null, next: NodeSnapshot): string[] {
  if (previous === null || previous.health === next.health) return [];
  const out: string[] = [];
  for (const [unit, h] of next.health) {
    const was = previous.health.get(unit);
    if (was !== undefined && was !== h) out.push(unit);
  }
  return out;
}

/** What changed from `previous` (null: nothing was served yet) to `next`. */
export function diff(previous: NodeSnapshot | null, next: NodeSnapshot): SnapshotDiff {
  const oldGpus = new Map((previous?.gpus ?? []).map((g) => [g.uuid, g]));
  const newUuids = new Set(next.gpus.map((g) => g.uuid));
  const gpusChanged = next.gpus
    .filter((g) => {
      const o = oldGpus.get(g.uuid);
      return o !== undefined && !sameJson(o, g);
    })
    .map((g) => g.uuid);
  const gpuSetChanged =
    previous === null ||
    !sameJson(previous.gpus, next.gpus) ||
    !sameJson(previous.nvlinks, next.nvlinks) ||
    !sameJson(previous.pcie, next.pcie);
  const oldMig = new Set((previous?.mig.devices ?? []).map((d) => d.uuid));
  const newMig = new Set(next.mig.devices.map((d) => d.uuid));
  return {
    gpusAdded: next.gpus.filter((g) => !oldGpus.has(g.uuid)).map((g) => g.uuid),
    gpusRemoved: [...oldGpus.keys()].filter((u) => !newUuids.has(u)),
    gpusChanged,
    gpuSetChanged,
    topologyChanged: gpuSetChanged || (previous !== null && !sameJson(liveNvlinks(previous), liveNvlinks(next))),
    driverChanged: previous === null || previous.driverVersion !== next.driverVersion,
    migChanged: previous === null || !sameJson(previous.mig, next.mig),
    migAdded: [...newMig].filter((u) => !oldMig.has(u)),
    migRemoved: [...oldMig].filter((u) => !newMig.has(u)),
    healthChanged: healthChanges(previous, next),
  };
}

/** Whether a diff changes anything of the node the kubelet or the operator would see. */
export function isEmptyDiff(d: SnapshotDiff): boolean {
  return d.healthChanged.length === 0 && !d.gpuSetChanged && !d.driverChanged && !d.migChanged;
}
