// The one object the composition root wires for labels and metrics, so that wiring stays a handful
// of calls wherever the node's state comes from (start and reload today; re-discovery and MIG
// layout through the node snapshot later):
//   metrics.resource(name)   → the recorder for that resource's handlers and registrar
//   apply(applied)           → every applied node snapshot (it is a consumer of the live node,
//                              node/consumer.ts): the labels file follows it (labelInput: the
//                              snapshot, its node facts and the configuration in force), metrics now
//   xids(batch)              → NVML events as the watcher reports them (XID counter)
//   registered()             → first registration of every resource (time to register at start)
//   stop()                   → clean stop (the labels file stays unless --nfd-remove-on-stop)
import { needsNodeReboot } from '../core/health-signals.ts';
import { hostname } from 'node:os';
import type { LabelInput } from '../core/labels.ts';
import { NodeMetrics } from '../core/metrics.ts';
import type { MetricsSnapshot } from '../core/metrics.ts';
import { NOTHING_ADVERTISED } from '../core/resource-plan.ts';
import type { AdvertisedView } from '../core/resource-plan.ts';
import type { NodeSnapshot, PlanSettings } from '../core/snapshot.ts';
import type { Options } from '../config/options.ts';
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

/** The observer's settings from the options. */
export function observerSettings(
  o: Pick<Options, 'nfdFeaturesFile' | 'nfdRemoveOnStop' | 'metricsFile' | 'metricsInterval'>,
  rest: Pick<ObserverSettings, 'sysfsRoot' | 'version' | 'log'>,
): ObserverSettings {
  return {
    nfdFeaturesFile: o.nfdFeaturesFile,
    nfdRemoveOnStop: o.nfdRemoveOnStop,
    metricsFile: o.metricsFile,
    metricsIntervalSeconds: o.metricsInterval,
    ...rest,
  };
}

/** The node as the metrics describe it, read at each write. */
export type NodeView = Omit<MetricsSnapshot, 'version' | 'node' | 'residentBytes'>;

/** The `gpu` of an event naming a device this plugin does not manage (as core/health-events.ts UNMANAGED_DEVICE). */
const UNMANAGED_DEVICE = -1;

/** An NVML event batch entry as the watcher reports it, its GPU by UUID (only XIDs are counted). */
export interface EventEntry {
  readonly event: {
    readonly kind: string;
    readonly gpu: string | null | typeof UNMANAGED_DEVICE;
    readonly xid?: number;
  };
  readonly count: number;
}

/**
 * What the labels are made of: the snapshot's GPUs with their node facts, and the configuration in
 * force. Null while the driver does not answer (the labels stay as they were).
 */
export function labelInput(s: NodeSnapshot, plan: PlanSettings): Omit<LabelInput, 'machine'> | null {
  if (s.driverVersion === null) return null;
  const facts = s.facts;
  return {
    gpus: s.gpus.map((g, i) => ({
      name: g.name,
      memoryBytes: g.memoryBytes,
      migEnabled: s.mig.modes[i]?.current === true,
      ...(facts?.gpus.get(g.uuid) ?? { compute: null, migCapable: false }),
    })),
    driverVersion: s.driverVersion,
    cudaDriverVersion: facts?.cudaDriverVersion ?? null,
    sharing: plan.sharing,
    migStrategy: plan.migStrategy ?? 'none',
    migDevices: s.mig.devices,
    nodeRebootRequired: s.gpus.some((g) => needsNodeReboot(s.signals?.get(g.uuid))),
  };
}

/** The node as the metrics describe it, with what is advertised per resource (none in DRA mode). */
export function metricsView(s: NodeSnapshot | null, advertised: AdvertisedView = NOTHING_ADVERTISED): NodeView {
  return {
    driverVersion: s?.driverVersion ?? 'not answering',
    gpus: (s?.gpus ?? []).map((g) => ({ index: g.index, uuid: g.uuid, healthy: s?.health.get(g.uuid) === 'Healthy' })),
    resources: s === null ? [] : advertised.resources,
    mpsDaemons: [...advertised.mpsDaemons].map(([resource, d]) => ({ resource, up: d.answering })),
    signals: (s?.gpus ?? []).flatMap((g) => {
      const sig = s?.signals?.get(g.uuid);
      if (sig?.reading === undefined) return [];
      return [
        {
          index: g.index,
          uuid: g.uuid,
          values: sig.reading.values,
          states: sig.states,
          expectedLinks: sig.memory.expectedLinks,
        },
      ];
    }),
  };
}

export class Observer {
  readonly metrics = new NodeMetrics(() => performance.now());
  private readonly labels: LabelsOutput | undefined;
  private readonly machine: string | null;
  private output: MetricsOutput | undefined;
  private readonly s: ObserverSettings;
  private firstRegistration = true;
  private last: NodeSnapshot | null = null;
  private advertised: () => AdvertisedView = () => NOTHING_ADVERTISED;

  constructor(s: ObserverSettings) {
    this.s = s;
    this.labels =
      s.nfdFeaturesFile === null ? undefined : new LabelsOutput(s.nfdFeaturesFile, s.nfdRemoveOnStop, s.log);
    this.machine = this.labels === undefined ? null : readMachineType(s.sysfsRoot);
  }

  readonly name = 'labels and metrics';

  /** Whether labels are written (the scanner then reads the NVML facts they need). */
  get wantsLabels(): boolean {
    return this.labels !== undefined;
  }

  /** What the serving mode advertises per resource, read at each write (node/consumer.ts's Registrations). */
  advertisedBy(from: { advertised?(): AdvertisedView }): void {
    this.advertised = () => from.advertised?.() ?? NOTHING_ADVERTISED;
  }

  /** Starts the metrics file (if configured), describing the last snapshot applied at each write. */
  start(): void {
    if (this.s.metricsFile === null) return;
    this.output = new MetricsOutput({
      path: this.s.metricsFile,
      intervalMs: this.s.metricsIntervalSeconds * 1000,
      metrics: this.metrics,
      log: this.s.log,
      snapshot: () => ({
        ...metricsView(this.last, this.advertised()),
        version: this.s.version,
        node: hostname(),
        residentBytes: process.memoryUsage.rss(),
      }),
    });
    this.output.start();
  }

  /** Every applied snapshot (a live-node consumer): metrics at once, and the labels follow it. */
  apply(applied: { readonly snapshot: NodeSnapshot; readonly settings: { readonly plan: PlanSettings } }): void {
    this.last = applied.snapshot;
    this.output?.healthChanged();
    const input = labelInput(applied.snapshot, applied.settings.plan);
    if (input === null || this.labels === undefined) return;
    this.labels
      .update({ ...input, machine: this.machine })
      .catch((err: unknown) =>
        this.s.log.warn('cannot update the node labels', { error: err instanceof Error ? err.message : String(err) }),
      );
  }

  xids(batch: readonly EventEntry[]): void {
    for (const { event: ev, count } of batch) {
      if (ev.kind === 'xid' && ev.gpu !== UNMANAGED_DEVICE && ev.xid !== undefined)
        this.metrics.xids.add(ev.gpu, ev.xid, count);
    }
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
