// End-to-end health: events injected into the fake NVML reach the kubelet stand-in's ListAndWatch.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { SimNode } from '../support/sim.ts';
import { onFileChange, waitUntil } from '../support/wait.ts';
import { DEFAULT_IGNORED_XIDS } from '../../src/core/health-policy.ts';

const sleep = (ms: number): Promise<void> => new Promise((r) => setTimeout(r, ms));
const healthString = (node: SimNode): string =>
  (node.kubelet!.devices() ?? []).map((d) => (d.health === 'Healthy' ? 'H' : 'U')).join('');

/** A simulated node whose health watcher is ready (events sent before it registers are lost, as with NVML). */
async function watched(opts: Parameters<typeof SimNode.start>[0]): Promise<SimNode> {
  const node = await SimNode.start(opts);
  await node.plugin.waitForLine(/watching GPU health/, 10000);
  return node;
}

/**
 * Waits until the fake NVML's call counts satisfy ok. Each read asks the fake for a stats file in the
 * node's folder, and that file's arrival is what reads again: the counts are followed as fast as the
 * fake answers, until they satisfy ok or the deadline fails the wait.
 */
async function untilCalls(node: SimNode, what: string, ok: (calls: Record<string, number>) => boolean): Promise<void> {
  await waitUntil(async () => ok((await node.nvmlStats()).calls), { on: onFileChange(node.dir), what });
}

/**
 * Waits until the plugin has probed every GPU `rounds` more times (the fake counts its calls; the
 * count starts over when NVML is opened afresh, so no re-open may happen meanwhile).
 */
async function probeRounds(node: SimNode, rounds: number): Promise<void> {
  const probes = (calls: Record<string, number>): number => calls.nvmlDeviceGetMemoryInfo ?? 0;
  const target = probes((await node.nvmlStats()).calls) + rounds * node.topology.gpus.length;
  await untilCalls(node, `${rounds} more probe rounds`, (calls) => probes(calls) >= target);
}

/**
 * Waits until the plugin has handled every event sent so far, by sending one more that it reports:
 * a critical XID on GPU `gpu` (events travel in order, and the live node applies them in order), so
 * that GPU is Unhealthy afterwards. A wait on something the plugin did, not on the clock.
 */
async function handled(node: SimNode, gpu: number): Promise<void> {
  node.nvml(`xid ${gpu} 48`);
  await node.kubelet!.waitForDevices((d) => d[gpu]?.health === 'Unhealthy', 'nvidia.com/gpu', 5000);
}

test('a critical XID marks that GPU unhealthy; each default-ignored XID does not', async () => {
  const node = await watched({ topology: 'demo-8', args: ['--log-level=debug'] });
  try {
    const k = node.kubelet!;
    await k.waitForDevices((d) => d.length === 8);
    for (const xid of DEFAULT_IGNORED_XIDS) node.nvml(`xid 1 ${xid}`);
    // Each ignored XID is handled, and said so at debug level.
    for (const xid of DEFAULT_IGNORED_XIDS)
      await node.plugin.waitForLine(new RegExp(`DEBUG XID ignored by the health settings gpu=1 .*xid=${xid} `));
    await handled(node, 7);
    assert.equal(healthString(node), 'HHHHHHHU', 'ignored XIDs change nothing');
    node.nvml('xid 3 79');
    await k.waitForDevices((d) => d[3]?.health === 'Unhealthy', 'nvidia.com/gpu', 5000);
    assert.equal(healthString(node), 'HHHUHHHU');
    // The log comes through another pipe than the list: wait for it.
    const line = await node.plugin.waitForLine(/GPU unhealthy gpu=3 /, 5000);
    assert.match(line, new RegExp(`uuid=${node.topology.gpus[3]!.uuid}`));
    assert.match(line, /xid=79/);
    assert.match(line, /fallen off the bus/);
  } finally {
    await node.stop();
  }
});

test('double-bit ECC marks unhealthy, single-bit ECC does not', async () => {
  const node = await watched({ topology: 'demo-8', args: ['--log-level=debug'] });
  try {
    const k = node.kubelet!;
    node.nvml('sbe 0');
    node.nvml('sbe 0');
    await node.plugin.waitForLine(/DEBUG single-bit ECC error gpu=0 /);
    await handled(node, 7);
    assert.equal(healthString(node), 'HHHHHHHU');
    node.nvml('dbe 6');
    await k.waitForDevices((d) => d[6]?.health === 'Unhealthy', 'nvidia.com/gpu', 5000);
    assert.equal(healthString(node), 'HHHHHHUU');
  } finally {
    await node.stop();
  }
});

test('an event that names no device concerns every GPU', async () => {
  const node = await watched({ topology: 'demo-8' });
  try {
    node.nvml('xid all 62');
    await node.kubelet!.waitForDevices((d) => d.every((x) => x.health === 'Unhealthy'), 'nvidia.com/gpu', 5000);
  } finally {
    await node.stop();
  }
});

test("DP_DISABLE_HEALTHCHECKS and DP_ENABLE_HEALTHCHECKS keep NVIDIA's meaning", async () => {
  // Extra ignored XID, and a default-ignored one made critical.
  let node = await watched({
    topology: 'demo-8',
    env: { DP_DISABLE_HEALTHCHECKS: '79', DP_ENABLE_HEALTHCHECKS: '31' },
  });
  try {
    node.nvml('xid 0 79');
    // XID 31 is critical here: once GPU 1 is marked, the XID 79 sent before it was handled too.
    node.nvml('xid 1 31');
    await node.kubelet!.waitForDevices((d) => d[1]?.health === 'Unhealthy', 'nvidia.com/gpu', 5000);
    assert.equal(healthString(node), 'HUHHHHHH', '79 ignored by DP_DISABLE_HEALTHCHECKS');
  } finally {
    await node.stop();
  }
  // all disabled but one enabled: only that one is watched.
  node = await watched({ topology: 'demo-8', env: { DP_DISABLE_HEALTHCHECKS: 'all', DP_ENABLE_HEALTHCHECKS: '74' } });
  try {
    node.nvml('xid 0 79');
    node.nvml('dbe 0');
    node.nvml('xid 2 74');
    await node.kubelet!.waitForDevices((d) => d[2]?.health === 'Unhealthy', 'nvidia.com/gpu', 5000);
    assert.equal(
      healthString(node),
      'HHUHHHHH',
      'only XID 74 is watched: the XID 79 and the double-bit ECC before it changed nothing',
    );
  } finally {
    await node.stop();
  }
  // all disabled: nothing is watched.
  node = await SimNode.start({
    topology: 'demo-8',
    env: { DP_DISABLE_HEALTHCHECKS: 'all' },
    args: ['--health-probe-interval=0.1'],
  });
  try {
    node.nvml('xid 0 79');
    node.nvml('lost 1');
    await node.plugin.waitForLine(/health checks are off .*GPUs are not watched/);
    // Nothing watches: no event set was ever made, and no probe ran (the fake counts every call).
    const calls = (await node.nvmlStats()).calls;
    assert.equal(calls.nvmlEventSetCreate ?? 0, 0);
    assert.equal(calls.nvmlDeviceRegisterEvents ?? 0, 0);
    const listed = await node.kubelet!.waitForDevices((d) => d.length === 8);
    assert.equal(listed.map((d) => (d.health === 'Healthy' ? 'H' : 'U')).join(''), 'HHHHHHHH');
  } finally {
    await node.stop();
  }
});

test('a bad DP_DISABLE_HEALTHCHECKS stops the start with a clear message', async () => {
  const node = await SimNode.start({
    topology: 'demo-8',
    waitRegistered: false,
    env: { DP_DISABLE_HEALTHCHECKS: '13,abc' },
  });
  try {
    const exit = await node.plugin.exited;
    assert.equal(exit.code, 2);
    assert.match(node.plugin.lines.join('\n'), /DP_DISABLE_HEALTHCHECKS: "abc" is not an XID/);
  } finally {
    await node.stop();
  }
});

test(
  'a GPU that falls off the bus without any event is ' + 'found by the probe, and stays unhealthy when back',
  async () => {
    const node = await watched({
      topology: 'demo-8',
      args: ['--health-probe-interval=0.1', '--health-recovery', '--health-recovery-quiet-period=0.2'],
    });
    try {
      node.nvml('lost 4');
      await node.kubelet!.waitForDevices((d) => d[4]?.health === 'Unhealthy', 'nvidia.com/gpu', 5000);
      const from = node.plugin.lines.length;
      node.nvml('back 4');
      // The probe answers ok again: the scanner opens NVML afresh to look at the node, and the health
      // thread starts again on the new session. Then it probes for longer than the quiet period: a GPU
      // that could recover would have by then.
      await node.plugin.waitForLine(/watching GPU health/, 10000, from);
      await probeRounds(node, 5);
      await handled(node, 7);
      assert.equal(healthString(node), 'HHHHUHHU', 'a lost GPU never recovers, even with recovery on');
    } finally {
      await node.stop();
    }
  },
);

test(
  'a GPU lost while another leaves the bus: the lost ' + 'one stays listed Unhealthy, the one that left goes',
  async () => {
    const node = await watched({ topology: 'demo-8', args: ['--health-probe-interval=0.1'] });
    try {
      const k = node.kubelet!;
      const u = node.topology.gpus.map((g) => g.uuid);
      await k.waitForDevices((d) => d.length === 8);
      // GPU 3 falls off the bus (XID 79, then GPU_IS_LOST); GPU 2 leaves: GPU 3 is NVML's index 2 now.
      node.nvml('xid 3 79');
      node.nvml('lost 3');
      await k.waitForDevices((d) => d[3]?.health === 'Unhealthy', 'nvidia.com/gpu', 5000);
      const from = node.plugin.lines.length;
      node.nvml('remove 2');
      const after = await k.waitForDevices((d) => d.length === 7, 'nvidia.com/gpu', 20000);
      assert.deepEqual(
        after.map((d) => d.ID),
        u.filter((_, i) => i !== 2),
        'the GPU that left goes; the lost one stays listed',
      );
      assert.equal(healthString(node), 'HHUHHHH', 'the lost GPU stays Unhealthy; the others are Healthy');
      assert.match(await node.plugin.waitForLine(/GPU left the node/), new RegExp(`uuid=${u[2]}`));
      // Health still lands on the right GPUs once watched on the new list: an XID on NVML's index 5
      // (GPU 6 of the start) marks GPU 6.
      await node.plugin.waitForLine(/watching GPU health/, 10000, from);
      node.nvml('xid 5 48');
      const marked = await k.waitForDevices((d) => d.find((x) => x.ID === u[6])?.health === 'Unhealthy');
      assert.equal(healthString(node), 'HHUHHUH');
      assert.equal(marked.find((x) => x.ID === u[3])?.health, 'Unhealthy');
    } finally {
      await node.stop();
    }
  },
);

test('recovery off (default): a GPU marked unhealthy by an XID stays so', async () => {
  const node = await watched({ topology: 'demo-8', args: ['--health-probe-interval=0.1'] });
  try {
    node.nvml('xid 2 94');
    await node.kubelet!.waitForDevices((d) => d[2]?.health === 'Unhealthy', 'nvidia.com/gpu', 5000);
    await probeRounds(node, 7);
    await handled(node, 7);
    assert.equal(healthString(node), 'HHUHHHHU');
  } finally {
    await node.stop();
  }
});

test('recovery on: healthy again after the quiet period of normal answers, logged once each way', async () => {
  const node = await watched({
    topology: 'demo-8',
    args: ['--health-probe-interval=0.05', '--health-recovery', '--health-recovery-quiet-period=0.4'],
  });
  try {
    const k = node.kubelet!;
    node.nvml('xid 2 94');
    await k.waitForDevices((d) => d[2]?.health === 'Unhealthy', 'nvidia.com/gpu', 5000);
    const t0 = performance.now();
    await k.waitForDevices((d) => d[2]?.health === 'Healthy', 'nvidia.com/gpu', 5000);
    assert.ok(performance.now() - t0 >= 300, 'not before the quiet period');
    // The log comes through another pipe than the list: wait for it.
    await node.plugin.waitForLine(/GPU healthy again/, 5000);
    assert.equal(node.plugin.matching(/GPU unhealthy/).length, 1);
    assert.equal(node.plugin.matching(/GPU healthy again/).length, 1);
    assert.match(node.plugin.matching(/GPU healthy again/)[0]!, /xid=94/);
  } finally {
    await node.stop();
  }
});

test('an XID storm (10 000 events a second) keeps Allocate answering, memory flat and updates bounded', async () => {
  const node = await watched({ topology: 'demo-8', args: ['--health-recovery', '--health-recovery-quiet-period=60'] });
  try {
    const k = node.kubelet!;
    const u = node.topology.gpus.map((g) => g.uuid);
    await k.waitForDevices((d) => d.length === 8);
    const stormFor = async (ms: number): Promise<number> => {
      const end = performance.now() + ms;
      let n = 0;
      while (performance.now() < end) {
        node.nvml(Array.from({ length: 100 }, (_, i) => `xid ${(n + i) % 2} 79`).join('\n'));
        n += 100;
        await sleep(10);
      }
      return n;
    };
    const allocateUntil = async (end: number): Promise<number> => {
      let n = 0;
      while (performance.now() < end) {
        const res = await k.allocate({ container_requests: [{ devices_ids: [u[5]!] }] });
        assert.equal(res.container_responses[0]!.envs.NVIDIA_VISIBLE_DEVICES, u[5]);
        n++;
      }
      return n;
    };
    // Warm-up with the same load: the heap sizes itself for it; growth after that would be a leak.
    await Promise.all([stormFor(2500), allocateUntil(performance.now() + 2500)]);
    await handled(node, 6);
    const updatesBefore = k.updates();
    const rssBefore = node.plugin.rss().totalKiB;
    const deadline = performance.now() + 3000;
    let allocations = 0;
    const storm = stormFor(3000);
    allocations = await allocateUntil(deadline);
    const sent = await storm;
    await handled(node, 7);
    // The marker's own update does not count.
    const updates = k.updates() - updatesBefore - 1;
    const rssAfter = node.plugin.rss().totalKiB;
    assert.ok(sent >= 5000, `storm sent ${sent} events`);
    assert.ok(allocations > 20, `Allocate kept answering (${allocations} in 3 s)`);
    assert.ok(updates <= 2, `bounded ListAndWatch updates (${updates}; the GPUs were already unhealthy)`);
    assert.equal(healthString(node), 'UUHHHHUU');
    assert.ok(rssAfter < rssBefore + 16 * 1024, `RSS ${rssBefore} → ${rssAfter} KiB`);
    process.stderr.write(
      `# storm: ${sent} XIDs in 3 s → ${updates} ListAndWatch updates, ${allocations} ` +
        `Allocates answered, RSS ${rssBefore} → ${rssAfter} KiB\n`,
    );
  } finally {
    await node.stop();
  }
});

test('a GPU that supports no events is logged once and still watched by the probe', async () => {
  const node = await watched({ topology: 'single', args: ['--health-probe-interval=0.1'] });
  try {
    await node.plugin.waitForLine(/supports no health events/, 5000);
    node.nvml('lost 0');
    await node.kubelet!.waitForDevices((d) => d[0]?.health === 'Unhealthy', 'nvidia.com/gpu', 5000);
    assert.equal(node.plugin.matching(/supports no health events/).length, 1);
  } finally {
    await node.stop();
  }
});

test('SIGTERM while the watcher is blocked in its NVML wait exits 0 promptly', async () => {
  const node = await watched({ topology: 'demo-8', args: ['--health-probe-interval=3600'] });
  try {
    // Blocked in its NVML wait: the fake has counted the health thread's call (at its entry).
    await untilCalls(
      node,
      "the health thread's NVML event wait",
      (calls) => (calls.nvmlEventSetWait_v2 ?? 0) + (calls.nvmlEventSetWait ?? 0) > 0,
    );
    const t0 = performance.now();
    node.plugin.signal('SIGTERM');
    assert.deepEqual(await node.plugin.exited, { code: 0, signal: null });
    assert.ok(performance.now() - t0 < 2000);
    assert.equal(node.plugin.matching(/stop took too long/).length, 0);
  } finally {
    await node.stop();
  }
});

test('the old-driver variant (first event wait only) still reports XIDs', async () => {
  const node = await watched({ topology: 'demo-8', nvml: 'old' });
  try {
    node.nvml('xid 7 79');
    await node.kubelet!.waitForDevices((d) => d[7]?.health === 'Unhealthy', 'nvidia.com/gpu', 5000);
  } finally {
    await node.stop();
  }
});
