// Dynamic MIG through the executables: the plugin in DRA mode with dra.dynamicMig on a fake node of 16 A100-40GB
// (15 in MIG mode, GPU 0 with one 3g.20gb instance of its own), and beside it the MPS unit's program as the
// sharing agent, which makes the instances. The slices the API-server stand-in stores (and the scheduler would
// use: every counter set and counter consumed exists); a claim for a partition
// prepared (the agent makes the GPU and compute instance through the fake NVML, the claim's spec gets its
// capability nodes) and unprepared (destroyed); a partition shared by MPS (MigDeviceConfig), its claim's control
// daemon serving the MIG UUID made, stopped before the instance is destroyed, also across an agent killed
// mid-make; a placement that is not offered refused by name. The plugin and the agents share one fake GPU state,
// so the plugin's own scan finds the agent's instances, as on a node: a claimed one stays the partition it was
// allocated as, with its MIG device's health, and the instance the package did not make survives every start,
// reload and prepare.
import assert from 'node:assert/strict';
import { existsSync, mkdtempSync, readFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { dirname, join } from 'node:path';
import { after, before, describe, test } from 'node:test';
import { buildFakeMpsControl } from '../fake-nvml/build.ts';
import { HealthStatus } from '../../src/api/dra.ts';
import type { Claim, DeviceHealth } from '../../src/api/dra.ts';
import type { JsonObject } from '../support/apiserver.ts';
import { poolProblems } from '../support/apiserver-counters.ts';
import {
  DRIVER,
  claimOn,
  devicesOf,
  environOf,
  launchOf,
  restartPlugin,
  prepareClaim,
  slicesOf,
  unprepareClaim,
  waitForSlices,
  startDynamicMigNode,
  startSharingAgent,
  stopWithAgent,
} from '../support/dra-node.ts';
import type { DraNode } from '../support/dra-node.ts';
import { PluginProcess, executable } from '../support/sim.ts';
import { onFileChange, waitUntil } from '../support/wait.ts';

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

after(() => stopWithAgent(node, agent, base));

type Spec = { sharedCounters?: { name: string }[]; devices?: { name: string; consumesCounters?: unknown[] }[] };
const specs = (): Spec[] => slicesOf(node.api).map((s) => s.spec as unknown as Spec);

/** A claim allocating `device` (a partition) with a MigDeviceConfig that shares it by MPS, with limits. */
function mpsPartitionClaim(name: string, device: string): Claim {
  const sharing = {
    strategy: 'MPS',
    mpsConfig: { defaultActiveThreadPercentage: 40, defaultPinnedDeviceMemoryLimit: '8Gi' },
  };
  const parameters = { apiVersion: 'resource.nvidia.com/v1beta1', kind: 'MigDeviceConfig', sharing };
  return claimOn(
    node.api,
    name,
    [{ request: 'mig', device }],
    [{ source: 'FromClaim', requests: ['mig'], opaque: { driver: DRIVER, parameters } }],
  );
}

interface CdiEdits {
  devices: { containerEdits: { env: string[] } }[];
}

/**
 * The claim's specs (the partition's MIG UUID, the daemon's pipe) and its control daemon serving that MIG device
 * with the claim's limits (the fake's state in its pipe directory); the claim's MPS root.
 */
function health(devices: readonly DeviceHealth[], name: string): HealthStatus | undefined {
  return devices.find((d) => d.device?.device_name === name)?.health;
}

/** The plugin's DRA checkpoint. */
function checkpointOf(): string {
  return join(node.plugins, DRIVER, 'gpu-device-plugin-checkpoint.json');
}

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
    // Its daemon killed: the partition UNHEALTHY to the kubelet and tainted (the plugin looked at the node again
    // once the instance was made, so it knows the MIG device the daemon serves); back once the agent restarted it.
    await node.sim.plugin.waitForLine(/MIG device found gpu=5 .*profile=3g\.20gb/);
    process.kill(Number(readFileSync(join(claimRoot, 'mps', '.started'), 'utf8').trim()), 'SIGKILL');
    const down = await node.watcher.waitForHealth(DRIVER, (d) => health(d, device) === HealthStatus.UNHEALTHY);
    assert.match(
      down.find((d) => d.device?.device_name === device)?.message ?? '',
      /MPS control daemon of claim team-a\/mig-mps .* does not answer/,
    );
    assert.equal(health(down, 'gpu-5-mig-1g5gb-19-0'), HealthStatus.HEALTHY, 'only the claim’s device');
    await waitForSlices(
      node.api,
      (d) => d.some((x) => x.name === device && (x.taints ?? []).some((t) => t.key === 'gpu.nvidia.com/mps-daemon')),
      'the partition tainted mps-daemon',
    );
    await node.watcher.waitForHealth(DRIVER, (d) => health(d, device) === HealthStatus.HEALTHY, 20_000);
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
    // Claimed partitions do not take placements out of the pool (the scheduler's counters keep them apart), so 4g
    // at 0 is still offered; allocated beside them all the same, the agent refuses it: memory slices 0-3 are taken.
    const overlap = claimOn(node.api, 'mig-overlap', [{ request: 'mig', device: 'gpu-4-mig-4g20gb-5-0' }]);
    const refused = await prepareClaim(node, overlap);
    assert.match(refused.error ?? '', /Insufficient resources \(NVML code 23\)/);
    await unprepareClaim(node, overlap);
    for (const i of [1, 0, 2]) await unprepareClaim(node, claims[i] as (typeof claims)[number]);
  });

  for (const [point, device] of [
    ['create-gpu-instance', 'gpu-3-mig-2g10gb-14-2'],
    ['create-compute-instance', 'gpu-6-mig-3g20gb-9-4'],
  ] as const)
    test(`the agent killed right after ${point}: the next one takes that instance and finishes the claim`, async () => {
      agent.signal('SIGTERM');
      await agent.exited;
      // The GPU's instances outlive the killed process, as on a node.
      const dying = startAgent({ FAKE_NVML_CRASH_AFTER: point });
      await dying.waitForLine(/DRA sharing agent started/);
      const claim = claimOn(node.api, `mig-crash-${point}`, [{ request: 'mig', device }]);
      const pending = prepareClaim(node, claim);
      assert.equal((await dying.exited).code, 137, `killed right after ${point}`);
      // The kubelet's prepare is still waiting for the answer: a new agent (the unit's restart) finds the intent in
      // its state directory and the instance the killed one made at that placement, takes it, and finishes it.
      agent = startAgent();
      const r = await pending;
      assert.equal(r.error, '', r.error);
      assert.equal(r.devices?.[0]?.cdi_device_ids?.length, 2);
      assert.ok(!agent.lines.some((l) => /MIG GPU instance created/.test(l)), 'the instance taken, not made again');
      await unprepareClaim(node, claim);
      await agent.waitForLine(/MIG GPU instance destroyed/);
    });

  test("the plugin's scan finds the agent's instance: the same partition, tainted by its XID", async () => {
    const device = 'gpu-7-mig-3g20gb-9-4';
    const plugin = node.sim.plugin;
    const preparedAt = plugin.lines.length;
    const claim = claimOn(node.api, 'mig-seen', [{ request: 'mig', device }]);
    assert.equal((await prepareClaim(node, claim)).error, '');
    // The plugin looks at the node again once the agent made the instance: it is there, as on a GPU.
    await plugin.waitForLine(/MIG device found gpu=7 .*profile=3g\.20gb .*made or destroyed/, 10_000, preparedAt);
    // A reload (SIGHUP) keeps it the partition. Its scan starts the health thread again: events before are not watched.
    const reloadedAt = plugin.lines.length;
    plugin.signal('SIGHUP');
    await plugin.waitForLine(/looked at the node again reason=reload/, 10_000, reloadedAt);
    await plugin.waitForLine(/watching GPU health/, 10_000, reloadedAt);
    // An XID on the instance (GPU instance 1, compute instance 0 of GPU 7) taints that device, no other of GPU 7.
    // The slices written for it are the pool as the plugin's scans made it.
    node.sim.nvml('xid 7 48 1 0');
    const seen = await waitForSlices(
      node.api,
      (d) => d.some((x) => x.name.startsWith('gpu-7-') && x.taints !== undefined),
      'a device of GPU 7 tainted',
    );
    assert.deepEqual(
      seen.filter((x) => x.name.startsWith('gpu-7-') && x.taints !== undefined).map((x) => x.name),
      [device],
    );
    assert.equal(seen.filter((x) => x.name === device).length, 1, 'published once');
    assert.deepEqual(poolProblems(slicesOf(node.api)), []);
    const published = seen.find((x) => x.name === device) as { consumesCounters?: unknown; attributes: JsonObject };
    assert.ok(published.consumesCounters !== undefined, 'still the partition: its counters stay consumed');
    assert.equal(published.attributes.uuid, undefined, 'not published as a MIG device of its own');
    assert.ok(
      seen.some((x) => x.name === 'gpu-7-mig-7g40gb-0-0'),
      'placements over it stay offered',
    );
    const foreign = seen.find((x) => x.name === 'gpu-0-mig-3g20gb-9-0') as { attributes: JsonObject } | undefined;
    assert.ok(foreign?.attributes.uuid !== undefined, 'the instance the package did not make: a MIG device, still');
    const unpreparedAt = plugin.lines.length;
    await unprepareClaim(node, claim);
    await agent.waitForLine(/MIG GPU instance destroyed/);
    await plugin.waitForLine(/MIG device gone; withdrawn/, 10_000, unpreparedAt);
    // Every start, reload and prepare of this file later: the foreign instance is where it was.
    const from = plugin.lines.length;
    plugin.signal('SIGHUP');
    await plugin.waitForLine(/looked at the node again reason=reload/, 10_000, from);
    const gpu0 = String((foreign.attributes.parentUUID as JsonObject).string);
    const state = readFileSync(join(base, 'mig-state'), 'utf8').split(/^gpu /m);
    const ofGpu0 = state.find((block) => block.startsWith(`${gpu0} `)) ?? '';
    assert.match(ofGpu0, /^gi \d+ 1 9 0 0$/m, "GPU 0's 3g.20gb (profile 9) at slice 0, GPU instance 1: untouched");
    assert.equal(ofGpu0.match(/^gi /gm)?.length, 1, 'and nothing else made there');
  });

  test('the plugin restarted with a prepared dynamic instance: the checkpoint answers, nothing is made', async () => {
    const device = 'gpu-8-mig-2g10gb-14-0';
    const claim = claimOn(node.api, 'mig-kept', [{ request: 'mig', device }]);
    const first = await prepareClaim(node, claim);
    assert.equal(first.error, '', first.error);
    const made = agent.matching(/MIG GPU instance created/).length;
    // Every pool the restarted plugin writes has the instance as the partition, from its first write on.
    const wrong: string[] = [];
    const look = (): void => {
      for (const d of devicesOf(node.api))
        if (d.name === device && d.attributes?.uuid !== undefined) wrong.push(JSON.stringify(d));
    };
    node.api.on('request', look);
    try {
      const regs = node.watcher.registrations.length;
      await restartPlugin(node);
      await node.watcher.waitForRegistrations(regs + 1, 15_000);
      await node.sim.plugin.waitForLine(/prepared DRA claims from the checkpoint.* claims=1 /);
      // The restarted plugin reads the node (the instance is on the GPU) and publishes it.
      await node.sim.plugin.waitForLine(/MIG device found gpu=8 .*profile=2g\.10gb/);
      const again = await prepareClaim(node, claim);
      assert.deepEqual(again, first, 'answered from the checkpoint');
      assert.equal(agent.matching(/MIG GPU instance created/).length, made, 'no instance made again');
      const devices = await waitForSlices(
        node.api,
        (d) => d.some((x) => x.name === device && x.consumesCounters !== undefined),
        'the partition',
      );
      assert.equal(devices.filter((x) => x.name === device).length, 1);
    } finally {
      node.api.off('request', look);
    }
    assert.deepEqual(wrong, [], 'never published as a MIG device of its own');
    await unprepareClaim(node, claim);
    await agent.waitForLine(/MIG GPU instance destroyed.*gpu-8-mig-2g10gb-14-0/);
  });

  test("someone else's re-layout (nvidia-smi mig): its instance published, placements over it withdrawn", async () => {
    const plugin = node.sim.plugin;
    const from = plugin.lines.length;
    node.sim.nvml('mig 9 on 1g.5gb');
    await node.sim.nvmlStats();
    plugin.signal('SIGHUP');
    await plugin.waitForLine(/MIG device found gpu=9 .*profile=1g\.5gb/, 10_000, from);
    // The pool is written slice by slice: waited for until the whole of it is the new layout's.
    const over0 = /^gpu-9-mig-(7g40gb-0|1g5gb-19|2g10gb-14|3g20gb-9|4g20gb-5)-0$/;
    const devices = await waitForSlices(
      node.api,
      (d) =>
        d.some((x) => x.name === 'gpu-9-mig-1g5gb-19-0' && x.attributes?.uuid !== undefined) &&
        !d.some((x) => over0.test(x.name) && x.consumesCounters !== undefined),
      "GPU 9's new instance as a MIG device, nothing over slice 0 offered",
    );
    const ofGpu9 = devices.filter((x) => x.name.startsWith('gpu-9-') && x.consumesCounters !== undefined);
    assert.ok(
      ofGpu9.some((x) => x.name === 'gpu-9-mig-3g20gb-9-4'),
      'the free placements still offered',
    );
    assert.deepEqual(poolProblems(slicesOf(node.api)), []);
    // Its slices are refused by the agent too, which reads the same GPU.
    const claim = claimOn(node.api, 'mig-over', [{ request: 'mig', device: 'gpu-9-mig-7g40gb-0-0' }]);
    assert.match((await prepareClaim(node, claim)).error ?? '', /does not have now/);
  });

  test('an XID on a whole GPU taints every partition of it, and none of another GPU', async () => {
    node.sim.nvml('xid 10 79');
    const devices = await waitForSlices(
      node.api,
      (d) => d.filter((x) => x.name.startsWith('gpu-10-mig-')).every((x) => x.taints !== undefined),
      'every partition of GPU 10 tainted',
    );
    const partitions = devices.filter((x) => x.name.startsWith('gpu-10-mig-'));
    assert.equal(partitions.length, 7 + 4 + 3 + 2 + 1 + 1 + 7, "every profile and placement of GPU 10's");
    // The API server stamps timeAdded.
    for (const x of partitions)
      assert.deepEqual(
        x.taints?.map(({ key, value, effect }) => ({ key, value, effect })),
        [{ key: 'gpu.nvidia.com/xid', value: '79', effect: 'NoSchedule' }],
      );
    assert.ok(devices.filter((x) => x.name.startsWith('gpu-11-mig-')).every((x) => x.taints === undefined));
  });

  test('a process on the instance at unprepare (IN_USE): an error for that claim, which keeps it', async () => {
    const device = 'gpu-12-mig-3g20gb-9-0';
    const claim = claimOn(node.api, 'mig-busy', [{ request: 'mig', device }]);
    assert.equal((await prepareClaim(node, claim)).error, '');
    // A CUDA process on GPU instance 1 of GPU 12: its compute instance cannot be destroyed.
    node.sim.nvml('mig 12 busy 1 1');
    await node.sim.nvmlStats();
    const client = node.watcher.client(DRIVER);
    const refused = (await client.unprepare([claim])).claims?.[claim.uid]?.error ?? '';
    assert.match(
      refused,
      /claim team-a\/mig-busy: its MIG partitions are not destroyed: .*journal says why.*ask again/,
    );
    const why = await agent.waitForLine(/cannot destroy a claim's MIG partitions; trying again/);
    assert.match(why, /In use by another client \(NVML code 19\)/);
    assert.ok(!agent.lines.some((l) => /MIG GPU instance destroyed.*gpu-12-/.test(l)), 'nothing destroyed under it');
    // Still the claim's in the checkpoint, so its instance stays the partition, not someone else's MIG device.
    assert.ok(readFileSync(checkpointOf(), 'utf8').includes(claim.uid), 'kept in the checkpoint');
    node.sim.nvml('mig 12 busy 1 0');
    await agent.waitForLine(/MIG GPU instance destroyed.*gpu-12-mig-3g20gb-9-0/);
    await unprepareClaim(node, claim);
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

  test('the plugin killed before its checkpoint says prepared: the retried prepare takes the instance', async () => {
    // The agent away, so that the plugin's prepare waits on it with the claim recorded PrepareStarted.
    agent.signal('SIGTERM');
    await agent.exited;
    const device = 'gpu-13-mig-4g20gb-5-0';
    const claim = claimOn(node.api, 'mig-plugin-killed', [{ request: 'mig', device }]);
    const old = node.sim.plugin;
    // The kubelet's call dies with the plugin.
    const pending = node.watcher
      .client(DRIVER)
      .prepare([claim])
      .catch(() => undefined);
    await waitUntil(() => existsSync(checkpointOf()) && readFileSync(checkpointOf(), 'utf8').includes(claim.uid), {
      on: onFileChange(dirname(checkpointOf())),
      what: 'the claim recorded PrepareStarted',
    });
    const { args, env } = launchOf(old);
    old.signal('SIGKILL');
    await old.exited;
    await pending;
    // The plugin started again (its checkpoint keeps the claim's request), then the agent: it makes the instance for
    // that request, though nobody waits for it now.
    const regs = node.watcher.registrations.length;
    node.sim.plugin = new PluginProcess(executable(), args, env);
    await node.watcher.waitForRegistrations(regs + 1, 15_000);
    await node.sim.plugin.waitForLine(/prepared DRA claims from the checkpoint/);
    agent = startAgent();
    await agent.waitForLine(/MIG GPU instance created.*gpu-13-mig-4g20gb-5-0/);
    // The kubelet asks again: answered with the instance made, none made again.
    const r = await prepareClaim(node, claim);
    assert.equal(r.error, '', r.error);
    assert.equal(r.devices?.[0]?.cdi_device_ids?.length, 2);
    assert.equal(agent.matching(/MIG GPU instance created.*gpu-13-/).length, 1, 'made once');
    await unprepareClaim(node, claim);
    await agent.waitForLine(/MIG GPU instance destroyed.*gpu-13-mig-4g20gb-5-0/);
  });

  test('a placement that is not offered (it overlaps an instance the package did not make) is refused', async () => {
    const claim = claimOn(node.api, 'mig-4g', [{ request: 'mig', device: 'gpu-0-mig-4g20gb-5-0' }]);
    const r = await prepareClaim(node, claim);
    assert.match(r.error ?? '', /allocates device gpu-0-mig-4g20gb-5-0, which node gpu-node-1 does not have now/);
    assert.match(r.error ?? '', / and \d+ more\)$/, "the node's devices named, not all 400 of them");
  });
});
