// Claims, the DRAPlugin service (v1 and v1beta1) served on dra.sock.
//
// NodePrepareResources, per claim, one call per claim UID at a time: a claim already prepared (in the
// checkpoint, this boot) gets the same answer without asking the API server; otherwise the claim is
// read through the injected ClaimReader, its allocation checked against this node's devices now
// (core/dra-claims.ts), refused if another claim holds one of its devices (unless the allocation
// shares it), recorded PrepareStarted, its devices mapped to the CDI IDs of the NVIDIA Container
// Toolkit's spec (core/dra-cdi.ts), recorded PrepareCompleted, and only then answered. A refusal is per claim, in the
// answer's map, and the kubelet asks again; only a failure outside any claim is a gRPC error.
// NodeUnprepareResources forgets the claim (an unknown one is a success).
import * as grpc from '@grpc/grpc-js';
import { draPluginService } from '../api/dra.ts';
import type {
  Claim,
  DraDevice,
  NodePrepareResourceResponse,
  NodePrepareResourcesRequest,
  NodePrepareResourcesResponse,
  NodeUnprepareResourceResponse,
  NodeUnprepareResourcesRequest,
  NodeUnprepareResourcesResponse,
} from '../api/dra.ts';
import { cdiDeviceId } from '../core/dra-cdi.ts';
import { claimedPartitions, deviceHeldElsewhere } from '../core/dra-checkpoint.ts';
import type { ClaimRecord, PreparedDevice } from '../core/dra-checkpoint.ts';
import { allocatedDevices, claimUidProblem, shareFields } from '../core/dra-claims.ts';
import type { AllocatedDevice } from '../core/dra-claims.ts';
import { hostRequest, timeSliceConflictIn } from '../core/dra-sharing.ts';
import type { HostDevice, HostRequest } from '../core/dra-sharing.ts';

import type { ServiceBinding } from '../kubelet/socket-server.ts';
import { errorText } from '../system/log.ts';
import { KeyedQueue } from '../system/timers.ts';
import type { Logger } from '../system/log.ts';
import { CDI_SPEC_DIRS, readCdiSpecs } from './cdi.ts';
import { BOOT_ID_FILE, CheckpointStore, readBootId } from './checkpoint.ts';
import type { HostSharing } from './sharing.ts';

/** Reads a ResourceClaim from the API server (k8s/resources.ts implements it): the object's JSON. */
export interface ClaimReader {
  getResourceClaim(namespace: string, name: string): Promise<unknown>;
}

export interface DraClaimsOptions {
  readonly driver: string;
  /** This node's name: the pool every device of ours is in. */
  readonly nodeName: string;
  readonly claims: ClaimReader;
  /** The devices this node offers now, as its ResourceSlice names them, with their memory. */
  readonly devices: () => readonly HostDevice[];
  /** What a claim sharing its GPUs by TimeSlicing or MPS asks of the host (sharing.ts). */
  readonly sharing: HostSharing;
  /** Where CDI specs are looked for (default /etc/cdi, /var/run/cdi). */
  readonly cdiDirs?: readonly string[];
  readonly checkpointPath: string;
  /** Default /proc/sys/kernel/random/boot_id. */
  readonly bootIdPath?: string;
  /** Wall clock, ms since the epoch (when a prepare completed). */
  readonly now: () => number;
  readonly log: Logger;
}

/** A claim the checkpoint holds, for `info`. */
export interface PreparedClaim {
  uid: string;
  namespace: string;
  name: string;
  state: string;
  devices: string[];
  since?: string;
}

const NOT_STARTED = 'the DRA plugin has not started yet (no node snapshot applied); the kubelet will try again';

const refuse = (error: string): NodePrepareResourceResponse => ({ devices: [], error });
const claimName = (c: Claim): string => `${c.namespace}/${c.name}`;

function wire(d: PreparedDevice): DraDevice {
  return {
    request_names: [...d.requests],
    pool_name: d.pool,
    device_name: d.device,
    cdi_device_ids: [...d.cdiDeviceIds],
    ...(d.shareId === undefined ? {} : { share_id: d.shareId }),
  };
}

function preparedDevice(d: AllocatedDevice, cdiDeviceIds: readonly string[]): PreparedDevice {
  const { requests, pool, device, partition } = d;
  return { requests, pool, device, cdiDeviceIds, ...shareFields(d), ...(partition === undefined ? {} : { partition }) };
}

export class DraClaims {
  private readonly opts: DraClaimsOptions;
  private store: CheckpointStore | undefined;
  /** Calls for one claim UID run one at a time, in order. */
  private readonly perClaim = new KeyedQueue<string>();
  private readonly listeners: (() => void)[] = [];
  /** Claims whose unprepare is under way. */
  private readonly ending = new Set<string>();

  constructor(opts: DraClaimsOptions) {
    this.opts = opts;
  }

  /** Reads the checkpoint (records of another boot are void); listeners hear its claims. */
  async open(): Promise<void> {
    const bootId = await readBootId(this.opts.bootIdPath ?? BOOT_ID_FILE);
    const path = this.opts.checkpointPath;
    this.store = await CheckpointStore.open(path, bootId, this.opts.log);
    if (this.store.size > 0)
      this.opts.log.info('prepared DRA claims from the checkpoint', { claims: this.store.size, checkpoint: path });
    await this.opts.sharing.reconcile(this.sharingRequests());
    this.changed();
  }

  /**
   * What each claim of the checkpoint asks of the host (claims asking nothing are not in it, nor claims being
   * unprepared: their daemons are going, and are no longer watched).
   */
  sharingRequests(): Map<string, HostRequest> {
    const out = new Map<string, HostRequest>();
    const s = this.store;
    if (s === undefined) return out;
    const node = this.opts.devices();
    for (const uid of s.uids()) {
      if (this.ending.has(uid)) continue;
      const r = s.get(uid);
      if (r === undefined) continue;
      const req = hostRequest({ namespace: r.namespace, name: r.name, uid }, r.devices, node);
      if (req !== null && !('error' in req)) out.set(uid, req);
    }
    return out;
  }

  /** After the checkpoint's claims changed (a prepare or unprepare written), and once it was read at start. */
  onClaimsChanged(fn: () => void): void {
    this.listeners.push(fn);
  }

  private changed(): void {
    for (const fn of this.listeners) fn();
  }

  /**
   * The dynamic MIG partitions the checkpoint's claims hold, by device name: from the claim's PrepareStarted record
   * (before the instance is made) until its unprepare removed it (after the instance is gone); preparedOnly: those
   * of prepared claims (their instances made).
   */
  claimedPartitions(preparedOnly = false): Set<string> {
    const s = this.store;
    const records = s === undefined ? [] : s.uids().flatMap((uid) => s.get(uid) ?? []);
    return claimedPartitions(records.filter((r) => !preparedOnly || r.state === 'PrepareCompleted'));
  }

  /** The claims the checkpoint holds (for `info`). */
  preparedClaims(): PreparedClaim[] {
    const s = this.store;
    if (s === undefined) return [];
    return s.uids().flatMap((uid) => {
      const r = s.get(uid);
      if (r === undefined) return [];
      const { namespace, name, state, preparedAt } = r;
      const devices = r.devices.map((d) => d.device);
      return [{ uid, namespace, name, state, devices, ...(preparedAt === undefined ? {} : { since: preparedAt }) }];
    });
  }

  /** Writes the checkpoint again when it holds claims and the file differs (wiped, edited); whether it wrote. */
  async persist(): Promise<boolean> {
    return this.store !== undefined && this.store.size > 0 ? await this.store.persist() : false;
  }

  /** Resolves once every call under way has finished. */
  async drain(): Promise<void> {
    await this.perClaim.drain();
  }

  /** The DRAPlugin service of both versions, for dra.sock. */
  bindings(): ServiceBinding[] {
    const implementation: grpc.UntypedServiceImplementation = {
      NodePrepareResources: (
        call: grpc.ServerUnaryCall<NodePrepareResourcesRequest, NodePrepareResourcesResponse>,
        cb: grpc.sendUnaryData<NodePrepareResourcesResponse>,
      ) => {
        this.prepare(call.request.claims ?? []).then(
          (r) => cb(null, r),
          (err: unknown) => cb({ code: grpc.status.INTERNAL, details: `NodePrepareResources: ${errorText(err)}` }),
        );
      },
      NodeUnprepareResources: (
        call: grpc.ServerUnaryCall<NodeUnprepareResourcesRequest, NodeUnprepareResourcesResponse>,
        cb: grpc.sendUnaryData<NodeUnprepareResourcesResponse>,
      ) => {
        this.unprepare(call.request.claims ?? []).then(
          (r) => cb(null, r),
          (err: unknown) => cb({ code: grpc.status.INTERNAL, details: `NodeUnprepareResources: ${errorText(err)}` }),
        );
      },
    };
    return [
      { definition: draPluginService('v1'), implementation },
      { definition: draPluginService('v1beta1'), implementation },
    ];
  }

  async prepare(claims: readonly Claim[]): Promise<NodePrepareResourcesResponse> {
    const out: Record<string, NodePrepareResourceResponse> = {};
    await Promise.all(
      claims.map(async (c) => {
        const r = await this.perClaim
          .run(c.uid, () => this.prepareOne(c))
          .catch((err: unknown) => refuse(`claim ${claimName(c)} (uid ${c.uid}): ${errorText(err)}`));
        out[c.uid] = r;
        if (r.error !== '')
          this.opts.log.warn('cannot prepare a DRA claim', { claim: claimName(c), uid: c.uid, error: r.error });
      }),
    );
    return { claims: out };
  }

  private async prepareOne(c: Claim): Promise<NodePrepareResourceResponse> {
    if (c.uid === '' || c.name === '' || c.namespace === '')
      return refuse(
        `the claim ${JSON.stringify(c)} lacks a uid, name or namespace: the kubelet names each claim by all three`,
      );
    const badUid = claimUidProblem(c.uid);
    if (badUid !== null) return refuse(`claim ${claimName(c)}: ${badUid}`);
    const store = this.store;
    if (store === undefined) return refuse(NOT_STARTED);
    const done = store.get(c.uid);
    if (done?.state === 'PrepareCompleted') {
      // Answered from the checkpoint; an MPS claim's CDI spec someone removed or edited is written again first.
      const host = this.sharingRequests().get(c.uid);
      const problem = host === undefined ? null : await this.opts.sharing.ensureSpec(host);
      if (problem !== null) return refuse(`claim ${claimName(c)}: ${problem}`);
      return { devices: done.devices.map(wire), error: '' };
    }
    const allocated = await this.allocation(c);
    if ('error' in allocated) return refuse(allocated.error);
    const host = hostRequest(c, allocated.devices, this.opts.devices());
    if (host !== null && 'error' in host) return refuse(`claim ${claimName(c)}: ${host.error}`);
    const unavailable = host === null ? null : this.opts.sharing.unavailable(host);
    if (unavailable !== null) return refuse(`claim ${claimName(c)}: ${unavailable}`);
    const started = await this.recordStarted(store, c, allocated.devices);
    if (started !== null) return refuse(started);
    // Its partitions are the package's from now on: an instance the scan finds there is this claim's.
    if (host?.partitions !== undefined) this.changed();
    const cdi = await this.withCdiIds(c, allocated.devices);
    if ('error' in cdi) return refuse(cdi.error);
    const prepared = host === null ? cdi : await this.withHostSharing(c, host, cdi);
    if ('error' in prepared) return refuse(prepared.error);
    const record = { namespace: c.namespace, name: c.name };
    const preparedAt = new Date(this.opts.now()).toISOString();
    try {
      await store.put(c.uid, { ...record, state: 'PrepareCompleted', devices: prepared, preparedAt });
    } catch (err) {
      return refuse(`cannot record claim ${claimName(c)} in the checkpoint: ${errorText(err)}`);
    }
    this.changed();
    this.opts.log.info('prepared a DRA claim', {
      claim: claimName(c),
      uid: c.uid,
      devices: prepared.map((d) => d.device),
      cdi: prepared.flatMap((d) => d.cdiDeviceIds),
    });
    return { devices: prepared.map(wire), error: '' };
  }

  /** The claim's devices of this driver on this node, read from the API server now. */
  private async allocation(c: Claim): Promise<{ devices: readonly AllocatedDevice[] } | { error: string }> {
    let json: unknown;
    try {
      json = await this.opts.claims.getResourceClaim(c.namespace, c.name);
    } catch (err) {
      return { error: `cannot read ResourceClaim ${claimName(c)} from the API server: ${errorText(err)}` };
    }
    return allocatedDevices(json, c, this.opts.driver, this.opts.nodeName, this.opts.devices());
  }

  /** Records the claim PrepareStarted, unless another claim holds one of its devices: then why not. */
  private async recordStarted(
    store: CheckpointStore,
    c: Claim,
    devices: readonly AllocatedDevice[],
  ): Promise<string | null> {
    const record: ClaimRecord = {
      namespace: c.namespace,
      name: c.name,
      state: 'PrepareStarted',
      devices: devices.map((d) => preparedDevice(d, [])),
    };
    try {
      const node = this.opts.devices();
      const held = await store.putUnless(
        c.uid,
        record,
        (cp) => deviceHeldElsewhere(cp, c.uid, devices) ?? timeSliceConflictIn(cp, c, devices, node),
      );
      return held === null ? null : `claim ${claimName(c)}: ${held}`;
    } catch (err) {
      return `cannot record claim ${claimName(c)} in the checkpoint: ${errorText(err)}`;
    }
  }

  /**
   * The host set up for the claim's sharing (sharing.ts); an MPS claim's CDI ID added to the first device
   * of each of its requests that shares by MPS (a container gets it once).
   */
  private async withHostSharing(
    c: Claim,
    host: HostRequest,
    devices: readonly PreparedDevice[],
  ): Promise<PreparedDevice[] | { error: string }> {
    const r = await this.opts.sharing.prepare(host);
    if ('error' in r) return { error: `claim ${claimName(c)}: ${r.error}` };
    const seen = new Set<string>();
    return devices.map((d) => {
      // A partition: its parent GPU's toolkit device, then its capability nodes from the claim's partition spec
      // (and, shared by MPS, the daemon's spec after them as for any device).
      const partition = r.partitionIds[d.device];
      const own = partition === undefined ? d : { ...d, cdiDeviceIds: [...d.cdiDeviceIds, partition] };
      if (d.sharing?.strategy !== 'MPS' || d.requests.every((q) => seen.has(q))) return own;
      for (const q of d.requests) seen.add(q);
      return { ...own, cdiDeviceIds: [...own.cdiDeviceIds, ...r.cdiDeviceIds] };
    });
  }

  /** The devices with their CDI IDs in the toolkit's spec, or every device's problem. */
  private async withCdiIds(
    c: Claim,
    devices: readonly AllocatedDevice[],
  ): Promise<PreparedDevice[] | { error: string }> {
    const dirs = this.opts.cdiDirs ?? CDI_SPEC_DIRS;
    const specs = devices.length === 0 ? [] : await readCdiSpecs(dirs);
    const node = this.opts.devices();
    const prepared: PreparedDevice[] = [];
    const problems: string[] = [];
    for (const d of devices) {
      const dev = node.find((x) => x.name === d.device);
      if (dev === undefined) continue; // allocatedDevices checked it is there
      const cdi = cdiDeviceId(dev, specs, dirs);
      if ('error' in cdi) problems.push(`device ${d.device}: ${cdi.error}`);
      else prepared.push(preparedDevice(d, [cdi.id]));
    }
    return problems.length > 0 ? { error: `claim ${claimName(c)}: ${problems.join('; ')}` } : prepared;
  }

  async unprepare(claims: readonly Claim[]): Promise<NodeUnprepareResourcesResponse> {
    const out: Record<string, NodeUnprepareResourceResponse> = {};
    await Promise.all(
      claims.map(async (c) => {
        out[c.uid] = await this.perClaim.run(c.uid, () => this.unprepareOne(c));
      }),
    );
    return { claims: out };
  }

  private async unprepareOne(c: Claim): Promise<NodeUnprepareResourceResponse> {
    // Nothing of a uid that is not one path component is ever on the host; its name must not reach a path.
    const badUid = claimUidProblem(c.uid);
    if (badUid !== null) return { error: `claim ${claimName(c)}: ${badUid}` };
    const store = this.store;
    if (store === undefined) return { error: NOT_STARTED };
    // A sharing claim's daemon stops being watched before it is stopped: its going is no fault of the device.
    const sharing = this.sharingRequests().has(c.uid);
    this.ending.add(c.uid);
    if (sharing) this.changed();
    try {
      const notEnded = await this.opts.sharing.unprepare(c);
      // A MIG partition not destroyed yet (a process still on it: IN_USE) stays the claim's until it is.
      const partitioned = store.get(c.uid)?.devices.some((d) => d.partition !== undefined) === true;
      if (notEnded !== null && partitioned)
        return { error: `claim ${claimName(c)}: its MIG partitions are not destroyed: ${notEnded}; ask again` };
      if (await store.remove(c.uid)) {
        this.opts.log.info('unprepared a DRA claim', { claim: claimName(c), uid: c.uid });
        this.changed();
      }
      return { error: '' };
    } catch (err) {
      return {
        error: `cannot remove claim ${claimName(c)} (uid ${c.uid}) from the checkpoint: ${errorText(err)}`,
      };
    } finally {
      this.ending.delete(c.uid);
      // Still prepared (its unprepare failed): its daemon is watched again.
      if (sharing && store.get(c.uid) !== undefined) this.changed();
    }
  }
}
