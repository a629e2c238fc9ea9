// DRA sharing on the host, pure: what a prepared claim asks of the host — the time-slice of each whole GPU it
// shares by TimeSlicing, an MPS control daemon of its own for the units it shares by MPS, with its limits —
// written as a request for the MPS unit's agent (the plugin has no privilege to do either), the agent's
// answer, where a claim's daemon lives under the MPS root, and the CDI spec that brings that daemon's pipe
// and shared memory into the claim's containers. Writing and watching the files is src/dra/'s and src/mps/'s.
//
// MPS LIMITS. A claim's daemon is its own, so its default limits are the claim's and no other claim's
// client shares its MPS server: a container reaches only its claim's pipe directory and cannot change
// what the daemon gives each client. Per unit, the pinned-memory limit is the claim's per-device limit
// (by UUID, or by index into the sorted UUIDs its configuration applies to), else its default; on a
// share of a device that allows multiple allocations, it is never above the share's consumed `memory`
// capacity. A unit without either limit gets its whole memory. Active threads: the claim's percentage,
// else 100. A dynamic MIG partition's unit is named by its device name (also its per-device key), since its MIG
// UUID exists only once the agent has made the instance; the agent resolves it then (core/dra-admission.ts).
//
// COMPUTE MODE. A whole GPU the claim has to itself is put in EXCLUSIVE_PROCESS while its daemon runs, as
// the device-plugin's MPS does; a GPU shared with other claims (a shareID) stays as it is, since another
// claim's daemon or process may use it too, and a MIG device has no compute mode of its own.
import { mpsKeyOf } from './dra-claims.ts';
import type { DraNodeDevice, PartitionOf } from './dra-claims.ts';
import { perDeviceLimits } from './dra-gpu-config.ts';
import type { GpuSharing, MpsSharing, TimeSliceInterval } from './dra-gpu-config.ts';
import { timeSliceConflict, wantedTimeSlices } from './dra-timeslice.ts';
import type { TimeSliceClaimDevice } from './dra-timeslice.ts';
import { isObject } from './json.ts';
import { parseMadePartition, parsePartition, parsePartitionMpsUnit } from './mig-instances.ts';
import type { MadePartition, PartitionMpsUnit, PartitionRequest } from './mig-instances.ts';
import { parseQuantity } from './quantity.ts';

/** One device of a claim as prepared, with what sharing asks of the host. */
export interface SharedDevice {
  readonly device: string;
  /** A dynamic MIG partition as recorded at allocation (it keeps its place once the instance exists). */
  readonly partition?: PartitionOf;
  readonly sharing?: GpuSharing;
  readonly shareId?: string;
  readonly consumedCapacity?: Readonly<Record<string, string>>;
}

/** A device of this node with its memory (a GPU's, or a MIG device's own). */
export type HostDevice = DraNodeDevice & { readonly memoryBytes: number };

export interface ClaimName {
  readonly namespace: string;
  readonly name: string;
  readonly uid: string;
}

/** One unit (a whole GPU, or a MIG device) an MPS daemon serves. */
export interface HostMpsUnit {
  /** The GPU's or MIG device's UUID: what the daemon's CUDA_VISIBLE_DEVICES names. */
  readonly uuid: string;
  /** The whole GPU's NVML index, for its compute mode; absent for a MIG device. */
  readonly gpuIndex?: number;
  readonly pinnedMemLimitMiB: number;
}

export interface HostMps {
  readonly activeThreadPercentage: number;
  /** Whole GPUs the claim has to itself: EXCLUSIVE_PROCESS while the daemon runs. */
  readonly exclusive: boolean;
  readonly units: readonly HostMpsUnit[];
  /** Dynamic MIG partitions of the same request the daemon serves too (after `units`), by device name. */
  readonly partitionUnits?: readonly PartitionMpsUnit[];
}

/** What one claim asks of the host. */
export interface HostRequest {
  readonly claim: ClaimName;
  /** Whole GPUs and the time-slice each must have while the claim is prepared. */
  readonly timeSlices: readonly { readonly uuid: string; readonly interval: TimeSliceInterval }[];
  readonly mps?: HostMps;
  /** Dynamic MIG: the partitions to carve for the claim while it is prepared (core/mig-instances.ts). */
  readonly partitions?: readonly PartitionRequest[];
}

export const HOST_REQUEST_VERSION = 'gpu-device-plugin.dra-sharing/v1';
const MIB = 1024 * 1024;

/** Where a claim's daemon lives: its own MPS root (pipe and log under `<root>/mps`, its shm at `<root>/shm`). */
export function claimMpsRoot(mpsRoot: string, uid: string): string {
  return `${mpsRoot}/dra/claims/${uid}`;
}

/** The resource name of a claim's daemon under its root (so its pipe is `<claim root>/mps/pipe`). */
export const CLAIM_MPS_RESOURCE = 'mps';

/** Where the plugin writes requests, one `<uid>.json` each. */
export function requestDir(mpsRoot: string): string {
  return `${mpsRoot}/dra/requests`;
}

/** Where the agent answers, one `<uid>.json` each. */
export function answerDir(mpsRoot: string): string {
  return `${mpsRoot}/dra/answers`;
}

/** The name the node's MPS daemon states know a claim's daemon by. */
export function claimDaemonName(c: ClaimName): string {
  return `claim ${c.namespace}/${c.name} (${c.uid})`;
}

/**
 * What a device's per-device MPS limit is keyed by (dra-claims.ts's mpsKeyOf): a partition by its device name, also
 * when the node no longer lists it (its instance made, the placement is no longer free); undefined: not on the node.
 */
function keyOf(d: SharedDevice, node: readonly HostDevice[]): string | undefined {
  if (d.partition !== undefined) return d.device;
  const dev = node.find((n) => n.name === d.device);
  return dev === undefined ? undefined : mpsKeyOf(dev);
}

/**
 * The pinned-memory limit of each MPS unit by its key (keyOf), per MPS configuration (core/dra-gpu-config.ts's
 * rule: per-device keys are UUIDs, or indices into the UUIDs one configuration applies to, sorted).
 */
function mpsLimits(
  devices: readonly SharedDevice[],
  node: readonly HostDevice[],
): { readonly limits: Map<string, number> } | { readonly error: string } {
  const groups = new Map<string, { sharing: MpsSharing; uuids: string[] }>();
  for (const d of devices) {
    if (d.sharing?.strategy !== 'MPS') continue;
    const unit = keyOf(d, node);
    if (unit === undefined) continue;
    const key = JSON.stringify(d.sharing);
    const g = groups.get(key) ?? { sharing: d.sharing, uuids: [] };
    g.uuids.push(unit);
    groups.set(key, g);
  }
  const limits = new Map<string, number>();
  for (const g of groups.values()) {
    const r = perDeviceLimits(g.sharing, g.uuids);
    if ('error' in r) return { error: `defaultPerDevicePinnedMemoryLimit["${r.key}"] ${r.error}` };
    for (const [uuid, bytes] of Object.entries(r.limits)) limits.set(uuid, bytes);
  }
  return { limits };
}

/**
 * What a claim asks of the host, or null when it asks nothing (no device of it shares by TimeSlicing or MPS
 * on something the host sets up); an error names a device this node does not have or a share without
 * a memory the daemon could enforce.
 */
export function hostRequest(
  claim: ClaimName,
  devices: readonly SharedDevice[],
  node: readonly HostDevice[],
): HostRequest | null | { error: string } {
  const timeSlices: { uuid: string; interval: TimeSliceInterval }[] = [];
  const units: HostMpsUnit[] = [];
  const limits = mpsLimits(devices, node);
  if ('error' in limits) return limits;
  let threads: number | undefined;
  let exclusive = true;
  const partitions: PartitionRequest[] = [];
  const partitionUnits: PartitionMpsUnit[] = [];
  for (const d of devices) {
    const dev = node.find((n) => n.name === d.device);
    const part =
      d.partition ?? (dev?.partition === undefined ? undefined : { parentUuid: dev.gpuUuid, ...dev.partition });
    if (part !== undefined) {
      // Its daemon's unit is named by the partition: the agent resolves it to the MIG UUID once it made the instance.
      if (d.sharing !== undefined && d.sharing.strategy !== 'MPS')
        return { error: `device ${d.device}: a dynamic MIG partition has no time-slice of its own; it shares by MPS` };
      partitions.push({ device: d.device, ...part });
      if (d.sharing === undefined) continue;
      exclusive = false;
      threads = Math.min(threads ?? 100, d.sharing.defaultActiveThreadPercentage ?? 100);
      const bytes = limits.limits.get(d.device);
      const limit = bytes === undefined ? {} : { pinnedMemLimitMiB: Math.max(1, Math.floor(bytes / MIB)) };
      partitionUnits.push({ partition: d.device, ...limit });
      continue;
    }
    if (d.sharing === undefined) continue;
    if (dev === undefined) return { error: `device ${d.device} is not on this node now` };
    if (d.sharing.strategy === 'TimeSlicing') {
      // A MIG device has no time-slice of its own: its GPU instance's engines are its alone.
      if (dev.mig === undefined) timeSlices.push({ uuid: dev.gpuUuid, interval: d.sharing.interval });
      continue;
    }
    let bytes = limits.limits.get(dev.mig?.uuid ?? dev.gpuUuid) ?? dev.memoryBytes;
    const consumed = d.consumedCapacity?.memory;
    if (d.shareId !== undefined && consumed !== undefined) {
      const share = parseQuantity(consumed);
      if (share === null || share === 0)
        return { error: `device ${d.device}: the consumed memory ${JSON.stringify(consumed)} is no positive quantity` };
      bytes = Math.min(bytes, share);
    }
    if (d.shareId !== undefined || dev.mig !== undefined) exclusive = false;
    threads = Math.min(threads ?? 100, d.sharing.defaultActiveThreadPercentage ?? 100);
    units.push({
      uuid: dev.mig?.uuid ?? dev.gpuUuid,
      ...(dev.mig === undefined ? { gpuIndex: dev.gpuIndex } : {}),
      pinnedMemLimitMiB: Math.max(1, Math.floor(bytes / MIB)),
    });
  }
  if (timeSlices.length === 0 && units.length === 0 && partitions.length === 0) return null;
  const byPartition = partitionUnits.length === 0 ? {} : { partitionUnits };
  const mps =
    threads === undefined ? {} : { mps: { activeThreadPercentage: threads, exclusive, units, ...byPartition } };
  // The claim as three fields in one order, whatever object named it: requests are compared as JSON.
  const name = { namespace: claim.namespace, name: claim.name, uid: claim.uid };
  return { claim: name, timeSlices, ...mps, ...(partitions.length === 0 ? {} : { partitions }) };
}

// ---- the request and answer files ----

/** A request as the plugin writes it: `id` changes with every write, the agent's answer names it. */
export interface RequestFile {
  readonly id: string;
  readonly request: HostRequest;
}

export function serializeRequest(r: RequestFile): string {
  return `${JSON.stringify({ version: HOST_REQUEST_VERSION, ...r }, null, 1)}\n`;
}

const INTERVALS: readonly string[] = ['Default', 'Short', 'Medium', 'Long'];

function parseUnit(u: unknown, at: string): HostMpsUnit {
  if (!isObject(u) || typeof u.uuid !== 'string' || typeof u.pinnedMemLimitMiB !== 'number')
    throw new Error(`${at}: needs uuid (string) and pinnedMemLimitMiB (number)`);
  if (u.gpuIndex !== undefined && typeof u.gpuIndex !== 'number') throw new Error(`${at}.gpuIndex: not a number`);
  const { uuid, pinnedMemLimitMiB, gpuIndex } = u;
  return { uuid, pinnedMemLimitMiB, ...(gpuIndex === undefined ? {} : { gpuIndex }) };
}

function parseMps(m: unknown): HostMps {
  if (!isObject(m) || typeof m.activeThreadPercentage !== 'number' || typeof m.exclusive !== 'boolean')
    throw new Error('request.mps: needs activeThreadPercentage (number), exclusive (boolean) and units');
  if (!Array.isArray(m.units)) throw new Error('request.mps.units: not a list');
  if (m.partitionUnits !== undefined && !Array.isArray(m.partitionUnits))
    throw new Error('request.mps.partitionUnits: not a list');
  const units = m.units.map((u, i) => parseUnit(u, `request.mps.units[${i}]`));
  const partitionUnits = (m.partitionUnits ?? []).map((u, i) =>
    parsePartitionMpsUnit(u, `request.mps.partitionUnits[${i}]`),
  );
  if (units.length + partitionUnits.length === 0) throw new Error('request.mps: names no unit (units, partitionUnits)');
  const byPartition = m.partitionUnits === undefined ? {} : { partitionUnits };
  return { activeThreadPercentage: m.activeThreadPercentage, exclusive: m.exclusive, units, ...byPartition };
}

/** A request file's text, checked; throws naming what is wrong. */
export function parseRequest(text: string): RequestFile {
  const doc: unknown = JSON.parse(text);
  if (!isObject(doc) || doc.version !== HOST_REQUEST_VERSION)
    throw new Error(`not a request of version ${HOST_REQUEST_VERSION}`);
  const { id, request } = doc;
  if (typeof id !== 'string' || !isObject(request)) throw new Error('needs id (string) and request (object)');
  const c = request.claim;
  if (!isObject(c) || typeof c.namespace !== 'string' || typeof c.name !== 'string' || typeof c.uid !== 'string')
    throw new Error('request.claim: needs namespace, name and uid');
  if (!Array.isArray(request.timeSlices)) throw new Error('request.timeSlices: not a list');
  const timeSlices = request.timeSlices.map((t, i) => {
    if (!isObject(t) || typeof t.uuid !== 'string' || typeof t.interval !== 'string' || !INTERVALS.includes(t.interval))
      throw new Error(`request.timeSlices[${i}]: needs uuid and interval (${INTERVALS.join(', ')})`);
    return { uuid: t.uuid, interval: t.interval as TimeSliceInterval };
  });
  const claim = { namespace: c.namespace, name: c.name, uid: c.uid };
  const mps = request.mps === undefined ? {} : { mps: parseMps(request.mps) };
  if (request.partitions !== undefined && !Array.isArray(request.partitions))
    throw new Error('request.partitions: not a list');
  const partitions =
    request.partitions === undefined
      ? {}
      : { partitions: request.partitions.map((p, i) => parsePartition(p, `request.partitions[${i}]`)) };
  return { id, request: { claim, timeSlices, ...mps, ...partitions } };
}

/** Whether two requests ask the host the same (their ids aside). */
export function sameRequest(a: HostRequest, b: HostRequest): boolean {
  return JSON.stringify(a) === JSON.stringify(b);
}

/** The agent's answer to one request: done (with the partitions it made, if it asked any), or why not. */
export type Answer =
  | { readonly id: string; readonly state: 'ready'; readonly partitions?: readonly MadePartition[] }
  | { readonly id: string; readonly state: 'failed'; readonly error: string };

export function serializeAnswer(a: Answer): string {
  return `${JSON.stringify({ version: HOST_REQUEST_VERSION, ...a })}\n`;
}

/** An answer file's text; throws naming what is wrong. */
export function parseAnswer(text: string): Answer {
  const doc: unknown = JSON.parse(text);
  if (!isObject(doc) || doc.version !== HOST_REQUEST_VERSION || typeof doc.id !== 'string')
    throw new Error(`not an answer of version ${HOST_REQUEST_VERSION}`);
  if (doc.state === 'ready') {
    if (doc.partitions === undefined) return { id: doc.id, state: 'ready' };
    if (!Array.isArray(doc.partitions)) throw new Error('partitions: not a list');
    const partitions = doc.partitions.map((p, i) => parseMadePartition(p, `partitions[${i}]`));
    return { id: doc.id, state: 'ready', partitions };
  }
  if (doc.state === 'failed' && typeof doc.error === 'string') return { id: doc.id, state: 'failed', error: doc.error };
  throw new Error('state is neither ready nor failed (with an error)');
}

/** The whole GPUs a claim's devices time-slice, with the interval each asks. */
function timeSlicesOf(
  c: ClaimName,
  devices: readonly SharedDevice[],
  node: readonly HostDevice[],
): TimeSliceClaimDevice[] {
  const out: TimeSliceClaimDevice[] = [];
  for (const d of devices) {
    if (d.sharing?.strategy !== 'TimeSlicing') continue;
    const dev = node.find((n) => n.name === d.device);
    if (dev === undefined || dev.mig !== undefined) continue;
    out.push({
      claimUid: c.uid,
      namespace: c.namespace,
      name: c.name,
      gpuUuid: dev.gpuUuid,
      interval: d.sharing.interval,
    });
  }
  return out;
}

/** A checkpoint's claims as far as sharing goes. */
export interface SharingClaims {
  readonly claims: Readonly<
    Record<string, { readonly namespace: string; readonly name: string; readonly devices: readonly SharedDevice[] }>
  >;
}

/**
 * Why `claim` may not time-slice its GPUs as it asks (core/dra-timeslice.ts): another claim of the checkpoint
 * holds one of them at another interval, or it asks two on one GPU. Null when it may.
 */
export function timeSliceConflictIn(
  checkpoint: SharingClaims,
  claim: ClaimName,
  devices: readonly SharedDevice[],
  node: readonly HostDevice[],
): string | null {
  const candidate = timeSlicesOf(claim, devices, node);
  if (candidate.length === 0) return null;
  const prepared = Object.entries(checkpoint.claims).flatMap(([uid, r]) =>
    uid === claim.uid ? [] : timeSlicesOf({ uid, namespace: r.namespace, name: r.name }, r.devices, node),
  );
  return timeSliceConflict(prepared, candidate)?.message ?? null;
}

/** Each GPU's time-slice wanted by the requests (one interval per GPU: the plugin refuses two). */
export function requestedTimeSlices(requests: readonly HostRequest[]): Map<string, TimeSliceInterval> {
  return wantedTimeSlices(
    requests.flatMap((r) =>
      r.timeSlices.map((t) => ({
        claimUid: r.claim.uid,
        namespace: r.claim.namespace,
        name: r.claim.name,
        gpuUuid: t.uuid,
        interval: t.interval,
      })),
    ),
  );
}

// ---- the CDI spec of a claim's daemon ----

/** The CDI kind of the specs this plugin writes for its claims. */
export const CLAIM_CDI_KIND = 'k8s.gpu-device-plugin/claim';

/** Where the claim's containers find its daemon's pipe. */
export function claimContainerPipe(uid: string): string {
  return `/mps/${uid}/pipe`;
}

/** The CDI spec that gives a container the claim's MPS pipe and shm; its one device is named by the claim's uid. */
export function claimCdiSpec(mpsRoot: string, uid: string): { readonly id: string; readonly spec: object } {
  const root = claimMpsRoot(mpsRoot, uid);
  const mount = (hostPath: string, containerPath: string) => ({
    hostPath,
    containerPath,
    options: ['rbind', 'rw', 'nosuid', 'nodev'],
  });
  return {
    id: `${CLAIM_CDI_KIND}=${uid}`,
    spec: {
      cdiVersion: '0.6.0',
      kind: CLAIM_CDI_KIND,
      devices: [
        {
          name: uid,
          containerEdits: {
            env: [`CUDA_MPS_PIPE_DIRECTORY=${claimContainerPipe(uid)}`],
            mounts: [
              mount(`${root}/${CLAIM_MPS_RESOURCE}/pipe`, claimContainerPipe(uid)),
              mount(`${root}/shm`, '/dev/shm'),
            ],
          },
        },
      ],
    },
  };
}
