// End-to-end live node: GPUs leaving and coming back, the driver unloaded and loaded again under a
// kubelet that holds its streams, SIGHUP on an unchanged node, and many re-discoveries without
// growth — through the built executable, the fake NVML's FIFO and the kubelet stand-in.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { readdirSync } from 'node:fs';
import * as grpc from '@grpc/grpc-js';
import { SimNode } from '../support/sim.ts';
import { onFileChange, waitUntil } from '../support/wait.ts';

const healthString = (d: readonly { health: string }[]): string =>
  d.map((x) => (x.health === 'Healthy' ? 'H' : 'U')).join('');
const grpcCode = (err: unknown): number | undefined => (err as { code?: number }).code;
const fdCount = (pid: number): number => readdirSync(`/proc/${pid}/fd`).length;

/** A node watched for health, re-discovering every `interval` seconds. */
async function liveNode(interval: string, extra: string[] = []): Promise<SimNode> {
  const node = await SimNode.start({ topology: 'demo-8', args: ['--rediscover-interval', interval, ...extra] });
  await node.plugin.waitForLine(/watching GPU health/, 10000);
  await node.kubelet!.waitForDevices((d) => d.length === 8);
  return node;
}

test(
  'a GPU removed leaves the list within one scan and is ' +
    'refused by Allocate; back, it returns with its health kept',
  async () => {
    const node = await liveNode('0.2');
    try {
      const k = node.kubelet!;
      const u = node.topology.gpus.map((g) => g.uuid);
      let broken = 0;
      k.on('stream-broken', () => broken++);
      node.nvml('xid 3 79');
      await k.waitForDevices((d) => d[3]?.health === 'Unhealthy');
      const registrations = k.registrations.length;

      node.nvml('remove 3');
      const shrunk = await k.waitForDevices((d) => d.length === 7, 'nvidia.com/gpu', 20000);
      assert.deepEqual(
        shrunk.map((d) => d.ID),
        u.filter((_, i) => i !== 3),
      );
      assert.equal(healthString(shrunk), 'HHHHHHH');
      assert.match(await node.plugin.waitForLine(/GPU left the node/), new RegExp(`uuid=${u[3]}`));
      await assert.rejects(
        k.allocate({ container_requests: [{ devices_ids: [u[3]!] }] }),
        (err: unknown) =>
          grpcCode(err) === grpc.status.INVALID_ARGUMENT &&
          new RegExp(`device ID "${u[3]}" is no longer on this node: its GPU left the node`).test(
            (err as Error).message,
          ),
      );
      await assert.rejects(
        k.preferred({
          container_requests: [{ available_deviceIDs: [u[0]!, u[3]!], must_include_deviceIDs: [], allocation_size: 1 }],
        }),
        (err: unknown) => grpcCode(err) === grpc.status.INVALID_ARGUMENT && (err as Error).message.includes(u[3]!),
      );
      // The GPUs that stayed are served as before, under their new NVML indices.
      const ok = await k.allocate({ container_requests: [{ devices_ids: [u[4]!] }] });
      assert.equal(ok.container_responses[0]!.envs.NVIDIA_VISIBLE_DEVICES, u[4]);

      node.nvml(`add ${u[3]}`);
      const back = await k.waitForDevices((d) => d.length === 8, 'nvidia.com/gpu', 20000);
      assert.deepEqual(
        back.map((d) => d.ID),
        u,
      );
      assert.equal(
        healthString(back),
        'HHHUHHHH',
        'XID 79 made it unhealthy before it left: it stays so (recovery is off)',
      );
      assert.match(await node.plugin.waitForLine(/GPU is back/), /health=Unhealthy/);
      assert.equal(
        k.registrations.length,
        registrations,
        'the list changed on the open stream, without registering again',
      );
      assert.equal(broken, 0, 'the stream never broke');
      // Health is watched on the new list: an XID on GPU 5 lands on GPU 5.
      await node.plugin.waitForLine(
        /watching GPU health/,
        10000,
        node.plugin.lines.findIndex((l) => /GPU is back/.test(l)),
      );
      node.nvml('xid 5 48');
      const after = await k.waitForDevices((d) => d[5]?.health === 'Unhealthy');
      assert.equal(healthString(after), 'HHHUHUHH');
      assert.equal(node.plugin.exit, undefined);
    } finally {
      await node.stop();
    }
  },
);

test('with recovery on, a GPU that comes back after leaving starts healthy', async () => {
  const node = await liveNode('0.2', ['--health-recovery']);
  try {
    const k = node.kubelet!;
    const u = node.topology.gpus.map((g) => g.uuid);
    node.nvml('xid 6 79');
    await k.waitForDevices((d) => d[6]?.health === 'Unhealthy');
    node.nvml('remove 6');
    await k.waitForDevices((d) => d.length === 7, 'nvidia.com/gpu', 20000);
    node.nvml(`add ${u[6]}`);
    const back = await k.waitForDevices((d) => d.length === 8, 'nvidia.com/gpu', 20000);
    assert.equal(healthString(back), 'HHHHHHHH');
  } finally {
    await node.stop();
  }
});

test(
  'driver unloaded under open streams: no crash, every device ' +
    'Unhealthy, registration kept; the new driver brings them back',
  async () => {
    const node = await liveNode('60');
    try {
      const k = node.kubelet!;
      const u = node.topology.gpus.map((g) => g.uuid);
      let broken = 0;
      k.on('stream-broken', () => broken++);
      node.nvml('xid 2 48');
      await k.waitForDevices((d) => d[2]?.health === 'Unhealthy');
      const registrations = k.registrations.length;

      node.nvml('unload');
      const down = await k.waitForDevices((d) => healthString(d) === 'UUUUUUUU', 'nvidia.com/gpu', 20000);
      assert.deepEqual(
        down.map((d) => d.ID),
        u,
        'withdrawn from allocation, not from the list: capacity stays',
      );
      await node.plugin.waitForLine(/the NVIDIA driver does not answer/);
      const allocation = await k.allocate({ container_requests: [{ devices_ids: [u[0]!] }] });
      assert.equal(
        allocation.container_responses[0]!.envs.NVIDIA_VISIBLE_DEVICES,
        u[0],
        'an Allocate in flight is still answered from the snapshot',
      );

      node.nvml('load 560.28.03');
      const up = await k.waitForDevices((d) => healthString(d) === 'HHUHHHHH', 'nvidia.com/gpu', 30000);
      assert.deepEqual(
        up.map((d) => d.ID),
        u,
      );
      assert.match(await node.plugin.waitForLine(/the NVIDIA driver answers/), /driver=560\.28\.03/);
      assert.equal(k.registrations.length, registrations, 'no re-registration');
      assert.equal(broken, 0, 'the stream never broke');
      assert.equal(node.plugin.exit, undefined);
      // The health watcher runs again on the new driver.
      await node.plugin.waitForLine(
        /watching GPU health/,
        10000,
        node.plugin.lines.findIndex((l) => /the NVIDIA driver answers/.test(l)),
      );
      node.nvml('xid 7 79');
      await k.waitForDevices((d) => healthString(d) === 'HHUHHHHU');
    } finally {
      await node.stop();
    }
  },
);

test('SIGHUP on an unchanged node looks again and re-registers nothing', async () => {
  const node = await liveNode('0');
  try {
    const k = node.kubelet!;
    const registrations = k.registrations.length;
    const updates = k.updates();
    const from = node.plugin.lines.length;
    node.plugin.signal('SIGHUP');
    assert.match(await node.plugin.waitForLine(/looked at the node again/, 10000, from), /gpus=8 .*changes=none/);
    await node.plugin.waitForLine(/watching GPU health/, 10000, from);
    assert.equal(k.registrations.length, registrations);
    assert.equal(k.updates(), updates, 'no new list was sent');
    assert.equal(node.plugin.matching(/registered with the kubelet/, from).length, 0);
  } finally {
    await node.stop();
  }
});

test(
  '200 re-discoveries and 20 SIGHUPs with no change: no ' +
    'growth in fds, handles (timers, sockets, watchers) or heap',
  async () => {
    const node = await liveNode('0.01', ['--log-level', 'debug']);
    try {
      const k = node.kubelet!;
      // One SIGHUP, measured once its new health watcher thread is up (a thread starting or
      // stopping holds a few descriptors of its own for a moment).
      const hup = async (): Promise<{ handles: string; heap: number; fds: number }> => {
        const from = node.plugin.lines.length;
        node.plugin.signal('SIGHUP');
        const line = await node.plugin.waitForLine(/process resources/, 20000, from);
        await node.plugin.waitForLine(/watching GPU health/, 20000, from);
        await new Promise((r) => setTimeout(r, 200));
        return {
          handles: /handles=(\S+)/.exec(line)?.[1] ?? '',
          heap: Number(/heap_kib=(\d+)/.exec(line)?.[1]),
          fds: fdCount(node.plugin.pid),
        };
      };
      // Warm-up: the SIGHUP path (worker restart, NVML re-open) once before measuring.
      await hup();
      const first = await hup();
      const before = await node.nvmlStats();
      // Each read asks the fake for a stats file in the node's folder; that file's arrival reads again.
      await waitUntil(
        async () =>
          ((await node.nvmlStats()).calls.nvmlDeviceGetCount_v2 ?? 0) - (before.calls.nvmlDeviceGetCount_v2 ?? 0) >=
          200,
        { on: onFileChange(node.dir), deadlineMs: 60_000, what: 'the re-discovery timer runs: 200 re-discoveries' },
      );
      const afterTimer = fdCount(node.plugin.pid);
      assert.ok(afterTimer <= first.fds + 1, `fds ${first.fds} → ${afterTimer} after 200 re-discoveries`);
      let last = first;
      for (let i = 0; i < 20; i++) last = await hup();
      assert.equal(last.handles, first.handles, 'the same timers, sockets and watchers');
      assert.ok(
        last.fds <= first.fds + 2,
        `fds ${first.fds} → ${last.fds} after 20 SIGHUPs (one leaked per SIGHUP would be +20)`,
      );
      assert.ok(last.heap < first.heap + 8192, `heap ${first.heap} KiB → ${last.heap} KiB`);
      assert.equal(
        node.plugin.matching(/GPU left|GPU appeared|device list changed|registered with the kubelet .*reason=(?!start)/)
          .length,
        0,
        'nothing changed',
      );
      assert.equal(k.registrations.length, 1);
      assert.equal(healthString(k.devices() ?? []), 'HHHHHHHH');
    } finally {
      await node.stop();
    }
  },
);

test(
  'a GPU removed cleanly is gone, not lost: its stale handle ' +
    'answering GPU_IS_LOST does not mark it, and it comes back healthy',
  async () => {
    // Re-discovery is slow here, so the fast probe is what notices the removal: the last GPU's handle
    // then answers GPU_IS_LOST (the fake, as NVML, for a GPU removed since).
    const node = await SimNode.start({
      topology: 'demo-8',
      args: ['--rediscover-interval', '60', '--health-probe-interval', '0.05'],
    });
    try {
      const k = node.kubelet!;
      await node.plugin.waitForLine(/watching GPU health/, 10000);
      const u = node.topology.gpus.map((g) => g.uuid);
      node.nvml('remove 7');
      assert.match(
        await node.plugin.waitForLine(/GPU answered GPU_IS_LOST but has left the node: it is gone, not lost/, 10000),
        new RegExp(`uuid=${u[7]}`),
      );
      const shrunk = await k.waitForDevices((d) => d.length === 7, 'nvidia.com/gpu', 20000);
      assert.equal(healthString(shrunk), 'HHHHHHH');
      assert.match(await node.plugin.waitForLine(/GPU left the node/), new RegExp(`uuid=${u[7]}`));
      node.nvml(`add ${u[7]}`);
      await node.nvmlStats();
      node.plugin.signal('SIGHUP');
      const back = await k.waitForDevices((d) => d.length === 8, 'nvidia.com/gpu', 20000);
      assert.equal(healthString(back), 'HHHHHHHH', 'it left healthy, so it is back healthy');
      assert.match(await node.plugin.waitForLine(/GPU is back/), /health=Healthy/);
      assert.deepEqual(node.plugin.matching(/GPU unhealthy/), [], 'nothing was marked lost');
    } finally {
      await node.stop();
    }
  },
);
