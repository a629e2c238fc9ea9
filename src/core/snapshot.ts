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
// (a re-created instance has a new UUID and starts fresh). A node that stops fitting
// --mig-strategy=single after start is reported and withdrawn (no resources), never half-advertised.
//
// Health is kept by identity, never by position: `gpuHealth` by GPU UUID, `migHealth` by MIG UUID,
// each with the reason and since when; an advertised device names its GPU (and MIG device) by UUID.
//
// MPS (core/mps.ts): each MPS resource's control daemon has a state in `mpsDaemons`, by resource
// name (answering or not, why, since when). Its devices are advertised Unhealthy while the daemon does
// not answer — from the resource's first snapshot until the daemon's first answer, too — and with
// their GPU's own health once it answers; the GPU's own health is never touched by it. A resource
// that stays MPS keeps its daemon's state across snapshots; one that stops being MPS loses it.
import { countHealthyGpus, deviceList, deviceUnit } from './devices.ts';
import type { AdvertisedDevice, DeviceIdStrategy, DeviceListEntry, Gpu, GpuHealth, Health } from './devices.ts';
import { freshHealthState } from './health.ts';
import type { GpuHealthState } from './health.ts';
import { migCapabilitiesProblem, planForNode } from './config-fit.ts';
import { MigStrategyError, NO_MIG } from './mig.ts';
import type { MigLayout, MigStrategy } from './mig.ts';
import type { PlannedResource, Sharing } from './sharing.ts';
import type { GpuLinkInfo } from './topology/index.ts';

/** What the node labels and the MPS client limit need beyond discovery (nvml/node-facts.ts reads it), by GPU UUID. */
export interface NodeFacts {
  /** e.g. 12040 for CUDA 12.4, or null when NVML cannot say. */
  readonly cudaDriverVersion: number | null;
  readonly gpus: ReadonlyMap<
    string,
    { readonly compute: { readonly major: number; readonly minor: number } | null; readonly migCapable: boolean }
  >;
}

/** What one scan of the node read, GPUs in NVML index order. */
export interface NodeScan {
  /** Read only when something wants them (the node labels). */
  readonly facts?: NodeFacts;
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

/** One unit's (GPU's or MIG device's) health: the tracker's state (core/health.ts), why, and since when. */
export interface UnitHealth {
  readonly state: GpuHealthState;
  /** Why it is what it is: the transition's reason (null: nothing ever happened to it). */
  readonly reason: string | null;
  /** When that transition happened, in the caller's clock (ms since the epoch); null with reason null. */
  readonly since: number | null;
}

/** The health of a unit nothing has happened to. */
export function freshUnitHealth(): UnitHealth {
  return { state: freshHealthState(), reason: null, since: null };
}

export interface NodeSnapshot {
  /** null: the driver does not answer (unloaded, mid-upgrade); gpus are the last ones seen. */
  readonly driverVersion: string | null;
  readonly gpus: readonly Gpu[];
  readonly nvlinks: readonly GpuLinkInfo[];
  readonly pcie: readonly (readonly number[])[];
  /** Health of each GPU, by GPU UUID (one entry per GPU in gpus). */
  readonly gpuHealth: ReadonlyMap<string, UnitHealth>;
  /**
   * Health advertised, by GPU UUID and by MIG UUID: each unit's own, or Unhealthy while the driver
   * is down.
   */
  readonly health: GpuHealth;
  /** GPUs seen earlier and gone now, by UUID, with the health they left with. */
  readonly departed: Readonly<Record<string, UnitHealth>>;
  readonly resources: readonly PlannedResource[];
  /** Why the settings could not be planned against these GPUs (the previous resources were kept), or null. */
  readonly planProblem: string | null;
  /** The MIG layout (NO_MIG when MIG is not used). */
  readonly mig: MigLayout;
  /** Health of each MIG device, by MIG UUID (one entry per device in mig.devices). */
  readonly migHealth: ReadonlyMap<string, UnitHealth>;
  /** Capability nodes of each MIG device by MIG UUID (for Allocate), or why there are none. */
  readonly migCapabilities: ReadonlyMap<string, readonly string[]> | { readonly problem: string };
  /** What the MIG plan left out, one line each (skipped GPUs, sub-instances). */
  readonly migNotes: readonly string[];
  /** The last facts read (kept while the driver is down), or null when none were read. */
  readonly facts: NodeFacts | null;
  /**
   * The control daemon of each MPS resource (PlannedResource.mps), by resource name: one entry per
   * MPS resource of `resources`. Absent (older callers): no MPS resource.
   */
  readonly mpsDaemons?: ReadonlyMap<string, MpsDaemonState>;
}

/** Whether an MPS resource's control daemon answers, why (the client's reason when not), since when. */
export interface MpsDaemonState {
  readonly answering: boolean;
  /** Not answering: the control client's reason (or that it was not asked yet); answering: null. */
  readonly reason: string | null;
  /** When it last changed, in the caller's clock (ms since the epoch); null: never asked yet. */
  readonly since: number | null;
}

/** A daemon nobody has asked yet: not answering, so its replicas wait Unhealthy. */
export const MPS_DAEMON_NOT_ASKED: MpsDaemonState = { answering: false, reason: 'not asked yet', since: null };

/** The daemons' states of `resources`: carried over by name for resources still MPS, new ones not asked yet. */
function carryMpsDaemons(
  resources: readonly PlannedResource[],
  previous: NodeSnapshot | null,
): ReadonlyMap<string, MpsDaemonState> {
  const out = new Map<string, MpsDaemonState>();
  for (const r of resources)
    if (r.mps === true) out.set(r.name, previous?.mpsDaemons?.get(r.name) ?? MPS_DAEMON_NOT_ASKED);
  return out;
}

/** The MPS resources whose daemon does not answer (their devices are advertised Unhealthy). */
export function silentMpsDaemons(
  snapshot: Pick<NodeSnapshot, 'mpsDaemons'>,
): { resource: string; state: MpsDaemonState }[] {
  return [...(snapshot.mpsDaemons ?? new Map<string, MpsDaemonState>())]
    .filter(([, st]) => !st.answering)
    .map(([resource, state]) => ({ resource, state }));
}

/**
 * The health a resource's devices are advertised with: the snapshot's, except for
 * an MPS resource whose daemon does not answer: its replicas are Unhealthy.
 */
export function resourceHealth(
  snapshot: Pick<NodeSnapshot, 'health' | 'mpsDaemons'>,
  resource: PlannedResource,
): GpuHealth {
  if (resource.mps !== true) return snapshot.health;
  const daemon = snapshot.mpsDaemons?.get(resource.name) ?? MPS_DAEMON_NOT_ASKED;
  if (daemon.answering) return snapshot.health;
  // Only the replicas are the daemon's clients: a whole GPU listed under the same name (MPS on some
  // GPUs, not renamed) is no client of it and keeps its own health.
  const out = new Map(snapshot.health);
  for (const d of resource.devices) if (d.replica !== undefined) out.set(deviceUnit(d), 'Unhealthy');
  return out;
}

/**
 * The same node with new states for some MPS daemons (by resource name). A resource that is not an
 * MPS resource of this snapshot (the config changed meanwhile) is left out: returns the snapshot as is.
 */
export function withMpsDaemons(snapshot: NodeSnapshot, updates: ReadonlyMap<string, MpsDaemonState>): NodeSnapshot {
  const known = snapshot.mpsDaemons ?? new Map<string, MpsDaemonState>();
  const next = new Map(known);
  let changed = false;
  for (const [name, st] of updates) {
    if (!known.has(name)) continue;
    next.set(name, st);
    changed = true;
  }
  return changed ? { ...snapshot, mpsDaemons: next } : snapshot;
}

/** What is advertised: every unit's own health, or Unhealthy for all while the driver is down. */
function advertisedHealth(
  gpuHealth: ReadonlyMap<string, UnitHealth>,
  migHealth: ReadonlyMap<string, UnitHealth>,
  driverUp: boolean,
): GpuHealth {
  const out = new Map<string, Health>();
  for (const [uuid, h] of gpuHealth) out.set(uuid, driverUp ? h.state.health : 'Unhealthy');
  for (const [uuid, h] of migHealth) out.set(uuid, driverUp ? h.state.health : 'Unhealthy');
  return out;
}

function capabilitiesOf(caps: NodeScan['migCapabilities']): NodeSnapshot['migCapabilities'] {
  return caps ?? new Map();
}

/** MIG devices' health carried over by MIG UUID; new ones start fresh. */
function carryMigHealth(mig: MigLayout, previous: NodeSnapshot | null): Map<string, UnitHealth> {
  return new Map(mig.devices.map((d) => [d.uuid, previous?.migHealth.get(d.uuid) ?? freshUnitHealth()]));
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
 * The snapshot after a scan (`scan` null: the driver does not answer). Health carries over from
 * `previous` by UUID (see the rules above). Throws what planResources throws only when nothing was
 * ever planned for GPUs (no previous snapshot, or only ones without GPUs): then it is a start that fails.
 */
export function buildSnapshot(
  scan: NodeScan | null,
  settings: PlanSettings,
  previous: NodeSnapshot | null,
  recoveryEnabled: boolean,
): NodeSnapshot {
  if (scan === null) {
    const gpus = previous?.gpus ?? [];
    const gpuHealth = previous?.gpuHealth ?? new Map<string, UnitHealth>();
    const mig = previous?.mig ?? NO_MIG;
    const migHealth = previous?.migHealth ?? new Map<string, UnitHealth>();
    // No driver at start: no GPUs to check the config against yet, nothing to advertise; the first
    // scan with GPUs plans (and refuses a config that does not fit them, as a start would).
    const { resources, planProblem, notes } =
      previous === null
        ? planWithoutGpus(settings)
        : plan(gpus, mig, settings, previous, previous.migCapabilities, previous.facts);
    return {
      driverVersion: null,
      gpus,
      nvlinks: previous?.nvlinks ?? [],
      pcie: previous?.pcie ?? [],
      gpuHealth,
      health: advertisedHealth(gpuHealth, migHealth, false),
      departed: previous?.departed ?? {},
      resources,
      planProblem,
      mig,
      migHealth,
      migCapabilities: previous?.migCapabilities ?? new Map(),
      migNotes: notes,
      facts: previous?.facts ?? null,
      mpsDaemons: carryMpsDaemons(resources, previous),
    };
  }
  const present = previous?.gpuHealth ?? new Map<string, UnitHealth>();
  const departed: Record<string, UnitHealth> = { ...(previous?.departed ?? {}) };
  const seen = new Set(scan.gpus.map((g) => g.uuid));
  for (const [uuid, h] of present) if (!seen.has(uuid)) departed[uuid] = h;
  const gpuHealth = new Map(
    scan.gpus.map((g): [string, UnitHealth] => {
      const kept = present.get(g.uuid);
      if (kept !== undefined) return [g.uuid, kept];
      const back = departed[g.uuid];
      if (back === undefined) return [g.uuid, freshUnitHealth()];
      delete departed[g.uuid];
      return [g.uuid, recoveryEnabled ? freshUnitHealth() : back];
    }),
  );
  const mig = scan.mig ?? NO_MIG;
  const migHealth = carryMigHealth(mig, previous);
  const migCapabilities = capabilitiesOf(scan.migCapabilities);
  const { resources, planProblem, notes } = plan(
    scan.gpus,
    mig,
    settings,
    previous,
    migCapabilities,
    scan.facts ?? null,
  );
  return {
    driverVersion: scan.driverVersion,
    gpus: scan.gpus,
    nvlinks: scan.nvlinks,
    pcie: scan.pcie,
    gpuHealth,
    health: advertisedHealth(gpuHealth, migHealth, true),
    departed,
    resources,
    planProblem,
    mig,
    migHealth,
    migCapabilities,
    migNotes: notes,
    facts: scan.facts ?? null,
    mpsDaemons: carryMpsDaemons(resources, previous),
  };
}

/** The scan a snapshot was made from (null while the driver is down): what a re-plan (config reload) starts from. */
export function scanOf(s: NodeSnapshot): NodeScan | null {
  if (s.driverVersion === null) return null;
  return {
    driverVersion: s.driverVersion,
    gpus: s.gpus,
    nvlinks: s.nvlinks,
    pcie: s.pcie,
    mig: s.mig,
    migCapabilities: s.migCapabilities,
    ...(s.facts === null ? {} : { facts: s.facts }),
  };
}

interface Plan {
  resources: PlannedResource[];
  planProblem: string | null;
  notes: string[];
}

/** The plan of a start without the driver: what no GPU makes (nvidia.com/gpu, empty), or nothing when the config names GPUs. */
function planWithoutGpus(settings: PlanSettings): Plan {
  try {
    return { ...planForNode([], NO_MIG, settings), planProblem: null };
  } catch {
    return { resources: [], planProblem: null, notes: [] };
  }
}

function plan(
  gpus: readonly Gpu[],
  mig: MigLayout,
  settings: PlanSettings,
  previous: NodeSnapshot | null,
  caps: NodeSnapshot['migCapabilities'],
  facts: NodeFacts | null,
): Plan {
  let planned: { resources: PlannedResource[]; notes: string[] };
  try {
    planned = planForNode(gpus, mig, settings, facts?.gpus);
  } catch (err) {
    if (previous === null || previous.gpus.length === 0) throw err;
    const problem = err instanceof Error ? err.message : String(err);
    // A node that stopped fitting --mig-strategy=single is withdrawn, not half-advertised.
    if (err instanceof MigStrategyError) return { resources: [], planProblem: problem, notes: [] };
    return { resources: carryPlan(previous.resources, gpus, mig), planProblem: problem, notes: [] };
  }
  const problem = migCapabilitiesProblem(planned, settings, caps);
  if (problem !== null) {
    if (previous === null) throw new Error(problem);
    return { ...planned, planProblem: problem };
  }
  return { ...planned, planProblem: null };
}

/** Whether a unit (a GPU UUID or a MIG UUID) is in the snapshot. */
export function hasUnit(snapshot: Pick<NodeSnapshot, 'gpuHealth' | 'migHealth'>, unit: string): boolean {
  return snapshot.gpuHealth.has(unit) || snapshot.migHealth.has(unit);
}

/**
 * The same node with new health for some units (GPU UUIDs or MIG UUIDs, from the health tracker).
 * Throws naming a unit the snapshot does not hold: the caller looks before it writes.
 */
export function withHealth(snapshot: NodeSnapshot, updates: ReadonlyMap<string, UnitHealth>): NodeSnapshot {
  if (updates.size === 0) return snapshot;
  const gpuHealth = new Map(snapshot.gpuHealth);
  const migHealth = new Map(snapshot.migHealth);
  for (const [unit, h] of updates) {
    if (gpuHealth.has(unit)) gpuHealth.set(unit, h);
    else if (migHealth.has(unit)) migHealth.set(unit, h);
    else throw new RangeError(`health for ${unit}, which is neither a GPU nor a MIG device of this snapshot`);
  }
  return {
    ...snapshot,
    gpuHealth,
    migHealth,
    health: advertisedHealth(gpuHealth, migHealth, snapshot.driverVersion !== null),
  };
}

/** Healthy of total: what STATUS, the log and the metrics say of a snapshot. */
export interface HealthCounts {
  readonly gpus: { readonly healthy: number; readonly total: number };
  readonly mig: { readonly healthy: number; readonly total: number };
  /** Per advertised resource with devices; a MIG device counts with its own health, not its parent's. */
  readonly resources: readonly { readonly name: string; readonly devices: number; readonly healthy: number }[];
}

export function healthCounts(
  snapshot: Pick<NodeSnapshot, 'gpus' | 'mig' | 'health' | 'resources' | 'mpsDaemons'>,
): HealthCounts {
  const h = snapshot.health;
  const of = (uuid: string, in_: GpuHealth = h): Health => in_.get(uuid) ?? 'Unhealthy';
  return {
    gpus: { healthy: countHealthyGpus(snapshot.gpus.map((g) => of(g.uuid))), total: snapshot.gpus.length },
    mig: { healthy: countHealthyGpus(snapshot.mig.devices.map((d) => of(d.uuid))), total: snapshot.mig.devices.length },
    resources: snapshot.resources
      .filter((r) => r.devices.length > 0)
      .map((r) => {
        const rh = resourceHealth(snapshot, r);
        return {
          name: r.name,
          devices: r.devices.length,
          healthy: r.devices.filter((d) => of(deviceUnit(d), rh) === 'Healthy').length,
        };
      }),
  };
}

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
  return (
    d.added.length === 0 &&
    d.updated.length === 0 &&
    d.removed.length === 0 &&
    !d.gpuSetChanged &&
    !d.driverChanged &&
    !d.migChanged
  );
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
