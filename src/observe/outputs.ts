// What the plugin tells the host's own tools: the node labels file that Node Feature Discovery's
// local source reads, and the metrics file that node_exporter's textfile collector reads. The
// content comes from core/labels.ts and core/metrics.ts; this folder decides when to write it and
// writes it atomically (system/atomic-file.ts), comparing with the file on disk, never with what it
// wrote before. A failed write is logged and tried again (the labels after a backoff, the metrics at
// the next interval), never fatal: labels and metrics must not cost the node its GPUs.
import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import { labelledModel, labelsFile, nodeLabels } from '../core/labels.ts';
import type { LabelInput } from '../core/labels.ts';
import { renderMetrics } from '../core/metrics.ts';
import type { MetricsSnapshot, NodeMetrics } from '../core/metrics.ts';
import { AtomicFile } from '../system/atomic-file.ts';
import { errorText } from '../system/log.ts';
import { TimerOwner } from '../system/timers.ts';
import type { Logger } from '../system/log.ts';

/** A failed labels write is tried again after this, doubling up to LABELS_RETRY_MAX_MS. */
export const LABELS_RETRY_FIRST_MS = 1000;
export const LABELS_RETRY_MAX_MS = 60_000;
/**
 * How often the labels file is looked at while all is well, to put it back when someone removed or edited
 * it: NFD reads it every minute, so a file gone for a minute at most costs the node at most one read.
 */
export const LABELS_RECHECK_MS = 60_000;

/**
 * The NFD feature file: written for every new node state when its content differs from the file on disk;
 * a failed write is tried again (1 s doubling to 60 s) until it works, and the file is looked at every
 * minute so that one removed or edited behind our back is put back.
 */
export class LabelsOutput {
  private readonly file: AtomicFile;
  private readonly removeOnStop: boolean;
  private readonly log: Logger;
  private readonly timers = new TimerOwner();
  private lastProblem: string | undefined;
  private warnedModels = '';
  private updates = 0;
  /** The content the file should hold (the latest node state's); null before the first update. */
  private wanted: string | null = null;
  private retryMs = LABELS_RETRY_FIRST_MS;
  private writing: Promise<void> = Promise.resolve();

  constructor(path: string, removeOnStop: boolean, log: Logger) {
    this.file = new AtomicFile(path);
    this.removeOnStop = removeOnStop;
    this.log = log;
  }

  get path(): string {
    return this.file.path;
  }

  /** Resolves when the write started last (by an update, a retry or a recheck) has ended. */
  settled(): Promise<void> {
    return this.writing;
  }

  /** Writes the labels for a new node state (start, config reload, re-discovery, MIG layout). */
  async update(input: LabelInput): Promise<void> {
    const model = labelledModel(input.gpus);
    const others = model?.others.join(', ') ?? '';
    if (others !== '' && others !== this.warnedModels) {
      this.log.warn(
        'GPUs of several models; the gpu.* labels describe the most common one, as GPU Feature Discovery labels one',
        { labelled: model?.gpu.name, others },
      );
    }
    this.warnedModels = others;
    const labels = nodeLabels(input);
    this.wanted = labelsFile(labels);
    await this.writeWanted(labels.length);
  }

  /** Writes what the file should hold if the disk differs; on failure, tries again later. */
  private writeWanted(labels?: number): Promise<void> {
    const content = this.wanted;
    if (content === null) return Promise.resolve();
    this.writing = this.file.write(content).then(
      (wrote) => {
        if (wrote)
          this.log.info('node labels written', { file: this.file.path, ...(labels === undefined ? {} : { labels }) });
        else if (this.updates === 0)
          this.log.info('node labels file already up to date; not rewritten', { file: this.file.path });
        this.updates++;
        if (this.lastProblem !== undefined) this.log.info('node labels file written again', { file: this.file.path });
        this.lastProblem = undefined;
        this.retryMs = LABELS_RETRY_FIRST_MS;
        this.timers.clear('retry');
        if (!this.timers.has('recheck')) this.timers.every('recheck', LABELS_RECHECK_MS, () => void this.writeWanted());
      },
      (err: unknown) => {
        const problem = errorText(err);
        if (problem !== this.lastProblem)
          this.log.error('cannot write the node labels file; labels are not updated; trying again', {
            error: problem,
            retryInMs: this.retryMs,
          });
        this.lastProblem = problem;
        this.timers.after('retry', this.retryMs, () => void this.writeWanted());
        this.retryMs = Math.min(this.retryMs * 2, LABELS_RETRY_MAX_MS);
      },
    );
    return this.writing;
  }

  /** On a clean stop: the file stays unless the operator asked for its removal. */
  async stop(): Promise<void> {
    this.timers.dispose();
    if (!this.removeOnStop) return;
    try {
      await this.file.remove();
      this.log.info('node labels file removed (--nfd-remove-on-stop)', { file: this.file.path });
    } catch (err) {
      this.log.warn('cannot remove the node labels file', { error: errorText(err) });
    }
  }
}

export interface MetricsOutputSettings {
  path: string;
  intervalMs: number;
  metrics: NodeMetrics;
  /** The node's state now; called at each write. */
  snapshot: () => MetricsSnapshot;
  log: Logger;
}

/** The .prom file: written every interval, and at once when GPU health changes. */
export class MetricsOutput {
  private readonly file: AtomicFile;
  private readonly s: MetricsOutputSettings;
  private timer: NodeJS.Timeout | undefined;
  private lastProblem: string | undefined;
  private stopped = false;

  constructor(s: MetricsOutputSettings) {
    this.s = s;
    this.file = new AtomicFile(s.path);
  }

  get writes(): number {
    return this.file.writes;
  }

  start(): void {
    void this.write();
    this.timer = setInterval(() => void this.write(), this.s.intervalMs);
    this.timer.unref();
  }

  /** Health changed: write now, outside the interval. */
  healthChanged(): void {
    void this.write();
  }

  async write(): Promise<void> {
    if (this.stopped) return;
    try {
      await this.file.write(renderMetrics(this.s.metrics, this.s.snapshot()));
      if (this.lastProblem !== undefined) this.s.log.info('metrics file written again', { file: this.file.path });
      this.lastProblem = undefined;
    } catch (err) {
      const problem = errorText(err);
      if (problem !== this.lastProblem)
        this.s.log.error('cannot write the metrics file; retrying every interval', { error: problem });
      this.lastProblem = problem;
    }
  }

  stop(): void {
    this.stopped = true;
    if (this.timer !== undefined) clearInterval(this.timer);
    this.timer = undefined;
  }
}

/** The host's machine type from DMI (<sysfs>/class/dmi/id/product_name), or null when it does not say. */
export function readMachineType(sysfsRoot: string): string | null {
  try {
    const text = readFileSync(join(sysfsRoot, 'class', 'dmi', 'id', 'product_name'), 'utf8').trim();
    return text === '' ? null : text;
  } catch {
    return null;
  }
}
