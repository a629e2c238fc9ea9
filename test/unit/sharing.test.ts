// Time-slicing (replica IDs, the resource plan, Allocate and the replica choice) and the exact
// container-facing answer of each device-list strategy.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { allocate, indexDevices } from '../../src/core/allocate.ts';
import type { AllocateSettings, DeviceIndex } from '../../src/core/allocate.ts';
import { deviceList } from '../../src/core/devices.ts';
import type { Gpu } from '../../src/core/devices.ts';
import { chooseReplicas, lowestFirstChooser, preferredAllocation } from '../../src/core/preferred.ts';
import { RequestError } from '../../src/core/request-error.ts';
import {
  NO_SHARING,
  SharingError,
  parseReplicaId,
  planResources,
  qualifyResourceName,
  replicaId,
} from '../../src/core/sharing.ts';
import type { SharedAllocationPolicy, Sharing, TimeSlicedResource } from '../../src/core/sharing.ts';

function gpus(n: number): Gpu[] {
  return Array.from({ length: n }, (_, i) => ({
    index: i,
    uuid: `GPU-${String(i).padStart(8, '0')}-1111-2222-3333-444444444444`,
    name: 'Test GPU',
    minor: i,
    busId: `00000000:0${i}:00.0`,
    memoryBytes: 1 << 30,
    numaNode: i < n / 2 ? 0 : 1,
  }));
}

function timeSliced(
  replicas: number,
  more: Partial<TimeSlicedResource> = {},
  flags: { renameByDefault?: boolean; failRequestsGreaterThanOne?: boolean } = {},
): Sharing {
  return {
    timeSlicing: {
      renameByDefault: flags.renameByDefault ?? false,
      failRequestsGreaterThanOne: flags.failRequestsGreaterThanOne ?? false,
      resources: [{ name: 'nvidia.com/gpu', rename: null, replicas, devices: { kind: 'all' }, ...more }],
    },
  };
}

function sharedIndex(g: readonly Gpu[], replicas: number): DeviceIndex {
  const plan = planResources(g, 'uuid', timeSliced(replicas));
  return indexDevices(plan[0]!.devices, g);
}

const base: AllocateSettings = { passDeviceSpecs: false, devRoot: '/', presentControlDevices: [] };

// --- replica IDs -------------------------------------------------------------------------------

test('replica IDs are <id>::<n> and parse back; other IDs are not replica IDs', () => {
  const u = gpus(1)[0]!.uuid;
  assert.equal(replicaId(u, 0), `${u}::0`);
  assert.equal(replicaId('3', 12), '3::12');
  assert.deepEqual(parseReplicaId(`${u}::7`), { base: u, replica: 7 });
  assert.deepEqual(parseReplicaId('3::0'), { base: '3', replica: 0 });
  for (const id of [u, '3', '::1', `${u}::`, `${u}::01`, `${u}::x`, `${u}::-1`, `${u}:1`]) {
    assert.equal(parseReplicaId(id), null, id);
  }
});

test('resource names: gpu and nvidia.com/gpu are the same; other domains and bad names are refused', () => {
  assert.deepEqual(qualifyResourceName('gpu'), { name: 'nvidia.com/gpu' });
  assert.deepEqual(qualifyResourceName('nvidia.com/gpu.shared'), { name: 'nvidia.com/gpu.shared' });
  assert.ok('problem' in qualifyResourceName('example.com/gpu'));
  assert.ok('problem' in qualifyResourceName('GPU'));
  assert.ok('problem' in qualifyResourceName(`nvidia.com/${'g'.repeat(60)}`));
});

// --- the resource plan ---------------------------------------------------------------------------

test('without time-slicing: one resource, nvidia.com/gpu, whole GPUs', () => {
  const g = gpus(2);
  const plan = planResources(g, 'uuid', NO_SHARING);
  assert.deepEqual(
    plan.map((r) => [r.name, r.shared, r.devices.map((d) => d.id)]),
    [['nvidia.com/gpu', false, [g[0]!.uuid, g[1]!.uuid]]],
  );
});

test('replicas: every GPU advertised N times as <UUID>::0..N-1 under nvidia.com/gpu', () => {
  const g = gpus(2);
  const plan = planResources(g, 'uuid', timeSliced(3));
  assert.equal(plan.length, 1);
  assert.equal(plan[0]!.name, 'nvidia.com/gpu');
  assert.equal(plan[0]!.shared, true);
  assert.deepEqual(
    plan[0]!.devices.map((d) => d.id),
    [0, 1].flatMap((i) => [0, 1, 2].map((n) => `${g[i]!.uuid}::${n}`)),
  );
  assert.ok(plan[0]!.devices.every((d) => d.runtimeName === g[d.gpu]!.uuid));
  // With the index strategy the replica IDs still carry the UUID (as NVIDIA's); the runtime gets the index.
  assert.deepEqual(
    planResources(g, 'index', timeSliced(2))[0]!.devices.map((d) => [d.id, d.runtimeName]),
    [0, 1].flatMap((i) => [0, 1].map((n) => [`${g[i]!.uuid}::${n}`, String(i)])),
  );
});

test('renameByDefault advertises nvidia.com/gpu.shared; rename wins over it', () => {
  const g = gpus(2);
  assert.deepEqual(
    planResources(g, 'uuid', timeSliced(2, {}, { renameByDefault: true })).map((r) => r.name),
    ['nvidia.com/gpu.shared'],
  );
  assert.deepEqual(
    planResources(g, 'uuid', timeSliced(2, { rename: 'nvidia.com/gpu.ts' }, { renameByDefault: true })).map(
      (r) => r.name,
    ),
    ['nvidia.com/gpu.ts'],
  );
});

test('devices: only the selected GPUs are shared; the others stay whole under nvidia.com/gpu', () => {
  const g = gpus(4);
  const plan = planResources(
    g,
    'uuid',
    timeSliced(2, { devices: { kind: 'list', refs: [{ index: 1 }, { uuid: g[3]!.uuid }] } }, { renameByDefault: true }),
  );
  assert.deepEqual(
    plan.map((r) => r.name),
    ['nvidia.com/gpu', 'nvidia.com/gpu.shared'],
  );
  assert.deepEqual(
    plan[0]!.devices.map((d) => d.id),
    [g[0]!.uuid, g[2]!.uuid],
  );
  assert.equal(plan[0]!.shared, false);
  assert.deepEqual(
    plan[1]!.devices.map((d) => d.id),
    [`${g[1]!.uuid}::0`, `${g[1]!.uuid}::1`, `${g[3]!.uuid}::0`, `${g[3]!.uuid}::1`],
  );
  const counted = planResources(
    g,
    'uuid',
    timeSliced(2, { devices: { kind: 'count', count: 2 } }, { renameByDefault: true }),
  );
  assert.deepEqual(
    counted[1]!.devices.map((d) => d.gpu),
    [0, 0, 1, 1],
  );
});

test('selections that do not fit the node are refused with the key path', () => {
  const g = gpus(2);
  const cases: [Sharing, RegExp][] = [
    [
      timeSliced(2, { devices: { kind: 'list', refs: [{ index: 0 }, { index: 5 }] } }),
      /^sharing\.timeSlicing\.resources\[0\]\.devices\[1\]: GPU 5 is not on this node \(its GPUs: indices 0, 1\)/,
    ],
    [
      timeSliced(2, { devices: { kind: 'list', refs: [{ uuid: 'GPU-ffffffff-1111-2222-3333-444444444444' }] } }),
      /devices\[0\]: GPU GPU-ffffffff-1111-2222-3333-444444444444 is not on this node/,
    ],
    [
      timeSliced(2, { devices: { kind: 'list', refs: [{ index: 1 }, { index: 1 }] } }),
      /devices\[1\]: GPU 1 is listed twice/,
    ],
    [timeSliced(2, { devices: { kind: 'count', count: 3 } }), /devices: 3 GPUs asked for, but this node has 2/],
    [
      {
        timeSlicing: {
          renameByDefault: false,
          failRequestsGreaterThanOne: false,
          resources: [
            { name: 'nvidia.com/gpu', rename: null, replicas: 2, devices: { kind: 'all' } },
            { name: 'nvidia.com/gpu', rename: null, replicas: 4, devices: { kind: 'list', refs: [{ index: 0 }] } },
          ],
        },
      },
      /^sharing\.timeSlicing\.resources\[1\]\.devices: GPU 0 is already shared by sharing\.timeSlicing\.resources\[0\]/,
    ],
  ];
  for (const [sharing, re] of cases) {
    assert.throws(
      () => planResources(g, 'uuid', sharing),
      (e: unknown) => e instanceof SharingError && re.test(e.message),
      String(re),
    );
  }
});

test('health applies to every replica of a GPU', () => {
  const g = gpus(2);
  const devs = planResources(g, 'uuid', timeSliced(3))[0]!.devices;
  const list = deviceList(
    devs,
    g,
    new Map([
      [g[0]!.uuid, 'Healthy'],
      [g[1]!.uuid, 'Unhealthy'],
    ]),
  );
  assert.deepEqual(
    list.map((d) => d.health),
    ['Healthy', 'Healthy', 'Healthy', 'Unhealthy', 'Unhealthy', 'Unhealthy'],
  );
  assert.deepEqual(list[3]!.topology, { nodes: [{ ID: 1 }] });
});

// --- Allocate: the container contract of each strategy -----------------------------------------------

test('envvar: NVIDIA_VISIBLE_DEVICES only', () => {
  const g = gpus(4);
  const idx = indexDevices(planResources(g, 'uuid', NO_SHARING)[0]!.devices, g);
  const [r] = allocate([{ devices_ids: [g[2]!.uuid, g[0]!.uuid] }], idx, { ...base, deviceListStrategies: ['envvar'] });
  assert.deepEqual(r, {
    envs: { NVIDIA_VISIBLE_DEVICES: `${g[2]!.uuid},${g[0]!.uuid}` },
    mounts: [],
    devices: [],
    annotations: {},
    cdi_devices: [],
  });
});

test('volume-mounts: the variable names the folder, one read-only /dev/null mount per device', () => {
  const g = gpus(4);
  const idx = indexDevices(planResources(g, 'index', NO_SHARING)[0]!.devices, g);
  const [r] = allocate([{ devices_ids: [g[3]!.uuid, g[1]!.uuid] }], idx, {
    ...base,
    deviceListStrategies: ['volume-mounts'],
  });
  assert.deepEqual(r, {
    envs: { NVIDIA_VISIBLE_DEVICES: '/var/run/nvidia-container-devices' },
    mounts: [
      { container_path: '/var/run/nvidia-container-devices/3', host_path: '/dev/null', read_only: true },
      { container_path: '/var/run/nvidia-container-devices/1', host_path: '/dev/null', read_only: true },
    ],
    devices: [],
    annotations: {},
    cdi_devices: [],
  });
  // With envvar too, the variable still points at the mounts (as in NVIDIA's plugin).
  const [both] = allocate([{ devices_ids: [g[3]!.uuid] }], idx, {
    ...base,
    deviceListStrategies: ['envvar', 'volume-mounts'],
  });
  assert.equal(both!.envs.NVIDIA_VISIBLE_DEVICES, '/var/run/nvidia-container-devices');
  assert.equal(both!.mounts.length, 1);
});

test('cdi-annotations: one annotation <prefix>nvidia-device-plugin_<uuid> with the CDI names; nothing else', () => {
  const g = gpus(4);
  const idx = indexDevices(planResources(g, 'uuid', NO_SHARING)[0]!.devices, g);
  const settings: AllocateSettings = {
    ...base,
    passDeviceSpecs: true,
    presentControlDevices: ['/dev/nvidiactl'],
    deviceListStrategies: ['cdi-annotations'],
    newUuid: () => '0b6e7d2c-1111-4222-8333-444455556666',
  };
  const [r] = allocate([{ devices_ids: [g[1]!.uuid, g[0]!.uuid] }], idx, settings);
  assert.deepEqual(r, {
    envs: {},
    mounts: [],
    devices: [],
    annotations: {
      'cdi.k8s.io/nvidia-device-plugin_0b6e7d2c-1111-4222-8333-444455556666': [
        `k8s.device-plugin.nvidia.com/gpu=${g[1]!.uuid}`,
        `k8s.device-plugin.nvidia.com/gpu=${g[0]!.uuid}`,
      ].join(','),
    },
    cdi_devices: [],
  });
  const [p] = allocate([{ devices_ids: [g[1]!.uuid] }], idx, { ...settings, cdiAnnotationPrefix: 'example.org/' });
  assert.deepEqual(Object.keys(p!.annotations), [
    'example.org/nvidia-device-plugin_0b6e7d2c-1111-4222-8333-444455556666',
  ]);
  // A fresh random UUID per container by default.
  const two = allocate([{ devices_ids: [g[0]!.uuid] }, { devices_ids: [g[1]!.uuid] }], idx, {
    ...base,
    deviceListStrategies: ['cdi-annotations'],
  });
  const keys = two.map((x) => Object.keys(x.annotations)[0] ?? '');
  assert.match(
    keys[0]!,
    /^cdi\.k8s\.io\/nvidia-device-plugin_[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$/,
  );
  assert.notEqual(keys[0], keys[1]);
});

test('cdi-cri: the CDI names in cdi_devices; several strategies at once add up', () => {
  const g = gpus(4);
  const idx = indexDevices(planResources(g, 'uuid', NO_SHARING)[0]!.devices, g);
  const [r] = allocate([{ devices_ids: [g[2]!.uuid] }], idx, { ...base, deviceListStrategies: ['cdi-cri'] });
  assert.deepEqual(r, {
    envs: {},
    mounts: [],
    devices: [],
    annotations: {},
    cdi_devices: [{ name: `k8s.device-plugin.nvidia.com/gpu=${g[2]!.uuid}` }],
  });
  const [all] = allocate([{ devices_ids: [g[2]!.uuid] }], idx, {
    ...base,
    passDeviceSpecs: true,
    presentControlDevices: ['/dev/nvidiactl'],
    deviceListStrategies: ['envvar', 'cdi-annotations', 'cdi-cri'],
    newUuid: () => 'u',
  });
  assert.deepEqual(all, {
    envs: { NVIDIA_VISIBLE_DEVICES: g[2]!.uuid },
    mounts: [],
    devices: [
      { container_path: '/dev/nvidiactl', host_path: '/dev/nvidiactl', permissions: 'rw' },
      { container_path: '/dev/nvidia2', host_path: '/dev/nvidia2', permissions: 'rw' },
    ],
    annotations: { 'cdi.k8s.io/nvidia-device-plugin_u': `k8s.device-plugin.nvidia.com/gpu=${g[2]!.uuid}` },
    cdi_devices: [{ name: `k8s.device-plugin.nvidia.com/gpu=${g[2]!.uuid}` }],
  });
});

// --- Allocate with replicas -------------------------------------------------------------------------

test('Allocate with replicas strips the suffix and lists each GPU once, in request order', () => {
  const g = gpus(3);
  const idx = sharedIndex(g, 4);
  const u = g.map((x) => x.uuid);
  const res = allocate(
    [{ devices_ids: [`${u[2]}::1`, `${u[0]}::3`, `${u[2]}::0`] }, { devices_ids: [`${u[1]}::2`] }],
    idx,
    { ...base, deviceListStrategies: ['envvar', 'cdi-cri'] },
  );
  assert.equal(res[0]!.envs.NVIDIA_VISIBLE_DEVICES, `${u[2]},${u[0]}`);
  assert.deepEqual(
    res[0]!.cdi_devices.map((d) => d.name),
    [`k8s.device-plugin.nvidia.com/gpu=${u[2]}`, `k8s.device-plugin.nvidia.com/gpu=${u[0]}`],
  );
  assert.equal(res[1]!.envs.NVIDIA_VISIBLE_DEVICES, u[1]);
  const mounts = allocate([{ devices_ids: [`${u[1]}::0`, `${u[1]}::1`] }], idx, {
    ...base,
    deviceListStrategies: ['volume-mounts'],
  });
  assert.deepEqual(
    mounts[0]!.mounts.map((m) => m.container_path),
    [`/var/run/nvidia-container-devices/${u[1]}`],
  );
  // Replicas are still checked one by one.
  assert.throws(() => allocate([{ devices_ids: [`${u[0]}::9`] }], idx, base), /unknown device ID ".*::9"/);
  assert.throws(
    () => allocate([{ devices_ids: [`${u[0]}::1`] }, { devices_ids: [`${u[0]}::1`] }], idx, base),
    /requested by container requests 0 and 1/,
  );
});

test(
  'failRequestsGreaterThanOne: more than one replica in a ' + 'container is refused with a clear message; one is fine',
  () => {
    const g = gpus(2);
    const idx = sharedIndex(g, 4);
    const u = g.map((x) => x.uuid);
    const settings: AllocateSettings = {
      ...base,
      failRequestsGreaterThanOne: true,
      resourceName: 'nvidia.com/gpu.shared',
    };
    assert.throws(
      () => allocate([{ devices_ids: [`${u[0]}::0`] }, { devices_ids: [`${u[0]}::1`, `${u[1]}::1`] }], idx, settings),
      (e: unknown) =>
        e instanceof RequestError &&
        e.message ===
          'container request 1 asks for 2 shared GPU replicas of nvidia.com/gpu.shared; ' +
            'failRequestsGreaterThanOne allows 1 per container (time-slicing ' +
            'gives no more GPU time to a container that holds several; request 1)',
    );
    assert.equal(allocate([{ devices_ids: [`${u[0]}::0`] }, { devices_ids: [`${u[0]}::1`] }], idx, settings).length, 2);
    // Whole GPUs are not limited by it.
    const whole = indexDevices(planResources(g, 'uuid', NO_SHARING)[0]!.devices, g);
    assert.equal(allocate([{ devices_ids: [u[0]!, u[1]!] }], whole, settings).length, 1);
  },
);

// --- GetPreferredAllocation with replicas -------------------------------------------------------------

const gpuOf = (idx: DeviceIndex, ids: readonly string[]): number[] => ids.map((id) => idx.byId.get(id)!.gpu);

test('distributed spreads replicas over the GPUs, least used first; packed fills one GPU before the next', () => {
  const g = gpus(4);
  const idx = sharedIndex(g, 4);
  const all = [...idx.byId.keys()];
  assert.deepEqual(gpuOf(idx, chooseReplicas(all, [], 3, idx, 'distributed')), [0, 1, 2]);
  assert.deepEqual(gpuOf(idx, chooseReplicas(all, [], 3, idx, 'packed')), [0, 0, 0]);
  assert.deepEqual(gpuOf(idx, chooseReplicas(all, [], 6, idx, 'packed')), [0, 0, 0, 0, 1, 1]);
  // GPU 0 has 3 replicas in use and GPU 1 has 1: distributed avoids them, packed tops up GPU 0.
  const avail = all.filter(
    (id) => !['::0', '::1', '::2'].some((s) => id === `${g[0]!.uuid}${s}`) && id !== `${g[1]!.uuid}::0`,
  );
  assert.deepEqual(gpuOf(idx, chooseReplicas(avail, [], 2, idx, 'distributed')), [2, 3]);
  assert.deepEqual(gpuOf(idx, chooseReplicas(avail, [], 2, idx, 'packed')), [0, 1]);
  assert.deepEqual(chooseReplicas(avail, [], 1, idx, 'packed'), [`${g[0]!.uuid}::3`]);
});

test('must-include replicas count as in use for the rest of the choice', () => {
  const g = gpus(3);
  const idx = sharedIndex(g, 2);
  const all = [...idx.byId.keys()];
  const must = [`${g[0]!.uuid}::1`];
  const d = chooseReplicas(all, must, 3, idx, 'distributed');
  assert.ok(d.includes(must[0]!));
  assert.deepEqual(gpuOf(idx, d), [0, 1, 2]);
  const p = chooseReplicas(all, must, 3, idx, 'packed');
  assert.deepEqual(p, [`${g[0]!.uuid}::0`, `${g[0]!.uuid}::1`, `${g[1]!.uuid}::0`]);
});

test('preferredAllocation keeps the contract with replicas under both policies (randomised)', () => {
  const g = gpus(5);
  const idx = sharedIndex(g, 3);
  const ids = [...idx.byId.keys()];
  let seed = 7;
  const rnd = (n: number): number => {
    seed = (seed * 1103515245 + 12345) % 2147483648;
    return seed % n;
  };
  for (const policy of ['distributed', 'packed'] as SharedAllocationPolicy[]) {
    for (let t = 0; t < 300; t++) {
      const avail = ids.filter(() => rnd(3) > 0);
      if (avail.length === 0) continue;
      const must = avail.filter(() => rnd(6) === 0);
      const size = must.length + rnd(avail.length - must.length + 1) || 1;
      if (size < must.length || size > avail.length) continue;
      const [answer] = preferredAllocation(
        [{ available_deviceIDs: avail, must_include_deviceIDs: must, allocation_size: size }],
        idx,
        lowestFirstChooser,
        policy,
      );
      assert.equal(answer!.length, size);
      assert.equal(new Set(answer).size, size);
      assert.ok(answer!.every((id) => avail.includes(id)));
      assert.ok(must.every((id) => answer!.includes(id)));
    }
  }
});

test('preferredAllocation refuses impossible replica questions as for whole GPUs', () => {
  const g = gpus(2);
  const idx = sharedIndex(g, 2);
  const ids = [...idx.byId.keys()];
  assert.throws(
    () =>
      preferredAllocation(
        [{ available_deviceIDs: ids.slice(0, 2), must_include_deviceIDs: [], allocation_size: 3 }],
        idx,
        lowestFirstChooser,
      ),
    /larger than the 2 available/,
  );
  assert.throws(
    () =>
      preferredAllocation(
        [{ available_deviceIDs: ids.slice(0, 2), must_include_deviceIDs: [ids[3]!], allocation_size: 2 }],
        idx,
        lowestFirstChooser,
      ),
    /not among the available/,
  );
  assert.throws(
    () =>
      preferredAllocation(
        [{ available_deviceIDs: [`${g[0]!.uuid}::5`], must_include_deviceIDs: [], allocation_size: 1 }],
        idx,
        lowestFirstChooser,
      ),
    /is not one this plugin advertises/,
  );
});
