// The DRA ResourceSlice publisher: a consumer of the live node model (node/consumer.ts) that keeps
// this node's ResourceSlices on the API server equal to the latest snapshot, as core/dra-slices.ts
// describes it. Split along its jobs: this file drives (when to sync, retries, the watch), the
// converging write is slice-writer.ts, what the operator is told is slice-log.ts.
//
// * apply() records the snapshot and wakes the writer, never waiting on the API server: a slow, down or
//   refusing one never holds up the node. It throws only for a new consumable capacity (start, reload) that
//   does not fit the GPUs (core/dra-capacity.ts): the start fails, the reload is refused.
// * Converge, never remember: the writer runs one sync at a time (later requests fold into one more
//   run). A sync is needed when the content changed, after republish(), after any failure, when the
//   watch (slice-watch.ts) or the periodic resync sees our slices differ from what the API server
//   last confirmed; each sync lists the node's slices fresh and writes only what differs. The slices
//   count as current only once the server confirmed the write.
// * 409 Conflict (someone else wrote a slice meanwhile) → read again and retry at once, a few times;
//   anything else that fails (server down, timeout, 5xx, 429, 403) → retried with capped backoff on a
//   TimerOwner timer.
// * republish(): the kubelet deletes every slice of its node at its start (and ours 30 s after our
//   plugin's connection goes away), so the kubelet plugin calls this after every registration.
// * pcieRoot: the PCIe root complex of a GPU (`pci<domain>:<bus>`) is read from sysfs, the first
//   `pci<domain>:<bus>` component of /sys/bus/pci/devices/<bdf>'s real path, once per GPU.
import { PoolSource } from './pool-source.ts';
export { pcieRootOfPath } from './pool-source.ts';
import type { ServerVersion } from './pool-source.ts';
import { EventEmitter } from 'node:events';
import { DEFAULT_DRA_DRIVER } from '../core/dra-slices.ts';
import type { PoolContent } from '../core/dra-slices.ts';
import { capacityFitProblem } from '../core/dra-capacity.ts';
import { SharingError } from '../core/sharing.ts';
import type { NodeSnapshot } from '../core/snapshot.ts';
import { KubeApiError } from '../k8s/client.ts';
import type { KubeClient } from '../k8s/client.ts';
import { checkAccess, getNode, serverVersion } from '../k8s/resources.ts';
import type { ResourceSlice } from '../k8s/resources.ts';
import type { WatchEvent } from '../k8s/watch.ts';
import type { AppliedSnapshot, NodeConsumer, NodeSettings } from '../node/consumer.ts';
import { errorText } from '../system/log.ts';
import type { Logger } from '../system/log.ts';
import { CoalescingQueue, TimerOwner } from '../system/timers.ts';
import { NodeUnknownError, PublishLog } from './slice-log.ts';
import { convergePool, untouched } from './slice-writer.ts';
import type { Confirmed } from './slice-writer.ts';
import { SliceWatch } from './slice-watch.ts';

export { NodeUnknownError } from './slice-log.ts';
export { sliceName } from './slice-writer.ts';

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
  /** Watch our slices and restore what someone else deletes or edits (default true). */
  readonly watch?: boolean;
  /** The fallback: a sync this often even when nothing seems to change (default 10 min; 0: none). */
  readonly resyncMs?: number;
  /** How long the API server keeps one watch open (default 300 s). */
  readonly watchTimeoutSeconds?: number;
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

export class SlicePublisher implements NodeConsumer {
  readonly name = 'DRA ResourceSlices';
  private readonly o: SlicePublisherOptions;
  private readonly driver: string;
  private readonly timers = new TimerOwner();
  private readonly queue: CoalescingQueue<null>;
  private readonly source: PoolSource;
  private readonly say: PublishLog;
  private snapshot: NodeSnapshot | null = null;
  /** The settings in force: the MIG strategy and the consumable capacity. */
  private settings: NodeSettings | null = null;
  /** What the API server last confirmed writing; never what we merely sent. */
  private confirmed: Confirmed | null = null;
  /** A sync must look at the server even if the content did not change (start, republish, failure, drift). */
  private stale = true;
  /** Bumped each time the slices are marked stale: a sync clears `stale` only if none came meanwhile. */
  private staleSeq = 0;
  /** The next sync that writes is a republish (after a kubelet registration), for the log. */
  private republishing = false;
  private nodeUid: string | null = null;
  private notes = '';
  private syncedCount = 0;
  private stopped = false;
  private watch: SliceWatch | null = null;
  private readonly waiters: (() => void)[] = [];
  /** 'synced' after each sync that left the slices current, 'failed' (with the error) after each that failed. */
  readonly events = new EventEmitter<{ synced: []; failed: [err: unknown] }>();

  constructor(o: SlicePublisherOptions) {
    this.o = o;
    this.driver = o.driver ?? DEFAULT_DRA_DRIVER;
    this.source = new PoolSource({
      nodeName: o.nodeName,
      driver: this.driver,
      sysfsRoot: o.sysfsRoot ?? '/sys',
      log: o.log,
    });
    this.say = new PublishLog(o.log, o.client.server, o.nodeName, o.backoff);
    this.queue = new CoalescingQueue<null>(
      () => this.run(),
      () => null,
    );
  }

  status(): PublisherStatus {
    return {
      synced: this.syncedCount,
      generation: this.confirmed?.generation ?? null,
      failing: this.say.failing,
      failures: this.say.failures,
      devices: this.confirmed?.devices ?? null,
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
    if (applied.reason === 'reload') {
      // The cluster may have been upgraded, or its DRAPartitionableDevices gate turned on, since.
      this.source.retryCounters();
      this.readServerVersion();
    }
    this.kick();
  }

  /** Looks at the node's slices on the server again and writes what is missing (after every kubelet registration). */
  republish(): void {
    this.republishing = true;
    this.markStale();
    this.kick();
  }

  /** Resolves once a sync has left the slices equal to the latest snapshot (tests, and a clean stop). */
  whenSynced(): Promise<void> {
    if (this.isCurrent()) return Promise.resolve();
    return new Promise((resolve) => this.waiters.push(resolve));
  }

  /**
   * The daemon is stopping: no further sync, no retry, no watch, and a request still in flight is not
   * reported when it fails — the caller then closes the shared client, which ends that request at
   * once instead of at its timeout (an API server that hangs must not hold the stop up).
   */
  halt(): void {
    this.stopped = true;
    this.timers.dispose();
    this.watch?.stop();
  }

  async stop(): Promise<void> {
    this.halt();
    await this.queue.close();
    for (const w of this.waiters.splice(0)) w();
  }

  private isCurrent(): boolean {
    if (this.snapshot === null || this.stale || this.confirmed === null) return false;
    return this.confirmed.key === this.keyOf(this.source.content(this.snapshot, this.settings?.plan));
  }

  private markStale(): void {
    this.stale = true;
    this.staleSeq++;
  }

  private kick(): void {
    if (this.stopped) return;
    this.timers.clear('retry');
    // Never rejects: run() catches everything.
    void this.queue.request(null);
  }

  private startWatching(): void {
    if (this.watch !== null || this.stopped) return;
    const resync = this.o.resyncMs ?? 600_000;
    if (resync > 0) this.timers.every('resync', resync, () => this.drifted());
    if (this.o.watch === false) return;
    this.watch = new SliceWatch({
      client: this.o.client,
      nodeName: this.o.nodeName,
      driver: this.driver,
      log: this.o.log,
      ...(this.o.backoff !== undefined ? { backoff: this.o.backoff } : {}),
      ...(this.o.watchTimeoutSeconds !== undefined ? { timeoutSeconds: this.o.watchTimeoutSeconds } : {}),
      onList: (items) => this.onList(items),
      onEvent: (e) => this.onEvent(e),
    });
    this.watch.start();
  }

  /** A list from the watch: anything other than what the server confirmed to us is drift. */
  private onList(items: readonly ResourceSlice[]): void {
    if (this.confirmed === null || !untouched(items, this.confirmed)) this.drifted();
  }

  /**
   * A watch event: our own confirmed write comes back with the uid and resourceVersion we hold and is
   * ignored; anything else (deleted, re-created, edited, a slice we did not write) needs a sync. An
   * event of our own write that arrives before its answer costs one list, never a write.
   */
  private onEvent(e: WatchEvent<ResourceSlice>): void {
    const m = e.object.metadata ?? {};
    const stamp = this.confirmed?.slices.get(m.name ?? '');
    const ours = stamp !== undefined && stamp.uid === m.uid && stamp.resourceVersion === m.resourceVersion;
    if (e.type === 'DELETED' ? stamp !== undefined && stamp.uid === m.uid : !ours) this.drifted();
  }

  private drifted(): void {
    if (this.stopped || this.snapshot === null) return;
    this.markStale();
    this.kick();
  }

  /**
   * The API server's version: dynamic MIG's counter sets need 1.35 or later (pool-source.ts). Read at start and at
   * each reload, without holding either up.
   */
  readServerVersion(): void {
    serverVersion(this.o.client).then(
      (v) => this.setServerVersion(v),
      (err: unknown) => this.o.log.debug('DRA: cannot read the API server version', { error: errorText(err) }),
    );
  }

  setServerVersion(v: ServerVersion | null): void {
    this.source.setServerVersion(v);
    if (this.snapshot !== null) this.kick();
  }

  private keyOf(c: PoolContent): string {
    return JSON.stringify([c.counterSets ?? [], c.slices]);
  }

  private async run(): Promise<void> {
    if (this.stopped || this.snapshot === null) return;
    const seq = this.staleSeq;
    try {
      await this.source.readPcieRoots(this.snapshot);
      if (this.stopped) return;
      const content = this.source.content(this.snapshot, this.settings?.plan);
      const notes = content.notes.join('\n');
      if (notes !== this.notes) {
        for (const n of content.notes) this.o.log.info('DRA: device not published', { note: n });
        this.notes = notes;
      }
      const key = this.keyOf(content);
      if (this.stale || this.confirmed?.key !== key) {
        // Until the server confirms, nothing is current: a failure below leaves `stale` set, so the
        // retry reads the server afresh whatever this run wrote or meant to.
        this.stale = true;
        await this.sync(content, key);
        if (this.staleSeq === seq) this.stale = false;
      }
      this.succeeded();
    } catch (err) {
      this.failed(err);
    }
  }

  private async sync(content: PoolContent, key: string): Promise<void> {
    const client = this.o.client;
    if (this.nodeUid === null) {
      try {
        this.nodeUid = (await getNode(client, this.o.nodeName)).metadata.uid ?? null;
      } catch (err) {
        if (err instanceof KubeApiError && err.code === 404) throw new NodeUnknownError(this.o.nodeName, client.server);
        throw err;
      }
    }
    const target = { client, nodeName: this.o.nodeName, driver: this.driver, nodeUid: this.nodeUid };
    const retries = this.o.conflictRetries ?? 3;
    for (let attempt = 0; ; attempt++) {
      try {
        const before = this.confirmed;
        const r = await convergePool(target, content, key, before);
        this.confirmed = r.confirmed;
        if (r.countersDropped) {
          this.source.countersDropped();
          this.kick();
          return;
        }
        if (r.wrote) this.logWrite(r.confirmed, content.slices.length, before, r.drift);
        this.republishing = false;
        return;
      } catch (err) {
        if (err instanceof KubeApiError && err.code === 409 && attempt < retries) continue;
        throw err;
      }
    }
  }

  private logWrite(c: Confirmed, slices: number, before: Confirmed | null, drift: string): void {
    const republish = this.republishing;
    this.republishing = false;
    const was = before?.generation;
    const what = republish
      ? 'DRA: ResourceSlices published again'
      : drift !== '' && before?.key === c.key
        ? 'DRA: ResourceSlices restored (someone else changed them)'
        : 'DRA: ResourceSlices published';
    this.o.log.info(what, {
      node: this.o.nodeName,
      driver: this.driver,
      slices,
      devices: c.devices,
      generation: c.generation,
      ...(was !== undefined ? { was } : {}),
      ...(drift !== '' ? { found: drift } : {}),
    });
  }

  private succeeded(): void {
    if (this.stale) return;
    this.say.succeeded();
    // Watched from the first sync on: what the watch sees is compared with what was confirmed.
    this.startWatching();
    if (this.isCurrent()) {
      this.syncedCount++;
      for (const w of this.waiters.splice(0)) w();
      this.events.emit('synced');
    }
  }

  private failed(err: unknown): void {
    if (this.stopped) return;
    // The same request would fail the same way at once: wait, then try again (a new snapshot, a
    // republish or a watch event tries at once).
    const delay = this.say.failed(err);
    this.timers.after('retry', delay, () => void this.queue.request(null));
    this.events.emit('failed', err);
  }
}
