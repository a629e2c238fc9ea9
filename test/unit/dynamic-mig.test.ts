// Dynamic MIG's pure core (src/core/dynamic-mig.ts): the counter set, the partitionable devices and their
// consumption on the A100-40GB and H100-80GB profile tables, placements beside existing instances, counter sets
// cut into slices of 8, and which placement a device name stands for at prepare.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import {
  canonicalProfile,
  counterSetSlices,
  gpuCounterSet,
  parsePartitionName,
  partitionDevices,
  resolvePartition,
} from '../../src/core/dynamic-mig.ts';
import type { DynamicMigGpu, GiProfile, MigPlacement } from '../../src/core/dynamic-mig.ts';

const at = (starts: number[], size: number): MigPlacement[] => starts.map((start) => ({ start, size }));

function profile(
  id: number,
  name: string,
  g: number,
  mem: number,
  sms: number,
  starts: number[],
  size: number,
): GiProfile {
  const dec = g === 7 ? 5 : g >= 3 ? 2 : g === 2 ? 1 : 0;
  return {
    id,
    name,
    multiprocessors: sms,
    copyEngines: g === 7 ? 7 : g,
    decoders: name.endsWith('+me') ? 1 : dec,
    encoders: 0,
    jpegEngines: g === 7 || name.endsWith('+me') ? 1 : 0,
    ofaEngines: g === 7 || name.endsWith('+me') ? 1 : 0,
    memoryMiB: mem,
    placements: at(starts, size),
  };
}

// A100-40GB: ids and placements of the MIG user guide's table.
const A100: GiProfile[] = [
  profile(19, '1g.5gb', 1, 4864, 14, [0, 1, 2, 3, 4, 5, 6], 1),
  profile(20, '1g.5gb+me', 1, 4864, 14, [0, 1, 2, 3, 4, 5, 6], 1),
  profile(15, '1g.10gb', 1, 9856, 14, [0, 2, 4, 6], 2),
  profile(14, '2g.10gb', 2, 9856, 28, [0, 2, 4], 2),
  profile(9, '3g.20gb', 3, 19968, 42, [0, 4], 4),
  profile(5, '4g.20gb', 4, 19968, 56, [0], 4),
  profile(0, '7g.40gb', 7, 40192, 98, [0], 8),
];
const H100: GiProfile[] = [
  profile(19, '1g.10gb', 1, 9984, 16, [0, 1, 2, 3, 4, 5, 6], 1),
  profile(20, '1g.10gb+me', 1, 9984, 16, [0, 1, 2, 3, 4, 5, 6], 1),
  profile(15, '1g.20gb', 1, 19968, 26, [0, 2, 4, 6], 2),
  profile(14, '2g.20gb', 2, 19968, 32, [0, 2, 4], 2),
  profile(9, '3g.40gb', 3, 40448, 60, [0, 4], 4),
  profile(5, '4g.40gb', 4, 40448, 64, [0], 4),
  profile(0, '7g.80gb', 7, 80896, 132, [0], 8),
];

const gpu = (minor: number, profiles: GiProfile[], instances: DynamicMigGpu['instances'] = []): DynamicMigGpu => ({
  minor,
  profiles,
  instances,
  parentAttributes: { parentUUID: { string: `GPU-${minor}` }, productName: { string: 'NVIDIA A100-SXM4-40GB' } },
});

test('profile names as NVIDIA writes them in device names', () => {
  assert.equal(canonicalProfile('1g.5gb'), '1g5gb');
  assert.equal(canonicalProfile('1g.5gb+me'), '1g5gb-me');
  assert.equal(canonicalProfile('1c.2g.20gb'), '1c2g20gb');
});

test('the counter set holds the largest profile and every memory slice', () => {
  const set = gpuCounterSet(gpu(3, H100));
  assert.equal(set.name, 'gpu-3-counter-set');
  assert.deepEqual(set.counters.multiprocessors, { value: '132' });
  assert.deepEqual(set.counters['copy-engines'], { value: '7' });
  assert.deepEqual(set.counters.decoders, { value: '5' });
  assert.deepEqual(set.counters.encoders, { value: '0' });
  assert.deepEqual(set.counters['jpeg-engines'], { value: '1' });
  assert.deepEqual(set.counters['ofa-engines'], { value: '1' });
  assert.deepEqual(set.counters.memory, { value: '79Gi' });
  const slices = Object.keys(set.counters).filter((k) => k.startsWith('memory-slice-'));
  assert.deepEqual(
    slices,
    [0, 1, 2, 3, 4, 5, 6, 7].map((i) => `memory-slice-${i}`),
  );
  for (const k of Object.keys(set.counters)) assert.match(k, /^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$/);
});

test('an empty GPU offers every profile at every placement (A100: 7+7+4+3+2+1+1)', () => {
  const devices = partitionDevices(gpu(0, A100));
  assert.equal(devices.length, 25);
  assert.equal(devices[0]?.name, 'gpu-0-mig-1g5gb-19-0');
  assert.ok(devices.some((d) => d.name === 'gpu-0-mig-1g5gb-me-20-6'));
  assert.ok(devices.some((d) => d.name === 'gpu-0-mig-3g20gb-9-4'));
  assert.equal(devices.at(-1)?.name, 'gpu-0-mig-7g40gb-0-0');
  assert.equal(new Set(devices.map((d) => d.name)).size, devices.length);
});

test("a device consumes its capacities and exactly its memory slices from its GPU's set", () => {
  const d = partitionDevices(gpu(1, H100)).find((x) => x.name === 'gpu-1-mig-1g20gb-15-6');
  assert.ok(d);
  assert.deepEqual(d.attributes.type, { string: 'mig' });
  assert.deepEqual(d.attributes.profile, { string: '1g.20gb' });
  assert.deepEqual(d.attributes.parentUUID, { string: 'GPU-1' });
  assert.equal(d.attributes.uuid, undefined);
  assert.deepEqual(d.capacity.multiprocessors, { value: '26' });
  assert.deepEqual(d.capacity.memory, { value: '19968Mi' });
  assert.equal(d.capacity['memory-slice-6'], undefined);
  assert.equal(d.consumesCounters.length, 1);
  const c = d.consumesCounters[0];
  assert.equal(c?.counterSet, 'gpu-1-counter-set');
  assert.deepEqual(
    Object.keys(c?.counters ?? {}).filter((k) => k.startsWith('memory-slice-')),
    ['memory-slice-6', 'memory-slice-7'],
  );
  assert.deepEqual(c?.counters['copy-engines'], { value: '1' });
  const set = gpuCounterSet(gpu(1, H100));
  for (const k of Object.keys(c?.counters ?? {})) assert.ok(k in set.counters, `${k} is a counter of the set`);
});

test('only placements free beside existing instances are offered', () => {
  const taken = gpu(0, A100, [{ giId: 1, profileId: 9, placement: { start: 4, size: 4 } }]);
  const names = partitionDevices(taken).map((d) => d.name);
  assert.ok(names.includes('gpu-0-mig-3g20gb-9-0'));
  assert.ok(!names.includes('gpu-0-mig-3g20gb-9-4'));
  assert.ok(!names.includes('gpu-0-mig-7g40gb-0-0'));
  assert.ok(names.includes('gpu-0-mig-4g20gb-5-0'));
  assert.ok(!names.includes('gpu-0-mig-1g5gb-19-4'));
  assert.ok(names.includes('gpu-0-mig-1g5gb-19-3'));
  assert.deepEqual(
    names.filter((n) => n.includes('-2g10gb-')),
    ['gpu-0-mig-2g10gb-14-0', 'gpu-0-mig-2g10gb-14-2'],
  );
});

test('counter sets go in slices of at most 8', () => {
  const sets = Array.from({ length: 17 }, (_, i) => gpuCounterSet(gpu(i, A100)));
  const slices = counterSetSlices(sets);
  assert.deepEqual(
    slices.map((s) => s.length),
    [8, 8, 1],
  );
  assert.equal(slices[2]?.[0]?.name, 'gpu-16-counter-set');
  assert.deepEqual(counterSetSlices([]), []);
});

test('a device name resolves to its profile and placement when free', () => {
  assert.deepEqual(parsePartitionName('gpu-0-mig-1g5gb-me-20-6'), {
    minor: 0,
    profile: '1g5gb-me',
    giProfileId: 20,
    start: 6,
  });
  assert.equal(parsePartitionName('gpu-0'), null);
  const r = resolvePartition(gpu(0, A100), 'gpu-0-mig-3g20gb-9-4');
  assert.ok(r.ok);
  assert.equal(r.profile.id, 9);
  assert.deepEqual(r.placement, { start: 4, size: 4 });
});

test('a device name is refused with the reason: other GPU, unknown profile or start, slices taken', () => {
  const g = gpu(0, A100, [{ giId: 2, profileId: 19, placement: { start: 5, size: 1 } }]);
  const reason = (name: string): string => {
    const r = resolvePartition(g, name);
    assert.ok(!r.ok, name);
    return r.reason;
  };
  assert.match(reason('gpu-0'), /not a MIG partition name/);
  assert.match(reason('gpu-1-mig-1g5gb-19-0'), /names GPU 1, not GPU 0/);
  assert.match(reason('gpu-0-mig-1g5gb-99-0'), /no profile 1g5gb-99/);
  assert.match(reason('gpu-0-mig-3g20gb-9-2'), /3g\.20gb cannot start at slice 2 \(starts: 0, 4\)/);
  assert.match(reason('gpu-0-mig-3g20gb-9-4'), /slices 4-7 of GPU 0 overlap GPU instance 2 \(slices 5-5\)/);
});

test('prepare accepts exactly the devices published beside existing instances', () => {
  const g = gpu(2, H100, [
    { giId: 1, profileId: 15, placement: { start: 2, size: 2 } },
    { giId: 4, profileId: 19, placement: { start: 6, size: 1 } },
  ]);
  const offered = new Set(partitionDevices(g).map((d) => d.name));
  assert.ok(offered.size > 0);
  let refused = 0;
  for (const p of H100) {
    for (const pl of p.placements) {
      const name = `gpu-2-mig-${canonicalProfile(p.name)}-${p.id}-${pl.start}`;
      const r = resolvePartition(g, name);
      assert.equal(r.ok, offered.has(name), name);
      if (!r.ok) refused++;
    }
  }
  assert.equal(refused, 25 - offered.size);
});
