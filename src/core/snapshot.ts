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
// GPU facts are compared whole; resources are only lists of advertised devices.
//
// MIG (core/mig.ts): the MIG layout is part of the snapshot, by GPU position. A re-layout is a new
// snapshot like any other: its diff adds and removes mig-* resources and changes lists, and leaves
// every other GPU's resources alone. MIG devices have health of their own, carried over by MIG UUID
// (a re-created instance has a new UUID and starts fresh); `health` lists the GPUs, then the MIG
// devices (the health units of core/mig.ts). A node that stops fitting --mig-strategy=single after
// start is reported and withdrawn (no resources), never half-advertised.
import { countHealthyGpus, deviceList, deviceUnit } from './devices.ts';
import type { AdvertisedDevice, DeviceIdStrategy, DeviceListEntry, Gpu, Health } from './devices.ts';
import { freshHealthState } from './health.ts';
import type { GpuHealthState } from './health.ts';
import { migCapabilitiesProblem, planForNode } from './config-fit.ts';
import { MigStrategyError, NO_MIG } from './mig.ts';
import type { MigLayout, MigStrategy } from './mig.ts';
import type { PlannedResource, Sharing } from './sharing.ts';
import type { GpuLinkInfo } from './topology/index.ts';

/** What one scan of the node read, GPUs in NVML index order. */
export interface NodeScan {
  readonly driverVersion: string;
  readonly gpus: readonly Gpu[];
  /** Active NVLinks of each GPU, by position in gpus. */
  readonly nvlinks: readonly GpuLinkInfo[];
  /** NVML topology level of each pair of GPUs, by position; -1 where NVML could not say. */
  readonly pcie: readonly (readonly number[])[];
  /** MIG modes and devices, by GPU position (absent: MIG not looked at, or no MIG functions). */
  readonly mig?: MigLayout;
  /**
   * Capability nodes of each MIG device, by MIG UUID (from mig-minors), or why they could not be
   * read. Absent when there are no MIG devices.
   */
  readonly migCapabilities?: ReadonlyMap<string, readonly string[]> | { readonly problem: string };
}

/** The options that decide what is advertised. */
export interface PlanSettings {
  readonly deviceIdStrategy: DeviceIdStrategy;
  readonly sharing: Sharing;
  /** Default none. */
  readonly migStrategy?: MigStrategy;
  /** Device specs are passed: MIG devices need their capability nodes (a start without them fails). */
  readonly needMigCapabilities?: boolean;
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
  /** The MIG layout (NO_MIG when MIG is not used). */
  readonly mig: MigLayout;
  /** Health state of each MIG device, by position in mig.devices. */
  readonly migHealthStates: readonly GpuHealthState[];
  /** Capability nodes of each MIG device by its position in mig.devices (for Allocate), or why there are none. */
  readonly migCapabilities: ReadonlyMap<number, readonly string[]> | { readonly problem: string };
  /** What the MIG plan left out, one line each (skipped GPUs, sub-instances). */
  readonly migNotes: readonly string[];
}

function advertisedHealth(states: readonly GpuHealthState[], driverUp: boolean): Health[] {
  return states.map((s) => (driverUp ? s.health : 'Unhealthy'));
}

/** Every health state of a snapshot, by health unit: the GPUs, then the MIG devices. */
export function unitHealthStates(snapshot: Pick<NodeSnapshot, 'healthStates' | 'migHealthStates'>): GpuHealthState[] {
  return [...snapshot.healthStates, ...snapshot.migHealthStates];
}

function migCapabilitiesByPosition(mig: MigLayout, caps: NodeScan['migCapabilities']): NodeSnapshot['migCapabilities'] {
  if (caps === undefined) return new Map();
  if ('problem' in caps) return caps;
  const out = new Map<number, readonly string[]>();
  mig.devices.forEach((d, k) => {
    const nodes = caps.get(d.uuid);
    if (nodes !== undefined) out.set(k, nodes);
  });
  return out;
}

/** MIG devices' health carried over by MIG UUID; new ones start fresh. */
function carryMigHealth(mig: MigLayout, previous: NodeSnapshot | null): GpuHealthState[] {
  const before = new Map<string, GpuHealthState>();
  previous?.mig.devices.forEach((d, k) => {
    const st = previous.migHealthStates[k];
    if (st !== undefined) before.set(d.uuid, st);
  });
  return mig.devices.map((d) => before.get(d.uuid) ?? freshHealthState());
}

/**
 * The previous plan, kept for the GPUs of `gpus` (by UUID); devices of GPUs that left are dropped,
 * and so are MIG devices no longer in `mig` (by MIG UUID).
 */
export function carryPlan(previous: readonly PlannedResource[], previousGpus: readonly Gpu[], gpus: readonly Gpu[], previousMig: MigLayout = NO_MIG, mig: MigLayout = NO_MIG): PlannedResource[] {
  const pos = new Map(gpus.map((g, i) => [g.uuid, i]));
  const migPos = new Map(mig.devices.map((d, k) => [d.uuid, k]));
  const out: PlannedResource[] = [];
  for (const r of previous) {
    const devices: AdvertisedDevice[] = [];
    for (const d of r.devices) {
      const uuid = previousGpus[d.gpu]?.uuid;
      const at = uuid === undefined ? undefined : pos.get(uuid);
      if (at === undefined) continue;
      if (d.mig === undefined) {
        devices.push({ ...d, gpu: at });
        continue;
      }
      const migUuid = previousMig.devices[d.mig]?.uuid;
      const k = migUuid === undefined ? undefined : migPos.get(migUuid);
      if (k !== undefined) devices.push({ ...d, gpu: at, mig: k });
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
    const mig = previous?.mig ?? NO_MIG;
    const migStates = previous?.migHealthStates ?? [];
    const { resources, planProblem, notes } = plan(gpus, mig, settings, previous, previous?.migCapabilities ?? new Map());
    return {
      driverVersion: null,
      gpus,
      nvlinks: previous?.nvlinks ?? [],
      pcie: previous?.pcie ?? [],
      healthStates: states,
      health: advertisedHealth([...states, ...migStates], false),
      departed: previous?.departed ?? {},
      resources,
      planProblem,
      mig,
      migHealthStates: migStates,
      migCapabilities: previous?.migCapabilities ?? new Map(),
      migNotes: notes,
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
  const mig = scan.mig ?? NO_MIG;
  const migStates = carryMigHealth(mig, previous);
  const migCapabilities = migCapabilitiesByPosition(mig, scan.migCapabilities);
  const { resources, planProblem, notes } = plan(scan.gpus, mig, settings, previous, migCapabilities);
  return {
    driverVersion: scan.driverVersion,
    gpus: scan.gpus,
    nvlinks: scan.nvlinks,
    pcie: scan.pcie,
    healthStates: states,
    health: advertisedHealth([...states, ...migStates], true),
    departed,
    resources,
    planProblem,
    mig,
    migHealthStates: migStates,
    migCapabilities,
    migNotes: notes,
  };
}

interface Plan {
  resources: PlannedResource[];
  planProblem: string | null;
  notes: string[];
}

function plan(gpus: readonly Gpu[], mig: MigLayout, settings: PlanSettings, previous: NodeSnapshot | null, caps: NodeSnapshot['migCapabilities']): Plan {
  let planned: { resources: PlannedResource[]; notes: string[] };
  try {
    planned = planForNode(gpus, mig, settings);
  } catch (err) {
    if (previous === null) throw err;
    const problem = err instanceof Error ? err.message : String(err);
    // A node that stopped fitting --mig-strategy=single is withdrawn, not half-advertised.
    if (err instanceof MigStrategyError) return { resources: [], planProblem: problem, notes: [] };
    return { resources: carryPlan(previous.resources, previous.gpus, gpus, previous.mig, mig), planProblem: problem, notes: [] };
  }
  const problem = migCapabilitiesProblem(planned, settings, caps);
  if (problem !== null) {
    if (previous === null) throw new Error(problem);
    return { ...planned, planProblem: problem };
  }
  return { ...planned, planProblem: null };
}

/** How many health units a snapshot has: its GPUs, then its MIG devices. */
export function healthUnitCount(snapshot: Pick<NodeSnapshot, 'gpus' | 'mig'>): number {
  return snapshot.gpus.length + snapshot.mig.devices.length;
}

/** The same node with new health states (from the health tracker), by health unit (GPUs, then MIG devices). */
export function withHealthStates(snapshot: NodeSnapshot, states: readonly GpuHealthState[]): NodeSnapshot {
  if (states.length !== healthUnitCount(snapshot)) {
    throw new RangeError(`${states.length} health states for ${snapshot.gpus.length} GPUs and ${snapshot.mig.devices.length} MIG devices; expected one each`);
  }
  const g = snapshot.gpus.length;
  return { ...snapshot, healthStates: states.slice(0, g), migHealthStates: states.slice(g), health: advertisedHealth(states, snapshot.driverVersion !== null) };
}

/** Healthy of total: what STATUS, the log and the metrics say of a snapshot. */
export interface HealthCounts {
  readonly gpus: { readonly healthy: number; readonly total: number };
  readonly mig: { readonly healthy: number; readonly total: number };
  /** Per advertised resource with devices; a MIG device counts with its own health, not its parent's. */
  readonly resources: readonly { readonly name: string; readonly devices: number; readonly healthy: number }[];
}

export function healthCounts(snapshot: Pick<NodeSnapshot, 'gpus' | 'health' | 'resources'>): HealthCounts {
  const g = snapshot.gpus.length;
  const h = snapshot.health;
  return {
    gpus: { healthy: countHealthyGpus(h.slice(0, g)), total: g },
    mig: { healthy: countHealthyGpus(h.slice(g)), total: h.length - g },
    resources: snapshot.resources.filter((r) => r.devices.length > 0).map((r) => ({
      name: r.name,
      devices: r.devices.length,
      healthy: r.devices.filter((d) => h[deviceUnit(d, g)] === 'Healthy').length,
    })),
  };
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
    const gpu = snapshot.gpus[d.gpu];
    out.set(d.id, { entry, key: `${gpu?.uuid}|${d.runtimeName}|${d.replica ?? ''}|${JSON.stringify(entry.topology)}` });
  });
  return out;
}

// The same object is the same JSON: a health-only snapshot shares everything else with the one before.
const sameJson = (a: unknown, b: unknown): boolean => a === b || JSON.stringify(a) === JSON.stringify(b);

/** What changed from `previous` (null: nothing was served yet) to `next`. */
export function diff(previous: NodeSnapshot | null, next: NodeSnapshot): SnapshotDiff {
  const before = new Map((previous?.resources ?? []).map((r) => [r.name, r]));
  const after = new Map(next.resources.map((r) => [r.name, r]));
  const added: ResourceChange[] = [];
  const updated: ResourceChange[] = [];
  const removed: ResourceChange[] = [];
  const unchanged: string[] = [];
  for (const r of next.resources) {
    const old = before.get(r.name);
    if (old === r && previous !== null && previous.gpus === next.gpus) {
      // The same planned resource on the same GPUs (a health-only snapshot): only health can differ.
      const devices = resourceDeviceList(next, r);
      const was = resourceDeviceList(previous, old);
      const healthChanged = devices.filter((d, i) => d.health !== was[i]?.health).map((d) => d.ID);
      if (healthChanged.length > 0) updated.push({ name: r.name, devices, appeared: [], vanished: [], healthChanged });
      else unchanged.push(r.name);
      continue;
    }
    const now = views(next, r);
    const devices = [...now.values()].map((v) => v.entry);
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
  const oldMig = new Set((previous?.mig.devices ?? []).map((d) => d.uuid));
  const newMig = new Set(next.mig.devices.map((d) => d.uuid));
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
    migChanged: previous === null || !sameJson(previous.mig, next.mig),
    migAdded: [...newMig].filter((u) => !oldMig.has(u)),
    migRemoved: [...oldMig].filter((u) => !newMig.has(u)),
  };
}

/** Whether a diff changes anything the kubelet or the operator would see. */
export function isEmptyDiff(d: SnapshotDiff): boolean {
  return d.added.length === 0 && d.updated.length === 0 && d.removed.length === 0 && !d.gpuSetChanged && !d.driverChanged && !d.migChanged;
}

/**
 * The cheap identity of a node, compared by the slow re-discovery timer: GPU count, UUIDs in index
 * order, and each GPU's MIG mode where the driver can say (null otherwise).
 */
export interface NodeIdentity {
  readonly uuids: readonly string[];
  readonly migModes: readonly (number | null)[];
  /** With MIG in use: each GPU's MIG device UUIDs (a re-layout keeps the mode and changes these). */
  readonly migDevices?: readonly (readonly string[])[];
}

export function sameIdentity(a: NodeIdentity, b: NodeIdentity): boolean {
  return sameJson(a, b);
}

