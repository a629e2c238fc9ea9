// Allocate: check the kubelet's choice and describe what each container needs from the NVIDIA
// container runtime (FACTS §3). Pure: the set of control device nodes present is an input.
import type { AdvertisedDevice, Gpu } from './devices.ts';
import { RequestError } from './request-error.ts';

/** Control device nodes passed with --pass-device-specs when they exist, in this order. */
export const CONTROL_DEVICE_NODES: readonly string[] = [
  '/dev/nvidiactl',
  '/dev/nvidia-uvm',
  '/dev/nvidia-uvm-tools',
  '/dev/nvidia-modeset',
];

export interface AllocateSettings {
  passDeviceSpecs: boolean;
  /** Host root under which device nodes live ('/' on most hosts). */
  devRoot: string;
  /** Which of CONTROL_DEVICE_NODES exist under devRoot (container paths). */
  presentControlDevices: readonly string[];
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
}

export function indexDevices(devices: readonly AdvertisedDevice[], gpus: readonly Gpu[]): DeviceIndex {
  return { byId: new Map(devices.map((d) => [d.id, d])), gpus };
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
  if (containers.length === 0) throw new RequestError('Allocate request has no container requests; expected one per container');
  if (containers.length > Math.max(advertised, 1)) {
    throw new RequestError(`Allocate request has ${containers.length} container requests, more than the ${advertised} devices this plugin advertises`);
  }
  const taken = new Map<string, number>();
  return containers.map((c, ci) => {
    const ids = c.devices_ids;
    if (ids.length === 0) throw new RequestError(`container request ${ci} lists no device IDs; expected at least one`);
    if (ids.length > advertised) {
      throw new RequestError(`container request ${ci} asks for ${ids.length} devices, more than the ${advertised} this plugin advertises`);
    }
    const gpuOrder: number[] = [];
    const names: string[] = [];
    const seenGpus = new Set<number>();
    for (const id of ids) {
      const dev = index.byId.get(id);
      if (dev === undefined) throw new RequestError(`container request ${ci} names unknown device ID ${showId(id)}; this plugin advertises ${advertised} devices`);
      const earlier = taken.get(id);
      if (earlier !== undefined) {
        throw new RequestError(earlier === ci
          ? `container request ${ci} lists device ID ${showId(id)} twice`
          : `device ID ${showId(id)} is requested by container requests ${earlier} and ${ci}; a device goes to one container`);
      }
      taken.set(id, ci);
      if (!seenGpus.has(dev.gpu)) {
        seenGpus.add(dev.gpu);
        gpuOrder.push(dev.gpu);
        names.push(dev.runtimeName);
      }
    }
    const devices: ContainerAllocation['devices'] = [];
    if (settings.passDeviceSpecs) {
      for (const p of settings.presentControlDevices) {
        devices.push({ container_path: p, host_path: hostPath(settings.devRoot, p), permissions: 'rw' });
      }
      for (const g of gpuOrder) {
        const gpu = index.gpus[g];
        if (gpu === undefined) throw new Error(`advertised device refers to GPU position ${g}, which does not exist`);
        const p = `/dev/nvidia${gpu.minor}`;
        devices.push({ container_path: p, host_path: hostPath(settings.devRoot, p), permissions: 'rw' });
      }
    }
    return {
      envs: { NVIDIA_VISIBLE_DEVICES: names.join(',') },
      mounts: [],
      devices,
      annotations: {},
      cdi_devices: [],
    };
  });
}
