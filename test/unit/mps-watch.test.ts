// The MPS daemon watch (src/mps/health-watch.ts) in-process, on node:test's mocked timers, with a fake
// client function: one question in flight per daemon (a hung daemon piles nothing up), a question
// every interval after the last one settled, transitions reported once with the client's reason,
// and the watch following the snapshots (a resource added or removed, a new root); and the core
// side (core/snapshot.ts): an MPS resource's devices Unhealthy while its daemon does not answer.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import type { Gpu } from '../../src/core/devices.ts';
import { NO_SHARING } from '../../src/core/sharing.ts';
import type { PlannedResource } from '../../src/core/sharing.ts';
import { diffResources, resourceDeviceList } from '../../src/core/resource-diff.ts';
import { advertisedView, mpsDaemonsOf } from '../../src/core/resource-plan.ts';
import { MPS_DAEMON_NOT_ASKED, withHealth, withMpsDaemons } from '../../src/core/snapshot.ts';
import type { MpsDaemonState, NodeScan, PlanSettings, UnitHealth } from '../../src/core/snapshot.ts';
import type { NodeSettings } from '../../src/node/consumer.ts';
import { ResourcePlanner } from '../../src/plugin/planner.ts';
import type { AppliedPlan } from '../../src/plugin/planner.ts';
import { changes, counts, planned, plannedNode, withPlan } from '../support/planned-node.ts';
import type { Planned } from '../support/planned-node.ts';
import { LiveNode } from '../../src/node/live-node.ts';
import { parseHealthSettings } from '../../src/core/health-policy.ts';
import { MpsControlError } from '../../src/mps/control-client.ts';
import type { MpsDaemonDirs } from '../../src/mps/control-client.ts';
import { ASK_INTERVAL_MS, ASK_TIMEOUT_MS, HEALTH_COMMAND, MpsDaemonWatch } from '../../src/mps/health-watch.ts';
import type { MpsDaemonReport } from '../../src/mps/health-watch.ts';
import { createLogger } from '../../src/system/log.ts';
import { mpsStatus, NodeStatus } from '../../src/system/service-status.ts';
import { parseStateDocument, stateDocument } from '../../src/core/daemon-state.ts';
import { formatDaemon } from '../../src/cli/daemon-view.ts';
import { daemonStateFromSnapshot } from '../../src/observe/snapshot-state.ts';
import { SinceTracker } from '../../src/observe/state-file.ts';

const MiB = 1024 * 1024;
const uuid = (i: number): string => `GPU-0000000${i}-aaaa-4000-8000-000000000000`;
const gpu = (i: number): Gpu => ({
  index: i,
  uuid: uuid(i),
  name: 'NVIDIA A100-SXM4-80GB',
  minor: i,
  busId: `00000000:0${i}:00.0`,
  memoryBytes: 81920 * MiB,
  numaNode: 0,
});
function scan(n: number): NodeScan {
  const gpus = Array.from({ length: n }, (_, i) => gpu(i));
  return {
    driverVersion: '550.54.15',
    gpus,
    nvlinks: gpus.map((g) => ({ busId: g.busId, links: [] })),
    pcie: gpus.map((_, i) => gpus.map((_, j) => (i === j ? -1 : 40))),
  };
}
const plan = (replicas: number): PlanSettings => ({
  deviceIdStrategy: 'uuid',
  sharing: {
    timeSlicing: {
      renameByDefault: false,
      failRequestsGreaterThanOne: true,
      resources: [{ name: 'nvidia.com/gpu', rename: null, replicas, devices: { kind: 'all' } }],
    },
  },
});

/**
 * A snapshot planned with its time-sliced resources made MPS by hand (the plan that sets
 * PlannedResource.mps from sharing.mps is built elsewhere); its daemons not asked yet.
 */
function mpsSnapshot(n: number, replicas: number, names: readonly string[] = ['nvidia.com/gpu']): Planned {
  const p = planned(scan(n), plan(replicas), null, false);
  const base = p.resources[0] as PlannedResource;
  const resources = names.map((name): PlannedResource => ({ ...base, name, mps: true }));
  const snapshot = { ...p.node.snapshot, mpsDaemons: new Map(names.map((nm) => [nm, MPS_DAEMON_NOT_ASKED])) };
  return plannedNode(snapshot, { ...p.node.plan, resources });
}

/** The same planned node with new MPS daemon states (what the live node makes of the watch's reports). */
const withDaemons = (p: Planned, updates: ReadonlyMap<string, MpsDaemonState | null>): Planned =>
  withPlan(withMpsDaemons(p.node.snapshot, updates), p);
/** The same planned node with new health for some units. */
const withUnits = (p: Planned, updates: ReadonlyMap<string, UnitHealth>): Planned =>
  withPlan(withHealth(p.node.snapshot, updates), p);

interface S extends NodeSettings {
  readonly root: string | null;
}
const settingsWith = (root: string | null): S => ({
  root,
  plan: { deviceIdStrategy: 'uuid', sharing: NO_SHARING },
});

/** A fake client: every question waits until the test answers it. */
class FakeClient {
  readonly asked: {
    dirs: MpsDaemonDirs;
    command: string;
    timeoutMs: number;
    answer: () => void;
    fail: (reason: string) => void;
  }[] = [];
  ask = (dirs: MpsDaemonDirs, command: string, timeoutMs: number): Promise<string> =>
    new Promise((resolve, reject) => {
      this.asked.push({
        dirs,
        command,
        timeoutMs,
        answer: () => resolve('100.0'),
        fail: (reason) => reject(new MpsControlError(command, dirs.pipeDir, reason)),
      });
    });
  last(): FakeClient['asked'][number] {
    const q = this.asked.at(-1);
    assert.ok(q !== undefined, 'no question asked');
    return q;
  }
}

const settle = (): Promise<void> => new Promise((resolve) => setImmediate(resolve));

function watchSetup() {
  const lines: string[] = [];
  const log = createLogger({ level: 'debug', journal: false, write: (l) => lines.push(l) });
  const client = new FakeClient();
  const reports: { resource: string; report: MpsDaemonReport }[] = [];
  /** Resources whose daemon is no longer watched (the report null), in order. */
  const forgotten: string[] = [];
  const watch = new MpsDaemonWatch<S>({
    log,
    rootOf: (c) => c.root,
    ask: client.ask,
    report: (resource, report) => (report === null ? forgotten.push(resource) : reports.push({ resource, report })),
  });
  const apply = (p: Planned, root: string | null): void => {
    watch.apply({ plan: p.node.plan, settings: settingsWith(root) });
  };
  return { watch, client, reports, forgotten, lines, apply };
}

test(
  'the watch asks each daemon once at a time, every interval ' +
    'after the last answer, and reports transitions with the reason',
  async (ctx) => {
    ctx.mock.timers.enable({ apis: ['setTimeout'] });
    const t = watchSetup();
    t.apply(mpsSnapshot(2, 4), '/run/nvidia/mps');
    assert.deepEqual(t.watch.watching(), [
      { resource: 'nvidia.com/gpu', pipeDir: '/run/nvidia/mps/nvidia.com/gpu/pipe' },
    ]);
    ctx.mock.timers.tick(0);
    assert.equal(t.client.asked.length, 1);
    assert.deepEqual(
      { ...t.client.last(), answer: 0, fail: 0 },
      {
        dirs: { pipeDir: '/run/nvidia/mps/nvidia.com/gpu/pipe', logDir: '/run/nvidia/mps/nvidia.com/gpu/log' },
        command: HEALTH_COMMAND,
        timeoutMs: ASK_TIMEOUT_MS,
        answer: 0,
        fail: 0,
      },
    );
    // A daemon that does not answer: no second question while the first is out, however long it takes.
    ctx.mock.timers.tick(60_000);
    assert.equal(t.client.asked.length, 1, 'one question in flight per daemon');
    t.client.last().fail('Cannot find MPS control daemon process');
    await settle();
    assert.deepEqual(t.reports, [
      { resource: 'nvidia.com/gpu', report: { answering: false, reason: 'Cannot find MPS control daemon process' } },
    ]);
    ctx.mock.timers.tick(ASK_INTERVAL_MS - 1);
    assert.equal(t.client.asked.length, 1);
    ctx.mock.timers.tick(1);
    assert.equal(t.client.asked.length, 2);
    // The same answer again: no report (transitions only).
    t.client.last().fail('Cannot find MPS control daemon process');
    await settle();
    assert.equal(t.reports.length, 1);
    ctx.mock.timers.tick(ASK_INTERVAL_MS);
    t.client.last().answer();
    await settle();
    assert.deepEqual(t.reports.at(-1), { resource: 'nvidia.com/gpu', report: { answering: true, reason: null } });
    ctx.mock.timers.tick(ASK_INTERVAL_MS);
    t.client.last().answer();
    await settle();
    assert.equal(t.reports.length, 2);
    ctx.mock.timers.tick(ASK_INTERVAL_MS);
    t.client.last().fail(`no answer within ${ASK_TIMEOUT_MS} ms`);
    await settle();
    assert.deepEqual(t.reports.at(-1), {
      resource: 'nvidia.com/gpu',
      report: { answering: false, reason: `no answer within ${ASK_TIMEOUT_MS} ms` },
    });
    assert.equal(t.client.asked.length, 5);
    t.watch.stop();
    ctx.mock.timers.tick(10 * ASK_INTERVAL_MS);
    assert.equal(t.client.asked.length, 5, 'nothing is asked after stop');
  },
);

test(
  'the watch follows the snapshots: a resource removed is no longer ' +
    'asked (its late answer dropped), a new root is a new daemon',
  async (ctx) => {
    ctx.mock.timers.enable({ apis: ['setTimeout'] });
    const t = watchSetup();
    t.apply(mpsSnapshot(1, 2, ['nvidia.com/gpu', 'nvidia.com/gpu.mps']), '/a');
    ctx.mock.timers.tick(0);
    assert.deepEqual(t.client.asked.map((q) => q.dirs.pipeDir).sort(), [
      '/a/nvidia.com/gpu.mps/pipe',
      '/a/nvidia.com/gpu/pipe',
    ]);
    const old = t.client.asked.find((q) => q.dirs.pipeDir === '/a/nvidia.com/gpu.mps/pipe')!;
    const kept = t.client.asked.find((q) => q.dirs.pipeDir === '/a/nvidia.com/gpu/pipe')!;
    // The config reload drops gpu.mps while its question is out.
    t.apply(mpsSnapshot(1, 2, ['nvidia.com/gpu']), '/a');
    old.answer();
    kept.answer();
    await settle();
    assert.deepEqual(t.reports, [{ resource: 'nvidia.com/gpu', report: { answering: true, reason: null } }]);
    assert.ok(
      t.lines.some((l) => /MPS control daemon no longer watched resource=nvidia.com\/gpu.mps/.test(l)),
      t.lines.join('\n'),
    );
    ctx.mock.timers.tick(ASK_INTERVAL_MS);
    assert.deepEqual(
      t.client.asked.slice(2).map((q) => q.dirs.pipeDir),
      ['/a/nvidia.com/gpu/pipe'],
    );
    // A new root: the daemon under /b is watched from scratch, the one under /a no longer.
    t.apply(mpsSnapshot(1, 2, ['nvidia.com/gpu']), '/b');
    ctx.mock.timers.tick(0);
    assert.deepEqual(t.watch.watching(), [{ resource: 'nvidia.com/gpu', pipeDir: '/b/nvidia.com/gpu/pipe' }]);
    assert.equal(t.client.last().dirs.pipeDir, '/b/nvidia.com/gpu/pipe');
    t.client.asked[2]!.fail('Cannot find MPS control daemon process');
    t.client.last().fail('Cannot find MPS control daemon process');
    await settle();
    assert.deepEqual(t.reports.at(-1), {
      resource: 'nvidia.com/gpu',
      report: { answering: false, reason: 'Cannot find MPS control daemon process' },
    });
    assert.equal(t.reports.length, 2, 'the late answer of the daemon under /a is not reported');
    assert.deepEqual(t.forgotten, ['nvidia.com/gpu.mps'], 'a new root is no reason to forget the state');
    // No MPS resource any more (or no root): nothing is watched.
    t.apply(planned(scan(1), plan(2), null, false), '/b');
    assert.deepEqual(t.watch.watching(), []);
    assert.deepEqual(t.forgotten, ['nvidia.com/gpu.mps', 'nvidia.com/gpu']);
    t.watch.stop();
  },
);

test(
  'an MPS resource is advertised Unhealthy until its daemon ' +
    "answers, with its GPU's own health after, and the diff says so",
  () => {
    const s0 = mpsSnapshot(2, 2);
    const r = s0.resources[0] as PlannedResource;
    assert.deepEqual(
      resourceDeviceList(s0, r).map((d) => d.health),
      ['Unhealthy', 'Unhealthy', 'Unhealthy', 'Unhealthy'],
    );
    assert.deepEqual(counts(s0).resources, [{ name: 'nvidia.com/gpu', devices: 4, healthy: 0 }]);
    assert.equal(s0.health.get(uuid(0)), 'Healthy', "the GPU's own health is untouched");
    const s1 = withDaemons(s0, new Map([['nvidia.com/gpu', { answering: true, reason: null, since: 5 }]]));
    assert.deepEqual(
      resourceDeviceList(s1, r).map((d) => d.health),
      ['Healthy', 'Healthy', 'Healthy', 'Healthy'],
    );
    const up = changes(s0, s1);
    assert.deepEqual(
      up.updated.map((u) => [u.name, u.healthChanged.length]),
      [['nvidia.com/gpu', 4]],
    );
    // The GPU's own health still counts once the daemon answers.
    const sick = withUnits(
      s1,
      new Map([
        [
          uuid(1),
          {
            ...s1.gpuHealth.get(uuid(1))!,
            state: { ...s1.gpuHealth.get(uuid(1))!.state, health: 'Unhealthy' },
            reason: 'XID 79',
            since: 6,
          },
        ],
      ]),
    );
    assert.deepEqual(
      resourceDeviceList(sick, r).map((d) => d.health),
      ['Healthy', 'Healthy', 'Unhealthy', 'Unhealthy'],
    );
    const down = withDaemons(
      sick,
      new Map([['nvidia.com/gpu', { answering: false, reason: 'Cannot find MPS control daemon process', since: 7 }]]),
    );
    assert.deepEqual(
      changes(sick, down).updated.map((u) => u.healthChanged.length),
      [2],
    );
    // A report for a resource that is not MPS in the plan changes nothing advertised.
    const other = withDaemons(down, new Map([['nvidia.com/other', { answering: true, reason: null, since: 8 }]]));
    assert.deepEqual(diffResources(down.node, other.node).updated, []);
    assert.deepEqual(mpsDaemonsOf(other.node), mpsDaemonsOf(down.node));
    // The next snapshot carries the daemon's state by resource name; a resource no longer MPS drops it.
    const rebuilt = planned(scan(2), plan(2), down, false);
    assert.equal(
      rebuilt.node.snapshot.mpsDaemons.get('nvidia.com/gpu'),
      down.node.snapshot.mpsDaemons.get('nvidia.com/gpu'),
    );
    assert.equal(mpsDaemonsOf(rebuilt.node).size, 0, 'the plan made no MPS resource: no daemon state');
    // A daemon no longer watched is forgotten: MPS again, it is not asked yet.
    assert.equal(withMpsDaemons(down.node.snapshot, new Map([['nvidia.com/gpu', null]])).mpsDaemons.size, 0);
  },
);

test(
  'info: the published state has each MPS resource with ' + "its daemon's state and limits, and `info` shows them",
  () => {
    const s0 = mpsSnapshot(2, 4);
    const ctx = (now: string) => ({
      pid: 42,
      version: '0.1.0',
      startedAt: '2026-01-01T00:00:00.000Z',
      now,
      options: {},
      registrations: [{ name: 'nvidia.com/gpu', registered: true }],
      since: new SinceTracker(),
    });
    const stateOf = (p: Planned, now: string) =>
      daemonStateFromSnapshot(p.node.snapshot, { ...ctx(now), advertised: advertisedView(p.node) });
    const waiting = stateOf(s0, 't1');
    assert.deepEqual(waiting.mps, [
      {
        resource: 'nvidia.com/gpu',
        answering: false,
        reason: 'not asked yet',
        replicas: 4,
        activeThreadPercentage: 25,
        gpus: [
          { index: 0, uuid: uuid(0), pinnedMemLimitMiB: 20480 },
          { index: 1, uuid: uuid(1), pinnedMemLimitMiB: 20480 },
        ],
      },
    ]);
    assert.deepEqual(
      waiting.resources.map((r) => [r.devices, r.healthy]),
      [[8, 0]],
    );
    const at = Date.UTC(2026, 0, 1, 12);
    const gone = withDaemons(
      s0,
      new Map([['nvidia.com/gpu', { answering: false, reason: 'Cannot find MPS control daemon process', since: at }]]),
    );
    const state = stateOf(gone, 't2');
    const back = parseStateDocument(stateDocument(state));
    assert.ok('state' in back);
    const text = formatDaemon({ read: { kind: 'running', path: '/run/x/state.json', state: back.state } });
    assert.match(
      text,
      new RegExp(
        String.raw`^nvidia\.com\/gpu +not answering: Cannot find MPS control daemon process ` +
          String.raw`+2026-01-01T12:00:00\.000Z +4 +25% +GPU 0: 20480 MiB, GPU 1: 20480 MiB$`,
        'm',
      ),
    );
    const up = stateOf(
      withDaemons(s0, new Map([['nvidia.com/gpu', { answering: true, reason: null, since: at }]])),
      't3',
    );
    assert.deepEqual([up.mps?.[0]?.answering, up.mps?.[0]?.reason, up.resources[0]?.healthy], [true, undefined, 8]);
    assert.match(
      formatDaemon({ read: { kind: 'running', path: '/p', state: up } }),
      /^nvidia\.com\/gpu +answering +2026-01-01T12:00:00\.000Z +4 +25%/m,
    );
    assert.equal(stateOf(planned(scan(2), plan(4), null, false), 't4').mps, undefined, 'no MPS resource: no mps part');
  },
);

test('STATUS says which MPS daemon does not answer and why, and stops saying it once it answers', () => {
  const sent: string[] = [];
  const status = new NodeStatus(
    {
      status: (line) => {
        sent.push(line);
      },
      waitFor: () => undefined,
    },
    { allRegisteredNow: () => true, advertised: () => advertisedView(shown.node) },
  );
  const s0 = mpsSnapshot(2, 2);
  let shown = s0;
  status.apply({ snapshot: s0 });
  status.registered(true);
  assert.equal(
    sent.at(-1),
    'STATUS=registered; 2 of 2 GPUs healthy; MPS daemon for nvidia.com/gpu not answering: not asked yet',
  );
  const gone = withDaemons(
    s0,
    new Map([['nvidia.com/gpu', { answering: false, reason: 'Cannot find MPS control daemon process', since: 1 }]]),
  );
  shown = gone;
  status.apply({ snapshot: gone });
  assert.equal(
    sent.at(-1),
    'STATUS=registered; 2 of 2 GPUs healthy; MPS daemon for ' +
      'nvidia.com/gpu not answering: Cannot find MPS control daemon process',
  );
  assert.equal(
    mpsStatus(advertisedView(gone.node)),
    '; MPS daemon for nvidia.com/gpu not answering: Cannot find MPS control daemon process',
  );
  shown = withDaemons(s0, new Map([['nvidia.com/gpu', { answering: true, reason: null, since: 2 }]]));
  status.apply({ snapshot: shown });
  assert.equal(sent.at(-1), 'STATUS=registered; 2 of 2 GPUs healthy');
});

/** A listener of the plans that records the lists the kubelet would be sent, by resource. */
class ListRecorder {
  readonly name = 'lists';
  readonly applied: AppliedPlan<S>[] = [];
  private waiters: { pred: (a: AppliedPlan<S>) => boolean; resolve: (a: AppliedPlan<S>) => void }[] = [];
  apply(a: AppliedPlan<S>): void {
    this.applied.push(a);
    this.waiters = this.waiters.filter((w) => {
      if (!w.pred(a)) return true;
      w.resolve(a);
      return false;
    });
  }
  next(pred: (a: AppliedPlan<S>) => boolean): Promise<AppliedPlan<S>> {
    const last = this.applied.at(-1);
    if (last !== undefined && pred(last)) return Promise.resolve(last);
    return new Promise((resolve) => this.waiters.push({ pred, resolve }));
  }
}

const mpsSettings = (replicas: number, root: string | null = '/run/nvidia/mps'): S => ({
  ...settingsWith(root),
  plan: {
    deviceIdStrategy: 'uuid',
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
const listHealth = (a: AppliedPlan<S>, name = 'nvidia.com/gpu'): string => {
  const r = a.plan.resources.find((x) => x.name === name);
  return r === undefined
    ? '-'
    : resourceDeviceList(a.snapshot, r)
        .map((d) => (d.health === 'Healthy' ? 'H' : 'U'))
        .join('');
};

test(
  'live node + watch: replicas Unhealthy from start until the daemon ' +
    'answers, Unhealthy when it stops, Healthy again; a reload follows',
  async (ctx) => {
    ctx.mock.timers.enable({ apis: ['setTimeout'] });
    const lines: string[] = [];
    const log = createLogger({ level: 'debug', journal: false, write: (l) => lines.push(l) });
    const client = new FakeClient();
    const rec = new ListRecorder();
    const sent: string[] = [];
    let node: LiveNode<S> | undefined;
    const watch = new MpsDaemonWatch<S>({
      log,
      rootOf: (c) => c.root,
      ask: client.ask,
      report: (r, rep) => {
        void node?.onMpsDaemon(r, rep);
      },
    });
    const status = new NodeStatus(
      {
        status: (line) => {
          sent.push(line);
        },
        waitFor: () => undefined,
      },
      { allRegisteredNow: () => true, advertised: () => planner.advertised() },
    );
    const planner = new ResourcePlanner<S>([watch, rec], log);
    node = new LiveNode<S>({
      log,
      config: mpsSettings(2),
      health: parseHealthSettings(undefined, undefined),
      recovery: { enabled: false, quietMs: 0 },
      consumers: [planner, status],
      wallNow: () => 1_700_000_000_000,
    });
    await node.scanned(scan(2), 'start');
    assert.equal(rec.applied.length, 1);
    assert.equal(rec.applied[0]!.plan.resources[0]?.mps, true, 'the plan marks the resource MPS');
    assert.equal(
      listHealth(rec.applied[0]!),
      'UUUU',
      'registered with every replica Unhealthy until the daemon answers',
    );
    ctx.mock.timers.tick(0);
    client.last().fail('Cannot find MPS control daemon process');
    // The STATUS line follows the planner: its change is done once the live node's queue has run it.
    const settleQueue = () => (node as LiveNode<S>).reconfigure((node as LiveNode<S>).config, 'settle');
    const waiting = await rec.next((a) => a.reason === 'MPS daemon does not answer');
    await settleQueue();
    assert.equal(listHealth(waiting), 'UUUU');
    assert.deepEqual(waiting.resourceChange.updated, [], 'nothing the kubelet sees changed');
    status.registered(true);
    assert.match(
      sent.at(-1) ?? '',
      new RegExp(
        '^STATUS=registered; 2 of 2 GPUs healthy; MPS daemon for ' +
          String.raw`nvidia\.com\/gpu not answering: Cannot find MPS control daemon process$`,
      ),
    );
    ctx.mock.timers.tick(ASK_INTERVAL_MS);
    client.last().answer();
    const up = await rec.next((a) => a.reason === 'MPS daemon answers');
    await settleQueue();
    assert.equal(listHealth(up), 'HHHH');
    assert.deepEqual(
      up.resourceChange.updated.map((u) => [u.name, u.healthChanged.length]),
      [['nvidia.com/gpu', 4]],
      'the diff reports the resource updated, so ListAndWatch sends the list',
    );
    assert.deepEqual(up.snapshot.mpsDaemons?.get('nvidia.com/gpu'), {
      answering: true,
      reason: null,
      since: 1_700_000_000_000,
    });
    assert.equal(sent.at(-1), 'STATUS=registered; 2 of 2 GPUs healthy');
    ctx.mock.timers.tick(ASK_INTERVAL_MS);
    client.last().fail(`no answer within ${ASK_TIMEOUT_MS} ms`);
    const down = await rec.next((a) => a.reason === 'MPS daemon does not answer' && a !== waiting);
    await settleQueue();
    assert.equal(listHealth(down), 'UUUU');
    assert.equal(down.snapshot.gpuHealth.get(uuid(0))?.state.health, 'Healthy', 'the GPU itself stays healthy');
    assert.match(sent.at(-1) ?? '', /MPS daemon for nvidia\.com\/gpu not answering: no answer within 2000 ms$/);
    // A reload to 3 replicas while the daemon is down: the new list, still Unhealthy (the state is carried).
    await node.reconfigure(mpsSettings(3), 'config reloaded');
    assert.equal(listHealth(rec.applied.at(-1)!), 'UUUUUU');
    ctx.mock.timers.tick(ASK_INTERVAL_MS);
    client.last().answer();
    assert.equal(listHealth(await rec.next((a) => a.reason === 'MPS daemon answers' && a !== up)), 'HHHHHH');
    assert.equal(
      lines.filter((l) => / WARN MPS control daemon does not answer;.* resource=nvidia\.com\/gpu/.test(l)).length,
      2,
      lines.join('\n'),
    );
    assert.equal(lines.filter((l) => / INFO MPS control daemon answers/.test(l)).length, 2);
    assert.equal(lines.filter((l) => /device counts/.test(l)).length, 0, 'one line per transition, its own');
    // MPS off by reload: nothing is watched any more.
    await node.reconfigure({ ...settingsWith('/run/nvidia/mps') }, 'config reloaded');
    assert.deepEqual(watch.watching(), []);
    assert.equal(mpsDaemonsOf(planner.planned!).size, 0);
    const forgotten = await rec.next((a) => a.reason === 'MPS daemon not watched');
    assert.equal(forgotten.snapshot.mpsDaemons?.size, 0);
    await node.stop();
  },
);
