// Reads what the plugin needs to know about the node's GPUs, once: identity, memory, NUMA node and
// the links between them. Never called per RPC.
import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import type { Gpu } from '../core/devices.ts';
import type { Logger } from '../system/log.ts';
import { NVML, NvmlError, meansDriverGone } from './errors.ts';
import type { DeviceHandle, Nvml, PciInfo } from './nvml.ts';

export interface DiscoveredGpus {
  gpus: Gpu[];
  /** NVML handles, by position in gpus. */
  handles: DeviceHandle[];
  /** GPUs NVML counts but which could not be read (fallen off the bus, say), by NVML index. */
  unreadable?: { index: number; error: NvmlError }[];
}

/** sysfs form of a PCI bus id: lower case, 4-digit domain (00000000:07:00.0 → 0000:07:00.0). */
export function sysfsBusId(busId: string): string {
  const m = /^([0-9a-fA-F]+):([0-9a-fA-F]{2}):([0-9a-fA-F]{2})\.([0-7])$/.exec(busId.trim());
  if (m === null) return busId.toLowerCase();
  const domain = (m[1] ?? '0').toLowerCase().replace(/^0+/, '').padStart(4, '0');
  return `${domain}:${(m[2] ?? '').toLowerCase()}:${(m[3] ?? '').toLowerCase()}.${m[4] ?? '0'}`;
}

/** NUMA node from sysfs, or null when the file is absent or says -1. */
export function sysfsNumaNode(sysfsRoot: string, busId: string): number | null {
  try {
    const text = readFileSync(join(sysfsRoot, 'bus', 'pci', 'devices', sysfsBusId(busId), 'numa_node'), 'utf8').trim();
    const n = Number.parseInt(text, 10);
    return Number.isInteger(n) && n >= 0 ? n : null;
  } catch {
    return null;
  }
}

/** logUnreadable false: the caller logs the GPUs that cannot be read (it knows what becomes of them). */
export function discoverGpus(nvml: Nvml, sysfsRoot: string, log: Logger, logUnreadable = true): DiscoveredGpus {
  const count = nvml.deviceCount();
  const gpus: Gpu[] = [];
  const handles: DeviceHandle[] = [];
  const unreadable: { index: number; error: NvmlError }[] = [];
  for (let index = 0; index < count; index++) {
    try {
      const h = nvml.handleByIndex(index);
      const ref = { index };
      const uuid = nvml.uuid(h, ref);
      const withUuid = { index, uuid };
      const pci = nvml.pciInfo(h, withUuid);
      const full = { index, uuid, busId: pci.busId };
      const numa = nvml.numaNode(h, full);
      gpus.push({
        index,
        uuid,
        name: nvml.name(h, full),
        minor: nvml.minor(h, full),
        busId: pci.busId,
        memoryBytes: nvml.memoryTotal(h, full),
        numaNode: numa ?? sysfsNumaNode(sysfsRoot, pci.busId),
      });
      handles.push(h);
    } catch (err) {
      // A GPU that cannot be read (fallen off the bus, say) is not advertised; the others are.
      // A driver that stopped answering concerns every GPU: the caller decides.
      if (!(err instanceof NvmlError) || meansDriverGone(err.code)) throw err;
      if (logUnreadable) log.error('GPU cannot be read and is not advertised', { gpu: index, error: err.message });
      unreadable.push({ index, error: err });
    }
  }
  return { gpus, handles, unreadable };
}

export type RemoteKind = 'gpu' | 'switch' | 'unknown';

export interface GpuLinks {
  busId: string;
  links: { remoteBusId: string; remote: RemoteKind; link?: number }[];
}

export interface NodeLinks {
  /** Active NVLinks of each GPU, by position. */
  gpus: GpuLinks[];
  /** PCIe relation (NVML topology level) of each pair, by position; -1 where NVML could not say. */
  pcie: number[][];
}

const NVLINK_REMOTE_GPU = 0;
const NVLINK_REMOTE_SWITCH = 2;
/** Safety bound on link iteration; NVML answers INVALID_ARGUMENT past a GPU's last link well before. */
const MAX_LINKS = 64;

function remoteKind(
  nvml: Nvml,
  h: DeviceHandle,
  link: number,
  remoteBus: string,
  busIds: ReadonlySet<string>,
): RemoteKind {
  if (nvml.has('nvmlDeviceGetNvLinkRemoteDeviceType')) {
    const out = [0];
    const code = nvml.callCode('nvmlDeviceGetNvLinkRemoteDeviceType', h, link, out);
    if (code === NVML.SUCCESS) {
      if (out[0] === NVLINK_REMOTE_GPU) return 'gpu';
      if (out[0] === NVLINK_REMOTE_SWITCH) return 'switch';
      return 'unknown';
    }
  }
  // Older drivers: a far end that is one of our GPUs is a GPU; anything else we cannot tell.
  return busIds.has(remoteBus) ? 'gpu' : 'unknown';
}

/** Reads NVLinks (until NVML says there are no more) and PCIe relations. Missing functions mean no links. */
export function readLinks(nvml: Nvml, found: DiscoveredGpus, log: Logger): NodeLinks {
  const busIds = new Set(found.gpus.map((g) => g.busId.toLowerCase()));
  const gpus: GpuLinks[] = found.gpus.map((g) => ({ busId: g.busId, links: [] }));
  const canLinks = nvml.has('nvmlDeviceGetNvLinkState') && nvml.has('nvmlDeviceGetNvLinkRemotePciInfo_v2');
  found.handles.forEach((h, i) => {
    const gpu = found.gpus[i];
    const entry = gpus[i];
    if (!canLinks || gpu === undefined || entry === undefined) return;
    for (let link = 0; link < MAX_LINKS; link++) {
      const active = [0];
      const code = nvml.callCode('nvmlDeviceGetNvLinkState', h, link, active);
      if (code === NVML.ERROR_INVALID_ARGUMENT || code === NVML.ERROR_NOT_SUPPORTED) break;
      if (code !== NVML.SUCCESS) {
        log.warn('cannot read NVLink state; links past this one are not counted', {
          gpu: gpu.index,
          uuid: gpu.uuid,
          link,
          error: new NvmlError('nvmlDeviceGetNvLinkState', code, nvml.errorText(code)).message,
        });
        break;
      }
      if (active[0] === 0) continue;
      const pci = {} as PciInfo;
      const pc = nvml.callCode('nvmlDeviceGetNvLinkRemotePciInfo_v2', h, link, pci);
      if (pc !== NVML.SUCCESS) continue;
      const remoteBusId = pci.busId.toLowerCase();
      entry.links.push({ remoteBusId, remote: remoteKind(nvml, h, link, remoteBusId, busIds), link });
    }
  });
  const n = found.gpus.length;
  const pcie: number[][] = Array.from({ length: n }, () => new Array<number>(n).fill(-1));
  const canPcie = nvml.has('nvmlDeviceGetTopologyCommonAncestor');
  for (let i = 0; i < n && canPcie; i++) {
    for (let j = i + 1; j < n; j++) {
      const out = [0];
      const code = nvml.callCode('nvmlDeviceGetTopologyCommonAncestor', found.handles[i], found.handles[j], out);
      const level = code === NVML.SUCCESS ? (out[0] ?? -1) : -1;
      (pcie[i] as number[])[j] = level;
      (pcie[j] as number[])[i] = level;
    }
  }
  return { gpus, pcie };
}
