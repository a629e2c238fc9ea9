// Host sharing, the plugin's side: a claim that shares its GPUs by TimeSlicing or MPS needs the host
// changed, which this unprivileged process cannot do; it writes the claim's request (core/dra-sharing.ts)
// for the MPS unit's agent (mps/dra-agent.ts) and waits for the answer naming it. For an MPS claim it then
// writes the claim's CDI spec (its daemon's pipe and shm), whose ID prepare returns beside the GPU's.
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
}

function claimSpecFile(cdiDir: string, uid: string): string {
  return join(cdiDir, `gpu-device-plugin-claim-${uid}.json`);
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

  constructor(o: HostSharingOptions) {
    this.o = o;
  }

  /** Why no request can be made for this claim at all (checked before anything is recorded); null when it can. */
  unavailable(request: HostRequest): string | null {
    if (this.o.mpsRoot !== null) return null;
    return (
      `it asks for ${request.mps !== undefined ? 'MPS' : 'time-slicing'}, which needs the MPS root (--mps-root, ` +
      `MPS_ROOT; the package's environment file sets /run/nvidia/mps) where ${AGENT_UNIT} finds the requests`
    );
  }

  /** Asks the agent for the claim's sharing and waits for it; the CDI IDs to add, or why not. */
  async prepare(request: HostRequest): Promise<{ cdiDeviceIds: string[] } | { error: string }> {
    const root = this.o.mpsRoot;
    const what = request.mps !== undefined ? 'MPS' : 'time-slicing';
    const unavailable = this.unavailable(request);
    if (root === null || unavailable !== null) return { error: unavailable ?? '' };
    const uid = request.claim.uid;
    const id = `${uid}/${process.pid}/${++this.written}/${Date.now()}`;
    try {
      await mkdir(requestDir(root), { recursive: true, mode: 0o755 });
      await writeAtomically(join(requestDir(root), `${uid}.json`), serializeRequest({ id, request }));
    } catch (err) {
      return { error: `cannot write its ${what} request for ${AGENT_UNIT}: ${errorText(err)}` };
    }
    const answer = await this.awaitAnswer(root, uid, id);
    if (answer === null)
      return {
        error:
          `${AGENT_UNIT} did not answer its ${what} request within ${this.answerTimeoutMs / 1000} s ` +
          `(is it running? systemctl status ${AGENT_UNIT}); the kubelet asks again`,
      };
    if (answer.state === 'failed') return { error: `${AGENT_UNIT} could not set up its ${what}: ${answer.error}` };
    if (request.mps === undefined) return { cdiDeviceIds: [] };
    const problem = await this.ensureSpec(request);
    if (problem !== null) return { error: problem };
    return { cdiDeviceIds: [claimCdiSpec(root, uid).id] };
  }

  /**
   * Makes the MPS claim's CDI spec file hold what it should, compared with the file on disk (a file removed
   * or edited by someone else is written again; one that is right is left alone). Null when it is right, else
   * why not. A claim that is not MPS has no spec.
   */
  async ensureSpec(request: HostRequest): Promise<string | null> {
    const root = this.o.mpsRoot;
    if (root === null || request.mps === undefined) return null;
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

  /** Withdraws the claim's request and CDI spec; waits a while for the agent to have ended it. */
  async unprepare(claim: { namespace: string; name: string; uid: string }): Promise<void> {
    const root = this.o.mpsRoot;
    // Without an MPS root no claim could share: there is nothing of it on the host.
    if (root === null) return;
    await rm(claimSpecFile(this.o.cdiDir, claim.uid), { force: true });
    const request = join(requestDir(root), `${claim.uid}.json`);
    const had = await readFile(request, 'utf8').then(
      () => true,
      () => false,
    );
    await rm(request, { force: true });
    if (!had) return;
    const answer = join(answerDir(root), `${claim.uid}.json`);
    // The answer's removal is the agent's word that the claim is ended.
    const gone = (): Promise<true | null> =>
      access(answer).then(
        () => null,
        () => true,
      );
    const ended = await this.watchFor(answerDir(root), this.o.endTimeoutMs ?? END_TIMEOUT_MS, gone);
    if (ended === null)
      this.o.log.warn(`${AGENT_UNIT} has not ended the claim's sharing yet; it does when it runs`, {
        claim: `${claim.namespace}/${claim.name}`,
        uid: claim.uid,
      });
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
