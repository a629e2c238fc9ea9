// Allocate: check the kubelet's choice and describe what each container needs from the NVIDIA
// container runtime, for each device-list strategy. Replicas (time-slicing) name their
// GPU: the suffix is stripped and each GPU is listed once. MIG devices are listed by
// their own name (MIG UUID or `<gpu>:<mig>`); their device specs are the parent's node and the two
// capability nodes of the MIG device. MPS replicas also get their resource's control
// daemon: the pipe directory's variable and two mounts, whatever the strategy. Pure: the set of control device nodes
// present and the source of random UUIDs are inputs.
import type { AdvertisedDevice, Gpu } from './devices.ts';
import { CDI_IMEX_KIND, IMEX_CHANNELS_ENV, imexChannelPath } from './imex.ts';
import { MPS_PIPE_ENV, containerPipeDir, mpsPaths, mpsShmDir } from './mps.ts';
import { RequestError } from './request-error.ts';

/** Control device nodes passed with --pass-device-specs when they exist, in this order. */
export const CONTROL_DEVICE_NODES: readonly string[] = [
  '/dev/nvidiactl',
  '/dev/nvidia-uvm',
  '/dev/nvidia-uvm-tools',
  '/dev/nvidia-modeset',
];

/** How the device list reaches the container runtime (NVIDIA's --device-list-strategy). */
export type DeviceListStrategy = 'envvar' | 'volume-mounts' | 'cdi-annotations' | 'cdi-cri';
export const DEVICE_LIST_STRATEGIES: readonly DeviceListStrategy[] = [
  'envvar',
  'volume-mounts',
  'cdi-annotations',
  'cdi-cri',
];

export const VISIBLE_DEVICES_ENV = 'NVIDIA_VISIBLE_DEVICES';
/** Container folder whose entries name the devices with the volume-mounts strategy. */
export const VOLUME_MOUNTS_ROOT = '/var/run/nvidia-container-devices';
/** Fully qualified CDI kind of a GPU of this plugin (NVIDIA's vendor and class). */
export const CDI_KIND = 'k8s.device-plugin.nvidia.com/gpu';
export const DEFAULT_CDI_ANNOTATION_PREFIX = 'cdi.k8s.io/';
/** Annotation key after the prefix, before a random UUID (NVIDIA's). */
export const CDI_ANNOTATION_NAME = 'nvidia-device-plugin_';

export interface AllocateSettings {
  passDeviceSpecs: boolean;
  /** Host root under which device nodes live ('/' on most hosts). */
  devRoot: string;
  /** Which of CONTROL_DEVICE_NODES exist under devRoot (container paths). */
  presentControlDevices: readonly string[];
  /** Default ['envvar']. */
  deviceListStrategies?: readonly DeviceListStrategy[];
  /** Default cdi.k8s.io/. */
  cdiAnnotationPrefix?: string;
  /** Refuse a container asking for more than one replica (time-slicing's failRequestsGreaterThanOne). */
  failRequestsGreaterThanOne?: boolean;
  /** The resource answered for, named in messages. */
  resourceName?: string;
  /** Random UUIDs for CDI annotation keys (default crypto.randomUUID). */
  newUuid?: () => string;
  /**
   * Capability nodes (container paths under /dev/nvidia-caps) of each MIG device, by its MIG UUID:
   * GI access, then CI access (core/mig.ts migCapabilityNodes). Needed for MIG
   * devices with passDeviceSpecs.
   */
  migCapabilities?: ReadonlyMap<string, readonly string[]>;
  /** IMEX channels every container gets (present and configured; see core/imex.ts). Default none. */
  imexChannels?: readonly number[];
  /** --mps-root: where the MPS control daemons' pipes and shm are on the host ('' or absent: not set). */
  mpsRoot?: string;
  /** The resource's replicas are MPS clients (PlannedResource.mps); needs mpsRoot and resourceName. */
  mps?: boolean;
}

/**
 * What an MPS client container gets (NVIDIA's updateResponseForMPS): CUDA_MPS_PIPE_DIRECTORY, its
 * resource's pipe directory and the daemons' shm as /dev/shm, both writable (a client creates its
 * own pipes and shared memory there). These are kept as the device plugin API's envs and mounts with
 * the CDI strategies too, as NVIDIA's plugin does: the kubelet hands a container's envs and mounts
 * to the runtime whatever names the devices, and no CDI spec (written by nvidia-ctk, not us) has
 * edits for a directory only this plugin's --mps-root knows.
 */
export function mpsContainerEdits(root: string, resource: string): Pick<ContainerAllocation, 'envs' | 'mounts'> {
  const inside = containerPipeDir(resource);
  return {
    envs: { [MPS_PIPE_ENV]: inside },
    mounts: [
      { container_path: inside, host_path: mpsPaths(root, resource).pipeDir, read_only: false },
      { container_path: '/dev/shm', host_path: mpsShmDir(root), read_only: false },
    ],
  };
}

export interface ContainerAllocation {
  envs: Record<string, string>;
  mounts: { container_path: string; host_path: string; read_only: boolean }[];
  devices: { container_path: string; host_path: string; permissions: string }[];
  annotations: Record<string, string>;
  cdi_devices: { name: string }[];
}

export interface DeviceIndex {
  readonly byId: ReadonlyMap<string, AdvertisedDevice>;
  readonly gpus: readonly Gpu[];
  /** Some devices are replicas: several IDs can name one GPU. */
  readonly shared: boolean;
  /** How many advertised devices each GPU position has (1 for a whole GPU, N for N replicas). */
  readonly perGpu: ReadonlyMap<number, number>;
  /** Position of each ID in the advertised list (answers are given in that order). */
  readonly order: ReadonlyMap<string, number>;
  /** Some devices are MIG devices: several distinct devices can share one parent GPU. */
  readonly mig?: boolean;
  /** Each MIG device (by MIG UUID) as a number of its own, for grouping its replicas (first advertised position). */
  readonly migGroups?: ReadonlyMap<string, number>;
}

export function indexDevices(devices: readonly AdvertisedDevice[], gpus: readonly Gpu[]): DeviceIndex {
  const perGpu = new Map<number, number>();
  for (const d of devices) perGpu.set(d.gpu, (perGpu.get(d.gpu) ?? 0) + 1);
  return {
    byId: new Map(devices.map((d) => [d.id, d])),
    gpus,
    shared: devices.some((d) => d.replica !== undefined),
    perGpu,
    order: new Map(devices.map((d, i) => [d.id, i])),
    mig: devices.some((d) => d.mig !== undefined),
    migGroups: migGroups(devices),
  };
}

function migGroups(devices: readonly AdvertisedDevice[]): Map<string, number> {
  const out = new Map<string, number>();
  devices.forEach((d, i) => {
    if (d.mig !== undefined && !out.has(d.mig)) out.set(d.mig, i);
  });
  return out;
}

/** Shows an ID from a request in an error message without letting a huge one flood the log. */
export function showId(id: string): string {
  const s = id.length > 80 ? `${id.slice(0, 77)}...` : id;
  return JSON.stringify(s);
}

export function hostPath(devRoot: string, containerPath: string): string {
  const root = devRoot.replace(/\/+$/, '');
  return `${root}${containerPath}`;
}

function strategiesOf(settings: AllocateSettings): ReadonlySet<DeviceListStrategy> {
  const list = settings.deviceListStrategies ?? ['envvar'];
  return new Set(list.length === 0 ? ['envvar'] : list);
}

/** What a container gets of one GPU or MIG device: its GPU position, and its MIG UUID if any. */
interface Unit {
  readonly gpu: number;
  readonly mig: string | undefined;
}

/** The names a container gets, in request order, each GPU or MIG device once: what each strategy passes on. */
function respond(
  names: readonly string[],
  units: readonly Unit[],
  index: DeviceIndex,
  settings: AllocateSettings,
): ContainerAllocation {
  const strategies = strategiesOf(settings);
  const legacy = strategies.has('envvar') || strategies.has('volume-mounts');
  const envs: Record<string, string> = {};
  const mounts: ContainerAllocation['mounts'] = [];
  const devices: ContainerAllocation['devices'] = [];
  const annotations: Record<string, string> = {};
  const cdi: ContainerAllocation['cdi_devices'] = [];
  if (strategies.has('volume-mounts')) {
    // As NVIDIA's plugin: with both envvar and volume-mounts, the variable points at the mounts.
    envs[VISIBLE_DEVICES_ENV] = VOLUME_MOUNTS_ROOT;
    for (const n of names)
      mounts.push({ container_path: `${VOLUME_MOUNTS_ROOT}/${n}`, host_path: '/dev/null', read_only: true });
  } else if (strategies.has('envvar')) {
    envs[VISIBLE_DEVICES_ENV] = names.join(',');
  }
  const imex = settings.imexChannels ?? [];
  if (strategies.has('envvar') && imex.length > 0) envs[IMEX_CHANNELS_ENV] = imex.join(',');
  if (legacy && settings.passDeviceSpecs) {
    for (const p of settings.presentControlDevices) {
      devices.push({ container_path: p, host_path: hostPath(settings.devRoot, p), permissions: 'rw' });
    }
    const passed = new Set<string>();
    const pass = (p: string): void => {
      if (passed.has(p)) return;
      passed.add(p);
      devices.push({ container_path: p, host_path: hostPath(settings.devRoot, p), permissions: 'rw' });
    };
    for (const u of units) {
      const gpu = index.gpus[u.gpu];
      if (gpu === undefined) throw new Error(`advertised device refers to GPU position ${u.gpu}, which does not exist`);
      pass(`/dev/nvidia${gpu.minor}`);
      if (u.mig === undefined) continue;
      const caps = settings.migCapabilities?.get(u.mig);
      if (caps === undefined)
        throw new Error(`MIG device ${u.mig} on GPU ${gpu.index} has no capability nodes (mig-minors not read)`);
      for (const p of caps) pass(p);
    }
    for (const id of imex)
      devices.push({
        container_path: imexChannelPath(id),
        host_path: hostPath(settings.devRoot, imexChannelPath(id)),
        permissions: 'rw',
      });
  }
  const cdiNames = [...names.map((n) => `${CDI_KIND}=${n}`), ...imex.map((id) => `${CDI_IMEX_KIND}=${id}`)];
  if (strategies.has('cdi-annotations')) {
    const uuid = settings.newUuid?.() ?? globalThis.crypto.randomUUID();
    annotations[`${settings.cdiAnnotationPrefix ?? DEFAULT_CDI_ANNOTATION_PREFIX}${CDI_ANNOTATION_NAME}${uuid}`] =
      cdiNames.join(',');
  }
  if (strategies.has('cdi-cri')) for (const name of cdiNames) cdi.push({ name });
  return { envs, mounts, devices, annotations, cdi_devices: cdi };
}

/** What one container request names: its units (each GPU or MIG device once), their runtime names, its replicas. */
interface ContainerRequest {
  readonly units: Unit[];
  readonly names: string[];
  readonly replicas: number;
  /** The first whole (not replicated) device it names. */
  readonly whole: AdvertisedDevice | undefined;
}

/**
 * Looks up container request `ci`'s device IDs, each known and taken by one container only (`taken`: ID → the
 * container request that holds it, filled in as it goes). Throws RequestError naming the first thing wrong.
 */
function readContainerRequest(
  ids: readonly string[],
  ci: number,
  index: DeviceIndex,
  taken: Map<string, number>,
): ContainerRequest {
  const advertised = index.byId.size;
  if (ids.length === 0) throw new RequestError(`container request ${ci} lists no device IDs; expected at least one`);
  if (ids.length > advertised) {
    throw new RequestError(
      `container request ${ci} asks for ${ids.length} devices, more than the ${advertised} this plugin advertises`,
    );
  }
  const units: Unit[] = [];
  const names: string[] = [];
  const seenUnits = new Set<string>();
  let replicas = 0;
  let whole: AdvertisedDevice | undefined;
  for (const id of ids) {
    const dev = index.byId.get(id);
    if (dev === undefined)
      throw new RequestError(
        `container request ${ci} names unknown device ID ${showId(id)}; this plugin advertises ${advertised} devices`,
      );
    const earlier = taken.get(id);
    if (earlier !== undefined) {
      throw new RequestError(
        earlier === ci
          ? `container request ${ci} lists device ID ${showId(id)} twice`
          : `device ID ${showId(id)} is requested by container requests ${earlier} and ${ci}; ` +
              `a device goes to one container`,
      );
    }
    taken.set(id, ci);
    if (dev.replica !== undefined) replicas++;
    else whole ??= dev;
    const key = dev.mig === undefined ? `gpu:${dev.gpu}` : `mig:${dev.mig}`;
    if (!seenUnits.has(key)) {
      seenUnits.add(key);
      units.push({ gpu: dev.gpu, mig: dev.mig });
      names.push(dev.runtimeName);
    }
  }
  return { units, names, replicas, whole };
}

/**
 * Checks one Allocate request (every container) and builds the responses, one per container in order.
 * Throws RequestError naming the first thing wrong.
 */
export function allocate(
  containers: readonly { devices_ids: readonly string[] }[],
  index: DeviceIndex,
  settings: AllocateSettings,
): ContainerAllocation[] {
  const advertised = index.byId.size;
  if (containers.length === 0)
    throw new RequestError('Allocate request has no container requests; expected one per container');
  if (containers.length > Math.max(advertised, 1)) {
    throw new RequestError(
      `Allocate request has ${containers.length} container requests, ` +
        `more than the ${advertised} devices this plugin advertises`,
    );
  }
  const taken = new Map<string, number>();
  return containers.map((c, ci) => {
    const ids = c.devices_ids;
    const { units, names, replicas, whole } = readContainerRequest(ids, ci, index, taken);
    const resource = settings.resourceName === undefined ? '' : ` of ${settings.resourceName}`;
    const mps = settings.mps === true && replicas > 0;
    if (settings.failRequestsGreaterThanOne === true && replicas > 0 && ids.length > 1) {
      // MPS: NVIDIA's words ("maximum request size for shared resources is 1; found N").
      const why = mps
        ? `maximum request size for shared resources is 1; found ${ids.length}: ` +
          `an MPS replica is one client's share of a GPU, and several give a container no more of it; request 1`
        : 'time-slicing gives no more GPU time to a container that holds several; request 1';
      throw new RequestError(
        `container request ${ci} asks for ${ids.length} shared GPU replicas${resource}; ` +
          `failRequestsGreaterThanOne allows 1 per container (${why})`,
      );
    }
    if (mps && whole !== undefined) {
      // The container's CUDA would go through the MPS daemon, which does not serve a whole GPU.
      throw new RequestError(
        `container request ${ci} asks for whole GPU ${showId(whole.id)} and MPS replicas${resource} together; ` +
          `a container's GPUs all go through MPS or none do: request replicas only, or whole GPUs only`,
      );
    }
    const answer = respond(names, units, index, settings);
    if (!mps) return answer;
    const root = settings.mpsRoot ?? '';
    if (root === '' || settings.resourceName === undefined)
      throw new Error(
        `MPS replicas${resource} allocated without ${root === '' ? 'an MPS root (--mps-root)' : 'a resource name'}`,
      );
    const edits = mpsContainerEdits(root, settings.resourceName);
    return { ...answer, envs: { ...answer.envs, ...edits.envs }, mounts: [...answer.mounts, ...edits.mounts] };
  });
}
