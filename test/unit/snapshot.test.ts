import { test } from 'node:test';
import assert from 'node:assert/strict';
import type { Gpu } from '../../src/core/devices.ts';
import { HealthTracker, freshHealthState } from '../../src/core/health-tracker.ts';
import { parseHealthSettings } from '../../src/core/health-policy.ts';
import type { GpuHealthState } from '../../src/core/health-tracker.ts';
import { NO_SHARING } from '../../src/core/sharing.ts';
import { carryPlan, samePlanInputs } from '../../src/core/resource-plan.ts';
import { sameIdentity, withHealth } from '../../src/core/snapshot.ts';
import { changes, noChange, planned, withPlan } from '../support/planned-node.ts';
import type { Planned } from '../support/planned-node.ts';
import type { NodeScan, NodeSnapshot, PlanSettings, UnitHealth } from '../../src/core/snapshot.ts';

const uuid = (i: number): string => `GPU-0000000${i}-1111-2222-3333-444444444444`;

function gpu(i: number, index = i): Gpu {
  return {
    index,
    uuid: uuid(i),
    name: 'Test GPU',
    minor: i,
    busId: `00000000:0${i}:00.0`,
    memoryBytes: 1 << 30,
    numaNode: i < 2 ? 0 : 1,
  };
}

/** A scan of the GPUs with these identities (the k-th present GPU has NVML index k). */
function scan(ids: readonly number[], driverVersion = '550.54.15'): NodeScan {
  const gpus = ids.map((id, k) => gpu(id, k));
  return {
    driverVersion,
    gpus,
    nvlinks: gpus.map((g) => ({ busId: g.busId, links: [] })),
    pcie: gpus.map((_, i) => gpus.map((_, j) => (i === j ? -1 : 50))),
  };
}

const plain: PlanSettings = { deviceIdStrategy: 'uuid', sharing: NO_SHARING };
const sliced = (replicas: number): PlanSettings => ({
  deviceIdStrategy: 'uuid',
  sharing: {
    timeSlicing: {
      renameByDefault: false,
      failRequestsGreaterThanOne: false,
      resources: [{ name: 'nvidia.com/gpu', rename: null, replicas, devices: { kind: 'all' } }],
    },
  },
});

const unhealthy = (why: Partial<GpuHealthState> = {}): GpuHealthState => ({
  ...freshHealthState(),
  health: 'Unhealthy',
  ...why,
});

const unit = (state: GpuHealthState): UnitHealth => ({
  state,
  reason: state.health === 'Healthy' ? null : 'test',
  since: state.health === 'Healthy' ? null : 1,
});

function markUnhealthy(s: Planned, pos: number, why: Partial<GpuHealthState> = {}): Planned {
  return withPlan(withHealth(s.node.snapshot, new Map([[s.gpus[pos]!.uuid, unit(unhealthy(why))]])), s);
}

/** Advertised health of each GPU, in the snapshot's GPU order. */
const healthOf = (s: NodeSnapshot): string[] => s.gpus.map((g) => s.health.get(g.uuid) ?? 'missing');
/** The state of the GPU with this identity. */
const stateOf = (s: NodeSnapshot, id: number): GpuHealthState | undefined => s.gpuHealth.get(uuid(id))?.state;

test('a first snapshot plans the resources, every GPU healthy, and its diff adds them', () => {
  const s = planned(scan([0, 1, 2]), plain, null, false);
  assert.equal(s.driverVersion, '550.54.15');
  assert.deepEqual(healthOf(s), ['Healthy', 'Healthy', 'Healthy']);
  assert.deepEqual(
    s.resources.map((r) => r.name),
    ['nvidia.com/gpu'],
  );
  const d = changes(null, s);
  assert.deepEqual(
    d.added.map((r) => [r.name, r.devices.map((x) => x.ID)]),
    [['nvidia.com/gpu', [uuid(0), uuid(1), uuid(2)]]],
  );
  assert.equal(d.updated.length + d.removed.length, 0);
  assert.ok(d.gpuSetChanged && d.driverChanged);
});

test('the same node scanned again gives an empty diff', () => {
  const a = planned(scan([0, 1, 2]), plain, null, false);
  const b = planned(scan([0, 1, 2]), plain, a, false);
  const d = changes(a, b);
  assert.ok(noChange(d), JSON.stringify(d));
  assert.deepEqual(d.unchanged, ['nvidia.com/gpu']);
});

test('a GPU that leaves vanishes from the list at once; its health is remembered by UUID', () => {
  const a = markUnhealthy(planned(scan([0, 1, 2]), plain, null, false), 1, { lost: true });
  const b = planned(scan([0, 2]), plain, a, false);
  assert.deepEqual(
    b.gpus.map((g) => [g.uuid, g.index]),
    [
      [uuid(0), 0],
      [uuid(2), 1],
    ],
    'NVML indices shift; UUIDs stay',
  );
  assert.deepEqual(Object.keys(b.departed), [uuid(1)]);
  const d = changes(a, b);
  assert.deepEqual(
    d.updated.map((r) => [r.name, r.devices.map((x) => x.ID), r.vanished]),
    [['nvidia.com/gpu', [uuid(0), uuid(2)], [uuid(1)]]],
  );
  assert.deepEqual(d.gpusRemoved, [uuid(1)]);
  assert.deepEqual(d.gpusChanged, [uuid(2)], 'GPU 2 is now NVML index 1');
  assert.ok(d.gpuSetChanged);
  assert.ok(!d.driverChanged);
});

test('a GPU that comes back keeps the state it left in, unless recovery is on', () => {
  const a = markUnhealthy(planned(scan([0, 1, 2]), plain, null, false), 1, { lost: true });
  const gone = planned(scan([0, 2]), plain, a, false);
  const back = planned(scan([0, 1, 2]), plain, gone, false);
  assert.deepEqual(healthOf(back), ['Healthy', 'Unhealthy', 'Healthy'], 'lost stays unhealthy without recovery');
  assert.equal(stateOf(back, 1)?.lost, true);
  assert.equal(back.gpuHealth.get(uuid(1))?.reason, 'test', 'the reason and since when come back with it');
  assert.deepEqual(back.departed, {});
  const d = changes(gone, back);
  assert.deepEqual(d.updated[0]?.appeared, [uuid(1)]);
  assert.equal(d.updated[0]?.devices.find((x) => x.ID === uuid(1))?.health, 'Unhealthy');

  const recovered = planned(scan([0, 1, 2]), plain, gone, true);
  assert.deepEqual(
    healthOf(recovered),
    ['Healthy', 'Healthy', 'Healthy'],
    'with recovery on, a GPU that is back on the bus starts fresh',
  );

  const healthyLeft = planned(scan([0, 2]), plain, planned(scan([0, 1, 2]), plain, null, false), false);
  assert.deepEqual(
    healthOf(planned(scan([0, 1, 2]), plain, healthyLeft, false)),
    ['Healthy', 'Healthy', 'Healthy'],
    'a GPU removed healthy comes back healthy',
  );
});

test('a GPU still present keeps its health state through a rescan, even when its index changes', () => {
  const a = markUnhealthy(planned(scan([0, 1, 2]), plain, null, false), 2, { permanent: true, lastXid: 48 });
  const b = planned(scan([1, 2]), plain, a, true);
  assert.deepEqual(healthOf(b), ['Healthy', 'Unhealthy']);
  assert.equal(stateOf(b, 2)?.lastXid, 48);
});

test('while the driver is down the GPUs stay, all unhealthy; when it is back they take their own state back', () => {
  const a = markUnhealthy(planned(scan([0, 1]), plain, null, false), 0, { lastXid: 74 });
  const down = planned(null, plain, a, false);
  assert.equal(down.driverVersion, null);
  assert.deepEqual(down.gpus, a.gpus);
  assert.deepEqual(healthOf(down), ['Unhealthy', 'Unhealthy']);
  const d1 = changes(a, down);
  assert.ok(d1.driverChanged && !d1.gpuSetChanged);
  assert.deepEqual(d1.updated[0]?.healthChanged, [uuid(1)]);
  assert.deepEqual(d1.updated[0]?.vanished, [], 'withdrawn from allocation, not from the list');
  // A health change reported while the driver is down does not make anything healthy.
  assert.deepEqual(healthOf(withHealth(down, new Map(down.gpus.map((g) => [g.uuid, unit(freshHealthState())])))), [
    'Unhealthy',
    'Unhealthy',
  ]);

  const up = planned(scan([0, 1], '560.28.03'), plain, down, false);
  assert.equal(up.driverVersion, '560.28.03');
  assert.deepEqual(healthOf(up), ['Unhealthy', 'Healthy'], 'a driver reload is not a GPU fault, nor a cure');
  const d2 = changes(down, up);
  assert.ok(d2.driverChanged);
  assert.deepEqual(d2.updated[0]?.healthChanged, [uuid(1)]);
});

test('a driver that is down at the very first scan gives an empty node', () => {
  const s = planned(null, plain, null, false);
  assert.deepEqual(s.gpus, []);
  assert.deepEqual(
    s.resources.map((r) => r.devices.length),
    [0],
  );
});

test('changed settings add, update and remove resources with their device lists', () => {
  const a = planned(scan([0, 1]), plain, null, false);
  const renamed: PlanSettings = {
    deviceIdStrategy: 'uuid',
    sharing: {
      timeSlicing: {
        renameByDefault: true,
        failRequestsGreaterThanOne: false,
        resources: [{ name: 'nvidia.com/gpu', rename: null, replicas: 2, devices: { kind: 'all' } }],
      },
    },
  };
  const b = planned(scan([0, 1]), renamed, a, false);
  const d = changes(a, b);
  assert.deepEqual(
    d.added.map((r) => [r.name, r.devices.map((x) => x.ID)]),
    [['nvidia.com/gpu.shared', [`${uuid(0)}::0`, `${uuid(0)}::1`, `${uuid(1)}::0`, `${uuid(1)}::1`]]],
  );
  assert.deepEqual(
    d.removed.map((r) => [r.name, r.vanished]),
    [['nvidia.com/gpu', [uuid(0), uuid(1)]]],
  );
  assert.ok(!d.gpuSetChanged);

  const c = planned(scan([0, 1]), sliced(3), b, false);
  const d2 = changes(b, c);
  assert.deepEqual(
    d2.added.map((r) => r.name),
    ['nvidia.com/gpu'],
  );
  assert.deepEqual(
    d2.removed.map((r) => r.name),
    ['nvidia.com/gpu.shared'],
  );
  const e = planned(scan([0, 1]), sliced(2), c, false);
  const d3 = changes(c, e);
  assert.deepEqual(
    d3.updated.map((r) => [r.name, r.vanished]),
    [['nvidia.com/gpu', [`${uuid(0)}::2`, `${uuid(1)}::2`]]],
  );
});

test(
  'with the index strategy a GPU leaving vanishes by its UUID; the ' +
    'others keep their IDs and the runtime names follow the indices',
  () => {
    const settings: PlanSettings = { deviceIdStrategy: 'index', sharing: NO_SHARING };
    const a = planned(scan([0, 1, 2]), settings, null, false);
    const b = planned(scan([0, 2]), settings, a, false);
    const d = changes(a, b);
    assert.deepEqual(
      d.updated.map((r) => [r.devices.map((x) => x.ID), r.vanished]),
      [[[uuid(0), uuid(2)], [uuid(1)]]],
    );
    assert.deepEqual(
      b.resources[0]?.devices.map((x) => x.runtimeName),
      b.gpus.map((g) => String(g.index)),
    );
  },
);

test('a config that no longer fits the GPUs keeps the previous resources for the GPUs still there', () => {
  const listed: PlanSettings = {
    deviceIdStrategy: 'uuid',
    sharing: {
      timeSlicing: {
        renameByDefault: false,
        failRequestsGreaterThanOne: false,
        resources: [
          { name: 'nvidia.com/gpu', rename: null, replicas: 2, devices: { kind: 'list', refs: [{ uuid: uuid(1) }] } },
        ],
      },
    },
  };
  const a = planned(scan([0, 1, 2]), listed, null, false);
  assert.equal(a.planProblem, null);
  const b = planned(scan([0, 2]), listed, a, false);
  assert.match(
    b.planProblem ?? '',
    /sharing\.timeSlicing\.resources\[0\]\.devices\[0\]: GPU GPU-00000001.* is not on this node/,
  );
  assert.deepEqual(
    b.resources.map((r) => [r.name, r.devices.map((x) => [x.id, x.gpu])]),
    [
      [
        'nvidia.com/gpu',
        [
          [uuid(0), 0],
          [uuid(2), 1],
        ],
      ],
    ],
  );
  assert.throws(
    () => planned(scan([0, 2]), listed, null, false),
    /is not on this node/,
    'at start there is nothing to fall back on',
  );
  const back = planned(scan([0, 1, 2]), listed, b, false);
  assert.equal(back.planProblem, null);
  assert.equal(back.resources[0]?.devices.length, 4);
});

test('carryPlan remaps devices to the new positions by UUID and drops empty resources', () => {
  const a = planned(scan([0, 1]), plain, null, false);
  assert.deepEqual(
    carryPlan(a.resources, [gpu(1, 0)]).map((r) => r.devices.map((d) => [d.id, d.uuid, d.gpu])),
    [[[uuid(1), uuid(1), 0]]],
  );
  assert.deepEqual(carryPlan(a.resources, []), []);
});

test('health states from a tracker go into the snapshot, and a tracker can start from a snapshot', () => {
  const a = planned(scan([0, 1]), plain, null, false);
  const byUuid = new Map([...a.gpuHealth].map(([u, h]) => [u, h.state]));
  const t = new HealthTracker<string>(
    [...byUuid.keys()],
    parseHealthSettings(undefined, undefined),
    { enabled: false, quietMs: 0 },
    byUuid,
  );
  const transitions = t.apply({ kind: 'xid', gpu: uuid(1), xid: 79 }, 10);
  assert.deepEqual(
    transitions.map((c) => c.gpu),
    [uuid(1)],
    'a transition names its unit by UUID',
  );
  const b = withPlan(withHealth(a.node.snapshot, new Map([[uuid(1), unit(t.stateOf(uuid(1))!)]])), a);
  assert.deepEqual(healthOf(b), ['Healthy', 'Unhealthy']);
  const d = changes(a, b);
  assert.deepEqual(d.updated[0]?.healthChanged, [uuid(1)]);
  assert.ok(!d.gpuSetChanged);
  const again = new HealthTracker<string>(
    [uuid(0), uuid(1)],
    parseHealthSettings(undefined, undefined),
    { enabled: true, quietMs: 0 },
    new Map([...b.gpuHealth].map(([u, h]) => [u, h.state])),
  );
  assert.deepEqual(again.health(), ['Healthy', 'Unhealthy'], 'XID 79 never recovers, also in a rebuilt tracker');
  assert.throws(
    () => withHealth(a, new Map([[uuid(7), unit(freshHealthState())]])),
    /GPU-00000007.* neither a GPU nor a MIG device of this snapshot/,
  );
});

test('node identities compare by UUIDs in order and MIG modes', () => {
  assert.ok(sameIdentity({ uuids: ['a', 'b'], migModes: [null, 0] }, { uuids: ['a', 'b'], migModes: [null, 0] }));
  assert.ok(!sameIdentity({ uuids: ['a', 'b'], migModes: [null, 0] }, { uuids: ['b', 'a'], migModes: [null, 0] }));
  assert.ok(!sameIdentity({ uuids: ['a'], migModes: [0] }, { uuids: ['a'], migModes: [1] }));
});

test('a health change keeps what a plan is made from; a new scan does not', () => {
  const a = planned(scan([0, 1, 2]), plain, null, false);
  const sick = markUnhealthy(a, 1);
  assert.ok(samePlanInputs(a.node.snapshot, sick.node.snapshot), 'the device-plugin mode keeps its plan');
  const rescanned = planned(scan([0, 1, 2]), plain, a, false);
  assert.equal(samePlanInputs(a.node.snapshot, rescanned.node.snapshot), false, 'a scan is planned again');
});
