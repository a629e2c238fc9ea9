// The live node model: a snapshot of the node (driver, GPUs by UUID with their facts and health, the
// MIG layout, the MPS daemons' states), whichever API serves it. Re-discovery, config reload and
// health changes all produce a new snapshot; what changed is snapshot-diff.ts's, the health view
// snapshot-health.ts's. What the device-plugin mode advertises of it is planned from it
// (resource-plan.ts), never held in it. Pure: plain data in, plain data out.
//
// Rules:
// * A GPU is identified by its UUID; its NVML index and handle may change across scans.
// * A GPU still present keeps its health state, whatever else changed.
// * A GPU that leaves is remembered (`departed`) with the state it left in. When it comes back it
//   keeps that state (unhealthy or lost stays so), unless recovery is on: then it comes back fresh,
//   since reappearing on the bus after a reset is what recovery waits for.
// * While the driver does not answer (`driverVersion` null) the GPUs last seen stay in the snapshot
//   and every device is advertised Unhealthy: nothing can use them, but the registration and the
//   node's capacity stay, and when the driver answers again they take their own state back (a
//   driver reload is not a GPU fault).
//
// MIG (core/mig.ts): the MIG layout is part of the snapshot, by GPU position. A re-layout is a new
// snapshot like any other. MIG devices have health of their own, carried over by MIG UUID (a
// re-created instance has a new UUID and starts fresh).
//
// Health is kept by identity, never by position: `gpuHealth` by GPU UUID, `migHealth` by MIG UUID,
// each with the reason and since when.
// MPS daemons' states are kept by resource name as the MPS daemon watch reports them, until it stops
// watching one (withMpsDaemons); which resources are MPS is the device-plugin plan's.
import type { ConsumableCapacity } from './dra-capacity.ts';
import type { DeviceIdStrategy, Gpu, GpuHealth } from './devices.ts';
import { NO_MIG } from './mig.ts';
import type { MigLayout, MigStrategy } from './mig.ts';
import type { Sharing } from './sharing.ts';
import { advertisedHealth, freshUnitHealth } from './snapshot-health.ts';
import type { MpsDaemonState, UnitHealth } from './snapshot-health.ts';
import { carrySignals, NO_SIGNALS, signalledUnits } from './snapshot-signals.ts';
import type { NodeSignals } from './snapshot-signals.ts';
import type { GpuSignals } from './health-signal-types.ts';
import type { GpuLinkInfo } from './topology/index.ts';

export {
  MPS_DAEMON_NOT_ASKED,
  freshUnitHealth,
  healthCounts,
  resourceHealth,
  silentMpsDaemons,
  unitsOfSilentClaimDaemons,
} from './snapshot-health.ts';
export type { HealthCounts, MpsDaemonState, UnitHealth } from './snapshot-health.ts';
export type { NodeSignals } from './snapshot-signals.ts';

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

/** The options that decide what is advertised (the device-plugin plan, core/resource-plan.ts; DRA's MIG strategy). */
export interface PlanSettings {
  readonly deviceIdStrategy: DeviceIdStrategy;
  readonly sharing: Sharing;
  /** Default none. */
  readonly migStrategy?: MigStrategy;
  /** Device specs are passed: MIG devices need their capability nodes (a start without them fails). */
  readonly needMigCapabilities?: boolean;
  /** DRA mode: whole GPUs' consumable capacity (core/dra-capacity.ts); absent: off. */
  readonly consumableCapacity?: ConsumableCapacity;
  /** DRA mode: MIG-mode GPUs published as partitionable devices (dynamic MIG); absent: off. */
  readonly dynamicMig?: boolean;
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
  /** The MIG layout (NO_MIG when MIG is not used). */
  readonly mig: MigLayout;
  /** Health of each MIG device, by MIG UUID (one entry per device in mig.devices). */
  readonly migHealth: ReadonlyMap<string, UnitHealth>;
  /** Capability nodes of each MIG device by MIG UUID (for Allocate), or why there are none. */
  readonly migCapabilities: ReadonlyMap<string, readonly string[]> | { readonly problem: string };
  /** The last facts read (kept while the driver is down), or null when none were read. */
  readonly facts: NodeFacts | null;
  /**
   * The control daemon of each watched MPS resource (PlannedResource.mps), by resource name, as last
   * reported; a resource not here has not been asked yet.
   */
  readonly mpsDaemons: ReadonlyMap<string, MpsDaemonState>;
  /**
   * Each GPU's health signals beyond XIDs (core/health-signals.ts), by GPU UUID: GPUs never read yet
   * have none. A critical bad signal makes the GPU and every MIG device on it Unhealthy in `health`.
   */
  readonly signals: NodeSignals;
  /**
   * Dynamic MIG: the partitions (device names, gpu-<minor>-mig-<profile>-<id>-<start>) that prepared claims hold or
   * are being made for. A GPU instance at such a partition's placement is the package's: it stands for that
   * partition and is never published as a MIG device of its own. Absent: none.
   */
  readonly claimedPartitions?: ReadonlySet<string>;
}

/**
 * The same node with the partitions prepared claims hold now; the snapshot as is when they are the same (or
 * undefined: not known here).
 */
export function withClaimedPartitions(snapshot: NodeSnapshot, names: ReadonlySet<string> | undefined): NodeSnapshot {
  if (names === undefined) return snapshot;
  const was = snapshot.claimedPartitions ?? new Set<string>();
  if (was.size === names.size && [...names].every((n) => was.has(n))) return snapshot;
  return { ...snapshot, claimedPartitions: new Set(names) };
}

/**
 * The same node with new states for some MPS daemons (by resource name); null: the daemon is no longer
 * watched, its state is forgotten (watched again, it starts not asked). Returns the snapshot as is
 * when nothing changes.
 */
export function withMpsDaemons(
  snapshot: NodeSnapshot,
  updates: ReadonlyMap<string, MpsDaemonState | null>,
): NodeSnapshot {
  const next = new Map(snapshot.mpsDaemons);
  let changed = false;
  for (const [name, st] of updates) {
    if (st === null) changed = next.delete(name) || changed;
    else {
      next.set(name, st);
      changed = true;
    }
  }
  return changed ? { ...snapshot, mpsDaemons: next } : snapshot;
}

/** The claimed partitions carried to the next snapshot: they are the claims', not the scan's. */
function claimedOf(previous: NodeSnapshot | null): Pick<NodeSnapshot, 'claimedPartitions'> {
  const c = previous?.claimedPartitions;
  return c === undefined ? {} : { claimedPartitions: c };
}

function capabilitiesOf(caps: NodeScan['migCapabilities']): NodeSnapshot['migCapabilities'] {
  return caps ?? new Map();
}

/** MIG devices' health carried over by MIG UUID; new ones start fresh. */
function carryMigHealth(mig: MigLayout, previous: NodeSnapshot | null): Map<string, UnitHealth> {
  return new Map(mig.devices.map((d) => [d.uuid, previous?.migHealth.get(d.uuid) ?? freshUnitHealth()]));
}

/**
 * The snapshot after a scan (`scan` null: the driver does not answer). Health and the MPS daemons'
 * states carry over from `previous` by UUID and by name (see the rules above).
 */
export function buildSnapshot(
  scan: NodeScan | null,
  previous: NodeSnapshot | null,
  recoveryEnabled: boolean,
): NodeSnapshot {
  if (scan === null) return driverDown(previous);
  const { gpuHealth, departed } = carryGpuHealth(scan.gpus, previous, recoveryEnabled);
  const mig = scan.mig ?? NO_MIG;
  const migHealth = carryMigHealth(mig, previous);
  const migCapabilities = capabilitiesOf(scan.migCapabilities);
  const facts = scan.facts ?? null;
  const signals = carrySignals(scan.gpus, previous?.signals);
  return {
    driverVersion: scan.driverVersion,
    gpus: scan.gpus,
    nvlinks: scan.nvlinks,
    pcie: scan.pcie,
    gpuHealth,
    health: advertisedHealth(gpuHealth, migHealth, true, signalledUnits(scan.gpus, mig, signals)),
    departed,
    mig,
    migHealth,
    migCapabilities,
    facts,
    mpsDaemons: previous?.mpsDaemons ?? new Map(),
    signals,
    ...claimedOf(previous),
  };
}

/**
 * GPUs' health carried over by UUID; one that left is remembered, one that is back gets what it left with (or fresh
 * with recovery).
 */
function carryGpuHealth(
  gpus: readonly Gpu[],
  previous: NodeSnapshot | null,
  recoveryEnabled: boolean,
): { gpuHealth: Map<string, UnitHealth>; departed: Record<string, UnitHealth> } {
  const present = previous?.gpuHealth ?? new Map<string, UnitHealth>();
  const departed: Record<string, UnitHealth> = { ...(previous?.departed ?? {}) };
  const seen = new Set(gpus.map((g) => g.uuid));
  for (const [uuid, h] of present) if (!seen.has(uuid)) departed[uuid] = h;
  const gpuHealth = new Map(
    gpus.map((g): [string, UnitHealth] => {
      const kept = present.get(g.uuid);
      if (kept !== undefined) return [g.uuid, kept];
      const back = departed[g.uuid];
      if (back === undefined) return [g.uuid, freshUnitHealth()];
      delete departed[g.uuid];
      return [g.uuid, recoveryEnabled ? freshUnitHealth() : back];
    }),
  );
  return { gpuHealth, departed };
}

/** The driver does not answer: the GPUs last seen stay, every device Unhealthy. */
function driverDown(previous: NodeSnapshot | null): NodeSnapshot {
  const gpuHealth = previous?.gpuHealth ?? new Map<string, UnitHealth>();
  const migHealth = previous?.migHealth ?? new Map<string, UnitHealth>();
  return {
    driverVersion: null,
    gpus: previous?.gpus ?? [],
    nvlinks: previous?.nvlinks ?? [],
    pcie: previous?.pcie ?? [],
    gpuHealth,
    health: advertisedHealth(gpuHealth, migHealth, false),
    departed: previous?.departed ?? {},
    mig: previous?.mig ?? NO_MIG,
    migHealth,
    migCapabilities: previous?.migCapabilities ?? new Map(),
    facts: previous?.facts ?? null,
    mpsDaemons: previous?.mpsDaemons ?? new Map(),
    signals: previous?.signals ?? NO_SIGNALS,
    ...claimedOf(previous),
  };
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
    health: advertised({ ...snapshot, gpuHealth, migHealth }),
  };
}

/** What a snapshot advertises from its units' health, its driver state and its GPUs' signals. */
function advertised(s: Pick<NodeSnapshot, 'gpuHealth' | 'migHealth' | 'driverVersion' | 'gpus' | 'mig' | 'signals'>) {
  return advertisedHealth(s.gpuHealth, s.migHealth, s.driverVersion !== null, signalledUnits(s.gpus, s.mig, s.signals));
}

/**
 * The same node with new health signals for some GPUs (by GPU UUID; one the snapshot does not hold
 * is left out), and what is advertised after them.
 */
export function withSignals(snapshot: NodeSnapshot, updates: NodeSignals): NodeSnapshot {
  const signals = new Map(snapshot.signals);
  let changed = false;
  for (const [uuid, g] of updates) {
    if (!snapshot.gpuHealth.has(uuid) || sameSignals(snapshot.signals.get(uuid), g)) continue;
    signals.set(uuid, g);
    changed = true;
  }
  return changed ? { ...snapshot, signals, health: advertised({ ...snapshot, signals }) } : snapshot;
}

// The same object is the same JSON.
const sameJson = (a: unknown, b: unknown): boolean => a === b || JSON.stringify(a) === JSON.stringify(b);

/**
 * A reading that changes nothing a consumer shows (the states, the raw values, the links expected) is
 * no new snapshot: an idle node's probe rounds rewrite no state file and send systemd no STATUS.
 */
function sameSignals(a: GpuSignals | undefined, b: GpuSignals): boolean {
  return (
    a !== undefined &&
    sameJson(a.states, b.states) &&
    sameJson(a.reading?.values, b.reading?.values) &&
    sameJson(a.memory.expectedLinks, b.memory.expectedLinks)
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
