// This node's GPUs and MIG devices as NVML lists them now, for the DRA sharing agent's admission of requests
// (core/dra-admission.ts): each whole GPU with its NVML index and memory, each MIG device with its parent GPU
// and its own memory. Read again for each sync that has a new request, so a GPU that went or a MIG layout that
// changed is seen.
import type { HostInventory, HostUnit } from '../core/dra-admission.ts';
import { discoverGpus } from '../nvml/discovery.ts';
import { discoverMig } from '../nvml/mig.ts';
import type { Nvml } from '../nvml/nvml.ts';
import type { Logger } from '../system/log.ts';

const MIB = 1024 * 1024;

export function readInventory(nvml: Nvml, log: Logger): HostInventory {
  const found = discoverGpus(nvml, '/sys', log);
  const units = new Map<string, HostUnit>();
  for (const g of found.gpus)
    units.set(g.uuid, { uuid: g.uuid, gpuUuid: g.uuid, gpuIndex: g.index, memoryMiB: Math.floor(g.memoryBytes / MIB) });
  const mig = discoverMig(nvml, found.gpus, found.handles, log);
  for (const d of mig?.devices ?? []) {
    const parent = found.gpus[d.parent];
    if (parent === undefined) continue;
    units.set(d.uuid, { uuid: d.uuid, gpuUuid: parent.uuid, memoryMiB: Math.floor(d.memoryBytes / MIB) });
  }
  return units;
}
