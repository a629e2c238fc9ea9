// The DRA sharing agent: what the MPS unit's program does on a DRA node (`mps-control-daemon` with
// --kubelet-api=dra). The plugin, which has no privilege, writes one request per prepared claim that
// shares its GPUs (core/dra-sharing.ts: time-slices, an MPS daemon with limits) under
// <mps root>/dra/requests; this agent makes the host match them and answers each under
// <mps root>/dra/answers, naming the request it answers.
//
// * MPS: each claim's control daemon is a supervisor of its own (daemon.ts) under the claim's root
//   (<mps root>/dra/claims/<uid>: pipe, log, its own shm tmpfs), so it is restarted with backoff when it
//   dies and stopped (quit, compute modes back, shm unmounted, the directory removed) when its request
//   goes. A request rewritten with the same content is answered again without touching its daemon. A daemon unit
//   named by a dynamic MIG partition is its MIG device once made (or found made, after a kill): the daemon starts
//   after the instance, and at the claim's end stops before the instance is destroyed (it would be IN_USE).
// * Time-slices: every GPU named by a request gets its interval; a GPU no request names any more gets
//   Default back. What was set is kept in the agent's own state directory (the unit's StateDirectory, which
//   the plugin cannot reach), so a restarted agent puts back the GPUs it set before.
// * Every request is admitted first (core/dra-admission.ts): its claim named as Kubernetes names one, its GPUs
//   and MIG devices ones NVML lists, its values in range, and within the operator's limits beside the claims
//   already served. One that is not is answered "failed" with the reason, once per request id, and never stops
//   the others; only admitted requests reach a time-slice, a compute mode or a daemon.
// * One sync at a time (CoalescingQueue); a sync runs on every change of the request directory and every
//   RESCAN_MS (inotify can miss events). The agent's own restart keeps nothing running: the unit's stop
//   ends every daemon, and a start brings the requests' daemons up again.
import { watch } from 'node:fs';
import type { FSWatcher } from 'node:fs';
import { mkdir } from 'node:fs/promises';
import { join } from 'node:path';
import { admitRequest, resolveMpsUnits } from '../core/dra-admission.ts';
import type { AdmissionLimits, HostInventory } from '../core/dra-admission.ts';
import {
  answerDir,
  claimMpsRoot,
  requestDir,
  sameRequest,
  requestedTimeSlices,
  serializeAnswer,
} from '../core/dra-sharing.ts';
import { changesToApply } from '../core/dra-timeslice.ts';
import type { Answer, HostMps, HostRequest, RequestFile } from '../core/dra-sharing.ts';
import type { TimeSliceInterval } from '../core/dra-gpu-config.ts';
import type { MadePartition } from '../core/mig-instances.ts';
import { errorText } from '../system/log.ts';
import { ensureDir, removeFile, removeTree, safeComponent, writeFileSafely } from '../system/safe-fs.ts';
import type { Logger } from '../system/log.ts';
import { CoalescingQueue, TimerOwner } from '../system/timers.ts';
import { readRequestFiles, readTimeSliceRecord, writeTimeSliceRecord } from './agent-files.ts';
import type { RequestRead } from './agent-files.ts';
import { startClaimDaemon } from './claim-daemon.ts';
import { MigPartitions } from './mig-partitions.ts';
import type { MigPort } from './mig-partitions.ts';
import type { MpsHost, MpsSupervisor } from './daemon.ts';

/** How often the request directory is read again even without an event. */
export const RESCAN_MS = 2000;

export interface DraAgentOptions {
  readonly mpsRoot: string;
  /**
   * The host of one claim's daemon (daemon-host.ts's RealMpsHost with the claim's root, confined below
   * `claimsDir`: confined-host.ts).
   */
  readonly hostFor: (claimRoot: string, claimsDir: string) => MpsHost;
  /** This node's GPUs and MIG devices as NVML lists them now (agent-inventory.ts). */
  readonly inventory: () => Promise<HostInventory>;
  readonly limits: AdmissionLimits;
  /** The agent's own directory (a real one of root's the plugin cannot write), for timeslices.json. */
  readonly stateDir: string;
  /** Sets a GPU's time-slice (timeslice.ts); throws naming what failed. */
  readonly setTimeSlice: (uuid: string, interval: TimeSliceInterval) => Promise<void>;
  readonly log: Logger;
  /** sd_notify STATUS lines. */
  readonly status?: (line: string) => void;
  readonly rescanMs?: number;
  /** After each sync (tests wait on it). */
  readonly onSynced?: () => void;
  /** NVML's MIG instance calls (mig-instances port); absent: a request for MIG partitions is refused. */
  readonly migPort?: MigPort;
}

interface Running {
  /** The request as the plugin wrote it. */
  readonly file: RequestFile;
  /** As admitted: what the agent acts on. */
  readonly request: HostRequest;
  readonly supervisor: MpsSupervisor | null;
  /** The dynamic MIG partitions made for it. */
  readonly made: readonly MadePartition[];
}

/** What one sync serves and what it refuses (by uid; `key` is what a refusal is remembered by). */
interface Admitted {
  readonly served: Map<string, { readonly file: RequestFile; readonly request: HostRequest }>;
  readonly refused: Map<string, { readonly id: string | null; readonly key: string; readonly error: string }>;
}

export class DraSharingAgent {
  private readonly o: DraAgentOptions;
  private readonly timers = new TimerOwner();
  private readonly running = new Map<string, Running>();
  /** Requests refused, by uid: what the refusal is remembered by, so one is refused once, until it changes. */
  private readonly refused = new Map<string, string>();
  /** The time-slice each GPU was given by this agent (absent: never set, or set back to Default). */
  private applied = new Map<string, TimeSliceInterval>();
  private readonly syncs: CoalescingQueue<void>;
  private watcher: FSWatcher | undefined;
  private stopped = false;
  private synced = 0;
  private readonly partitions: MigPartitions | null;

  constructor(o: DraAgentOptions) {
    this.o = o;
    this.partitions =
      o.migPort === undefined ? null : new MigPartitions({ port: o.migPort, stateDir: o.stateDir, log: o.log });
    this.syncs = new CoalescingQueue<void>(
      () => this.sync(),
      () => undefined,
    );
  }

  /** One sync that begins after this call, done (what a change of the request directory brings). */
  syncNow(): Promise<void> {
    return this.syncs.request();
  }

  /** Syncs completed so far (tests wait on it). */
  get syncCount(): number {
    return this.synced;
  }

  private get claimsDir(): string {
    return `${this.o.mpsRoot}/dra/claims`;
  }

  /** A claim's root, `claims/<uid>`, for a uid that is one safe path component; throws for any other. */
  private claimRoot(uid: string): string {
    if (!safeComponent(uid)) throw new Error(`claim uid ${JSON.stringify(uid)} is not a single safe path component`);
    return claimMpsRoot(this.o.mpsRoot, uid);
  }

  /**
   * The MPS root (the host's), then the agent's tree below it, each a real directory of root's, 0755: a symlink
   * or a directory of another owner there is refused (the plugin only writes requests, not answers or claims).
   */
  private async makeTree(): Promise<void> {
    const root = this.o.mpsRoot;
    await mkdir(root, { recursive: true, mode: 0o755 });
    for (const dir of [`${root}/dra`, requestDir(root), answerDir(root), this.claimsDir]) await ensureDir(root, dir);
  }

  async start(): Promise<void> {
    const requests = requestDir(this.o.mpsRoot);
    await this.makeTree();
    this.applied = await readTimeSliceRecord(this.o.stateDir, this.o.mpsRoot);
    await this.partitions?.load();
    try {
      this.watcher = watch(requests, () => void this.syncs.request());
      this.watcher.on('error', (err) => this.o.log.warn('cannot watch the DRA requests', { error: errorText(err) }));
    } catch (err) {
      this.o.log.warn('cannot watch the DRA requests; reading them every few seconds', { error: errorText(err) });
    }
    this.timers.every('rescan', this.o.rescanMs ?? RESCAN_MS, () => void this.syncs.request());
    this.o.log.info('DRA sharing agent started', { requests, answers: answerDir(this.o.mpsRoot) });
    await this.syncs.request();
  }

  /**
   * Which requests this sync serves: those served already and unchanged keep their place; each new or changed one
   * is admitted beside them (core/dra-admission.ts) against NVML's list of this node's devices, read once per
   * sync that has one. A request refused before under the same id stays refused without being looked at again.
   */
  private async admit(read: ReadonlyMap<string, RequestRead>): Promise<Admitted> {
    const served: Admitted['served'] = new Map();
    const refused: Admitted['refused'] = new Map();
    for (const [uid, r] of read) {
      const was = this.running.get(uid);
      if ('file' in r && was !== undefined && sameRequest(was.file.request, r.file.request))
        served.set(uid, { file: r.file, request: was.request });
    }
    let inventory: HostInventory | undefined;
    for (const [uid, r] of read) {
      if (served.has(uid)) continue;
      if (!('file' in r)) {
        refused.set(uid, r);
        continue;
      }
      const key = r.file.id;
      if (this.refused.get(uid) === key) {
        refused.set(uid, { id: key, key, error: '' });
        continue;
      }
      inventory ??= await this.o.inventory();
      const held = [...served.values()].map((x) => x.request);
      const verdict = admitRequest(r.file.request, held, inventory, this.o.limits);
      if ('error' in verdict) refused.set(uid, { id: key, key, error: verdict.error });
      else served.set(uid, { file: r.file, request: verdict.request });
    }
    return { served, refused };
  }

  private async sync(): Promise<void> {
    if (this.stopped) return;
    const read = await readRequestFiles(this.o.mpsRoot);
    const { served, refused } = await this.admit(read).catch((err: unknown) => {
      // NVML could not list the devices: nothing new is admitted this time, the claims served stay served.
      this.o.log.error("cannot list this node's GPUs to check the DRA requests; trying again", {
        error: errorText(err),
      });
      const keep: Admitted['served'] = new Map();
      for (const [uid, r] of this.running) if (read.has(uid)) keep.set(uid, { file: r.file, request: r.request });
      return { served: keep, refused: new Map() } satisfies Admitted;
    });
    // Time-slices first: a claim's answer goes (its unprepare returns) only once its GPUs are back at Default.
    const sliceProblems = await this.applyTimeSlices([...served.values()].map((f) => f.request));
    for (const [uid, r] of [...this.running]) if (!served.has(uid)) await this.end(uid, r);
    // Partitions of claims no request wants any more: those whose end failed, and those a killed agent left.
    for (const uid of this.partitions?.claims() ?? [])
      if (!served.has(uid) && !this.running.has(uid) && (await this.releasePartitions(uid)))
        await this.removeAnswer(uid);
    for (const uid of [...this.refused.keys()]) if (!read.has(uid)) await this.forget(uid);
    for (const [uid, r] of refused) if (this.refused.get(uid) !== r.key) await this.refuse(uid, r);
    for (const [uid, { file, request }] of served) {
      // One the agent cannot set up (a claim tree in the way, say) is answered "failed" once; the others are served.
      await this.serve(uid, file, request, sliceProblems).then(
        () => this.refused.delete(uid),
        (err: unknown) => this.refuse(uid, { id: file.id, key: file.id, error: errorText(err) }),
      );
    }
    this.synced++;
    this.o.onSynced?.();
    this.o.status?.(`STATUS=DRA sharing: ${this.running.size} claim${this.running.size === 1 ? '' : 's'}`);
  }

  private async serve(
    uid: string,
    file: RequestFile,
    request: HostRequest,
    sliceProblems: ReadonlyMap<string, string>,
  ): Promise<void> {
    this.claimRoot(uid);
    const was = this.running.get(uid);
    if (was !== undefined && sameRequest(was.file.request, file.request)) {
      this.running.set(uid, { ...was, file });
    } else {
      if (was !== undefined && !(await this.end(uid, was)))
        throw new Error('its earlier MIG partitions are not gone yet');
      const made = await this.makePartitions(uid, request);
      this.running.set(uid, { file, request, made, supervisor: await this.startDaemon(request, made) });
    }
    await this.answer(uid, file, request, sliceProblems);
  }

  /** A refused request went (its claim unprepared): its answer goes too, the plugin's word that the claim ended. */
  private async forget(uid: string): Promise<void> {
    this.refused.delete(uid);
    if (safeComponent(uid)) await this.removeAnswer(uid);
  }

  /** A request the agent does not serve: logged, and answered "failed" with the reason where it can be. */
  private async refuse(uid: string, r: { readonly id: string | null; readonly key: string; readonly error: string }) {
    this.refused.set(uid, r.key);
    this.o.log.error('refused a DRA sharing request', { uid, request: r.id, error: r.error });
    if (r.id === null || !safeComponent(uid)) return;
    const a: Answer = { id: r.id, state: 'failed', error: r.error };
    await writeFileSafely(this.o.mpsRoot, join(answerDir(this.o.mpsRoot), `${uid}.json`), serializeAnswer(a)).catch(
      (e: unknown) => this.o.log.error('cannot answer a DRA request', { uid, error: errorText(e) }),
    );
  }

  /** Every GPU at the interval its requests want (Default when none does); per GPU, what failed. */
  private async applyTimeSlices(requests: readonly RequestFile['request'][]): Promise<Map<string, string>> {
    const problems = new Map<string, string>();
    const changes = changesToApply(this.applied, requestedTimeSlices(requests));
    for (const { gpuUuid, to } of changes) {
      try {
        await this.o.setTimeSlice(gpuUuid, to);
        if (to === 'Default') this.applied.delete(gpuUuid);
        else this.applied.set(gpuUuid, to);
        this.o.log.info('time-slice set', { gpu: gpuUuid, interval: to });
      } catch (err) {
        problems.set(gpuUuid, errorText(err));
        this.o.log.error('cannot set a time-slice', { gpu: gpuUuid, interval: to, error: errorText(err) });
      }
    }
    if (changes.length > 0) await this.saveApplied();
    return problems;
  }

  private async saveApplied(): Promise<void> {
    await writeTimeSliceRecord(this.o.stateDir, this.applied);
  }

  /** The claim's daemon, its units named by partition resolved to the MIG devices made for them (NVML read again). */
  private async startDaemon(request: HostRequest, made: readonly MadePartition[]): Promise<MpsSupervisor | null> {
    if (request.mps === undefined) return null;
    const mps: HostMps | { error: string } =
      (request.mps.partitionUnits ?? []).length === 0
        ? request.mps
        : resolveMpsUnits(request.mps, made, await this.o.inventory());
    if ('error' in mps) throw new Error(mps.error);
    const root = this.claimRoot(request.claim.uid);
    // A claim root that is no real directory of root's (a link planted there) refuses the claim at once, before a
    // supervisor would try it again and again.
    await ensureDir(this.claimsDir, root);
    const c = request.claim;
    const log = this.o.log.child({ claim: `${c.namespace}/${c.name}`, uid: c.uid });
    return startClaimDaemon(mps, root, this.o.hostFor(root, this.claimsDir), log);
  }

  private async answer(
    uid: string,
    file: RequestFile,
    request: HostRequest,
    sliceProblems: ReadonlyMap<string, string>,
  ): Promise<void> {
    const problems = request.timeSlices.flatMap((t) => {
      const p = sliceProblems.get(t.uuid);
      return p === undefined ? [] : [`time-slice of GPU ${t.uuid}: ${p}`];
    });
    const daemon = this.running.get(uid)?.supervisor?.problem ?? null;
    if (daemon !== null) problems.push(`its MPS control daemon is not up: ${daemon}`);
    const made = this.running.get(uid)?.made ?? [];
    const a: Answer =
      problems.length > 0
        ? { id: file.id, state: 'failed', error: problems.join('; ') }
        : made.length > 0
          ? { id: file.id, state: 'ready', partitions: made }
          : { id: file.id, state: 'ready' };
    await writeFileSafely(this.o.mpsRoot, join(answerDir(this.o.mpsRoot), `${uid}.json`), serializeAnswer(a));
  }

  /** The claim's MIG partitions made (or found made); none when it asks none. */
  private async makePartitions(uid: string, request: HostRequest): Promise<readonly MadePartition[]> {
    const wanted = request.partitions ?? [];
    if (wanted.length === 0) return [];
    if (this.partitions === null)
      throw new Error("this agent cannot make MIG partitions: the driver's NVML has no MIG instance calls");
    return this.partitions.ensure(uid, wanted);
  }

  /** The claim's MIG partitions destroyed; false (logged) when one could not be, to be tried at the next sync. */
  private async releasePartitions(uid: string): Promise<boolean> {
    if (this.partitions === null || !this.partitions.claims().includes(uid)) return true;
    return this.partitions.release(uid).then(
      () => true,
      (err: unknown) => {
        this.o.log.error("cannot destroy a claim's MIG partitions; trying again", { uid, error: errorText(err) });
        return false;
      },
    );
  }

  /**
   * A claim's request went: its daemon stopped, its directory, MIG partitions (unless `keepPartitions`: the agent's
   * own stop, which leaves them to the next agent) and answer removed. False while a partition is left, when the
   * answer stays (the plugin's unprepare waits for its removal) and the next sync tries again.
   */
  private async end(uid: string, r: Running, keepPartitions = false): Promise<boolean> {
    this.running.delete(uid);
    if (r.supervisor !== null) {
      await r.supervisor
        .stop()
        .catch((err: unknown) =>
          this.o.log.warn("a claim's MPS control daemon did not stop cleanly", { uid, error: errorText(err) }),
        );
      await removeTree(this.claimsDir, this.claimRoot(uid)).catch((err: unknown) =>
        this.o.log.warn("cannot remove a claim's MPS directory", { uid, error: errorText(err) }),
      );
      this.o.log.info("a claim's MPS control daemon stopped", { uid });
    }
    if (!keepPartitions && !(await this.releasePartitions(uid))) return false;
    await this.removeAnswer(uid);
    return true;
  }

  private async removeAnswer(uid: string): Promise<void> {
    await removeFile(this.o.mpsRoot, join(answerDir(this.o.mpsRoot), `${uid}.json`)).catch((err: unknown) =>
      this.o.log.warn("cannot remove a claim's answer", { uid, error: errorText(err) }),
    );
  }

  /** Stops every daemon and puts every time-slice back (the unit's stop). */
  async stop(): Promise<void> {
    this.stopped = true;
    this.watcher?.close();
    this.timers.dispose();
    await this.syncs.close();
    await Promise.all([...this.running].map(([uid, r]) => this.end(uid, r, true)));
    for (const uuid of [...this.applied.keys()]) {
      await this.o.setTimeSlice(uuid, 'Default').then(
        () => this.applied.delete(uuid),
        (err: unknown) => this.o.log.warn('cannot put a time-slice back', { gpu: uuid, error: errorText(err) }),
      );
    }
    await this.saveApplied().catch(() => undefined);
  }
}
