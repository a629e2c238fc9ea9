// Host sharing, the plugin's side: a claim that shares its GPUs by TimeSlicing or MPS, or asks for a dynamic MIG
// partition, needs the host changed, which this unprivileged process cannot do; it writes the claim's request
// (core/dra-sharing.ts) for the MPS unit's agent (mps/dra-agent.ts) and waits for the answer naming it. For an
// MPS claim it then writes the claim's CDI spec (its daemon's pipe and shm), whose ID prepare returns beside the
// GPU's; for partitions, their spec (core/dra-partition-cdi.ts: capability nodes, MIG UUID) from the answer.
// Unprepare removes both and waits a while for the agent to have ended the claim's daemon and put its
// time-slices back; an agent that does not answer then is logged, not refused (it cleans up when it runs
// again, from the requests it finds), so a stopped MPS unit never holds a pod's deletion up.
import { watch } from 'node:fs';
import type { FSWatcher } from 'node:fs';
import { access, mkdir, readFile, readdir, rename, rm, writeFile } from 'node:fs/promises';
import { join } from 'node:path';
import {
  answerDir,
  claimCdiSpec,
  parseAnswer,
  parseRequest,
  requestDir,
  sameRequest,
  serializeRequest,
} from '../core/dra-sharing.ts';
import type { Answer, HostRequest } from '../core/dra-sharing.ts';
import { capsMajor, partitionCdiSpec } from '../core/dra-partition-cdi.ts';
import type { MadePartition } from '../core/mig-instances.ts';
import { errorText } from '../system/log.ts';
import type { Logger } from '../system/log.ts';
import { CoalescingQueue, TimerOwner } from '../system/timers.ts';

/** The unit whose program answers the requests. */
export const AGENT_UNIT = 'gpu-device-plugin-mps.service';
/** How long prepare waits for the agent's answer (the kubelet gives the whole call 45 s). */
export const ANSWER_TIMEOUT_MS = 20000;
/** How long unprepare waits for the agent to have ended a claim. */
export const END_TIMEOUT_MS = 10000;
/** How often the answer is looked for besides inotify's events. */
const LOOK_MS = 250;

export interface HostSharingOptions {
  /** The MPS root (--mps-root); null: none configured, so no claim can share. */
  readonly mpsRoot: string | null;
  /** Where the claims' CDI specs are written (a directory the container runtime reads: /var/run/cdi). */
  readonly cdiDir: string;
  readonly log: Logger;
  readonly answerTimeoutMs?: number;
  readonly endTimeoutMs?: number;
  /** /proc (PROC_ROOT): its `devices` names the driver's nvidia-caps major, for a partition's capability nodes. */
  readonly procRoot?: string;
}

/** What prepare adds: the MPS spec's CDI ID, and each partition's (by device name). */
export interface SharingPrepared {
  readonly cdiDeviceIds: string[];
  readonly partitionIds: Readonly<Record<string, string>>;
}

function claimSpecFile(cdiDir: string, uid: string): string {
  return join(cdiDir, `gpu-device-plugin-claim-${uid}.json`);
}

function partitionSpecFile(cdiDir: string, uid: string): string {
  return join(cdiDir, `gpu-device-plugin-claim-${uid}-mig.json`);
}

/** What a request asks, for messages. */
function what(request: HostRequest): string {
  if (request.partitions !== undefined) return 'MIG partition';
  return request.mps !== undefined ? 'MPS' : 'time-slicing';
}

/** Replaces the file by rename; a failed write leaves nothing behind (no half-written temporary file). */
async function writeAtomically(path: string, text: string): Promise<void> {
  try {
    await writeFile(`${path}.tmp`, text, { mode: 0o644 });
    await rename(`${path}.tmp`, path);
  } catch (err) {
    await rm(`${path}.tmp`, { force: true }).catch(() => undefined);
    throw err;
  }
}

/** A claim's MPS CDI spec as written (one JSON document). */
function claimSpecText(mpsRoot: string, uid: string): string {
  return `${JSON.stringify(claimCdiSpec(mpsRoot, uid).spec, null, 1)}\n`;
}

export class HostSharing {
  private readonly o: HostSharingOptions;
  private written = 0;
  /** Each prepared claim's partitions as the agent made them (its answer), by claim UID. */
  private readonly made = new Map<string, readonly MadePartition[]>();

  constructor(o: HostSharingOptions) {
    this.o = o;
  }

  /** Why no request can be made for this claim at all (checked before anything is recorded); null when it can. */
  unavailable(request: HostRequest): string | null {
    if (this.o.mpsRoot !== null) return null;
    return (
      `it asks for ${what(request)}, which needs the MPS root (--mps-root, ` +
      `MPS_ROOT; the package's environment file sets /run/nvidia/mps) where ${AGENT_UNIT} finds the requests`
    );
  }

  /** Asks the agent for the claim's sharing and waits for it; the CDI IDs to add, or why not. */
  async prepare(request: HostRequest): Promise<SharingPrepared | { error: string }> {
    const root = this.o.mpsRoot;
    const asks = what(request);
    const unavailable = this.unavailable(request);
    if (root === null || unavailable !== null) return { error: unavailable ?? '' };
    const uid = request.claim.uid;
    const id = `${uid}/${process.pid}/${++this.written}/${Date.now()}`;
    try {
      await mkdir(requestDir(root), { recursive: true, mode: 0o755 });
      await writeAtomically(join(requestDir(root), `${uid}.json`), serializeRequest({ id, request }));
    } catch (err) {
      return { error: `cannot write its ${asks} request for ${AGENT_UNIT}: ${errorText(err)}` };
    }
    const answer = await this.awaitAnswer(root, uid, id);
    if (answer === null)
      return {
        error:
          `${AGENT_UNIT} did not answer its ${asks} request within ${this.answerTimeoutMs / 1000} s ` +
          `(is it running? systemctl status ${AGENT_UNIT}); the kubelet asks again`,
      };
    if (answer.state === 'failed') return { error: `${AGENT_UNIT} could not set up its ${asks}: ${answer.error}` };
    const parts = await this.ensurePartitionSpec(uid, answer.partitions ?? []);
    if ('error' in parts) return parts;
    if (request.mps === undefined) return { cdiDeviceIds: [], partitionIds: parts.ids };
    const problem = await this.ensureSpec(request);
    if (problem !== null) return { error: problem };
    return { cdiDeviceIds: [claimCdiSpec(root, uid).id], partitionIds: parts.ids };
  }

  /** The MIG UUID the agent made for the claim's partition (a device name), once its answer said so. */
  madeUuid(uid: string, device: string): string | undefined {
    return this.made.get(uid)?.find((p) => p.device === device)?.uuid;
  }

  /** The claim's partition spec written as the made partitions say (none: no file); their CDI IDs by device. */
  private async ensurePartitionSpec(
    uid: string,
    made: readonly MadePartition[],
  ): Promise<{ ids: Record<string, string> } | { error: string }> {
    if (made.length === 0) return { ids: {} };
    this.made.set(uid, made);
    const devices = await readFile(join(this.o.procRoot ?? '/proc', 'devices'), 'utf8').catch(() => '');
    const major = capsMajor(devices);
    if (major === null)
      return { error: "the driver has no nvidia-caps devices (/proc/devices), which a MIG partition's nodes need" };
    const { ids, spec } = partitionCdiSpec(uid, made, major);
    const file = partitionSpecFile(this.o.cdiDir, uid);
    const want = `${JSON.stringify(spec, null, 1)}\n`;
    try {
      if ((await readFile(file, 'utf8').catch(() => null)) !== want) {
        await mkdir(this.o.cdiDir, { recursive: true, mode: 0o755 });
        await writeAtomically(file, want);
      }
    } catch (err) {
      return { error: `cannot write the CDI spec of its MIG partitions in ${this.o.cdiDir}: ${errorText(err)}` };
    }
    return { ids: Object.fromEntries(made.map((p, i) => [p.device, ids[i] ?? ''])) };
  }

  /**
   * Makes the MPS claim's CDI spec file hold what it should, compared with the file on disk (a file removed
   * or edited by someone else is written again; one that is right is left alone). Null when it is right, else
   * why not. A claim that is not MPS has no spec.
   */
  async ensureSpec(request: HostRequest): Promise<string | null> {
    const root = this.o.mpsRoot;
    if (root === null) return null;
    if (request.partitions !== undefined) {
      // Made partitions are as the agent's answer says (it stays while the claim is prepared).
      const text = await readFile(join(answerDir(root), `${request.claim.uid}.json`), 'utf8').catch(() => null);
      const answer =
        text === null
          ? null
          : (() => {
              try {
                return parseAnswer(text);
              } catch {
                return null;
              }
            })();
      if (answer?.state === 'ready') {
        const r = await this.ensurePartitionSpec(request.claim.uid, answer.partitions ?? []);
        if ('error' in r) return r.error;
      }
    }
    if (request.mps === undefined) return null;
    const uid = request.claim.uid;
    const file = claimSpecFile(this.o.cdiDir, uid);
    const want = claimSpecText(root, uid);
    if ((await readFile(file, 'utf8').catch(() => null)) === want) return null;
    try {
      await mkdir(this.o.cdiDir, { recursive: true, mode: 0o755 });
      await writeAtomically(file, want);
    } catch (err) {
      return `cannot write the CDI spec of its MPS daemon in ${this.o.cdiDir}: ${errorText(err)}`;
    }
    return null;
  }

  private get answerTimeoutMs(): number {
    return this.o.answerTimeoutMs ?? ANSWER_TIMEOUT_MS;
  }

  /**
   * Resolves with `check()`'s first non-null result, looked for on each change of `dir` and every LOOK_MS;
   * null at the timeout.
   */
  private async watchFor<T>(dir: string, timeoutMs: number, check: () => Promise<T | null>): Promise<T | null> {
    const timers = new TimerOwner();
    let watcher: FSWatcher | undefined;
    let looks: CoalescingQueue<void> | undefined;
    try {
      return await new Promise<T | null>((resolve) => {
        // One look at a time; a change seen during one makes one more.
        looks = new CoalescingQueue<void>(
          async () => {
            const v = await check();
            if (v !== null) resolve(v);
          },
          () => undefined,
        );
        const queue = looks;
        const look = (): void => void queue.request();
        try {
          watcher = watch(dir, look);
          watcher.on('error', () => undefined);
        } catch {
          // Not there yet: looked for every LOOK_MS.
        }
        timers.every('look', LOOK_MS, look);
        timers.after('timeout', timeoutMs, () => resolve(null));
        look();
      });
    } finally {
      watcher?.close();
      timers.dispose();
      await looks?.close();
    }
  }

  private awaitAnswer(root: string, uid: string, id: string): Promise<Answer | null> {
    const file = join(answerDir(root), `${uid}.json`);
    return this.watchFor(answerDir(root), this.answerTimeoutMs, async () => {
      const text = await readFile(file, 'utf8').catch(() => null);
      if (text === null) return null;
      try {
        const a = parseAnswer(text);
        return a.id === id ? a : null;
      } catch {
        return null; // being written
      }
    });
  }

  /**
   * Withdraws the claim's request and CDI spec; waits a while for the agent to have ended it (removed its answer).
   * Null when it has, or there was nothing to end; else why not yet (the agent tries again at its next sync).
   */
  async unprepare(claim: { namespace: string; name: string; uid: string }): Promise<string | null> {
    const root = this.o.mpsRoot;
    // Without an MPS root no claim could share: there is nothing of it on the host.
    if (root === null) return null;
    await rm(claimSpecFile(this.o.cdiDir, claim.uid), { force: true });
    await rm(partitionSpecFile(this.o.cdiDir, claim.uid), { force: true });
    await rm(join(requestDir(root), `${claim.uid}.json`), { force: true });
    const answer = join(answerDir(root), `${claim.uid}.json`);
    // The answer's removal is the agent's word that the claim is ended: asked again after a timeout, the wait is
    // for an answer still there.
    const gone = (): Promise<true | null> =>
      access(answer).then(
        () => null,
        () => true,
      );
    const wait = this.o.endTimeoutMs ?? END_TIMEOUT_MS;
    const ended = (await gone()) ?? (await this.watchFor(answerDir(root), wait, gone));
    if (ended !== null) {
      this.made.delete(claim.uid);
      return null;
    }
    this.o.log.warn(`${AGENT_UNIT} has not ended the claim's sharing yet; it does when it runs`, {
      claim: `${claim.namespace}/${claim.name}`,
      uid: claim.uid,
    });
    return `${AGENT_UNIT} has not ended it yet (its journal says why)`;
  }

  /**
   * At start, with the checkpoint's claims: a request of a claim no longer prepared is withdrawn, and one
   * missing (the MPS root was emptied) written again; the rest are left to the agent as they are. Each
   * prepared MPS claim's CDI spec is made right again too (the CDI directory emptied, a file edited).
   */
  async reconcile(prepared: ReadonlyMap<string, HostRequest>): Promise<void> {
    const root = this.o.mpsRoot;
    if (root === null) return;
    const dir = requestDir(root);
    const names = await readdir(dir).catch(() => [] as string[]);
    for (const name of names) {
      if (!name.endsWith('.json')) continue;
      const uid = name.slice(0, -'.json'.length);
      if (prepared.has(uid)) continue;
      await rm(join(dir, name), { force: true });
      await rm(claimSpecFile(this.o.cdiDir, uid), { force: true });
      await rm(partitionSpecFile(this.o.cdiDir, uid), { force: true });
      this.o.log.info('withdrew the sharing request of a claim no longer prepared', { uid });
    }
    for (const [uid, request] of prepared) {
      const text = await readFile(join(dir, `${uid}.json`), 'utf8').catch(() => null);
      let same = false;
      try {
        same = text !== null && sameRequest(parseRequest(text).request, request);
      } catch {
        same = false;
      }
      const specProblem = await this.ensureSpec(request);
      if (specProblem !== null) this.o.log.error('a prepared MPS claim has no CDI spec', { uid, error: specProblem });
      if (same) continue;
      await mkdir(dir, { recursive: true, mode: 0o755 });
      await writeAtomically(join(dir, `${uid}.json`), serializeRequest({ id: `${uid}/restored`, request }));
      this.o.log.info('wrote the sharing request of a prepared claim again', { uid });
    }
  }
}
