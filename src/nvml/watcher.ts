// Starts and stops the NVML event worker (event-worker.ts) and hands what it reports to callbacks.
// Inside the single executable the worker's code is a string bundled at build time; from a source
// checkout it is the TypeScript file itself.
import { Worker } from 'node:worker_threads';
import type { Logger } from '../system/log.ts';
import type { EventBatchEntry, ProbeResult, WatchedGpu, WorkerMessage, WorkerSettings } from './events.ts';

declare const __EVENT_WORKER_SOURCE__: string | undefined;

export interface EventWatcherOptions {
  library: string;
  gpus: WatchedGpu[];
  probeIntervalMs: number;
  waitTimeoutMs: number;
  log: Logger;
  logLevel: WorkerSettings['logLevel'];
  journal: boolean;
  writeLine: (line: string) => void;
  onReady(watched: number[], unsupported: number[]): void;
  onEvents(events: EventBatchEntry[]): void;
  onProbe(results: ProbeResult[]): void;
  /** NVML said the driver is gone; the worker has stopped. */
  onDriverGone?(message: string): void;
}

export class EventWatcher {
  private readonly worker: Worker;
  private readonly stopFlag: Int32Array;
  private readonly exited: Promise<void>;
  /** Set by stop(): what the worker still says is about GPUs no longer watched, and is dropped. */
  private stopping = false;

  private constructor(worker: Worker, stopFlag: Int32Array) {
    this.worker = worker;
    this.stopFlag = stopFlag;
    this.exited = new Promise((resolve) => worker.once('exit', () => resolve()));
  }

  static start(opts: EventWatcherOptions): EventWatcher {
    const stop = new SharedArrayBuffer(4);
    const workerData: WorkerSettings = {
      library: opts.library,
      gpus: opts.gpus,
      probeIntervalMs: opts.probeIntervalMs,
      waitTimeoutMs: opts.waitTimeoutMs,
      stop,
      logLevel: opts.logLevel,
      journal: opts.journal,
    };
    const worker = typeof __EVENT_WORKER_SOURCE__ === 'string'
      ? new Worker(__EVENT_WORKER_SOURCE__, { eval: true, workerData, name: 'nvml-events' })
      : new Worker(new URL('./event-worker.ts', import.meta.url), { workerData, name: 'nvml-events' });
    const w = new EventWatcher(worker, new Int32Array(stop));
    worker.on('message', (m: WorkerMessage) => {
      if (w.stopping && m.type !== 'log') return;
      switch (m.type) {
        case 'ready': opts.onReady(m.watched, m.unsupported); break;
        case 'events': opts.onEvents(m.events); break;
        case 'probe': opts.onProbe(m.results); break;
        case 'log': opts.writeLine(m.line); break;
        case 'driver-gone': opts.onDriverGone?.(m.message); break;
        case 'failed': opts.log.error('GPU health watcher failed; health is no longer watched', { error: m.message }); break;
        case 'stopped': break;
      }
    });
    worker.on('error', (err: unknown) => w.stopping || opts.log.error('GPU health watcher crashed; health is no longer watched', { error: err instanceof Error ? err.message : String(err) }));
    return w;
  }

  /** Asks the worker to stop (it notices within one wait timeout) and waits for it, at most limitMs. */
  async stop(limitMs: number): Promise<void> {
    this.stopping = true;
    Atomics.store(this.stopFlag, 0, 1);
    Atomics.notify(this.stopFlag, 0);
    let timer: NodeJS.Timeout | undefined;
    const late = new Promise<'late'>((resolve) => { timer = setTimeout(() => resolve('late'), limitMs); });
    const outcome = await Promise.race([this.exited.then(() => 'done' as const), late]);
    clearTimeout(timer);
    if (outcome === 'late') await this.worker.terminate();
  }
}
