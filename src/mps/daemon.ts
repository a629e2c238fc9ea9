// The MPS control daemons' supervisor (`gpu-device-plugin mps-control-daemon`): from the daemons'
// plan (core/mps.ts planMpsDaemons) to what runs on the host. Per resource: its GPUs in compute mode
// EXCLUSIVE_PROCESS, `<root>/<resource>/{pipe,log}`, `nvidia-cuda-mps-control -f` as a child, the
// default limits through the client, `.started`; `<root>/.ready` once all are up; the shared
// `<root>/shm` tmpfs. A control daemon that dies is started again with backoff. Stop undoes it all.
// Everything that touches the host goes through the MpsHost port (daemon-host.ts is the real one),
// so this file is tested in-process with fakes and mocked timers (test/unit/mps-daemon.test.ts).
import { mpsPaths, mpsReadyFile, mpsShmDir } from '../core/mps.ts';
import type { MpsDaemonPlan, MpsPaths } from '../core/mps.ts';
import { errorText } from '../system/log.ts';
import type { Logger } from '../system/log.ts';

/** How a control daemon child ended. */
export interface ControlExit {
  readonly code: number | null;
  readonly signal: string | null;
}

/** A running `nvidia-cuda-mps-control -f`. */
export interface ControlChild {
  readonly pid: number;
  /** Settles once the process has exited. */
  readonly exited: Promise<ControlExit>;
  /** Sends it SIGTERM (the stop's last resort when `quit` got no answer). */
  kill(): void;
}

/** Everything the supervisor does to the host. Each call throws an Error naming what failed. */
export interface MpsHost {
  setComputeMode(
    gpu: { readonly uuid: string; readonly index: number },
    mode: 'exclusive-process' | 'default',
  ): Promise<void>;
  /** mkdir -p with 0755 on each directory it creates, and chmod 0755 on `dir` itself. */
  makeDirs(dir: string): Promise<void>;
  writeFile(path: string, text: string): Promise<void>;
  /** rm -rf; no error when absent. */
  remove(path: string): Promise<void>;
  /** Mounts the shared tmpfs (or finds it mounted): what was done. */
  mountShm(dir: string): Promise<{ mounted: boolean; size: string }>;
  unmountShm(dir: string): Promise<void>;
  /** Starts the control daemon in the foreground and returns once it answers its client. */
  startControl(plan: MpsDaemonPlan, paths: MpsPaths): Promise<ControlChild>;
  /** One command through the control client; its answer. timeoutMs: the host's default when absent. */
  command(paths: MpsPaths, command: string, timeoutMs?: number): Promise<string>;
}

export interface SupervisorOptions {
  readonly root: string;
  readonly host: MpsHost;
  readonly log: Logger;
  /** sd_notify lines (STATUS=…); ready adds READY=1 the first time. */
  readonly status: (line: string, ready?: boolean) => void;
}

/** Backoff between starts of a control daemon that died or could not start: 1 s doubling to 30 s. */
export const FIRST_RESTART_MS = 1000;
export const MAX_RESTART_MS = 30000;
/** A daemon up this long has its backoff reset. */
export const STABLE_MS = 60000;
/**
 * The stop's bounds, inside the 2 s in which the process ends after SIGTERM (system/signals.ts):
 * `quit` gets this long to be taken, the daemon as long again to exit, then SIGTERM and a last wait,
 * so that the compute modes are put back in any case.
 */
export const QUIT_MS = 600;

/** The commands that set a plan's default limits, in order. */
export function limitCommands(plan: MpsDaemonPlan): string[] {
  return [
    ...plan.gpus.map((g) => `set_default_device_pinned_mem_limit ${g.mpsDevice} ${g.pinnedMemLimitMiB}M`),
    `set_default_active_thread_percentage ${plan.activeThreadPercentage}`,
  ];
}

/** What a SIGHUP's new plan means for the running daemons. */
export type PlanChange =
  | { readonly kind: 'same-gpus'; readonly limitsChanged: boolean }
  | { readonly kind: 'restart-needed'; readonly why: string };

/** Same resources on the same GPUs: limits can be re-applied; anything else needs a restart. */
export function comparePlans(running: readonly MpsDaemonPlan[], next: readonly MpsDaemonPlan[]): PlanChange {
  const names = (ps: readonly MpsDaemonPlan[]): string =>
    ps
      .map((p) => p.resource)
      .sort()
      .join(',');
  if (names(running) !== names(next)) {
    return { kind: 'restart-needed', why: `the MPS resources change from [${names(running)}] to [${names(next)}]` };
  }
  let limitsChanged = false;
  for (const p of next) {
    const old = running.find((r) => r.resource === p.resource) as MpsDaemonPlan;
    const gpus = (q: MpsDaemonPlan): string => q.gpus.map((g) => g.uuid).join(',');
    if (gpus(old) !== gpus(p))
      return { kind: 'restart-needed', why: `${p.resource} changes GPUs from [${gpus(old)}] to [${gpus(p)}]` };
    if (limitCommands(old).join('\n') !== limitCommands(p).join('\n')) limitsChanged = true;
  }
  return { kind: 'same-gpus', limitsChanged };
}

type State = 'starting' | 'up' | 'waiting' | 'stopped';

class Resource {
  plan: MpsDaemonPlan;
  readonly paths: MpsPaths;
  state: State = 'starting';
  child: ControlChild | undefined;
  backoffMs = FIRST_RESTART_MS;
  timer: NodeJS.Timeout | undefined;
  stableTimer: NodeJS.Timeout | undefined;
  /** The last failure, for STATUS. */
  problem = '';
  attempted = false;
  /** The start under way (or the last one, settled): a stop waits for it, so a daemon it brings up is quit too. */
  inFlight: Promise<void> = Promise.resolve();
  constructor(plan: MpsDaemonPlan, root: string) {
    this.plan = plan;
    this.paths = mpsPaths(root, plan.resource);
  }
}

export class MpsSupervisor {
  private readonly opts: SupervisorOptions;
  private readonly log: Logger;
  private readonly host: MpsHost;
  private resources: Resource[] = [];
  private stopping = false;
  private readySent = false;
  private shmMounted = false;

  constructor(opts: SupervisorOptions) {
    this.opts = opts;
    this.log = opts.log;
    this.host = opts.host;
  }

  /** The plans in force. */
  get plans(): readonly MpsDaemonPlan[] {
    return this.resources.map((r) => r.plan);
  }

  /** Why some daemon is not up now (each one's last failure, or that it is starting); null when all are up. */
  get problem(): string | null {
    const down = this.resources.filter((r) => r.state !== 'up');
    if (down.length === 0) return null;
    return down.map((r) => `${r.plan.resource}: ${r.problem || 'starting'}`).join('; ');
  }

  /** Starts every daemon of the plan; resolves once each has had its first attempt (READY=1 then). */
  async start(plans: readonly MpsDaemonPlan[]): Promise<void> {
    if (plans.length === 0) {
      this.log.info('no MPS resources configured (sharing.mps in the config file): no control daemon to run', {
        root: this.opts.root,
      });
      this.opts.status('STATUS=no MPS resources configured', true);
      this.readySent = true;
      return;
    }
    this.resources = plans.map((p) => new Resource(p, this.opts.root));
    await this.host.makeDirs(this.opts.root);
    const shmDir = mpsShmDir(this.opts.root);
    await this.host.makeDirs(shmDir);
    const shm = await this.host.mountShm(shmDir);
    this.shmMounted = true;
    this.log.info(shm.mounted ? 'mounted the MPS shm tmpfs' : 'the MPS shm tmpfs is already mounted; reusing it', {
      dir: shmDir,
      size: shm.size,
    });
    await Promise.all(this.resources.map((r) => this.launch(r)));
  }

  private launch(r: Resource): Promise<void> {
    r.inFlight = this.startOne(r);
    return r.inFlight;
  }

  private async startOne(r: Resource): Promise<void> {
    if (this.stopping) return;
    r.state = 'starting';
    const { plan, paths } = r;
    try {
      for (const g of plan.gpus) await this.host.setComputeMode(g, 'exclusive-process');
      await this.host.makeDirs(paths.pipeDir);
      await this.host.makeDirs(paths.logDir);
      const child = await this.host.startControl(plan, paths);
      r.child = child;
      void child.exited.then((exit) => this.exited(r, child, exit));
      if (this.stopping) return;
      for (const c of limitCommands(plan)) await this.host.command(paths, c);
      // Its exit while the limits were set is this start's failure (exited() left it to the catch below).
      if (r.child !== child) throw new Error('its control daemon exited while its limits were being set');
      await this.host.writeFile(paths.startedFile, `${child.pid}\n`);
      r.state = 'up';
      r.problem = '';
      r.stableTimer = setTimeout(() => {
        r.backoffMs = FIRST_RESTART_MS;
      }, STABLE_MS);
      this.log.info('MPS control daemon up', {
        resource: plan.resource,
        pid: child.pid,
        gpus: plan.gpus.map((g) => g.uuid),
        replicas: plan.replicas,
        activeThreadPercentage: plan.activeThreadPercentage,
        pinnedMemLimitMiB: plan.gpus.map((g) => `${g.mpsDevice}:${g.pinnedMemLimitMiB}`),
      });
    } catch (err) {
      if (this.stopping) return;
      r.problem = errorText(err);
      this.log.error('cannot start the MPS control daemon; trying again', {
        resource: plan.resource,
        retryInMs: r.backoffMs,
        error: r.problem,
      });
      const child = r.child;
      r.child = undefined; // its exit is this failure's, not a second one
      child?.kill();
      this.retry(r);
    } finally {
      r.attempted = true;
      await this.settle();
    }
  }

  private retry(r: Resource): void {
    r.state = 'waiting';
    clearTimeout(r.stableTimer);
    const delay = r.backoffMs;
    r.backoffMs = Math.min(r.backoffMs * 2, MAX_RESTART_MS);
    r.timer = setTimeout(() => {
      r.timer = undefined;
      void this.launch(r);
    }, delay);
  }

  /** A control daemon ended. During a stop that is expected; otherwise it died on its own. */
  private exited(r: Resource, child: ControlChild, exit: ControlExit): void {
    if (this.stopping || r.child !== child) return;
    r.child = undefined;
    const how = exit.signal !== null ? `was killed by ${exit.signal}` : `exited with status ${exit.code}`;
    r.problem = `its control daemon ${how}`;
    // During its start the failure is startOne's to report and retry (its next step fails).
    if (r.state === 'starting') return;
    this.log.error(
      `MPS control daemon ${how}; every client's CUDA context went with it (clients must restart); starting it again`,
      {
        resource: r.plan.resource,
        pid: child.pid,
        retryInMs: r.backoffMs,
      },
    );
    void this.host
      .remove(r.paths.startedFile)
      .catch((err: unknown) =>
        this.log.warn('cannot remove .started', { file: r.paths.startedFile, error: errorText(err) }),
      );
    this.retry(r);
    void this.settle();
  }

  /** .ready and STATUS from the resources' states; READY=1 once each has had its first attempt. */
  private async settle(): Promise<void> {
    if (this.stopping) return;
    const up = this.resources.filter((r) => r.state === 'up');
    const down = this.resources.filter((r) => r.state !== 'up');
    const ready = mpsReadyFile(this.opts.root);
    try {
      if (down.length === 0) await this.host.writeFile(ready, '');
      else await this.host.remove(ready);
    } catch (err) {
      this.log.warn('cannot update the ready file', { file: ready, error: errorText(err) });
    }
    const line =
      down.length === 0
        ? `STATUS=${up.length} MPS control daemon${up.length === 1 ? '' : 's'} ` +
          `up: ${up.map((r) => r.plan.resource).join(', ')}`
        : `STATUS=${up.length} of ${this.resources.length} MPS control daemons ` +
          `up; ${down.map((r) => `${r.plan.resource} down (${r.problem || 'starting'})`).join('; ')}`;
    const first = !this.readySent && this.resources.every((r) => r.attempted);
    if (first) this.readySent = true;
    this.opts.status(line, first);
  }

  /**
   * SIGHUP with the config read again: the same GPUs per resource → the default limits applied
   * again (clients that connect from now on get them); anything else → one WARN line and the
   * daemons keep running as they are (a restart would kill every client).
   */
  async reload(next: readonly MpsDaemonPlan[]): Promise<void> {
    if (this.stopping) return;
    const change = comparePlans(this.plans, next);
    if (change.kind === 'restart-needed') {
      this.log.warn(
        `SIGHUP: the MPS configuration changed in a way the running control daemons ` +
          `cannot take (${change.why}); restart the unit to apply it (systemctl ` +
          `restart gpu-device-plugin-mps — it ends every MPS client); running as before`,
      );
      return;
    }
    const applied: string[] = [];
    for (const r of this.resources) {
      const p = next.find((n) => n.resource === r.plan.resource) as MpsDaemonPlan;
      r.plan = p;
      // A daemon that is down gets the new limits when it starts again.
      if (r.state !== 'up') continue;
      for (const c of limitCommands(p)) await this.host.command(r.paths, c);
      applied.push(
        `${p.resource}: ${p.replicas} replicas, ${p.activeThreadPercentage}%, ` +
          `${p.gpus.map((g) => `${g.mpsDevice}:${g.pinnedMemLimitMiB}M`).join(' ')}`,
      );
    }
    this.log.info(
      `SIGHUP: default limits applied again${change.limitsChanged ? ' (changed)' : ' (unchanged)'}; ` +
        `clients that connect from now on get them`,
      { applied },
    );
  }

  /** SIGTERM: `quit` each daemon, compute modes back to DEFAULT, files removed, shm unmounted. */
  async stop(): Promise<void> {
    this.stopping = true;
    const problems: string[] = [];
    await Promise.all(
      this.resources.map(async (r) => {
        clearTimeout(r.timer);
        clearTimeout(r.stableTimer);
        // A daemon whose start is under way is there once the start returns (it sees the stop and sets no
        // limits): it is quit like the others, never left running.
        await r.inFlight.catch(() => undefined);
        const child = r.child;
        if (child !== undefined) {
          const exitedWithin = async (ms: number): Promise<boolean> => {
            let timer: NodeJS.Timeout | undefined;
            const done = await Promise.race([
              child.exited.then(() => true),
              new Promise<boolean>((res) => {
                timer = setTimeout(() => res(false), ms);
              }),
            ]);
            clearTimeout(timer);
            return done;
          };
          let why = '';
          try {
            await this.host.command(r.paths, 'quit', QUIT_MS);
            if (!(await exitedWithin(QUIT_MS)))
              why = `still running ${QUIT_MS} ms after quit (its clients have not finished)`;
          } catch (err) {
            why = `did not take quit: ${errorText(err)}`;
          }
          if (why !== '') {
            this.log.warn(`the MPS control daemon ${why}; sending it SIGTERM`, {
              resource: r.plan.resource,
              pid: child.pid,
            });
            child.kill();
            if (!(await exitedWithin(QUIT_MS / 2)))
              problems.push(
                `the MPS control daemon for ${r.plan.resource} (pid ${child.pid}) has not exited after SIGTERM`,
              );
          }
        }
        r.state = 'stopped';
        for (const g of r.plan.gpus) {
          try {
            await this.host.setComputeMode(g, 'default');
          } catch (err) {
            problems.push(errorText(err));
          }
        }
        for (const p of [r.paths.startedFile, r.paths.logDir])
          await this.host.remove(p).catch((err: unknown) => problems.push(errorText(err)));
      }),
    );
    await this.host.remove(mpsReadyFile(this.opts.root)).catch((err: unknown) => problems.push(errorText(err)));
    if (this.shmMounted)
      await this.host.unmountShm(mpsShmDir(this.opts.root)).catch((err: unknown) => problems.push(errorText(err)));
    if (problems.length > 0) throw new Error(`the MPS control daemons stopped, but: ${problems.join('; ')}`);
    if (this.resources.length > 0)
      this.log.info('MPS control daemons stopped; compute modes back to DEFAULT', {
        resources: this.resources.map((r) => r.plan.resource),
      });
  }
}
