// What the node labels need from NVML beyond discovery: the CUDA version the driver supports, each
// GPU's compute capability and whether it can do MIG. Read once per node state (start, reload), a
// few calls per GPU; a driver without one of these functions loses only the labels made from it.
import type { LabelGpu } from '../core/labels.ts';
import type { Gpu } from '../core/devices.ts';
import type { Logger } from '../system/log.ts';
import { NVML, NvmlError } from './errors.ts';
import type { DeviceHandle, Nvml } from './nvml.ts';

export interface NodeFacts {
  /** e.g. 12040 for CUDA 12.4, or null when NVML cannot say. */
  cudaDriverVersion: number | null;
  /** By position in the GPU list. */
  gpus: LabelGpu[];
}

export function readNodeFacts(nvml: Nvml, gpus: readonly Gpu[], handles: readonly DeviceHandle[], log: Logger): NodeFacts {
  let cudaDriverVersion: number | null = null;
  if (nvml.has('nvmlSystemGetCudaDriverVersion_v2')) {
    const out = [0];
    const code = nvml.callCode('nvmlSystemGetCudaDriverVersion_v2', out);
    if (code === NVML.SUCCESS) cudaDriverVersion = out[0] ?? null;
    else log.warn('cannot read the CUDA driver version; the cuda.runtime labels are left out', { error: new NvmlError('nvmlSystemGetCudaDriverVersion_v2', code, nvml.errorText(code)).message });
  }
  const canCompute = nvml.has('nvmlDeviceGetCudaComputeCapability');
  const canMig = nvml.has('nvmlDeviceGetMigMode');
  const facts = gpus.map((g, i): LabelGpu => {
    const h = handles[i];
    let compute: LabelGpu['compute'] = null;
    let migCapable = false;
    if (h !== undefined && canCompute) {
      const major = [0];
      const minor = [0];
      const code = nvml.callCode('nvmlDeviceGetCudaComputeCapability', h, major, minor);
      if (code === NVML.SUCCESS) compute = { major: major[0] ?? 0, minor: minor[0] ?? 0 };
      else log.warn('cannot read the compute capability; the family and compute labels are left out', { gpu: g.index, uuid: g.uuid, error: new NvmlError('nvmlDeviceGetCudaComputeCapability', code, nvml.errorText(code)).message });
    }
    if (h !== undefined && canMig) {
      // NOT_SUPPORTED: a GPU without MIG. Any answer at all: MIG-capable, enabled or not.
      migCapable = nvml.callCode('nvmlDeviceGetMigMode', h, [0], [0]) === NVML.SUCCESS;
    }
    return { name: g.name, memoryBytes: g.memoryBytes, compute, migCapable };
  });
  return { cudaDriverVersion, gpus: facts };
}
