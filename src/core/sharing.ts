// Time-slicing and MPS: a GPU advertised as several devices (replicas) so that several containers
// share it, in NVIDIA's format: replica IDs `<id>::<n>`, n from 0 to replicas-1,
// under the resource named by the config (renamed to `<resource>.shared` with renameByDefault). GPUs
// a sharing resource does not select stay whole under nvidia.com/gpu. MPS replicas are planned
// exactly as time-slicing ones and marked `mps` (their containers reach the resource's MPS control
// daemon, core/mps.ts); the two exclude each other. Pure: plain data in, plain data out.
import { MAX_DEVICE_ID_LENGTH, gpuDeviceId } from './devices.ts';
import type { AdvertisedDevice, DeviceIdStrategy, Gpu } from './devices.ts';

/** The resource whole GPUs are advertised as. */
export const GPU_RESOURCE = 'nvidia.com/gpu';
/** Vendor domain every resource of this plugin lives in (as in NVIDIA's plugin). */
export const RESOURCE_DOMAIN = 'nvidia.com';
/** Appended to a shared resource's name with renameByDefault. */
export const SHARED_SUFFIX = '.shared';
/** Between a GPU's ID and the replica number in a replica ID. */
export const REPLICA_SEPARATOR = '::';
/** Most replicas per GPU accepted: beyond this the device list stops being useful to the kubelet. */
export const MAX_REPLICAS = 1024;
/** Longest fully qualified resource name NVIDIA's plugin accepts. */
export const MAX_RESOURCE_NAME_LENGTH = 63;

/** Which GPUs a time-slicing resource replicates: all, the first N by index, or a list. */
export type DeviceSelection =
  | { readonly kind: 'all' }
  | { readonly kind: 'count'; readonly count: number }
  | { readonly kind: 'list'; readonly refs: readonly GpuRef[] };

/** A GPU named in a config file: by NVML index or by UUID. */
export type GpuRef = { readonly index: number } | { readonly uuid: string };

export interface TimeSlicedResource {
  /** The resource replicated (fully qualified; only nvidia.com/gpu exists without MIG). */
  readonly name: string;
  /** Name the replicas are advertised under (fully qualified), or null for `name`. */
  readonly rename: string | null;
  readonly replicas: number;
  readonly devices: DeviceSelection;
}

export interface TimeSlicing {
  readonly renameByDefault: boolean;
  readonly failRequestsGreaterThanOne: boolean;
  readonly resources: readonly TimeSlicedResource[];
}

export interface Sharing {
  readonly timeSlicing: TimeSlicing | null;
  /**
   * MPS: the same shape as time-slicing, its replicas served by one MPS control daemon per
   * resource (core/mps.ts). Absent or null: no MPS. Excludes time-slicing.
   */
  readonly mps?: TimeSlicing | null;
}

export const NO_SHARING: Sharing = { timeSlicing: null };

/** How GPUs are shared (NVIDIA's `nvidia.com/gpu.sharing-strategy` values). */
export type SharingStrategy = 'none' | 'time-slicing' | 'mps';

/**
 * The sharing section in force and the config key it sits under: MPS when configured, else
 * time-slicing, else null. Both at once is refused when the file is read (and by planResources).
 */
export function activeSharing(
  sharing: Sharing,
): { readonly strategy: 'time-slicing' | 'mps'; readonly key: string; readonly config: TimeSlicing } | null {
  if (sharing.mps !== undefined && sharing.mps !== null)
    return { strategy: 'mps', key: 'sharing.mps', config: sharing.mps };
  if (sharing.timeSlicing !== null)
    return { strategy: 'time-slicing', key: 'sharing.timeSlicing', config: sharing.timeSlicing };
  return null;
}

export type SharedAllocationPolicy = 'distributed' | 'packed';
export const SHARED_ALLOCATION_POLICIES: readonly SharedAllocationPolicy[] = ['distributed', 'packed'];

/** A problem with the sharing config that only shows against the node's GPUs; names the key path. */
export class SharingError extends Error {
  override name = 'SharingError';
  readonly path: string;
  constructor(path: string, message: string) {
    super(`${path}: ${message}`);
    this.path = path;
  }
}

export function replicaId(base: string, replica: number): string {
  return `${base}${REPLICA_SEPARATOR}${replica}`;
}

/** Splits `<id>::<n>`; null when the ID is not a replica ID (no separator, or n not a plain number). */
export function parseReplicaId(id: string): { base: string; replica: number } | null {
  const at = id.lastIndexOf(REPLICA_SEPARATOR);
  if (at <= 0) return null;
  const n = id.slice(at + REPLICA_SEPARATOR.length);
  if (!/^(0|[1-9][0-9]{0,8})$/.test(n)) return null;
  return { base: id.slice(0, at), replica: Number(n) };
}

/**
 * A resource name as NVIDIA's config accepts it: `gpu` or `nvidia.com/gpu` (the domain is added when
 * missing). Returns the fully qualified name, or a reason it is not one.
 */
export function qualifyResourceName(raw: string): { name: string } | { problem: string } {
  const full = raw.startsWith(`${RESOURCE_DOMAIN}/`) ? raw : `${RESOURCE_DOMAIN}/${raw}`;
  const local = full.slice(RESOURCE_DOMAIN.length + 1);
  if (full.length > MAX_RESOURCE_NAME_LENGTH)
    return {
      problem: `${JSON.stringify(full)} is ${full.length} characters; at most ${MAX_RESOURCE_NAME_LENGTH} are allowed`,
    };
  if (!/^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$/.test(local)) {
    return {
      problem:
        `${JSON.stringify(raw)} is not a resource name; ` +
        `expected lower-case letters, digits, '-' and '.' after ${RESOURCE_DOMAIN}/ (e.g. gpu.shared)`,
    };
  }
  return { name: full };
}

/** Name the replicas of a time-sliced resource are advertised under. */
export function advertisedName(r: TimeSlicedResource, renameByDefault: boolean): string {
  if (r.rename !== null) return r.rename;
  return renameByDefault ? `${r.name}${SHARED_SUFFIX}` : r.name;
}

/** One resource to advertise: its own socket, registration and device list. */
export interface PlannedResource {
  readonly name: string;
  readonly devices: readonly AdvertisedDevice[];
  /** Some of its devices are replicas (time-slicing or MPS). */
  readonly shared: boolean;
  /** A container may hold at most one replica of this resource (failRequestsGreaterThanOne). */
  readonly failRequestsGreaterThanOne: boolean;
  /**
   * Its replicas are clients of the MPS control daemon for this resource (core/mps.ts); absent: not
   * MPS. Whole GPUs may sit beside them under nvidia.com/gpu (a `devices` selection that leaves some
   * out); only the replicas are MPS clients.
   */
  readonly mps?: true;
}

function checkId(id: string, gpu: Gpu): void {
  if (id.length === 0 || id.length > MAX_DEVICE_ID_LENGTH) {
    throw new Error(
      `GPU ${gpu.index} (bus ${gpu.busId}) has device ID ${JSON.stringify(id)} of ${id.length} characters; ` +
        `the kubelet accepts 1 to ${MAX_DEVICE_ID_LENGTH}`,
    );
  }
}

function select(sel: DeviceSelection, gpus: readonly Gpu[], path: string): number[] {
  switch (sel.kind) {
    case 'all':
      return gpus.map((_, i) => i);
    case 'count': {
      if (sel.count > gpus.length) {
        throw new SharingError(path, `${sel.count} GPUs asked for, but this node has ${gpus.length}`);
      }
      const byIndex = gpus.map((g, i) => ({ index: g.index, pos: i })).sort((a, b) => a.index - b.index);
      return byIndex
        .slice(0, sel.count)
        .map((x) => x.pos)
        .sort((a, b) => a - b);
    }
    case 'list': {
      const chosen: number[] = [];
      sel.refs.forEach((ref, k) => {
        const pos =
          'index' in ref ? gpus.findIndex((g) => g.index === ref.index) : gpus.findIndex((g) => g.uuid === ref.uuid);
        if (pos < 0) {
          const what = 'index' in ref ? `GPU ${ref.index}` : `GPU ${ref.uuid}`;
          const have = gpus.length === 0 ? 'none' : `indices ${gpus.map((g) => g.index).join(', ')}`;
          throw new SharingError(`${path}[${k}]`, `${what} is not on this node (its GPUs: ${have})`);
        }
        if (chosen.includes(pos)) throw new SharingError(`${path}[${k}]`, `GPU ${gpus[pos]?.index} is listed twice`);
        chosen.push(pos);
      });
      return chosen.sort((a, b) => a - b);
    }
  }
}

/** Narrows planResources for MIG (core/mig.ts): only some GPUs whole, some resources planned elsewhere. */
export interface PlanScope {
  /** GPU positions advertised whole (default: all); sharing selections drop the others. */
  readonly wholeGpus?: ReadonlySet<number>;
  /** Sharing entries for these resource names are left to the caller. */
  readonly skipResource?: (name: string) => boolean;
}

/** Checks a GPU's device ID (length, not advertised already) and records it in `seen`. */
function claimId(id: string, gpu: Gpu, seen: Set<string>): void {
  checkId(id, gpu);
  if (seen.has(id))
    throw new Error(`GPU ${gpu.index} (bus ${gpu.busId}) repeats device ID ${id}; every GPU needs its own`);
  seen.add(id);
}

/** GPU `pos` whole: advertised by UUID whatever the strategy; the runtime gets the strategy's name (devices.ts). */
function wholeDevice(
  gpus: readonly Gpu[],
  pos: number,
  strategy: DeviceIdStrategy,
  seen: Set<string>,
): AdvertisedDevice {
  const gpu = gpus[pos] as Gpu;
  claimId(gpu.uuid, gpu, seen);
  return { id: gpu.uuid, uuid: gpu.uuid, gpu: pos, runtimeName: gpuDeviceId(gpu, strategy) };
}

type ActiveSharing = NonNullable<ReturnType<typeof activeSharing>>;

/** The replicas of the sharing entries by advertised name, and which entry (its position) shares each GPU. */
interface Replicas {
  readonly byName: ReadonlyMap<string, AdvertisedDevice[]>;
  readonly sharedBy: ReadonlyMap<number, number>;
}

/** Replicates the GPUs each sharing entry selects (among those advertised whole); entries `skip` names are left out. */
function planReplicas(
  active: ActiveSharing,
  gpus: readonly Gpu[],
  strategy: DeviceIdStrategy,
  isWhole: (pos: number) => boolean,
  skip: ((name: string) => boolean) | undefined,
  seen: Set<string>,
): Replicas {
  const ts = active.config;
  const sharedBy = new Map<number, number>();
  const byName = new Map<string, AdvertisedDevice[]>();
  ts.resources.forEach((r, k) => {
    const path = `${active.key}.resources[${k}]`;
    if (skip?.(r.name) === true) return;
    if (r.name !== GPU_RESOURCE)
      throw new SharingError(
        `${path}.name`,
        `${JSON.stringify(r.name)} is not a resource of this plugin; expected ${GPU_RESOURCE}`,
      );
    const chosen = select(r.devices, gpus, `${path}.devices`).filter(isWhole);
    const target = advertisedName(r, ts.renameByDefault);
    const list = byName.get(target) ?? [];
    byName.set(target, list);
    for (const pos of chosen) {
      const earlier = sharedBy.get(pos);
      if (earlier !== undefined) {
        throw new SharingError(
          `${path}.devices`,
          `GPU ${gpus[pos]?.index} is already shared by ${active.key}.resources[${earlier}]; ` +
            `a GPU is shared by one entry`,
        );
      }
      sharedBy.set(pos, k);
      const gpu = gpus[pos] as Gpu;
      const runtimeName = gpuDeviceId(gpu, strategy);
      for (let n = 0; n < r.replicas; n++) {
        const id = replicaId(gpu.uuid, n);
        claimId(id, gpu, seen);
        list.push({ id, uuid: gpu.uuid, gpu: pos, runtimeName, replica: n });
      }
    }
  });
  return { byName, sharedBy };
}

/**
 * The shared plan's resources: nvidia.com/gpu (the GPUs not shared, and the replicas of entries that keep its name)
 * first when it has devices, then every renamed resource with devices; each resource's devices by GPU, then replica.
 */
function sharedResources(
  plain: readonly AdvertisedDevice[],
  byName: ReadonlyMap<string, readonly AdvertisedDevice[]>,
  active: ActiveSharing,
): PlannedResource[] {
  const failRequestsGreaterThanOne = active.config.failRequestsGreaterThanOne;
  const mps = active.strategy === 'mps' ? { mps: true as const } : {};
  const ordered = (ds: readonly AdvertisedDevice[]): AdvertisedDevice[] =>
    [...ds].sort((a, b) => a.gpu - b.gpu || (a.replica ?? -1) - (b.replica ?? -1));
  const out: PlannedResource[] = [];
  const gpuList = [...plain, ...(byName.get(GPU_RESOURCE) ?? [])];
  if (gpuList.length > 0) {
    const shared = gpuList.some((d) => d.replica !== undefined);
    out.push({
      name: GPU_RESOURCE,
      devices: ordered(gpuList),
      shared,
      failRequestsGreaterThanOne: shared && failRequestsGreaterThanOne,
      ...(shared ? mps : {}),
    });
  }
  for (const [name, ds] of byName) {
    if (name === GPU_RESOURCE || ds.length === 0) continue;
    out.push({ name, devices: ordered(ds), shared: true, failRequestsGreaterThanOne, ...mps });
  }
  return out;
}

/**
 * The resources to advertise for these GPUs: whole GPUs under nvidia.com/gpu, and the replicas of
 * each shared resource (time-slicing or MPS) under its (possibly renamed) name. nvidia.com/gpu comes
 * first when it has devices; a resource with no devices is not advertised. Throws SharingError naming
 * the config key for selections that do not fit the node.
 */
export function planResources(
  gpus: readonly Gpu[],
  strategy: DeviceIdStrategy,
  sharing: Sharing,
  scope: PlanScope = {},
): PlannedResource[] {
  if (sharing.timeSlicing !== null && sharing.mps !== undefined && sharing.mps !== null) {
    throw new SharingError(
      'sharing.mps',
      'MPS and time-slicing exclude each other; keep sharing.mps or sharing.timeSlicing, not both',
    );
  }
  const active = activeSharing(sharing);
  const isWhole = (pos: number): boolean => scope.wholeGpus?.has(pos) ?? true;
  const seen = new Set<string>();
  const positions = gpus.map((_, i) => i);
  if (active === null) {
    const devices = positions.filter(isWhole).map((i) => wholeDevice(gpus, i, strategy, seen));
    return [{ name: GPU_RESOURCE, devices, shared: false, failRequestsGreaterThanOne: false }];
  }
  const { byName, sharedBy } = planReplicas(active, gpus, strategy, isWhole, scope.skipResource, seen);
  const plain = positions
    .filter((pos) => !sharedBy.has(pos) && isWhole(pos))
    .map((pos) => wholeDevice(gpus, pos, strategy, seen));
  return sharedResources(plain, byName, active);
}

/** One line describing a plan, for the log: `nvidia.com/gpu.shared=32 (8 GPUs x 4)`. */
export function describePlan(plan: readonly PlannedResource[]): string {
  return plan
    .map((r) => {
      const gpus = new Set(r.devices.map((d) => d.gpu)).size;
      return r.shared
        ? `${r.name}=${r.devices.length} (${r.mps === true ? 'MPS ' : ''}replicas of ${gpus} GPUs)`
        : `${r.name}=${r.devices.length}`;
    })
    .join(', ');
}
