// End-to-end: the built executable against the kubelet stand-in (real gRPC, the kubelet's blocking
// dial), through kubelet restarts: graceful ones back to back, and ones after the socket directory was
// deleted and re-created.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { existsSync, mkdirSync, rmSync } from 'node:fs';
import { SimNode } from '../support/sim.ts';

const median = (xs: number[]): number => {
  const s = [...xs].sort((a, b) => a - b);
  return s[Math.floor(s.length / 2)] ?? NaN;
};

test('100 graceful kubelet restarts back to back: every Register the kubelet gets finds our socket served', async () => {
  const node = await SimNode.start({ topology: 'demo-8' });
  try {
    const k = node.kubelet!;
    await k.waitForDevices((d) => d.length === 8);
    const lat: number[] = [];
    const dial: number[] = [];
    for (let i = 0; i < 100; i++) {
      const n = k.registrations.length;
      // The old kubelet removes kubelet.sock; the new one deletes our socket, then serves kubelet.sock.
      await k.restart();
      // Liveness bound only: a registration the kubelet's dial timeout (10 s) ended would show as a
      // rejection below, not as a timeout here.
      const reg = await k.waitForRegistrations(n + 1, 30000);
      lat.push(reg.at - reg.socketCreatedAt);
      dial.push(reg.dialMs);
      await k.waitForDevices((d) => d.length === 8);
      assert.ok(existsSync(node.pluginSocket), `restart ${i + 1}: our socket is there`);
    }
    // A Register whose dial found no socket to connect to within the kubelet's timeout fails: none did.
    assert.deepEqual(k.rejected.map((r) => r.reason), [], 'every Register the kubelet received succeeded');
    const u = node.topology.gpus.map((g) => g.uuid);
    const res = await k.allocate({ container_requests: [{ devices_ids: [u[0]!] }] });
    assert.equal(res.container_responses[0]!.envs['NVIDIA_VISIBLE_DEVICES'], u[0]);
    process.stderr.write(`# graceful restart → re-registered: median ${median(lat).toFixed(1)} ms, worst ${Math.max(...lat).toFixed(1)} ms; `
      + `the kubelet's dial had to retry ${dial.filter((ms) => ms > 500).length} times, waiting at worst ${Math.max(...dial).toFixed(0)} ms (of 100; measured, not asserted)\n`);
  } finally {
    await node.stop();
  }
});

/** rm -rf that retries while the plugin re-creates its socket in the directory being deleted. */
function removeDir(dir: string): void {
  for (let i = 0; ; i++) {
    try {
      rmSync(dir, { recursive: true, force: true });
      return;
    } catch (err) {
      if ((err as NodeJS.ErrnoException).code !== 'ENOTEMPTY' || i > 1000) throw err;
    }
  }
}

test('the socket directory deleted and re-created 5 times: every kubelet start after it is seen by the directory watch', async () => {
  // The periodic check is an hour away: only the watch can see the kubelet come back.
  const node = await SimNode.start({ topology: 'demo-8', args: ['--socket-check-interval', '3600'] });
  try {
    const k = node.kubelet!;
    await k.waitForDevices((d) => d.length === 8);
    for (let i = 0; i < 5; i++) {
      const n = k.registrations.length;
      await k.stopKubelet();
      removeDir(node.kubeletDir);
      mkdirSync(node.kubeletDir);
      await k.startKubelet();
      await k.waitForRegistrations(n + 1, 30000);
      await k.waitForDevices((d) => d.length === 8);
    }
    assert.equal(node.plugin.matching(/the socket directory was re-created; watching the new one/).length, 5, node.plugin.lines.join('\n'));
    // Then routine restarts, in the directory made last.
    for (let i = 0; i < 3; i++) {
      const n = k.registrations.length;
      await k.restart();
      await k.waitForRegistrations(n + 1, 30000);
    }
    await k.waitForDevices((d) => d.length === 8);
    assert.ok(existsSync(node.pluginSocket));
    assert.equal(node.plugin.exit, undefined);
    assert.equal(node.plugin.matching(/lost the socket directory/).length, 0);
  } finally {
    await node.stop();
  }
});
