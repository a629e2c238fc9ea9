// MIG, the pure core (src/core/mig*.ts) and the parts of allocate/preferred/health it feeds: NVIDIA's
// profile names, the strategies on uniform, mixed and empty layouts, Allocate for MIG devices, the
// preferred choice, and which devices a health event concerns (with the monitor that applies it).
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { allocate, indexDevices } from '../../src/core/allocate.ts';
import type { AllocateSettings } from '../../src/core/allocate.ts';
import { deviceList } from '../../src/core/devices.ts';
import type { Gpu, Health } from '../../src/core/devices.ts';
import { parseHealthSettings } from '../../src/core/health-policy.ts';
import type { ProbeResult } from '../../src/core/health-events.ts';
import { buildSnapshot } from '../../src/core/snapshot.ts';
import { eventUnits } from '../../src/core/mig-events.ts';
import {
  MigStrategyError,
  pendingModeChanges,
  planMigResources,
  singleStrategyProblem,
} from '../../src/core/mig-strategies.ts';
import {
  NO_MIG,
  migCapabilityNodes,
  migMemoryGb,
  migProfileName,
  migResourceName,
  parseMigMinors,
} from '../../src/core/mig.ts';
import type { MigDevice, MigLayout } from '../../src/core/mig.ts';
import { lowestFirstChooser, preferredAllocation } from '../../src/core/preferred.ts';
import { RequestError } from '../../src/core/request-error.ts';
import { NO_SHARING, SharingError } from '../../src/core/sharing.ts';
import type { Sharing } from '../../src/core/sharing.ts';
import { NodeHealth } from '../../src/node/node-health.ts';
import { createLogger } from '../../src/system/log.ts';
import { migMinorsText } from '../support/mig.ts';

const MiB = 1024 * 1024;

// ---- profile names ------------------------------------------------------------------------------

test("profile names are NVIDIA's: A100-40GB/80GB, H100 (1g.20gb), H200 (1g.18gb), +me, sub-instances", () => {
  const a100_40 = 40960 * MiB;
  const a100_80 = 81920 * MiB;
  const h100 = 81559 * MiB;
  const h200 = 143771 * MiB;
  const name = (
    parent: number,
    giSlices: number,
    memoryMiB: number,
    ciSlices = giSlices,
    profileIndex: number | null = null,
  ): string => migProfileName({ giSlices, ciSlices, memoryMiB, parentMemoryBytes: parent, profileIndex });
  assert.deepEqual(
    [
      name(a100_40, 1, 4864),
      name(a100_40, 2, 9856),
      name(a100_40, 3, 20096),
      name(a100_40, 4, 20096),
      name(a100_40, 7, 40448),
    ],
    ['1g.5gb', '2g.10gb', '3g.20gb', '4g.20gb', '7g.40gb'],
  );
  assert.deepEqual(
    [
      name(a100_80, 1, 9728),
      name(a100_80, 2, 19968),
      name(a100_80, 3, 40192),
      name(a100_80, 4, 40192),
      name(a100_80, 7, 81152),
    ],
    ['1g.10gb', '2g.20gb', '3g.40gb', '4g.40gb', '7g.80gb'],
  );
  assert.equal(name(a100_80, 1, 9728, 1, 7), '1g.10gb+me');
  assert.equal(name(a100_80, 2, 19968, 1), '1c.2g.20gb');
  assert.equal(name(a100_80, 7, 81152, 3), '3c.7g.80gb');
  assert.deepEqual(
    [name(h100, 1, 9984), name(h100, 1, 20096, 1, 9), name(h100, 3, 40448), name(h100, 7, 81152)],
    ['1g.10gb', '1g.20gb', '3g.40gb', '7g.80gb'],
  );
  assert.deepEqual(
    [
      name(h200, 1, 16384),
      name(h200, 1, 33152, 1, 9),
      name(h200, 2, 33152),
      name(h200, 3, 71680),
      name(h200, 7, 143488),
    ],
    ['1g.18gb', '1g.35gb', '2g.35gb', '3g.71gb', '7g.141gb'],
  );
  assert.equal(migMemoryGb(a100_80, 81920), 80);
  assert.equal(migResourceName('1g.10gb+me'), 'nvidia.com/mig-1g.10gb.me');
  assert.equal(migResourceName('1g.10gb'), 'nvidia.com/mig-1g.10gb');
});

// ---- a node like test/fixtures/topologies/mig-mixed-4.json ---------------------------------------

function gpu(index: number, numaNode: number | null, name = 'NVIDIA A100-SXM4-80GB'): Gpu {
  return {
    index,
    uuid: `GPU-0000000${index}-0000-4000-8000-000000000000`,
    name,
    minor: index,
    busId: `00000000:0${index}:00.0`,
    memoryBytes: 81920 * MiB,
    numaNode,
  };
}

function mig(
  parent: number,
  index: number,
  gi: number,
  profile: string,
  giSlices = Number(profile[0]),
  ciSlices = giSlices,
): MigDevice {
  return {
    parent,
    index,
    uuid: `MIG-0000000${parent}-0000-4000-8000-00000000${String(gi).padStart(2, '0')}00`,
    gi,
    ci: 0,
    profile,
    giSlices,
    ciSlices,
    memoryBytes: 9728 * MiB,
    multiprocessors: 14 * ciSlices,
    engines: { copy: giSlices, decoder: 0, encoder: 0, jpeg: 0, ofa: 0 },
  };
}

const GPUS = [gpu(0, 0), gpu(1, 0), gpu(2, 1), gpu(3, 1)];
const MIXED: MigLayout = {
  modes: [
    { current: true, pending: true },
    { current: true, pending: true },
    { current: false, pending: false },
    { current: true, pending: true },
  ],
  devices: [
    mig(0, 0, 1, '1g.10gb'),
    mig(0, 1, 2, '1g.10gb'),
    mig(0, 2, 3, '1g.10gb+me'),
    mig(0, 3, 4, '2g.20gb'),
    mig(0, 4, 5, '1c.2g.20gb', 2, 1),
    mig(1, 0, 1, '3g.40gb'),
    mig(1, 1, 2, '1g.20gb'),
    mig(1, 2, 3, '1g.10gb'),
    mig(1, 3, 4, '1g.10gb'),
  ],
};
const UNIFORM: MigLayout = {
  modes: [
    { current: true, pending: true },
    { current: true, pending: true },
  ],
  devices: [mig(0, 0, 1, '3g.40gb'), mig(0, 1, 2, '3g.40gb'), mig(1, 0, 1, '3g.40gb'), mig(1, 1, 2, '3g.40gb')],
};
const EMPTY: MigLayout = {
  modes: [
    { current: true, pending: true },
    { current: true, pending: true },
  ],
  devices: [],
};
const UNIFORM_GPUS = [gpu(0, 0), gpu(1, 1)];

const summary = (plan: ReturnType<typeof planMigResources>) =>
  plan.resources.map((r) => [r.name, r.devices.map((d) => d.id)]);

test('none: MIG ignored, every GPU whole, on every layout', () => {
  for (const [g, layout] of [
    [GPUS, MIXED],
    [UNIFORM_GPUS, UNIFORM],
    [UNIFORM_GPUS, EMPTY],
  ] as const) {
    const plan = planMigResources(g, layout, 'none', 'uuid', NO_SHARING);
    assert.deepEqual(summary(plan), [['nvidia.com/gpu', g.map((x) => x.uuid)]]);
  }
});

test('single: a uniform node advertises every MIG device as nvidia.com/gpu (UUIDs, or <gpu>:<mig> with index)', () => {
  assert.equal(singleStrategyProblem(UNIFORM_GPUS, UNIFORM), null);
  const plan = planMigResources(UNIFORM_GPUS, UNIFORM, 'single', 'uuid', NO_SHARING);
  assert.deepEqual(summary(plan), [['nvidia.com/gpu', UNIFORM.devices.map((d) => d.uuid)]]);
  assert.deepEqual(
    plan.resources[0]?.devices.map((d) => [d.gpu, d.uuid, d.mig, d.runtimeName]),
    UNIFORM.devices.map((d) => [d.parent, UNIFORM_GPUS[d.parent]!.uuid, d.uuid, d.uuid]),
  );
  const byIndex = planMigResources(UNIFORM_GPUS, UNIFORM, 'single', 'index', NO_SHARING);
  assert.deepEqual(
    summary(byIndex),
    [['nvidia.com/gpu', UNIFORM.devices.map((d) => d.uuid)]],
    'the kubelet gets MIG UUIDs whatever the strategy',
  );
  assert.deepEqual(
    byIndex.resources[0]?.devices.map((d) => d.runtimeName),
    ['0:0', '0:1', '1:0', '1:1'],
  );
  // No MIG-enabled GPU at all: as none.
  const off: MigLayout = { modes: [null, { current: false, pending: true }], devices: [] };
  assert.deepEqual(summary(planMigResources(UNIFORM_GPUS, off, 'single', 'uuid', NO_SHARING)), [
    ['nvidia.com/gpu', UNIFORM_GPUS.map((g) => g.uuid)],
  ]);
});

test('single: non-uniform nodes stop the start naming the GPUs and what differs', () => {
  assert.throws(
    () => planMigResources(GPUS, MIXED, 'single', 'uuid', NO_SHARING),
    (e: unknown) =>
      e instanceof MigStrategyError &&
      e.message.includes('GPU 2 has MIG disabled while GPU 0, 1, 3 have it enabled') &&
      e.message.includes('GPU 3 has MIG enabled but no MIG devices') &&
      e.message.includes(
        'MIG devices differ in profile: 1g.10gb on GPU 0, 1; 1g.10gb+me on GPU 0; ' +
          '2g.20gb on GPU 0; 1c.2g.20gb on GPU 0; 3g.40gb on GPU 1; 1g.20gb on GPU 1',
      ),
  );
  assert.match(singleStrategyProblem(UNIFORM_GPUS, EMPTY) ?? '', /GPU 0, 1 have MIG enabled but no MIG devices/);
  const twoProfiles: MigLayout = { ...UNIFORM, devices: [...UNIFORM.devices.slice(0, 3), mig(1, 1, 2, '2g.20gb')] };
  assert.match(
    singleStrategyProblem(UNIFORM_GPUS, twoProfiles) ?? '',
    /differ in profile: 3g\.40gb on GPU 0, 1; 2g\.20gb on GPU 1/,
  );
});

test(
  'mixed: one resource per full profile (+ as .), MIG-disabled ' +
    'GPUs whole, sub-instances and empty GPUs noted and skipped',
  () => {
    const plan = planMigResources(GPUS, MIXED, 'mixed', 'uuid', NO_SHARING);
    const u = (k: number) => MIXED.devices[k]!.uuid;
    assert.deepEqual(summary(plan), [
      ['nvidia.com/gpu', [GPUS[2]!.uuid]],
      ['nvidia.com/mig-1g.10gb', [u(0), u(1), u(7), u(8)]],
      ['nvidia.com/mig-1g.10gb.me', [u(2)]],
      ['nvidia.com/mig-1g.20gb', [u(6)]],
      ['nvidia.com/mig-2g.20gb', [u(3)]],
      ['nvidia.com/mig-3g.40gb', [u(5)]],
    ]);
    assert.deepEqual(plan.notes, [
      '1 MIG device of profile 1c.2g.20gb not advertised: the mixed strategy advertises full compute instances only',
      `GPU 3 (${GPUS[3]!.uuid}) has MIG enabled but no MIG devices; it is skipped until it has some`,
    ]);
    const byIndex = planMigResources(GPUS, MIXED, 'mixed', 'index', NO_SHARING);
    assert.deepEqual(
      byIndex.resources.find((r) => r.name === 'nvidia.com/mig-1g.10gb')?.devices.map((d) => [d.id, d.runtimeName]),
      [
        [u(0), '0:0'],
        [u(1), '0:1'],
        [u(7), '1:2'],
        [u(8), '1:3'],
      ],
    );
    // Empty layout: nothing at all to advertise, and each GPU noted.
    const empty = planMigResources(UNIFORM_GPUS, EMPTY, 'mixed', 'uuid', NO_SHARING);
    assert.deepEqual(empty.resources, []);
    assert.equal(empty.notes.length, 2);
  },
);

test(
  'mixed: time-slicing by resource name, renamed or not; whole ' +
    'GPUs keep their own entry; bad MIG selections name the key',
  () => {
    const sharing: Sharing = {
      timeSlicing: {
        renameByDefault: false,
        failRequestsGreaterThanOne: true,
        resources: [
          { name: 'nvidia.com/mig-1g.10gb', rename: null, replicas: 2, devices: { kind: 'all' } },
          {
            name: 'nvidia.com/mig-3g.40gb',
            rename: 'nvidia.com/mig-3g.40gb.shared',
            replicas: 3,
            devices: { kind: 'all' },
          },
          { name: 'nvidia.com/gpu', rename: null, replicas: 2, devices: { kind: 'all' } },
          { name: 'nvidia.com/mig-7g.80gb', rename: null, replicas: 2, devices: { kind: 'all' } },
        ],
      },
    };
    const plan = planMigResources(GPUS, MIXED, 'mixed', 'uuid', sharing);
    const r = new Map(plan.resources.map((x) => [x.name, x]));
    assert.deepEqual(
      [...r.keys()],
      [
        'nvidia.com/gpu',
        'nvidia.com/mig-1g.10gb',
        'nvidia.com/mig-1g.10gb.me',
        'nvidia.com/mig-1g.20gb',
        'nvidia.com/mig-2g.20gb',
        'nvidia.com/mig-3g.40gb.shared',
      ],
    );
    assert.deepEqual(
      r.get('nvidia.com/gpu')?.devices.map((d) => d.id),
      [`${GPUS[2]!.uuid}::0`, `${GPUS[2]!.uuid}::1`],
    );
    const mig1g = r.get('nvidia.com/mig-1g.10gb');
    assert.equal(mig1g?.devices.length, 8);
    assert.deepEqual(
      mig1g?.devices.slice(0, 2).map((d) => [d.id, d.runtimeName, d.replica, d.mig]),
      [
        [`${MIXED.devices[0]!.uuid}::0`, MIXED.devices[0]!.uuid, 0, MIXED.devices[0]!.uuid],
        [`${MIXED.devices[0]!.uuid}::1`, MIXED.devices[0]!.uuid, 1, MIXED.devices[0]!.uuid],
      ],
    );
    assert.equal(mig1g?.shared, true);
    assert.equal(mig1g?.failRequestsGreaterThanOne, true);
    assert.equal(r.get('nvidia.com/mig-3g.40gb.shared')?.devices.length, 3);
    assert.equal(r.get('nvidia.com/mig-2g.20gb')?.shared, false);
    const bad: Sharing = {
      timeSlicing: {
        renameByDefault: false,
        failRequestsGreaterThanOne: false,
        resources: [
          { name: 'nvidia.com/mig-1g.10gb', rename: null, replicas: 2, devices: { kind: 'count', count: 1 } },
        ],
      },
    };
    assert.throws(
      () => planMigResources(GPUS, MIXED, 'mixed', 'uuid', bad),
      (e: unknown) => e instanceof SharingError && e.path === 'sharing.timeSlicing.resources[0].devices',
    );
  },
);

test("the device list: MIG devices carry their parent's NUMA node and their own health", () => {
  const plan = planMigResources(GPUS, MIXED, 'mixed', 'uuid', NO_SHARING);
  const r = plan.resources.find((x) => x.name === 'nvidia.com/mig-1g.10gb')!;
  const health = new Map<string, Health>([
    ...GPUS.map((g): [string, Health] => [g.uuid, 'Healthy']),
    ...MIXED.devices.map((d): [string, Health] => [d.uuid, 'Healthy']),
  ]);
  health.set(MIXED.devices[7]!.uuid, 'Unhealthy');
  assert.deepEqual(
    deviceList(r.devices, GPUS, health).map((d) => [d.health, d.topology?.nodes[0]?.ID]),
    [
      ['Healthy', 0],
      ['Healthy', 0],
      ['Unhealthy', 0],
      ['Healthy', 0],
    ],
  );
});

test('pending MIG mode changes are described, not acted on', () => {
  const layout: MigLayout = {
    modes: [
      { current: true, pending: false },
      null,
      { current: false, pending: true },
      { current: true, pending: true },
    ],
    devices: [],
  };
  assert.deepEqual(pendingModeChanges(GPUS, layout), [
    `GPU 0 (${GPUS[0]!.uuid}): MIG mode is enabled now and ` +
      `disabled after the next GPU reset; nothing changes until then`,
    `GPU 2 (${GPUS[2]!.uuid}): MIG mode is disabled now and ` +
      `enabled after the next GPU reset; nothing changes until then`,
  ]);
});

// ---- Allocate ------------------------------------------------------------------------------------

test('mig-minors: GI and CI capability nodes per MIG device; a missing entry is named', () => {
  const minors = parseMigMinors(migMinorsText(4));
  assert.equal(minors.get('gpu0/gi1/access'), 12);
  assert.equal(minors.get('gpu0/gi1/ci0/access'), 13);
  const caps = migCapabilityNodes(GPUS, MIXED.devices, minors);
  assert.deepEqual(caps.get(MIXED.devices[0]!.uuid), [
    '/dev/nvidia-caps/nvidia-cap12',
    '/dev/nvidia-caps/nvidia-cap13',
  ]);
  assert.deepEqual(caps.get(MIXED.devices[5]!.uuid), [
    '/dev/nvidia-caps/nvidia-cap147',
    '/dev/nvidia-caps/nvidia-cap148',
  ]);
  assert.throws(
    () => migCapabilityNodes(GPUS, MIXED.devices, parseMigMinors('config 1\n')),
    /mig-minors has no gpu0\/gi1\/access for MIG device MIG-/,
  );
});

test('Allocate: one and two MIG devices, on one and two parents, with index IDs and device specs', () => {
  const plan = planMigResources(GPUS, MIXED, 'mixed', 'index', NO_SHARING);
  const r = plan.resources.find((x) => x.name === 'nvidia.com/mig-1g.10gb')!;
  const index = indexDevices(r.devices, GPUS);
  // The kubelet names MIG devices by UUID; the runtime gets <gpu>:<mig> (the index strategy).
  const ids = (names: string[]): string[] => names.map((n) => r.devices.find((d) => d.runtimeName === n)?.id ?? n);
  const settings: AllocateSettings = {
    passDeviceSpecs: true,
    devRoot: '/host',
    presentControlDevices: ['/dev/nvidiactl'],
    migCapabilities: migCapabilityNodes(GPUS, MIXED.devices, parseMigMinors(migMinorsText(4))),
  };
  const [one, sameParent, twoParents] = allocate([{ devices_ids: ids(['0:1']) }], index, settings).concat(
    allocate([{ devices_ids: ids(['1:2', '1:3']) }], index, settings),
    allocate([{ devices_ids: ids(['1:3', '0:0']) }], index, settings),
  );
  const specs = (a: typeof one) => a?.devices.map((d) => `${d.container_path}=${d.host_path}`);
  assert.deepEqual(one?.envs, { NVIDIA_VISIBLE_DEVICES: '0:1' });
  assert.deepEqual(specs(one), [
    '/dev/nvidiactl=/host/dev/nvidiactl',
    '/dev/nvidia0=/host/dev/nvidia0',
    '/dev/nvidia-caps/nvidia-cap21=/host/dev/nvidia-caps/nvidia-cap21',
    '/dev/nvidia-caps/nvidia-cap22=/host/dev/nvidia-caps/nvidia-cap22',
  ]);
  assert.deepEqual(sameParent?.envs, { NVIDIA_VISIBLE_DEVICES: '1:2,1:3' });
  // GPU 1 minor 1: GI 3 → 3+135+27 = 165, GI 4 → 174; the parent node once.
  assert.deepEqual(
    specs(sameParent)?.map((s) => s.split('=')[0]),
    [
      '/dev/nvidiactl',
      '/dev/nvidia1',
      '/dev/nvidia-caps/nvidia-cap165',
      '/dev/nvidia-caps/nvidia-cap166',
      '/dev/nvidia-caps/nvidia-cap174',
      '/dev/nvidia-caps/nvidia-cap175',
    ],
  );
  assert.deepEqual(twoParents?.envs, { NVIDIA_VISIBLE_DEVICES: '1:3,0:0' });
  assert.deepEqual(
    specs(twoParents)?.map((s) => s.split('=')[0]),
    [
      '/dev/nvidiactl',
      '/dev/nvidia1',
      '/dev/nvidia-caps/nvidia-cap174',
      '/dev/nvidia-caps/nvidia-cap175',
      '/dev/nvidia0',
      '/dev/nvidia-caps/nvidia-cap12',
      '/dev/nvidia-caps/nvidia-cap13',
    ],
  );
  // CDI keeps NVIDIA's class; unknown and foreign IDs are refused by name.
  const cdi = allocate([{ devices_ids: ids(['0:0']) }], index, {
    ...settings,
    deviceListStrategies: ['cdi-cri', 'cdi-annotations'],
    newUuid: () => 'u',
  });
  assert.deepEqual(cdi[0]?.cdi_devices, [{ name: 'k8s.device-plugin.nvidia.com/gpu=0:0' }]);
  assert.deepEqual(cdi[0]?.annotations, {
    'cdi.k8s.io/nvidia-device-plugin_u': 'k8s.device-plugin.nvidia.com/gpu=0:0',
  });
  assert.deepEqual(cdi[0]?.devices, []);
  assert.throws(
    () => allocate([{ devices_ids: ['0:2'] }], index, settings),
    (e: unknown) => e instanceof RequestError && /unknown device ID "0:2"/.test(e.message),
  );
  assert.throws(
    () => allocate([{ devices_ids: [GPUS[2]!.uuid] }], index, settings),
    (e: unknown) => e instanceof RequestError && e.message.includes(GPUS[2]!.uuid),
  );
  // Replicas of MIG devices: each MIG device once.
  const shared = planMigResources(GPUS, MIXED, 'mixed', 'uuid', {
    timeSlicing: {
      renameByDefault: false,
      failRequestsGreaterThanOne: false,
      resources: [{ name: 'nvidia.com/mig-1g.10gb', rename: null, replicas: 2, devices: { kind: 'all' } }],
    },
  });
  const sr = shared.resources.find((x) => x.name === 'nvidia.com/mig-1g.10gb')!;
  const u0 = MIXED.devices[0]!.uuid;
  const u1 = MIXED.devices[1]!.uuid;
  assert.deepEqual(
    allocate([{ devices_ids: [`${u0}::1`, `${u0}::0`, `${u1}::0`] }], indexDevices(sr.devices, GPUS), {
      passDeviceSpecs: false,
      devRoot: '/',
      presentControlDevices: [],
    })[0]?.envs,
    { NVIDIA_VISIBLE_DEVICES: `${u0},${u1}` },
  );
});

// ---- GetPreferredAllocation -------------------------------------------------------------------------

test(
  'preferred MIG devices: packed fills one GPU first, ' +
    'distributed spreads; one NUMA node when it fits; contract kept',
  () => {
    // 1g.10gb on GPUs 0 and 1 (NUMA 0: two each) and GPU 2 (NUMA 1: three).
    const gpus = [gpu(0, 0), gpu(1, 0), gpu(2, 1)];
    const layout: MigLayout = {
      modes: gpus.map(() => ({ current: true, pending: true })),
      devices: [
        mig(0, 0, 1, '1g.10gb'),
        mig(0, 1, 2, '1g.10gb'),
        mig(1, 0, 1, '1g.10gb'),
        mig(1, 1, 2, '1g.10gb'),
        mig(2, 0, 1, '1g.10gb'),
        mig(2, 1, 2, '1g.10gb'),
        mig(2, 2, 3, '1g.10gb'),
      ],
    };
    const r = planMigResources(gpus, layout, 'mixed', 'index', NO_SHARING).resources[0]!;
    const index = indexDevices(r.devices, gpus);
    // Asked and answered in <gpu>:<mig> runtime names for readability; the kubelet's IDs are MIG UUIDs.
    const idOf = new Map(r.devices.map((d) => [d.runtimeName, d.id]));
    const nameOf = new Map(r.devices.map((d) => [d.id, d.runtimeName]));
    const all = r.devices.map((d) => d.runtimeName);
    const ask = (available: string[], must: string[], size: number, policy: 'packed' | 'distributed') =>
      preferredAllocation(
        [
          {
            available_deviceIDs: available.map((n) => idOf.get(n) ?? n),
            must_include_deviceIDs: must.map((n) => idOf.get(n) ?? n),
            allocation_size: size,
          },
        ],
        index,
        lowestFirstChooser,
        policy,
      )[0]?.map((id) => nameOf.get(id) ?? id);
    // Two: packed fills the NUMA node with fewest free (node 1, GPU 2) and keeps node 0 whole;
    // distributed takes the node with most free and spreads over its GPUs.
    assert.deepEqual(ask(all, [], 2, 'packed'), ['2:0', '2:1']);
    assert.deepEqual(ask(all, [], 2, 'distributed'), ['0:0', '1:0']);
    assert.deepEqual(
      ask(
        all.filter((id) => !id.startsWith('2:')),
        [],
        2,
        'packed',
      ),
      ['0:0', '0:1'],
    );
    // A GPU with devices in use is filled first by packed, avoided by distributed.
    const some = all.filter((id) => id !== '1:0');
    assert.deepEqual(
      ask(
        some.filter((id) => !id.startsWith('2:')),
        [],
        1,
        'packed',
      ),
      ['1:1'],
    );
    assert.deepEqual(
      ask(
        some.filter((id) => !id.startsWith('2:')),
        [],
        1,
        'distributed',
      ),
      ['0:0'],
    );
    // Must-include on NUMA 1 keeps the answer there; three do not fit node 0 without it.
    assert.deepEqual(ask(all, ['2:2'], 2, 'packed'), ['2:0', '2:2']);
    assert.deepEqual(ask(all, ['0:0', '2:0'], 3, 'packed'), ['0:0', '0:1', '2:0']);
    assert.equal(ask(all, [], 5, 'packed')?.length, 5);
    // Contract: exact size, must-include, only available IDs.
    for (const policy of ['packed', 'distributed'] as const) {
      for (let size = 1; size <= all.length; size++) {
        const avail = all.filter((_, i) => i % 2 === 0 || size > 3);
        if (size > avail.length) continue;
        const got = ask(avail, [avail[avail.length - 1]!], size, policy)!;
        assert.equal(got.length, size);
        assert.ok(got.includes(avail[avail.length - 1]!));
        assert.ok(got.every((id) => avail.includes(id)));
      }
    }
    assert.throws(() => ask(all, ['9:9'], 1, 'packed'), RequestError);
  },
);

// ---- health --------------------------------------------------------------------------------------

test(
  'health units: an XID naming a MIG device marks that device; whole GPU ' +
    '(0xFFFFFFFF) marks all of its MIG devices; an unknown GI/CI marks nothing',
  () => {
    const G = GPUS.length;
    const units = [...GPUS.map((g) => g.uuid), ...MIXED.devices.map((d) => d.uuid)];
    const at = (...k: number[]) => ({ units: k.map((i) => units[i]!) });
    const u0 = GPUS[0]!.uuid;
    const u1 = GPUS[1]!.uuid;
    assert.deepEqual(eventUnits(GPUS, MIXED, u0, 2, 0), at(G + 1));
    assert.deepEqual(eventUnits(GPUS, MIXED, u1, 4, 0), at(G + 8));
    assert.deepEqual(eventUnits(GPUS, MIXED, u0, 0xffffffff, 0xffffffff), at(0, G, G + 1, G + 2, G + 3, G + 4));
    assert.deepEqual(eventUnits(GPUS, MIXED, u1, undefined, undefined), at(1, G + 5, G + 6, G + 7, G + 8));
    assert.deepEqual(
      eventUnits(GPUS, MIXED, u0, 9, 0),
      { unknown: 'GPU instance 9, compute instance 0 is no MIG device known on this GPU' },
      "an unknown GI marks nothing (NVIDIA's plugin ignores it)",
    );
    assert.deepEqual(
      eventUnits(GPUS, MIXED, GPUS[2]!.uuid, 1, 0),
      { unknown: 'GPU instance 1, compute instance 0 is no MIG device known on this GPU' },
      'a GPU without MIG devices',
    );
    assert.deepEqual(eventUnits(GPUS, MIXED, GPUS[2]!.uuid, 0xffffffff, 0), at(2), 'a GPU without MIG devices, whole');
    // --mig-strategy=none reads no MIG layout: every GPU is served whole, and an XID naming one of its
    // MIG instances is the GPU's own.
    assert.deepEqual(eventUnits(GPUS, NO_MIG, u0, 3, 0), { units: [u0] }, 'served whole: the GPU takes it');
    assert.deepEqual(eventUnits(GPUS, NO_MIG, u1, 3, 0xffffffff), { units: [u1] });
  },
);

function monitor() {
  const lines: string[] = [];
  const log = createLogger({ level: 'info', journal: false, write: (l) => lines.push(l) });
  let now = 0;
  const h = new NodeHealth({
    settings: parseHealthSettings(undefined, undefined),
    recovery: { enabled: true, quietMs: 1000 },
    log,
    now: () => now,
    wallNow: () => 1_000_000 + now,
  });
  const scan = {
    driverVersion: '550.54.15',
    gpus: GPUS,
    nvlinks: GPUS.map((g) => ({ busId: g.busId, links: [] })),
    pcie: GPUS.map(() => GPUS.map(() => -1)),
    mig: MIXED,
  };
  const snapshot = buildSnapshot(scan, null, false);
  h.follow(snapshot);
  const units = [...GPUS.map((g) => g.uuid), ...MIXED.devices.map((d) => d.uuid)];
  const probe = (r: ProbeResult[]) => new Map(GPUS.map((g, i) => [g.uuid, r[i] ?? 'error']));
  /** Positions (GPUs, then MIG devices) of the unhealthy units. */
  const unhealthy = (): number[] => {
    const c = h.current();
    return units.map((u, i) => (c.get(u)?.state.health === 'Unhealthy' ? i : -1)).filter((i) => i >= 0);
  };
  return {
    h,
    lines,
    probe,
    unhealthy,
    at: (t: number) => {
      now = t;
    },
  };
}

test(
  'node health: two unhealthy MIG devices on one parent are both ' +
    'reported; whole-GPU and NULL events; lost parents; recovery',
  () => {
    const G = GPUS.length;
    const t = monitor();
    const first = t.h.onEvents([{ event: { kind: 'xid', gpu: GPUS[0]!.uuid, xid: 94, gi: 2, ci: 0 }, count: 1 }]);
    assert.deepEqual(
      [...first.updates.keys()],
      [MIXED.devices[1]!.uuid],
      'the update names the MIG device by its UUID',
    );
    assert.match(first.updates.get(MIXED.devices[1]!.uuid)?.reason ?? '', /critical XID 94/);
    assert.equal(first.updates.get(MIXED.devices[1]!.uuid)?.since, 1_000_000);
    t.h.onEvents([{ event: { kind: 'xid', gpu: GPUS[0]!.uuid, xid: 94, gi: 1, ci: 0 }, count: 1 }]);
    assert.deepEqual(t.unhealthy(), [G, G + 1], 'both MIG devices, not the parent or its other MIG devices');
    assert.equal(t.lines.filter((l) => l.includes('MIG device unhealthy')).length, 2);
    assert.match(
      t.lines[0] ?? '',
      new RegExp(
        `gpu=0 uuid=${GPUS[0]!.uuid} mig=MIG-00000000-0000-4000-8000-000000000200 profile=1g\\.10gb gi=2 ci=0 xid=94`,
      ),
    );
    // Application XIDs on a MIG device are ignored as for whole GPUs.
    t.h.onEvents([{ event: { kind: 'xid', gpu: GPUS[1]!.uuid, xid: 31, gi: 3, ci: 0 }, count: 1 }]);
    assert.deepEqual(t.unhealthy(), [G, G + 1]);
    // A GI/CI naming no MIG device known marks nothing and is handed back.
    const unknown = t.h.onEvents([{ event: { kind: 'xid', gpu: GPUS[1]!.uuid, xid: 79, gi: 9, ci: 0 }, count: 1 }]);
    assert.equal(unknown.updates.size, 0);
    assert.deepEqual(
      unknown.unplaced.map((u) => u.why),
      ['GPU instance 9, compute instance 0 is no MIG device known on this GPU'],
    );
    assert.deepEqual(t.unhealthy(), [G, G + 1]);
    // The whole GPU: it and every MIG device on it.
    t.h.onEvents([{ event: { kind: 'xid', gpu: GPUS[1]!.uuid, xid: 79, gi: 0xffffffff, ci: 0xffffffff }, count: 1 }]);
    assert.deepEqual(t.unhealthy(), [1, G, G + 1, G + 5, G + 6, G + 7, G + 8]);
    // Recovery as for whole GPUs: ok probes and a quiet period (XID 79 never recovers).
    t.at(500);
    t.h.onProbe(t.probe(['ok', 'ok', 'ok', 'ok']));
    t.at(1500);
    t.h.onProbe(t.probe(['ok', 'ok', 'ok', 'ok']));
    assert.deepEqual(t.unhealthy(), [1, G + 5, G + 6, G + 7, G + 8]);
    assert.equal(t.lines.filter((l) => l.includes('MIG device healthy again')).length, 2);
    // A lost answer is only suspected until a scan still lists the GPU; then it takes its MIG devices with it.
    const lost = t.h.onProbe(t.probe(['lost', 'ok', 'ok', 'ok']));
    assert.deepEqual(lost.suspectLost, [GPUS[0]!.uuid]);
    assert.deepEqual(t.unhealthy(), [1, G + 5, G + 6, G + 7, G + 8]);
    t.h.confirmLost(lost.suspectLost);
    assert.deepEqual(t.unhealthy(), [0, 1, G, G + 1, G + 2, G + 3, G + 4, G + 5, G + 6, G + 7, G + 8]);
    // A NULL-device event marks everything.
    t.h.onEvents([{ event: { kind: 'xid', gpu: null, xid: 48 }, count: 1 }]);
    assert.equal(t.unhealthy().length, G + MIXED.devices.length);
  },
);
