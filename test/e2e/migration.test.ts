// End-to-end: moving a node from NVIDIA's device plugin (its DaemonSet) to this one and back, with the
// kubelet stand-in (which replaces a resource's endpoint on a new Register and stops it when the
// replaced plugin disconnects, as the kubelet does) and a stand-in for NVIDIA's plugin.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { existsSync } from 'node:fs';
import { SimNode } from '../support/sim.ts';
import { NVIDIA_ENDPOINT, NvidiaPluginStandIn } from '../support/nvidia-plugin.ts';
import type * as M from '../../src/api/messages.ts';

const allHealthy =
  (ids: readonly string[]) =>
  (d: M.Device[]): boolean =>
    d.length === ids.length && d.every((x, i) => x.ID === ids[i] && x.health === 'Healthy');

test("from NVIDIA's plugin to this one and back: same resource, same IDs, allocations by UUID throughout", async () => {
  let nvidia: NvidiaPluginStandIn | undefined;
  let uuids: string[] = [];
  // NVIDIA's plugin serves the node first.
  const node = await SimNode.start({
    topology: 'demo-8',
    waitRegistered: false,
    beforePlugin: async (n) => {
      uuids = n.topology.gpus.map((g) => g.uuid);
      nvidia = await NvidiaPluginStandIn.start(n.kubeletDir, uuids);
      await nvidia.register(n.kubeletSocket);
      const k = n.kubelet!;
      await k.waitForDevices(allHealthy(uuids));
      assert.equal(k.endpoint(), NVIDIA_ENDPOINT);
      const r = await k.allocate({ container_requests: [{ devices_ids: [uuids[0]!, uuids[1]!] }] });
      assert.equal(r.container_responses[0]!.envs.NVIDIA_VISIBLE_DEVICES, `${uuids[0]},${uuids[1]}`);
      assert.deepEqual(nvidia.allocated, [[uuids[0], uuids[1]]]);
    },
  });
  try {
    const k = node.kubelet!;
    const nv = nvidia!;
    // Ours starts in the same directory and becomes the resource's endpoint, listing the same IDs.
    const ours = await k.waitForRegistrations(2, 15000);
    assert.equal(ours.request.resource_name, 'nvidia.com/gpu');
    assert.equal(ours.request.endpoint, 'gpu-device-plugin-gpu.sock');
    assert.equal(k.endpoint(), 'gpu-device-plugin-gpu.sock');
    await k.waitForDevices(allHealthy(uuids));
    const r1 = await k.allocate({ container_requests: [{ devices_ids: [uuids[0]!, uuids[1]!] }] });
    assert.equal(r1.container_responses[0]!.envs.NVIDIA_VISIBLE_DEVICES, `${uuids[0]},${uuids[1]}`);
    assert.equal(nv.allocated.length, 1, "the same UUIDs allocated through ours, not NVIDIA's");
    assert.equal(nv.openStreams, 1, "the kubelet keeps NVIDIA's stream open (it does not close a replaced plugin)");

    // NVIDIA's plugin goes away (socket removed, stream closed). The kubelet then marks the resource
    // Unhealthy and stops its endpoint, which is ours: ours registers again, and serves as before.
    const n = k.registrations.length;
    const goneAt = performance.now();
    await nv.stop();
    const again = await k.waitForRegistrations(n + 1, 15000);
    const window = again.at - goneAt;
    assert.equal(again.request.endpoint, 'gpu-device-plugin-gpu.sock');
    assert.equal(k.endpointStopped(), false);
    await k.waitForDevices(allHealthy(uuids));
    const r2 = await k.allocate({ container_requests: [{ devices_ids: [uuids[2]!] }] });
    assert.equal(r2.container_responses[0]!.envs.NVIDIA_VISIBLE_DEVICES, uuids[2]);
    assert.ok(existsSync(node.pluginSocket));
    assert.equal(node.plugin.exit, undefined);
    assert.match(
      await node.plugin.waitForLine(/registered with the kubelet .*another plugin's socket went/),
      new RegExp(NVIDIA_ENDPOINT.replace('.', '\\.')),
    );
    assert.deepEqual(node.plugin.matching(/ (WARN|ERROR) /), []);

    // The way back: ours stops (its socket removed), NVIDIA's registers again and serves.
    node.plugin.signal('SIGTERM');
    assert.equal((await node.plugin.exited).code, 0);
    assert.ok(!existsSync(node.pluginSocket));
    const back = await NvidiaPluginStandIn.start(node.kubeletDir, uuids);
    nvidia = back;
    const m = k.registrations.length;
    await back.register(node.kubeletSocket);
    await k.waitForRegistrations(m + 1);
    assert.equal(k.endpoint(), NVIDIA_ENDPOINT);
    await k.waitForDevices(allHealthy(uuids));
    const r3 = await k.allocate({ container_requests: [{ devices_ids: [uuids[0]!, uuids[1]!] }] });
    assert.equal(r3.container_responses[0]!.envs.NVIDIA_VISIBLE_DEVICES, `${uuids[0]},${uuids[1]}`);
    assert.deepEqual(back.allocated, [[uuids[0], uuids[1]]]);
    process.stderr.write(
      `# NVIDIA's plugin gone → ours registered again after ${window.toFixed(0)} ` +
        `ms (Allocate refused by the kubelet meanwhile; measured, not asserted)\n`,
    );
  } finally {
    await nvidia?.stop();
    await node.stop();
  }
});
