// The health thread's supervisor: starts the thread (watcher.ts, through the session's watch()) on
// the GPUs of the last scan and stops it when they change or NVML is closed; holds the first start
// back until the first registration (or WORKER_HOLD_MS), so that the thread's start-up does not
// compete with it — until then nothing is advertised anyway. Events carry GPU UUIDs (the watcher
// translates positions from the list it was started with), so nothing needs holding back for them.
// Its probes ask for a scan when a GPU newly answers GPU_IS_LOST, when a lost one answers again
// (with NVML opened afresh: a GPU back after a reset is enumerated only by a new session), and a
// re-discovery check when a probe starts failing (a handle that stopped answering: a GPU removed).
import type { Gpu } from '../core/devices.ts';
import type { EventBatchEntry, ProbeRound } from '../core/health-events.ts';
import type { SignalName, SignalReading } from '../core/health-signals.ts';
import type { Logger } from '../system/log.ts';
import { TimerOwner } from '../system/timers.ts';
import type { WatchedGpu } from './events.ts';
import type { HealthWatch, NodeReader } from './node-reader.ts';

/** How long the health thread waits at most for the first registration before it starts anyway. */
export const WORKER_HOLD_MS = 2000;
/** How long a stopping thread may stay in an NVML call before that is logged (it is still waited for). */
const STOP_LIMIT_MS = 800;

export interface HealthSupervisorOptions {
  log: Logger;
  probeIntervalMs: number;
  onEvents(events: EventBatchEntry[]): void;
  onProbe(results: ProbeRound): void;
  /** The health signals the thread reads, asked at each start of it (a reload may change them). */
  signals?(): readonly SignalName[];
  onSignals?(readings: ReadonlyMap<string, SignalReading>): void;
  onWatching?(watched: readonly WatchedGpu[], unsupported: readonly WatchedGpu[]): void;
  /** Asks for a full scan; reopen: open NVML afresh first. */
  rescan(reason: string, reopen: boolean): void;
  /** A probe started failing: the cheap identity check decides. */
  checkIdentity(): void;
}

export class HealthSupervisor {
  private readonly o: HealthSupervisorOptions;
  private readonly timers = new TimerOwner();
  private watch: HealthWatch | undefined;
  private watching: readonly Gpu[] = [];
  private held: { reader: NodeReader; gpus: readonly Gpu[] } | null = null;
  private released = false;
  private lastProbe: ProbeRound = new Map();
  /** The last stop asked for, so that stop() can wait for one a rescan began. */
  private stopping: Promise<void> = Promise.resolve();
  private stopped = false;

  constructor(o: HealthSupervisorOptions) {
    this.o = o;
    this.timers.after('hold', WORKER_HOLD_MS, () => this.release());
  }

  /** Whether the thread watches exactly these GPUs (same indices and UUIDs). */
  watches(gpus: readonly Gpu[]): boolean {
    return (
      this.watch !== undefined &&
      this.watching.length === gpus.length &&
      this.watching.every((g, i) => g.index === gpus[i]?.index && g.uuid === gpus[i]?.uuid)
    );
  }

  /** Lets the thread start (the first registration, or the hold timer). */
  release(): void {
    if (this.released) return;
    this.released = true;
    this.timers.clear('hold');
    const h = this.held;
    this.held = null;
    if (h !== null && this.watch === undefined) this.start(h.reader, h.gpus);
  }

  /** Starts the thread on these GPUs (held until released). */
  start(reader: NodeReader, gpus: readonly Gpu[]): void {
    if (this.stopped || gpus.length === 0) return;
    if (!this.released) {
      this.held = { reader, gpus };
      return;
    }
    this.watching = gpus;
    this.lastProbe = new Map();
    this.watch = reader.watch(gpus, this.o.probeIntervalMs, {
      onReady: (watched, unsupported) => {
        for (const g of unsupported)
          this.o.log.warn('GPU supports no health events; watched by the probe only', {
            gpu: g.nvmlIndex,
            uuid: g.uuid,
          });
        this.o.log.info('watching GPU health', { event_gpus: watched.length, probe_s: this.o.probeIntervalMs / 1000 });
        this.o.onWatching?.(watched, unsupported);
      },
      onEvents: (events) => this.o.onEvents(events),
      onProbe: (results) => {
        this.o.onProbe(results);
        this.probed(results);
      },
      onDriverGone: (message) => this.o.rescan(`health watcher: ${message}`, false),
      signals: this.o.signals?.() ?? [],
      onSignals: (readings) => this.o.onSignals?.(readings),
    });
  }

  /** A GPU newly lost, or a lost one answering again: look at the node again. */
  private probed(results: ProbeRound): void {
    // The first probe of a thread compares with nothing: what it finds wrong counts as new.
    const before = this.lastProbe;
    this.lastProbe = results;
    const was = [...results].map(([uuid, r]) => [r, before.get(uuid)] as const);
    const lost = was.some(([r, b]) => r === 'lost' && b !== 'lost');
    const back = was.some(([r, b]) => r === 'ok' && b === 'lost');
    if (lost || back) this.o.rescan(back ? 'a lost GPU answers again' : 'a GPU is lost', back);
    else if (was.some(([r, b]) => r === 'error' && b !== 'error')) this.o.checkIdentity();
  }

  /** Stops the thread (and forgets a held start); resolves once it has let go of NVML. */
  async halt(): Promise<void> {
    this.held = null;
    const w = this.watch;
    this.watch = undefined;
    this.watching = [];
    if (w === undefined) return;
    const stopping = w.stop(STOP_LIMIT_MS);
    this.stopping = stopping;
    await stopping;
  }

  async stop(): Promise<void> {
    this.stopped = true;
    this.timers.dispose();
    await this.halt();
    // A rescan in flight may be stopping the previous thread: the process must not exit while that
    // thread is still inside NVML (exiting under a native call aborts the process).
    await this.stopping;
  }
}
