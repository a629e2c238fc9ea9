// DRA's checkpoint of prepared claims, pure: its records, its JSON (written and parsed, every field checked), the
// boot-ID rule (records of another boot no longer count), which devices its claims hold (a device another claim
// holds, the dynamic MIG partitions). Reading and writing the file is src/dra/checkpoint.ts's.
import { shareFields } from './dra-claims.ts';
import type { AllocatedDevice, DeviceSharing, PartitionOf } from './dra-claims.ts';
import { checkSharing } from './dra-gpu-config.ts';
import type { GpuSharing } from './dra-gpu-config.ts';
import { isObject, isStringList, isStringMap } from './json.ts';

export type PrepareState = 'PrepareStarted' | 'PrepareCompleted';

/** One prepared device as answered to the kubelet. */
export interface PreparedDevice {
  readonly requests: readonly string[];
  readonly pool: string;
  readonly device: string;
  readonly cdiDeviceIds: readonly string[];
  /** How the allocation shares the device (absent: this claim has it to itself). */
  readonly shared?: DeviceSharing;
  /** The allocation's shareID (absent: not a share; and in older records). */
  readonly shareId?: string;
  /** The capacity the share consumes, quantities as the API server wrote them (absent in older records). */
  readonly consumedCapacity?: Readonly<Record<string, string>>;
  /** The sharing configuration that applies to the device (absent: none; and in older records). */
  readonly sharing?: GpuSharing;
  /** A dynamic MIG partition: where it is carved (absent: a device that exists on its own). */
  readonly partition?: PartitionOf;
}

export interface ClaimRecord {
  readonly state: PrepareState;
  readonly namespace: string;
  readonly name: string;
  readonly devices: readonly PreparedDevice[];
  /** When the prepare completed (ISO 8601), for `info`; absent in older records. */
  readonly preparedAt?: string;
}

export interface Checkpoint {
  /** The node's boot ID when the records were written. */
  readonly bootId: string;
  /** By claim UID. */
  readonly claims: Readonly<Record<string, ClaimRecord>>;
}

export const CHECKPOINT_VERSION = 'gpu-device-plugin.dra/v1';

export function serializeCheckpoint(c: Checkpoint): string {
  return `${JSON.stringify({ version: CHECKPOINT_VERSION, bootId: c.bootId, claims: c.claims }, null, 1)}\n`;
}

/** One prepared device of a checkpoint's claim record; throws naming what is wrong. */
function isPartition(v: unknown): v is PartitionOf {
  const int = (n: unknown): boolean => typeof n === 'number' && Number.isInteger(n) && n >= 0;
  return isObject(v) && typeof v.parentUuid === 'string' && int(v.giProfileId) && int(v.start) && int(v.size);
}

function parseDevice(uid: string, d: unknown): PreparedDevice {
  if (
    !isObject(d) ||
    !isStringList(d.requests) ||
    typeof d.pool !== 'string' ||
    typeof d.device !== 'string' ||
    !isStringList(d.cdiDeviceIds)
  ) {
    throw new Error(`claim ${uid}: a device lacks requests, pool, device or cdiDeviceIds`);
  }
  const { requests, pool, device, cdiDeviceIds, shared, shareId, consumedCapacity, sharing } = d;
  const bad = (what: string): Error => new Error(`claim ${uid}: device ${device}: ${what}`);
  if (shared !== undefined && shared !== 'adminAccess' && shared !== 'shareID')
    throw bad('shared is neither adminAccess nor shareID');
  if (shareId !== undefined && typeof shareId !== 'string') throw bad('shareId is not a string');
  if (consumedCapacity !== undefined && !isStringMap(consumedCapacity))
    throw bad('consumedCapacity is not a map of quantities (strings)');
  const wrong = sharing === undefined ? null : checkSharing(sharing);
  if (wrong !== null) throw bad(`sharing ${wrong}`);
  const fields = {
    shared: shared as DeviceSharing | undefined,
    shareId,
    consumedCapacity,
    sharing: sharing as GpuSharing | undefined,
  };
  const part = d.partition;
  if (part !== undefined && !isPartition(part)) throw bad('partition needs parentUuid, giProfileId, start and size');
  return {
    requests,
    pool,
    device,
    cdiDeviceIds,
    ...shareFields(fields),
    ...(part === undefined ? {} : { partition: part }),
  };
}

/** Parses a checkpoint file's text; throws naming what is wrong. */
export function parseCheckpoint(text: string): Checkpoint {
  let doc: unknown;
  try {
    doc = JSON.parse(text);
  } catch (err) {
    throw new Error(`not JSON: ${(err as Error).message}`);
  }
  if (!isObject(doc)) throw new Error('not a JSON object');
  if (doc.version !== CHECKPOINT_VERSION)
    throw new Error(`version is ${JSON.stringify(doc.version)}, expected ${JSON.stringify(CHECKPOINT_VERSION)}`);
  const bootId = doc.bootId;
  if (typeof bootId !== 'string') throw new Error('bootId is not a string');
  const raw = doc.claims;
  if (!isObject(raw)) throw new Error('claims is not an object');
  const claims: Record<string, ClaimRecord> = {};
  for (const [uid, r] of Object.entries(raw)) {
    if (!isObject(r)) throw new Error(`claim ${uid} is not an object`);
    const { state, namespace, name, devices, preparedAt } = r;
    if (state !== 'PrepareStarted' && state !== 'PrepareCompleted')
      throw new Error(`claim ${uid}: state ${JSON.stringify(state)} is neither PrepareStarted nor PrepareCompleted`);
    if (typeof namespace !== 'string' || typeof name !== 'string')
      throw new Error(`claim ${uid}: namespace and name must be strings`);
    if (!Array.isArray(devices)) throw new Error(`claim ${uid}: devices is not a list`);
    const out = devices.map((d: unknown) => parseDevice(uid, d));
    claims[uid] = { state, namespace, name, devices: out, ...(typeof preparedAt === 'string' ? { preparedAt } : {}) };
  }
  return { bootId, claims };
}

/** The records that still count on a node booted as `bootId`: none if the checkpoint is of another boot. */
export function checkpointForBoot(c: Checkpoint | null, bootId: string): { checkpoint: Checkpoint; voided: number } {
  if (c === null) return { checkpoint: { bootId, claims: {} }, voided: 0 };
  if (c.bootId !== bootId) return { checkpoint: { bootId, claims: {} }, voided: Object.keys(c.claims).length };
  return { checkpoint: c, voided: 0 };
}

/** Whether two uses of one device may stand together: either is an admin's, or both are shares. */
function compatible(a: DeviceSharing | undefined, b: DeviceSharing | undefined): boolean {
  return a === 'adminAccess' || b === 'adminAccess' || (a === 'shareID' && b === 'shareID');
}

/**
 * Why claim `uid` may not have `devices`: the first one another claim of the checkpoint holds (being
 * prepared or prepared) in a way the two uses cannot stand together. Null when none is.
 */
export function deviceHeldElsewhere(c: Checkpoint, uid: string, devices: readonly AllocatedDevice[]): string | null {
  for (const d of devices) {
    for (const [other, record] of Object.entries(c.claims)) {
      const held = record.devices.find((x) => x.device === d.device && x.pool === d.pool);
      if (other === uid || held === undefined || compatible(d.shared, held.shared)) continue;
      const how = record.state === 'PrepareCompleted' ? 'already prepared' : 'being prepared';
      return (
        `device ${d.device} is ${how} for claim ${record.namespace}/${record.name} (uid ${other}): a device ` +
        `serves one claim at a time unless its allocation shares it (adminAccess, or a shareID of a device that ` +
        `allows multiple allocations); the kubelet asks again, which succeeds once that claim is unprepared`
      );
    }
  }
  return null;
}

/** The dynamic MIG partitions the records hold, by device name. */
export function claimedPartitions(records: Iterable<ClaimRecord>): Set<string> {
  const out = new Set<string>();
  for (const r of records) for (const d of r.devices) if (d.partition !== undefined) out.add(d.device);
  return out;
}
