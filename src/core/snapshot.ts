// The live node model: a snapshot of the node (driver, GPUs by UUID with their facts and health, the
// resources planned from them) and a diff between two snapshots saying which resources to start,
// update or stop. Re-discovery, config reload and health changes all produce a new snapshot; the
// manager applies the diff. Pure: plain data in, plain data out.
//
// Rules (FACTS §5 and the live-node issue):
// * A GPU is identified by its UUID; its NVML index and handle may change across scans.
// * A GPU still present keeps its health state, whatever else changed.
// * A GPU that leaves is remembered (`departed`) with the state it left in. When it comes back it
//   keeps that state (unhealthy or lost stays so), unless recovery is on: then it comes back fresh,
//   since reappearing on the bus after a reset is what recovery waits for.
// * While the driver does not answer (`driverVersion` null) the GPUs last seen stay in the snapshot
//   and every device is advertised Unhealthy: nothing can use them, but the registration and the
//   node's capacity stay, and when the driver answers again they take their own state back (a
//   driver reload is not a GPU fault).
// * A config that no longer fits the GPUs (a time-slicing list naming a GPU that left) does not stop
//   the node: the previous resources are kept for the GPUs still there, and planProblem says why.
//
// GPU facts are compared whole, so facts added to Gpu later (its MIG devices, say) take part in the
// diff without changes here; resources are only lists of advertised devices.
import { deviceList } from './devices.ts';
import type { AdvertisedDevice, DeviceIdStrategy, DeviceListEntry, Gpu, Health } from './devices.ts';
import { freshHealthState } from './health.ts';
import type { GpuHealthState } from './health.ts';
import { planResources } from './sharing.ts';
import type { PlannedResource, Sharing } from './sharing.ts';
import type { GpuLinkInfo } from './topology.ts';

/** What one scan of the node read, GPUs in NVML index order. */
export interface NodeScan {
  readonly driverVersion: string;
  readonly gpus: readonly Gpu[];
  /** Active NVLinks of each GPU, by position in gpus. */
  readonly nvlinks: readonly GpuLinkInfo[];
  /** NVML topology level of each pair of GPUs, by position; -1 where NVML could not say. */
  readonly pcie: readonly (readonly number[])[];
}

/** The options that decide what is advertised. */
export interface PlanSettings {
  readonly deviceIdStrategy: DeviceIdStrategy;
  readonly sharing: Sharing;
}

export interface NodeSnapshot {
  /** null: the driver does not answer (unloaded, mid-upgrade); gpus are the last ones seen. */
  readonly driverVersion: string | null;
  readonly gpus: readonly Gpu[];
  readonly nvlinks: readonly GpuLinkInfo[];
  readonly pcie: readonly (readonly number[])[];
  /** Health state of each GPU, by position (see core/health.ts). */
  readonly healthStates: readonly GpuHealthState[];
  /** Health advertised for each GPU, by position: its state's, or Unhealthy while the driver is down. */
  readonly health: readonly Health[];
  /** GPUs seen earlier and gone now, by UUID, with the state they left in. */
  readonly departed: Readonly<Record<string, GpuHealthState>>;
  readonly resources: readonly PlannedResource[];
  /** Why the settings could not be planned against these GPUs (the previous resources were kept), or null. */
  readonly planProblem: string | null;
}

function advertisedHealth(states: readonly GpuHealthState[], driverUp: boolean): Health[] {
  return states.map((s) => (driverUp ? s.health : 'Unhealthy'));
}

/** The previous plan, kept for the GPUs of `gpus` (by UUID); devices of GPUs that left are dropped. */
export function carryPlan(previous: readonly PlannedResource[], previousGpus: readonly Gpu[], gpus: readonly Gpu[]): PlannedResource[] {
  const pos = new Map(gpus.map((g, i) => [g.uuid, i]));
  const out: PlannedResource[] = [];
  for (const r of previous) {
    const devices: AdvertisedDevice[] = [];
    for (const d of r.devices) {
      const uuid = previousGpus[d.gpu]?.uuid;
      const at = uuid === undefined ? undefined : pos.get(uuid);
      if (at !== undefined) devices.push({ ...d, gpu: at });
    }
    if (devices.length > 0) out.push({ ...r, devices });
  }
  return out;
}

/**
 * The snapshot after a scan (`scan` null: the driver does not answer). Health carries over from
 * `previous` by UUID (see the rules above). Throws what planResources throws only when there is no
 * previous snapshot to fall back on.
 */
export function buildSnapshot(scan: NodeScan | null, settings: PlanSettings, previous: NodeSnapshot | null, recoveryEnabled: boolean): NodeSnapshot {
  if (scan === null) {
    const gpus = previous?.gpus ?? [];
    const states = previous?.healthStates ?? [];
    const { resources, planProblem } = plan(gpus, settings, previous);
    return {
      driverVersion: null,
      gpus,
      nvlinks: previous?.nvlinks ?? [],
      pcie: previous?.pcie ?? [],
      healthStates: states,
      health: advertisedHealth(states, false),
      departed: previous?.departed ?? {},
      resources,
      planProblem,
    };
  }
  const present = new Map<string, GpuHealthState>();
  previous?.gpus.forEach((g, i) => {
    const s = previous.healthStates[i];
    if (s !== undefined) present.set(g.uuid, s);
  });
  const departed: Record<string, GpuHealthState> = { ...(previous?.departed ?? {}) };
  const seen = new Set(scan.gpus.map((g) => g.uuid));
  for (const [uuid, s] of present) if (!seen.has(uuid)) departed[uuid] = s;
  const states = scan.gpus.map((g): GpuHealthState => {
    const kept = present.get(g.uuid);
    if (kept !== undefined) return kept;
    const back = departed[g.uuid];
    if (back === undefined) return freshHealthState();
    delete departed[g.uuid];
    return recoveryEnabled ? freshHealthState() : back;
  });
  const { resources, planProblem } = plan(scan.gpus, settings, previous);
  return {
    driverVersion: scan.driverVersion,
    gpus: scan.gpus,
    nvlinks: scan.nvlinks,
    pcie: scan.pcie,
    healthStates: states,
    health: advertisedHealth(states, true),
    departed,
    resources,
    planProblem,
  };
}

function plan(gpus: readonly Gpu[], settings: PlanSettings, previous: NodeSnapshot | null): { resources: PlannedResource[]; planProblem: string | null } {
  try {
    return { resources: planResources(gpus, settings.deviceIdStrategy, settings.sharing), planProblem: null };
  } catch (err) {
    if (previous === null) throw err;
    const problem = err instanceof Error ? err.message : String(err);
    return { resources: carryPlan(previous.resources, previous.gpus, gpus), planProblem: problem };
  }
}

/** The same node with new per-GPU health states (from the health tracker), by position. */
export function withHealthStates(snapshot: NodeSnapshot, states: readonly GpuHealthState[]): NodeSnapshot {
  if (states.length !== snapshot.gpus.length) {
    throw new RangeError(`${states.length} health states for ${snapshot.gpus.length} GPUs; expected one per GPU`);
  }
  return { ...snapshot, healthStates: states, health: advertisedHealth(states, snapshot.driverVersion !== null) };
}

/** The device list of a resource as the kubelet sees it. */
export function resourceDeviceList(snapshot: NodeSnapshot, resource: PlannedResource): DeviceListEntry[] {
  return deviceList(resource.devices, snapshot.gpus, snapshot.health);
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
  /** The driver version differs (also when the driver stopped or started answering). */
  readonly driverChanged: boolean;
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
    const gpu = snapshot.gpus[d.gpu];
    out.set(d.id, { entry, key: `${gpu?.uuid}|${d.runtimeName}|${d.replica ?? ''}|${JSON.stringify(entry.topology)}` });
  });
  return out;
}

const sameJson = (a: unknown, b: unknown): boolean => JSON.stringify(a) === JSON.stringify(b);

/** What changed from `previous` (null: nothing was served yet) to `next`. */
export function diff(previous: NodeSnapshot | null, next: NodeSnapshot): SnapshotDiff {
  const before = new Map((previous?.resources ?? []).map((r) => [r.name, r]));
  const after = new Map(next.resources.map((r) => [r.name, r]));
  const added: ResourceChange[] = [];
  const updated: ResourceChange[] = [];
  const removed: ResourceChange[] = [];
  const unchanged: string[] = [];
  for (const r of next.resources) {
    const now = views(next, r);
    const devices = [...now.values()].map((v) => v.entry);
    const old = before.get(r.name);
    if (old === undefined || previous === null) {
      added.push({ name: r.name, devices, appeared: [...now.keys()], vanished: [], healthChanged: [] });
      continue;
    }
    const was = views(previous, old);
    const appeared: string[] = [];
    const vanished: string[] = [];
    const healthChanged: string[] = [];
    let other = old.failRequestsGreaterThanOne !== r.failRequestsGreaterThanOne || [...was.keys()].join(' ') !== [...now.keys()].join(' ');
    for (const [id, v] of now) {
      const w = was.get(id);
      if (w === undefined) appeared.push(id);
      else {
        if (w.entry.health !== v.entry.health) healthChanged.push(id);
        if (w.key !== v.key) other = true;
      }
    }
    for (const id of was.keys()) if (!now.has(id)) vanished.push(id);
    if (appeared.length + vanished.length + healthChanged.length > 0 || other) {
      updated.push({ name: r.name, devices, appeared, vanished, healthChanged });
    } else unchanged.push(r.name);
  }
  if (previous !== null) {
    for (const r of previous.resources) {
      if (after.has(r.name)) continue;
      const devices = resourceDeviceList(previous, r);
      removed.push({ name: r.name, devices, appeared: [], vanished: devices.map((d) => d.ID), healthChanged: [] });
    }
  }
  const oldGpus = new Map((previous?.gpus ?? []).map((g) => [g.uuid, g]));
  const newUuids = new Set(next.gpus.map((g) => g.uuid));
  const gpusAdded = next.gpus.filter((g) => !oldGpus.has(g.uuid)).map((g) => g.uuid);
  const gpusRemoved = [...oldGpus.keys()].filter((u) => !newUuids.has(u));
  const gpusChanged = next.gpus.filter((g) => {
    const o = oldGpus.get(g.uuid);
    return o !== undefined && !sameJson(o, g);
  }).map((g) => g.uuid);
  const gpuSetChanged = previous === null || !sameJson(previous.gpus, next.gpus) || !sameJson(previous.nvlinks, next.nvlinks) || !sameJson(previous.pcie, next.pcie);
  return {
    added,
    updated,
    removed,
    unchanged,
    gpusAdded,
    gpusRemoved,
    gpusChanged,
    gpuSetChanged,
    driverChanged: previous === null || previous.driverVersion !== next.driverVersion,
  };
}

/** Whether a diff changes anything the kubelet or the operator would see. */
export function isEmptyDiff(d: SnapshotDiff): boolean {
  return d.added.length === 0 && d.updated.length === 0 && d.removed.length === 0 && !d.gpuSetChanged && !d.driverChanged;
}

/**
 * The cheap identity of a node, compared by the slow re-discovery timer: GPU count, UUIDs in index
 * order, and each GPU's MIG mode where the driver can say (null otherwise).
 */
export interface NodeIdentity {
  readonly uuids: readonly string[];
  readonly migModes: readonly (number | null)[];
}

export function sameIdentity(a: NodeIdentity, b: NodeIdentity): boolean {
  return sameJson(a, b);
}

