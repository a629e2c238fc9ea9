// MIG in the live node model (core/snapshot.ts): the layout is part of the snapshot, a re-layout is a
// new snapshot whose diff adds and removes mig-* resources and leaves other GPUs alone, MIG devices
// keep their health by MIG UUID, single withdraws a node that stops being uniform, and device specs
// without capability nodes stop a start.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import type { Gpu } from '../../src/core/devices.ts';
import { freshHealthState } from '../../src/core/health-tracker.ts';
import type { MigDevice, MigLayout } from '../../src/core/mig.ts';
import { NO_SHARING } from '../../src/core/sharing.ts';
import { withHealth } from '../../src/core/snapshot.ts';
import { changes, counts, noChange, planned, withPlan } from '../support/planned-node.ts';
import type { NodeScan, NodeSnapshot, PlanSettings } from '../../src/core/snapshot.ts';

/** Advertised health: the GPUs, then the MIG devices, in layout order. */
const healthOf = (s: NodeSnapshot): string[] =>
  [...s.gpus.map((g) => g.uuid), ...s.mig.devices.map((d) => d.uuid)].map((u) => s.health.get(u) ?? 'missing');
const sickUnit = {
  state: { ...freshHealthState(), health: 'Unhealthy' as const, lastXid: 94 },
  reason: 'critical XID 94',
  since: 5,
};

const MiB = 1024 * 1024;
const gpus: Gpu[] = [0, 1, 2].map((i) => ({
  index: i,
  uuid: `GPU-0000000${i}-0000-4000-8000-000000000000`,
  name: 'NVIDIA A100-SXM4-80GB',
  minor: i,
  busId: `00000000:0${i}:00.0`,
  memoryBytes: 81920 * MiB,
  numaNode: 0,
}));
const on = { current: true, pending: true };
const off = { current: false, pending: false };

function mig(parent: number, index: number, gi: number, profile: string, slices: number): MigDevice {
  return {
    parent,
    index,
    uuid: `MIG-${parent}-${profile}-${gi}`,
    gi,
    ci: 0,
    profile,
    giSlices: slices,
    ciSlices: slices,
    memoryBytes: 9728 * MiB,
    multiprocessors: 14 * slices,
    engines: { copy: slices, decoder: 0, encoder: 0, jpeg: 0, ofa: 0 },
  };
}

function scan(layout: MigLayout, caps: NodeScan['migCapabilities'] = new Map()): NodeScan {
  return {
    driverVersion: '550.54.15',
    gpus,
    nvlinks: gpus.map((g) => ({ busId: g.busId, links: [] })),
    pcie: gpus.map((_, i) => gpus.map((_, j) => (i === j ? -1 : 40))),
    mig: layout,
    migCapabilities: caps,
  };
}

const mixed: PlanSettings = { deviceIdStrategy: 'uuid', sharing: NO_SHARING, migStrategy: 'mixed' };
const A: MigLayout = {
  modes: [on, on, off],
  devices: [
    mig(0, 0, 1, '1g.10gb', 1),
    mig(0, 1, 2, '1g.10gb', 1),
    mig(1, 0, 1, '3g.40gb', 3),
    mig(1, 1, 2, '1g.10gb', 1),
  ],
};
// GPU 1 re-partitioned into one 7g.80gb.
const B: MigLayout = {
  modes: [on, on, off],
  devices: [mig(0, 0, 1, '1g.10gb', 1), mig(0, 1, 2, '1g.10gb', 1), mig(1, 0, 1, '7g.80gb', 7)],
};

test("a re-layout is a new snapshot: mig-* resources added and removed, other GPUs' resources unchanged", () => {
  const a = planned(scan(A), mixed, null, false);
  assert.deepEqual(
    a.resources.map((r) => [r.name, r.devices.length]),
    [
      ['nvidia.com/gpu', 1],
      ['nvidia.com/mig-1g.10gb', 3],
      ['nvidia.com/mig-3g.40gb', 1],
    ],
  );
  assert.equal(a.gpuHealth.size + a.migHealth.size, 3 + 4);
  const b = planned(scan(B), mixed, a, false);
  const d = changes(a, b);
  assert.deepEqual(
    d.added.map((r) => r.name),
    ['nvidia.com/mig-7g.80gb'],
  );
  assert.deepEqual(
    d.removed.map((r) => r.name),
    ['nvidia.com/mig-3g.40gb'],
  );
  assert.deepEqual(
    d.updated.map((r) => [r.name, r.vanished]),
    [['nvidia.com/mig-1g.10gb', ['MIG-1-1g.10gb-2']]],
  );
  assert.deepEqual(d.unchanged, ['nvidia.com/gpu']);
  assert.equal(d.gpuSetChanged, false, 'the GPUs themselves did not change');
  assert.equal(d.migChanged, true);
  assert.deepEqual(d.migAdded, ['MIG-1-7g.80gb-1']);
  assert.deepEqual(d.migRemoved, ['MIG-1-3g.40gb-1', 'MIG-1-1g.10gb-2']);
  assert.equal(noChange(changes(b, planned(scan(B), mixed, b, false))), true);
});

test('MIG devices keep their health by MIG UUID; new instances start fresh; GPU health is separate', () => {
  const a = planned(scan(A), mixed, null, false);
  // MIG-0-1g.10gb-2, and MIG-1-3g.40gb-1, which the re-layout removes
  const a2 = withPlan(
    withHealth(
      a.node.snapshot,
      new Map([
        [A.devices[1]!.uuid, sickUnit],
        [A.devices[2]!.uuid, sickUnit],
      ]),
    ),
    a,
  );
  assert.deepEqual(healthOf(a2), ['Healthy', 'Healthy', 'Healthy', 'Healthy', 'Unhealthy', 'Unhealthy', 'Healthy']);
  assert.throws(
    () => withHealth(a, new Map([['MIG-nowhere', sickUnit]])),
    /MIG-nowhere, which is neither a GPU nor a MIG device of this snapshot/,
  );
  const b = planned(scan(B), mixed, a2, false);
  assert.deepEqual(healthOf(b), ['Healthy', 'Healthy', 'Healthy', 'Healthy', 'Unhealthy', 'Healthy']);
  assert.deepEqual(b.migHealth.get(A.devices[1]!.uuid), sickUnit, 'kept by MIG UUID with its reason and since when');
  const r = b.resources.find((x) => x.name === 'nvidia.com/mig-1g.10gb')!;
  assert.deepEqual(
    changes(a2, b)
      .updated.find((u) => u.name === r.name)
      ?.devices.map((x) => x.health),
    ['Healthy', 'Unhealthy'],
  );
  // While the driver is down, every unit is advertised unhealthy and the layout is kept.
  const down = planned(null, mixed, b, false);
  assert.equal(down.mig, b.mig);
  assert.ok([...down.health.values()].every((h) => h === 'Unhealthy'));
  assert.equal(down.health.size, 6);
});

test('single: a node that stops being uniform is withdrawn with the reason, and a start on one fails', () => {
  const single: PlanSettings = { ...mixed, migStrategy: 'single' };
  const uniform: MigLayout = {
    modes: [on, on, on],
    devices: [mig(0, 0, 1, '3g.40gb', 3), mig(1, 0, 1, '3g.40gb', 3), mig(2, 0, 1, '3g.40gb', 3)],
  };
  const a = planned(scan(uniform), single, null, false);
  assert.deepEqual(
    a.resources.map((r) => [r.name, r.devices.length]),
    [['nvidia.com/gpu', 3]],
  );
  const broken: MigLayout = { ...uniform, devices: [...uniform.devices.slice(0, 2), mig(2, 0, 1, '2g.20gb', 2)] };
  const b = planned(scan(broken), single, a, false);
  assert.deepEqual(b.resources, []);
  assert.match(b.planProblem ?? '', /^--mig-strategy=single needs .*3g\.40gb on GPU 0, 1; 2g\.20gb on GPU 2/);
  assert.deepEqual(
    changes(a, b).removed.map((r) => r.name),
    ['nvidia.com/gpu'],
  );
  const c = planned(scan(uniform), single, b, false);
  assert.equal(c.planProblem, null);
  assert.deepEqual(
    changes(b, c).added.map((r) => r.name),
    ['nvidia.com/gpu'],
  );
  assert.throws(() => planned(scan(broken), single, null, false), /mig-strategy=single/);
});

test(
  'capability nodes: by MIG UUID for Allocate; without ' + 'them device specs stop a start and are reported after',
  () => {
    const caps = new Map(
      A.devices.map((d, k) => [
        d.uuid,
        [`/dev/nvidia-caps/nvidia-cap${10 + 2 * k}`, `/dev/nvidia-caps/nvidia-cap${11 + 2 * k}`],
      ]),
    );
    const a = planned(scan(A, caps), { ...mixed, needMigCapabilities: true }, null, false);
    assert.ok(!('problem' in a.migCapabilities));
    if (!('problem' in a.migCapabilities))
      assert.deepEqual(a.migCapabilities.get(A.devices[2]!.uuid), [
        '/dev/nvidia-caps/nvidia-cap14',
        '/dev/nvidia-caps/nvidia-cap15',
      ]);
    const missing = { problem: 'cannot read /proc/driver/nvidia-caps/mig-minors (ENOENT)' };
    assert.throws(
      () => planned(scan(A, missing), { ...mixed, needMigCapabilities: true }, null, false),
      /mig-minors \(ENOENT\); --pass-device-specs cannot give MIG devices their capability nodes/,
    );
    const later = planned(scan(A, missing), { ...mixed, needMigCapabilities: true }, a, false);
    assert.match(later.planProblem ?? '', /cannot give MIG devices their capability nodes/);
    assert.equal(later.resources.length, 3, 'still advertised; Allocate of a MIG device says what is missing');
    // Without device specs nothing is needed.
    assert.equal(planned(scan(A, missing), mixed, null, false).planProblem, null);
  },
);

test("health counts: a MIG device counts with its own health, not its parent GPU's", () => {
  const a = planned(scan(A), mixed, null, false);
  // MIG-0-1g.10gb-2; GPU 0 itself stays healthy
  const c = counts(withPlan(withHealth(a.node.snapshot, new Map([[A.devices[1]!.uuid, sickUnit]])), a));
  assert.deepEqual(c.gpus, { healthy: 3, total: 3 });
  assert.deepEqual(c.mig, { healthy: 3, total: 4 });
  assert.deepEqual(c.resources, [
    { name: 'nvidia.com/gpu', devices: 1, healthy: 1 },
    { name: 'nvidia.com/mig-1g.10gb', devices: 3, healthy: 2 },
    { name: 'nvidia.com/mig-3g.40gb', devices: 1, healthy: 1 },
  ]);
});
