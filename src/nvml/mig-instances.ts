// Dynamic MIG's NVML calls, for the DRA sharing agent (mps/mig-partitions.ts's port): a parent GPU's GPU
// instances with their placements and compute instances, a GPU instance made at a placement, one compute
// instance spanning it, the MIG device of the pair (its UUID, and the minors of its two capability nodes from the
// driver's mig-minors), and both destroyed. Each failure throws an NvmlError naming the call, the GPU and NVML's
// code and text. Instances are looked up by id (GPU instances 1 to 14, compute instances 0 to 7), so no handle
// array crosses the FFI boundary. Creating and destroying need the mig/config capability: root's.
import { readFileSync } from 'node:fs';
import type { Gpu } from '../core/devices.ts';
import type { GiProfile, MigPlacement, PartitionableGpu } from '../core/dynamic-mig.ts';
import { MIG_MINORS_FILE, migProfileName, parseMigMinors } from '../core/mig.ts';
import { errorText } from '../system/log.ts';
import { NVML, NvmlError } from './errors.ts';
import type { DeviceHandle, Nvml } from './nvml.ts';

/** A GPU instance on a GPU now (what core/mig-instances.ts calls GpuInstanceNow). */
export interface GpuInstanceState {
  readonly gi: number;
  readonly profileId: number;
  readonly start: number;
  readonly size: number;
  readonly cis: readonly number[];
}

const MAX_GI_ID = 14;
const MAX_CI_ID = 7;
const MAX_PROFILE_INDEX = 32;
/** NVML_COMPUTE_INSTANCE_PROFILE_* of a compute instance of C slices: the one that spans a GPU instance. */
const FULL_CI_PROFILE: Readonly<Record<number, number>> = { 1: 0, 2: 1, 3: 2, 4: 3, 7: 4, 8: 5, 6: 6 };

export class NvmlMigInstances {
  private readonly nvml: Nvml;
  private readonly procRoot: string;

  constructor(nvml: Nvml, procRoot: string) {
    this.nvml = nvml;
    this.procRoot = procRoot;
  }

  private check(func: string, code: number, uuid: string): void {
    if (code !== NVML.SUCCESS) throw new NvmlError(func, code, this.nvml.errorText(code), { uuid });
  }

  /** The parent GPU's handle and minor, by its UUID. */
  private parent(uuid: string): { readonly h: DeviceHandle; readonly minor: number } {
    const count = this.nvml.deviceCount();
    for (let index = 0; index < count; index++) {
      const h = this.nvml.handleByIndex(index);
      if (this.nvml.uuid(h, { index }) === uuid) return { h, minor: this.nvml.minor(h, { index, uuid }) };
    }
    throw new NvmlError('nvmlDeviceGetUUID', NVML.ERROR_NOT_FOUND, `no GPU ${uuid} on this node`, { uuid });
  }

  private gpuInstance(h: DeviceHandle, gi: number): unknown {
    const out: unknown[] = [null];
    return this.nvml.callCode('nvmlDeviceGetGpuInstanceById', h, gi, out) === NVML.SUCCESS ? out[0] : null;
  }

  private computeInstance(gpuInstance: unknown, ci: number): unknown {
    const out: unknown[] = [null];
    return this.nvml.callCode('nvmlGpuInstanceGetComputeInstanceById', gpuInstance, ci, out) === NVML.SUCCESS
      ? out[0]
      : null;
  }

  async gpuInstances(parentUuid: string): Promise<GpuInstanceState[]> {
    const { h } = this.parent(parentUuid);
    const out: GpuInstanceState[] = [];
    for (let gi = 1; gi <= MAX_GI_ID; gi++) {
      const handle = this.gpuInstance(h, gi);
      if (handle === null) continue;
      const info = Buffer.alloc(24);
      this.check('nvmlGpuInstanceGetInfo', this.nvml.callCode('nvmlGpuInstanceGetInfo', handle, info), parentUuid);
      const cis: number[] = [];
      for (let ci = 0; ci <= MAX_CI_ID; ci++) if (this.computeInstance(handle, ci) !== null) cis.push(ci);
      out.push({
        gi,
        profileId: info.readUInt32LE(12),
        start: info.readUInt32LE(16),
        size: info.readUInt32LE(20),
        cis,
      });
    }
    return out;
  }

  async createGpuInstance(parentUuid: string, giProfileId: number, start: number, size: number): Promise<number> {
    const { h } = this.parent(parentUuid);
    const placement = Buffer.alloc(8);
    placement.writeUInt32LE(start, 0);
    placement.writeUInt32LE(size, 4);
    const out: unknown[] = [null];
    const code = this.nvml.callCode('nvmlDeviceCreateGpuInstanceWithPlacement', h, giProfileId, placement, out);
    this.check('nvmlDeviceCreateGpuInstanceWithPlacement', code, parentUuid);
    const info = Buffer.alloc(24);
    this.check('nvmlGpuInstanceGetInfo', this.nvml.callCode('nvmlGpuInstanceGetInfo', out[0], info), parentUuid);
    return info.readUInt32LE(8);
  }

  /** The GPU-instance profile's slice count, by its id (profile infos enumerated by NVML profile index). */
  private giSlices(h: DeviceHandle, profileId: number, parentUuid: string): number {
    const found = profileInfos(this.nvml, h).find((p) => p.info.readUInt32LE(0) === profileId);
    if (found !== undefined) return found.info.readUInt32LE(8);
    throw new NvmlError('nvmlDeviceGetGpuInstanceProfileInfo', NVML.ERROR_NOT_FOUND, `no profile ${profileId}`, {
      uuid: parentUuid,
    });
  }

  async createComputeInstance(parentUuid: string, gi: number): Promise<number> {
    const { h } = this.parent(parentUuid);
    const handle = this.gpuInstance(h, gi);
    if (handle === null)
      throw new NvmlError('nvmlDeviceGetGpuInstanceById', NVML.ERROR_NOT_FOUND, `no GPU instance ${gi}`, {
        uuid: parentUuid,
      });
    const info = Buffer.alloc(24);
    this.check('nvmlGpuInstanceGetInfo', this.nvml.callCode('nvmlGpuInstanceGetInfo', handle, info), parentUuid);
    const ciProfile = FULL_CI_PROFILE[this.giSlices(h, info.readUInt32LE(12), parentUuid)] ?? 0;
    const ids = (): number[] =>
      [...Array(MAX_CI_ID + 1).keys()].filter((c) => this.computeInstance(handle, c) !== null);
    const before = ids();
    const out: unknown[] = [null];
    const code = this.nvml.callCode('nvmlGpuInstanceCreateComputeInstance', handle, ciProfile, out);
    this.check('nvmlGpuInstanceCreateComputeInstance', code, parentUuid);
    // The new one's id: the one that was not there before (a GPU instance of ours holds one at most).
    const made = ids().find((c) => !before.includes(c));
    if (made === undefined)
      throw new NvmlError('nvmlGpuInstanceGetComputeInstanceById', NVML.ERROR_NOT_FOUND, 'the new compute instance', {
        uuid: parentUuid,
      });
    return made;
  }

  async migDevice(
    parentUuid: string,
    gi: number,
    ci: number,
  ): Promise<{ readonly uuid: string; readonly giCapMinor: number; readonly ciCapMinor: number }> {
    const { h, minor } = this.parent(parentUuid);
    const max = [0];
    this.check(
      'nvmlDeviceGetMaxMigDeviceCount',
      this.nvml.callCode('nvmlDeviceGetMaxMigDeviceCount', h, max),
      parentUuid,
    );
    for (let i = 0; i < (max[0] ?? 0); i++) {
      const mig: unknown[] = [null];
      if (this.nvml.callCode('nvmlDeviceGetMigDeviceHandleByIndex', h, i, mig) !== NVML.SUCCESS) continue;
      const ids = [[0], [0]] as const;
      if (this.nvml.callCode('nvmlDeviceGetGpuInstanceId', mig[0], ids[0]) !== NVML.SUCCESS) continue;
      if (this.nvml.callCode('nvmlDeviceGetComputeInstanceId', mig[0], ids[1]) !== NVML.SUCCESS) continue;
      if (ids[0][0] !== gi || ids[1][0] !== ci) continue;
      const uuid = this.nvml.uuid(mig[0] as DeviceHandle, { uuid: parentUuid });
      return { uuid, ...this.capMinors(parentUuid, minor, gi, ci) };
    }
    throw new NvmlError('nvmlDeviceGetMigDeviceHandleByIndex', NVML.ERROR_NOT_FOUND, `no MIG device ${gi}/${ci}`, {
      uuid: parentUuid,
    });
  }

  /** The minors of a GPU instance's and compute instance's capability nodes, from the driver's mig-minors. */
  private capMinors(uuid: string, minor: number, gi: number, ci: number): { giCapMinor: number; ciCapMinor: number } {
    const file = `${this.procRoot}${MIG_MINORS_FILE}`;
    const where = `GPU ${uuid} (minor ${minor}) GI ${gi} CI ${ci}`;
    let minors: Map<string, number>;
    try {
      minors = parseMigMinors(readFileSync(file, 'utf8'));
    } catch (err) {
      throw new Error(`cannot read the capability minors of ${where} from ${file}: ${errorText(err)}`);
    }
    const giCapMinor = minors.get(`gpu${minor}/gi${gi}/access`);
    const ciCapMinor = minors.get(`gpu${minor}/gi${gi}/ci${ci}/access`);
    if (giCapMinor === undefined || ciCapMinor === undefined)
      throw new Error(
        `${file} has no gpu${minor}/gi${gi}/access or gpu${minor}/gi${gi}/ci${ci}/access line for ${where}; ` +
          'the driver writes one for every possible instance',
      );
    return { giCapMinor, ciCapMinor };
  }

  async destroyComputeInstance(parentUuid: string, gi: number, ci: number): Promise<void> {
    const { h } = this.parent(parentUuid);
    const handle = this.gpuInstance(h, gi);
    const c = handle === null ? null : this.computeInstance(handle, ci);
    if (c === null) return;
    this.check('nvmlComputeInstanceDestroy', this.nvml.callCode('nvmlComputeInstanceDestroy', c), parentUuid);
  }

  async destroyGpuInstance(parentUuid: string, gi: number): Promise<void> {
    const { h } = this.parent(parentUuid);
    const handle = this.gpuInstance(h, gi);
    if (handle === null) return;
    this.check('nvmlGpuInstanceDestroy', this.nvml.callCode('nvmlGpuInstanceDestroy', handle), parentUuid);
  }
}

/** A profile's placements (nvmlGpuInstancePlacement_t: start, size, in memory slices); none when NVML has none. */
function placementsOf(nvml: Nvml, h: DeviceHandle, profileId: number): MigPlacement[] {
  const count = [0];
  const name = 'nvmlDeviceGetGpuInstancePossiblePlacements_v2';
  if (nvml.callCode(name, h, profileId, null, count) !== NVML.SUCCESS || (count[0] ?? 0) === 0) return [];
  const buf = Buffer.alloc(8 * (count[0] ?? 0));
  if (nvml.callCode(name, h, profileId, buf, count) !== NVML.SUCCESS) return [];
  return [...Array(count[0] ?? 0).keys()].map((i) => ({
    start: buf.readUInt32LE(8 * i),
    size: buf.readUInt32LE(8 * i + 4),
  }));
}

/**
 * The GPU's GPU-instance profile infos (nvmlGpuInstanceProfileInfo_t, 48 bytes) with the NVML profile index each
 * was read at: indexes from 0 until INVALID_ARGUMENT (nvml.h's rule), a profile the GPU lacks (NOT_SUPPORTED, or
 * another failure) left out.
 */
export function profileInfos(nvml: Nvml, h: DeviceHandle): { readonly index: number; readonly info: Buffer }[] {
  const out: { index: number; info: Buffer }[] = [];
  for (let index = 0; index < MAX_PROFILE_INDEX; index++) {
    const info = Buffer.alloc(48);
    const code = nvml.callCode('nvmlDeviceGetGpuInstanceProfileInfo', h, index, info);
    if (code === NVML.ERROR_INVALID_ARGUMENT) break;
    if (code === NVML.SUCCESS) out.push({ index, info });
  }
  return out;
}

/** The GPU's GPU-instance profiles with their placements. */
function profilesOf(nvml: Nvml, h: DeviceHandle, gpu: Gpu): GiProfile[] {
  const out: GiProfile[] = [];
  for (const { index: i, info: b } of profileInfos(nvml, h)) {
    const slices = b.readUInt32LE(8);
    const memoryMiB = Number(b.readBigUInt64LE(40));
    const name = migProfileName({
      giSlices: slices,
      ciSlices: slices,
      memoryMiB,
      parentMemoryBytes: gpu.memoryBytes,
      profileIndex: i,
    });
    const id = b.readUInt32LE(0);
    out.push({
      id,
      name,
      multiprocessors: b.readUInt32LE(16),
      copyEngines: b.readUInt32LE(20),
      decoders: b.readUInt32LE(24),
      encoders: b.readUInt32LE(28),
      jpegEngines: b.readUInt32LE(32),
      ofaEngines: b.readUInt32LE(36),
      memoryMiB,
      placements: placementsOf(nvml, h, id),
    });
  }
  return out;
}

/**
 * What dynamic MIG needs of a MIG-mode GPU: its profiles with their placements and its GPU instances (made by
 * anyone, a compute instance in them or not); null when this driver has no placement call.
 */
export function readPartitionable(nvml: Nvml, h: DeviceHandle, gpu: Gpu): PartitionableGpu | null {
  if (!nvml.has('nvmlDeviceGetGpuInstancePossiblePlacements_v2', true)) return null;
  const instances = [];
  for (let gi = 1; gi <= MAX_GI_ID; gi++) {
    const out: unknown[] = [null];
    if (nvml.callCode('nvmlDeviceGetGpuInstanceById', h, gi, out) !== NVML.SUCCESS) continue;
    const info = Buffer.alloc(24);
    if (nvml.callCode('nvmlGpuInstanceGetInfo', out[0], info) !== NVML.SUCCESS) continue;
    const placement = { start: info.readUInt32LE(16), size: info.readUInt32LE(20) };
    instances.push({ giId: gi, profileId: info.readUInt32LE(12), placement });
  }
  return { profiles: profilesOf(nvml, h, gpu).filter((p) => p.placements.length > 0), instances };
}
