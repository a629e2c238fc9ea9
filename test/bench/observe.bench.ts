// What the labels file and the metrics file cost, as one JSON object on stdout (run by
// `npm run bench`, or alone: node test/bench/observe.bench.ts after npm run build). In-process: CPU
// per label set, per metrics text, per atomic write and per recorded RPC. Against the built
// executable on the demo-8 node: NVML calls at start, resident memory and CPU time while idle, with
// both files on (metrics every second) and with both off.
import { mkdtempSync, readFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { labelsFile, nodeLabels } from '../../src/core/labels.ts';
import { NodeMetrics, OUTCOME, RPC, renderMetrics } from '../../src/core/metrics.ts';
import { NO_SHARING } from '../../src/core/sharing.ts';
import { AtomicFile } from '../../src/system/atomic-file.ts';
import { SimNode } from '../support/sim.ts';

const r2 = (x: number): number => Math.round(x * 100) / 100;
const sleep = (ms: number): Promise<void> => new Promise((r) => setTimeout(r, ms));

function perOp(n: number, fn: (i: number) => void): number {
  for (let i = 0; i < Math.min(n, 200); i++) fn(i);
  const t0 = process.cpuUsage();
  for (let i = 0; i < n; i++) fn(i);
  const d = process.cpuUsage(t0);
  return (d.user + d.system) / n;
}

const gpus = Array.from({ length: 8 }, () => ({
  name: 'Tesla V100-SXM2-32GB',
  memoryBytes: 32 << 30,
  compute: { major: 7, minor: 0 },
  migCapable: false,
  migEnabled: false,
}));
const labelsUs = perOp(5000, () =>
  labelsFile(
    nodeLabels({
      gpus,
      driverVersion: '550.54.15',
      cudaDriverVersion: 12040,
      machine: 'DGX-1',
      sharing: NO_SHARING,
      migStrategy: 'none',
      migDevices: [],
    }),
  ),
);

const metrics = new NodeMetrics(() => performance.now());
const res = metrics.resource('nvidia.com/gpu');
const rpcNs = perOp(2_000_000, (i) => res.rpc(RPC.Allocate, OUTCOME.ok, (i % 100) * 0.00001)) * 1000;
for (let i = 0; i < 8; i++) metrics.xids.add(`GPU-${i}`, 79, 1);
const snapshot = {
  version: '0.1.0',
  driverVersion: '550.54.15',
  node: 'bench',
  gpus: Array.from({ length: 8 }, (_, i) => ({ index: i, uuid: `GPU-${i}`, healthy: true })),
  resources: [{ name: 'nvidia.com/gpu', devices: 8, healthy: 8 }],
  residentBytes: 1,
};
const promText = renderMetrics(metrics, snapshot);
const renderUs = perOp(2000, () => renderMetrics(metrics, snapshot));

const dir = mkdtempSync(join(tmpdir(), 'gdp-bench-observe-'));
const file = new AtomicFile(join(dir, 'm.prom'));
const writes: number[] = [];
for (let i = 0; i < 300; i++) {
  const c0 = process.cpuUsage();
  await file.write(`${promText}# ${i}\n`);
  const d = process.cpuUsage(c0);
  writes.push(d.user + d.system);
}
writes.sort((a, b) => a - b);
rmSync(dir, { recursive: true, force: true });

async function processFigures(withFiles: boolean): Promise<Record<string, number>> {
  const out = mkdtempSync(join(tmpdir(), 'gdp-bench-observe-'));
  const args = withFiles
    ? ['--nfd-features-file', join(out, 'labels'), '--metrics-file', join(out, 'm.prom'), '--metrics-interval', '1']
    : [];
  const node = await SimNode.start({ topology: 'demo-8', args });
  try {
    await node.plugin.waitForLine(/watching GPU health/);
    const calls = (await node.nvmlStats()).calls;
    const nvmlAtStart = Object.values(calls).reduce((a, b) => a + b, 0);
    await sleep(2000);
    const cpu = (): number => {
      const f = readFileSync(`/proc/${node.plugin.pid}/stat`, 'utf8').split(') ')[1]?.split(' ') ?? [];
      return (Number(f[11]) + Number(f[12])) * 10; // utime + stime, clock ticks (100 Hz) → ms
    };
    const c0 = cpu();
    await sleep(20000);
    const cpuMsPerMinute = (cpu() - c0) * 3;
    const rss = node.plugin.rss();
    return {
      nvml_calls_until_watching: nvmlAtStart,
      idle_cpu_ms_per_minute: r2(cpuMsPerMinute),
      rss_mib: r2(rss.totalKiB / 1024),
      private_rss_mib: r2(rss.anonKiB / 1024),
    };
  } finally {
    await node.stop();
    rmSync(out, { recursive: true, force: true });
  }
}

const off = await processFigures(false);
const on = await processFigures(true);
process.stdout.write(
  `${JSON.stringify(
    {
      labels_file_content_us: r2(labelsUs),
      metrics_text_us: r2(renderUs),
      metrics_text_bytes: promText.length,
      atomic_write_cpu_us: {
        p50: writes[Math.floor(writes.length / 2)],
        p99: writes[Math.floor(writes.length * 0.99)],
      },
      rpc_record_ns: r2(rpcNs),
      files_off: off,
      files_on_metrics_every_second: on,
    },
    null,
    2,
  )}\n`,
);
