// DRA on the kubelet side, the pure part: what a ResourceClaim's JSON allocates to this driver on this node (and how
// the allocation shares each device), the CDI device name the Container Toolkit's spec has for a GPU or MIG device,
// the checkpoint of prepared claims (its JSON and the boot-ID rule), and the health list the DRAResourceHealth stream
// sends. Plain data in and out; reading the claim, the spec files, the boot ID and the checkpoint are src/dra/'s.
import { withSignalReasons } from './snapshot-signals.ts';
import type { NodeSnapshot } from './snapshot.ts';

/**
 * One device this node offers through DRA, as the ResourceSlice names it (names come from the
 * slice side, core/dra-devices.ts: `gpu-<minor>`, MIG names), with what the runtime
 * and the health model know it by.
 */
export interface DraNodeDevice {
  /** The device name in the ResourceSlice (a DNS label). */
  readonly name: string;
  /** UUID of the GPU, or of the MIG device's parent. */
  readonly gpuUuid: string;
  /** NVML index of the GPU (or of the MIG device's parent). */
  readonly gpuIndex: number;
  /** The GPU's minor number (/dev/nvidia<minor>). */
  readonly minor: number;
  /** For a MIG device: its UUID and its index under the parent (the j of `<gpu>:<j>`). */
  readonly mig?: { readonly uuid: string; readonly index: number };
}

/** The claim the kubelet names (NodePrepareResources' Claim). */
export interface ClaimRef {
  readonly namespace: string;
  readonly name: string;
  readonly uid: string;
}

/**
 * How a device may be shared with other claims, by its allocation result: `adminAccess` (an admin's
 * claim, e.g. monitoring, which may use a device in use) or `shareID` (one share of a device that
 * allows multiple allocations). Absent: the claim has the device to itself.
 */
export type DeviceSharing = 'adminAccess' | 'shareID';

/** One device of the claim's allocation that this driver prepares, with the requests it serves. */
export interface AllocatedDevice {
  readonly device: string;
  readonly pool: string;
  readonly requests: readonly string[];
  readonly shared?: DeviceSharing;
}

export type ClaimVerdict = { readonly devices: readonly AllocatedDevice[] } | { readonly error: string };

function isObject(v: unknown): v is Record<string, unknown> {
  return typeof v === 'object' && v !== null && !Array.isArray(v);
}

const claimName = (c: ClaimRef): string => `ResourceClaim ${c.namespace}/${c.name} (uid ${c.uid})`;

/**
 * What `claimJson` (the API server's ResourceClaim) allocates to `driver` on this node: every
 * status.allocation.devices.results[] entry whose driver is ours must name pool `pool` (the node
 * name) and a device of `devices`; results of other drivers are not ours to prepare. Devices named
 * by several requests are listed once, with every request. An error says what was wrong and what
 * would be right.
 */
export function allocatedDevices(
  claimJson: unknown,
  claim: ClaimRef,
  driver: string,
  pool: string,
  devices: readonly DraNodeDevice[],
): ClaimVerdict {
  const what = claimName(claim);
  if (!isObject(claimJson)) return { error: `${what}: the API server's answer is not an object` };
  const meta = claimJson.metadata;
  const uid = isObject(meta) ? meta.uid : undefined;
  if (uid !== claim.uid) {
    return {
      error:
        `${what}: the API server has a claim of that name with uid ${typeof uid === 'string' ? uid : '(none)'}: ` +
        `the claim the kubelet asked for was deleted and re-created; the kubelet should ask for the current one`,
    };
  }
  const status = claimJson.status;
  const allocation = isObject(status) ? status.allocation : undefined;
  const results = isObject(allocation) && isObject(allocation.devices) ? allocation.devices.results : undefined;
  if (!isObject(allocation))
    return {
      error:
        `${what} is not allocated (status.allocation is missing): the ` +
        `scheduler allocates a claim before the kubelet prepares it`,
    };
  if (results !== undefined && !Array.isArray(results))
    return { error: `${what}: status.allocation.devices.results is not a list` };
  const known = new Map(devices.map((d) => [d.name, d]));
  const byDevice = new Map<string, { pool: string; requests: string[]; shared: DeviceSharing | undefined }>();
  for (const [i, r] of (results ?? []).entries()) {
    if (!isObject(r)) return { error: `${what}: status.allocation.devices.results[${i}] is not an object` };
    if (r.driver !== driver) continue;
    const { request, pool: p, device } = r;
    if (typeof request !== 'string' || typeof p !== 'string' || typeof device !== 'string') {
      return { error: `${what}: status.allocation.devices.results[${i}] lacks request, pool or device (strings)` };
    }
    if (p !== pool) {
      return {
        error:
          `${what}: results[${i}] allocates device ${device} of pool ${p}, which is ` +
          `not this node's: driver ${driver} on this node serves pool ${pool} only`,
      };
    }
    if (!known.has(device)) {
      const have = [...known.keys()];
      return {
        error:
          `${what}: results[${i}] allocates device ${device}, which node ${pool} does ` +
          `not have now (its devices: ${have.length === 0 ? 'none' : have.join(', ')})`,
      };
    }
    const shared = resultSharing(r);
    const e = byDevice.get(device);
    if (e === undefined) byDevice.set(device, { pool: p, requests: [request], shared });
    else {
      if (!e.requests.includes(request)) e.requests.push(request);
      // Named by several results: shared only if every one of them says so, the same way.
      if (e.shared !== shared) e.shared = undefined;
    }
  }
  return {
    devices: [...byDevice].map(([device, e]) => ({
      device,
      pool: e.pool,
      requests: e.requests,
      ...(e.shared === undefined ? {} : { shared: e.shared }),
    })),
  };
}

/** How one allocation result shares its device (see DeviceSharing). */
function resultSharing(r: Record<string, unknown>): DeviceSharing | undefined {
  if (r.adminAccess === true) return 'adminAccess';
  if (typeof r.shareID === 'string' && r.shareID !== '') return 'shareID';
  return undefined;
}

// ---- CDI ----

/** The CDI kind of the NVIDIA Container Toolkit's GPU spec. */
export const CDI_KIND = 'nvidia.com/gpu';

/** The command that writes the toolkit's spec where the runtime looks. */
export const CDI_GENERATE_HINT =
  'run `nvidia-ctk cdi generate --output=/var/run/cdi/nvidia.yaml` (or `systemctl ' +
  'restart nvidia-cdi-refresh.service` with NVIDIA Container Toolkit 1.18 or later)';

/** A CDI spec file as the adapter read it: its kind and, per device, its name and device node paths. */
export type CdiSpec =
  | {
      readonly path: string;
      readonly kind: string;
      readonly devices: readonly { readonly name: string; readonly deviceNodes: readonly string[] }[];
    }
  | { readonly path: string; readonly error: string };

/**
 * The names the toolkit may give a device, by `nvidia-ctk cdi generate --device-name-strategy`:
 * index (default: `0`, a MIG device `0:1`), uuid (`GPU-…`, `MIG-…`), type-index (`gpu0`, `mig0:1`).
 */
export function cdiNameCandidates(d: DraNodeDevice): string[] {
  if (d.mig !== undefined) {
    const idx = `${d.gpuIndex}:${d.mig.index}`;
    return [idx, d.mig.uuid, `mig${idx}`];
  }
  return [String(d.gpuIndex), d.gpuUuid, `gpu${d.gpuIndex}`];
}

export type CdiVerdict = { readonly id: string } | { readonly error: string };

type ReadSpec = Extract<CdiSpec, { kind: string }>;

/** A whole GPU's name in the toolkit's index strategies (`0`, `gpu0`): what an NVML index change can move. */
const INDEX_NAME = /^(gpu)?\d+$/;

/**
 * The index-named entry whose device node is this GPU's: after a GPU left the bus NVML numbers the
 * others anew, while a spec generated before still names each GPU by its index then, with its
 * /dev/nvidia<minor>. The device node, not today's index, says which entry is this GPU.
 */
function entryByDeviceNode(d: DraNodeDevice, specs: readonly ReadSpec[]): string | undefined {
  const node = `/dev/nvidia${d.minor}`;
  for (const spec of specs) {
    const e = spec.devices.find((x) => INDEX_NAME.test(x.name) && x.deviceNodes.includes(node));
    if (e !== undefined) return e.name;
  }
  return undefined;
}

/**
 * The entry named `name` in the specs, if it is this device: a whole GPU named by index must carry
 * /dev/nvidia<minor> when the spec lists device nodes (`stale`: it names another GPU).
 */
function entryNamed(
  d: DraNodeDevice,
  name: string,
  specs: readonly ReadSpec[],
): { found: true } | { stale: string } | undefined {
  for (const spec of specs) {
    const entry = spec.devices.find((e) => e.name === name);
    if (entry === undefined) continue;
    const node = `/dev/nvidia${d.minor}`;
    if (d.mig !== undefined || name === d.gpuUuid || entry.deviceNodes.length === 0 || entry.deviceNodes.includes(node))
      return { found: true };
    return { stale: `the CDI spec ${spec.path} is stale: its device ${name} has ${entry.deviceNodes.join(', ')}` };
  }
  return undefined;
}

/**
 * The CDI device ID (`nvidia.com/gpu=<name>`) of a device, from the toolkit's specs: the first of its
 * candidate names found; for a whole GPU whose index-named entry is another GPU's, the index-named
 * entry with its device node (an index that moved), else a stale spec. Missing and stale specs are
 * errors saying what to run.
 */
export function cdiDeviceId(d: DraNodeDevice, specs: readonly CdiSpec[], dirs: readonly string[]): CdiVerdict {
  const ours = specs.filter((s): s is ReadSpec => 'kind' in s && s.kind === CDI_KIND);
  const unreadable = specs.filter((s): s is Extract<CdiSpec, { error: string }> => 'error' in s);
  const unreadableNote =
    unreadable.length === 0
      ? ''
      : `; unreadable spec files: ${unreadable.map((s) => `${s.path} (${s.error})`).join(', ')}`;
  const what =
    d.mig === undefined
      ? `GPU ${d.gpuIndex} (${d.gpuUuid})`
      : `MIG device ${d.gpuIndex}:${d.mig.index} (${d.mig.uuid}) of GPU ${d.gpuUuid}`;
  if (ours.length === 0) {
    return {
      error:
        `no CDI spec of kind ${CDI_KIND} in ${dirs.join(' or ')}${unreadableNote}: the ` +
        `container runtime could not give the container ${what}; ${CDI_GENERATE_HINT}`,
    };
  }
  const candidates = cdiNameCandidates(d);
  let stale: string | undefined;
  for (const name of candidates) {
    const e = entryNamed(d, name, ours);
    if (e === undefined) continue;
    if ('found' in e) return { id: `${CDI_KIND}=${name}` };
    stale ??= e.stale;
  }
  const moved = d.mig === undefined ? entryByDeviceNode(d, ours) : undefined;
  if (moved !== undefined) return { id: `${CDI_KIND}=${moved}` };
  if (stale !== undefined) return { error: `${stale}, but ${what} is /dev/nvidia${d.minor}; ${CDI_GENERATE_HINT}` };
  return {
    error:
      `the CDI spec${ours.length > 1 ? 's' : ''} ${ours.map((s) => s.path).join(', ')}` +
      ` ${ours.length > 1 ? 'have' : 'has'} no device for ${what} (looked for ` +
      `${candidates.join(', ')}): ${ours.length > 1 ? 'they were' : 'it was'} generated ` +
      `before the GPUs or the MIG layout changed; ${CDI_GENERATE_HINT}${unreadableNote}`,
  };
}

// ---- the checkpoint ----

export type PrepareState = 'PrepareStarted' | 'PrepareCompleted';

/** One prepared device as answered to the kubelet. */
export interface PreparedDevice {
  readonly requests: readonly string[];
  readonly pool: string;
  readonly device: string;
  readonly cdiDeviceIds: readonly string[];
  /** How the allocation shares the device (absent: this claim has it to itself). */
  readonly shared?: DeviceSharing;
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

function stringList(v: unknown): v is string[] {
  return Array.isArray(v) && v.every((x) => typeof x === 'string');
}

/** One prepared device of a checkpoint's claim record; throws naming what is wrong. */
function parseDevice(uid: string, d: unknown): PreparedDevice {
  if (
    !isObject(d) ||
    !stringList(d.requests) ||
    typeof d.pool !== 'string' ||
    typeof d.device !== 'string' ||
    !stringList(d.cdiDeviceIds)
  ) {
    throw new Error(`claim ${uid}: a device lacks requests, pool, device or cdiDeviceIds`);
  }
  const { requests, pool, device, cdiDeviceIds, shared } = d;
  if (shared === undefined) return { requests, pool, device, cdiDeviceIds };
  if (shared !== 'adminAccess' && shared !== 'shareID')
    throw new Error(`claim ${uid}: device ${device}: shared is neither adminAccess nor shareID`);
  return { requests, pool, device, cdiDeviceIds, shared };
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

// ---- health ----

export type DeviceHealthState = 'Healthy' | 'Unhealthy';

export interface DraDeviceHealth {
  readonly device: string;
  readonly health: DeviceHealthState;
  /** Unix seconds of the last change (or of `nowSec` when nothing ever happened to it). */
  readonly lastUpdated: number;
  /** Why (the health model's reason), at most MAX_HEALTH_MESSAGE characters; empty when healthy with nothing to say. */
  readonly message: string;
}

export const MAX_HEALTH_MESSAGE = 1024;

function clip(s: string): string {
  return s.length <= MAX_HEALTH_MESSAGE ? s : `${s.slice(0, MAX_HEALTH_MESSAGE - 1)}…`;
}

/**
 * The health of every device, from the snapshot: a MIG device's own (by MIG UUID), a GPU's by its
 * UUID, with its GPU's critical health signals; every device Unhealthy while the driver does not answer.
 */
export function deviceHealthList(
  snapshot: Pick<NodeSnapshot, 'health' | 'gpuHealth' | 'migHealth' | 'driverVersion'> &
    Partial<Pick<NodeSnapshot, 'signals'>>,
  devices: readonly DraNodeDevice[],
  nowSec: number,
): DraDeviceHealth[] {
  return devices.map((d) => {
    const unit = d.mig?.uuid ?? d.gpuUuid;
    const h = d.mig === undefined ? snapshot.gpuHealth.get(unit) : snapshot.migHealth.get(unit);
    const health: DeviceHealthState = snapshot.health.get(unit) ?? 'Unhealthy';
    const [since, own] = [h?.since ?? null, h?.reason ?? ''];
    let message = withSignalReasons(h?.state.health === 'Unhealthy' ? own : '', snapshot.signals, d.gpuUuid) || own;
    if (snapshot.driverVersion === null)
      message = `the NVIDIA driver does not answer${message === '' ? '' : ` (last: ${message})`}`;
    else if (!snapshot.health.has(unit)) message = 'the health model has no entry for this device';
    return {
      device: d.name,
      health,
      lastUpdated: since === null ? nowSec : Math.floor(since / 1000),
      message: clip(message),
    };
  });
}

/** Whether two health lists say the same (the stream sends a new message only when they differ). */
export function sameHealth(a: readonly DraDeviceHealth[], b: readonly DraDeviceHealth[]): boolean {
  return (
    a.length === b.length &&
    a.every((x, i) => {
      const y = b[i];
      return (
        y !== undefined &&
        x.device === y.device &&
        x.health === y.health &&
        x.message === y.message &&
        x.lastUpdated === y.lastUpdated
      );
    })
  );
}
