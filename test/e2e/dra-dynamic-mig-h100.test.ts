// Dynamic MIG through the executables on a fake H100 node (2× H100 80GB HBM3 in MIG mode, GPU 1 with two 1g.10gb
// instances of its own): the H100's profiles and placements as NVML gives them — 1g.20gb (profile 15) at
// memory slices 0, 2, 4, 6 — a 1g.20gb partition prepared and unprepared through the agent, and the foreign
// instances still there and published as MIG devices after it; three profiles side by side on the bare GPU,
// unprepared in another order.
import assert from 'node:assert/strict';
import { mkdtempSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { after, before, test } from 'node:test';
import { buildFakeMpsControl } from '../fake-nvml/build.ts';
import { poolProblems } from '../support/apiserver-counters.ts';
import {
  claimOn,
  devicesOf,
  prepareClaim,
  slicesOf,
  unprepareClaim,
  waitForSlices,
  startDynamicMigNode,
  startSharingAgent,
  stopWithAgent,
} from '../support/dra-node.ts';
import type { DraNode } from '../support/dra-node.ts';
import type { PluginProcess } from '../support/sim.ts';

let base = '';
let node: DraNode;
let agent: PluginProcess;

before(async () => {
  const mpsDir = await buildFakeMpsControl();
  base = mkdtempSync(join(tmpdir(), 'gdp-dra-h100-'));
  node = await startDynamicMigNode(base, 'mig-dynamic-h100-2', 2, mpsDir);
  agent = startSharingAgent(node, join(base, 'agent-state'));
  await agent.waitForLine(/DRA sharing agent started/);
});

after(() => stopWithAgent(node, agent, base));

test('H100: 1g.20gb offered at 0, 2, 4, 6 on a bare GPU; beside the foreign 1g.10gb pair at 2, 4, 6', async () => {
  const devices = await waitForSlices(node.api, (d) => d.some((x) => x.name.startsWith('gpu-0-mig-')), 'published');
  const names = devices.map((d) => d.name);
  const starts = (gpu: number) =>
    names.filter((n) => n.startsWith(`gpu-${gpu}-mig-1g20gb-15-`)).map((n) => Number(n.split('-').at(-1)));
  assert.deepEqual(starts(0), [0, 2, 4, 6]);
  assert.deepEqual(starts(1), [2, 4, 6]);
  assert.ok(names.includes('gpu-1-mig-1g10gb-19-0') && names.includes('gpu-1-mig-1g10gb-19-1'), 'foreign: MIG devices');
});

test('H100: a 1g.20gb partition beside the foreign instances, prepared and unprepared; they stay', async () => {
  const claim = claimOn(node.api, 'h100-1g20gb', [{ request: 'mig', device: 'gpu-1-mig-1g20gb-15-6' }]);
  const r = await prepareClaim(node, claim);
  assert.equal(r.error, '', r.error);
  await agent.waitForLine(/MIG GPU instance created/);
  await unprepareClaim(node, claim);
  await agent.waitForLine(/MIG GPU instance destroyed/);
  assert.ok(!agent.lines.some((l) => /destroyed/.test(l) && /gi=[12]\b/.test(l)), 'the foreign instances untouched');
  const names = devicesOf(node.api).map((d) => d.name);
  assert.ok(names.includes('gpu-1-mig-1g10gb-19-0') && names.includes('gpu-1-mig-1g10gb-19-1'));
});

test('H100: 3g.40gb, 2g.20gb and 1g.20gb carved side by side on one GPU, unprepared in another order', async () => {
  const names = ['gpu-0-mig-3g40gb-9-4', 'gpu-0-mig-2g20gb-14-0', 'gpu-0-mig-1g20gb-15-2'];
  const claims = names.map((device, i) => claimOn(node.api, `h100-side-${i}`, [{ request: 'mig', device }]));
  for (const c of claims) assert.equal((await prepareClaim(node, c)).error, '', c.name);
  assert.equal(agent.matching(/MIG GPU instance created.*gpu-0-mig-/).length, 3);
  // Once the plugin has looked at the node again, the three stay their partitions in a pool that validates.
  await node.sim.plugin.waitForLine(/MIG device found gpu=0 .*profile=1g\.20gb/);
  const devices = await waitForSlices(node.api, () => poolProblems(slicesOf(node.api)).length === 0, 'valid');
  for (const n of names) assert.equal(devices.filter((d) => d.name === n && d.consumesCounters).length, 1, n);
  for (const i of [1, 2, 0]) await unprepareClaim(node, claims[i] as (typeof claims)[number]);
  assert.equal(agent.matching(/MIG GPU instance destroyed.*gpu-0-mig-/).length, 3);
  assert.ok(!agent.lines.some((l) => /destroyed/.test(l) && /gpu-1-mig-1g10gb/.test(l)), 'the foreign ones untouched');
});
