// DRA's claims on the kubelet side, pure: the devices this node offers through DRA as the claim side knows them,
// and what a ResourceClaim's JSON allocates to this driver on this node (and how the allocation shares each device).
// Plain data in and out; reading the claim is src/dra/'s.
import { configPath, driverConfigs, perDeviceLimits, sharingFor } from './dra-gpu-config.ts';
import type { DriverConfig, GpuSharing, MpsSharing } from './dra-gpu-config.ts';
import { isObject, isStringMap } from './json.ts';

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
  /**
   * For a dynamic MIG partition (carved from the GPU at prepare, so it has no MIG UUID yet): its GPU-instance
   * profile id and placement.
   */
  readonly partition?: { readonly giProfileId: number; readonly start: number; readonly size: number };
  /** For a claimed partition whose GPU instance the node's scan holds: that MIG device's UUID (its health). */
  readonly instanceUuid?: string;
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
  /** The allocation's shareID: which share of a device that allows multiple allocations this is. */
  readonly shareId?: string;
  /** The capacity this share consumes, by capacity name, quantities as the API server wrote them. */
  readonly consumedCapacity?: Readonly<Record<string, string>>;
  /** The sharing configuration that applies to the device's requests (absent: none). */
  readonly sharing?: GpuSharing;
  /** A dynamic MIG partition: what to carve, recorded so that the claim keeps it once the instance exists. */
  readonly partition?: PartitionOf;
}

/** Where a dynamic MIG partition is: its parent GPU, GPU-instance profile and placement. */
export interface PartitionOf {
  readonly parentUuid: string;
  readonly giProfileId: number;
  readonly start: number;
  readonly size: number;
}

export type ClaimVerdict = { readonly devices: readonly AllocatedDevice[] } | { readonly error: string };

/**
 * Why a claim's uid cannot be used, or null. The uid names the claim's files on the host (its request to the
 * MPS unit, its CDI spec, its MPS daemon's directory) and its CDI device, so it must be one path component
 * and a valid CDI name. The API server gives every object a UUID (lowercase hex and "-"); what is accepted is
 * a little wider, a DNS label (letters, digits and "-", at most 63), and never "..", "/" or a dot.
 */
export function claimUidProblem(uid: string): string | null {
  if (/^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$/.test(uid)) return null;
  return (
    `the claim uid ${JSON.stringify(uid.length > 80 ? `${uid.slice(0, 80)}…` : uid)} is not a Kubernetes UID ` +
    '(lowercase letters, digits and "-", at most 63 characters, as the API server\'s UUIDs are): it would name ' +
    "the claim's files on the host"
  );
}

const claimName = (c: ClaimRef): string => `ResourceClaim ${c.namespace}/${c.name} (uid ${c.uid})`;

/** The allocation's results and configs, or what is wrong with the claim. */
function allocationOf(
  claimJson: unknown,
  claim: ClaimRef,
): { results: unknown[]; config: unknown } | { error: string } {
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
  if (!isObject(allocation))
    return {
      error:
        `${what} is not allocated (status.allocation is missing): the ` +
        `scheduler allocates a claim before the kubelet prepares it`,
    };
  const devices = isObject(allocation.devices) ? allocation.devices : {};
  const results = devices.results;
  if (results !== undefined && !Array.isArray(results))
    return { error: `${what}: status.allocation.devices.results is not a list` };
  return { results: results ?? [], config: devices.config };
}

/** One allocation result of ours, checked against this node. */
interface Result {
  readonly request: string;
  readonly pool: string;
  readonly device: string;
  readonly shared: DeviceSharing | undefined;
  readonly shareId: string | undefined;
  readonly consumedCapacity: Record<string, string> | undefined;
  readonly sharing: Resolved;
}

/** The sharing a request resolved to, and the index of the configuration it comes from. */
interface Resolved {
  readonly sharing?: GpuSharing;
  readonly config?: number;
}

interface Scope {
  readonly driver: string;
  readonly pool: string;
  readonly known: ReadonlyMap<string, DraNodeDevice>;
  readonly configs: readonly DriverConfig[];
}

/** Result `i`, null when it is another driver's, or what is wrong with it. */
function readResult(r: unknown, i: number, s: Scope): Result | null | { error: string } {
  if (!isObject(r)) return { error: `status.allocation.devices.results[${i}] is not an object` };
  if (r.driver !== s.driver) return null;
  const { request, pool: p, device, consumedCapacity } = r;
  if (typeof request !== 'string' || typeof p !== 'string' || typeof device !== 'string') {
    return { error: `status.allocation.devices.results[${i}] lacks request, pool or device (strings)` };
  }
  if (p !== s.pool) {
    return {
      error:
        `results[${i}] allocates device ${device} of pool ${p}, which is ` +
        `not this node's: driver ${s.driver} on this node serves pool ${s.pool} only`,
    };
  }
  const dev = s.known.get(device);
  if (dev === undefined) {
    // The node's devices named, the first 16 (a node with dynamic MIG has hundreds): enough to see what it offers.
    const have = [...s.known.keys()];
    const shown = have.length <= 16 ? have.join(', ') : `${have.slice(0, 16).join(', ')} and ${have.length - 16} more`;
    return {
      error:
        `results[${i}] allocates device ${device}, which node ${s.pool} does ` +
        `not have now (its devices: ${have.length === 0 ? 'none' : shown})`,
    };
  }
  if (consumedCapacity !== undefined && !isStringMap(consumedCapacity))
    return { error: `status.allocation.devices.results[${i}].consumedCapacity is not a map of quantities (strings)` };
  // A dynamic MIG partition is a MIG device to NVIDIA's configurations (MigDeviceConfig), as a static one is.
  const kind = dev.mig === undefined && dev.partition === undefined ? 'gpu' : 'mig';
  const config = sharingFor(s.configs, request, kind, device);
  if ('error' in config) return config;
  const shareId = typeof r.shareID === 'string' && r.shareID !== '' ? r.shareID : undefined;
  return { request, pool: p, device, shared: resultSharing(r), shareId, consumedCapacity, sharing: config };
}

/** A device's entry while the results are read: one per device and share. */
interface Entry {
  readonly device: string;
  readonly pool: string;
  readonly requests: string[];
  shared: DeviceSharing | undefined;
  readonly shareId: string | undefined;
  readonly consumedCapacity: Record<string, string> | undefined;
  /** The sharing each request resolved to. */
  readonly sharing: Map<string, Resolved>;
}

/**
 * What `claimJson` (the API server's ResourceClaim) allocates to `driver` on this node: every
 * status.allocation.devices.results[] entry whose driver is ours must name pool `pool` (the node
 * name) and a device of `devices`; results of other drivers are not ours to prepare. Devices named
 * by several requests are listed once (once per share), with every request, and with the sharing
 * configuration of status.allocation.devices.config that applies to them (core/dra-gpu-config.ts). An
 * error says what was wrong and what would be right.
 */
export function allocatedDevices(
  claimJson: unknown,
  claim: ClaimRef,
  driver: string,
  pool: string,
  devices: readonly DraNodeDevice[],
): ClaimVerdict {
  const what = claimName(claim);
  const allocation = allocationOf(claimJson, claim);
  if ('error' in allocation) return allocation;
  const configs = driverConfigs(allocation.config, driver);
  if ('error' in configs) return { error: `${what}: ${configs.error}` };
  const scope: Scope = { driver, pool, known: new Map(devices.map((d) => [d.name, d])), configs: configs.configs };
  const entries = new Map<string, Entry>();
  for (const [i, r] of allocation.results.entries()) {
    const res = readResult(r, i, scope);
    if (res === null) continue;
    if ('error' in res) return { error: `${what}: ${res.error}` };
    const key = `${res.device}\n${res.shareId ?? ''}`;
    const e = entries.get(key);
    if (e === undefined) {
      const { device, pool: p, shared, shareId, consumedCapacity } = res;
      const sharing = new Map([[res.request, res.sharing]]);
      entries.set(key, { device, pool: p, requests: [res.request], shared, shareId, consumedCapacity, sharing });
    } else {
      if (!e.requests.includes(res.request)) e.requests.push(res.request);
      e.sharing.set(res.request, res.sharing);
      // Named by several results: shared only if every one of them says so, the same way.
      if (e.shared !== res.shared) e.shared = undefined;
    }
  }
  const conflict = sharingConflict([...entries.values()], scope.known);
  return conflict === null
    ? { devices: [...entries.values()].map((e) => allocated(e, scope.known)) }
    : { error: `${what}: ${conflict}` };
}

/** How a device is shared, as the optional fields AllocatedDevice and PreparedDevice carry: only those set. */
export type ShareFields = Pick<AllocatedDevice, 'shared' | 'shareId' | 'consumedCapacity' | 'sharing'>;

/** The sharing fields of `f` that are set (an object spread of them leaves the others out, not undefined). */
export function shareFields(f: {
  readonly shared?: DeviceSharing | undefined;
  readonly shareId?: string | undefined;
  readonly consumedCapacity?: Readonly<Record<string, string>> | undefined;
  readonly sharing?: GpuSharing | undefined;
}): ShareFields {
  const { shared, shareId, consumedCapacity, sharing } = f;
  return {
    ...(shared === undefined ? {} : { shared }),
    ...(shareId === undefined ? {} : { shareId }),
    ...(consumedCapacity === undefined ? {} : { consumedCapacity }),
    ...(sharing === undefined ? {} : { sharing }),
  };
}

function allocated(e: Entry, known: ReadonlyMap<string, DraNodeDevice>): AllocatedDevice {
  const { device, pool, requests, shared, shareId, consumedCapacity } = e;
  const sharing = [...e.sharing.values()][0]?.sharing;
  const n = known.get(device);
  const partition = n?.partition === undefined ? {} : { partition: { parentUuid: n.gpuUuid, ...n.partition } };
  return { device, pool, requests, ...shareFields({ shared, shareId, consumedCapacity, sharing }), ...partition };
}

const from = (config: number | undefined): string => (config === undefined ? '' : ` (${configPath(config)})`);

const sharingText = (s: GpuSharing | undefined): string => {
  if (s === undefined) return 'no sharing';
  const { strategy, ...settings } = s;
  return `${strategy} ${JSON.stringify(settings)}`;
};

/**
 * Why the sharing the entries resolved to cannot be applied: one device whose requests resolved to different
 * sharings, or an MPS per-device limit whose key names none of the devices its configuration applies to.
 * Null when there is none.
 */
function sharingConflict(entries: readonly Entry[], known: ReadonlyMap<string, DraNodeDevice>): string | null {
  const byDevice = new Map<string, [string, Resolved][]>();
  for (const e of entries) byDevice.set(e.device, [...(byDevice.get(e.device) ?? []), ...e.sharing]);
  // The claim's devices under one MPS sharing: what its per-device keys may name.
  const mps = new Map<string, { sharing: MpsSharing; config: number; uuids: string[] }>();
  for (const [device, resolved] of byDevice) {
    const [first, ...rest] = resolved;
    if (first === undefined) continue;
    const [request, { sharing: s, config }] = first;
    const other = rest.find(([, r]) => sharingText(r.sharing) !== sharingText(s));
    if (other !== undefined)
      return (
        `device ${device} is configured two ways: request ${request} with ${sharingText(s)}` +
        `${from(config)}, request ${other[0]} with ${sharingText(other[1].sharing)}${from(other[1].config)}; ` +
        `the configurations that apply to one device's requests must agree`
      );
    const dev = known.get(device);
    if (s?.strategy !== 'MPS' || config === undefined || dev === undefined) continue;
    const group = mps.get(sharingText(s)) ?? { sharing: s, config, uuids: [] };
    group.uuids.push(mpsKeyOf(dev));
    mps.set(sharingText(s), group);
  }
  for (const { sharing, config, uuids } of mps.values()) {
    const limits = perDeviceLimits(sharing, uuids);
    if ('error' in limits) {
      const field = 'opaque.parameters.sharing.mpsConfig.defaultPerDevicePinnedMemoryLimit';
      return `${configPath(config)}.${field}[${JSON.stringify(limits.key)}]: ${limits.error}`;
    }
  }
  return null;
}

/**
 * What an MPS configuration's per-device limits know a device by: its UUID (a MIG device's own), or for a dynamic
 * MIG partition, whose MIG UUID exists only once the instance is made, its device name.
 */
export function mpsKeyOf(dev: DraNodeDevice): string {
  if (dev.mig !== undefined) return dev.mig.uuid;
  return dev.partition === undefined ? dev.gpuUuid : dev.name;
}

/** How one allocation result shares its device (see DeviceSharing). */
function resultSharing(r: Record<string, unknown>): DeviceSharing | undefined {
  if (r.adminAccess === true) return 'adminAccess';
  if (typeof r.shareID === 'string' && r.shareID !== '') return 'shareID';
  return undefined;
}
