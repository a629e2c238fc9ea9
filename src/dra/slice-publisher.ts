// The DRA ResourceSlice publisher: a consumer of the live node model (node/consumer.ts) that keeps
// this node's ResourceSlices on the API server equal to the latest snapshot, as core/dra-slices.ts
// describes it.
//
// * apply() records the snapshot and wakes the writer, never waiting on the API server: a slow, down or
//   refusing one never holds up the node. It throws only for a new consumable capacity (start, reload) that
//   does not fit the GPUs (core/dra-capacity.ts): the start fails, the reload is refused.
// * The writer runs one sync at a time (later requests fold into one more run). A sync reads the
//   node's slices of our driver (fieldSelector spec.nodeName + spec.driver), then updates each in
//   place with the pool generation one above the highest seen (never delete-and-create: a slice
//   keeps its name and uid), creates the slices missing, and deletes the surplus. Each slice carries
//   an owner reference to the Node (its uid read once), so it goes when the Node object goes.
// * "Changed?" is decided on what we last wrote (our own description, before the server canonicalises
//   quantities or fills taints' timeAdded), never on the server's JSON — comparing with what the
//   server returns would rewrite the slices for ever. A sync with nothing new writes nothing.
// * 409 Conflict (someone else wrote a slice meanwhile) → read again and retry at once, a few times;
//   anything else that fails (server down, timeout, 5xx, 403) → retried with capped backoff on a
//   TimerOwner timer. One WARN when the API server stops answering, one INFO when it answers again,
//   never a line per retry; an error the server gives (403, 422) is logged once per distinct text.
// * republish(): the kubelet deletes every slice of its node at its start (and ours 30 s after our
//   plugin's connection goes away), so the kubelet plugin calls this after every registration: the
//   next sync writes whatever is missing, whatever we remember.
// * pcieRoot: the PCIe root complex of a GPU (`pci<domain>:<bus>`) is read from sysfs, the first
//   `pci<domain>:<bus>` component of /sys/bus/pci/devices/<bdf>'s real path, once per GPU.
import { EventEmitter } from 'node:events';
import { realpath } from 'node:fs/promises';
import { join } from 'node:path';
import { DEFAULT_DRA_DRIVER, poolContent, standardBusId } from '../core/dra-slices.ts';
import type { PoolContent, SliceDevice } from '../core/dra-slices.ts';
import { capacityFitProblem } from '../core/dra-capacity.ts';
import { SharingError } from '../core/sharing.ts';
import type { NodeSnapshot } from '../core/snapshot.ts';
import { KubeApiError, KubeUnreachableError } from '../k8s/client.ts';
import type { KubeClient } from '../k8s/client.ts';
import { checkAccess, createSlice, deleteSlice, getNode, listNodeSlices, updateSlice } from '../k8s/resources.ts';
import type { ResourceSlice } from '../k8s/resources.ts';
import type { AppliedSnapshot, NodeConsumer, NodeSettings } from '../node/consumer.ts';
import type { Logger } from '../system/log.ts';
import { errorText } from '../system/log.ts';
import { CoalescingQueue, TimerOwner } from '../system/timers.ts';

export interface SlicePublisherOptions {
  /** The caller's (the kubelet plugin reads claims with the same one): stop() leaves it open. */
  readonly client: KubeClient;
  readonly nodeName: string;
  /** Default gpu.nvidia.com. */
  readonly driver?: string;
  readonly log: Logger;
  /** Retry delays: the first, doubled up to the cap. Default 1 s to 30 s. */
  readonly backoff?: { readonly initialMs: number; readonly maxMs: number };
  /** Where sysfs is (default /sys), for the GPUs' PCIe roots. */
  readonly sysfsRoot?: string;
  /** How many times a sync re-reads and retries at once after 409 Conflict before backing off. Default 3. */
  readonly conflictRetries?: number;
}

/** What the publisher has done, for tests and `info`. */
export interface PublisherStatus {
  /** Syncs that ended with the slices equal to the snapshot. */
  readonly synced: number;
  /** The pool generation last written, or null. */
  readonly generation: number | null;
  /** The API server does not answer (or refuses) now. */
  readonly failing: string | null;
  /** Syncs that failed (each is retried). */
  readonly failures: number;
  /** How many devices the slices last written hold, or null before the first write. */
  readonly devices: number | null;
}

/** The slices' names: `<node>-<driver>-<n>`, the node part shortened if the whole would pass 253. */
export function sliceName(nodeName: string, driver: string, n: number): string {
  const suffix = `-${driver}-${n}`;
  return `${nodeName.slice(0, 253 - suffix.length).replace(/[-.]+$/, '')}${suffix}`;
}

/** The PCIe root of a device from its sysfs path (`…/devices/pci0000:00/0000:00:01.0/0000:07:00.0` → pci0000:00). */
export function pcieRootOfPath(path: string): string | null {
  const m = /\/devices\/pci([0-9a-f]{4,8}):([0-9a-f]{2})(?:\/|$)/i.exec(path);
  if (m === null) return null;
  return `pci${(m[1] ?? '').slice(-4).toLowerCase()}:${(m[2] ?? '').toLowerCase()}`;
}

/**
 * Whether these credentials can do what the publisher and the kubelet plugin need. null when they
 * can; otherwise what they cannot, worded for a refusal to start. Throws KubeUnreachableError when
 * the API server cannot be asked (the caller starts anyway: the publisher retries).
 */
export async function accessProblem(client: KubeClient, timeoutMs?: number): Promise<string | null> {
  const verdict = await checkAccess(client, undefined, timeoutMs);
  if (verdict.ok) return null;
  return (
    `the credentials in ${client.target.source} may not ${verdict.denied.join(', ')} on ${client.server}; ` +
    `DRA mode needs them (apply the RBAC shipped with the package for this node's user)`
  );
}

/** The API server has no Node of our name: slices for it would be owned by nothing and scheduled nowhere. */
export class NodeUnknownError extends Error {
  override name = 'NodeUnknownError';
  constructor(node: string, server: string) {
    super(
      `the API server ${server} has no Node named ${JSON.stringify(node)}; is the node name right (it must ` +
        `be the kubelet's --hostname-override or the host name), and has the kubelet registered the node?`,
    );
  }
}

interface Written {
  /** What the pool meant when written (JSON of our own description). */
  readonly key: string;
  readonly generation: number;
  readonly devices: number;
}

export class SlicePublisher implements NodeConsumer {
  readonly name = 'DRA ResourceSlices';
  private readonly o: SlicePublisherOptions;
  private readonly driver: string;
  private readonly timers = new TimerOwner();
  private readonly queue: CoalescingQueue<null>;
  private readonly pcieRoots = new Map<string, string | null>();
  private snapshot: NodeSnapshot | null = null;
  private lastDriverVersion: string | null = null;
  /** The settings in force: the MIG strategy and the consumable capacity. */
  private settings: NodeSettings | null = null;
  private written: Written | null = null;
  private nodeUid: string | null = null;
  private dirty = false;
  private failing: string | null = null;
  private loggedError: string | null = null;
  private notes = '';
  private delayMs: number;
  private syncedCount = 0;
  private stopped = false;
  private readonly waiters: (() => void)[] = [];
  private failures = 0;
  /** 'synced' after each sync that left the slices current, 'failed' (with the error) after each that failed. */
  readonly events = new EventEmitter<{ synced: []; failed: [err: unknown] }>();

  constructor(o: SlicePublisherOptions) {
    this.o = o;
    this.driver = o.driver ?? DEFAULT_DRA_DRIVER;
    this.delayMs = o.backoff?.initialMs ?? 1000;
    this.queue = new CoalescingQueue<null>(
      () => this.run(),
      () => null,
    );
  }

  status(): PublisherStatus {
    return {
      synced: this.syncedCount,
      generation: this.written?.generation ?? null,
      failing: this.failing,
      failures: this.failures,
      devices: this.written?.devices ?? null,
    };
  }

  apply(applied: AppliedSnapshot<NodeSettings>): void {
    const capacity = applied.settings.plan.consumableCapacity;
    if (JSON.stringify(capacity ?? null) !== JSON.stringify(this.settings?.plan.consumableCapacity ?? null)) {
      const misfit = capacityFitProblem(applied.snapshot.gpus, capacity);
      if (misfit !== null) throw new SharingError(misfit.path, misfit.message);
    }
    this.settings = applied.settings;
    this.snapshot = applied.snapshot;
    this.lastDriverVersion = applied.snapshot.driverVersion ?? this.lastDriverVersion;
    this.kick();
  }

  /** Writes the node's slices again whatever we remember (after every kubelet registration). */
  republish(): void {
    this.dirty = true;
    this.kick();
  }

  /** Resolves once a sync has left the slices equal to the latest snapshot (tests, and a clean stop). */
  whenSynced(): Promise<void> {
    if (this.isCurrent()) return Promise.resolve();
    return new Promise((resolve) => this.waiters.push(resolve));
  }

  /**
   * The daemon is stopping: no further sync, no retry, and a request still in flight is not
   * reported when it fails — the caller then closes the shared client, which ends that request at
   * once instead of at its timeout (an API server that hangs must not hold the stop up).
   */
  halt(): void {
    this.stopped = true;
    this.timers.dispose();
  }

  async stop(): Promise<void> {
    this.halt();
    await this.queue.close();
    for (const w of this.waiters.splice(0)) w();
  }

  private isCurrent(): boolean {
    if (this.snapshot === null || this.dirty || this.written === null) return false;
    return this.written.key === this.keyOf(this.content());
  }

  private kick(): void {
    if (this.stopped) return;
    this.timers.clear('retry');
    // Never rejects: run() catches everything.
    void this.queue.request(null);
  }

  private content(): PoolContent {
    const s = this.snapshot as NodeSnapshot;
    const roots = new Map<string, string>();
    for (const g of s.gpus) {
      const r = this.pcieRoots.get(g.busId);
      if (r !== undefined && r !== null) roots.set(g.busId, r);
    }
    const plan = this.settings?.plan;
    const capacity = plan?.consumableCapacity;
    return poolContent(
      s,
      {
        nodeName: this.o.nodeName,
        migStrategy: plan?.migStrategy ?? 'none',
        pcieRoots: roots,
        ...(this.lastDriverVersion !== null ? { lastDriverVersion: this.lastDriverVersion } : {}),
        ...(capacity !== undefined ? { consumableCapacity: capacity } : {}),
      },
      this.driver,
    );
  }

  private keyOf(c: PoolContent): string {
    return JSON.stringify(c.slices);
  }

  private async readPcieRoots(s: NodeSnapshot): Promise<void> {
    const sysfs = this.o.sysfsRoot ?? '/sys';
    for (const g of s.gpus) {
      if (this.pcieRoots.has(g.busId)) continue;
      let root: string | null = null;
      try {
        root = pcieRootOfPath(await realpath(join(sysfs, 'bus', 'pci', 'devices', standardBusId(g.busId))));
      } catch {
        root = null;
      }
      this.pcieRoots.set(g.busId, root);
    }
  }

  private async run(): Promise<void> {
    if (this.stopped || this.snapshot === null) return;
    try {
      await this.readPcieRoots(this.snapshot);
      const content = this.content();
      const notes = content.notes.join('\n');
      if (notes !== this.notes) {
        for (const n of content.notes) this.o.log.info('DRA: device not published', { note: n });
        this.notes = notes;
      }
      const key = this.keyOf(content);
      if (this.dirty || this.written?.key !== key) {
        const republish = this.dirty;
        this.dirty = false;
        await this.sync(content, key, republish);
      }
      this.succeeded();
    } catch (err) {
      this.failed(err);
    }
  }

  private async sync(content: PoolContent, key: string, republish: boolean): Promise<void> {
    const client = this.o.client;
    if (this.nodeUid === null) {
      try {
        this.nodeUid = (await getNode(client, this.o.nodeName)).metadata.uid ?? null;
      } catch (err) {
        if (err instanceof KubeApiError && err.code === 404) throw new NodeUnknownError(this.o.nodeName, client.server);
        throw err;
      }
    }
    const retries = this.o.conflictRetries ?? 3;
    for (let attempt = 0; ; attempt++) {
      try {
        const generation = await this.write(content);
        const was = this.written?.generation;
        const devices = content.slices.reduce((n, sl) => n + sl.length, 0);
        this.written = { key, generation, devices };
        this.o.log.info(republish ? 'DRA: ResourceSlices published again' : 'DRA: ResourceSlices published', {
          node: this.o.nodeName,
          driver: this.driver,
          slices: content.slices.length,
          devices,
          generation,
          ...(was !== undefined ? { was } : {}),
        });
        return;
      } catch (err) {
        if (err instanceof KubeApiError && err.code === 409 && attempt < retries) continue;
        throw err;
      }
    }
  }

  /** One write of the pool; returns its generation. Throws what the API server says. */
  private async write(content: PoolContent): Promise<number> {
    const client = this.o.client;
    const existing = await listNodeSlices(client, this.o.nodeName, this.driver);
    const generation =
      Math.max(this.written?.generation ?? 0, ...existing.map((s) => s.spec?.pool?.generation ?? 0)) + 1;
    const count = content.slices.length;
    const names = content.slices.map((_, i) => sliceName(this.o.nodeName, this.driver, i));
    const byName = new Map(existing.map((s) => [s.metadata.name ?? '', s]));
    // Slices of ours under other names (another version, NVIDIA's generated names) are reused in
    // place for the slices we would otherwise create.
    const spare = existing.filter((s) => !names.includes(s.metadata.name ?? ''));
    const owner =
      this.nodeUid === null
        ? []
        : [{ apiVersion: 'v1', kind: 'Node', name: this.o.nodeName, uid: this.nodeUid, controller: true }];
    const body = (name: string, devices: readonly SliceDevice[], from?: ResourceSlice): ResourceSlice => ({
      metadata: {
        name,
        ...(from?.metadata.resourceVersion !== undefined ? { resourceVersion: from.metadata.resourceVersion } : {}),
        ...(from?.metadata.uid !== undefined ? { uid: from.metadata.uid } : {}),
        ownerReferences: owner,
      },
      spec: {
        driver: this.driver,
        nodeName: this.o.nodeName,
        pool: { name: content.pool, generation, resourceSliceCount: count },
        devices,
      },
    });
    for (let i = 0; i < count; i++) {
      const devices = content.slices[i] as readonly SliceDevice[];
      const name = names[i] as string;
      const there = byName.get(name) ?? spare.shift();
      if (there !== undefined) await updateSlice(client, body(there.metadata.name ?? name, devices, there));
      else await createSlice(client, body(name, devices));
    }
    for (const s of spare) await deleteSlice(client, s.metadata.name ?? '', s.metadata.uid);
    return generation;
  }

  private succeeded(): void {
    this.delayMs = this.o.backoff?.initialMs ?? 1000;
    this.loggedError = null;
    if (this.failing !== null) {
      this.o.log.info('DRA: the API server answers again; ResourceSlices are current', {
        server: this.o.client.server,
        node: this.o.nodeName,
      });
      this.failing = null;
    }
    if (this.isCurrent()) {
      this.syncedCount++;
      for (const w of this.waiters.splice(0)) w();
      this.events.emit('synced');
    }
  }

  private failed(err: unknown): void {
    if (this.stopped) return;
    const text = errorText(err);
    if (err instanceof KubeUnreachableError || (err instanceof KubeApiError && err.code >= 500)) {
      if (this.failing === null) {
        this.o.log.warn('DRA: the API server does not answer; ResourceSlices will be published when it does', {
          server: this.o.client.server,
          node: this.o.nodeName,
          error: text,
        });
      }
    } else if (this.loggedError !== text) {
      const forbidden = err instanceof KubeApiError && (err.code === 401 || err.code === 403);
      const what = forbidden
        ? 'DRA: the API server refuses our credentials; ResourceSlices cannot be published until the RBAC allows it'
        : err instanceof NodeUnknownError
          ? 'DRA: ResourceSlices cannot be published for a node the API server does not know'
          : 'DRA: the API server refused the ResourceSlices';
      this.o.log.error(what, {
        server: this.o.client.server,
        node: this.o.nodeName,
        error: text,
      });
      this.loggedError = text;
    }
    this.failing = text;
    // The same request would fail the same way at once: wait, then try again (a new snapshot or a
    // republish tries at once).
    const delay = this.delayMs;
    this.delayMs = Math.min(this.delayMs * 2, this.o.backoff?.maxMs ?? 30_000);
    this.failures++;
    if (!this.stopped) this.timers.after('retry', delay, () => void this.queue.request(null));
    this.events.emit('failed', err);
  }
}
