// What the node labels need from NVML beyond discovery: the CUDA version the driver supports, each
// GPU's compute capability and whether it can do MIG. Read with each scan when labels are on, a
// few calls per GPU; a driver without one of these functions loses only the labels made from it.
import type { Gpu } from '../core/devices.ts';
import type { NodeFacts } from '../core/snapshot.ts';
import type { Logger } from '../system/log.ts';
import { NVML, NvmlError } from './errors.ts';
import type { DeviceHandle, Nvml } from './nvml.ts';

export type { NodeFacts };
type GpuFacts = { compute: { major: number; minor: number } | null; migCapable: boolean };

export function readNodeFacts(
  nvml: Nvml,
  gpus: readonly Gpu[],
  handles: readonly DeviceHandle[],
  log: Logger,
): NodeFacts {
  let cudaDriverVersion: number | null = null;
  if (nvml.has('nvmlSystemGetCudaDriverVersion_v2')) {
    const out = [0];
    const code = nvml.callCode('nvmlSystemGetCudaDriverVersion_v2', out);
    if (code === NVML.SUCCESS) cudaDriverVersion = out[0] ?? null;
    else
      log.warn('cannot read the CUDA driver version; the cuda.runtime labels are left out', {
        error: new NvmlError('nvmlSystemGetCudaDriverVersion_v2', code, nvml.errorText(code)).message,
      });
  }
  const canCompute = nvml.has('nvmlDeviceGetCudaComputeCapability');
  const canMig = nvml.has('nvmlDeviceGetMigMode');
  const facts = new Map<string, GpuFacts>();
  gpus.forEach((g, i) => {
    const h = handles[i];
    let compute: GpuFacts['compute'] = null;
    let migCapable = false;
    if (h !== undefined && canCompute) {
      const major = [0];
      const minor = [0];
      const code = nvml.callCode('nvmlDeviceGetCudaComputeCapability', h, major, minor);
      if (code === NVML.SUCCESS) compute = { major: major[0] ?? 0, minor: minor[0] ?? 0 };
      else
        log.warn('cannot read the compute capability; the family and compute labels are left out', {
          gpu: g.index,
          uuid: g.uuid,
          error: new NvmlError('nvmlDeviceGetCudaComputeCapability', code, nvml.errorText(code)).message,
        });
    }
    if (h !== undefined && canMig) {
      // NOT_SUPPORTED: a GPU without MIG. Any answer at all: MIG-capable, enabled or not.
      migCapable = nvml.callCode('nvmlDeviceGetMigMode', h, [0], [0]) === NVML.SUCCESS;
    }
    facts.set(g.uuid, { compute, migCapable });
  });
  return { cudaDriverVersion, gpus: facts };
}
