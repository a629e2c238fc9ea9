// NodePrepareResources and NodeUnprepareResources latency in DRA mode, per kind of claim, through the built
// executables: the plugin (test/support/dra-node.ts: plugin watcher and API server stand-ins) and the MPS
// unit's program beside it as the sharing agent, with the fake nvidia-smi and nvidia-cuda-mps-control. Each
// round creates a claim, times prepare (the kubelet stand-in's call: read the claim, check it, the durable
// checkpoint written twice, and for a shared claim the agent's answer) and unprepare, one claim at a time:
//   plain          one whole GPU, no sharing config: the floor the others are compared with
//   time-sliced    GpuConfig TimeSlicing Long: the agent runs nvidia-smi (once per prepare, Default back
//                  at unprepare)
//   MPS            GpuConfig MPS with limits: the agent starts the claim's control daemon (its shm
//                  mounted, limits set) and stops it at unprepare
import { mkdtempSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import type { Claim } from '../../src/api/dra.ts';
import { buildFakeMpsControl, buildFakeNvidiaSmi } from '../fake-nvml/build.ts';
import type { JsonObject } from '../support/apiserver.ts';
import { DRIVER, NODE, startDraNode, startSharingAgent, stopWithAgent } from '../support/dra-node.ts';
import { r2, stats } from './stats.ts';

type Kind = 'plain' | 'time-sliced' | 'MPS';

const SHARING: Record<Kind, JsonObject | null> = {
  plain: null,
  'time-sliced': { strategy: 'TimeSlicing', timeSlicingConfig: { interval: 'Long' } },
  MPS: { strategy: 'MPS', mpsConfig: { defaultActiveThreadPercentage: 50, defaultPinnedDeviceMemoryLimit: '8Gi' } },
};

export async function draPrepareLatency(rounds: number): Promise<Record<string, unknown>> {
  const [mpsDir, smiDir] = await Promise.all([buildFakeMpsControl(), buildFakeNvidiaSmi()]);
  const base = mkdtempSync(join(tmpdir(), 'gdp-bench-dra-'));
  const mpsRoot = join(base, 'mps');
  const node = await startDraNode({
    args: [`--mps-root=${mpsRoot}`],
    env: {
      PATH: `${mpsDir}:${smiDir}:${process.env.PATH ?? ''}`,
      FAKE_NVIDIA_SMI_STATE: join(base, 'nvidia-smi.json'),
    },
  });
  const agent = startSharingAgent(node, join(base, 'agent-state'));
  try {
    await agent.waitForLine(/DRA sharing agent started/);
    const client = node.watcher.client(DRIVER);
    const prepare: Record<Kind, number[]> = { plain: [], 'time-sliced': [], MPS: [] };
    const unprepare: Record<Kind, number[]> = { plain: [], 'time-sliced': [], MPS: [] };
    for (let i = 0; i < rounds; i++) {
      for (const kind of Object.keys(SHARING) as Kind[]) {
        const sharing = SHARING[kind];
        const name = `${kind.toLowerCase()}-${i}`;
        const stored = node.api.putClaim({
          namespace: 'bench',
          name,
          status: {
            allocation: {
              devices: {
                results: [{ request: 'gpu', driver: DRIVER, pool: NODE, device: `gpu-${i % 8}` }],
                ...(sharing === null
                  ? {}
                  : {
                      config: [
                        {
                          source: 'FromClaim',
                          opaque: {
                            driver: DRIVER,
                            parameters: { apiVersion: 'resource.nvidia.com/v1beta1', kind: 'GpuConfig', sharing },
                          },
                        },
                      ],
                    }),
              },
            },
          },
        });
        const claim: Claim = { namespace: 'bench', name, uid: String((stored.metadata as JsonObject).uid) };
        let t = performance.now();
        const r = await client.prepare([claim]);
        prepare[kind].push(performance.now() - t);
        const error = r.claims?.[claim.uid]?.error ?? 'no answer';
        if (error !== '') throw new Error(`prepare ${kind}: ${error}`);
        t = performance.now();
        await client.unprepare([claim]);
        unprepare[kind].push(performance.now() - t);
      }
    }
    const floor = stats(prepare.plain).p50;
    const out: Record<string, unknown> = {};
    for (const kind of Object.keys(SHARING) as Kind[]) {
      const p = stats(prepare[kind]);
      out[kind] = {
        prepare_ms: p,
        unprepare_ms: stats(unprepare[kind]),
        prepare_p50_vs_plain: r2(p.p50 / floor),
      };
    }
    return { dra_prepare: out, checkpoint_durable: true, rounds };
  } finally {
    await stopWithAgent(node, agent, base);
  }
}

if (import.meta.main) {
  const rounds = Number(process.argv[2] ?? 50);
  process.stdout.write(`${JSON.stringify(await draPrepareLatency(rounds), null, 2)}\n`);
}
