// The scanner in-process (src/nvml/scanner.ts and its parts), on an in-process fake of its session
// interface (node-reader.ts NodeSessions/NodeReader — not koffi, not the C fake) and node:test's
// mocked timers: the identity timer, the driver gone and the re-open backoff, the empty-node
// backoff, and the health thread held until the first registration or its hold timer.
import { EventEmitter } from 'node:events';
import { test } from 'node:test';
import type { TestContext } from 'node:test';
import assert from 'node:assert/strict';
import type { Gpu } from '../../src/core/devices.ts';
import type { ProbeResult } from '../../src/core/health-events.ts';
import type { NodeIdentity, NodeScan } from '../../src/core/snapshot.ts';
import { NVML, NvmlError } from '../../src/nvml/errors.ts';
import { WORKER_HOLD_MS } from '../../src/nvml/health-supervisor.ts';
import type { HealthWatch, HealthWatchHandlers, NodeReader, NodeSessions } from '../../src/nvml/node-reader.ts';
import { Scanner } from '../../src/nvml/scanner.ts';
import { createLogger } from '../../src/system/log.ts';
import { onEvent, waitUntil } from '../support/wait.ts';

const uuid = (i: number): string => `GPU-0000000${i}-bbbb-4000-8000-000000000000`;
const gpu = (i: number, index = i): Gpu => ({
  index,
  uuid: uuid(i),
  name: 'Fake GPU',
  minor: i,
  busId: `00000000:0${i}:00.0`,
  memoryBytes: 1 << 30,
  numaNode: 0,
});
const gone = (): NvmlError => new NvmlError('nvmlDeviceGetCount_v2', NVML.ERROR_DRIVER_NOT_LOADED, 'Driver Not Loaded');

/** The node the fake sessions read: which GPUs are there, and whether the driver answers. */
class FakeNode extends EventEmitter implements NodeSessions {
  ids: number[] = [0, 1];
  driver = true;
  opens = 0;
  closes = 0;
  watches: { gpus: string[]; handlers: HealthWatchHandlers; stopped: boolean }[] = [];

  open(): NodeReader {
    this.opens++;
    this.emit('open');
    if (!this.driver) throw new Error('NVML cannot be loaded: libnvidia-ml.so.1: cannot open shared object file');
    return new FakeReader(this);
  }
}

class FakeReader implements NodeReader {
  readonly library = '/fake/libnvidia-ml.so.1';
  private readonly node: FakeNode;
  private closed = false;

  constructor(node: FakeNode) {
    this.node = node;
  }

  private check(): void {
    if (this.closed) throw new Error('read on a closed session');
    if (!this.node.driver) throw gone();
  }

  driverVersion(): string {
    this.check();
    return '550.54.15';
  }

  read(): NodeScan {
    this.check();
    const gpus = this.node.ids.map((id, k) => gpu(id, k));
    return {
      driverVersion: '550.54.15',
      gpus,
      nvlinks: gpus.map((g) => ({ busId: g.busId, links: [] })),
      pcie: gpus.map(() => gpus.map(() => -1)),
    };
  }

  identity(): NodeIdentity {
    this.check();
    return { uuids: this.node.ids.map(uuid), migModes: this.node.ids.map(() => null) };
  }

  watch(gpus: readonly Gpu[], _probeIntervalMs: number, handlers: HealthWatchHandlers): HealthWatch {
    const w = { gpus: gpus.map((g) => g.uuid), handlers, stopped: false };
    this.node.watches.push(w);
    return {
      stop: async () => {
        w.stopped = true;
      },
    };
  }

  close(): void {
    this.closed = true;
    this.node.closes++;
  }

  shutdown(): void {
    this.closed = true;
  }
}

const mocked = new WeakSet<TestContext>();

function setup(
  ctx: TestContext,
  opts: { intervalMs?: number; health?: boolean; refuse?: (scan: NodeScan) => string | null } = {},
) {
  if (!mocked.has(ctx)) ctx.mock.timers.enable({ apis: ['setTimeout', 'setInterval'] });
  mocked.add(ctx);
  const node = new FakeNode();
  const lines: string[] = [];
  const scans: { scan: NodeScan | null; reason: string }[] = [];
  const waiters: (() => void)[] = [];
  const probes: ReadonlyMap<string, ProbeResult>[] = [];
  const startFailures: unknown[] = [];
  const scanner = new Scanner({
    sessions: node,
    log: createLogger({ level: 'debug', journal: false, write: (l) => lines.push(l) }),
    rediscoverIntervalMs: opts.intervalMs ?? 0,
    health: opts.health === true ? { probeIntervalMs: 1000 } : null,
    onScan: async (scan, reason) => {
      scans.push({ scan, reason });
      for (const w of waiters.splice(0)) w();
      const refused = scan === null ? null : (opts.refuse?.(scan) ?? null);
      if (refused !== null) throw new Error(refused);
    },
    onStartFailed: (err) => {
      startFailures.push(err);
      for (const w of waiters.splice(0)) w();
    },
    onEvents: () => undefined,
    onProbe: (r) => probes.push(r),
  });
  /** Resolves once `n` scans have been handed over (waits on the scanner, not on time). */
  const scanned = async (n: number): Promise<void> => {
    while (scans.length < n) await new Promise<void>((r) => waiters.push(r));
  };
  const gpusOf = (i: number): string =>
    scans[i]?.scan === null ? 'driver down' : (scans[i]?.scan?.gpus ?? []).map((g) => g.uuid.slice(0, 12)).join(',');
  /** Resolves once the scanner has reported a failed start (waits on the scanner, not on time). */
  const startFailed = async (): Promise<unknown> => {
    while (startFailures.length === 0) await new Promise<void>((r) => waiters.push(r));
    return startFailures[0];
  };
  return {
    node,
    lines,
    scans,
    scanned,
    scanner,
    probes,
    gpusOf,
    startFailures,
    startFailed,
    tick: (ms: number) => ctx.mock.timers.tick(ms),
  };
}

test('re-discovery: the identity timer scans only when the GPUs changed', async (ctx) => {
  const t = setup(ctx, { intervalMs: 5000 });
  await t.scanner.start(false);
  assert.deepEqual(
    t.scans.map((s) => s.reason),
    ['start'],
  );
  t.tick(5000);
  t.tick(5000);
  assert.equal(t.scanner.identityCheckCount, 2);
  assert.equal(t.scans.length, 1, 'same identity: no scan');
  t.node.ids = [0, 1, 2];
  t.tick(5000);
  await t.scanned(2);
  assert.equal(t.scans[1]?.reason, 're-discovery: the GPUs changed');
  assert.equal(t.scans[1]?.scan?.gpus.length, 3);
  t.scanner.setInterval(0);
  t.node.ids = [0];
  t.tick(60000);
  assert.equal(t.scanner.identityCheckCount, 3, 'interval 0: no timer');
  await t.scanner.stop();
});

test(
  'the driver gone: reported once as a null scan, NVML ' + 're-opened with capped backoff, then scanned again',
  async (ctx) => {
    const t = setup(ctx);
    await t.scanner.start(false);
    t.node.driver = false;
    const rescan = t.scanner.rescan('SIGHUP', true);
    await t.scanned(2);
    assert.equal(t.scans[1]?.scan, null);
    assert.equal(t.scans[1]?.reason, 'driver gone');
    await turn(); // the scanner goes on to arm its retry timer
    const opens = t.node.opens;
    // Re-opens back off: 1 s, 2 s, 4 s…
    t.tick(999);
    assert.equal(t.node.opens, opens);
    t.tick(1);
    await opened(t.node, opens + 1);
    await turn();
    t.tick(1999);
    assert.equal(t.node.opens, opens + 1);
    t.tick(1);
    await opened(t.node, opens + 2);
    await turn();
    t.node.driver = true;
    t.tick(4000);
    await rescan;
    await t.scanned(3);
    assert.equal(t.scans[2]?.reason, 'SIGHUP');
    assert.equal(t.scans.filter((s) => s.scan === null).length, 1, 'reported down once');
    assert.equal(t.lines.filter((l) => /WARN the NVIDIA driver does not answer/.test(l)).length, 1);
    assert.equal(t.lines.filter((l) => /INFO NVML answers again/.test(l)).length, 1);
    await t.scanner.stop();
  },
);

test(
  'a driver that goes in the middle of a scan: the session is ' +
    'closed, the driver reported down, and the scan done once it is back',
  async (ctx) => {
    const t = setup(ctx);
    await t.scanner.start(false);
    t.node.driver = false;
    const done = t.scanner.rescan('re-discovery');
    await t.scanned(2);
    assert.equal(t.scans[1]?.scan, null);
    assert.equal(t.node.closes, 1, 'the old session is closed');
    await turn();
    t.node.driver = true;
    t.tick(1000);
    await done;
    assert.equal(t.scans[2]?.reason, 're-discovery');
    await t.scanner.stop();
  },
);

test(
  'NVML missing at start: fatal with failOnInitError, ' + 'else the driver is reported down and looked for',
  async (ctx) => {
    const t = setup(ctx);
    t.node.driver = false;
    await assert.rejects(t.scanner.start(true), /cannot open shared object file/);
    const u = setup(ctx);
    u.node.driver = false;
    await u.scanner.start(false);
    assert.deepEqual(
      u.scans.map((s) => [s.scan, s.reason]),
      [[null, 'start']],
    );
    await turn();
    u.node.driver = true;
    u.tick(1000);
    await u.scanned(2);
    assert.equal(u.gpusOf(1), `${uuid(0).slice(0, 12)},${uuid(1).slice(0, 12)}`);
    await u.scanner.stop();
  },
);

test(
  'started without the driver, the first scan that reaches it and is refused (a config ' +
    'that does not fit) is a failed start, reported once; a refused scan after that is not',
  async (ctx) => {
    const u = setup(ctx, {
      refuse: (scan) =>
        scan.gpus.length > 0 ? 'sharing.timeSlicing.resources[0].devices: GPU 7 is not on this node' : null,
    });
    u.node.driver = false;
    await u.scanner.start(false);
    assert.deepEqual(u.startFailures, [], 'the driver-down report itself is no failure');
    await turn();
    u.node.driver = true;
    u.tick(1000);
    const err = await u.startFailed();
    assert.match(String(err), /GPU 7 is not on this node/);
    assert.equal(u.startFailures.length, 1);
    await u.scanner.stop();

    const v = setup(ctx, { refuse: (scan) => (scan.gpus.length > 2 ? 'does not fit' : null) });
    await v.scanner.start(false);
    v.node.ids = [0, 1, 2];
    await v.scanner.rescan('test');
    assert.deepEqual(v.startFailures, [], 'after a scan was applied, a refused one keeps the last in force');
    assert.ok(v.lines.some((l) => /scan failed; what was read before stays in force/.test(l)));
    await v.scanner.stop();
  },
);

test('a node without GPUs is looked at again with capped backoff, NVML opened afresh each time', async (ctx) => {
  const t = setup(ctx);
  t.node.ids = [];
  await t.scanner.start(false);
  const opens = t.node.opens;
  t.tick(1000);
  await t.scanned(2);
  assert.equal(t.scans[1]?.reason, 'no GPUs yet');
  assert.equal(t.node.opens, opens + 1, 're-opened');
  t.tick(1999);
  assert.equal(t.scans.length, 2);
  t.tick(1);
  await t.scanned(3);
  t.node.ids = [4];
  t.tick(4000);
  await t.scanned(4);
  t.tick(60000);
  assert.equal(t.scans.length, 4, 'GPUs found: no more retries');
  await t.scanner.stop();
});

test(
  'the health thread waits for the first registration (or its hold ' +
    'timer), follows the GPU list, and a lost probe asks for a scan',
  async (ctx) => {
    const t = setup(ctx, { health: true });
    await t.scanner.start(false);
    assert.equal(t.node.watches.length, 0, 'held back until registered');
    t.scanner.releaseWorker();
    assert.deepEqual(
      t.node.watches.map((w) => w.gpus),
      [[uuid(0), uuid(1)]],
    );
    const w = t.node.watches[0]!;
    w.handlers.onProbe(
      new Map([
        [uuid(0), 'ok'],
        [uuid(1), 'lost'],
      ]),
    );
    assert.deepEqual(
      [...t.probes[0]!.entries()],
      [
        [uuid(0), 'ok'],
        [uuid(1), 'lost'],
      ],
      'probes reach the caller by UUID',
    );
    await t.scanned(2);
    assert.equal(t.scans[1]?.reason, 'a GPU is lost');
    // The list changed: the thread is stopped and started on the new one.
    t.node.ids = [0];
    await t.scanner.rescan('re-discovery');
    assert.equal(w.stopped, true);
    assert.deepEqual(t.node.watches.at(-1)?.gpus, [uuid(0)]);
    await t.scanner.stop();
    assert.equal(t.node.watches.at(-1)?.stopped, true);

    const u = setup(ctx, { health: true });
    await u.scanner.start(false);
    u.tick(WORKER_HOLD_MS);
    assert.equal(u.node.watches.length, 1, 'started after the hold without a registration');
    await u.scanner.stop();
  },
);

/** One turn of the event loop (setImmediate is not mocked): promise chains the scanner started have run. */
const turn = (): Promise<void> => new Promise<void>((r) => setImmediate(r));

/** Waits until the scanner has opened NVML `n` times in all. */
const opened = (node: FakeNode, n: number): Promise<void> =>
  waitUntil(() => node.opens === n, { on: onEvent(node, 'open'), what: `NVML opened ${n} times (now ${node.opens})` });
