// The GPU health thread (our C library src/native/nvml_watch.c, through src/nvml/watcher.ts) against
// the fake NVML's real ABI, from source: what it reports (folded batches with counts, MIG ids from the
// v2 wait only, probe answers, GPUs it cannot watch with NVML's code and text), that a driver gone is
// reported once and ends the thread, and that stop() returns while it is blocked in a wait.
import { after, before, test } from 'node:test';
import assert from 'node:assert/strict';
import { EventEmitter } from 'node:events';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { ensureNativeLibrary } from '../../build/native.ts';
import { buildFakeNvml, LIBRARY_NAME } from '../fake-nvml/build.ts';
import type { EventBatchEntry, ProbeResult } from '../../src/core/health-events.ts';
import { Nvml } from '../../src/nvml/nvml.ts';
import { EventWatcher } from '../../src/nvml/watcher.ts';
import type { EventWatcherOptions } from '../../src/nvml/watcher.ts';
import { createLogger } from '../../src/system/log.ts';
import { loadKoffi } from '../../src/system/native.ts';
import { TOPOLOGIES, fakeNvmlStats, nvmlCommand } from '../support/sim.ts';
import { onEvent, waitUntil } from '../support/wait.ts';

let dir: string;
let control: string;
let libs: { current: string; old: string };

before(async () => {
  [libs] = await Promise.all([buildFakeNvml(), ensureNativeLibrary()]);
  dir = mkdtempSync(join(tmpdir(), 'gdp-health-thread-'));
  control = join(dir, 'control');
  process.env.FAKE_NVML_CONFIG = join(TOPOLOGIES, 'demo-8.json');
  process.env.FAKE_NVML_CONTROL = control;
});
after(() => rmSync(dir, { recursive: true, force: true }));

const send = (command: string): void => nvmlCommand(control, command);

/** Resolves once the fake NVML has applied every command sent before (its stats file appears). */
async function applied(): Promise<void> {
  await fakeNvmlStats(send, dir);
}

/** Waits until ok() holds, looking again whenever the health thread reported something. */
const until = (run: Run, what: string, ok: () => boolean): Promise<void> =>
  waitUntil(ok, { on: onEvent(run.reported, 'report'), what });

interface Run {
  nvml: Nvml;
  watcher: EventWatcher;
  lines: string[];
  batches: EventBatchEntry[][];
  probes: ProbeResult[][];
  gone: string[];
  ready: { watched: number[]; unsupported: number[] } | null;
  /** Emits 'report' after each callback of the health thread. */
  reported: EventEmitter;
}

async function watch(variant: 'current' | 'old', extra: Partial<EventWatcherOptions> = {}, gpus = 8): Promise<Run> {
  const lines: string[] = [];
  const log = createLogger({ level: 'debug', journal: false, write: (l) => lines.push(l) });
  const koffi = loadKoffi();
  const nvml = Nvml.open({ koffi, driverRoot: '/', log, library: join(libs[variant], LIBRARY_NAME) });
  const run: Run = {
    nvml,
    watcher: undefined as unknown as EventWatcher,
    lines,
    batches: [],
    probes: [],
    gone: [],
    ready: null,
    reported: new EventEmitter(),
  };
  const report = (): boolean => run.reported.emit('report');
  run.watcher = EventWatcher.start({
    nvml,
    koffi,
    log,
    gpus: Array.from({ length: gpus }, (_, i) => ({ nvmlIndex: i, uuid: `gpu-${i}` })),
    probeIntervalMs: 3_600_000,
    waitTimeoutMs: 200,
    // The watcher names GPUs by UUID (gpu-<index> here); positions keep the assertions short.
    onReady: (watched, unsupported) => {
      run.ready = { watched: watched.map((g) => g.nvmlIndex), unsupported: unsupported.map((g) => g.nvmlIndex) };
      report();
    },
    onEvents: (events) => run.batches.push(events) && report(),
    onProbe: (results) =>
      run.probes.push(Array.from({ length: gpus }, (_, i) => results.get(`gpu-${i}`) ?? 'error')) && report(),
    onDriverGone: (message) => run.gone.push(message) && report(),
    ...extra,
  });
  await until(run, 'the health thread is ready', () => run.ready !== null && run.probes.length > 0);
  return run;
}

async function end(run: Run): Promise<void> {
  await run.watcher.stop(5000);
  run.nvml.shutdown();
}

const total = (run: Run, match: (e: EventBatchEntry) => boolean): number =>
  run.batches
    .flat()
    .filter(match)
    .reduce((n, e) => n + e.count, 0);

test('identical events travel folded with counts; v2 XIDs carry their MIG ids; a NULL device is null', async () => {
  const run = await watch('current');
  try {
    assert.deepEqual(run.ready, { watched: [0, 1, 2, 3, 4, 5, 6, 7], unsupported: [] });
    assert.deepEqual(run.probes[0], ['ok', 'ok', 'ok', 'ok', 'ok', 'ok', 'ok', 'ok']);
    send(
      [...Array.from({ length: 1000 }, () => 'xid 2 79'), 'xid 5 94 1 0', 'xid all 48', 'dbe 6', 'sbe 1'].join('\n'),
    );
    const isXid79 = (e: EventBatchEntry): boolean =>
      e.event.kind === 'xid' && e.event.gpu === 'gpu-2' && e.event.xid === 79;
    await until(
      run,
      'every event reported',
      () => total(run, isXid79) === 1000 && total(run, (e) => e.event.kind === 'ecc-single') === 1,
    );
    const xid79 = run.batches.flat().filter(isXid79);
    assert.ok(xid79.length < 1000, `1000 identical XIDs were folded (${xid79.length} entries)`);
    assert.ok(xid79.every((e) => e.event.kind === 'xid' && e.event.gi === 0xffffffff && e.event.ci === 0xffffffff));
    assert.deepEqual(
      run.batches
        .flat()
        .filter((e) => e.event.kind === 'xid' && e.event.xid === 94)
        .map((e) => e.event),
      [{ kind: 'xid', gpu: 'gpu-5', xid: 94, gi: 1, ci: 0 }],
    );
    assert.deepEqual(
      run.batches
        .flat()
        .filter((e) => e.event.kind === 'xid' && e.event.xid === 48)
        .map((e) => e.event.gpu),
      [null],
    );
    assert.deepEqual(
      run.batches
        .flat()
        .filter((e) => e.event.kind !== 'xid')
        .map((e) => [e.event, e.count]),
      [
        [{ kind: 'ecc-double', gpu: 'gpu-6' }, 1],
        [{ kind: 'ecc-single', gpu: 'gpu-1' }, 1],
      ],
    );
    assert.ok(
      run.batches.every((b) => b.length > 0),
      'no empty batch',
    );
  } finally {
    await end(run);
  }
  assert.deepEqual(
    run.lines.filter((l) => / (ERROR|WARN) /.test(l)),
    [],
  );
});

test('the first wait (an old driver) gives XIDs without MIG ids, and its absence of the second is logged', async () => {
  const run = await watch('old');
  try {
    send('xid 3 79 1 0');
    await until(run, 'the XID reported', () => run.batches.length > 0);
    assert.deepEqual(run.batches.flat(), [{ event: { kind: 'xid', gpu: 'gpu-3', xid: 79 }, count: 1 }]);
    assert.equal(
      run.lines.filter((l) => /NVML lacks a function;.*function=nvmlEventSetWait_v2/.test(l)).length,
      1,
      run.lines.join('\n'),
    );
  } finally {
    await end(run);
  }
});

test("a GPU that cannot be watched is named with NVML's code and text, and probed as an error", async () => {
  const run = await watch('current', {}, 9);
  try {
    assert.deepEqual(run.ready, { watched: [0, 1, 2, 3, 4, 5, 6, 7], unsupported: [] });
    assert.equal(run.probes[0]?.[8], 'error');
    const warn = run.lines.filter((l) => /cannot watch GPU; it is reported by the probe only/.test(l));
    assert.equal(warn.length, 1);
    assert.match(warn[0] ?? '', /nvmlDeviceGetHandleByIndex_v2 failed for GPU 8: .+ \(NVML code \d+\)/);
  } finally {
    await end(run);
  }
});

test('probes report a lost GPU, and it answering again', async () => {
  const run = await watch('current', { probeIntervalMs: 50 });
  try {
    send('lost 4');
    await until(run, 'GPU 4 probed lost', () => run.probes.at(-1)?.[4] === 'lost');
    assert.deepEqual(
      run.probes.at(-1)?.filter((r) => r !== 'ok'),
      ['lost'],
    );
    send('back 4');
    await until(run, 'GPU 4 probed ok again', () => run.probes.at(-1)?.[4] === 'ok');
  } finally {
    await end(run);
  }
});

test("the driver gone: reported once, naming the wait and NVML's code, and the thread ends by itself", async () => {
  const run = await watch('current');
  try {
    send('unload');
    await until(run, 'the driver gone reported', () => run.gone.length > 0);
    assert.match(run.gone[0] ?? '', /^nvmlEventSetWait_v2 failed: .+ \(NVML code 9\)$/);
    // Ended by itself: the stop below only collects it; nothing more is reported meanwhile.
    await run.watcher.stop(5000);
    assert.equal(run.gone.length, 1);
    assert.deepEqual(
      run.lines.filter((l) => /still inside an NVML call/.test(l)),
      [],
    );
  } finally {
    send('load');
    await applied();
    run.nvml.close();
  }
});

test('stop() while the thread is blocked in a long wait returns, and drops what comes after', async () => {
  const run = await watch('current', { waitTimeoutMs: 3000 });
  const stopping = run.watcher.stop(10000);
  send('xid 1 79');
  await stopping;
  await run.watcher.stop(10000);
  run.nvml.shutdown();
  assert.deepEqual(
    run.lines.filter((l) => /still inside an NVML call/.test(l)),
    [],
    'stopped within its wait timeout',
  );
});
