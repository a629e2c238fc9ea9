// Metrics for Prometheus node_exporter's textfile collector: the counters the handlers
// and the registrar bump through small recorder interfaces, and the text exposition format made
// from them plus a snapshot of the node's state. Counting costs one array increment and one
// histogram bucket per RPC and allocates nothing; the text is built only when the file is written.
// Pure: the clock is passed in, nothing here does I/O.

import { renderSignalMetrics } from './metrics-signals.ts';
import type { GpuSignalMetrics } from './metrics-signals.ts';

/** RPC methods, by the number the handlers record them under. */
export const RPC_METHODS = [
  'GetDevicePluginOptions',
  'ListAndWatch',
  'GetPreferredAllocation',
  'Allocate',
  'PreStartContainer',
] as const;
export const RPC = {
  GetDevicePluginOptions: 0,
  ListAndWatch: 1,
  GetPreferredAllocation: 2,
  Allocate: 3,
  PreStartContainer: 4,
} as const;
export type RpcMethodId = (typeof RPC)[keyof typeof RPC];

/** Outcomes: answered; refused as a bad request (INVALID_ARGUMENT); failed inside the plugin (INTERNAL). */
export const RPC_OUTCOMES = ['ok', 'refused', 'error'] as const;
export const OUTCOME = { ok: 0, refused: 1, error: 2 } as const;
export type RpcOutcomeId = (typeof OUTCOME)[keyof typeof OUTCOME];

/** What the DevicePlugin handlers report: one call per RPC answered. */
export interface RpcRecorder {
  rpc(method: RpcMethodId, outcome: RpcOutcomeId, seconds: number): void;
}

/** What the registrar reports: one call per registration the kubelet accepted. */
export interface RegistrationRecorder {
  registered(): void;
}

export const NO_RECORDER: RpcRecorder & RegistrationRecorder = { rpc: () => undefined, registered: () => undefined };

/** Latency buckets (seconds): Allocate and GetPreferredAllocation answer in well under a millisecond. */
export const LATENCY_BUCKETS: readonly number[] = [
  0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1,
];

export class Histogram {
  /** counts[i]: observations in bucket i alone (not cumulative); the last slot is above every bound. */
  readonly counts = new Float64Array(LATENCY_BUCKETS.length + 1);
  sum = 0;
  count = 0;

  observe(v: number): void {
    let i = 0;
    while (i < LATENCY_BUCKETS.length && v > (LATENCY_BUCKETS[i] as number)) i++;
    this.counts[i] = (this.counts[i] ?? 0) + 1;
    this.sum += v;
    this.count++;
  }
}

/** The counters of one advertised resource; kept across config reloads so they never go back. */
export class ResourceMetrics implements RpcRecorder, RegistrationRecorder {
  readonly name: string;
  /** rpcs[method * RPC_OUTCOMES.length + outcome] */
  readonly rpcs = new Float64Array(RPC_METHODS.length * RPC_OUTCOMES.length);
  readonly allocate = new Histogram();
  readonly preferred = new Histogram();
  registrations = 0;
  /** Clock reading (ms) of the last registration, or null before the first. */
  lastRegistrationMs: number | null = null;
  private readonly now: () => number;

  constructor(name: string, now: () => number) {
    this.name = name;
    this.now = now;
  }

  rpc(method: RpcMethodId, outcome: RpcOutcomeId, seconds: number): void {
    const k = method * RPC_OUTCOMES.length + outcome;
    this.rpcs[k] = (this.rpcs[k] ?? 0) + 1;
    if (method === RPC.Allocate) this.allocate.observe(seconds);
    else if (method === RPC.GetPreferredAllocation) this.preferred.observe(seconds);
  }

  registered(): void {
    this.registrations++;
    this.lastRegistrationMs = this.now();
  }
}

/** XIDs seen, by GPU UUID (null: an event that named no device) and code. */
export class XidCounts {
  private readonly counts = new Map<string, { gpu: string | null; xid: number; n: number }>();

  add(gpu: string | null, xid: number, n: number): void {
    const key = `${gpu ?? 'all'}:${xid}`;
    const c = this.counts.get(key);
    if (c === undefined) this.counts.set(key, { gpu, xid, n });
    else c.n += n;
  }

  entries(): { gpu: string | null; xid: number; n: number }[] {
    return [...this.counts.values()].sort((a, b) => (a.gpu ?? '').localeCompare(b.gpu ?? '') || a.xid - b.xid);
  }
}

/** Everything counted over the life of the process. */
export class NodeMetrics {
  readonly xids = new XidCounts();
  private readonly resources = new Map<string, ResourceMetrics>();
  private readonly now: () => number;
  /** Seconds from process start to every resource registered for the first time, once known. */
  startToRegisteredSeconds: number | null = null;

  constructor(now: () => number) {
    this.now = now;
  }

  resource(name: string): ResourceMetrics {
    let r = this.resources.get(name);
    if (r === undefined) {
      r = new ResourceMetrics(name, this.now);
      this.resources.set(name, r);
    }
    return r;
  }

  allResources(): ResourceMetrics[] {
    return [...this.resources.values()].sort((a, b) => (a.name < b.name ? -1 : a.name > b.name ? 1 : 0));
  }

  clock(): number {
    return this.now();
  }
}

/** The node's state when the file is written. */
export interface MetricsSnapshot {
  readonly version: string;
  readonly driverVersion: string;
  readonly node: string;
  readonly gpus: readonly { readonly index: number; readonly uuid: string; readonly healthy: boolean }[];
  /** Resources advertised now, with how many of their devices are healthy. */
  readonly resources: readonly { readonly name: string; readonly devices: number; readonly healthy: number }[];
  /** Each MPS resource's control daemon: whether it answers (absent or empty: no MPS resource). */
  readonly mpsDaemons?: readonly { readonly resource: string; readonly up: boolean }[];
  /** Each read GPU's health signals (absent or empty: none read). */
  readonly signals?: readonly GpuSignalMetrics[];
  readonly residentBytes: number;
}

/** A label value in the exposition format: backslash, double quote and newline escaped. */
export function escapeLabel(v: string): string {
  return v.replace(/\\/g, '\\\\').replace(/"/g, '\\"').replace(/\n/g, '\\n');
}

type Pairs = readonly (readonly [string, string])[];

function labels(pairs: Pairs): string {
  return pairs.length === 0 ? '' : `{${pairs.map(([k, v]) => `${k}="${escapeLabel(v)}"`).join(',')}}`;
}

function num(v: number): string {
  if (Number.isNaN(v)) return 'NaN';
  if (v === Infinity) return '+Inf';
  if (v === -Infinity) return '-Inf';
  return String(v);
}

const P = 'gpu_device_plugin_';

/** Writes the lines of the .prom file: a family's HELP and TYPE, and one sample, each named without the prefix. */
interface PromWriter {
  family(name: string, type: 'gauge' | 'counter' | 'histogram', help: string): void;
  sample(name: string, pairs: Pairs, v: number): void;
}

function promWriter(out: string[]): PromWriter {
  return {
    family: (name, type, help) => {
      out.push(`# HELP ${P}${name} ${help}`, `# TYPE ${P}${name} ${type}`);
    },
    sample: (name, pairs, v) => {
      out.push(`${P}${name}${labels(pairs)} ${num(v)}`);
    },
  };
}

function writeBuildInfo(w: PromWriter, s: MetricsSnapshot): void {
  w.family(
    'build_info',
    'gauge',
    'Always 1; the labels say which plugin version runs on which node with which NVIDIA driver.',
  );
  w.sample(
    'build_info',
    [
      ['version', s.version],
      ['driver', s.driverVersion],
      ['node', s.node],
    ],
    1,
  );
}

/** What is advertised and healthy now: devices per resource, MPS daemons, GPUs. */
function writeNodeHealth(w: PromWriter, s: MetricsSnapshot): void {
  w.family('devices_advertised', 'gauge', 'Devices advertised to the kubelet, per resource.');
  for (const r of s.resources) w.sample('devices_advertised', [['resource', r.name]], r.devices);
  w.family('devices_healthy', 'gauge', 'Advertised devices that are healthy, per resource.');
  for (const r of s.resources) w.sample('devices_healthy', [['resource', r.name]], r.healthy);

  // Only on nodes with MPS resources: elsewhere there is no daemon to be up or down.
  if (s.mpsDaemons !== undefined && s.mpsDaemons.length > 0) {
    w.family(
      'mps_daemon_up',
      'gauge',
      '1 when the MPS control daemon of the resource answers, 0 when it does not ' +
        '(its replicas are then advertised Unhealthy).',
    );
    for (const d of s.mpsDaemons) w.sample('mps_daemon_up', [['resource', d.resource]], d.up ? 1 : 0);
  }

  w.family('gpu_healthy', 'gauge', '1 when the GPU is healthy, 0 when it is not (XID, double-bit ECC error, lost).');
  for (const g of s.gpus)
    w.sample(
      'gpu_healthy',
      [
        ['uuid', g.uuid],
        ['index', String(g.index)],
      ],
      g.healthy ? 1 : 0,
    );
}

function writeXids(w: PromWriter, xids: XidCounts, gpus: MetricsSnapshot['gpus']): void {
  const gpuById = new Map(gpus.map((g) => [g.uuid, g]));
  w.family(
    'xid_errors_total',
    'counter',
    'NVML XID events seen, by GPU and XID code (uuid and index "all" for events naming no GPU).',
  );
  for (const x of xids.entries()) {
    // A GPU that has left since keeps its count, with index "gone".
    const g = x.gpu === null ? undefined : gpuById.get(x.gpu);
    const index = x.gpu === null ? 'all' : g === undefined ? 'gone' : String(g.index);
    w.sample(
      'xid_errors_total',
      [
        ['uuid', x.gpu ?? 'all'],
        ['index', index],
        ['xid', String(x.xid)],
      ],
      x.n,
    );
  }
}

function writeRegistrations(w: PromWriter, rs: readonly ResourceMetrics[], nowMs: number): void {
  w.family('registrations_total', 'counter', 'Registrations the kubelet accepted, per resource.');
  for (const r of rs) w.sample('registrations_total', [['resource', r.name]], r.registrations);
  w.family(
    'reregistrations_total',
    'counter',
    'Registrations after the first (kubelet restarts, socket recreated, config reloads), per resource.',
  );
  for (const r of rs) w.sample('reregistrations_total', [['resource', r.name]], Math.max(0, r.registrations - 1));
  w.family(
    'seconds_since_last_registration',
    'gauge',
    'Seconds since the kubelet last accepted a registration, per resource.',
  );
  for (const r of rs)
    if (r.lastRegistrationMs !== null)
      w.sample(
        'seconds_since_last_registration',
        [['resource', r.name]],
        Math.max(0, (nowMs - r.lastRegistrationMs) / 1000),
      );
}

function writeRpcs(w: PromWriter, rs: readonly ResourceMetrics[]): void {
  w.family(
    'rpcs_total',
    'counter',
    'DevicePlugin RPCs answered, by resource, method and outcome (ok, refused as a bad request, error).',
  );
  for (const r of rs) {
    RPC_METHODS.forEach((method, mi) => {
      RPC_OUTCOMES.forEach((outcome, oi) => {
        w.sample(
          'rpcs_total',
          [
            ['resource', r.name],
            ['method', method],
            ['outcome', outcome],
          ],
          r.rpcs[mi * RPC_OUTCOMES.length + oi] ?? 0,
        );
      });
    });
  }
}

/** A latency histogram per resource: cumulative buckets, then +Inf, sum and count. */
function writeLatency(
  w: PromWriter,
  rs: readonly ResourceMetrics[],
  name: string,
  help: string,
  pick: (r: ResourceMetrics) => Histogram,
): void {
  w.family(name, 'histogram', help);
  for (const r of rs) {
    const h = pick(r);
    let cumulative = 0;
    LATENCY_BUCKETS.forEach((le, i) => {
      cumulative += h.counts[i] ?? 0;
      w.sample(
        `${name}_bucket`,
        [
          ['resource', r.name],
          ['le', String(le)],
        ],
        cumulative,
      );
    });
    w.sample(
      `${name}_bucket`,
      [
        ['resource', r.name],
        ['le', '+Inf'],
      ],
      h.count,
    );
    w.sample(`${name}_sum`, [['resource', r.name]], h.sum);
    w.sample(`${name}_count`, [['resource', r.name]], h.count);
  }
}

/** The .prom file: HELP and TYPE for every family, then its samples; the same input gives the same text. */
export function renderMetrics(m: NodeMetrics, s: MetricsSnapshot): string {
  const out: string[] = [];
  const w = promWriter(out);
  const now = m.clock();
  const rs = m.allResources();
  writeBuildInfo(w, s);
  writeNodeHealth(w, s);
  writeXids(w, m.xids, s.gpus);
  writeRegistrations(w, rs, now);
  writeRpcs(w, rs);
  writeLatency(w, rs, 'allocate_duration_seconds', 'Time to answer Allocate, in seconds.', (r) => r.allocate);
  writeLatency(
    w,
    rs,
    'preferred_allocation_duration_seconds',
    'Time to answer GetPreferredAllocation, in seconds.',
    (r) => r.preferred,
  );
  if (m.startToRegisteredSeconds !== null) {
    w.family(
      'start_to_registered_seconds',
      'gauge',
      'Seconds from process start until every resource was registered for the first time.',
    );
    w.sample('start_to_registered_seconds', [], m.startToRegisteredSeconds);
  }
  renderSignalMetrics(s.signals ?? [], w.family, w.sample);
  w.family('resident_memory_bytes', 'gauge', 'Resident set size of the plugin process, in bytes.');
  w.sample('resident_memory_bytes', [], s.residentBytes);
  return `${out.join('\n')}\n`;
}
