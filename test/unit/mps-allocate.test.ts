// MPS sharing's container side and labels: Allocate's variable and mounts for
// every device-list strategy, failRequestsGreaterThanOne with NVIDIA's words, and GFD's
// mps.capable / sharing-strategy / -SHARED labels.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { allocate, indexDevices } from '../../src/core/allocate.ts';
import type { AllocateSettings, ContainerAllocation, DeviceListStrategy } from '../../src/core/allocate.ts';
import type { Gpu } from '../../src/core/devices.ts';
import { nodeLabels } from '../../src/core/labels.ts';
import type { LabelGpu, LabelInput } from '../../src/core/labels.ts';
import { RequestError } from '../../src/core/request-error.ts';
import { planResources } from '../../src/core/sharing.ts';
import type { PlannedResource, Sharing } from '../../src/core/sharing.ts';

const gpus: Gpu[] = [0, 1].map((i) => ({
  index: i,
  uuid: `GPU-${i}`,
  name: 'Test GPU',
  minor: i,
  busId: `00000000:0${i}:00.0`,
  memoryBytes: 1 << 30,
  numaNode: null,
}));

function mps(
  replicas: number,
  more: { devices?: number[]; renameByDefault?: boolean; failRequestsGreaterThanOne?: boolean } = {},
): Sharing {
  return {
    timeSlicing: null,
    mps: {
      renameByDefault: more.renameByDefault ?? false,
      failRequestsGreaterThanOne: more.failRequestsGreaterThanOne ?? true,
      resources: [
        {
          name: 'nvidia.com/gpu',
          rename: null,
          replicas,
          devices:
            more.devices === undefined
              ? { kind: 'all' }
              : { kind: 'list', refs: more.devices.map((index) => ({ index })) },
        },
      ],
    },
  };
}

/** Allocate as the manager calls it for a planned resource (manager.ts stateFor). */
function allocateFor(r: PlannedResource, ids: string[][], more: Partial<AllocateSettings> = {}): ContainerAllocation[] {
  const settings: AllocateSettings = {
    passDeviceSpecs: false,
    devRoot: '/',
    presentControlDevices: [],
    newUuid: () => '0b6e7d2c-1111-4222-8333-444455556666',
    mpsRoot: '/run/nvidia/mps',
    failRequestsGreaterThanOne: r.failRequestsGreaterThanOne,
    resourceName: r.name,
    mps: r.mps === true,
    ...more,
  };
  return allocate(
    ids.map((devices_ids) => ({ devices_ids })),
    indexDevices(r.devices, gpus),
    settings,
  );
}

const MPS_ENV = { CUDA_MPS_PIPE_DIRECTORY: '/mps/nvidia.com/gpu/pipe' };
const MPS_MOUNTS = [
  { container_path: '/mps/nvidia.com/gpu/pipe', host_path: '/run/nvidia/mps/nvidia.com/gpu/pipe', read_only: false },
  { container_path: '/dev/shm', host_path: '/run/nvidia/mps/shm', read_only: false },
];

test(
  'Allocate gives an MPS replica the pipe variable and ' + 'the pipe and shm mounts, with every device-list strategy',
  () => {
    const [r] = planResources(gpus, 'uuid', mps(4));
    assert.ok(r?.mps === true);
    const expected: Record<DeviceListStrategy, ContainerAllocation> = {
      envvar: {
        envs: { NVIDIA_VISIBLE_DEVICES: 'GPU-1', ...MPS_ENV },
        mounts: MPS_MOUNTS,
        devices: [],
        annotations: {},
        cdi_devices: [],
      },
      'volume-mounts': {
        envs: { NVIDIA_VISIBLE_DEVICES: '/var/run/nvidia-container-devices', ...MPS_ENV },
        mounts: [
          { container_path: '/var/run/nvidia-container-devices/GPU-1', host_path: '/dev/null', read_only: true },
          ...MPS_MOUNTS,
        ],
        devices: [],
        annotations: {},
        cdi_devices: [],
      },
      // CDI strategies: the plugin API's envs and mounts still reach the runtime (NVIDIA does the same).
      'cdi-annotations': {
        envs: MPS_ENV,
        mounts: MPS_MOUNTS,
        devices: [],
        annotations: {
          'cdi.k8s.io/nvidia-device-plugin_0b6e7d2c-1111-4222-8333-444455556666':
            'k8s.device-plugin.nvidia.com/gpu=GPU-1',
        },
        cdi_devices: [],
      },
      'cdi-cri': {
        envs: MPS_ENV,
        mounts: MPS_MOUNTS,
        devices: [],
        annotations: {},
        cdi_devices: [{ name: 'k8s.device-plugin.nvidia.com/gpu=GPU-1' }],
      },
    };
    for (const [strategy, answer] of Object.entries(expected)) {
      assert.deepEqual(
        allocateFor(r, [['GPU-1::2']], { deviceListStrategies: [strategy as DeviceListStrategy] }),
        [answer],
        strategy,
      );
    }
    // Every container of the request gets them.
    const two = allocateFor(r, [['GPU-0::0'], ['GPU-1::3']]);
    assert.deepEqual(
      two.map((c) => [c.envs.NVIDIA_VISIBLE_DEVICES, c.envs.CUDA_MPS_PIPE_DIRECTORY, c.mounts.length]),
      [
        ['GPU-0', '/mps/nvidia.com/gpu/pipe', 2],
        ['GPU-1', '/mps/nvidia.com/gpu/pipe', 2],
      ],
    );
  },
);

test('a renamed MPS resource gets its own pipe directory; time-slicing replicas get no MPS edits', () => {
  const plan = planResources(gpus, 'index', mps(2, { devices: [1], renameByDefault: true }));
  const shared = plan.find((r) => r.name === 'nvidia.com/gpu.shared')!;
  const [c] = allocateFor(shared, [['GPU-1::0']]);
  assert.deepEqual(c?.envs, {
    NVIDIA_VISIBLE_DEVICES: '1',
    CUDA_MPS_PIPE_DIRECTORY: '/mps/nvidia.com/gpu.shared/pipe',
  });
  assert.deepEqual(
    c?.mounts.map((m) => m.host_path),
    ['/run/nvidia/mps/nvidia.com/gpu.shared/pipe', '/run/nvidia/mps/shm'],
  );
  // The whole GPU beside it is no MPS client.
  const whole = plan.find((r) => r.name === 'nvidia.com/gpu')!;
  assert.deepEqual(allocateFor(whole, [['GPU-0']])[0]?.envs, { NVIDIA_VISIBLE_DEVICES: '0' });
  const sliced = planResources(gpus, 'uuid', {
    timeSlicing: {
      renameByDefault: false,
      failRequestsGreaterThanOne: false,
      resources: [{ name: 'nvidia.com/gpu', rename: null, replicas: 2, devices: { kind: 'all' } }],
    },
  });
  assert.deepEqual(allocateFor(sliced[0]!, [['GPU-0::1']])[0], {
    envs: { NVIDIA_VISIBLE_DEVICES: 'GPU-0' },
    mounts: [],
    devices: [],
    annotations: {},
    cdi_devices: [],
  });
});

test(
  "failRequestsGreaterThanOne (MPS's default) refuses two " + "replicas in NVIDIA's words; relaxed, they are allowed",
  () => {
    const [r] = planResources(gpus, 'uuid', mps(4));
    assert.throws(
      () => allocateFor(r!, [['GPU-0::0', 'GPU-1::0']]),
      (e: unknown) =>
        e instanceof RequestError &&
        e.message ===
          'container request 0 asks for 2 shared GPU replicas of nvidia.com/gpu; failRequestsGreaterThanOne ' +
            'allows 1 per container (maximum request size for shared resources is 1; found 2: an MPS ' +
            "replica is one client's share of a GPU, and several give a container no more of it; request 1)",
    );
    const [relaxed] = planResources(gpus, 'uuid', mps(4, { failRequestsGreaterThanOne: false }));
    const [c] = allocateFor(relaxed!, [['GPU-0::0', 'GPU-1::0']]);
    assert.equal(c?.envs.NVIDIA_VISIBLE_DEVICES, 'GPU-0,GPU-1');
    assert.equal(c?.envs.CUDA_MPS_PIPE_DIRECTORY, '/mps/nvidia.com/gpu/pipe');
  },
);

test(
  'a container holding a whole GPU and MPS replicas together ' +
    'is refused; MPS without a root is a bug, not an answer',
  () => {
    const [r] = planResources(gpus, 'uuid', mps(2, { devices: [1], failRequestsGreaterThanOne: false }));
    assert.deepEqual(
      r?.devices.map((d) => d.id),
      ['GPU-0', 'GPU-1::0', 'GPU-1::1'],
    );
    assert.throws(
      () => allocateFor(r!, [['GPU-1::0', 'GPU-0']]),
      (e: unknown) =>
        e instanceof RequestError &&
        e.message ===
          'container request 0 asks for whole GPU "GPU-0" and MPS replicas of nvidia.com/gpu together; ' +
            "a container's GPUs all go through MPS or none do: request replicas only, or whole GPUs only",
    );
    assert.deepEqual(allocateFor(r!, [['GPU-0']])[0]?.mounts, [], 'a whole GPU alone is no MPS client');
    assert.throws(
      () => allocateFor(r!, [['GPU-1::0']], { mpsRoot: '' }),
      (e: unknown) =>
        !(e instanceof RequestError) &&
        e instanceof Error &&
        e.message === 'MPS replicas of nvidia.com/gpu allocated without an MPS root (--mps-root)',
    );
  },
);

// ---- labels ------------------------------------------------------------------------------------

const V100: LabelGpu = {
  name: 'Tesla V100-SXM2-32GB',
  memoryBytes: 32768 * 1024 * 1024,
  compute: { major: 7, minor: 0 },
  migCapable: false,
  migEnabled: false,
};
const label = (over: Partial<LabelInput>): Map<string, string> =>
  new Map(
    nodeLabels({
      gpus: [V100, V100],
      driverVersion: '550.54.15',
      cudaDriverVersion: 12040,
      machine: null,
      sharing: { timeSlicing: null },
      migStrategy: 'none',
      migDevices: [],
      ...over,
    }),
  );

test('labels with MPS, as GFD: mps.capable true, sharing-strategy mps, replicas, -SHARED unless renamed', () => {
  const l = label({ sharing: mps(10) });
  assert.equal(l.get('nvidia.com/mps.capable'), 'true');
  assert.equal(l.get('nvidia.com/gpu.sharing-strategy'), 'mps');
  assert.equal(l.get('nvidia.com/gpu.replicas'), '10');
  assert.equal(l.get('nvidia.com/gpu.product'), 'Tesla-V100-SXM2-32GB-SHARED');
  assert.equal(l.get('nvidia.com/gpu.count'), '2');
  const renamed = label({ sharing: mps(10, { renameByDefault: true }) });
  assert.equal(renamed.get('nvidia.com/gpu.product'), 'Tesla-V100-SXM2-32GB');
  assert.equal(renamed.get('nvidia.com/gpu.sharing-strategy'), 'mps');
  // Not configured: false, as GFD says of a node without MPS; MIG on: false (MPS is not for MIG devices).
  assert.equal(label({}).get('nvidia.com/mps.capable'), 'false');
  assert.equal(
    label({ sharing: mps(10), gpus: [V100, { ...V100, migCapable: true, migEnabled: true }] }).get(
      'nvidia.com/mps.capable',
    ),
    'false',
  );
  // Time-slicing still says time-slicing.
  const sliced = label({
    sharing: {
      timeSlicing: {
        renameByDefault: false,
        failRequestsGreaterThanOne: false,
        resources: [{ name: 'nvidia.com/gpu', rename: null, replicas: 3, devices: { kind: 'all' } }],
      },
    },
  });
  assert.equal(sliced.get('nvidia.com/gpu.sharing-strategy'), 'time-slicing');
  assert.equal(sliced.get('nvidia.com/mps.capable'), 'false');
});
