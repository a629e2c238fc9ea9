// Dynamic MIG through the executables: the plugin in DRA mode with dra.dynamicMig on a fake node of 16 A100-40GB
// (15 in MIG mode, GPU 0 with one 3g.20gb instance of its own), and beside it the MPS unit's program as the
// sharing agent, which makes the instances. The slices the API-server stand-in stores (and the scheduler would
// use: every counter set and counter consumed exists); a claim for a partition
// prepared (the agent makes the GPU and compute instance through the fake NVML, the claim's spec gets its
// capability nodes) and unprepared (destroyed); a partition shared by MPS (MigDeviceConfig), its claim's control
// daemon serving the MIG UUID made, stopped before the instance is destroyed, also across an agent killed
// mid-make; a placement that is not offered refused by name. The fake NVML
// keeps its instances per process: the plugin's own scan does not see the agent's instance.
import assert from 'node:assert/strict';
import { existsSync, mkdtempSync, readFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { after, before, describe, test } from 'node:test';
import { buildFakeMpsControl } from '../fake-nvml/build.ts';
import type { Claim } from '../../src/api/dra.ts';
import type { JsonObject } from '../support/apiserver.ts';
import { poolProblems } from '../support/apiserver-counters.ts';
import {
  DRIVER,
  NODE,
  claimOn,
  environOf,
  prepareClaim,
  slicesOf,
  unprepareClaim,
  waitForSlices,
  startDynamicMigNode,
  startSharingAgent,
} from '../support/dra-node.ts';
import type { DraNode } from '../support/dra-node.ts';
import { unmountUnder } from '../support/mounts.ts';
import type { PluginProcess } from '../support/sim.ts';

let base = '';
let node: DraNode;
let agent: PluginProcess;

/** The MPS unit's program as the sharing agent, with `env` in its environment. */
function startAgent(env: Record<string, string> = {}): PluginProcess {
  return startSharingAgent(node, join(base, 'agent-state'), { env });
}

before(async () => {
  const mpsDir = await buildFakeMpsControl();
  base = mkdtempSync(join(tmpdir(), 'gdp-dra-dynmig-'));
  node = await startDynamicMigNode(base, 'mig-dynamic-16', 16, mpsDir);
  agent = startAgent();
  await agent.waitForLine(/DRA sharing agent started/);
});

after(async () => {
  agent?.signal('SIGTERM');
  await agent?.exited;
  await node?.stop();
  unmountUnder(base);
  rmSync(base, { recursive: true, force: true });
});

type Spec = { sharedCounters?: { name: string }[]; devices?: { name: string; consumesCounters?: unknown[] }[] };
const specs = (): Spec[] => slicesOf(node.api).map((s) => s.spec as unknown as Spec);

/** A claim allocating `device` (a partition) with a MigDeviceConfig that shares it by MPS, with limits. */
function mpsPartitionClaim(name: string, device: string): Claim {
  const sharing = {
    strategy: 'MPS',
    mpsConfig: { defaultActiveThreadPercentage: 40, defaultPinnedDeviceMemoryLimit: '8Gi' },
  };
  const parameters = { apiVersion: 'resource.nvidia.com/v1beta1', kind: 'MigDeviceConfig', sharing };
  const stored = node.api.putClaim({
    namespace: 'team-a',
    name,
    status: {
      allocation: {
        devices: {
          results: [{ request: 'mig', driver: DRIVER, pool: NODE, device }],
          config: [{ source: 'FromClaim', requests: ['mig'], opaque: { driver: DRIVER, parameters } }],
        },
      },
    },
  });
  return { namespace: 'team-a', name, uid: String((stored.metadata as JsonObject).uid) };
}

interface CdiEdits {
  devices: { containerEdits: { env: string[] } }[];
}

/**
 * The claim's specs (the partition's MIG UUID, the daemon's pipe) and its control daemon serving that MIG device
 * with the claim's limits (the fake's state in its pipe directory); the claim's MPS root.
 */
function assertDaemonForPartition(uid: string): string {
  const spec = (file: string) => JSON.parse(readFileSync(join(node.cdi, file), 'utf8')) as CdiEdits;
  const visible = String(spec(`gpu-device-plugin-claim-${uid}-mig.json`).devices[0]?.containerEdits.env[0]);
  assert.match(visible, /^CUDA_VISIBLE_DEVICES=MIG-/);
  const mpsEnv = spec(`gpu-device-plugin-claim-${uid}.json`).devices[0]?.containerEdits.env;
  assert.deepEqual(mpsEnv, [`CUDA_MPS_PIPE_DIRECTORY=/mps/${uid}/pipe`]);
  const claimRoot = join(base, 'mps', 'dra', 'claims', uid);
  const pid = Number(readFileSync(join(claimRoot, 'mps', '.started'), 'utf8').trim());
  assert.equal(environOf(pid).CUDA_VISIBLE_DEVICES, visible.slice('CUDA_VISIBLE_DEVICES='.length));
  const state = JSON.parse(readFileSync(join(claimRoot, 'mps', 'pipe', 'fake-mps-state.json'), 'utf8')) as {
    defaultActiveThreadPercentage?: unknown;
    pinnedMemLimitMiB?: unknown;
  };
  assert.deepEqual([state.defaultActiveThreadPercentage, state.pinnedMemLimitMiB], [40, { '0': 8192 }]);
  return claimRoot;
}

describe('dynamic MIG under DRA, through the executables', { concurrency: false }, () => {
  test('16 GPUs: 15 counter sets in two slices of their own, partitions of the free placements beside', async () => {
    // The whole pool written: as many slices as each says there are, the partitions among them.
    const complete = (): boolean => {
      const all = slicesOf(node.api);
      const count = (x: JsonObject): unknown => ((x.spec as JsonObject).pool as JsonObject).resourceSliceCount;
      return all.length > 0 && all.every((x) => count(x) === all.length);
    };
    await waitForSlices(node.api, (d) => d.some((x) => x.name === 'gpu-2-mig-3g20gb-9-4') && complete(), 'complete');
    const counterSlices = specs().filter((s) => s.sharedCounters !== undefined);
    assert.deepEqual(counterSlices.map((s) => s.sharedCounters?.length).sort(), [7, 8]);
    assert.ok(
      counterSlices.every((s) => s.devices === undefined || s.devices.length === 0),
      'no devices beside',
    );
    const devices = specs().flatMap((s) => s.devices ?? []);
    const partition = devices.find((d) => d.name === 'gpu-2-mig-3g20gb-9-4');
    assert.ok(partition?.consumesCounters !== undefined, 'it consumes its counters');
    assert.ok(
      !devices.some((d) => d.name === 'gpu-0-mig-4g20gb-5-0'),
      'overlapping the existing instance: not offered',
    );
    const counts = slicesOf(node.api).map((s) => ((s.spec as JsonObject).pool as JsonObject).resourceSliceCount);
    assert.equal(new Set(counts).size, 1, 'one resourceSliceCount');
    assert.equal(counts[0], slicesOf(node.api).length);
    assert.deepEqual(poolProblems(slicesOf(node.api)), [], 'a pool the scheduler uses: every counter consumed exists');
  });

  test('a partition claim: made by the agent at prepare, with its capability nodes; gone at unprepare', async () => {
    const claim = claimOn(node.api, 'mig-3g', [{ request: 'mig', device: 'gpu-2-mig-3g20gb-9-4' }]);
    const r = await prepareClaim(node, claim);
    assert.equal(r.error, '', r.error);
    const ids = r.devices?.[0]?.cdi_device_ids ?? [];
    assert.deepEqual(ids, ['nvidia.com/gpu=2', `k8s.gpu-device-plugin/claim=${claim.uid}-gpu-2-mig-3g20gb-9-4`]);
    const specFile = join(node.cdi, `gpu-device-plugin-claim-${claim.uid}-mig.json`);
    const spec = JSON.parse(readFileSync(specFile, 'utf8')) as {
      devices: { containerEdits: { env: string[]; deviceNodes: { path: string; major: number }[] } }[];
    };
    const edits = spec.devices[0]?.containerEdits;
    assert.match(edits?.env[0] ?? '', /^CUDA_VISIBLE_DEVICES=MIG-/);
    assert.deepEqual(
      edits?.deviceNodes.map((n) => n.major),
      [236, 236],
    );
    await agent.waitForLine(/MIG GPU instance created/);
    await unprepareClaim(node, claim);
    assert.equal(existsSync(specFile), false, 'its spec removed');
    await agent.waitForLine(/MIG GPU instance destroyed/);
  });

  test('a partition shared by MPS (MigDeviceConfig): a daemon for its MIG UUID, stopped before it goes', async () => {
    const device = 'gpu-5-mig-3g20gb-9-4';
    const claim = mpsPartitionClaim('mig-mps', device);
    const r = await prepareClaim(node, claim);
    assert.equal(r.error, '', r.error);
    // The parent GPU, the partition's capability nodes, and the claim's MPS daemon: pipe and shm.
    assert.deepEqual(r.devices?.[0]?.cdi_device_ids, [
      'nvidia.com/gpu=5',
      `k8s.gpu-device-plugin/claim=${claim.uid}-${device}`,
      `k8s.gpu-device-plugin/claim=${claim.uid}`,
    ]);
    const claimRoot = assertDaemonForPartition(claim.uid);
    assert.deepEqual(agent.matching(/compute mode set/), [], 'a MIG device has no compute mode');
    // Unprepared: the daemon stopped first, then the instance destroyed (it is IN_USE while a daemon holds it).
    const from = agent.lines.length;
    await unprepareClaim(node, claim);
    const stopped = await agent.waitForLine(new RegExp(`MPS control daemon stopped.*${claim.uid}`), 10_000, from);
    const destroyed = await agent.waitForLine(new RegExp(`MIG GPU instance destroyed.*${claim.uid}`), 10_000, from);
    assert.ok(agent.lines.indexOf(stopped) < agent.lines.indexOf(destroyed), 'the daemon stopped before');
    assert.equal(existsSync(claimRoot), false, "the claim's MPS directory removed");
    assert.equal(existsSync(join(node.cdi, `gpu-device-plugin-claim-${claim.uid}.json`)), false, 'its MPS spec gone');
  });

  test('three profiles carved from one GPU side by side, unprepared in another order; an overlap refused', async () => {
    const names = ['gpu-4-mig-3g20gb-9-4', 'gpu-4-mig-2g10gb-14-0', 'gpu-4-mig-1g5gb-19-2'];
    const claims = names.map((device, i) => claimOn(node.api, `mig-side-${i}`, [{ request: 'mig', device }]));
    for (const c of claims) assert.equal((await prepareClaim(node, c)).error, '', c.name);
    // The plugin's own scan does not see the agent's instances (the fake's live in its process), so it still
    // offers 4g at 0; the agent, which does, refuses it: memory slices 0-3 are taken.
    const overlap = claimOn(node.api, 'mig-overlap', [{ request: 'mig', device: 'gpu-4-mig-4g20gb-5-0' }]);
    const refused = await prepareClaim(node, overlap);
    assert.match(refused.error ?? '', /Insufficient resources \(NVML code 23\)/);
    await unprepareClaim(node, overlap);
    for (const i of [1, 0, 2]) await unprepareClaim(node, claims[i] as (typeof claims)[number]);
  });

  test('the agent killed right after making the GPU instance: the next one finishes the claim', async () => {
    agent.signal('SIGTERM');
    await agent.exited;
    // The GPU's instances outlive the killed process, as on a node (the fake keeps them in this file).
    const gpuState = { FAKE_NVML_MIG_STATE: join(base, 'mig-state') };
    const dying = startAgent({ ...gpuState, FAKE_NVML_CRASH_AFTER: 'create-gpu-instance' });
    await dying.waitForLine(/DRA sharing agent started/);
    const claim = claimOn(node.api, 'mig-crash', [{ request: 'mig', device: 'gpu-3-mig-2g10gb-14-2' }]);
    const pending = prepareClaim(node, claim);
    assert.equal((await dying.exited).code, 137, 'killed between the GPU instance and its record');
    // The kubelet's prepare is still waiting for the answer: a new agent (the unit's restart) finds the intent in
    // its state directory and the instance the killed one made at that placement, takes it, and finishes it.
    agent = startAgent(gpuState);
    const r = await pending;
    assert.equal(r.error, '', r.error);
    assert.equal(r.devices?.[0]?.cdi_device_ids?.length, 2);
    assert.ok(!agent.lines.some((l) => /MIG GPU instance created/.test(l)), 'the instance taken, not made again');
    await unprepareClaim(node, claim);
    await agent.waitForLine(/MIG GPU instance destroyed/);
  });

  test('MPS on a partition, the agent killed after the compute instance: the next one finishes it', async () => {
    agent.signal('SIGTERM');
    await agent.exited;
    const gpuState = { FAKE_NVML_MIG_STATE: join(base, 'mig-state') };
    const dying = startAgent({ ...gpuState, FAKE_NVML_CRASH_AFTER: 'create-compute-instance' });
    await dying.waitForLine(/DRA sharing agent started/);
    const claim = mpsPartitionClaim('mig-mps-crash', 'gpu-6-mig-2g10gb-14-2');
    const pending = prepareClaim(node, claim);
    assert.equal((await dying.exited).code, 137, 'killed between the compute instance and its record');
    assert.equal(existsSync(join(base, 'mps', 'dra', 'claims', claim.uid, 'mps', '.started')), false, 'no daemon yet');
    agent = startAgent(gpuState);
    const r = await pending;
    assert.equal(r.error, '', r.error);
    assert.equal(r.devices?.[0]?.cdi_device_ids?.length, 3, 'the GPU, the partition, the daemon');
    assert.ok(!agent.lines.some((l) => /MIG GPU instance created/.test(l)), 'the instance taken, not made again');
    const claimRoot = assertDaemonForPartition(claim.uid);
    await unprepareClaim(node, claim);
    await agent.waitForLine(new RegExp(`MIG GPU instance destroyed.*${claim.uid}`));
    assert.equal(existsSync(claimRoot), false, "the claim's MPS directory removed");
  });

  test('a placement that is not offered (it overlaps an instance the package did not make) is refused', async () => {
    const claim = claimOn(node.api, 'mig-4g', [{ request: 'mig', device: 'gpu-0-mig-4g20gb-5-0' }]);
    const r = await prepareClaim(node, claim);
    assert.match(r.error ?? '', /allocates device gpu-0-mig-4g20gb-5-0, which node gpu-node-1 does not have now/);
    assert.match(r.error ?? '', / and \d+ more\)$/, "the node's devices named, not all 400 of them");
  });
});
