// How fast DRA mode's ResourceSlices come back, through the built executable (test/support/dra-node.ts:
// the plugin watcher and API server stand-ins, faults injected with apiserver-faults.ts):
//   wipe → back, 0 failed    the kubelet restarts and wipes the node's slices; the plugin republishes
//   wipe → back, 1 failed    the same with the next slice request reset (goal: the backoff, 1 s, + 1 s)
//   wipe → back, 3 failed    the same with the next three answered 503 (backoff 1 + 2 + 4 s, + 1 s)
//   delete → restored        another client deletes the slice; the plugin's watch writes it back
// Medians over the rounds; the goals are printed beside them. `node test/bench/dra-slices.bench.ts [rounds]`.
import type { FaultAction } from '../support/apiserver-faults.ts';
import type { DraNode } from '../support/dra-node.ts';
import { NODE, slicesOf, startDraNode, waitForSlices } from '../support/dra-node.ts';
import type { JsonObject } from '../support/apiserver.ts';
import { PluginWatcherStandIn } from '../support/plugin-watcher.ts';
import { r2, stats } from './stats.ts';

const SLICES = '/apis/resource.k8s.io/v1/resourceslices';

async function wipeToBack(node: DraNode, failed: number, action: FaultAction | undefined): Promise<number> {
  await node.watcher.stop();
  if (action !== undefined) node.api.fault({ method: 'GET', path: SLICES, times: failed, action });
  const t0 = performance.now();
  node.watcher = await PluginWatcherStandIn.start(node.registry, {
    slices: { janitor: node.api, nodeName: NODE, wipeDelayMs: 60_000 },
  });
  await waitForSlices(node.api, (d) => d.length === 8, 'back after the wipe', 60_000);
  const ms = performance.now() - t0;
  node.api.clearFaults();
  return ms;
}

async function deleteToRestored(node: DraNode): Promise<number> {
  const name = String((slicesOf(node.api)[0]?.metadata as JsonObject | undefined)?.name);
  const t0 = performance.now();
  node.api.removeSlice(name);
  await waitForSlices(node.api, (d) => d.length === 8, 'restored', 60_000);
  return performance.now() - t0;
}

export async function draSliceRecovery(rounds: number): Promise<Record<string, unknown>> {
  const node = await startDraNode();
  const times: Record<string, number[]> = { wipe0: [], wipe1: [], wipe3: [], deleted: [] };
  try {
    await waitForSlices(node.api, (d) => d.length === 8, 'published');
    for (let i = 0; i < rounds; i++) {
      times.wipe0?.push(await wipeToBack(node, 0, undefined));
      times.wipe1?.push(await wipeToBack(node, 1, { kind: 'reset' }));
      times.wipe3?.push(await wipeToBack(node, 3, { kind: 'status', code: 503 }));
      times.deleted?.push(await deleteToRestored(node));
    }
  } finally {
    await node.stop();
  }
  const s = (k: string) => stats(times[k] ?? []);
  return {
    dra_slices_ms: {
      wipe_to_back_0_failed: { ...s('wipe0'), goal: '≤ 1000' },
      wipe_to_back_1_failed: { ...s('wipe1'), goal: '≤ 2000 (backoff 1 s + 1 s)' },
      wipe_to_back_3_failed: { ...s('wipe3'), goal: '≤ 8000 (backoff 1 + 2 + 4 s + 1 s)' },
      delete_to_restored: { ...s('deleted'), goal: '≤ 5000' },
      all_ms: Object.fromEntries(Object.entries(times).map(([k, v]) => [k, v.map(r2)])),
    },
  };
}

if (import.meta.main) {
  const rounds = Number(process.argv[2] ?? 7);
  process.stdout.write(`${JSON.stringify(await draSliceRecovery(rounds), null, 2)}\n`);
}
