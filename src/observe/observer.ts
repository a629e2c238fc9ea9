// The one object the composition root wires for labels and metrics, so that wiring stays a handful
// of calls wherever the node's state comes from (start and reload today; re-discovery and MIG
// layout through the node snapshot later):
//   metrics.resource(name)   → the recorder for that resource's handlers and registrar
//   nodeState(input)         → every new node state: the labels file is rewritten if it changed
//   xids(batch)              → NVML events as the watcher reports them (XID counter)
//   changed()                → a new snapshot (health changed, GPUs or driver came or went): metrics now
//   registered()             → first registration of every resource (time to register at start)
//   stop()                   → clean stop (the labels file stays unless --nfd-remove-on-stop)
import { hostname } from 'node:os';
import type { LabelInput } from '../core/labels.ts';
import { NodeMetrics } from '../core/metrics.ts';
import type { MetricsSnapshot } from '../core/metrics.ts';
import type { Logger } from '../system/log.ts';
import { LabelsOutput, MetricsOutput, readMachineType } from './outputs.ts';

export interface ObserverSettings {
  nfdFeaturesFile: string | null;
  nfdRemoveOnStop: boolean;
  metricsFile: string | null;
  metricsIntervalSeconds: number;
  sysfsRoot: string;
  version: string;
  log: Logger;
}

/** The node as the metrics describe it, read at each write. */
export type NodeView = Omit<MetricsSnapshot, 'version' | 'node' | 'residentBytes'>;

/** An NVML event batch entry as the watcher reports it (only XIDs are counted). */
export interface EventEntry {
  readonly event: { readonly kind: string; readonly gpu: number | null; readonly xid?: number };
  readonly count: number;
}

export class Observer {
  readonly metrics = new NodeMetrics(() => performance.now());
  private readonly labels: LabelsOutput | undefined;
  private readonly machine: string | null;
  private output: MetricsOutput | undefined;
  private readonly s: ObserverSettings;
  private firstRegistration = true;

  constructor(s: ObserverSettings) {
    this.s = s;
    this.labels = s.nfdFeaturesFile === null ? undefined : new LabelsOutput(s.nfdFeaturesFile, s.nfdRemoveOnStop, s.log);
    this.machine = this.labels === undefined ? null : readMachineType(s.sysfsRoot);
  }

  /** Whether labels are written (the caller then reads the NVML facts they need). */
  get wantsLabels(): boolean {
    return this.labels !== undefined;
  }

  /** Starts the metrics file (if configured), reading the node through `view` at each write. */
  start(view: () => NodeView): void {
    if (this.s.metricsFile === null) return;
    this.output = new MetricsOutput({
      path: this.s.metricsFile,
      intervalMs: this.s.metricsIntervalSeconds * 1000,
      metrics: this.metrics,
      log: this.s.log,
      snapshot: () => ({ ...view(), version: this.s.version, node: hostname(), residentBytes: process.memoryUsage.rss() }),
    });
    this.output.start();
  }

  /** A new node state: the labels file follows it. */
  async nodeState(input: Omit<LabelInput, 'machine'>): Promise<void> {
    await this.labels?.update({ ...input, machine: this.machine });
  }

  xids(batch: readonly EventEntry[]): void {
    for (const { event: ev, count } of batch) {
      if (ev.kind === 'xid' && ev.gpu !== -1 && ev.xid !== undefined) this.metrics.xids.add(ev.gpu, ev.xid, count);
    }
  }

  /** The node changed (a GPU's health among others): the metrics file is written at once. */
  changed(): void {
    this.output?.healthChanged();
  }

  /** Every resource is registered; the first call records the time from process start. */
  registered(): void {
    if (!this.firstRegistration) return;
    this.firstRegistration = false;
    this.metrics.startToRegisteredSeconds = performance.now() / 1000;
    void this.output?.write();
  }

  async stop(): Promise<void> {
    this.output?.stop();
    await this.labels?.stop();
  }
}
