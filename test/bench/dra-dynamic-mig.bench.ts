// NodePrepareResources and NodeUnprepareResources of a dynamic MIG claim beside a plain one, through the built
// executables: the plugin in DRA mode with dra.dynamicMig on the fake 16×A100-40GB node (GPU 1 not in MIG mode)
// and the MPS unit's program as the agent that makes and destroys the instances through the fake NVML. Rounds
// alternate a claim for the whole GPU 1 (the floor) and one for a 1g.5gb partition of GPU 2 (made at prepare:
// intent recorded, GPU instance, compute instance, MIG device read back, CDI spec; destroyed at unprepare).
// `node test/bench/dra-dynamic-mig.bench.ts [rounds]`.
import { mkdtempSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { buildFakeMpsControl } from '../fake-nvml/build.ts';
import {
  DRIVER,
  claimOn,
  waitForSlices,
  startDynamicMigNode,
  startSharingAgent,
  stopWithAgent,
} from '../support/dra-node.ts';
import { r2, stats } from './stats.ts';

export async function draDynamicMigLatency(rounds: number): Promise<Record<string, unknown>> {
  const mpsDir = await buildFakeMpsControl();
  const base = mkdtempSync(join(tmpdir(), 'gdp-bench-dynmig-'));
  const node = await startDynamicMigNode(base, 'mig-dynamic-16', 16, mpsDir);
  const agent = startSharingAgent(node, join(base, 'agent-state'));
  try {
    await agent.waitForLine(/DRA sharing agent started/);
    await waitForSlices(node.api, (d) => d.some((x) => x.name === 'gpu-2-mig-1g5gb-19-0'), 'with partitions');
    const client = node.watcher.client(DRIVER);
    const times = {
      plain: [] as number[],
      dynamic: [] as number[],
      plainEnd: [] as number[],
      dynamicEnd: [] as number[],
    };
    for (let i = 0; i < rounds; i++) {
      for (const kind of ['plain', 'dynamic'] as const) {
        const device = kind === 'plain' ? 'gpu-1' : `gpu-2-mig-1g5gb-19-${i % 7}`;
        const claim = claimOn(node.api, `${kind}-${i}`, [{ request: 'gpu', device }]);
        let t = performance.now();
        const r = await client.prepare([claim]);
        times[kind].push(performance.now() - t);
        const error = r.claims?.[claim.uid]?.error ?? 'no answer';
        if (error !== '') throw new Error(`prepare ${kind}: ${error}`);
        t = performance.now();
        await client.unprepare([claim]);
        times[kind === 'plain' ? 'plainEnd' : 'dynamicEnd'].push(performance.now() - t);
      }
    }
    const floor = stats(times.plain).p50;
    return {
      dra_dynamic_mig: {
        plain: { prepare_ms: stats(times.plain), unprepare_ms: stats(times.plainEnd) },
        dynamic_mig: {
          prepare_ms: stats(times.dynamic),
          unprepare_ms: stats(times.dynamicEnd),
          prepare_p50_vs_plain: r2(stats(times.dynamic).p50 / floor),
        },
      },
      rounds,
    };
  } finally {
    await stopWithAgent(node, agent, base);
  }
}

if (import.meta.main) {
  const rounds = Number(process.argv[2] ?? 50);
  process.stdout.write(`${JSON.stringify(await draDynamicMigLatency(rounds), null, 2)}\n`);
}
