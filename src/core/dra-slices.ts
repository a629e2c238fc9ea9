// DRA ResourceSlices of a node, the pure part: the devices of dra-devices.ts described as NVIDIA's
// DRA driver describes them, with the standard cross-driver attributes, what only we
// know (the NVLink domain), health as device taints (KEP-5055), cut into slices of one pool that the
// API server's validation accepts. The slice publisher (dra/slice-publisher.ts) writes them.
//
// ATTRIBUTES (bare names are the driver's domain, gpu.nvidia.com/<name> in CEL and constraints):
// * whole GPU: type "gpu", uuid, productName; versions cudaComputeCapability, driverVersion,
//   cudaDriverVersion (semver: 8.0 → 8.0.0, 535.104.05 → 535.104.5, CUDA 12040 → 12.4.0); capacity
//   memory (bytes, in binary units: 80Gi). brand and architecture, which NVIDIA's driver also gives, are left out: the
//   snapshot does not know them, and a value guessed from the name or the compute capability could
//   be wrong.
// * MIG device: type "mig", uuid (the MIG UUID), parentUUID, profile (1g.10gb), the parent's
//   productName and versions; capacities multiprocessors, copyEngines, decoders, encoders,
//   jpegEngines, ofaEngines, memory (binary units, 80Gi, as NVIDIA's driver and the
//   API server write it), and memorySlice<i> (value 1) for each memory slice its GPU
//   instance occupies (placement start .. start + slices - 1), so that the scheduler can see which
//   devices overlap.
// * standard (k8s.io/dynamic-resource-allocation/deviceattribute): resource.kubernetes.io/pciBusID
//   (`0000:07:00.0`, the parent's for a MIG device), resource.kubernetes.io/pcieRoot (`pci0000:00`)
//   when the caller read it (it lives in sysfs, not in the snapshot), resource.kubernetes.io/numaNode
//   when the snapshot knows it (omitted otherwise, never a made-up -1).
// * nvlinkDomain (int, whole GPUs only): GPUs that share a value can all talk to each other over
//   NVLink — every pair directly linked or on one NVSwitch fabric (core/nvlink-domains.ts has the rule:
//   the largest such groups first, numbered by their smallest minor number). A GPU in no such group
//   (no NVLinks, or left over) has no domain, so a claim with `matchAttribute: gpu.nvidia.com/nvlinkDomain`
//   only ever gets GPUs that can talk over NVLink. MIG devices have none (no GPU-to-GPU peer access).
//
// TAINTS. A device advertised Unhealthy gets one taint, effect NoSchedule (new claims avoid it;
// pods already using it are not evicted, as with the device-plugin API):
// * gpu.nvidia.com/gpu-lost — the GPU fell off the bus (NVML GPU_IS_LOST);
// * gpu.nvidia.com/xid = <XID> — the critical XID that made it unhealthy;
// * gpu.nvidia.com/unhealthy = driver-not-answering | double-bit-ecc | other — anything else.
// * gpu.nvidia.com/mps-daemon = not-answering — the MPS control daemon of a DRA claim using the device was asked
//   and does not answer (the claim's containers lost their MPS server); it goes when the daemon answers again.
// While the driver does not answer, devices keep the driver version last seen (PoolSettings), so a
// driver reload changes only the taints. When the device is healthy again (recovery, a driver
// back), the taint goes with the next publish —
// NVIDIA's driver keeps its taints until it restarts. The API server fills timeAdded; we never send it.
// Each bad health signal of the GPU (health-signals.ts) adds its own taint to the GPU and every MIG
// device on it: gpu.nvidia.com/recovery-action = GPU_RESET, …/row-remap = pending | failed, …, effect
// NoSchedule for a critical signal and None for a warning (shown, never keeping a claim away); it goes
// when the signal clears.
//
// CONSUMABLE CAPACITY (off unless the settings carry a policy, core/dra-capacity.ts): every whole GPU is
// published with `allowMultipleAllocations: true` and its memory capacity carrying the policy as its
// `requestPolicy`, so that several claims may each take a share of one GPU (the allocation's shareID and
// consumedCapacity). A GPU too small for the policy (one that came after the settings were put in force) is
// published as without it, with a note. MIG devices are never shared this way.
//
// SLICES. One pool named after the node; devices in order, at most 64 per slice (the limit when any
// device has taints; always 64, so that a taint appearing never changes how devices are cut); at
// most 32 attributes and capacities per device (the most we write is 26). resourceSliceCount is
// the number of slices; the pool generation is the publisher's.
import { normalizeBusId } from './topology/index.ts';
import { draDevices, migDevicesByName, withoutClaimedInstances } from './dra-devices.ts';
import { nvlinkDomains } from './nvlink-domains.ts';
import { bytesQuantity } from './quantity.ts';
import { policyFitProblem, wireRequestPolicy } from './dra-capacity.ts';
import type { ConsumableCapacity } from './dra-capacity.ts';
import type { DraDevice } from './dra-devices.ts';
import { partitionPool } from './dra-partitions.ts';
import type { CounterSet, PartitionableGpu } from './dynamic-mig.ts';
import type { DeviceAttribute, DeviceTaint, SliceDevice } from './dra-wire.ts';

export type { DeviceAttribute, DeviceCapacity, DeviceTaint, SliceDevice } from './dra-wire.ts';
import type { Gpu } from './devices.ts';
import type { MigDevice, MigStrategy } from './mig.ts';
import { signalTaints } from './health-signals.ts';
import { liveNvlinks } from './snapshot-signals.ts';
import { unitsOfSilentClaimDaemons } from './snapshot.ts';
import type { NodeSnapshot } from './snapshot.ts';

export { nvlinkDomains } from './nvlink-domains.ts';

export const DEFAULT_DRA_DRIVER = 'gpu.nvidia.com';
export const STANDARD_DOMAIN = 'resource.kubernetes.io';
export const MAX_DEVICES_PER_SLICE = 64;
export const MAX_ATTRIBUTES_AND_CAPACITIES = 32;
export const MAX_STRING_VALUE = 64;

export interface PoolContent {
  /** The pool's name: the node's. */
  readonly pool: string;
  /** The devices of each slice, in order. */
  readonly slices: readonly (readonly SliceDevice[])[];
  /** Dynamic MIG's counter sets, in slices of their own written before the device slices; absent: none. */
  readonly counterSets?: readonly (readonly CounterSet[])[];
  /** Devices left out, attributes not given, and why; one line each. */
  readonly notes: readonly string[];
}

export interface PoolSettings {
  readonly nodeName: string;
  readonly migStrategy: MigStrategy;
  /** The PCIe root (`pci<domain>:<bus>`) of a GPU by its PCI bus id as NVML gives it, when known. */
  readonly pcieRoots?: ReadonlyMap<string, string>;
  /**
   * The driver version last seen, for while the driver does not answer: the devices keep their
   * driverVersion attribute (they are tainted instead), so a driver reload is no churn of attributes.
   */
  readonly lastDriverVersion?: string;
  /** Whole GPUs' consumable capacity; absent: each GPU goes to one allocation at a time. */
  readonly consumableCapacity?: ConsumableCapacity;
  /** Dynamic MIG: MIG-mode GPUs by UUID with their profiles and placements; absent: off. */
  readonly partitionable?: ReadonlyMap<string, PartitionableGpu>;
}

/** A version as strict semver 2.0.0: numeric parts without leading zeros, padded to three. Null when not numeric. */
export function semverOf(v: string): string | null {
  const m = /^v?(\d+)(?:\.(\d+))?(?:\.(\d+))?$/.exec(v.trim());
  if (m === null) return null;
  return [m[1], m[2] ?? '0', m[3] ?? '0'].map((p) => String(Number(p))).join('.');
}

/** NVML's CUDA driver version (12040) as semver (12.4.0). */
export function cudaVersionOf(v: number): string {
  return `${Math.floor(v / 1000)}.${Math.floor((v % 1000) / 10)}.0`;
}

/** The standard pciBusID form: 4-digit domain, lower case (`0000:07:00.0`). */
export function standardBusId(busId: string): string {
  const n = normalizeBusId(busId);
  const m = /^([0-9a-f]{8}):(.*)$/.exec(n);
  if (m === null) return n;
  const domain = (m[1] ?? '').replace(/^0{4}/, '');
  return `${domain}:${m[2] ?? ''}`;
}

type Attrs = Record<string, DeviceAttribute>;

function str(value: string): DeviceAttribute {
  return { string: value.length > MAX_STRING_VALUE ? value.slice(0, MAX_STRING_VALUE) : value };
}

/** What a whole GPU and its MIG devices share. */
function commonAttributes(s: NodeSnapshot, gpu: Gpu, settings: PoolSettings): Attrs {
  const a: Attrs = { productName: str(gpu.name) };
  const cc = s.facts?.gpus.get(gpu.uuid)?.compute;
  if (cc !== undefined && cc !== null) a.cudaComputeCapability = { version: `${cc.major}.${cc.minor}.0` };
  const version = s.driverVersion ?? settings.lastDriverVersion ?? null;
  const driver = version === null ? null : semverOf(version);
  if (driver !== null) a.driverVersion = { version: driver };
  const cuda = s.facts?.cudaDriverVersion;
  if (cuda !== undefined && cuda !== null && cuda > 0) a.cudaDriverVersion = { version: cudaVersionOf(cuda) };
  a[`${STANDARD_DOMAIN}/pciBusID`] = str(standardBusId(gpu.busId));
  const root = settings.pcieRoots?.get(gpu.busId);
  if (root !== undefined) a[`${STANDARD_DOMAIN}/pcieRoot`] = str(root);
  if (gpu.numaNode !== null && gpu.numaNode >= 0) a[`${STANDARD_DOMAIN}/numaNode`] = { int: gpu.numaNode };
  return a;
}

/**
 * The taints of a unit (GPU UUID or MIG UUID; `gpu`: its GPU's UUID): one for its own health when it
 * is Unhealthy, then one per bad health signal of its GPU.
 */
export function taintsOf(s: NodeSnapshot, unit: string, domain: string, gpu: string = unit): DeviceTaint[] {
  const mps: DeviceTaint[] = unitsOfSilentClaimDaemons(s).has(unit)
    ? [{ key: `${domain}/mps-daemon`, value: 'not-answering', effect: 'NoSchedule' }]
    : [];
  return [...healthTaints(s, unit, domain), ...mps, ...signalTaints(s.signals.get(gpu), domain)];
}

function healthTaints(s: NodeSnapshot, unit: string, domain: string): DeviceTaint[] {
  if (s.health.get(unit) !== 'Unhealthy') return [];
  if (s.driverVersion === null)
    return [{ key: `${domain}/unhealthy`, value: 'driver-not-answering', effect: 'NoSchedule' }];
  const h = (s.migHealth.get(unit) ?? s.gpuHealth.get(unit))?.state;
  // Unhealthy by its signals only: their taints say why.
  if (h?.health === 'Healthy') return [];
  if (h?.lost === true) return [{ key: `${domain}/gpu-lost`, effect: 'NoSchedule' }];
  if (h !== undefined && h.lastXid !== null)
    return [{ key: `${domain}/xid`, value: String(h.lastXid), effect: 'NoSchedule' }];
  if (h?.permanent === true) return [{ key: `${domain}/unhealthy`, value: 'double-bit-ecc', effect: 'NoSchedule' }];
  return [{ key: `${domain}/unhealthy`, value: 'other', effect: 'NoSchedule' }];
}

/** A whole GPU's memory capacity, shared by several allocations when the settings have a policy that fits it. */
function wholeGpuMemory(
  gpu: Gpu,
  name: string,
  settings: PoolSettings,
  notes: string[],
): Pick<SliceDevice, 'capacity' | 'allowMultipleAllocations'> {
  const value = bytesQuantity(gpu.memoryBytes);
  const policy = settings.consumableCapacity?.memory;
  if (policy === undefined) return { capacity: { memory: { value } } };
  const problem = policyFitProblem(policy, gpu.memoryBytes);
  if (problem !== null) {
    notes.push(
      `device ${name} is published for one allocation at a time: the consumable capacity's memory ` +
        `${problem.field} does not fit it (${problem.message})`,
    );
    return { capacity: { memory: { value } } };
  }
  return { allowMultipleAllocations: true, capacity: { memory: { value, requestPolicy: wireRequestPolicy(policy) } } };
}

function describe(
  s: NodeSnapshot,
  d: DraDevice,
  domains: readonly (number | null)[],
  settings: PoolSettings,
  driver: string,
  notes: string[],
): SliceDevice {
  const gpu = s.gpus[d.gpu] as Gpu;
  const common = commonAttributes(s, gpu, settings);
  const m = d.mig;
  if (m === undefined) {
    const attributes: Attrs = { type: str('gpu'), uuid: str(gpu.uuid), ...common };
    const domain = domains[d.gpu];
    if (domain !== null && domain !== undefined) attributes.nvlinkDomain = { int: domain };
    const taints = taintsOf(s, gpu.uuid, driver);
    return {
      name: d.name,
      attributes,
      ...wholeGpuMemory(gpu, d.name, settings, notes),
      ...(taints.length > 0 ? { taints } : {}),
    };
  }
  const attributes: Attrs = {
    type: str('mig'),
    uuid: str(m.uuid),
    parentUUID: str(gpu.uuid),
    profile: str(m.profile),
    ...common,
  };
  const capacity: Record<string, { value: string }> = {
    multiprocessors: { value: String(m.multiprocessors) },
    copyEngines: { value: String(m.engines.copy) },
    decoders: { value: String(m.engines.decoder) },
    encoders: { value: String(m.engines.encoder) },
    jpegEngines: { value: String(m.engines.jpeg) },
    ofaEngines: { value: String(m.engines.ofa) },
    memory: { value: bytesQuantity(m.memoryBytes) },
  };
  // The memory slices its placement spans (a 3g instance holds 4 of the 8). Without the driver's word on the
  // placement there are none: its compute slices (3 for a 3g) are not its memory slices.
  const start = m.placementStart;
  const size = m.placementSize;
  if (start !== undefined && size !== undefined)
    for (let i = start; i < start + size; i++) capacity[`memorySlice${i}`] = { value: '1' };
  const taints = taintsOf(s, m.uuid, driver, gpu.uuid);
  return { name: d.name, attributes, capacity, ...(taints.length > 0 ? { taints } : {}) };
}

/**
 * The node's pool: every DRA device described, cut into slices. A device with more attributes and
 * capacities than a device may have is left out with a note (it cannot happen with what we write,
 * but a slice the server refuses would take every other device with it).
 */
export function poolContent(s: NodeSnapshot, settings: PoolSettings, driver: string = DEFAULT_DRA_DRIVER): PoolContent {
  const list = withoutClaimedInstances(s, draDevices(s, settings.migStrategy), settings.partitionable);
  const notes = [...list.notes];
  const domains = nvlinkDomains({ gpus: s.gpus, nvlinks: liveNvlinks(s) });
  const devices: SliceDevice[] = [];
  for (const d of list.devices) {
    const dev = describe(s, d, domains, settings, driver, notes);
    const count = Object.keys(dev.attributes).length + Object.keys(dev.capacity).length;
    if (count > MAX_ATTRIBUTES_AND_CAPACITIES) {
      notes.push(
        `device ${d.name} is not published: ${count} attributes and capacities, ` +
          `more than the ${MAX_ATTRIBUTES_AND_CAPACITIES} a device may have`,
      );
      continue;
    }
    devices.push(dev);
  }
  // A claimed partition whose instance exists has that MIG device's health.
  const migByName = settings.partitionable === undefined ? new Map<string, MigDevice>() : migDevicesByName(s);
  const partitions =
    settings.partitionable === undefined
      ? null
      : partitionPool(
          s.gpus,
          (i) => s.mig?.modes[i]?.current === true,
          settings.partitionable,
          (gpu) => commonAttributes(s, gpu, settings),
          (gpu, device) => {
            const m = migByName.get(device);
            return m === undefined ? taintsOf(s, gpu.uuid, driver) : taintsOf(s, m.uuid, driver, gpu.uuid);
          },
          s.claimedPartitions,
        );
  for (const list of partitions?.devices.values() ?? []) devices.push(...list);
  const slices: SliceDevice[][] = [];
  for (let i = 0; i < devices.length; i += MAX_DEVICES_PER_SLICE)
    slices.push(devices.slice(i, i + MAX_DEVICES_PER_SLICE));
  // A node without devices still publishes one empty slice: the pool exists and says "nothing here".
  if (slices.length === 0) slices.push([]);
  const counterSets =
    partitions === null || partitions.counterSets.length === 0 ? {} : { counterSets: partitions.counterSets };
  return { pool: settings.nodeName, slices, notes, ...counterSets };
}
