import { test } from 'node:test';
import assert from 'node:assert/strict';
import { allocate, indexDevices, CONTROL_DEVICE_NODES } from '../../src/core/allocate.ts';
import type { AllocateSettings } from '../../src/core/allocate.ts';
import { countHealthyGpus, deviceList, wholeGpuDevices } from '../../src/core/devices.ts';
import type { Gpu } from '../../src/core/devices.ts';
import { lowestFirstChooser, preferredAllocation } from '../../src/core/preferred.ts';
import { RequestError } from '../../src/core/request-error.ts';

function gpus(n: number): Gpu[] {
  return Array.from({ length: n }, (_, i) => ({
    index: i,
    uuid: `GPU-0000000${i}-1111-2222-3333-444444444444`,
    name: 'Test GPU',
    minor: i + 10,
    busId: `00000000:0${i}:00.0`,
    memoryBytes: 1 << 30,
    numaNode: i < n / 2 ? 0 : i === n - 1 ? null : 1,
  }));
}

const noSpecs: AllocateSettings = { passDeviceSpecs: false, devRoot: '/', presentControlDevices: [] };

test('whole-GPU devices are advertised by UUID whatever the strategy; the runtime gets the UUID or the index', () => {
  const g = gpus(3);
  assert.deepEqual(
    wholeGpuDevices(g, 'uuid').map((d) => [d.id, d.runtimeName]),
    g.map((x) => [x.uuid, x.uuid]),
  );
  assert.deepEqual(
    wholeGpuDevices(g, 'index').map((d) => [d.id, d.runtimeName]),
    g.map((x, i) => [x.uuid, String(i)]),
  );
});

test('device IDs longer than 63 characters or repeated are refused with the GPU named', () => {
  const long = [{ ...gpus(1)[0]!, uuid: `GPU-${'x'.repeat(60)}` }];
  assert.throws(() => wholeGpuDevices(long, 'uuid'), /GPU 0 .*64 characters; the kubelet accepts 1 to 63/);
  const g = gpus(2);
  const twice = [g[0]!, { ...g[1]!, uuid: g[0]!.uuid }];
  assert.throws(() => wholeGpuDevices(twice, 'uuid'), /GPU 1 .*repeats device ID/);
});

test('the device list carries health and NUMA node, and omits topology without a NUMA node', () => {
  const g = gpus(4);
  const devs = wholeGpuDevices(g, 'uuid');
  const list = deviceList(devs, g, new Map(g.map((x, i) => [x.uuid, i === 1 ? 'Unhealthy' : 'Healthy'])));
  assert.deepEqual(
    list.map((d) => d.health),
    ['Healthy', 'Unhealthy', 'Healthy', 'Healthy'],
  );
  assert.deepEqual(list[0]!.topology, { nodes: [{ ID: 0 }] });
  assert.deepEqual(list[2]!.topology, { nodes: [{ ID: 1 }] });
  assert.equal(list[3]!.topology, null);
  assert.equal(countHealthyGpus(['Healthy', 'Unhealthy', 'Healthy', 'Healthy']), 3);
});

test('Allocate answers one response per container, in order, with NVIDIA_VISIBLE_DEVICES', () => {
  const g = gpus(4);
  const idx = indexDevices(wholeGpuDevices(g, 'uuid'), g);
  const res = allocate([{ devices_ids: [g[2]!.uuid, g[0]!.uuid] }, { devices_ids: [g[3]!.uuid] }], idx, noSpecs);
  assert.equal(res.length, 2);
  assert.equal(res[0]!.envs.NVIDIA_VISIBLE_DEVICES, `${g[2]!.uuid},${g[0]!.uuid}`);
  assert.equal(res[1]!.envs.NVIDIA_VISIBLE_DEVICES, g[3]!.uuid);
  assert.deepEqual(res[0]!.devices, []);
  assert.deepEqual(res[0]!.mounts, []);
});

test('Allocate with the index strategy passes indices', () => {
  const g = gpus(4);
  const idx = indexDevices(wholeGpuDevices(g, 'index'), g);
  const res = allocate([{ devices_ids: [g[3]!.uuid, g[1]!.uuid] }], idx, noSpecs);
  assert.equal(res[0]!.envs.NVIDIA_VISIBLE_DEVICES, '3,1');
});

test('pass-device-specs adds the control nodes that exist and one node per GPU, under dev-root', () => {
  const g = gpus(4);
  const idx = indexDevices(wholeGpuDevices(g, 'uuid'), g);
  const res = allocate([{ devices_ids: [g[1]!.uuid] }], idx, {
    passDeviceSpecs: true,
    devRoot: '/run/nvidia/driver/',
    presentControlDevices: ['/dev/nvidiactl', '/dev/nvidia-uvm'],
  });
  assert.deepEqual(res[0]!.devices, [
    { container_path: '/dev/nvidiactl', host_path: '/run/nvidia/driver/dev/nvidiactl', permissions: 'rw' },
    { container_path: '/dev/nvidia-uvm', host_path: '/run/nvidia/driver/dev/nvidia-uvm', permissions: 'rw' },
    { container_path: '/dev/nvidia11', host_path: '/run/nvidia/driver/dev/nvidia11', permissions: 'rw' },
  ]);
  assert.deepEqual(CONTROL_DEVICE_NODES, [
    '/dev/nvidiactl',
    '/dev/nvidia-uvm',
    '/dev/nvidia-uvm-tools',
    '/dev/nvidia-modeset',
  ]);
});

test('Allocate refuses unknown, duplicated, empty and oversized requests, naming the offender', () => {
  const g = gpus(4);
  const idx = indexDevices(wholeGpuDevices(g, 'uuid'), g);
  const u = g.map((x) => x.uuid);
  const cases: [{ devices_ids: string[] }[], RegExp][] = [
    [[{ devices_ids: ['GPU-nope'] }], /unknown device ID "GPU-nope"/],
    [[{ devices_ids: [u[0]!, u[0]!] }], new RegExp(`lists device ID "${u[0]}" twice`)],
    [[{ devices_ids: [u[0]!] }, { devices_ids: [u[0]!] }], /requested by container requests 0 and 1/],
    [[{ devices_ids: [] }], /container request 0 lists no device IDs/],
    [[], /no container requests/],
    [[{ devices_ids: Array.from({ length: 10000 }, (_, i) => `id-${i}`) }], /asks for 10000 devices, more than the 4/],
    [Array.from({ length: 5 }, () => ({ devices_ids: [u[0]!] })), /5 container requests, more than the 4/],
    [[{ devices_ids: ['x'.repeat(5000)] }], /unknown device ID "x{77}\.\.\."/],
  ];
  for (const [req, re] of cases) {
    assert.throws(
      () => allocate(req, idx, noSpecs),
      (err: unknown) => err instanceof RequestError && re.test(err.message),
      String(re),
    );
  }
});

test('GetPreferredAllocation keeps the contract: exact size, must-include, only available, per container', () => {
  const g = gpus(8);
  const idx = indexDevices(wholeGpuDevices(g, 'uuid'), g);
  const u = g.map((x) => x.uuid);
  const res = preferredAllocation(
    [
      { available_deviceIDs: [u[5]!, u[3]!, u[7]!, u[1]!], must_include_deviceIDs: [u[7]!], allocation_size: 2 },
      { available_deviceIDs: u, must_include_deviceIDs: [], allocation_size: 8 },
    ],
    idx,
    lowestFirstChooser,
  );
  assert.equal(res.length, 2);
  assert.equal(res[0]!.length, 2);
  assert.ok(res[0]!.includes(u[7]!));
  assert.deepEqual(res[0], [u[1]!, u[7]!]);
  assert.deepEqual(new Set(res[1]), new Set(u));
});

test('GetPreferredAllocation refuses impossible questions with a clear message', () => {
  const g = gpus(4);
  const idx = indexDevices(wholeGpuDevices(g, 'uuid'), g);
  const u = g.map((x) => x.uuid);
  const q = (available: string[], must: string[], size: number) => ({
    available_deviceIDs: available,
    must_include_deviceIDs: must,
    allocation_size: size,
  });
  const cases: [ReturnType<typeof q>[], RegExp][] = [
    [[q([u[0]!], [], 2)], /allocation_size 2 is larger than the 1 available/],
    [[q([u[0]!, u[1]!], [u[2]!], 1)], /must-include device ID .* is not among the available/],
    [[q(u, [u[0]!, u[1]!], 1)], /allocation_size 1 is smaller than the 2 must-include/],
    [[q(['GPU-unknown'], [], 1)], /available device ID "GPU-unknown" is not one this plugin advertises/],
    [[q(u, ['GPU-x'], 1)], /must-include device ID "GPU-x" is not one/],
    [[q(u, [], 0)], /allocation_size 0 is not allowed; expected 1 to 4/],
    [[q(u, [], -3)], /allocation_size -3 is not allowed/],
    [[q([u[0]!, u[0]!], [], 1)], /listed twice/],
    [[], /no container requests/],
  ];
  for (const [req, re] of cases) {
    assert.throws(
      () => preferredAllocation(req, idx, lowestFirstChooser),
      (err: unknown) => err instanceof RequestError && re.test(err.message),
      String(re),
    );
  }
});
