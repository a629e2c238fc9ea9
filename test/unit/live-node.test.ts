// The live node in-process (src/node/live-node.ts): scans, health events and probes by UUID, an
// event for a device the snapshot does not hold, a GPU_IS_LOST answer confirmed or not by a rescan,
// a config reload as a transaction, the driver going and coming back, a MIG re-layout, and recovery
// on node:test's mocked timers — with recording consumers instead of servers.
import { EventEmitter } from 'node:events';
import { test } from 'node:test';
import assert from 'node:assert/strict';
import type { Gpu } from '../../src/core/devices.ts';
import { parseHealthSettings } from '../../src/core/health-policy.ts';
import type { EventBatchEntry, ProbeResult } from '../../src/core/health-events.ts';
import type { MigDevice, MigLayout } from '../../src/core/mig.ts';
import { NO_SHARING } from '../../src/core/sharing.ts';
import type { NodeScan, NodeSnapshot } from '../../src/core/snapshot.ts';
import { describePlan } from '../../src/core/sharing.ts';
import type { NodeSettings } from '../../src/node/consumer.ts';
import { LiveNode } from '../../src/node/live-node.ts';
import { ResourcePlanner } from '../../src/plugin/planner.ts';
import type { AppliedPlan, PlanListener } from '../../src/plugin/planner.ts';
import { createLogger } from '../../src/system/log.ts';
import { onEvent, waitFor, waitUntil } from '../support/wait.ts';

const MiB = 1024 * 1024;
const uuid = (i: number): string => `GPU-0000000${i}-aaaa-4000-8000-000000000000`;
const gpu = (i: number, index = i): Gpu => ({
  index,
  uuid: uuid(i),
  name: 'NVIDIA A100-SXM4-80GB',
  minor: i,
  busId: `00000000:0${i}:00.0`,
  memoryBytes: 81920 * MiB,
  numaNode: 0,
});
const migDev = (parent: number, gi: number, uuidTail: string): MigDevice => ({
  parent,
  index: gi - 1,
  uuid: `MIG-${uuidTail}`,
  gi,
  ci: 0,
  profile: '1g.10gb',
  giSlices: 1,
  ciSlices: 1,
  memoryBytes: 9728 * MiB,
  multiprocessors: 14,
  engines: { copy: 1, decoder: 0, encoder: 0, jpeg: 0, ofa: 0 },
});

function scan(ids: readonly number[], mig?: MigLayout): NodeScan {
  const gpus = ids.map((id, k) => gpu(id, k));
  return {
    driverVersion: '550.54.15',
    gpus,
    nvlinks: gpus.map((g) => ({ busId: g.busId, links: [] })),
    pcie: gpus.map((_, i) => gpus.map((_, j) => (i === j ? -1 : 40))),
    ...(mig === undefined ? {} : { mig }),
  };
}

const settings = (replicas = 1, migStrategy: 'none' | 'mixed' = 'none'): NodeSettings => ({
  plan: {
    deviceIdStrategy: 'uuid',
    migStrategy,
    sharing:
      replicas === 1
        ? NO_SHARING
        : {
            timeSlicing: {
              renameByDefault: false,
              failRequestsGreaterThanOne: false,
              resources: [{ name: 'nvidia.com/gpu', rename: null, replicas, devices: { kind: 'all' } }],
            },
          },
  },
});

/**
 * A listener of the device-plugin plans (a consumer of the node behind the planner) that records what it was given, and
 * can be told to refuse the next one.
 */
class Recorder implements PlanListener {
  readonly name = 'recorder';
  readonly applied: AppliedPlan[] = [];
  refuseNext: Error | null = null;
  stopped = false;
  /** Emits 'applied' after each snapshot it is given. */
  private readonly events = new EventEmitter();

  apply(a: AppliedPlan): void {
    const err = this.refuseNext;
    this.refuseNext = null;
    if (err !== null) throw err;
    this.applied.push(a);
    this.events.emit('applied');
  }

  stop(): void {
    this.stopped = true;
  }

  get last(): NodeSnapshot {
    const a = this.applied.at(-1);
    if (a === undefined) throw new Error('nothing applied yet');
    return a.snapshot;
  }

  /** The next applied snapshot that satisfies pred (or the last one, if it already does). */
  next(pred: (a: AppliedPlan) => boolean): Promise<AppliedPlan> {
    const from = Math.max(this.applied.length - 1, 0);
    return waitFor(() => this.applied.slice(from).find(pred), {
      on: onEvent(this.events, 'applied'),
      what: `an applied snapshot matching ${pred.toString()}`,
    });
  }
}

function setup(
  opts: {
    recovery?: boolean;
    mig?: boolean;
    rescan?: (node: LiveNode, reason: string) => Promise<void>;
    /** Consumers after the recorder. */
    after?: readonly PlanListener[];
    claimedPartitions?: ReadonlySet<string>;
  } = {},
) {
  const lines: string[] = [];
  const logged = new EventEmitter();
  const log = createLogger({ level: 'debug', journal: false, write: (l) => lines.push(l) && logged.emit('line') });
  const rec = new Recorder();
  let now = 1000;
  const node = new LiveNode({
    log,
    config: settings(1, opts.mig === true ? 'mixed' : 'none'),
    health: parseHealthSettings(undefined, undefined),
    recovery: { enabled: opts.recovery === true, quietMs: 5000 },
    consumers: [new ResourcePlanner([rec, ...(opts.after ?? [])], log)],
    now: () => now,
    wallNow: () => 1_700_000_000_000 + now,
    ...(opts.claimedPartitions === undefined ? {} : { claimedPartitions: opts.claimedPartitions }),
  });
  const rescans: string[] = [];
  if (opts.rescan !== undefined) {
    const fn = opts.rescan;
    node.onRescanWanted((reason) => {
      rescans.push(reason);
      return fn(node, reason);
    });
  }
  const health = (s: NodeSnapshot = rec.last): string =>
    s.gpus.map((g) => (s.health.get(g.uuid) === 'Healthy' ? 'H' : 'U')).join('');
  return {
    node,
    rec,
    lines,
    logged,
    rescans,
    health,
    advance: (ms: number) => {
      now += ms;
    },
  };
}

const xid = (gpuUuid: string | null, code: number, gi?: number, ci?: number): EventBatchEntry[] => [
  { event: { kind: 'xid', gpu: gpuUuid, xid: code, ...(gi === undefined ? {} : { gi, ci: ci ?? 0 }) }, count: 1 },
];
const probes = (results: Record<string, ProbeResult>): ReadonlyMap<string, ProbeResult> =>
  new Map(Object.entries(results));
const healthChanged = (a: AppliedPlan): boolean => a.reason === 'health changed';

test(
  'a scan goes to every consumer with its diff; an XID ' + 'marks its GPU by UUID, with the reason and since when',
  async () => {
    const t = setup();
    await t.node.scanned(scan([0, 1, 2]), 'start');
    assert.equal(t.rec.applied.length, 1);
    assert.deepEqual(
      t.rec.applied[0]!.resourceChange.added.map((r) => r.name),
      ['nvidia.com/gpu'],
    );
    assert.equal(t.rec.applied[0]!.reason, 'start');
    t.node.onEvents(xid(uuid(1), 79));
    const a = await t.rec.next(healthChanged);
    assert.equal(t.health(a.snapshot), 'HUH');
    const h = a.snapshot.gpuHealth.get(uuid(1))!;
    assert.match(h.reason ?? '', /critical XID 79/);
    assert.equal(h.since, 1_700_000_001_000);
    assert.deepEqual(
      a.resourceChange.updated.map((u) => u.healthChanged),
      [[uuid(1)]],
    );
    assert.equal(t.lines.filter((l) => / WARN GPU unhealthy gpu=1 uuid=GPU-00000001/.test(l)).length, 1);
    // The GPUs move (GPU 0 leaves, so GPU 1 is now NVML index 0): the event for GPU 1's UUID still lands on it.
    await t.node.scanned(scan([1, 2]), 're-discovery');
    assert.equal(t.health(), 'UH');
    t.node.onEvents(xid(uuid(2), 48));
    assert.equal(t.health((await t.rec.next(healthChanged)).snapshot), 'UU');
    await t.node.stop();
    assert.ok(t.rec.stopped);
  },
);

test('an ignored XID changes nothing and is visible at debug; single-bit ECC counts survive a scan', async () => {
  const t = setup();
  await t.node.scanned(scan([0, 1]), 'start');
  t.node.onEvents([...xid(uuid(0), 13), { event: { kind: 'ecc-single', gpu: uuid(1) }, count: 3 }]);
  await t.node.scanned(scan([0, 1]), 're-discovery');
  assert.equal(t.health(), 'HH');
  assert.equal(t.rec.applied.filter(healthChanged).length, 0);
  assert.equal(
    t.lines.filter((l) => / DEBUG XID ignored by the health settings gpu=0 uuid=GPU-00000000.* xid=13/.test(l)).length,
    1,
  );
  assert.equal(t.rec.last.gpuHealth.get(uuid(1))?.state.singleBit, 3);
});

test(
  'an event for a GPU the snapshot does not hold marks ' +
    'nothing, asks for a rescan, and lands once the rescan has it',
  async () => {
    let present = [0, 1];
    const t = setup({ rescan: (node, reason) => node.scanned(scan(present), reason) });
    await t.node.scanned(scan(present), 'start');
    present = [0, 1, 2]; // GPU 2 appears; an event names it before any scan saw it
    t.node.onEvents(xid(uuid(2), 79));
    const a = await t.rec.next((x) => healthChanged(x) && x.snapshot.gpus.length === 3);
    assert.equal(t.health(a.snapshot), 'HHU');
    assert.equal(t.rescans.length, 1);
    assert.equal(
      t.lines.filter((l) =>
        new RegExp(
          'INFO event names a device the node snapshot does not hold; ' +
            'nothing is marked, looking at the node again uuid=GPU-00000002',
        ).test(l),
      ).length,
      1,
    );
    // One that a rescan cannot place either is logged once and then ignored without rescanning again.
    t.node.onEvents(xid(uuid(7), 79));
    await logs(t, /event still names no device of this node after looking again; ignored uuid=GPU-00000007/);
    t.node.onEvents(xid(uuid(7), 79));
    await t.node.scanned(scan(present), 're-discovery');
    assert.equal(t.rescans.length, 2, 'no third rescan for an event already known to name nothing');
    assert.equal(t.health(), 'HHU');
  },
);

test(
  'an XID naming an unknown GI/CI marks nothing, and after ' + 'the MIG re-scan marks the MIG device that now exists',
  async () => {
    const on = { current: true, pending: true };
    let layout: MigLayout = { modes: [on, on], devices: [migDev(0, 1, 'a')] };
    const t = setup({ mig: true, rescan: (node, reason) => node.scanned(scan([0, 1], layout), reason) });
    await t.node.scanned(scan([0, 1], layout), 'start');
    layout = { modes: [on, on], devices: [migDev(0, 1, 'a'), migDev(1, 2, 'b')] };
    t.node.onEvents(xid(uuid(1), 94, 2, 0));
    const a = await t.rec.next((x) => healthChanged(x));
    assert.equal(a.snapshot.migHealth.get('MIG-b')?.state.health, 'Unhealthy');
    assert.equal(a.snapshot.migHealth.get('MIG-a')?.state.health, 'Healthy');
    assert.equal(a.snapshot.gpuHealth.get(uuid(1))?.state.health, 'Healthy', 'not the whole GPU');
    assert.match(
      t.lines.find((l) => /event names a device the node snapshot does not hold/.test(l)) ?? '',
      /gpu=1 .*xid=94 gi=2 ci=0 why="GPU instance 2, compute instance 0 is no MIG device known on this GPU"/,
    );
  },
);

test('GPU_IS_LOST is believed once a rescan still lists the GPU; a GPU that has left is gone, not lost', async () => {
  let present = [0, 1, 2];
  const t = setup({ rescan: (node, reason) => node.scanned(scan(present), reason) });
  await t.node.scanned(scan(present), 'start');
  t.node.onProbe(probes({ [uuid(1)]: 'lost', [uuid(0)]: 'ok' }));
  const a = await t.rec.next(healthChanged);
  assert.equal(t.health(a.snapshot), 'HUH');
  assert.equal(t.rescans.length, 1);
  present = [0, 1];
  t.node.onProbe(probes({ [uuid(2)]: 'lost' }));
  await t.rec.next((x) => x.snapshot.gpus.length === 2);
  await logs(t, /GPU answered GPU_IS_LOST but has left the node: it is gone, not lost uuid=GPU-00000002/);
  present = [0, 1, 2];
  await t.node.scanned(scan(present), 'reload');
  assert.equal(t.health(), 'HUH', 'GPU 2 comes back with the health it left with');
});

test('the driver going and coming back: every device Unhealthy meanwhile, then each its own health', async () => {
  const t = setup();
  await t.node.scanned(scan([0, 1]), 'start');
  t.node.onEvents(xid(uuid(0), 79));
  await t.rec.next(healthChanged);
  await t.node.scanned(null, 'driver gone');
  assert.equal(t.health(), 'UU');
  assert.equal(t.rec.last.gpus.length, 2, 'the GPUs stay listed');
  await t.node.scanned(scan([0, 1]), 'the driver answers');
  assert.equal(t.health(), 'UH');
  assert.ok(t.lines.some((l) => /INFO the NVIDIA driver answers/.test(l)));
});

test('a config reload is a transaction: in force while applied, kept when a consumer refuses it', async () => {
  const t = setup();
  await t.node.scanned(scan([0, 1]), 'start');
  await t.node.reconfigure(settings(2), 'config reloaded');
  assert.equal(describePlan(t.rec.applied.at(-1)!.plan.resources), 'nvidia.com/gpu=4 (replicas of 2 GPUs)');
  const a = t.rec.applied.at(-1)!;
  assert.equal(a.reregister, 'config reloaded');
  assert.equal(a.settings, t.node.config);
  assert.equal(a.plan.resources[0]?.devices.length, 4);
  const before = t.node.config;
  t.rec.refuseNext = new Error('cannot serve that');
  await assert.rejects(t.node.reconfigure(settings(3), 'config reloaded'), /cannot serve that/);
  assert.equal(t.node.config, before, 'the running configuration is kept');
  // A sharing entry that cannot be planned is refused before anything is applied.
  const bad: NodeSettings = {
    ...settings(),
    plan: {
      ...settings().plan,
      sharing: {
        timeSlicing: {
          renameByDefault: false,
          failRequestsGreaterThanOne: false,
          resources: [{ name: 'nvidia.com/other', rename: null, replicas: 2, devices: { kind: 'all' } }],
        },
      },
    },
  };
  const count = t.rec.applied.length;
  await assert.rejects(t.node.reconfigure(bad, 'config reloaded'), /nvidia\.com\/other/);
  assert.equal(t.rec.applied.length, count);
  assert.equal(t.node.config, before);
});

test('a refused reload leaves the snapshot, health tracking and every consumer as they were', async () => {
  const second = new Recorder();
  const t = setup({ after: [second] });
  await t.node.scanned(scan([0, 1]), 'start');
  const before = { snapshot: t.node.snapshot, config: t.node.config, applied: t.node.appliedCount };
  second.refuseNext = new Error('cannot serve that');
  await assert.rejects(t.node.reconfigure(settings(2), 'config reloaded'), /cannot serve that/);
  assert.equal(t.node.snapshot, before.snapshot, "the refused plan is not the node's snapshot");
  assert.equal(t.node.config, before.config);
  assert.equal(t.node.appliedCount, before.applied);
  assert.equal(t.rec.last, before.snapshot, 'the consumer that took it has the snapshot before it again');
  assert.equal(t.rec.applied.at(-1)!.settings, before.config);
  assert.equal(second.last, before.snapshot);
  // The next change is judged against the snapshot in force: nothing of the refused plan shows.
  await t.node.scanned(scan([0, 1]), 're-discovery');
  assert.deepEqual(second.applied.at(-1)!.resourceChange.updated, []);
  // A refused scan that drops a GPU: health tracking still follows the GPU, so its XID marks it.
  second.refuseNext = new Error('cannot serve that');
  await assert.rejects(t.node.scanned(scan([0]), 're-discovery'), /cannot serve that/);
  assert.equal(t.rec.last.gpus.length, 2);
  t.node.onEvents(xid(uuid(1), 48));
  const marked = await second.next(healthChanged);
  assert.equal(t.health(marked.snapshot), 'HU');
  assert.ok(!t.lines.some((l) => /does not hold/.test(l)), t.lines.join('\n'));
});

test('a MIG re-layout: MIG health carried by MIG UUID, a re-created instance starts fresh', async () => {
  const on = { current: true, pending: true };
  const t = setup({ mig: true });
  await t.node.scanned(scan([0], { modes: [on], devices: [migDev(0, 1, 'a'), migDev(0, 2, 'b')] }), 'start');
  t.node.onEvents(xid(uuid(0), 94, 1, 0));
  t.node.onEvents(xid(uuid(0), 94, 2, 0));
  await t.rec.next((a) => healthChanged(a) && a.snapshot.migHealth.get('MIG-b')?.state.health === 'Unhealthy');
  await t.node.scanned(scan([0], { modes: [on], devices: [migDev(0, 1, 'a'), migDev(0, 2, 'c')] }), 're-discovery');
  const s = t.rec.last;
  assert.equal(s.migHealth.get('MIG-a')?.state.health, 'Unhealthy');
  assert.equal(s.migHealth.get('MIG-c')?.state.health, 'Healthy');
  assert.equal(s.migHealth.has('MIG-b'), false);
  assert.deepEqual(t.rec.applied.at(-1)!.change.migAdded, ['MIG-c']);
  // The tracker follows the new layout: an XID on GI 2 now marks MIG-c.
  t.node.onEvents(xid(uuid(0), 94, 2, 0));
  assert.equal(
    (
      await t.rec.next((a) => healthChanged(a) && a.snapshot.migHealth.get('MIG-c')?.state.health === 'Unhealthy')
    ).snapshot.migHealth.get('MIG-a')?.state.health,
    'Unhealthy',
  );
});

test(
  'recovery on mocked timers: healthy again after ' + "the quiet period, through the live node's own timer",
  async (ctx) => {
    ctx.mock.timers.enable({ apis: ['setTimeout'] });
    const t = setup({ recovery: true });
    await t.node.scanned(scan([0]), 'start');
    t.node.onEvents(xid(uuid(0), 74));
    await t.rec.next(healthChanged);
    t.node.onProbe(probes({ [uuid(0)]: 'ok' }));
    await settleQueue(t.node);
    assert.equal(t.health(), 'U');
    t.advance(5000);
    ctx.mock.timers.tick(5001);
    const back = await t.rec.next((a) => healthChanged(a) && t.health(a.snapshot) === 'H');
    assert.match(back.snapshot.gpuHealth.get(uuid(0))?.reason ?? '', /recovered from XID 74/);
    await t.node.stop();
  },
);

/** The live node's queue has run what was enqueued so far (a scan goes through the same queue). */
async function settleQueue(node: LiveNode): Promise<void> {
  await node.reconfigure(node.config, 'settle');
}

/** Waits until the node has logged a line matching re. */
const logs = (t: { lines: string[]; logged: EventEmitter }, re: RegExp): Promise<void> =>
  waitUntil(() => t.lines.some((l) => re.test(l)), { on: onEvent(t.logged, 'line'), what: `a line matching ${re}` });

test(
  'a config reload asking more MPS clients than a GPU ' + 'serves is refused, the running configuration kept',
  async () => {
    const t = setup();
    const pascal = {
      cudaDriverVersion: 12040,
      gpus: new Map([0, 1].map((i) => [uuid(i), { compute: { major: 6, minor: 0 }, migCapable: false }])),
    };
    await t.node.scanned({ ...scan([0, 1]), facts: pascal }, 'start');
    const before = t.node.config;
    const count = t.rec.applied.length;
    const mps = (replicas: number): NodeSettings => ({
      ...settings(),
      plan: {
        ...settings().plan,
        sharing: {
          timeSlicing: null,
          mps: {
            renameByDefault: false,
            failRequestsGreaterThanOne: true,
            resources: [{ name: 'nvidia.com/gpu', rename: null, replicas, devices: { kind: 'all' } }],
          },
        },
      },
    });
    await assert.rejects(t.node.reconfigure(mps(20), 'config reloaded'), /16/);
    assert.equal(t.rec.applied.length, count, 'nothing applied');
    assert.equal(t.node.config, before, 'the running configuration is kept');
    await t.node.reconfigure(mps(16), 'config reloaded');
    assert.equal(describePlan(t.rec.applied.at(-1)!.plan.resources), 'nvidia.com/gpu=32 (MPS replicas of 2 GPUs)');
  },
);

test('claimed MIG partitions: the first snapshot has those of the start; a change is one more snapshot', async () => {
  const t = setup({ claimedPartitions: new Set(['gpu-0-mig-3g20gb-9-4']) });
  await t.node.scanned(scan([0]), 'start');
  assert.deepEqual([...(t.rec.last.claimedPartitions ?? [])], ['gpu-0-mig-3g20gb-9-4']);
  const applied = t.rec.applied.length;
  await t.node.onClaimedPartitions(new Set(['gpu-0-mig-3g20gb-9-4']));
  assert.equal(t.rec.applied.length, applied, 'the same set: no snapshot');
  await t.node.onClaimedPartitions(new Set());
  assert.equal(t.rec.applied.length, applied + 1);
  assert.deepEqual([...(t.rec.last.claimedPartitions ?? [])], []);
  await t.node.scanned(scan([0]), 're-discovery');
  assert.deepEqual([...(t.rec.last.claimedPartitions ?? [])], [], 'a scan keeps what the claims said');
});
