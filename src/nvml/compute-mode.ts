// A GPU's compute mode through NVML. MPS sharing (src/mps/) puts each GPU it serves in
// EXCLUSIVE_PROCESS before it starts nvidia-cuda-mps-control, and back in DEFAULT when it stops;
// `info` and `check` (src/cli/) read each GPU's mode. Both entry points are as old as NVML itself, but they
// are bound lazily like every symbol outside the basic set, so a plugin that never shares through
// MPS nor runs `info` or `check` never binds them.
import { NVML, NvmlError } from './errors.ts';
import type { GpuRef } from './errors.ts';
import type { DeviceHandle, Nvml } from './nvml.ts';

/** nvmlComputeMode_t, as in nvml.h. */
export const NVML_COMPUTE_MODE = {
  default: 0,
  /** "Support Removed" in nvml.h: drivers refuse to set it; it can only be read from old ones. */
  'exclusive-thread': 1,
  prohibited: 2,
  'exclusive-process': 3,
} as const;

export type ComputeMode = keyof typeof NVML_COMPUTE_MODE;
/** The modes a current driver can be asked to set. */
export type SettableComputeMode = Exclude<ComputeMode, 'exclusive-thread'>;

const NAMES: ReadonlyMap<number, ComputeMode> = new Map(
  (Object.entries(NVML_COMPUTE_MODE) as [ComputeMode, number][]).map(([name, value]) => [value, name]),
);

/** The name of an nvmlComputeMode_t value, or undefined for a value nvml.h does not define. */
export function computeModeName(value: number): ComputeMode | undefined {
  return NAMES.get(value);
}

/**
 * The GPU's compute mode. Throws NvmlError naming the GPU and the call: FUNCTION_NOT_FOUND when the
 * driver lacks the symbol, NVML's own code on failure (GPU_IS_LOST, NOT_SUPPORTED for a MIG device…),
 * UNKNOWN when the driver answers a value nvml.h does not define.
 */
export function getComputeMode(nvml: Nvml, h: DeviceHandle, gpu: GpuRef): ComputeMode {
  const out = [-1];
  nvml.check('nvmlDeviceGetComputeMode', nvml.callCode('nvmlDeviceGetComputeMode', h, out), gpu);
  const value = out[0] ?? -1;
  const mode = computeModeName(value);
  if (mode === undefined) {
    throw new NvmlError(
      'nvmlDeviceGetComputeMode',
      NVML.ERROR_UNKNOWN,
      `the driver answered compute mode ${value}, which nvml.h does not define ` +
        `(0 DEFAULT, 1 EXCLUSIVE_THREAD, 2 PROHIBITED, 3 EXCLUSIVE_PROCESS)`,
      gpu,
    );
  }
  return mode;
}

/**
 * Sets the GPU's compute mode (it takes effect at once and lasts until changed or the driver is
 * reloaded). Throws NvmlError naming the GPU, the call and the code; NO_PERMISSION says the
 * process must run as root.
 */
export function setComputeMode(nvml: Nvml, h: DeviceHandle, gpu: GpuRef, mode: SettableComputeMode): void {
  const value = NVML_COMPUTE_MODE[mode];
  const code = nvml.callCode('nvmlDeviceSetComputeMode', h, value);
  if (code === NVML.SUCCESS) return;
  const hint = code === NVML.ERROR_NO_PERMISSION ? '; setting a compute mode needs root' : '';
  throw new NvmlError(
    'nvmlDeviceSetComputeMode',
    code,
    `${nvml.errorText(code)} (setting ${mode.toUpperCase().replace('-', '_')}, ${value})${hint}`,
    gpu,
  );
}
