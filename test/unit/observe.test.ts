// Node labels (GFD's names and formats), the metrics text, and the atomic file writer.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { mkdtempSync, readFileSync, readdirSync, rmSync, statSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { archFamily, labelsFile, nodeLabels, sanitise } from '../../src/core/labels.ts';
import type { LabelGpu, LabelInput, LabelMigDevice } from '../../src/core/labels.ts';
import { LATENCY_BUCKETS, NodeMetrics, OUTCOME, RPC, escapeLabel, renderMetrics } from '../../src/core/metrics.ts';
import type { MetricsSnapshot } from '../../src/core/metrics.ts';
import { deviceHolders, holderText } from '../../src/core/holders.ts';
import { NO_SHARING } from '../../src/core/sharing.ts';
import type { Sharing } from '../../src/core/sharing.ts';
import { AtomicFile } from '../../src/system/atomic-file.ts';
import { parseSamples, promtoolProblems } from '../support/prom.ts';

const V100: LabelGpu = {
  name: 'Tesla V100-SXM2-32GB',
  memoryBytes: 32768 * 1048576,
  compute: { major: 7, minor: 0 },
  migCapable: false,
  migEnabled: false,
};
const A100: LabelGpu = {
  name: 'NVIDIA A100-SXM4-80GB',
  memoryBytes: 81920 * 1048576,
  compute: { major: 8, minor: 0 },
  migCapable: true,
  migEnabled: false,
};

function input(more: Partial<LabelInput> = {}): LabelInput {
  return {
    gpus: [V100, V100],
    driverVersion: '550.54.15',
    cudaDriverVersion: 12040,
    machine: 'DGX-1 with V100-32\n',
    sharing: NO_SHARING,
    migStrategy: 'none',
    migDevices: [],
    ...more,
  };
}

function slicing(replicas: number, rename: string | null, renameByDefault: boolean): Sharing {
  return {
    timeSlicing: {
      renameByDefault,
      failRequestsGreaterThanOne: false,
      resources: [{ name: 'nvidia.com/gpu', rename, replicas, devices: { kind: 'all' } }],
    },
  };
}

test('labels: the exact feature file for two V100s without sharing, sorted by name', () => {
  assert.equal(
    labelsFile(nodeLabels(input())),
    [
      'nvidia.com/cuda.driver-version.full=550.54.15',
      'nvidia.com/cuda.driver-version.major=550',
      'nvidia.com/cuda.driver-version.minor=54',
      'nvidia.com/cuda.driver-version.revision=15',
      'nvidia.com/cuda.driver.major=550',
      'nvidia.com/cuda.driver.minor=54',
      'nvidia.com/cuda.driver.rev=15',
      'nvidia.com/cuda.runtime-version.full=12.4',
      'nvidia.com/cuda.runtime-version.major=12',
      'nvidia.com/cuda.runtime-version.minor=4',
      'nvidia.com/cuda.runtime.major=12',
      'nvidia.com/cuda.runtime.minor=4',
      'nvidia.com/gpu.compute.major=7',
      'nvidia.com/gpu.compute.minor=0',
      'nvidia.com/gpu.count=2',
      'nvidia.com/gpu.family=volta',
      'nvidia.com/gpu.machine=DGX-1-with-V100-32',
      'nvidia.com/gpu.memory=32768',
      'nvidia.com/gpu.product=Tesla-V100-SXM2-32GB',
      'nvidia.com/gpu.replicas=1',
      'nvidia.com/gpu.sharing-strategy=none',
      'nvidia.com/mig.capable=false',
      'nvidia.com/mps.capable=false',
      '',
    ].join('\n'),
  );
});

test('labels: time-slicing appends -SHARED to the product unless the resource is renamed', () => {
  const get = (sharing: Sharing): Map<string, string> => new Map(nodeLabels(input({ sharing })));
  const shared = get(slicing(4, null, false));
  assert.equal(shared.get('nvidia.com/gpu.product'), 'Tesla-V100-SXM2-32GB-SHARED');
  assert.equal(shared.get('nvidia.com/gpu.replicas'), '4');
  assert.equal(shared.get('nvidia.com/gpu.sharing-strategy'), 'time-slicing');
  assert.equal(shared.get('nvidia.com/gpu.count'), '2');
  for (const renamed of [get(slicing(4, null, true)), get(slicing(4, 'nvidia.com/gpu.x', false))]) {
    assert.equal(renamed.get('nvidia.com/gpu.product'), 'Tesla-V100-SXM2-32GB');
    assert.equal(renamed.get('nvidia.com/gpu.replicas'), '4');
    assert.equal(renamed.get('nvidia.com/gpu.sharing-strategy'), 'time-slicing');
  }
  // One replica shares nothing.
  const one = get(slicing(1, null, false));
  assert.equal(one.get('nvidia.com/gpu.product'), 'Tesla-V100-SXM2-32GB');
  assert.equal(one.get('nvidia.com/gpu.sharing-strategy'), 'none');
});

test('labels: sanitising, families, the labelled model on mixed nodes, missing facts', () => {
  assert.equal(sanitise('NVIDIA  GeForce RTX™ 4090 (rev a1)'), 'NVIDIA-GeForce-RTX-4090-rev-a1');
  assert.deepEqual(
    [
      [3, 7],
      [5, 2],
      [6, 1],
      [7, 0],
      [7, 2],
      [7, 5],
      [8, 0],
      [8, 6],
      [8, 7],
      [8, 9],
      [9, 0],
      [10, 0],
      [12, 0],
      [13, 0],
    ].map(([a, b]) => archFamily(a ?? 0, b ?? 0)),
    [
      'kepler',
      'maxwell',
      'pascal',
      'volta',
      'volta',
      'turing',
      'ampere',
      'ampere',
      'ampere',
      'ada-lovelace',
      'hopper',
      'blackwell',
      'blackwell',
      'undefined',
    ],
  );
  const mixed = new Map(nodeLabels(input({ gpus: [A100, V100, V100] })));
  assert.equal(mixed.get('nvidia.com/gpu.product'), 'Tesla-V100-SXM2-32GB');
  assert.equal(mixed.get('nvidia.com/gpu.count'), '2');
  assert.equal(mixed.get('nvidia.com/mig.capable'), 'true');
  const tie = new Map(nodeLabels(input({ gpus: [A100, V100] })));
  assert.equal(tie.get('nvidia.com/gpu.product'), 'NVIDIA-A100-SXM4-80GB');
  assert.equal(tie.get('nvidia.com/gpu.family'), 'ampere');
  const bare = new Map(
    nodeLabels(
      input({ gpus: [{ ...V100, compute: null }], machine: null, cudaDriverVersion: null, driverVersion: '550' }),
    ),
  );
  assert.equal(bare.get('nvidia.com/gpu.machine'), 'unknown');
  for (const k of [
    'nvidia.com/gpu.family',
    'nvidia.com/gpu.compute.major',
    'nvidia.com/cuda.runtime.major',
    'nvidia.com/cuda.driver.major',
  ])
    assert.equal(bare.has(k), false, k);
  const twoPart = new Map(nodeLabels(input({ driverVersion: '470.82' })));
  assert.equal(twoPart.get('nvidia.com/cuda.driver.rev'), '');
  assert.equal(twoPart.get('nvidia.com/cuda.driver-version.full'), '470.82');
  assert.deepEqual(nodeLabels(input({ gpus: [] })), []);
});

// MIG devices as NVML's attributes describe them (A100-SXM4-80GB profiles).
const MiB = 1048576;
const engines = (copy: number, media: number): LabelMigDevice['engines'] => ({
  copy,
  decoder: media,
  encoder: 0,
  jpeg: media > 0 ? 1 : 0,
  ofa: media > 0 ? 1 : 0,
});
const mig1g = (parent: number): LabelMigDevice => ({
  parent,
  profile: '1g.10gb',
  giSlices: 1,
  ciSlices: 1,
  memoryBytes: 9856 * MiB,
  multiprocessors: 14,
  engines: engines(1, 0),
});
const mig3g = (parent: number): LabelMigDevice => ({
  parent,
  profile: '3g.40gb',
  giSlices: 3,
  ciSlices: 3,
  memoryBytes: 40192 * MiB,
  multiprocessors: 42,
  engines: engines(3, 2),
});
const migMe = (parent: number): LabelMigDevice => ({
  parent,
  profile: '1g.10gb+me',
  giSlices: 1,
  ciSlices: 1,
  memoryBytes: 9856 * MiB,
  multiprocessors: 14,
  engines: engines(1, 1),
});
const subInstance = (parent: number): LabelMigDevice => ({
  parent,
  profile: '1c.3g.40gb',
  giSlices: 3,
  ciSlices: 1,
  memoryBytes: 40192 * MiB,
  multiprocessors: 14,
  engines: engines(3, 2),
});
const on = { ...A100, migEnabled: true };

test(
  "labels, MIG mixed: gpu.* as with none, and GFD's labels " + 'for every profile advertised (full instances only)',
  () => {
    const l = new Map(
      nodeLabels(
        input({
          gpus: [on, on, A100],
          migStrategy: 'mixed',
          migDevices: [mig1g(0), mig1g(0), mig3g(0), migMe(1), mig1g(1), subInstance(1)],
        }),
      ),
    );
    assert.equal(l.get('nvidia.com/mig.strategy'), 'mixed');
    assert.equal(l.get('nvidia.com/gpu.count'), '3');
    assert.equal(l.get('nvidia.com/gpu.product'), 'NVIDIA-A100-SXM4-80GB');
    const mixed = [...l].filter(([k]) => k.startsWith('nvidia.com/mig-'));
    assert.deepEqual(
      Object.fromEntries(
        mixed.filter(([k]) => k.startsWith('nvidia.com/mig-1g.10gb.') && !k.startsWith('nvidia.com/mig-1g.10gb.me.')),
      ),
      {
        'nvidia.com/mig-1g.10gb.count': '3',
        'nvidia.com/mig-1g.10gb.engines.copy': '1',
        'nvidia.com/mig-1g.10gb.engines.decoder': '0',
        'nvidia.com/mig-1g.10gb.engines.encoder': '0',
        'nvidia.com/mig-1g.10gb.engines.jpeg': '0',
        'nvidia.com/mig-1g.10gb.engines.ofa': '0',
        'nvidia.com/mig-1g.10gb.memory': '9856',
        'nvidia.com/mig-1g.10gb.multiprocessors': '14',
        'nvidia.com/mig-1g.10gb.product': 'NVIDIA-A100-SXM4-80GB-MIG-1g.10gb',
        'nvidia.com/mig-1g.10gb.replicas': '1',
        'nvidia.com/mig-1g.10gb.slices.ci': '1',
        'nvidia.com/mig-1g.10gb.slices.gi': '1',
      },
    );
    // The +me profile is named as its resource is (nvidia.com/mig-1g.10gb.me); label values allow no '+'.
    assert.equal(l.get('nvidia.com/mig-1g.10gb.me.count'), '1');
    assert.equal(l.get('nvidia.com/mig-1g.10gb.me.product'), 'NVIDIA-A100-SXM4-80GB-MIG-1g.10gb.me');
    assert.equal(l.get('nvidia.com/mig-1g.10gb.me.engines.decoder'), '1');
    assert.equal(l.get('nvidia.com/mig-3g.40gb.count'), '1');
    assert.equal(l.get('nvidia.com/mig-3g.40gb.multiprocessors'), '42');
    // A sub-instance is not advertised, so it is not labelled either.
    assert.equal(
      mixed.some(([k]) => k.includes('1c.3g')),
      false,
    );
    // Time-slicing a MIG resource: its replicas, and -SHARED unless renamed.
    const shared: Sharing = {
      timeSlicing: {
        renameByDefault: false,
        failRequestsGreaterThanOne: false,
        resources: [{ name: 'nvidia.com/mig-1g.10gb', rename: null, replicas: 4, devices: { kind: 'all' } }],
      },
    };
    const s = new Map(
      nodeLabels(input({ gpus: [on, A100], migStrategy: 'mixed', migDevices: [mig1g(0)], sharing: shared })),
    );
    assert.equal(s.get('nvidia.com/mig-1g.10gb.replicas'), '4');
    assert.equal(s.get('nvidia.com/mig-1g.10gb.product'), 'NVIDIA-A100-SXM4-80GB-MIG-1g.10gb-SHARED');
    assert.equal(s.get('nvidia.com/gpu.product'), 'NVIDIA-A100-SXM4-80GB');
    // No MIG devices: no MIG type labels.
    assert.deepEqual(
      [...nodeLabels(input({ gpus: [A100], migStrategy: 'mixed' }))].filter(([k]) => k.startsWith('nvidia.com/mig-')),
      [],
    );
  },
);

test("labels, MIG single: gpu.* describe the MIG devices; a node that does not fit gets GFD's INVALID labels", () => {
  const l = new Map(
    nodeLabels(input({ gpus: [on, on], migStrategy: 'single', migDevices: [mig1g(0), mig1g(0), mig1g(1)] })),
  );
  assert.equal(l.get('nvidia.com/mig.strategy'), 'single');
  assert.equal(l.get('nvidia.com/gpu.count'), '3');
  assert.equal(l.get('nvidia.com/gpu.product'), 'NVIDIA-A100-SXM4-80GB-MIG-1g.10gb');
  assert.equal(l.get('nvidia.com/gpu.memory'), '9856');
  assert.equal(l.get('nvidia.com/gpu.multiprocessors'), '14');
  assert.equal(l.get('nvidia.com/gpu.slices.gi'), '1');
  assert.equal(l.get('nvidia.com/gpu.slices.ci'), '1');
  assert.equal(l.get('nvidia.com/gpu.engines.copy'), '1');
  assert.equal(l.get('nvidia.com/gpu.family'), 'ampere');
  assert.equal(
    [...l.keys()].some((k) => k.startsWith('nvidia.com/mig-')),
    false,
  );
  const invalid = (gpus: LabelGpu[], devices: LabelMigDevice[]): Map<string, string> =>
    new Map(nodeLabels(input({ gpus, migStrategy: 'single', migDevices: devices })));
  for (const [why, l2] of [
    ['MIG on some GPUs only', invalid([on, A100], [mig1g(0)])],
    ['two profiles', invalid([on, on], [mig1g(0), mig3g(1)])],
    ['an enabled GPU without devices', invalid([on, on], [mig1g(0)])],
  ] as const) {
    assert.equal(l2.get('nvidia.com/gpu.count'), '0', why);
    assert.equal(l2.get('nvidia.com/gpu.memory'), '0', why);
    assert.equal(l2.get('nvidia.com/gpu.product'), 'NVIDIA-A100-SXM4-80GB-MIG-INVALID', why);
  }
  // No GPU in MIG mode: the same labels as with none (apart from the strategy).
  const whole = new Map(nodeLabels(input({ gpus: [A100, A100], migStrategy: 'single' })));
  const none = new Map(nodeLabels(input({ gpus: [A100, A100] })));
  whole.delete('nvidia.com/mig.strategy');
  assert.deepEqual(whole, none);
});

function snapshot(): MetricsSnapshot {
  return {
    version: '1.2.3',
    driverVersion: '550.54.15',
    node: 'gpu-7',
    gpus: [
      { index: 0, uuid: 'GPU-a', healthy: true },
      { index: 1, uuid: 'GPU-b', healthy: false },
    ],
    resources: [{ name: 'nvidia.com/gpu', devices: 2, healthy: 1 }],
    mpsDaemons: [
      { resource: 'nvidia.com/gpu', up: false },
      { resource: 'nvidia.com/gpu.mps', up: true },
    ],
    residentBytes: 50_000_000,
  };
}

test('metrics: counters, histograms and gauges as the exposition format writes them', () => {
  let now = 1000;
  const m = new NodeMetrics(() => now);
  const r = m.resource('nvidia.com/gpu');
  r.registered();
  now = 6000;
  r.registered();
  r.rpc(RPC.Allocate, OUTCOME.ok, 0.0003);
  r.rpc(RPC.Allocate, OUTCOME.ok, 2);
  r.rpc(RPC.Allocate, OUTCOME.refused, 0.00005);
  r.rpc(RPC.GetPreferredAllocation, OUTCOME.error, 0.001);
  m.xids.add('GPU-b', 79, 1);
  m.xids.add('GPU-b', 79, 2);
  m.xids.add(null, 31, 1);
  m.startToRegisteredSeconds = 0.25;
  now = 8500;
  const text = renderMetrics(m, snapshot());
  const s = parseSamples(text);
  const P = 'gpu_device_plugin_';
  assert.equal(s.get(`${P}build_info{version="1.2.3",driver="550.54.15",node="gpu-7"}`), 1);
  assert.equal(s.get(`${P}devices_advertised{resource="nvidia.com/gpu"}`), 2);
  assert.equal(s.get(`${P}devices_healthy{resource="nvidia.com/gpu"}`), 1);
  assert.equal(s.get(`${P}gpu_healthy{uuid="GPU-b",index="1"}`), 0);
  assert.equal(s.get(`${P}mps_daemon_up{resource="nvidia.com/gpu"}`), 0);
  assert.equal(s.get(`${P}mps_daemon_up{resource="nvidia.com/gpu.mps"}`), 1);
  assert.ok(
    !renderMetrics(m, { ...snapshot(), mpsDaemons: [] }).includes('mps_daemon_up'),
    'no MPS resource: no MPS family',
  );
  assert.equal(s.get(`${P}xid_errors_total{uuid="GPU-b",index="1",xid="79"}`), 3);
  assert.equal(s.get(`${P}xid_errors_total{uuid="all",index="all",xid="31"}`), 1);
  assert.equal(s.get(`${P}registrations_total{resource="nvidia.com/gpu"}`), 2);
  assert.equal(s.get(`${P}reregistrations_total{resource="nvidia.com/gpu"}`), 1);
  assert.equal(s.get(`${P}seconds_since_last_registration{resource="nvidia.com/gpu"}`), 2.5);
  assert.equal(s.get(`${P}rpcs_total{resource="nvidia.com/gpu",method="Allocate",outcome="ok"}`), 2);
  assert.equal(s.get(`${P}rpcs_total{resource="nvidia.com/gpu",method="Allocate",outcome="refused"}`), 1);
  assert.equal(s.get(`${P}rpcs_total{resource="nvidia.com/gpu",method="GetPreferredAllocation",outcome="error"}`), 1);
  assert.equal(s.get(`${P}allocate_duration_seconds_bucket{resource="nvidia.com/gpu",le="0.0001"}`), 1);
  assert.equal(s.get(`${P}allocate_duration_seconds_bucket{resource="nvidia.com/gpu",le="0.0005"}`), 2);
  assert.equal(s.get(`${P}allocate_duration_seconds_bucket{resource="nvidia.com/gpu",le="1"}`), 2);
  assert.equal(s.get(`${P}allocate_duration_seconds_bucket{resource="nvidia.com/gpu",le="+Inf"}`), 3);
  assert.equal(s.get(`${P}allocate_duration_seconds_count{resource="nvidia.com/gpu"}`), 3);
  assert.ok(Math.abs((s.get(`${P}allocate_duration_seconds_sum{resource="nvidia.com/gpu"}`) ?? 0) - 2.00035) < 1e-12);
  assert.equal(s.get(`${P}preferred_allocation_duration_seconds_bucket{resource="nvidia.com/gpu",le="0.001"}`), 1);
  assert.equal(s.get(`${P}start_to_registered_seconds`), 0.25);
  assert.equal(s.get(`${P}resident_memory_bytes`), 50_000_000);
  // Buckets are cumulative and never decrease.
  const buckets = LATENCY_BUCKETS.map(
    (le) => s.get(`${P}allocate_duration_seconds_bucket{resource="nvidia.com/gpu",le="${le}"}`) ?? -1,
  );
  for (let i = 1; i < buckets.length; i++) assert.ok((buckets[i] ?? 0) >= (buckets[i - 1] ?? 0));
  // Every family has HELP and TYPE, each once.
  const types = text.split('\n').filter((l) => l.startsWith('# TYPE '));
  assert.equal(new Set(types).size, types.length);
  assert.equal(escapeLabel('a"b\\c\nd'), 'a\\"b\\\\c\\nd');
  assert.equal(promtoolProblems(text), '');
});

test('atomic file: writes only changed content, replaces by rename, cleans up, removes', async () => {
  const dir = mkdtempSync(join(tmpdir(), 'gdp-atomic-'));
  try {
    const path = join(dir, 'labels');
    writeFileSync(path, 'a=1\n');
    const f = new AtomicFile(path);
    const before = statSync(path);
    // What the file already holds (an earlier run wrote it) is not written again.
    assert.equal(await f.write('a=1\n'), false);
    assert.equal(statSync(path).ino, before.ino);
    assert.equal(await f.write('a=2\n'), true);
    const after = statSync(path);
    assert.notEqual(after.ino, before.ino, 'replaced by rename, not rewritten in place');
    assert.equal(readFileSync(path, 'utf8'), 'a=2\n');
    assert.equal(after.mode & 0o777, 0o644);
    assert.equal(await f.write('a=2\n'), false);
    assert.equal(statSync(path).mtimeMs, after.mtimeMs);
    assert.deepEqual(readdirSync(dir), ['labels'], 'no temporary file left behind');
    // Removed behind our back: written again even though the content did not change.
    rmSync(path);
    assert.equal(await f.write('a=2\n'), true);
    await f.remove();
    assert.deepEqual(readdirSync(dir), []);
    await f.remove();
    await assert.rejects(new AtomicFile(join(dir, 'missing', 'x')).write('x'), /does not exist/);
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
});

test(
  'holders: device IDs traced to GPUs by UUID, index and ' +
    'replica; foreign resources ignored; unknown IDs kept apart',
  () => {
    const gpus = [
      { index: 0, uuid: 'GPU-a' },
      { index: 1, uuid: 'GPU-b' },
    ];
    const { perGpu, others } = deviceHolders(gpus, [
      {
        namespace: 'ml',
        pod: 'p',
        containers: [
          {
            name: 'c',
            devices: [
              { resource: 'nvidia.com/gpu', ids: ['GPU-b', '0'] },
              { resource: 'example.com/nic', ids: ['GPU-a'] },
            ],
          },
        ],
      },
      {
        namespace: 'default',
        pod: 'q',
        containers: [
          {
            name: 'd',
            devices: [
              { resource: 'nvidia.com/gpu.shared', ids: ['GPU-a::3'] },
              { resource: 'nvidia.com/mig-1g.10gb', ids: ['MIG-x'] },
            ],
          },
        ],
      },
    ]);
    assert.deepEqual(perGpu[0]?.map(holderText), ['default/q/d (replica 3)', 'ml/p/c']);
    assert.deepEqual(perGpu[1]?.map(holderText), ['ml/p/c']);
    assert.deepEqual(
      others.map((h) => `${h.deviceId} ${h.resource} ${holderText(h)}`),
      ['MIG-x nvidia.com/mig-1g.10gb default/q/d'],
    );
    // With MIG devices known (the MIG extension point), their IDs lead to their GPU.
    const mig = deviceHolders(
      gpus,
      [
        {
          namespace: 'ml',
          pod: 'r',
          containers: [{ name: 'e', devices: [{ resource: 'nvidia.com/mig-1g.10gb', ids: ['MIG-x'] }] }],
        },
      ],
      new Map([['MIG-x', 1]]),
    );
    assert.deepEqual(
      mig.perGpu[1]?.map((h) => `${h.deviceId} ${holderText(h)}`),
      ['MIG-x ml/r/e'],
    );
    assert.deepEqual(mig.others, []);
  },
);
