// MIG discovery through NVML: each GPU's MIG mode (current and pending), and each MIG
// device with its UUID, parent, GPU- and compute-instance ids, attributes and NVIDIA's profile name.
// Every MIG symbol is bound lazily: a driver without them loses MIG, with one log line. Also the
// driver's /proc/driver/nvidia-caps/mig-minors, for the MIG devices' capability nodes.
import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import type { Gpu } from '../core/devices.ts';
import { MIG_MINORS_FILE, migCapabilityNodes, migProfileName, parseMigMinors } from '../core/mig.ts';
import type { MigDevice, MigEngines, MigLayout, MigMode } from '../core/mig.ts';
import type { PartitionableGpu } from '../core/dynamic-mig.ts';
import type { Logger } from '../system/log.ts';
import { errorText } from '../system/log.ts';
import { NVML, NvmlError } from './errors.ts';
import { profileInfos, readPartitionable } from './mig-instances.ts';
import { PROFILE_MIG_SYMBOLS, REQUIRED_MIG_SYMBOLS } from './mig-symbols.ts';
import type { DeviceHandle, Nvml } from './nvml.ts';

/** nvmlDeviceAttributes_t as decoded from its 40 bytes. */
export interface MigAttributes {
  multiprocessorCount: number;
  engines: MigEngines;
  gpuInstanceSliceCount: number;
  computeInstanceSliceCount: number;
  memorySizeMB: number;
}

/** Whether this NVML has what MIG discovery needs (quietly: the caller logs one line if not). */
export function nvmlHasMig(nvml: Nvml): { ok: true } | { ok: false; missing: string } {
  for (const name of REQUIRED_MIG_SYMBOLS) if (!nvml.has(name, true)) return { ok: false, missing: name };
  return { ok: true };
}

function attributes(nvml: Nvml, h: DeviceHandle): MigAttributes | number {
  const buf = Buffer.alloc(40);
  const code = nvml.callCode('nvmlDeviceGetAttributes_v2', h, buf);
  if (code !== NVML.SUCCESS) return code;
  return {
    multiprocessorCount: buf.readUInt32LE(0),
    engines: {
      copy: buf.readUInt32LE(4),
      decoder: buf.readUInt32LE(8),
      encoder: buf.readUInt32LE(12),
      jpeg: buf.readUInt32LE(16),
      ofa: buf.readUInt32LE(20),
    },
    gpuInstanceSliceCount: buf.readUInt32LE(24),
    computeInstanceSliceCount: buf.readUInt32LE(28),
    memorySizeMB: Number(buf.readBigUInt64LE(32)),
  };
}

/** GPU-instance profile id → NVML profile index, for one parent (null when the driver cannot say). */
function profileIndexTable(nvml: Nvml, parent: DeviceHandle): Map<number, number> | null {
  if (!PROFILE_MIG_SYMBOLS.every((s) => nvml.has(s, true))) return null;
  return new Map(profileInfos(nvml, parent).map((p) => [p.info.readUInt32LE(0), p.index]));
}

/** What nvmlGpuInstanceGetInfo says of the GPU instance a MIG device lives in. */
interface GiInfo {
  /** GPU-instance profile id (NVML_GPU_INSTANCE_PROFILE_* value as nvidia-smi shows it: 19 for 1g.10gb). */
  readonly profileId: number;
  /** First memory slice of the instance's placement, and how many memory slices it spans. */
  readonly placementStart: number;
  readonly placementSize: number;
}

/**
 * The GPU instance's info (nvmlGpuInstanceInfo_t, 24 bytes: device pointer, id, profileId, then
 * placement {start, size}), or null when the driver cannot say.
 */
function giInfo(nvml: Nvml, parent: DeviceHandle, gi: number): GiInfo | null {
  if (!nvml.has('nvmlDeviceGetGpuInstanceById', true) || !nvml.has('nvmlGpuInstanceGetInfo', true)) return null;
  const out: unknown[] = [null];
  if (nvml.callCode('nvmlDeviceGetGpuInstanceById', parent, gi, out) !== NVML.SUCCESS) return null;
  const info = Buffer.alloc(24);
  if (nvml.callCode('nvmlGpuInstanceGetInfo', out[0], info) !== NVML.SUCCESS) return null;
  return {
    profileId: info.readUInt32LE(12),
    placementStart: info.readUInt32LE(16),
    placementSize: info.readUInt32LE(20),
  };
}

function readMode(nvml: Nvml, h: DeviceHandle, gpu: Gpu, log: Logger): MigMode | null {
  const current = [0];
  const pending = [0];
  const code = nvml.callCode('nvmlDeviceGetMigMode', h, current, pending);
  if (code === NVML.ERROR_NOT_SUPPORTED) return null;
  if (code !== NVML.SUCCESS) {
    log.warn('cannot read MIG mode; the GPU is taken as not MIG-capable', {
      gpu: gpu.index,
      uuid: gpu.uuid,
      error: new NvmlError('nvmlDeviceGetMigMode', code, nvml.errorText(code)).message,
    });
    return null;
  }
  return { current: current[0] === 1, pending: pending[0] === 1 };
}

/**
 * MIG device `index` of GPU `gpu` (at position `parent`, handle `h`) through its handle `m`; throws NvmlError when a
 * call fails. `profileTable` gives the parent's profile-index table, looked up once it is needed.
 */
function readMigDevice(
  nvml: Nvml,
  gpu: Gpu,
  at: { readonly parent: number; readonly h: DeviceHandle; readonly index: number; readonly m: DeviceHandle },
  profileTable: () => Map<number, number> | null,
): MigDevice {
  const { parent, h, index, m } = at;
  const uuid = nvml.uuid(m, { index: gpu.index, uuid: gpu.uuid });
  const ids = { gi: [0], ci: [0] };
  for (const [fnName, arr] of [
    ['nvmlDeviceGetGpuInstanceId', ids.gi],
    ['nvmlDeviceGetComputeInstanceId', ids.ci],
  ] as const) {
    nvml.check(fnName, nvml.callCode(fnName, m, arr), { index: gpu.index, uuid });
  }
  const attrs = attributes(nvml, m);
  if (typeof attrs === 'number')
    throw new NvmlError('nvmlDeviceGetAttributes_v2', attrs, nvml.errorText(attrs), { index: gpu.index, uuid });
  const gi = ids.gi[0] ?? 0;
  const table = profileTable();
  const info = giInfo(nvml, h, gi);
  return {
    parent,
    index,
    uuid,
    gi,
    ci: ids.ci[0] ?? 0,
    profile: migProfileName({
      giSlices: attrs.gpuInstanceSliceCount,
      ciSlices: attrs.computeInstanceSliceCount,
      memoryMiB: attrs.memorySizeMB,
      parentMemoryBytes: gpu.memoryBytes,
      profileIndex: info === null || table === null ? null : (table.get(info.profileId) ?? null),
    }),
    ...(info === null
      ? {}
      : { giProfileId: info.profileId, placementStart: info.placementStart, placementSize: info.placementSize }),
    giSlices: attrs.gpuInstanceSliceCount,
    ciSlices: attrs.computeInstanceSliceCount,
    memoryBytes: attrs.memorySizeMB * 1024 * 1024,
    multiprocessors: attrs.multiprocessorCount,
    engines: attrs.engines,
  };
}

/**
 * The MIG devices of one MIG-enabled GPU (position `parent`, handle `h`). A device that cannot be read is logged and
 * left out; when the devices cannot even be counted, none are kept.
 */
function gpuMigDevices(nvml: Nvml, gpu: Gpu, parent: number, h: DeviceHandle, log: Logger): MigDevice[] {
  const max = [0];
  const mc = nvml.callCode('nvmlDeviceGetMaxMigDeviceCount', h, max);
  if (mc !== NVML.SUCCESS) {
    log.warn('cannot count MIG devices; none are advertised for this GPU', {
      gpu: gpu.index,
      uuid: gpu.uuid,
      error: new NvmlError('nvmlDeviceGetMaxMigDeviceCount', mc, nvml.errorText(mc)).message,
    });
    return [];
  }
  const devices: MigDevice[] = [];
  let table: Map<number, number> | null | undefined;
  const profileTable = (): Map<number, number> | null => {
    table ??= profileIndexTable(nvml, h);
    return table;
  };
  for (let index = 0; index < (max[0] ?? 0); index++) {
    const out: unknown[] = [null];
    const code = nvml.callCode('nvmlDeviceGetMigDeviceHandleByIndex', h, index, out);
    if (code === NVML.ERROR_NOT_FOUND || code === NVML.ERROR_INVALID_ARGUMENT) continue;
    try {
      if (code !== NVML.SUCCESS)
        throw new NvmlError('nvmlDeviceGetMigDeviceHandleByIndex', code, nvml.errorText(code), {
          index: gpu.index,
          uuid: gpu.uuid,
        });
      devices.push(readMigDevice(nvml, gpu, { parent, h, index, m: out[0] as DeviceHandle }, profileTable));
    } catch (err) {
      if (!(err instanceof NvmlError)) throw err;
      log.error('MIG device cannot be read and is not advertised', {
        gpu: gpu.index,
        uuid: gpu.uuid,
        mig_index: index,
        error: err.message,
      });
    }
  }
  return devices;
}

/**
 * The MIG layout of these GPUs (positions as in `gpus`/`handles`), or null when this NVML has no
 * MIG functions (then one line is logged and MIG is off). A MIG device that cannot be read is
 * logged and left out; the others are kept.
 */
export function discoverMig(
  nvml: Nvml,
  gpus: readonly Gpu[],
  handles: readonly DeviceHandle[],
  log: Logger,
): MigLayout | null {
  const has = nvmlHasMig(nvml);
  if (!has.ok) {
    log.warn('this NVIDIA driver has no MIG functions; MIG is off and every GPU is advertised whole', {
      missing: has.missing,
      library: nvml.libraryPath,
    });
    return null;
  }
  const modes: (MigMode | null)[] = [];
  const devices: MigDevice[] = [];
  const partitionable = new Map<string, PartitionableGpu>();
  gpus.forEach((gpu, parent) => {
    const h = handles[parent];
    if (h === undefined) {
      modes.push(null);
      return;
    }
    const mode = readMode(nvml, h, gpu, log);
    modes.push(mode);
    if (mode === null || !mode.current) return;
    devices.push(...gpuMigDevices(nvml, gpu, parent, h, log));
    const p = readPartitionable(nvml, h, gpu);
    if (p !== null) partitionable.set(gpu.uuid, p);
  });
  return { modes, devices, ...(partitionable.size > 0 ? { partitionable } : {}) };
}

/** The driver's mig-minors under the proc root (PROC_ROOT, default /proc), for the MIG capability device nodes. */
export function migMinorsPath(env: Readonly<Record<string, string | undefined>> = process.env): string {
  return join(env.PROC_ROOT || '/proc', MIG_MINORS_FILE);
}

/**
 * The capability nodes of every MIG device by MIG UUID, from mig-minors (a small /proc file, read
 * synchronously like the NVML calls of a scan), or why they cannot be had.
 */
export function readMigCapabilities(
  gpus: readonly Gpu[],
  layout: MigLayout,
  env: Readonly<Record<string, string | undefined>> = process.env,
): Map<string, readonly string[]> | { problem: string } {
  if (layout.devices.length === 0) return new Map();
  const file = migMinorsPath(env);
  let text: string;
  try {
    text = readFileSync(file, 'utf8');
  } catch (err) {
    return {
      problem:
        `cannot read ${file} (${errorText(err)}), which --pass-device-specs needs ` +
        `for the MIG devices' capability nodes; is the NVIDIA driver loaded with MIG support?`,
    };
  }
  try {
    return migCapabilityNodes(gpus, layout.devices, parseMigMinors(text));
  } catch (err) {
    return { problem: `${file}: ${errorText(err)}` };
  }
}
