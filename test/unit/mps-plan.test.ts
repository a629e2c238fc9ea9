// core/mps.ts: the paths both processes derive, the client limit per GPU generation, and the
// daemons' plan (GPUs, renumbered MPS devices, default limits) from planned resources.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import {
  containerPipeDir,
  maxMpsClients,
  mpsPaths,
  mpsReadyFile,
  mpsShmDir,
  planMpsDaemons,
} from '../../src/core/mps.ts';
import type { Gpu } from '../../src/core/devices.ts';
import type { PlannedResource } from '../../src/core/sharing.ts';

const gpu = (index: number, gib: number): Gpu => ({
  index,
  uuid: `GPU-${index}`,
  name: 'Fake',
  minor: index,
  busId: `0000000${index}:00:00.0`,
  memoryBytes: gib * 1024 ** 3,
  numaNode: null,
});

test("paths under the root follow NVIDIA's layout, the resource name being the full name", () => {
  assert.deepEqual(mpsPaths('/run/nvidia/mps/', 'nvidia.com/gpu'), {
    dir: '/run/nvidia/mps/nvidia.com/gpu',
    pipeDir: '/run/nvidia/mps/nvidia.com/gpu/pipe',
    logDir: '/run/nvidia/mps/nvidia.com/gpu/log',
    startedFile: '/run/nvidia/mps/nvidia.com/gpu/.started',
  });
  assert.equal(mpsShmDir('/run/nvidia/mps'), '/run/nvidia/mps/shm');
  assert.equal(mpsReadyFile('/run/nvidia/mps'), '/run/nvidia/mps/.ready');
  assert.equal(containerPipeDir('nvidia.com/gpu.shared'), '/mps/nvidia.com/gpu.shared/pipe');
});

test('48 clients from Volta (7.0, not 7.5 as NVIDIA compares), 16 before it or when unknown', () => {
  assert.equal(maxMpsClients({ major: 7, minor: 0 }), 48);
  assert.equal(maxMpsClients({ major: 9, minor: 0 }), 48);
  assert.equal(maxMpsClients({ major: 6, minor: 1 }), 16);
  assert.equal(maxMpsClients(null), 16);
});

test(
  'one daemon per MPS resource: its GPUs renumbered from ' + '0 in index order, memory / replicas, 100 / replicas',
  () => {
    const gpus = [gpu(0, 80), gpu(1, 40), gpu(2, 16)];
    const dev = (pos: number, n: number) => ({
      id: `GPU-${pos}::${n}`,
      uuid: `GPU-${pos}`,
      gpu: pos,
      runtimeName: `GPU-${pos}`,
      replica: n,
    });
    const resources: PlannedResource[] = [
      {
        name: 'nvidia.com/gpu',
        devices: [{ id: 'GPU-0', uuid: 'GPU-0', gpu: 0, runtimeName: 'GPU-0' }],
        shared: false,
        failRequestsGreaterThanOne: false,
      },
      {
        name: 'nvidia.com/gpu.shared',
        devices: [0, 1, 2].flatMap((n) => [dev(2, n), dev(1, n)]),
        shared: true,
        failRequestsGreaterThanOne: true,
        mps: true,
      },
    ];
    assert.deepEqual(planMpsDaemons(resources, gpus), [
      {
        resource: 'nvidia.com/gpu.shared',
        replicas: 3,
        activeThreadPercentage: 33,
        gpus: [
          { uuid: 'GPU-1', index: 1, mpsDevice: 0, pinnedMemLimitMiB: Math.floor((40 * 1024) / 3) },
          { uuid: 'GPU-2', index: 2, mpsDevice: 1, pinnedMemLimitMiB: Math.floor((16 * 1024) / 3) },
        ],
      },
    ]);
    assert.deepEqual(planMpsDaemons(resources.slice(0, 1), gpus), []);
  },
);

test('a silent MPS daemon makes its replicas Unhealthy, not the whole GPUs listed under the same name', async () => {
  const { resourceHealth } = await import('../../src/core/snapshot.ts');
  const resource: PlannedResource = {
    name: 'nvidia.com/gpu',
    shared: true,
    failRequestsGreaterThanOne: true,
    mps: true,
    devices: [
      { id: 'GPU-0', uuid: 'GPU-0', gpu: 0, runtimeName: 'GPU-0' },
      { id: 'GPU-1::0', uuid: 'GPU-1', gpu: 1, runtimeName: 'GPU-1', replica: 0 },
      { id: 'GPU-1::1', uuid: 'GPU-1', gpu: 1, runtimeName: 'GPU-1', replica: 1 },
    ],
  };
  const health = new Map([
    ['GPU-0', 'Healthy' as const],
    ['GPU-1', 'Healthy' as const],
  ]);
  const silent = resourceHealth(
    { health, mpsDaemons: new Map([['nvidia.com/gpu', { answering: false, reason: 'no daemon', since: 1 }]]) },
    resource,
  );
  assert.deepEqual([silent.get('GPU-0'), silent.get('GPU-1')], ['Healthy', 'Unhealthy']);
  const answering = resourceHealth(
    { health, mpsDaemons: new Map([['nvidia.com/gpu', { answering: true, reason: null, since: 2 }]]) },
    resource,
  );
  assert.equal(answering.get('GPU-1'), 'Healthy');
});
