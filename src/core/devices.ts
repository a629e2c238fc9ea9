// The device model: the GPUs NVML found, the IDs advertised to the kubelet for them, and their health.
// Pure: plain data in, plain data out.

export type Health = 'Healthy' | 'Unhealthy';

/** One physical GPU as discovered at start. */
export interface Gpu {
  readonly index: number;
  readonly uuid: string;
  readonly name: string;
  readonly minor: number;
  /** PCI bus id as NVML gives it, e.g. 00000000:07:00.0 */
  readonly busId: string;
  readonly memoryBytes: number;
  /** NUMA node of the GPU, or null when the platform reports none. */
  readonly numaNode: number | null;
}

export type DeviceIdStrategy = 'uuid' | 'index';
export const DEVICE_ID_STRATEGIES: readonly DeviceIdStrategy[] = ['uuid', 'index'];

/**
 * One ID advertised to the kubelet. Every advertised device is derived from one GPU (a whole GPU or
 * a time-slicing replica of one, or a MIG device on it), and takes that GPU's health — or, for a
 * MIG device, the MIG device's own.
 */
export interface AdvertisedDevice {
  readonly id: string;
  /** UUID of the GPU this device is carved from: what its identity and (whole-GPU) health go by. */
  readonly uuid: string;
  /**
   * Position of that GPU in the list the plan was made from (the same snapshot's `gpus`): the row of
   * the topology matrix and the GPU whose facts Allocate reads. Never used across snapshots.
   */
  readonly gpu: number;
  /** The name the container runtime knows the device by (UUID or index), for NVIDIA_VISIBLE_DEVICES. */
  readonly runtimeName: string;
  /** For a time-slicing replica, its number (the n of `<id>::<n>`); absent for a whole GPU. */
  readonly replica?: number;
  /** For a MIG device (or a replica of one), the MIG device's UUID: its health and capability nodes go by it. */
  readonly mig?: string;
}

export const MAX_DEVICE_ID_LENGTH = 63;

/**
 * The name the container runtime gets for a GPU (NVIDIA_VISIBLE_DEVICES, CDI names, volume-mounts):
 * its UUID or its index, by the strategy. The ID advertised to the kubelet is always the UUID (as
 * NVIDIA's plugin does whatever the strategy), so allocations the kubelet checkpointed survive a
 * strategy change, a switch from NVIDIA's plugin, and a reboot that re-indexes the GPUs.
 */
export function gpuDeviceId(gpu: Gpu, strategy: DeviceIdStrategy): string {
  return strategy === 'uuid' ? gpu.uuid : String(gpu.index);
}

/** The devices advertised for whole GPUs. Throws if an ID breaks the API's rules. */
export function wholeGpuDevices(gpus: readonly Gpu[], strategy: DeviceIdStrategy): AdvertisedDevice[] {
  const seen = new Set<string>();
  return gpus.map((gpu, i) => {
    const id = gpu.uuid;
    if (id.length === 0 || id.length > MAX_DEVICE_ID_LENGTH) {
      throw new Error(
        `GPU ${gpu.index} (bus ${gpu.busId}) has device ID ${JSON.stringify(id)} ` +
          `of ${id.length} characters; the kubelet accepts 1 to ${MAX_DEVICE_ID_LENGTH}`,
      );
    }
    if (seen.has(id))
      throw new Error(`GPU ${gpu.index} (bus ${gpu.busId}) repeats device ID ${id}; every GPU needs its own`);
    seen.add(id);
    return { id, uuid: gpu.uuid, gpu: i, runtimeName: gpuDeviceId(gpu, strategy) };
  });
}

/** Advertised health by UUID: each GPU's by its UUID, each MIG device's by its MIG UUID. */
export type GpuHealth = ReadonlyMap<string, Health>;

export interface DeviceListEntry {
  ID: string;
  health: Health;
  topology: { nodes: { ID: number }[] } | null;
}

/** The health unit of an advertised device: its MIG device's UUID, else its GPU's. */
export function deviceUnit(d: AdvertisedDevice): string {
  return d.mig ?? d.uuid;
}

/** The full list sent on ListAndWatch. NUMA topology is omitted for GPUs with no NUMA node. */
export function deviceList(
  devices: readonly AdvertisedDevice[],
  gpus: readonly Gpu[],
  health: GpuHealth,
): DeviceListEntry[] {
  return devices.map((d) => {
    const gpu = gpus[d.gpu];
    if (gpu === undefined) throw new Error(`device ${d.id} refers to GPU position ${d.gpu}, which does not exist`);
    return {
      ID: d.id,
      health: health.get(deviceUnit(d)) ?? 'Unhealthy',
      topology: gpu.numaNode === null ? null : { nodes: [{ ID: gpu.numaNode }] },
    };
  });
}

/** How many are healthy. */
export function countHealthyGpus(health: Iterable<Health>): number {
  let n = 0;
  for (const h of health) if (h === 'Healthy') n++;
  return n;
}
