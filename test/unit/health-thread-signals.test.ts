// The health thread's signals (src/native/signals.c, decoded by src/nvml/signals-record.ts through
// src/nvml/watcher.ts) against the fake NVML's real ABI, from source: one reading per GPU with every
// probe, an immediate read of a GPU its recovery-action or retirement event (or XID 154) names, the
// signals the driver lacks reported unavailable (older library, NOT_SUPPORTED, a field's own return),
// only supported event types registered, and nothing read when no signal is asked for.
import { after, before, test } from 'node:test';
import assert from 'node:assert/strict';
import { EventEmitter } from 'node:events';
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { ensureNativeLibrary } from '../../build/native.ts';
import { buildFakeNvml, LIBRARY_NAME } from '../fake-nvml/build.ts';
import { SIGNAL_NAMES } from '../../src/core/health-signals.ts';
import type { SignalName, SignalReading } from '../../src/core/health-signals.ts';
import { Nvml } from '../../src/nvml/nvml.ts';
import { EventWatcher } from '../../src/nvml/watcher.ts';
import type { EventWatcherOptions } from '../../src/nvml/watcher.ts';
import { createLogger } from '../../src/system/log.ts';
import { loadKoffi } from '../../src/system/native.ts';
import { fakeNvmlStats, nvmlCommand } from '../support/sim.ts';
import { onEvent, waitUntil } from '../support/wait.ts';

let dir: string;
let control: string;
let libs: { current: string; old: string };

const EVENTS = ['xid', 'dbe', 'sbe', 'retirement', 'retirement-failure', 'recovery-action'];
const GPUS = [
  { name: 'NVIDIA A100-SXM4-80GB', events: EVENTS, health: { recoveryActionValueType: 4 } },
  { name: 'NVIDIA A100-SXM4-80GB', events: EVENTS },
  { name: 'Tesla V100-SXM2-32GB', events: ['xid'], health: { pcieWidth: 8, clocksEventReasons: 0x40 } },
];

before(async () => {
  [libs] = await Promise.all([buildFakeNvml(), ensureNativeLibrary()]);
  dir = mkdtempSync(join(tmpdir(), 'gdp-signals-thread-'));
  control = join(dir, 'control');
  const config = join(dir, 'node.json');
  writeFileSync(
    config,
    JSON.stringify({
      linkCount: 4,
      gpus: GPUS.map((g, i) => ({
        uuid: `GPU-${i}0000000-0000-0000-0000-000000000000`,
        busId: `00000000:0${i + 1}:00.0`,
        ...g,
      })),
      nvlinks: [
        [0, 1, 2],
        [1, 2, 1],
      ],
    }),
  );
  process.env.FAKE_NVML_CONFIG = config;
  process.env.FAKE_NVML_CONTROL = control;
});
after(() => rmSync(dir, { recursive: true, force: true }));

const send = (command: string): void => nvmlCommand(control, command);

/** Resolves once the fake NVML has applied every command sent before (its stats file appears). */
async function applied(): Promise<void> {
  await fakeNvmlStats(send, dir);
}

/** Emits 'report' after each callback of a health thread. */
const reported = new EventEmitter();

/** Waits until ok() holds, looking again whenever a health thread reported something. */
const until = (what: string, ok: () => boolean, ms = 10000): Promise<void> =>
  waitUntil(ok, { on: onEvent(reported, 'report'), what, deadlineMs: ms });

interface Run {
  nvml: Nvml;
  watcher: EventWatcher;
  lines: string[];
  readings: Map<string, SignalReading>[];
  ready: boolean;
  probes: number;
}

async function watch(
  variant: 'current' | 'old',
  signals: readonly SignalName[] = SIGNAL_NAMES,
  extra: Partial<EventWatcherOptions> = {},
): Promise<Run> {
  const lines: string[] = [];
  const log = createLogger({ level: 'debug', journal: false, write: (l) => lines.push(l) });
  const koffi = loadKoffi();
  const nvml = Nvml.open({ koffi, driverRoot: '/', log, library: join(libs[variant], LIBRARY_NAME) });
  const run: Run = {
    nvml,
    watcher: undefined as unknown as EventWatcher,
    lines,
    readings: [],
    ready: false,
    probes: 0,
  };
  let clock = 0;
  run.watcher = EventWatcher.start({
    nvml,
    koffi,
    log,
    gpus: GPUS.map((_, i) => ({ nvmlIndex: i, uuid: `gpu-${i}` })),
    probeIntervalMs: 3_600_000,
    waitTimeoutMs: 200,
    signals,
    onReady: () => {
      run.ready = true;
      reported.emit('report');
    },
    onEvents: () => {},
    onProbe: () => {
      run.probes++;
      reported.emit('report');
    },
    onSignals: (r) => run.readings.push(new Map(r)) && reported.emit('report'),
    now: () => ++clock,
    ...extra,
  });
  await until('the health thread is ready and probed', () => run.ready && run.probes > 0);
  return run;
}

async function end(run: Run): Promise<void> {
  await run.watcher.stop(5000);
  run.nvml.shutdown();
}

/** Clears what a test set on the fake GPUs (FIFO state outlives nvmlShutdown within the process). */
async function clear(): Promise<void> {
  const nvml = Nvml.open({
    koffi: loadKoffi(),
    driverRoot: '/',
    log: createLogger({ level: 'error', journal: false, write: () => {} }),
    library: join(libs.current, LIBRARY_NAME),
  });
  send('health all quiet clear');
  await applied();
  nvml.shutdown();
}

test('every probe reads each GPU once: values, what the board lacks, and the links active now', async () => {
  const run = await watch('current');
  try {
    await until('the first readings', () => run.readings.length > 0);
    const first = run.readings[0]!;
    assert.deepEqual([...first.keys()], ['gpu-0', 'gpu-1', 'gpu-2']);
    assert.deepEqual(first.get('gpu-0')!.values, {
      'recovery-action': 0,
      'row-remap': { corrected: 0, uncorrected: 0, pending: false, failure: false },
      'retired-pages': 'unavailable',
      'ecc-uncorrectable': 0,
      nvlink: [0, 1],
      'pcie-width': { current: 16, max: 16 },
      'pcie-replay': 0,
      clocks: 0,
    });
    const v100 = first.get('gpu-2')!.values;
    assert.equal(v100['row-remap'], 'unavailable', 'no row remapping before Ampere');
    assert.deepEqual(v100['retired-pages'], { singleBit: 0, doubleBit: 0, pending: false });
    assert.deepEqual(v100['pcie-width'], { current: 8, max: 16 });
    assert.equal(v100.clocks, 0x40);
    assert.deepEqual(v100.nvlink, [0]);
    assert.deepEqual(
      run.lines.filter((l) => / (ERROR|WARN) /.test(l)),
      [],
    );
  } finally {
    await end(run);
  }
});

test("an event names its GPU for an immediate read of that GPU's signals; XID 154 does too", async () => {
  const run = await watch('current');
  try {
    await until('the first readings', () => run.readings.length > 0);
    send('health 0 recovery-action=3');
    await until('GPU 0 read at once', () => run.readings.length > 1);
    assert.deepEqual([...run.readings[1]!.keys()], ['gpu-0']);
    assert.equal(run.readings[1]!.get('gpu-0')!.values['recovery-action'], 3, 'a signed long long field value');

    send('health 1 remap-pending=1 remap-uncorrected=2');
    await until('GPU 1 read at once', () => run.readings.length > 2);
    assert.deepEqual(run.readings[2]!.get('gpu-1')!.values['row-remap'], {
      corrected: 0,
      uncorrected: 2,
      pending: true,
      failure: false,
    });

    // Without an event the state waits for the next probe; XID 154 asks for the read.
    send('health 1 quiet recovery-action=1 nvlink-down=1');
    send('health 2 recovery-action=5'); // GPU 2 supports no recovery-action events: nothing is read
    await applied();
    send('xid 1 154');
    await until('GPU 1 read after XID 154', () => run.readings.length > 3);
    assert.deepEqual([...run.readings[3]!.keys()], ['gpu-1']);
    assert.equal(run.readings[3]!.get('gpu-1')!.values['recovery-action'], 1);
    assert.deepEqual(run.readings[3]!.get('gpu-1')!.values.nvlink, [0, 2]);
    assert.equal(run.readings.length, 4);
    assert.equal(run.probes, 1, 'no probe meanwhile');
    const stamps = run.readings.flatMap((r) => [...r.values()].map((x) => x.atMs));
    assert.ok(
      stamps.every((t, i) => i === 0 || t >= stamps[i - 1]!),
      'stamped by the clock given',
    );
  } finally {
    await end(run);
    await clear();
  }
});

test('only the signals asked for are read; none asked: no reading and no signals event registered', async () => {
  const some = await watch('current', ['clocks', 'pcie-width']);
  try {
    await until('the first readings', () => some.readings.length > 0);
    const v = some.readings[0]!.get('gpu-2')!.values;
    assert.equal(v.clocks, 0x40);
    assert.equal(v['recovery-action'], 'failed', 'not read');
    assert.equal(v.nvlink, 'failed', 'not read');
  } finally {
    await end(some);
  }
  const none = await watch('current', [], { probeIntervalMs: 50 });
  try {
    await until('a few probes', () => none.probes >= 3);
    send('health 0 recovery-action=1');
    send('xid 0 154');
    await applied();
    await until('another probe', () => none.probes >= 5);
    assert.equal(none.readings.length, 0);
  } finally {
    await end(none);
    await clear();
  }
});

test('an older library: the calls it lacks and the field it does not know are unavailable, never errors', async () => {
  const run = await watch('old');
  try {
    await until('the first readings', () => run.readings.length > 0);
    const v = run.readings[0]!.get('gpu-0')!.values;
    assert.equal(v['recovery-action'], 'unavailable', "the field's own return");
    assert.equal(v['row-remap'], 'unavailable', 'nvmlDeviceGetRemappedRows is missing');
    assert.equal(v['retired-pages'], 'unavailable', 'nvmlDeviceGetRetiredPages_v2 is missing');
    assert.equal(v.clocks, 0, 'read through the older name of the call');
    assert.deepEqual(v['pcie-width'], { current: 16, max: 16 });
    assert.deepEqual(
      run.lines.filter((l) => / (ERROR|WARN) /.test(l) && !/nvmlEventSetWait_v2/.test(l)),
      [],
    );
  } finally {
    await end(run);
  }
});

test('NOT_SUPPORTED and FUNCTION_NOT_FOUND make a signal unavailable; a lost GPU makes every read fail', async () => {
  const run = await watch('current', SIGNAL_NAMES, { probeIntervalMs: 50 });
  try {
    send('health 0 quiet unsupported=ecc,pcie-replay missing=nvlink,clocks');
    await applied();
    const from = run.readings.length;
    await until('a reading after the change', () => run.readings.length > from);
    const v = run.readings.at(-1)!.get('gpu-0')!.values;
    assert.deepEqual(
      [v['ecc-uncorrectable'], v['pcie-replay'], v.nvlink, v.clocks],
      ['unavailable', 'unavailable', 'unavailable', 'unavailable'],
    );
    send('lost 1');
    await applied();
    const lost = run.readings.length;
    await until('a reading with GPU 1 lost', () => run.readings.length > lost);
    assert.ok(SIGNAL_NAMES.every((s) => run.readings.at(-1)!.get('gpu-1')!.values[s] === 'failed'));
    send('back 1');
  } finally {
    await end(run);
    await clear();
  }
});
