// MIG (Multi-Instance GPU), the pure part: the MIG device model, NVIDIA's profile names and resource names, the
// name a MIG device has for the container runtime, and the device nodes a MIG device needs. The strategies
// none/single/mixed are in mig-strategies.ts, which health units an event concerns in mig-events.ts. Plain data in,
// plain data out.
import type { PartitionableGpu } from './dynamic-mig.ts';
import type { DeviceIdStrategy, Gpu } from './devices.ts';
import { RESOURCE_DOMAIN } from './sharing.ts';

export type MigStrategy = 'none' | 'single' | 'mixed';
export const MIG_STRATEGIES: readonly MigStrategy[] = ['none', 'single', 'mixed'];

/** MIG mode of a MIG-capable GPU: what is active now, and what a GPU reset would make active. */
export interface MigMode {
  readonly current: boolean;
  readonly pending: boolean;
}

/** One MIG device (a compute instance inside a GPU instance) as discovered. */
export interface MigDevice {
  /** Position in the GPU list of its parent GPU. */
  readonly parent: number;
  /** Its index under the parent (nvmlDeviceGetMigDeviceHandleByIndex): the j of `<gpu>:<j>`. */
  readonly index: number;
  readonly uuid: string;
  /** GPU-instance and compute-instance ids (what XID events name). */
  readonly gi: number;
  readonly ci: number;
  /**
   * The GPU instance's profile id (19 for 1g.10gb on an A100-80GB, as nvidia-smi mig -lgi shows it)
   * and the first memory slice of its placement, from nvmlGpuInstanceGetInfo: what NVIDIA's DRA
   * device names are made of (core/dra-devices.ts). Absent when the driver cannot say.
   */
  readonly giProfileId?: number;
  readonly placementStart?: number;
  /** How many memory slices the placement spans (8 per GPU on A100 and H100): what the instance occupies. */
  readonly placementSize?: number;
  /** NVIDIA's profile name: 1g.10gb, 1c.2g.20gb, 1g.10gb+me … */
  readonly profile: string;
  readonly giSlices: number;
  readonly ciSlices: number;
  readonly memoryBytes: number;
  /** Streaming multiprocessors, and the engines it shares (nvmlDeviceAttributes_t; GFD labels them). */
  readonly multiprocessors: number;
  readonly engines: MigEngines;
}

/** The engines a MIG device has of its parent, as nvmlDeviceAttributes_t counts them. */
export interface MigEngines {
  readonly copy: number;
  readonly decoder: number;
  readonly encoder: number;
  readonly jpeg: number;
  readonly ofa: number;
}

/** The MIG facts of a node: per GPU position its mode (null: not MIG-capable), and every MIG device. */
export interface MigLayout {
  readonly modes: readonly (MigMode | null)[];
  /**
   * Dynamic MIG: each MIG-mode GPU's profiles with their placements and its GPU instances, by GPU UUID, where the
   * driver has the placement call (nvml/mig-instances.ts); absent otherwise.
   */
  readonly partitionable?: ReadonlyMap<string, PartitionableGpu>;
  readonly devices: readonly MigDevice[];
}

export const NO_MIG: MigLayout = { modes: [], devices: [] };

const MiB = 1024 * 1024;
const GiB = 1024 * MiB;

/**
 * The GB of a MIG profile name, computed as NVIDIA's go-nvlib does (same IEEE double operations):
 * the instance's share of the parent's memory rounded up to eighths, times the parent's memory in
 * GiB rounded up, then rounded to the nearest integer.
 */
export function migMemoryGb(parentMemoryBytes: number, instanceMemoryMiB: number): number {
  const fraction = (instanceMemoryMiB * MiB) / parentMemoryBytes;
  const eighths = Math.ceil(fraction * 8) / 8;
  const totalGb = Math.floor((parentMemoryBytes + GiB - 1) / GiB);
  return Math.round(eighths * totalGb);
}

/** Attribute suffix of a GPU-instance profile, by NVML profile index (NVML_GPU_INSTANCE_PROFILE_*). */
export function profileAttributes(profileIndex: number | null): string {
  switch (profileIndex) {
    case 7: // 1_SLICE_REV1
    case 8: // 2_SLICE_REV1
      return '+me';
    case 10:
    case 11:
    case 12: // *_GFX
      return '+gfx';
    case 13:
    case 14: // *_NO_ME
      return '-me';
    case 15:
    case 16: // *_ALL_ME
      return '+me.all';
    default:
      return '';
  }
}

/** NVIDIA's name of a MIG profile: `<G>g.<GB>gb`, `<C>c.` in front for a smaller compute instance, then attributes. */
export function migProfileName(p: {
  giSlices: number;
  ciSlices: number;
  memoryMiB: number;
  parentMemoryBytes: number;
  profileIndex: number | null;
}): string {
  const gb = migMemoryGb(p.parentMemoryBytes, p.memoryMiB);
  const base = `${p.giSlices}g.${gb}gb${profileAttributes(p.profileIndex)}`;
  return p.ciSlices === p.giSlices ? base : `${p.ciSlices}c.${base}`;
}

/** A full compute instance: the compute instance has every slice of its GPU instance. */
export function isFullInstance(d: Pick<MigDevice, 'giSlices' | 'ciSlices'>): boolean {
  return d.ciSlices === d.giSlices;
}

/** `nvidia.com/mig-<profile>` with `+` replaced by `.` (nvidia.com/mig-1g.10gb.me). */
export function migResourceName(profile: string): string {
  return `${RESOURCE_DOMAIN}/mig-${profile.replace(/\+/g, '.')}`;
}

/** Whether a resource name is a MIG resource of the mixed strategy. */
export function isMigResource(name: string): boolean {
  return name.startsWith(`${RESOURCE_DOMAIN}/mig-`);
}

/**
 * The name the container runtime gets for a MIG device: its UUID, or
 * `<parent index>:<MIG index>` (the kubelet always gets the UUID).
 */
export function migDeviceId(d: MigDevice, gpus: readonly Gpu[], strategy: DeviceIdStrategy): string {
  if (strategy === 'uuid') return d.uuid;
  const parent = gpus[d.parent];
  if (parent === undefined)
    throw new Error(`MIG device ${d.uuid} refers to GPU position ${d.parent}, which does not exist`);
  return `${parent.index}:${d.index}`;
}

// Device nodes: /proc/driver/nvidia-caps/mig-minors → the capability nodes of a MIG device.

export const MIG_MINORS_FILE = '/driver/nvidia-caps/mig-minors';
export const MIG_CAPS_DIR = '/dev/nvidia-caps';

/** Parses mig-minors (`gpu0/gi1/access 12`, `gpu0/gi1/ci0/access 13`, `config 1` …) into name → minor. */
export function parseMigMinors(text: string): Map<string, number> {
  const out = new Map<string, number>();
  for (const line of text.split('\n')) {
    const m = /^\s*(\S+)\s+(\d+)\s*$/.exec(line);
    if (m !== null) out.set(m[1] as string, Number(m[2]));
  }
  return out;
}

/**
 * Container paths of the two capability nodes of each MIG device (GI access, then CI access), by
 * MIG UUID, from mig-minors and the parents' minor numbers. Throws naming the first device
 * whose entries are missing.
 */
export function migCapabilityNodes(
  gpus: readonly Gpu[],
  devices: readonly MigDevice[],
  minors: ReadonlyMap<string, number>,
): Map<string, readonly string[]> {
  const out = new Map<string, readonly string[]>();
  devices.forEach((d) => {
    const parent = gpus[d.parent];
    if (parent === undefined) return;
    const giKey = `gpu${parent.minor}/gi${d.gi}/access`;
    const ciKey = `gpu${parent.minor}/gi${d.gi}/ci${d.ci}/access`;
    const gi = minors.get(giKey);
    const ci = minors.get(ciKey);
    if (gi === undefined || ci === undefined) {
      throw new Error(
        `mig-minors has no ${gi === undefined ? giKey : ciKey} for MIG device ${d.uuid} ` +
          `(GPU ${parent.index}, GI ${d.gi}, CI ${d.ci})`,
      );
    }
    out.set(d.uuid, [`${MIG_CAPS_DIR}/nvidia-cap${gi}`, `${MIG_CAPS_DIR}/nvidia-cap${ci}`]);
  });
  return out;
}
