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
  /** Index into the GPU list of the GPU this device is carved from. */
  readonly gpu: number;
  /** The name the container runtime knows the device by (UUID or index), for NVIDIA_VISIBLE_DEVICES. */
  readonly runtimeName: string;
  /** For a time-slicing replica, its number (the n of `<id>::<n>`); absent for a whole GPU. */
  readonly replica?: number;
  /** For a MIG device (or a replica of one), its position in the MIG layout (core/mig.ts). */
  readonly mig?: number;
}

export const MAX_DEVICE_ID_LENGTH = 63;

export function gpuDeviceId(gpu: Gpu, strategy: DeviceIdStrategy): string {
  return strategy === 'uuid' ? gpu.uuid : String(gpu.index);
}

/** The devices advertised for whole GPUs. Throws if an ID breaks the API's rules. */
export function wholeGpuDevices(gpus: readonly Gpu[], strategy: DeviceIdStrategy): AdvertisedDevice[] {
  const seen = new Set<string>();
  return gpus.map((gpu, i) => {
    const id = gpuDeviceId(gpu, strategy);
    if (id.length === 0 || id.length > MAX_DEVICE_ID_LENGTH) {
      throw new Error(`GPU ${gpu.index} (bus ${gpu.busId}) has device ID ${JSON.stringify(id)} of ${id.length} characters; the kubelet accepts 1 to ${MAX_DEVICE_ID_LENGTH}`);
    }
    if (seen.has(id)) throw new Error(`GPU ${gpu.index} (bus ${gpu.busId}) repeats device ID ${id}; every GPU needs its own`);
    seen.add(id);
    return { id, gpu: i, runtimeName: id };
  });
}

/** Health of each GPU, by position in the GPU list; with MIG, MIG device k follows at gpus.length + k. */
export type GpuHealth = readonly Health[];

export interface DeviceListEntry {
  ID: string;
  health: Health;
  topology: { nodes: { ID: number }[] } | null;
}

/** The health unit of an advertised device (the health array lists GPUs, then MIG devices): its MIG device, else its GPU. */
export function deviceUnit(d: AdvertisedDevice, gpuCount: number): number {
  return d.mig === undefined ? d.gpu : gpuCount + d.mig;
}

/** The full list sent on ListAndWatch. NUMA topology is omitted for GPUs with no NUMA node. */
export function deviceList(devices: readonly AdvertisedDevice[], gpus: readonly Gpu[], health: GpuHealth): DeviceListEntry[] {
  return devices.map((d) => {
    const gpu = gpus[d.gpu];
    if (gpu === undefined) throw new Error(`device ${d.id} refers to GPU position ${d.gpu}, which does not exist`);
    return {
      ID: d.id,
      health: health[deviceUnit(d, gpus.length)] ?? 'Unhealthy',
      topology: gpu.numaNode === null ? null : { nodes: [{ ID: gpu.numaNode }] },
    };
  });
}

/** How many GPUs are healthy (replicas of one GPU count once). */
export function countHealthyGpus(health: GpuHealth): number {
  let n = 0;
  for (const h of health) if (h === 'Healthy') n++;
  return n;
}
