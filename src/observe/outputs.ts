// What the plugin tells the host's own tools: the node labels file that Node Feature Discovery's
// local source reads, and the metrics file that node_exporter's textfile collector reads. The
// content comes from core/labels.ts and core/metrics.ts; this folder decides when to write it and
// writes it atomically (system/atomic-file.ts). A failed write is logged, never fatal: labels and
// metrics must not cost the node its GPUs.
import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import { labelledModel, labelsFile, nodeLabels } from '../core/labels.ts';
import type { LabelInput } from '../core/labels.ts';
import { renderMetrics } from '../core/metrics.ts';
import type { MetricsSnapshot, NodeMetrics } from '../core/metrics.ts';
import { AtomicFile } from '../system/atomic-file.ts';
import { errorText } from '../system/log.ts';
import type { Logger } from '../system/log.ts';

/** The NFD feature file: rewritten on every new node state, and only when its content changes. */
export class LabelsOutput {
  private readonly file: AtomicFile;
  private readonly removeOnStop: boolean;
  private readonly log: Logger;
  private lastProblem: string | undefined;
  private warnedModels = '';
  private updates = 0;

  constructor(path: string, removeOnStop: boolean, log: Logger) {
    this.file = new AtomicFile(path);
    this.removeOnStop = removeOnStop;
    this.log = log;
  }

  get path(): string {
    return this.file.path;
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
    try {
      const wrote = await this.file.write(labelsFile(labels));
      if (wrote) this.log.info('node labels written', { file: this.file.path, labels: labels.length });
      else if (this.updates === 0)
        this.log.info('node labels file already up to date; not rewritten', { file: this.file.path });
      this.updates++;
      this.lastProblem = undefined;
    } catch (err) {
      const problem = errorText(err);
      if (problem !== this.lastProblem)
        this.log.error('cannot write the node labels file; labels are not updated', { error: problem });
      this.lastProblem = problem;
    }
  }

  /** On a clean stop: the file stays unless the operator asked for its removal. */
  async stop(): Promise<void> {
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
