// Health signals as node state: the live node's readings by GPU UUID (src/node/live-node.ts,
// node-signals.ts) — a critical signal takes the GPU and all that shares it out of service, a warning
// changes no health, recovery from an XID waits for the recovery action NONE, XID 154 only prompts a
// read — and what the pure consumers make of the snapshot: DRA taints, the NVLinks in service, the
// metrics, the node-reboot label, the STATUS words.
import assert from 'node:assert/strict';
import { test } from 'node:test';
import type { Gpu } from '../../src/core/devices.ts';
import { poolContent } from '../../src/core/dra-slices.ts';
import { parseHealthSettings } from '../../src/core/health-policy.ts';
import type { EventBatchEntry } from '../../src/core/health-events.ts';
import { DEFAULT_SIGNAL_POLICY, evaluateGpuSignals } from '../../src/core/health-signals.ts';
import type { GpuSignals, SignalReading } from '../../src/core/health-signals.ts';
import { nodeLabels } from '../../src/core/labels.ts';
import { NodeMetrics, renderMetrics } from '../../src/core/metrics.ts';
import type { MigDevice, MigLayout } from '../../src/core/mig.ts';
import { planSnapshot } from '../../src/core/resource-plan.ts';
import { NO_SHARING } from '../../src/core/sharing.ts';
import { buildSnapshot, withSignals } from '../../src/core/snapshot.ts';
import type { NodeScan, NodeSnapshot } from '../../src/core/snapshot.ts';
import { liveNvlinks } from '../../src/core/snapshot-signals.ts';
import type { AppliedSnapshot, NodeConsumer, NodeSettings } from '../../src/node/consumer.ts';
import { LiveNode } from '../../src/node/live-node.ts';
import { labelInput, metricsView } from '../../src/observe/observer.ts';
import { createLogger } from '../../src/system/log.ts';
import { signalStatus } from '../../src/system/service-status.ts';

const MiB = 1024 * 1024;
const uuid = (i: number): string => `GPU-0000000${i}-aaaa-4000-8000-000000000000`;
const gpu = (i: number): Gpu => ({
  index: i,
  uuid: uuid(i),
  name: 'NVIDIA A100-SXM4-80GB',
  minor: i,
  busId: `00000000:0${i}:00.0`,
  memoryBytes: 81920 * MiB,
  numaNode: 0,
});
const migDev = (parent: number, gi: number): MigDevice => ({
  parent,
  index: gi - 1,
  uuid: `MIG-${parent}-${gi}`,
  gi,
  ci: 0,
  profile: '1g.10gb',
  giSlices: 1,
  ciSlices: 1,
  memoryBytes: 9728 * MiB,
  multiprocessors: 14,
  engines: { copy: 1, decoder: 0, encoder: 0, jpeg: 0, ofa: 0 },
});

/** Three GPUs; 0 and 1 joined by links 0 and 1 (both ends), GPU 2 alone. */
function scan(mig?: MigLayout): NodeScan {
  const gpus = [0, 1, 2].map(gpu);
  const link = (to: number, n: number) => ({
    remoteBusId: gpus[to]!.busId,
    remote: 'gpu' as const,
    link: n,
  });
  return {
    driverVersion: '550.54.15',
    gpus,
    nvlinks: [
      { busId: gpus[0]!.busId, links: [link(1, 0), link(1, 1)] },
      { busId: gpus[1]!.busId, links: [link(0, 0), link(0, 1)] },
      { busId: gpus[2]!.busId, links: [] },
    ],
    pcie: gpus.map((_, i) => gpus.map((_, j) => (i === j ? -1 : 40))),
    ...(mig === undefined ? {} : { mig }),
  };
}

const settings = (replicas = 1, migStrategy: 'none' | 'mixed' = 'none'): NodeSettings => ({
  plan: {
    deviceIdStrategy: 'uuid',
    migStrategy,
    sharing:
      replicas === 1
        ? NO_SHARING
        : {
            timeSlicing: {
              renameByDefault: false,
              failRequestsGreaterThanOne: false,
              resources: [{ name: 'nvidia.com/gpu', rename: null, replicas, devices: { kind: 'all' } }],
            },
          },
  },
});

/** A healthy reading, with some values changed. */
function reading(over: Partial<SignalReading['values']> = {}, atMs = 0): SignalReading {
  return {
    atMs,
    values: {
      'recovery-action': 0,
      'row-remap': { corrected: 0, uncorrected: 0, pending: false, failure: false },
      'retired-pages': 'unavailable',
      'ecc-uncorrectable': 0,
      nvlink: [0, 1],
      'pcie-width': { current: 16, max: 16 },
      'pcie-replay': 0,
      clocks: 0,
      ...over,
    },
  };
}

class Recorder implements NodeConsumer {
  readonly name = 'recorder';
  readonly applied: AppliedSnapshot[] = [];
  apply(a: AppliedSnapshot): void {
    this.applied.push(a);
  }
  get last(): NodeSnapshot {
    return this.applied.at(-1)!.snapshot;
  }
}

function setup(o: { recovery?: boolean; replicas?: number; mig?: boolean } = {}) {
  const lines: string[] = [];
  const log = createLogger({ level: 'debug', journal: false, write: (l) => lines.push(l) });
  const rec = new Recorder();
  let now = 1000;
  const node = new LiveNode({
    log,
    config: settings(o.replicas ?? 1, o.mig === true ? 'mixed' : 'none'),
    health: parseHealthSettings(undefined, undefined),
    recovery: { enabled: o.recovery === true, quietMs: 5000 },
    consumers: [rec],
    now: () => now,
  });
  return {
    node,
    rec,
    lines,
    advance: (ms: number) => {
      now += ms;
    },
    /** Every advertised device's health in list order, as letters. */
    list: (s: NodeSnapshot = rec.last): string =>
      planSnapshot(s, node.config.plan, null)
        .resources.flatMap((r) => r.devices)
        .map((d) => (s.health.get(d.mig ?? d.uuid) === 'Healthy' ? 'H' : 'U'))
        .join(''),
  };
}

/** The live node's queue has run what was enqueued so far. */
async function settle(node: LiveNode): Promise<void> {
  await node.reconfigure(node.config, 'settle');
}

const read = (t: ReturnType<typeof setup>, i: number, r: SignalReading): Promise<void> => {
  t.node.onSignals(new Map([[uuid(i), r]]));
  return settle(t.node);
};

test(
  'a critical signal takes its GPU out with every replica; ' + 'a warning changes no health; cleared, it is back',
  async () => {
    const t = setup({ replicas: 2 });
    await t.node.scanned(scan(), 'start');
    assert.equal(t.list(), 'HHHHHH');
    await read(t, 1, reading({ 'row-remap': { corrected: 1, uncorrected: 2, pending: true, failure: false } }));
    assert.equal(t.list(), 'HHUUHH', 'both replicas of GPU 1');
    assert.equal(t.rec.last.gpuHealth.get(uuid(1))?.state.health, 'Healthy', 'its XID health is untouched');
    const bad = t.lines.filter((l) => /ERROR GPU health signal bad gpu=1 uuid=GPU-00000001.* signal=row-remap/.test(l));
    assert.equal(bad.length, 1);
    assert.match(bad[0]!, /nvidia-smi -r -i 1/);
    await read(t, 2, reading({ clocks: 0x40 }));
    assert.equal(t.list(), 'HHUUHH', 'a warning leaves GPU 2 schedulable');
    assert.equal(t.lines.filter((l) => /WARN GPU health signal bad gpu=2 .*signal=clocks/.test(l)).length, 1);
    await read(t, 1, reading());
    assert.equal(t.list(), 'HHHHHH');
    assert.equal(t.lines.filter((l) => /INFO GPU health signal cleared gpu=1 .*signal=row-remap/.test(l)).length, 1);
    // A reading for a GPU the snapshot does not hold (the thread's list is older) is dropped.
    t.node.onSignals(new Map([['GPU-gone', reading({ 'ecc-uncorrectable': 3 })]]));
    await settle(t.node);
    assert.equal(t.rec.last.signals.has('GPU-gone'), false);
    await t.node.stop();
  },
);

test('a critical signal takes every MIG device of its GPU out', async () => {
  const t = setup({ mig: true });
  await t.node.scanned(
    scan({ modes: [{ current: true, pending: true }, null, null], devices: [migDev(0, 1), migDev(0, 2)] }),
    'start',
  );
  await read(t, 0, reading({ 'recovery-action': 1 }));
  const s = t.rec.last;
  assert.equal(s.health.get('MIG-0-1'), 'Unhealthy');
  assert.equal(s.health.get('MIG-0-2'), 'Unhealthy');
  assert.equal(s.health.get(uuid(1)), 'Healthy');
  await t.node.stop();
});

test('with recovery on, an XID-made Unhealthy GPU recovers only once the recovery action is NONE', async () => {
  const t = setup({ recovery: true });
  await t.node.scanned(scan(), 'start');
  t.node.onEvents([{ event: { kind: 'xid', gpu: uuid(0), xid: 74 }, count: 1 }]);
  await settle(t.node);
  await read(t, 0, reading({ 'recovery-action': 1 }));
  t.node.onProbe(new Map([[uuid(0), 'ok']]));
  await settle(t.node);
  t.advance(6000);
  t.node.onProbe(new Map([[uuid(0), 'ok']]));
  await settle(t.node);
  assert.equal(t.rec.last.gpuHealth.get(uuid(0))?.state.health, 'Unhealthy', 'held while the driver asks for a reset');
  await read(t, 0, reading());
  assert.equal(t.rec.last.gpuHealth.get(uuid(0))?.state.health, 'Healthy', 'recovered once the action is NONE');
  assert.equal(t.rec.last.health.get(uuid(0)), 'Healthy');
  await t.node.stop();
});

test('XID 154 only prompts a read of the recovery action: it is no XID fault', async () => {
  const t = setup();
  await t.node.scanned(scan(), 'start');
  const ev: EventBatchEntry[] = [{ event: { kind: 'xid', gpu: uuid(0), xid: 154 }, count: 1 }];
  t.node.onEvents(ev);
  await settle(t.node);
  assert.equal(t.rec.last.health.get(uuid(0)), 'Healthy');
  await t.node.stop();
});

function snapshotWith(signals: Record<number, SignalReading>): NodeSnapshot {
  const s = buildSnapshot(scan(), null, false);
  const updates = new Map<string, GpuSignals>();
  for (const [i, r] of Object.entries(signals)) {
    // The first reading sets the NVLink expectation (links 0 and 1 up).
    const first = evaluateGpuSignals(undefined, reading(), DEFAULT_SIGNAL_POLICY, Number(i));
    updates.set(uuid(Number(i)), { ...evaluateGpuSignals(first, r, DEFAULT_SIGNAL_POLICY, Number(i)), reading: r });
  }
  return withSignals(s, updates);
}

test('DRA: a taint per bad signal, NoSchedule for critical, None for a warning', () => {
  const s = snapshotWith({
    0: reading({ 'recovery-action': 2, 'pcie-width': { current: 8, max: 16 } }),
    1: reading(),
  });
  const devices = poolContent(s, { nodeName: 'n', migStrategy: 'none' }).slices.flat();
  assert.deepEqual(
    devices[0]?.taints?.map((x) => [x.key, x.value, x.effect]),
    [
      ['gpu.nvidia.com/recovery-action', 'NODE_REBOOT', 'NoSchedule'],
      ['gpu.nvidia.com/pcie-width', 'x8-of-x16', 'None'],
    ],
  );
  assert.equal(devices[1]?.taints, undefined);
});

test('an NVLink down leaves the topology (both ends) and the nvlinkDomain attribute; up again, it is back', () => {
  const healthy = snapshotWith({ 0: reading(), 1: reading() });
  assert.equal(liveNvlinks(healthy), healthy.nvlinks);
  const down = snapshotWith({ 0: reading({ nvlink: [] }), 1: reading() });
  assert.deepEqual(
    liveNvlinks(down).map((g) => g.links.length),
    [0, 0, 0],
  );
  const domain = (s: NodeSnapshot) =>
    poolContent(s, { nodeName: 'n', migStrategy: 'none' }).slices.flat()[1]?.attributes.nvlinkDomain;
  assert.deepEqual(domain(healthy), { int: 0 });
  assert.equal(domain(down), undefined);
  const one = snapshotWith({ 0: reading({ nvlink: [1] }) });
  assert.deepEqual(
    liveNvlinks(one).map((g) => g.links.map((l) => l.link)),
    [[1], [1], []],
  );
});

test('metrics carry the raw values; the node-reboot label while a GPU asks for a reboot; STATUS counts', () => {
  const s = snapshotWith({ 0: reading({ 'recovery-action': 2, 'ecc-uncorrectable': 3 }), 1: reading() });
  const text = renderMetrics(new NodeMetrics(() => 0), {
    ...metricsView(s),
    version: 'v',
    node: 'n',
    residentBytes: 1,
  });
  assert.match(text, /gpu_device_plugin_gpu_recovery_action\{uuid="GPU-00000000[^}]*index="0"\} 2/);
  assert.match(text, /gpu_device_plugin_gpu_ecc_uncorrected_volatile\{uuid="GPU-00000000[^}]*\} 3/);
  assert.match(text, /gpu_device_plugin_gpu_remapped_rows\{[^}]*kind="uncorrected"\} 0/);
  assert.match(text, /gpu_device_plugin_gpu_nvlink_links_up\{uuid="GPU-00000001[^}]*\} 2/);
  assert.match(text, /gpu_device_plugin_gpu_signal_bad\{[^}]*signal="recovery-action",class="critical"\} 1/);
  assert.doesNotMatch(text, /gpu_retired_pages\{/, 'a value the driver does not give has no sample');
  const labels = (x: NodeSnapshot) => nodeLabels({ ...labelInput(x, settings().plan)!, machine: null });
  assert.ok(labels(s).some(([k, v]) => k === 'nvidia.com/gpu.node-reboot-required' && v === 'true'));
  assert.ok(!labels(snapshotWith({ 0: reading() })).some(([k]) => k === 'nvidia.com/gpu.node-reboot-required'));
  assert.equal(signalStatus(s.signals, 0), '');
  assert.equal(signalStatus(s.signals, 3), '; health signals: 2 bad, 3 transitions');
});

test('a reading that changes no state, value or expected link makes no new snapshot; a changed value does', () => {
  const s = snapshotWith({ 0: reading() });
  const again = (r: SignalReading) => {
    const first = evaluateGpuSignals(undefined, reading(), DEFAULT_SIGNAL_POLICY, 0);
    return new Map([[uuid(0), { ...evaluateGpuSignals(first, r, DEFAULT_SIGNAL_POLICY, 0), reading: r }]]);
  };
  assert.equal(withSignals(s, again(reading({}, 5000))), s, 'the same reading later: the same snapshot');
  const moved = withSignals(s, again(reading({ 'pcie-replay': 3 }, 5000)));
  assert.notEqual(moved, s, 'a raw value the metrics carry moved');
  assert.equal(moved.signals.get(uuid(0))?.reading?.values['pcie-replay'], 3);
});
