// Dynamic MIG in the node's pool (core/dra-partitions.ts through poolContent) on what the fake NVML really gives:
// 16 A100-40GB, 15 of them in MIG mode, GPU 0 with one 3g.20gb instance at memory slices 0-3. Counter sets in
// slices of their own, at most 8 each; one partition device per profile and placement free beside the existing
// instance, consuming its counters and memory slices; the MIG-disabled GPU whole; nothing of it when off; an
// instance a claim holds published as its partition, not as a MIG device.
import assert from 'node:assert/strict';
import { before, test } from 'node:test';
import { poolContent } from '../../src/core/dra-slices.ts';
import { NO_SHARING } from '../../src/core/sharing.ts';
import { PoolSource } from '../../src/dra/pool-source.ts';
import { createLogger } from '../../src/system/log.ts';
import { withClaimedPartitions, withHealth } from '../../src/core/snapshot.ts';
import { diff } from '../../src/core/snapshot-diff.ts';
import { deviceHealthList } from '../../src/core/dra-health.ts';
import { publishedDevices } from '../../src/dra/kubelet-plugin.ts';
import type { NodeSnapshot } from '../../src/core/snapshot.ts';
import { freshHealthState } from '../../src/core/health-tracker.ts';
import { fixtureSnapshot } from '../support/node-scan.ts';

let s: NodeSnapshot;
before(async () => {
  s = await fixtureSnapshot('mig-dynamic-16.json', 'mixed');
});

const settings = () => ({ nodeName: 'node-16', migStrategy: 'mixed' as const });

test('NVML gives each MIG-mode GPU its profiles with placements in memory slices, and its GPU instances', () => {
  const p = s.mig.partitionable;
  assert.ok(p !== undefined);
  assert.equal(p.size, 15, 'the MIG-disabled GPU has none');
  const gpu0 = p.get(s.gpus[0]?.uuid ?? '');
  assert.deepEqual(gpu0?.instances, [{ giId: 1, profileId: 9, placement: { start: 0, size: 4 } }]);
  const threeG = gpu0?.profiles.find((x) => x.id === 9);
  assert.deepEqual(threeG?.placements, [
    { start: 0, size: 4 },
    { start: 4, size: 4 },
  ]);
  assert.equal(threeG?.name, '3g.20gb');
  assert.deepEqual(
    gpu0?.profiles.map((x) => `${x.name}:${x.id}`),
    ['1g.5gb:19', '2g.10gb:14', '3g.20gb:9', '4g.20gb:5', '7g.40gb:0', '1g.5gb+me:20', '1g.10gb:15'],
  );
});

test('off: no counter sets and no partition devices', () => {
  const c = poolContent(s, settings());
  assert.equal(c.counterSets, undefined);
  assert.ok(!c.slices.flat().some((d) => d.consumesCounters !== undefined));
});

test('on: 15 counter sets in 2 slices (8 + 7); partitions only where the memory slices are free', () => {
  const c = poolContent(s, { ...settings(), partitionable: s.mig.partitionable ?? new Map() });
  assert.deepEqual(
    c.counterSets?.map((sl) => sl.length),
    [8, 7],
  );
  const set0 = c.counterSets?.[0]?.[0];
  assert.equal(set0?.name, 'gpu-0-counter-set');
  assert.deepEqual(Object.keys(set0?.counters ?? {}).filter((k) => k.startsWith('memory-slice')).length, 8);
  assert.equal(set0?.counters.multiprocessors?.value, '98');
  const devices = c.slices.flat();
  const gpu0 = devices.filter((d) => d.name.startsWith('gpu-0-mig-') && d.consumesCounters !== undefined);
  const names = gpu0.map((d) => d.name);
  assert.ok(names.includes('gpu-0-mig-3g20gb-9-4'), 'the free 3g placement');
  assert.ok(!names.includes('gpu-0-mig-3g20gb-9-0'), 'the occupied one is not offered');
  assert.ok(!names.some((n) => /-7g40gb-0-0$|-4g20gb-5-0$/.test(n)), 'nor anything overlapping slices 0-3');
  assert.ok(
    devices.some((d) => d.name === 'gpu-0-mig-3g20gb-9-0' && d.consumesCounters === undefined),
    'static',
  );
  const one = gpu0.find((d) => d.name === 'gpu-0-mig-1g5gb-19-5');
  assert.deepEqual(one?.consumesCounters?.[0]?.counterSet, 'gpu-0-counter-set');
  assert.deepEqual(one?.consumesCounters?.[0]?.counters['memory-slice-5'], { value: '1' });
  assert.equal(one?.attributes.parentUUID && 'string' in one.attributes.parentUUID, true);
  assert.ok(
    devices.some((d) => d.name === 'gpu-1'),
    'the GPU not in MIG mode is published whole',
  );
  assert.equal(devices.filter((d) => d.name.startsWith('gpu-15-mig-')).length, 7 + 4 + 3 + 2 + 1 + 1 + 7);
});

test('an API server older than 1.35 gets MIG-mode GPUs without counter sets, said once as an ERROR', () => {
  const lines: string[] = [];
  const log = createLogger({ level: 'info', journal: false, write: (l) => lines.push(l) });
  const source = new PoolSource({ nodeName: 'node-16', driver: 'gpu.nvidia.com', sysfsRoot: '/nonexistent', log });
  const plan = {
    deviceIdStrategy: 'uuid' as const,
    sharing: NO_SHARING,
    migStrategy: 'mixed' as const,
    dynamicMig: true,
  };
  assert.equal(source.content(s, plan).counterSets?.length, 2, 'version not known yet: written');
  source.setServerVersion({ major: 1, minor: 34 });
  assert.equal(source.content(s, plan).counterSets, undefined);
  assert.equal(source.content(s, plan).counterSets, undefined);
  assert.equal(lines.filter((l) => /dra\.dynamicMig needs Kubernetes 1\.35 or later/.test(l)).length, 1);
  source.setServerVersion({ major: 1, minor: 36 });
  assert.equal(source.content(s, plan).counterSets?.length, 2);
});

test('a partition carries its GPU’s health: an XID on GPU 2 taints every partition of it, none of GPU 3', () => {
  const gpu2 = s.gpus[2]?.uuid ?? '';
  const sick = withHealth(
    s,
    new Map([[gpu2, { state: { ...freshHealthState(), health: 'Unhealthy', lastXid: 79 }, reason: 'test', since: 1 }]]),
  );
  const c = poolContent(sick, { ...settings(), partitionable: s.mig.partitionable ?? new Map() });
  const devices = c.slices.flat().filter((d) => d.consumesCounters !== undefined);
  const ofGpu = (i: number) => devices.filter((d) => d.name.startsWith(`gpu-${i}-mig-`));
  assert.ok(ofGpu(2).length > 0);
  for (const d of ofGpu(2))
    assert.deepEqual(d.taints, [{ key: 'gpu.nvidia.com/xid', value: '79', effect: 'NoSchedule' }]);
  for (const d of ofGpu(3)) assert.equal(d.taints, undefined);
});

test('a claimed instance stays the partition it was allocated as, consuming its counters; only it is tainted', () => {
  // GPU 0's 3g.20gb at slices 0-3 taken as the package's own: a claim holds gpu-0-mig-3g20gb-9-0.
  const name = 'gpu-0-mig-3g20gb-9-0';
  const mine = withClaimedPartitions(s, new Set([name]));
  const partitionable = s.mig.partitionable ?? new Map();
  const devices = poolContent(mine, { ...settings(), partitionable }).slices.flat();
  const named = devices.filter((d) => d.name === name);
  assert.equal(named.length, 1, 'published once');
  assert.ok(named[0]?.consumesCounters !== undefined, 'as the partition: the scheduler counts its memory slices');
  assert.equal(named[0]?.attributes.uuid, undefined, 'not as the MIG device');
  assert.ok(
    devices.some((d) => d.name === 'gpu-0-mig-4g20gb-5-0'),
    'placements over it offered again: the counters keep them apart',
  );
  // Its MIG device's XID taints it, and no other partition of GPU 0.
  const mig = mine.mig.devices.find((m) => m.parent === 0);
  assert.ok(mig !== undefined);
  const xid = { state: { ...freshHealthState(), health: 'Unhealthy' as const, lastXid: 94 }, reason: 't', since: 1 };
  const sick = withHealth(mine, new Map([[mig.uuid, xid]]));
  const after = poolContent(sick, { ...settings(), partitionable }).slices.flat();
  const tainted = after.filter((d) => d.name.startsWith('gpu-0-') && d.taints !== undefined).map((d) => d.name);
  assert.deepEqual(tainted, [name]);
  // The kubelet side lists the same: the partition (with its instance's UUID for health), not the MIG device.
  const plan = { deviceIdStrategy: 'uuid' as const, sharing: NO_SHARING, migStrategy: 'mixed' as const };
  const applied = (snapshot: NodeSnapshot) => ({
    snapshot,
    change: diff(null, snapshot),
    reason: 'test',
    reregister: null,
    settings: { plan: { ...plan, dynamicMig: true } },
  });
  const listed = publishedDevices(applied(mine)).filter((d) => d.name === name);
  assert.equal(listed.length, 1);
  assert.deepEqual(listed[0]?.partition, { giProfileId: 9, start: 0, size: 4 });
  assert.equal(listed[0]?.instanceUuid, mig.uuid);
  assert.equal(listed[0]?.mig, undefined);
  const health = deviceHealthList(sick, publishedDevices(applied(sick)), 0);
  assert.deepEqual(
    health.filter((h) => h.device.startsWith('gpu-0-') && h.health === 'Unhealthy').map((h) => h.device),
    [name],
    "the kubelet hears its instance's health",
  );
  // Not claimed: the instance is someone else's, a MIG device of its own, and nothing overlapping it is offered.
  const foreign = publishedDevices(applied(s));
  assert.ok(foreign.some((d) => d.name === name && d.mig?.uuid === mig.uuid));
  assert.ok(!foreign.some((d) => d.name === 'gpu-0-mig-4g20gb-5-0'));
});
