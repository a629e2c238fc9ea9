// MIG figures for npm run bench (also runnable alone: node test/bench/mig.bench.ts, after npm run
// build), on the mixed fixture: XID naming one MIG device → that device Unhealthy at the kubelet
// (recovery on, so every round starts healthy); a re-layout of one GPU (FIFO, then SIGHUP) → the new
// lists at the kubelet. Prints one JSON object on stdout.
import { SimNode } from '../support/sim.ts';
import { stats } from './stats.ts';

export async function migXidLatency(rounds: number): Promise<Record<string, unknown>> {
  const node = await SimNode.start({
    topology: 'mig-mixed-4',
    args: [
      '--mig-strategy=mixed',
      '--health-recovery',
      '--health-recovery-quiet-period=0.05',
      '--health-probe-interval=0.05',
    ],
    waitRegistered: false,
  });
  try {
    const k = node.kubelet!;
    const resource = 'nvidia.com/mig-1g.10gb';
    await k.waitForRegistrations(6, 15000);
    await node.plugin.waitForLine(/watching GPU health/);
    await k.waitForDevices((d) => d.length === 4, resource);
    const lat: number[] = [];
    for (let i = 0; i < rounds; i++) {
      const m = i % 2; // the two 1g.10gb devices of GPU 0: GI 1 and GI 2
      const t0 = performance.now();
      node.nvml(`xid 0 94 ${m + 1} 0`);
      await k.waitForDevices((d) => d[m]?.health === 'Unhealthy', resource);
      lat.push(performance.now() - t0);
      await k.waitForDevices((d) => d[m]?.health === 'Healthy', resource);
    }
    return { mig_xid_to_unhealthy_at_kubelet_ms: stats(lat) };
  } finally {
    await node.stop();
  }
}

export async function migRelayoutLatency(rounds: number): Promise<Record<string, unknown>> {
  const node = await SimNode.start({ topology: 'mig-mixed-4', args: ['--mig-strategy=mixed'], waitRegistered: false });
  try {
    const k = node.kubelet!;
    await k.waitForRegistrations(6, 15000);
    const lat: number[] = [];
    for (let i = 0; i < rounds; i++) {
      // GPU 1 alternates between one 7g.80gb and its fixture layout.
      const seven = i % 2 === 0;
      // The re-layout lands at a spread of points in the health thread's 200 ms event wait (a
      // rescan stops the thread once that wait returns); each round would otherwise land at the same point.
      await new Promise((r) => setTimeout(r, ((i * 0.6180339887) % 1) * 250));
      const t0 = performance.now();
      node.nvml(seven ? 'mig 1 on 7g.80gb' : 'mig 1 on 3g.40gb 1g.20gb 1g.10gb 1g.10gb');
      await node.nvmlStats();
      node.plugin.signal('SIGHUP');
      await k.waitForDevices((d) => d.length === (seven ? 2 : 4), 'nvidia.com/mig-1g.10gb', 10000);
      await k.waitForDevices((d) => d.length === 1, seven ? 'nvidia.com/mig-7g.80gb' : 'nvidia.com/mig-3g.40gb', 10000);
      lat.push(performance.now() - t0);
    }
    return { mig_relayout_to_new_lists_ms: stats(lat) };
  } finally {
    await node.stop();
  }
}

if (import.meta.url === `file://${process.argv[1]}`) {
  process.stdout.write(
    `${JSON.stringify({ ...(await migXidLatency(200)), ...(await migRelayoutLatency(20)) }, null, 2)}\n`,
  );
}
