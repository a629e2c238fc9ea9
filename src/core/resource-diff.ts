// What changed of the device-plugin resources between two planned nodes (resource-plan.ts): per
// resource, the list to advertise now and the device IDs that appeared, vanished or changed health.
// Resources are only lists of advertised devices; a health-only snapshot with the same plan shares
// everything else with the one before, so it is cheap. Pure.
import { deviceList } from './devices.ts';
import type { DeviceListEntry } from './devices.ts';
import type { PlannedNode } from './resource-plan.ts';
import type { PlannedResource } from './sharing.ts';
import { resourceHealth } from './snapshot-health.ts';
import type { NodeSnapshot } from './snapshot.ts';

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

export interface ResourceDiff {
  readonly added: readonly ResourceChange[];
  readonly updated: readonly ResourceChange[];
  readonly removed: readonly ResourceChange[];
  /** Resources whose list and devices are exactly as before. */
  readonly unchanged: readonly string[];
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

/** The resources that were added, updated, removed or left as they were (previous null: nothing was served yet). */
export function diffResources(previous: PlannedNode | null, next: PlannedNode): ResourceDiff {
  const was = previous?.plan.resources ?? [];
  const before = new Map(was.map((r) => [r.name, r]));
  const after = new Map(next.plan.resources.map((r) => [r.name, r]));
  const out = { added: [] as ResourceChange[], updated: [] as ResourceChange[], unchanged: [] as string[] };
  for (const r of next.plan.resources) {
    const c = resourceChange(previous?.snapshot ?? null, before.get(r.name), next.snapshot, r);
    if (c === null) out.unchanged.push(r.name);
    else out[c.kind].push(c.change);
  }
  const removed: ResourceChange[] = [];
  for (const r of was) {
    if (after.has(r.name) || previous === null) continue;
    const devices = resourceDeviceList(previous.snapshot, r);
    removed.push({ name: r.name, devices, appeared: [], vanished: devices.map((d) => d.ID), healthChanged: [] });
  }
  return { ...out, removed };
}

/** Whether no resource changed. */
export function isEmptyResourceDiff(d: ResourceDiff): boolean {
  return d.added.length === 0 && d.updated.length === 0 && d.removed.length === 0;
}
