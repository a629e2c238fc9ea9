// End-to-end: the NFD feature file and the node_exporter metrics file written by the built
// executable on a simulated node (fake NVML + kubelet stand-in): exact labels, atomic replacement,
// no rewrite without change, updates on reload, counters moving on XIDs, RPCs and re-registrations.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { existsSync, mkdirSync, mkdtempSync, readFileSync, rmSync, statSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { dirname, join } from 'node:path';
import { SimNode } from '../support/sim.ts';
import { parseSamples, promtoolProblems } from '../support/prom.ts';
import { onEvent, onFileChange, waitFor } from '../support/wait.ts';

/**
 * Resolves with fn's first value other than undefined, read again on each line the plugin logs and
 * each change in the directory of `file` (where it writes its labels or metrics).
 */
const written = <T>(
  node: SimNode,
  file: string,
  what: string | (() => string),
  fn: () => T | undefined,
  deadlineMs = 15000,
): Promise<NonNullable<T>> =>
  waitFor(fn, { on: [onEvent(node.plugin, 'line'), onFileChange(dirname(file))], what, deadlineMs });

const readIf = (path: string): string | undefined => (existsSync(path) ? readFileSync(path, 'utf8') : undefined);

const PLAIN = [
  'nvidia.com/cuda.driver-version.full=550.54.15',
  'nvidia.com/cuda.driver-version.major=550',
  'nvidia.com/cuda.driver-version.minor=54',
  'nvidia.com/cuda.driver-version.revision=15',
  'nvidia.com/cuda.driver.major=550',
  'nvidia.com/cuda.driver.minor=54',
  'nvidia.com/cuda.driver.rev=15',
  'nvidia.com/cuda.runtime-version.full=12.8',
  'nvidia.com/cuda.runtime-version.major=12',
  'nvidia.com/cuda.runtime-version.minor=8',
  'nvidia.com/cuda.runtime.major=12',
  'nvidia.com/cuda.runtime.minor=8',
  'nvidia.com/gpu.compute.major=7',
  'nvidia.com/gpu.compute.minor=0',
  'nvidia.com/gpu.count=8',
  'nvidia.com/gpu.family=volta',
  'nvidia.com/gpu.machine=DGX-1-with-V100-32',
  'nvidia.com/gpu.memory=32768',
  'nvidia.com/gpu.product=Tesla-V100-SXM2-32GB',
  'nvidia.com/gpu.replicas=1',
  'nvidia.com/gpu.sharing-strategy=none',
  'nvidia.com/mig.capable=false',
  'nvidia.com/mps.capable=false',
  '',
].join('\n');

const SHARED = PLAIN.replace('gpu.product=Tesla-V100-SXM2-32GB', 'gpu.product=Tesla-V100-SXM2-32GB-SHARED')
  .replace('gpu.replicas=1', 'gpu.replicas=4')
  .replace('gpu.sharing-strategy=none', 'gpu.sharing-strategy=time-slicing');

/** demo-8 with a CUDA driver version other than the fake's default, so the label is seen to come from NVML. */
function topologyWithCuda(dir: string): string {
  const path = join(dir, 'topology.json');
  const topo = JSON.parse(
    readFileSync(join(import.meta.dirname, '..', 'fixtures', 'topologies', 'demo-8.json'), 'utf8'),
  ) as Record<string, unknown>;
  writeFileSync(path, JSON.stringify({ ...topo, cudaDriverVersion: 12080 }));
  return path;
}

const NO_SHARING_CONFIG = 'version: v1\nflags:\n  migStrategy: none\n';
const SHARING_CONFIG =
  'version: v1\nsharing:\n  timeSlicing:\n    resources:\n      - name: nvidia.com/gpu\n        replicas: 4\n';

test(
  'labels file: exact content, rewritten on reload only when it ' +
    'changes, kept across a restart, removed on stop only when asked',
  async () => {
    const dir = mkdtempSync(join(tmpdir(), 'gdp-labels-'));
    const features = join(dir, 'features.d');
    mkdirSync(features);
    const labels = join(features, 'gpu-device-plugin');
    const config = join(dir, 'config.yaml');
    writeFileSync(config, NO_SHARING_CONFIG);
    const topology = topologyWithCuda(dir);
    const args = ['--config-file', config, '--nfd-features-file', labels];
    let node = await SimNode.start({ topology, machine: 'DGX-1 with V100-32', args });
    try {
      assert.equal(await written(node, labels, 'the labels file', () => readIf(labels)), PLAIN);
      const first = statSync(labels);

      // A reload that changes nothing leaves the file alone (same inode, same mtime).
      let from = node.plugin.lines.length;
      node.plugin.signal('SIGHUP');
      await node.plugin.waitForLine(/config reloaded; nothing to change/, 10000, from);
      assert.equal(statSync(labels).ino, first.ino);
      assert.equal(statSync(labels).mtimeMs, first.mtimeMs);

      // Time-slicing: product -SHARED, replicas, strategy.
      writeFileSync(config, SHARING_CONFIG);
      from = node.plugin.lines.length;
      node.plugin.signal('SIGHUP');
      await node.plugin.waitForLine(/config reloaded.*changed/, 10000, from);
      assert.equal(
        await written(node, labels, 'the shared labels', () => (readIf(labels) === SHARED ? SHARED : undefined)),
        SHARED,
      );
      await written(node, labels, 'two writes logged', () =>
        node.plugin.matching(/node labels written/).length === 2 ? true : undefined,
      );

      // A clean stop keeps the file; the next start with the same node state does not rewrite it.
      node.plugin.signal('SIGTERM');
      assert.deepEqual(await node.plugin.exited, { code: 0, signal: null }, node.plugin.lines.slice(-40).join('\n'));
      const kept = statSync(labels);
      assert.equal(readFileSync(labels, 'utf8'), SHARED);
      await node.stop();
      node = await SimNode.start({ topology, machine: 'DGX-1 with V100-32', args: [...args, '--nfd-remove-on-stop'] });
      await node.plugin.waitForLine(/node labels file already up to date/, 10000);
      assert.equal(node.plugin.matching(/node labels written/).length, 0);
      assert.equal(statSync(labels).ino, kept.ino);
      assert.equal(statSync(labels).mtimeMs, kept.mtimeMs);

      // --nfd-remove-on-stop: gone after a clean stop.
      node.plugin.signal('SIGTERM');
      assert.equal((await node.plugin.exited).code, 0);
      assert.equal(existsSync(labels), false);
    } finally {
      await node.stop();
      rmSync(dir, { recursive: true, force: true });
    }
  },
);

test('labels file: a reader polling during reloads only ever sees one complete version or the other', async () => {
  const dir = mkdtempSync(join(tmpdir(), 'gdp-labels-'));
  const labels = join(dir, 'gpu-device-plugin');
  const config = join(dir, 'config.yaml');
  writeFileSync(config, NO_SHARING_CONFIG);
  const topology = topologyWithCuda(dir);
  const node = await SimNode.start({
    topology,
    machine: 'DGX-1 with V100-32',
    args: ['--config-file', config, '--nfd-features-file', labels],
  });
  try {
    await written(node, labels, 'the labels file', () => readIf(labels));
    const seen = new Map<string, number>();
    let reading = true;
    const reader = (async () => {
      while (reading) {
        const text = readIf(labels) ?? '(missing)';
        seen.set(text, (seen.get(text) ?? 0) + 1);
        await new Promise((r) => setImmediate(r));
      }
    })();
    for (let i = 0; i < 10; i++) {
      writeFileSync(config, i % 2 === 0 ? SHARING_CONFIG : NO_SHARING_CONFIG);
      const want = i % 2 === 0 ? SHARED : PLAIN;
      const from = node.plugin.lines.length;
      node.plugin.signal('SIGHUP');
      await node.plugin.waitForLine(/config reloaded/, 10000, from);
      await written(node, labels, `version ${i}`, () => (readIf(labels) === want ? true : undefined));
    }
    reading = false;
    await reader;
    assert.deepEqual(
      [...seen.keys()].filter((t) => t !== PLAIN && t !== SHARED),
      [],
      'a partial or missing file was read',
    );
    await written(node, labels, 'eleven writes logged', () =>
      node.plugin.matching(/node labels written/).length === 11 ? true : undefined,
    );
    assert.ok((seen.get(PLAIN) ?? 0) > 0 && (seen.get(SHARED) ?? 0) > 0);
  } finally {
    await node.stop();
    rmSync(dir, { recursive: true, force: true });
  }
});

test(
  'metrics file: parsed back; RPCs, XIDs and re-registrations ' + 'move the counters; promtool finds nothing wrong',
  async () => {
    const dir = mkdtempSync(join(tmpdir(), 'gdp-metrics-'));
    const prom = join(dir, 'gpu-device-plugin.prom');
    const node = await SimNode.start({ topology: 'demo-8', args: ['--metrics-file', prom, '--metrics-interval', '1'] });
    const P = 'gpu_device_plugin_';
    const R = 'resource="nvidia.com/gpu"';
    const sample = (name: string): number | undefined => {
      const text = readIf(prom);
      return text === undefined ? undefined : parseSamples(text).get(`${P}${name}`);
    };
    const until = (name: string, want: number): Promise<number> =>
      written(
        node,
        prom,
        () => `${name} = ${want} (now ${sample(name)}); plugin log:\n${node.plugin.lines.slice(-30).join('\n')}`,
        () => (sample(name) === want ? want : undefined),
      );
    try {
      const u = node.topology.gpus.map((g) => g.uuid);
      await until(`registrations_total{${R}}`, 1);
      const first = parseSamples(readFileSync(prom, 'utf8'));
      assert.equal(
        first.get(
          `${P}build_info{version="` +
            `${JSON.parse(readFileSync(join(import.meta.dirname, '..', '..', 'package.json'), 'utf8')).version}` +
            `",driver="550.54.15",node="${(await import('node:os')).hostname()}"}`,
        ),
        1,
      );
      assert.equal(first.get(`${P}devices_advertised{${R}}`), 8);
      assert.ok((first.get(`${P}start_to_registered_seconds`) ?? 0) > 0);
      assert.ok((first.get(`${P}resident_memory_bytes`) ?? 0) > 10_000_000);

      await node.kubelet!.allocate({ container_requests: [{ devices_ids: [u[0]!] }] });
      await node.kubelet!.allocate({ container_requests: [{ devices_ids: [u[1]!, u[2]!] }] });
      await assert.rejects(node.kubelet!.allocate({ container_requests: [{ devices_ids: ['GPU-not-here'] }] }));
      await node.kubelet!.preferred({
        container_requests: [{ available_deviceIDs: u, must_include_deviceIDs: [], allocation_size: 2 }],
      });
      await until(`rpcs_total{${R},method="Allocate",outcome="ok"}`, 2);
      await until(`rpcs_total{${R},method="Allocate",outcome="refused"}`, 1);
      await until(`rpcs_total{${R},method="GetPreferredAllocation",outcome="ok"}`, 1);
      await until(`allocate_duration_seconds_count{${R}}`, 3);
      await until(`preferred_allocation_duration_seconds_bucket{${R},le="+Inf"}`, 1);

      // A critical XID: counted, and the GPU turns unhealthy in the file.
      await node.plugin.waitForLine(/watching GPU health/, 15000);
      node.nvml('xid 2 79');
      await until(`xid_errors_total{uuid="${u[2]}",index="2",xid="79"}`, 1);
      await until(`gpu_healthy{uuid="${u[2]}",index="2"}`, 0);
      await until(`devices_healthy{${R}}`, 7);

      // A kubelet restart: registered again, counted as a re-registration.
      await node.kubelet!.restart();
      await node.kubelet!.waitForRegistrations(2, 15000);
      await until(`reregistrations_total{${R}}`, 1);
      await until(`registrations_total{${R}}`, 2);
      assert.ok((sample(`seconds_since_last_registration{${R}}`) ?? -1) >= 0);

      assert.equal(promtoolProblems(readFileSync(prom, 'utf8')), '');
    } finally {
      await node.stop();
      rmSync(dir, { recursive: true, force: true });
    }
  },
);

test(
  'labels follow re-discovery: a GPU leaves and comes ' + 'back, the driver goes (labels kept) and returns upgraded',
  async () => {
    const dir = mkdtempSync(join(tmpdir(), 'gdp-labels-'));
    const labels = join(dir, 'gpu-device-plugin');
    const prom = join(dir, 'gpu-device-plugin.prom');
    const node = await SimNode.start({
      topology: topologyWithCuda(dir),
      machine: 'DGX-1 with V100-32',
      args: [
        '--rediscover-interval',
        '0.2',
        '--nfd-features-file',
        labels,
        '--metrics-file',
        prom,
        '--metrics-interval',
        '1',
      ],
    });
    const label = (name: string): string | undefined =>
      readIf(labels)
        ?.split('\n')
        .find((l) => l.startsWith(`nvidia.com/${name}=`))
        ?.split('=')[1];
    const untilLabel = (name: string, want: string): Promise<string> =>
      written(
        node,
        labels,
        () => `${name}=${want} (now ${label(name)})`,
        () => (label(name) === want ? want : undefined),
        30000,
      );
    try {
      assert.equal(await written(node, labels, 'the labels file', () => readIf(labels)), PLAIN);
      const u = node.topology.gpus.map((g) => g.uuid);
      node.nvml('remove 3');
      await untilLabel('gpu.count', '7');
      await written(node, labels, '7 devices in the metrics', () =>
        parseSamples(readIf(prom) ?? '').get('gpu_device_plugin_devices_advertised{resource="nvidia.com/gpu"}') === 7
          ? true
          : undefined,
      );
      node.nvml(`add ${u[3]}`);
      await untilLabel('gpu.count', '8');
      assert.equal(readFileSync(labels, 'utf8'), PLAIN);

      // The driver goes away: the labels stay as they were (no flapping during an upgrade).
      const before = statSync(labels);
      node.nvml('unload');
      await node.plugin.waitForLine(/the NVIDIA driver does not answer/, 20000);
      assert.equal(readFileSync(labels, 'utf8'), PLAIN);
      assert.equal(statSync(labels).ino, before.ino);
      node.nvml('load 560.28.03');
      await untilLabel('cuda.driver-version.full', '560.28.03');
      assert.equal(label('cuda.driver.major'), '560');
      assert.equal(label('cuda.driver.minor'), '28');
      assert.equal(label('cuda.driver.rev'), '03');
      assert.equal(label('gpu.count'), '8');
    } finally {
      await node.stop();
      rmSync(dir, { recursive: true, force: true });
    }
  },
);

test(
  'MIG labels: mixed labels every advertised profile and ' + 'follows a re-layout; single describes the MIG devices',
  async () => {
    const dir = mkdtempSync(join(tmpdir(), 'gdp-mig-labels-'));
    const labels = join(dir, 'gpu-device-plugin');
    const read = (): Map<string, string> =>
      new Map(
        (readIf(labels) ?? '')
          .split('\n')
          .filter((l) => l !== '')
          .map((l) => l.split('=') as [string, string]),
      );
    const until = (name: string, want: string | undefined): Promise<Map<string, string>> =>
      written(
        node,
        labels,
        () => `${name}=${want} (now ${read().get(name)})`,
        () => {
          const l = read();
          return l.get(name) === want ? l : undefined;
        },
        20000,
      );
    let node = await SimNode.start({
      topology: 'mig-mixed-4',
      args: ['--mig-strategy=mixed', '--nfd-features-file', labels],
      waitRegistered: false,
    });
    try {
      // GPU 0 (A100) has 2x 1g.10gb, 1g.10gb+me, 2g.20gb and a sub-instance; GPU 1 (H100) 3g.40gb, 1g.20gb, 2x 1g.10gb.
      let l = await until('nvidia.com/mig-1g.10gb.count', '4');
      assert.equal(l.get('nvidia.com/mig.strategy'), 'mixed');
      // gpu.* stay as with none: the labelled model is the A100, of which the node has three.
      assert.equal(l.get('nvidia.com/gpu.count'), '3');
      assert.equal(l.get('nvidia.com/mig-1g.10gb.product'), 'NVIDIA-A100-SXM4-80GB-MIG-1g.10gb');
      assert.equal(l.get('nvidia.com/mig-1g.10gb.slices.gi'), '1');
      assert.equal(l.get('nvidia.com/mig-1g.10gb.replicas'), '1');
      assert.match(l.get('nvidia.com/mig-1g.10gb.memory') ?? '', /^9\d{3}$/);
      assert.match(l.get('nvidia.com/mig-1g.10gb.multiprocessors') ?? '', /^[1-9]\d*$/);
      assert.equal(l.get('nvidia.com/mig-1g.10gb.me.count'), '1');
      assert.equal(l.get('nvidia.com/mig-3g.40gb.product'), 'NVIDIA-H100-80GB-HBM3-MIG-3g.40gb');
      assert.equal(l.get('nvidia.com/mig-3g.40gb.slices.gi'), '3');
      for (const k of l.keys()) assert.doesNotMatch(k, /1c\.2g/, 'a sub-instance is neither advertised nor labelled');
      // The H100 is re-partitioned into one 7g.80gb: its profiles' labels go, the new one comes.
      node.nvml('mig 1 on 7g.80gb');
      await node.nvmlStats();
      node.plugin.signal('SIGHUP');
      l = await until('nvidia.com/mig-7g.80gb.count', '1');
      assert.equal(l.get('nvidia.com/mig-1g.10gb.count'), '2');
      assert.equal(l.has('nvidia.com/mig-3g.40gb.count'), false);
      assert.equal(l.has('nvidia.com/mig-1g.20gb.count'), false);
      await node.stop();

      rmSync(labels, { force: true });
      node = await SimNode.start({
        topology: 'mig-uniform-2',
        args: ['--mig-strategy=single', '--nfd-features-file', labels],
      });
      l = await until('nvidia.com/gpu.count', '4');
      assert.equal(l.get('nvidia.com/mig.strategy'), 'single');
      assert.equal(l.get('nvidia.com/gpu.product'), 'NVIDIA-H100-80GB-HBM3-MIG-3g.40gb');
      assert.equal(l.get('nvidia.com/gpu.slices.gi'), '3');
      assert.equal(l.get('nvidia.com/gpu.slices.ci'), '3');
      assert.match(l.get('nvidia.com/gpu.memory') ?? '', /^4\d{4}$/);
      for (const e of ['copy', 'decoder', 'encoder', 'jpeg', 'ofa'])
        assert.match(l.get(`nvidia.com/gpu.engines.${e}`) ?? '', /^\d+$/, e);
    } finally {
      await node.stop();
      rmSync(dir, { recursive: true, force: true });
    }
  },
);
