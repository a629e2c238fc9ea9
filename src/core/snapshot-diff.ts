// What changed between two node snapshots (snapshot.ts): per resource, the list to advertise now and
// the device IDs that appeared, vanished or changed health; the GPUs that came, went or changed; the
// driver and the MIG layout. GPU facts are compared whole; resources are only lists of advertised
// devices. A health-only snapshot shares everything else with the one before, so it is cheap. Pure.
import { deviceList } from './devices.ts';
import type { DeviceListEntry } from './devices.ts';
import type { PlannedResource } from './sharing.ts';
import { resourceHealth } from './snapshot-health.ts';
import type { NodeSnapshot } from './snapshot.ts';
import { liveNvlinks } from './snapshot-signals.ts';

/** The device list of a resource as the kubelet sees it. */
export function resourceDeviceList(snapshot: NodeSnapshot, resource: PlannedResource): DeviceListEntry[] {
  return deviceList(resource.devices, snapshot.gpus, resourceHealth(snapshot, resource));
}

/** One resource in a diff: the list to advertise now (for a removed one, the last list advertised). */
export interface ResourceChange {
  readonly name: string;
  readonly devices: readonly DeviceListEntry[];
  /** Device IDs advertised now and not before. */
  readonly appeared: readonly string[];
  /** Device IDs advertised before and not now. */
  readonly vanished: readonly string[];
  /** Device IDs in both whose health changed. */
  readonly healthChanged: readonly string[];
}

export interface SnapshotDiff {
  readonly added: readonly ResourceChange[];
  readonly updated: readonly ResourceChange[];
  readonly removed: readonly ResourceChange[];
  /** Resources whose list and devices are exactly as before. */
  readonly unchanged: readonly string[];
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
}

interface DeviceView {
  readonly entry: DeviceListEntry;
  /** What else must match for the device to be "the same": its GPU and the name the runtime gets. */
  readonly key: string;
}

function views(snapshot: NodeSnapshot, r: PlannedResource): Map<string, DeviceView> {
  const list = resourceDeviceList(snapshot, r);
  const out = new Map<string, DeviceView>();
  r.devices.forEach((d, i) => {
    const entry = list[i] as DeviceListEntry;
    out.set(d.id, { entry, key: `${d.uuid}|${d.runtimeName}|${d.replica ?? ''}|${JSON.stringify(entry.topology)}` });
  });
  return out;
}

// The same object is the same JSON: a health-only snapshot shares everything else with the one before.
const sameJson = (a: unknown, b: unknown): boolean => a === b || JSON.stringify(a) === JSON.stringify(b);

type ResourceDiff = Pick<SnapshotDiff, 'added' | 'updated' | 'removed' | 'unchanged'>;

/** One resource of `next` against its namesake in `previous`: added, updated, or unchanged (null). */
function resourceChange(
  previous: NodeSnapshot | null,
  old: PlannedResource | undefined,
  next: NodeSnapshot,
  r: PlannedResource,
): { kind: 'added' | 'updated'; change: ResourceChange } | null {
  if (old === r && previous !== null && previous.gpus === next.gpus) {
    // The same planned resource on the same GPUs (a health-only snapshot): only health can differ.
    const devices = resourceDeviceList(next, r);
    const was = resourceDeviceList(previous, old);
    const healthChanged = devices.filter((d, i) => d.health !== was[i]?.health).map((d) => d.ID);
    if (healthChanged.length === 0) return null;
    return { kind: 'updated', change: { name: r.name, devices, appeared: [], vanished: [], healthChanged } };
  }
  const now = views(next, r);
  const devices = [...now.values()].map((v) => v.entry);
  if (old === undefined || previous === null)
    return {
      kind: 'added',
      change: { name: r.name, devices, appeared: [...now.keys()], vanished: [], healthChanged: [] },
    };
  const was = views(previous, old);
  const appeared: string[] = [];
  const healthChanged: string[] = [];
  let other =
    old.failRequestsGreaterThanOne !== r.failRequestsGreaterThanOne ||
    [...was.keys()].join(' ') !== [...now.keys()].join(' ');
  for (const [id, v] of now) {
    const w = was.get(id);
    if (w === undefined) appeared.push(id);
    else {
      if (w.entry.health !== v.entry.health) healthChanged.push(id);
      if (w.key !== v.key) other = true;
    }
  }
  const vanished = [...was.keys()].filter((id) => !now.has(id));
  if (appeared.length + vanished.length + healthChanged.length === 0 && !other) return null;
  return { kind: 'updated', change: { name: r.name, devices, appeared, vanished, healthChanged } };
}

/** The resources that were added, updated, removed or left as they were. */
function resourcesDiff(previous: NodeSnapshot | null, next: NodeSnapshot): ResourceDiff {
  const before = new Map((previous?.resources ?? []).map((r) => [r.name, r]));
  const after = new Map(next.resources.map((r) => [r.name, r]));
  const out = { added: [] as ResourceChange[], updated: [] as ResourceChange[], unchanged: [] as string[] };
  for (const r of next.resources) {
    const c = resourceChange(previous, before.get(r.name), next, r);
    if (c === null) out.unchanged.push(r.name);
    else out[c.kind].push(c.change);
  }
  const removed: ResourceChange[] = [];
  for (const r of previous?.resources ?? []) {
    if (after.has(r.name) || previous === null) continue;
    const devices = resourceDeviceList(previous, r);
    removed.push({ name: r.name, devices, appeared: [], vanished: devices.map((d) => d.ID), healthChanged: [] });
  }
  return { ...out, removed };
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
    ...resourcesDiff(previous, next),
    gpusAdded: next.gpus.filter((g) => !oldGpus.has(g.uuid)).map((g) => g.uuid),
    gpusRemoved: [...oldGpus.keys()].filter((u) => !newUuids.has(u)),
    gpusChanged,
    gpuSetChanged,
    topologyChanged: gpuSetChanged || (previous !== null && !sameJson(liveNvlinks(previous), liveNvlinks(next))),
    driverChanged: previous === null || previous.driverVersion !== next.driverVersion,
    migChanged: previous === null || !sameJson(previous.mig, next.mig),
    migAdded: [...newMig].filter((u) => !oldMig.has(u)),
    migRemoved: [...oldMig].filter((u) => !newMig.has(u)),
  };
}

/** Whether a diff changes anything the kubelet or the operator would see. */
export function isEmptyDiff(d: SnapshotDiff): boolean {
  return (
    d.added.length === 0 &&
    d.updated.length === 0 &&
    d.removed.length === 0 &&
    !d.gpuSetChanged &&
    !d.driverChanged &&
    !d.migChanged
  );
}
