// DRA's claims on the kubelet side, pure: the devices this node offers through DRA as the claim side knows them,
// and what a ResourceClaim's JSON allocates to this driver on this node (and how the allocation shares each device).
// Plain data in and out; reading the claim is src/dra/'s.

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
