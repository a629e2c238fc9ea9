// Dynamic MIG, the pure part: a MIG-mode GPU described as NVIDIA's DRA driver describes it for
// partitionable devices (resource.k8s.io/v1 sharedCounters + consumesCounters), and the decision that
// prepare needs — which GPU-instance profile and placement a device name stands for, and whether it is free.
//
// SHAPE. Per GPU one counter set `gpu-<minor>-counter-set` with counters multiprocessors, copy-engines,
// decoders, encoders, jpeg-engines, ofa-engines (the most any profile has), memory (bytes, the largest
// profile's) and memory-slice-0 … memory-slice-<N-1> (value 1; N the end of the furthest placement).
// One device per profile and placement, `gpu-<minor>-mig-<profile>-<giProfileId>-<start>`, consuming its
// capacities and the memory slices start … start+size-1, with capacities multiprocessors, copyEngines,
// decoders, encoders, jpegEngines, ofaEngines and memory (counters are DNS labels, capacities C identifiers).
// Only placements whose memory slices no existing GPU instance occupies are offered. Counter sets go in
// slices of their own (a slice holds counter sets or devices, never both), at most 8 per slice.
import { bytesQuantity } from './quantity.ts';
import type { Counter, CounterSet, DeviceAttribute, DeviceCapacity, DeviceCounterConsumption } from './dra-wire.ts';

export type { Counter, CounterSet, DeviceCounterConsumption } from './dra-wire.ts';

export const MAX_COUNTER_SETS_PER_SLICE = 8;

/** A GPU-instance placement: the first memory slice it occupies and how many. */
export interface MigPlacement {
  readonly start: number;
  readonly size: number;
}

/** A GPU-instance profile as NVML reports it (profile info with a full compute instance), with its placements. */
export interface GiProfile {
  /** NVML's profile id (info.id: 19 for 1g.5gb on an A100), not the profile enum. */
  readonly id: number;
  /** NVIDIA's profile name: 1g.5gb, 1g.5gb+me. */
  readonly name: string;
  readonly multiprocessors: number;
  readonly copyEngines: number;
  readonly decoders: number;
  readonly encoders: number;
  readonly jpegEngines: number;
  readonly ofaEngines: number;
  readonly memoryMiB: number;
  readonly placements: readonly MigPlacement[];
}

/** A GPU instance that exists on the GPU (created by anyone), with the memory slices it holds. */
export interface ExistingGpuInstance {
  readonly giId: number;
  readonly profileId: number;
  readonly placement: MigPlacement;
}

/** What NVML says of one MIG-mode GPU for dynamic MIG: its profiles with placements, and its GPU instances. */
export interface PartitionableGpu {
  readonly profiles: readonly GiProfile[];
  readonly instances: readonly ExistingGpuInstance[];
}

export interface DynamicMigGpu {
  /** The GPU's device minor (nvmlDeviceGetMinorNumber). */
  readonly minor: number;
  readonly profiles: readonly GiProfile[];
  readonly instances: readonly ExistingGpuInstance[];
  /** Attributes each MIG device carries from its parent (parentUUID, productName, versions, PCI). */
  readonly parentAttributes: Readonly<Record<string, DeviceAttribute>>;
}

/** A partitionable MIG device as written in a ResourceSlice. */
export interface PartitionDevice {
  readonly name: string;
  readonly attributes: Readonly<Record<string, DeviceAttribute>>;
  readonly capacity: Readonly<Record<string, DeviceCapacity>>;
  readonly consumesCounters: readonly DeviceCounterConsumption[];
}

const ENGINES = [
  ['multiprocessors', 'multiprocessors', 'multiprocessors'],
  ['copyEngines', 'copy-engines', 'copyEngines'],
  ['decoders', 'decoders', 'decoders'],
  ['encoders', 'encoders', 'encoders'],
  ['jpegEngines', 'jpeg-engines', 'jpegEngines'],
  ['ofaEngines', 'ofa-engines', 'ofaEngines'],
] as const;

export function counterSetName(minor: number): string {
  return `gpu-${minor}-counter-set`;
}

/** A profile name as NVIDIA puts it in device names: lowercase, dots dropped, anything else not [a-z0-9-] a dash. */
export function canonicalProfile(name: string): string {
  return name
    .toLowerCase()
    .replace(/\./g, '')
    .replace(/[^a-z0-9-]/g, '-');
}

export function partitionDeviceName(minor: number, profile: Pick<GiProfile, 'name' | 'id'>, start: number): string {
  return `gpu-${minor}-mig-${canonicalProfile(profile.name)}-${profile.id}-${start}`;
}

function memoryBytes(p: GiProfile): number {
  return p.memoryMiB * 1024 * 1024;
}

/** The number of memory slices: the end of the furthest placement of any profile. */
export function memorySliceCount(profiles: readonly GiProfile[]): number {
  let n = 0;
  for (const p of profiles) for (const pl of p.placements) n = Math.max(n, pl.start + pl.size);
  return n;
}

/** The GPU's counter set: each engine count and the memory the most any profile has, and every memory slice. */
export function gpuCounterSet(gpu: Pick<DynamicMigGpu, 'minor' | 'profiles'>): CounterSet {
  const counters: Record<string, Counter> = {};
  for (const [field, counter] of ENGINES) {
    counters[counter] = { value: String(Math.max(0, ...gpu.profiles.map((p) => p[field]))) };
  }
  counters.memory = { value: bytesQuantity(Math.max(0, ...gpu.profiles.map(memoryBytes))) };
  for (let i = 0; i < memorySliceCount(gpu.profiles); i++) counters[`memory-slice-${i}`] = { value: '1' };
  return { name: counterSetName(gpu.minor), counters };
}

function overlaps(a: MigPlacement, b: MigPlacement): boolean {
  return a.start < b.start + b.size && b.start < a.start + a.size;
}

/** Whether no existing GPU instance holds any memory slice of the placement. */
export function placementFree(instances: readonly ExistingGpuInstance[], placement: MigPlacement): boolean {
  return !instances.some((i) => overlaps(i.placement, placement));
}

function partitionDevice(gpu: DynamicMigGpu, p: GiProfile, pl: MigPlacement): PartitionDevice {
  const capacity: Record<string, DeviceCapacity> = {};
  const counters: Record<string, Counter> = {};
  for (const [field, counter, cap] of ENGINES) {
    capacity[cap] = { value: String(p[field]) };
    counters[counter] = { value: String(p[field]) };
  }
  capacity.memory = { value: bytesQuantity(memoryBytes(p)) };
  counters.memory = { value: bytesQuantity(memoryBytes(p)) };
  for (let i = pl.start; i < pl.start + pl.size; i++) counters[`memory-slice-${i}`] = { value: '1' };
  return {
    name: partitionDeviceName(gpu.minor, p, pl.start),
    attributes: { ...gpu.parentAttributes, type: { string: 'mig' }, profile: { string: p.name } },
    capacity,
    consumesCounters: [{ counterSet: counterSetName(gpu.minor), counters }],
  };
}

/**
 * The partition a GPU instance stands for (its profile's name and id, its placement's start), or null when the
 * GPU has no such profile.
 */
export function instancePartitionName(
  gpu: Pick<DynamicMigGpu, 'minor' | 'profiles'>,
  i: ExistingGpuInstance,
): string | null {
  const profile = gpu.profiles.find((p) => p.id === i.profileId);
  return profile === undefined ? null : partitionDeviceName(gpu.minor, profile, i.placement.start);
}

/**
 * The GPU's instances that are not the package's: those that stand for no claimed partition. Only these keep
 * placements from being offered; a claimed partition stays published as the partition it was allocated as, and
 * the scheduler's counters keep its memory slices from being allocated twice.
 */
export function foreignInstances(
  gpu: Pick<DynamicMigGpu, 'minor' | 'profiles' | 'instances'>,
  claimed: ReadonlySet<string>,
): ExistingGpuInstance[] {
  return gpu.instances.filter((i) => {
    const name = instancePartitionName(gpu, i);
    return name === null || !claimed.has(name);
  });
}

/** Every profile and placement of the GPU that fits beside its existing instances, in profile then start order. */
export function freePartitions(
  gpu: Pick<DynamicMigGpu, 'minor' | 'profiles' | 'instances'>,
): { readonly name: string; readonly profile: GiProfile; readonly placement: MigPlacement }[] {
  const out: { name: string; profile: GiProfile; placement: MigPlacement }[] = [];
  for (const p of gpu.profiles) {
    const starts = [...p.placements].sort((a, b) => a.start - b.start);
    for (const pl of starts)
      if (placementFree(gpu.instances, pl))
        out.push({ name: partitionDeviceName(gpu.minor, p, pl.start), profile: p, placement: pl });
  }
  return out;
}

/** The partition devices of freePartitions, as written in a slice. */
export function partitionDevices(gpu: DynamicMigGpu): PartitionDevice[] {
  return freePartitions(gpu).map((f) => partitionDevice(gpu, f.profile, f.placement));
}

/** Counter sets cut into slices of their own, at most 8 per slice, in order. */
export function counterSetSlices(sets: readonly CounterSet[]): CounterSet[][] {
  const out: CounterSet[][] = [];
  for (let i = 0; i < sets.length; i += MAX_COUNTER_SETS_PER_SLICE) {
    out.push(sets.slice(i, i + MAX_COUNTER_SETS_PER_SLICE));
  }
  return out;
}

/** The parts of a partitionable device's name. */
export interface PartitionName {
  readonly minor: number;
  readonly profile: string;
  readonly giProfileId: number;
  readonly start: number;
}

const NAME = /^gpu-(\d+)-mig-(.+)-(\d+)-(\d+)$/;

/** The parts of `gpu-<minor>-mig-<profile>-<giProfileId>-<start>`; null for any other name. */
export function parsePartitionName(name: string): PartitionName | null {
  const m = NAME.exec(name);
  if (m === null) return null;
  return { minor: Number(m[1]), profile: m[2] ?? '', giProfileId: Number(m[3]), start: Number(m[4]) };
}

export type PlacementDecision =
  | { readonly ok: true; readonly profile: GiProfile; readonly placement: MigPlacement }
  | { readonly ok: false; readonly reason: string };

/**
 * Which GPU-instance profile and placement a device name stands for on this GPU, and whether it is free now:
 * a refusal says what was wrong (not a partition name, another GPU, no such profile or placement, or the
 * memory slices an existing instance holds).
 */
export function resolvePartition(gpu: DynamicMigGpu, deviceName: string): PlacementDecision {
  const n = parsePartitionName(deviceName);
  if (n === null) {
    return { ok: false, reason: `${deviceName}: not a MIG partition name (gpu-<minor>-mig-<profile>-<id>-<start>)` };
  }
  if (n.minor !== gpu.minor) return { ok: false, reason: `${deviceName}: names GPU ${n.minor}, not GPU ${gpu.minor}` };
  const profile = gpu.profiles.find((p) => p.id === n.giProfileId && canonicalProfile(p.name) === n.profile);
  if (profile === undefined) {
    const known = gpu.profiles.map((p) => `${canonicalProfile(p.name)}-${p.id}`).join(', ');
    return {
      ok: false,
      reason: `${deviceName}: GPU ${gpu.minor} has no profile ${n.profile}-${n.giProfileId} (has ${known})`,
    };
  }
  const placement = profile.placements.find((pl) => pl.start === n.start);
  if (placement === undefined) {
    const starts = profile.placements.map((pl) => pl.start).join(', ');
    return { ok: false, reason: `${deviceName}: ${profile.name} cannot start at slice ${n.start} (starts: ${starts})` };
  }
  const holder = gpu.instances.find((i) => overlaps(i.placement, placement));
  if (holder !== undefined) {
    const end = holder.placement.start + holder.placement.size - 1;
    return {
      ok: false,
      reason:
        `${deviceName}: memory slices ${placement.start}-${placement.start + placement.size - 1} of GPU ` +
        `${gpu.minor} overlap GPU instance ${holder.giId} (slices ${holder.placement.start}-${end})`,
    };
  }
  return { ok: true, profile, placement };
}
