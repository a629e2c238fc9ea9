// MIG (Multi-Instance GPU), the pure part: the MIG device model, NVIDIA's profile names, the
// strategies none/single/mixed with NVIDIA's validation (FACTS §4a), the resources they advertise
// (fed through the same time-slicing rules as whole GPUs), which devices a health event concerns,
// and the device nodes a MIG device needs. Plain data in, plain data out.
import { MAX_DEVICE_ID_LENGTH } from './devices.ts';
import type { AdvertisedDevice, DeviceIdStrategy, Gpu } from './devices.ts';
import { GPU_RESOURCE, RESOURCE_DOMAIN, SharingError, advertisedName, planResources, replicaId } from './sharing.ts';
import type { PlannedResource, Sharing } from './sharing.ts';

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

/** The name the container runtime gets for a MIG device: its UUID, or `<parent index>:<MIG index>` (the kubelet always gets the UUID). */
export function migDeviceId(d: MigDevice, gpus: readonly Gpu[], strategy: DeviceIdStrategy): string {
  if (strategy === 'uuid') return d.uuid;
  const parent = gpus[d.parent];
  if (parent === undefined)
    throw new Error(`MIG device ${d.uuid} refers to GPU position ${d.parent}, which does not exist`);
  return `${parent.index}:${d.index}`;
}

/** Start-stopping problem with the node for the chosen strategy; names the GPUs and what differs. */
export class MigStrategyError extends Error {
  override name = 'MigStrategyError';
}

export interface MigPlan {
  readonly resources: PlannedResource[];
  /** Things worth one log line each (skipped GPUs, sub-instances not advertised). */
  readonly notes: string[];
}

const enabled = (layout: MigLayout, pos: number): boolean => layout.modes[pos]?.current === true;

function gpuList(gpus: readonly Gpu[], positions: readonly number[]): string {
  return positions.map((p) => gpus[p]?.index ?? p).join(', ');
}

/**
 * Why a node is not valid for the single strategy, or null when it is (or has no MIG-enabled GPU,
 * in which case single acts like none). NVIDIA's rules: every GPU MIG-enabled, each with MIG
 * devices, all of one profile.
 */
export function singleStrategyProblem(gpus: readonly Gpu[], layout: MigLayout): string | null {
  const on = gpus.map((_, i) => i).filter((i) => enabled(layout, i));
  if (on.length === 0) return null;
  const problems: string[] = [];
  const off = gpus.map((_, i) => i).filter((i) => !enabled(layout, i));
  if (off.length > 0)
    problems.push(
      `GPU ${gpuList(gpus, off)} ${off.length === 1 ? 'has' : 'have'} MIG disabled while GPU ${gpuList(gpus, on)} ${on.length === 1 ? 'has' : 'have'} it enabled`,
    );
  const empty = on.filter((i) => !layout.devices.some((d) => d.parent === i));
  if (empty.length > 0)
    problems.push(`GPU ${gpuList(gpus, empty)} ${empty.length === 1 ? 'has' : 'have'} MIG enabled but no MIG devices`);
  const byProfile = new Map<string, Set<number>>();
  for (const d of layout.devices) {
    const set = byProfile.get(d.profile) ?? new Set<number>();
    set.add(d.parent);
    byProfile.set(d.profile, set);
  }
  if (byProfile.size > 1) {
    const parts = [...byProfile].map(
      ([p, g]) =>
        `${p} on GPU ${gpuList(
          gpus,
          [...g].sort((a, b) => a - b),
        )}`,
    );
    problems.push(`MIG devices differ in profile: ${parts.join('; ')}`);
  }
  if (problems.length === 0) return null;
  return `--mig-strategy=single needs every GPU in MIG mode with MIG devices of one profile: ${problems.join('; ')} (use --mig-strategy=mixed, or re-partition the GPUs alike)`;
}

function checkId(id: string, what: string): void {
  if (id.length === 0 || id.length > MAX_DEVICE_ID_LENGTH) {
    throw new Error(
      `${what} has device ID ${JSON.stringify(id)} of ${id.length} characters; the kubelet accepts 1 to ${MAX_DEVICE_ID_LENGTH}`,
    );
  }
}

/** The advertised devices of some MIG devices, with the replicas a time-slicing entry asks for. */
function migDevices(
  list: readonly { d: MigDevice; pos: number }[],
  gpus: readonly Gpu[],
  strategy: DeviceIdStrategy,
  replicas: number,
): AdvertisedDevice[] {
  const out: AdvertisedDevice[] = [];
  for (const { d } of list) {
    // Advertised by MIG UUID whatever the strategy; the runtime gets the strategy's name.
    const runtimeName = migDeviceId(d, gpus, strategy);
    const uuid = gpus[d.parent]?.uuid ?? '';
    if (replicas <= 1) {
      checkId(d.uuid, `MIG device ${d.uuid}`);
      out.push({ id: d.uuid, uuid, gpu: d.parent, runtimeName, mig: d.uuid });
      continue;
    }
    for (let n = 0; n < replicas; n++) {
      const id = replicaId(d.uuid, n);
      checkId(id, `MIG device ${d.uuid}`);
      out.push({ id, uuid, gpu: d.parent, runtimeName, replica: n, mig: d.uuid });
    }
  }
  return out;
}

/**
 * MIG devices under resource names, with the time-slicing entries that name those resources.
 * Entries for MIG resources replicate every device of the resource (`devices: all`); a selection
 * by count or list is refused naming the key. Entries for resources this node does not have change
 * nothing (a re-layout may bring them).
 */
function planMigGroups(
  groups: ReadonlyMap<string, { d: MigDevice; pos: number }[]>,
  gpus: readonly Gpu[],
  strategy: DeviceIdStrategy,
  sharing: Sharing,
  handled: (name: string) => boolean,
): PlannedResource[] {
  const ts = sharing.timeSlicing;
  const out = new Map<string, PlannedResource>();
  const sharedNames = new Set<string>();
  ts?.resources.forEach((r, k) => {
    if (!handled(r.name)) return;
    const path = `sharing.timeSlicing.resources[${k}]`;
    if (r.devices.kind !== 'all')
      throw new SharingError(
        `${path}.devices`,
        `MIG resources are time-sliced whole; expected all (or no devices key) for ${r.name}`,
      );
    if (sharedNames.has(r.name))
      throw new SharingError(`${path}.name`, `${r.name} is already time-sliced by an earlier entry`);
    sharedNames.add(r.name);
    const list = groups.get(r.name);
    if (list === undefined || list.length === 0) return;
    const target = advertisedName(r, ts.renameByDefault);
    const prev = out.get(target);
    const devices = [...(prev?.devices ?? []), ...migDevices(list, gpus, strategy, r.replicas)];
    out.set(target, {
      name: target,
      devices,
      shared: r.replicas > 1 || (prev?.shared ?? false),
      failRequestsGreaterThanOne: ts.failRequestsGreaterThanOne && r.replicas > 1,
    });
  });
  for (const [name, list] of groups) {
    if (sharedNames.has(name) || list.length === 0) continue;
    const prev = out.get(name);
    out.set(name, {
      name,
      devices: [...(prev?.devices ?? []), ...migDevices(list, gpus, strategy, 1)],
      shared: prev?.shared ?? false,
      failRequestsGreaterThanOne: prev?.failRequestsGreaterThanOne ?? false,
    });
  }
  return [...out.values()];
}

/**
 * The resources to advertise under a MIG strategy (FACTS §4a):
 * - none: MIG ignored; every GPU whole (as planResources).
 * - single: no MIG-enabled GPU → as none; otherwise the node must be uniform (MigStrategyError
 *   naming the GPUs and what differs) and every MIG device is advertised as nvidia.com/gpu.
 * - mixed: MIG-disabled GPUs whole under nvidia.com/gpu; one resource per full-compute-instance
 *   profile, nvidia.com/mig-<profile with + as .>; sub-instances (1c.2g.20gb) and MIG-enabled GPUs
 *   without MIG devices are not advertised (a note says so).
 * Time-slicing applies by resource name. Resources without devices are left out.
 */
export function planMigResources(
  gpus: readonly Gpu[],
  layout: MigLayout,
  migStrategy: MigStrategy,
  strategy: DeviceIdStrategy,
  sharing: Sharing,
): MigPlan {
  const notes: string[] = [];
  const anyEnabled = gpus.some((_, i) => enabled(layout, i));
  if (migStrategy === 'none' || !anyEnabled) {
    return { resources: planResources(gpus, strategy, sharing, { skipResource: isMigResource }), notes };
  }
  const devs = layout.devices
    .map((d, pos) => ({ d, pos }))
    .filter(({ d }) => enabled(layout, d.parent) && gpus[d.parent] !== undefined);
  if (migStrategy === 'single') {
    const problem = singleStrategyProblem(gpus, layout);
    if (problem !== null) throw new MigStrategyError(problem);
    const resources = planMigGroups(
      new Map([[GPU_RESOURCE, devs]]),
      gpus,
      strategy,
      sharing,
      (n) => n === GPU_RESOURCE,
    );
    return { resources, notes };
  }
  const whole = new Set(gpus.map((_, i) => i).filter((i) => !enabled(layout, i)));
  const isMig = isMigResource;
  const wholePlan =
    whole.size === 0 ? [] : planResources(gpus, strategy, sharing, { wholeGpus: whole, skipResource: isMig });
  const groups = new Map<string, { d: MigDevice; pos: number }[]>();
  const skipped = new Map<string, number>();
  for (const x of devs) {
    if (!isFullInstance(x.d)) {
      skipped.set(x.d.profile, (skipped.get(x.d.profile) ?? 0) + 1);
      continue;
    }
    const name = migResourceName(x.d.profile);
    const list = groups.get(name) ?? [];
    list.push(x);
    groups.set(name, list);
  }
  for (const [profile, n] of skipped)
    notes.push(
      `${n} MIG device${n === 1 ? '' : 's'} of profile ${profile} not advertised: the mixed strategy advertises full compute instances only`,
    );
  for (let i = 0; i < gpus.length; i++) {
    if (enabled(layout, i) && !devs.some(({ d }) => d.parent === i)) {
      notes.push(
        `GPU ${gpus[i]?.index} (${gpus[i]?.uuid}) has MIG enabled but no MIG devices; it is skipped until it has some`,
      );
    }
  }
  const migPlan = planMigGroups(groups, gpus, strategy, sharing, isMig);
  const resources = [
    ...wholePlan.filter((r) => r.devices.length > 0),
    ...migPlan.sort((a, b) => a.name.localeCompare(b.name)),
  ];
  return { resources, notes };
}

/** MIG modes where pending differs from current: logged, never acted on (a GPU reset applies them). */
export function pendingModeChanges(gpus: readonly Gpu[], layout: MigLayout): string[] {
  const out: string[] = [];
  layout.modes.forEach((m, i) => {
    if (m !== null && m !== undefined && m.current !== m.pending) {
      const g = gpus[i];
      out.push(
        `GPU ${g?.index} (${g?.uuid}): MIG mode is ${m.current ? 'enabled' : 'disabled'} now and ${m.pending ? 'enabled' : 'disabled'} after the next GPU reset; nothing changes until then`,
      );
    }
  });
  return out;
}

// ---------------------------------------------------------------------------------------------
// Health: which health units an event concerns. A unit is a GPU (by its UUID) or a MIG device (by
// its MIG UUID).
// ---------------------------------------------------------------------------------------------

/** The instance id NVML puts in an event that concerns the whole GPU. */
export const WHOLE_GPU_INSTANCE = 0xffffffff;

/** A GPU and every MIG device on it (UUIDs; the GPU first). */
export function unitsOfGpu(gpus: readonly Gpu[], layout: MigLayout, uuid: string): string[] {
  const pos = gpus.findIndex((g) => g.uuid === uuid);
  const out = [uuid];
  if (pos >= 0) for (const m of layout.devices) if (m.parent === pos) out.push(m.uuid);
  return out;
}

/** The units an event concerns, or why it concerns none (the GI/CI it names is no MIG device known here). */
export type EventTargets = { readonly units: readonly string[] } | { readonly unknown: string };

/**
 * The units an event on GPU `uuid` concerns. An event naming a MIG device (GI/CI) concerns that
 * device only; one for the whole GPU (0xFFFFFFFF, or absent) the GPU and every MIG device on it.
 * On a GPU whose MIG mode was not read (--mig-strategy=none: it is served whole, MIG mode or not),
 * an event naming a MIG device concerns the GPU itself, as NVIDIA's plugin has it. Otherwise a
 * GI/CI this layout does not know concerns nothing known: the caller looks at the MIG layout again
 * and asks once more.
 */
export function eventUnits(
  gpus: readonly Gpu[],
  layout: MigLayout,
  uuid: string,
  gi: number | undefined,
  ci: number | undefined,
): EventTargets {
  const pos = gpus.findIndex((g) => g.uuid === uuid);
  if (gi === undefined || gi === WHOLE_GPU_INSTANCE || layout.modes[pos] == null)
    return { units: unitsOfGpu(gpus, layout, uuid) };
  const hits = layout.devices
    .filter((m) => m.parent === pos && m.gi === gi && (ci === undefined || ci === WHOLE_GPU_INSTANCE || m.ci === ci))
    .map((m) => m.uuid);
  if (hits.length > 0) return { units: hits };
  return {
    unknown: `GPU instance ${gi}${ci === undefined || ci === WHOLE_GPU_INSTANCE ? '' : `, compute instance ${ci}`} is no MIG device known on this GPU`,
  };
}

// ---------------------------------------------------------------------------------------------
// Device nodes: /proc/driver/nvidia-caps/mig-minors → the capability nodes of a MIG device.
// ---------------------------------------------------------------------------------------------

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
        `mig-minors has no ${gi === undefined ? giKey : ciKey} for MIG device ${d.uuid} (GPU ${parent.index}, GI ${d.gi}, CI ${d.ci})`,
      );
    }
    out.set(d.uuid, [`${MIG_CAPS_DIR}/nvidia-cap${gi}`, `${MIG_CAPS_DIR}/nvidia-cap${ci}`]);
  });
  return out;
}
