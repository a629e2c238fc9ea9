// NVML return codes and the typed error every failed NVML call becomes.

export const NVML = {
  SUCCESS: 0,
  ERROR_UNINITIALIZED: 1,
  ERROR_INVALID_ARGUMENT: 2,
  ERROR_NOT_SUPPORTED: 3,
  ERROR_NO_PERMISSION: 4,
  ERROR_NOT_FOUND: 6,
  ERROR_INSUFFICIENT_SIZE: 7,
  ERROR_DRIVER_NOT_LOADED: 9,
  ERROR_TIMEOUT: 10,
  ERROR_FUNCTION_NOT_FOUND: 13,
  ERROR_GPU_IS_LOST: 15,
  ERROR_RESET_REQUIRED: 16,
  ERROR_LIB_RM_VERSION_MISMATCH: 18,
  ERROR_UNKNOWN: 999,
} as const;

/**
 * Codes that say the driver as a whole does not answer (unloaded, or library and kernel module of
 * different versions mid-upgrade): NVML is shut down and opened again until it answers.
 */
export function meansDriverGone(code: number): boolean {
  return (
    code === NVML.ERROR_UNINITIALIZED ||
    code === NVML.ERROR_DRIVER_NOT_LOADED ||
    code === NVML.ERROR_LIB_RM_VERSION_MISMATCH
  );
}

/** Which GPU a failed call concerned, as far as it is known. */
export interface GpuRef {
  index?: number;
  uuid?: string;
  busId?: string;
}

function describeGpu(gpu: GpuRef | undefined): string {
  if (gpu === undefined) return '';
  const parts: string[] = [];
  if (gpu.index !== undefined) parts.push(`GPU ${gpu.index}`);
  if (gpu.uuid !== undefined) parts.push(gpu.uuid);
  if (gpu.busId !== undefined) parts.push(`bus ${gpu.busId}`);
  return parts.length > 0 ? ` for ${parts.join(' ')}` : '';
}

export class NvmlError extends Error {
  override name = 'NvmlError';
  readonly func: string;
  readonly code: number;
  readonly text: string;
  readonly gpu: GpuRef | undefined;
  constructor(func: string, code: number, text: string, gpu?: GpuRef) {
    super(`${func} failed${describeGpu(gpu)}: ${text} (NVML code ${code})`);
    this.func = func;
    this.code = code;
    this.text = text;
    this.gpu = gpu;
  }
}

/** Text NVML would give, for when the library itself could not be asked. */
export function fallbackErrorText(code: number): string {
  switch (code) {
    case NVML.SUCCESS:
      return 'Success';
    case NVML.ERROR_UNINITIALIZED:
      return 'Uninitialized';
    case NVML.ERROR_INVALID_ARGUMENT:
      return 'Invalid Argument';
    case NVML.ERROR_NOT_SUPPORTED:
      return 'Not Supported';
    case NVML.ERROR_NO_PERMISSION:
      return 'Insufficient Permissions';
    case NVML.ERROR_NOT_FOUND:
      return 'Not Found';
    case NVML.ERROR_INSUFFICIENT_SIZE:
      return 'Insufficient Size';
    case NVML.ERROR_DRIVER_NOT_LOADED:
      return 'Driver Not Loaded';
    case NVML.ERROR_TIMEOUT:
      return 'Timeout';
    case NVML.ERROR_FUNCTION_NOT_FOUND:
      return 'Function Not Found';
    case NVML.ERROR_GPU_IS_LOST:
      return 'GPU is lost';
    case NVML.ERROR_RESET_REQUIRED:
      return 'GPU requires reset';
    case NVML.ERROR_LIB_RM_VERSION_MISMATCH:
      return 'RM has detected an NVML/RM version mismatch';
    default:
      return 'Unknown Error';
  }
}
