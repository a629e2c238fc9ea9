// What one probe round of the health signals costs (run by `npm run bench`, or alone after npm run
// build: node test/bench/signals-round.bench.ts), as one JSON object on stdout. In-process, against
// the fake NVML built from source with the demo-8 and nvswitch-16 fixtures, the health thread (our C
// library) started as the daemon starts it, probing every 20 ms:
// * main-thread time per round: the event loop's active time (performance.eventLoopUtilization, which
//   counts this thread only, not the health thread) over 200 rounds, divided by the rounds; with every
//   signal read and each reading evaluated (SignalBook, as the node model does), against the floor of
//   the same thread probing with no signal asked for, in the same run;
// * decode + evaluate per round, timed alone: the signals records decoded (decodeSignalsRecord) and
//   the readings evaluated (SignalBook.apply) for every GPU;
// * NVML calls per round, from the fake library's call counters, with and without the signals.
import { mkdtempSync, readFileSync, rmSync, writeFileSync, existsSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { ensureNativeLibrary } from '../../build/native.ts';
import { buildFakeNvml, LIBRARY_NAME } from '../fake-nvml/build.ts';
import { DEFAULT_SIGNAL_POLICY, SIGNAL_NAMES, SignalBook } from '../../src/core/health-signals.ts';
import type { SignalName, SignalReading } from '../../src/core/health-signals.ts';
import { Nvml } from '../../src/nvml/nvml.ts';
import { decodeSignalsRecord } from '../../src/nvml/signals-record.ts';
import { EventWatcher } from '../../src/nvml/watcher.ts';
import { createLogger } from '../../src/system/log.ts';
import { loadKoffi } from '../../src/system/native.ts';
import { nvmlCommand, TOPOLOGIES } from '../support/sim.ts';
import { r2, stats } from './stats.ts';

const ROUNDS = 200;
const INTERVAL_MS = 20;
const REPEATS = 3;

const [libs] = await Promise.all([buildFakeNvml(), ensureNativeLibrary()]);
const dir = mkdtempSync(join(tmpdir(), 'gdp-bench-signals-'));
const control = join(dir, 'control');
process.env.FAKE_NVML_CONTROL = control;
const log = createLogger({ level: 'error', journal: false, write: (l) => process.stderr.write(l) });
const koffi = loadKoffi();

const r3 = (x: number): number => Math.round(x * 1000) / 1000;
const median = (xs: readonly number[]): number => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)] ?? NaN;

/** The fake library's call counters (its `stats` command, answered in order by its control thread). */
async function calls(): Promise<Record<string, number>> {
  const path = join(dir, `stats-${Math.random()}.json`);
  nvmlCommand(control, `stats ${path}`);
  for (let i = 0; i < 500 && !existsSync(path); i++) await new Promise((r) => setTimeout(r, 10));
  return (JSON.parse(readFileSync(path, 'utf8')) as { calls: Record<string, number> }).calls;
}

interface Round {
  /** Event-loop active ms per round. */
  mainMs: number;
  /** NVML calls per round, by function. */
  calls: Record<string, number>;
  /** ms evaluating each round's readings (signals only). */
  evaluateMs: number[];
  readings: Map<string, SignalReading>;
}

/** ROUNDS probe rounds of `gpus` GPUs every INTERVAL_MS, reading `signals`; what they cost. */
async function rounds(gpus: { nvmlIndex: number; uuid: string }[], signals: readonly SignalName[]): Promise<Round> {
  const nvml = Nvml.open({ koffi, driverRoot: '/', log, library: join(libs.current, LIBRARY_NAME) });
  const book = new SignalBook();
  const evaluateMs: number[] = [];
  let readings = new Map<string, SignalReading>();
  let probes = 0;
  let from = 0;
  let atStart: (() => void) | undefined;
  let atEnd: (() => void) | undefined;
  const started = new Promise<void>((r) => {
    atStart = r;
  });
  const ended = new Promise<void>((r) => {
    atEnd = r;
  });
  const watcher = EventWatcher.start({
    nvml,
    koffi,
    log,
    gpus,
    probeIntervalMs: INTERVAL_MS,
    waitTimeoutMs: 200,
    signals,
    onReady: () => {},
    onEvents: () => {},
    onProbe: () => {
      probes++;
      if (probes === 5) atStart?.();
      if (probes === 5 + ROUNDS) atEnd?.();
    },
    onSignals: (r) => {
      const t = performance.now();
      for (const g of gpus) {
        const reading = r.get(g.uuid);
        if (reading !== undefined) book.apply({ uuid: g.uuid, index: g.nvmlIndex }, reading, DEFAULT_SIGNAL_POLICY);
      }
      evaluateMs.push(performance.now() - t);
      readings = new Map(r);
    },
  });
  // A few rounds to warm up, then ROUNDS measured.
  await started;
  const c0 = await calls();
  from = evaluateMs.length;
  const elu0 = performance.eventLoopUtilization();
  await ended;
  const elu = performance.eventLoopUtilization(elu0);
  const c1 = await calls();
  await watcher.stop(5000);
  nvml.shutdown();
  const perRound: Record<string, number> = {};
  for (const [k, v] of Object.entries(c1)) {
    const d = v - (c0[k] ?? 0);
    if (d > 0) perRound[k] = r2(d / ROUNDS);
  }
  return { mainMs: elu.active / ROUNDS, calls: perRound, evaluateMs: evaluateMs.slice(from), readings };
}

/** µs to decode one round's signals records (40 bytes each, as the thread writes them) for n GPUs. */
function decodeUs(n: number): number {
  const b = Buffer.alloc(40 * n);
  for (let i = 0; i < n; i++) {
    b.writeUInt32LE(14, i * 40);
    b.writeInt32LE(i, i * 40 + 4);
    b.writeUInt8(16, i * 40 + 13);
    b.writeUInt32LE(0x3f, i * 40 + 32);
  }
  const once = (): void => {
    for (let at = 0; at < b.length; at += 40) decodeSignalsRecord(b, at, 0);
  };
  for (let i = 0; i < 2000; i++) once();
  const k = 20000;
  const t = performance.now();
  for (let i = 0; i < k; i++) once();
  return ((performance.now() - t) * 1000) / k;
}

const total = (c: Record<string, number>): number => r2(Object.values(c).reduce((a, b) => a + b, 0));

async function fixture(topology: string): Promise<Record<string, unknown>> {
  const topo = JSON.parse(readFileSync(join(TOPOLOGIES, `${topology}.json`), 'utf8')) as { gpus: { uuid: string }[] };
  const config = join(dir, `${topology}.json`);
  writeFileSync(config, JSON.stringify(topo));
  process.env.FAKE_NVML_CONFIG = config;
  const gpus = topo.gpus.map((g, i) => ({ nvmlIndex: i, uuid: g.uuid }));
  const floor: Round[] = [];
  const signals: Round[] = [];
  // Alternated, so that drift in the machine's load falls on both alike.
  for (let i = 0; i < REPEATS; i++) {
    floor.push(await rounds(gpus, []));
    signals.push(await rounds(gpus, SIGNAL_NAMES));
  }
  const floorMs = median(floor.map((r) => r.mainMs));
  const signalsMs = median(signals.map((r) => r.mainMs));
  const evaluate = stats(signals.flatMap((r) => r.evaluateMs.map((ms) => ms * 1000)));
  const decode = decodeUs(gpus.length);
  const last = signals[signals.length - 1]!;
  const floorCalls = floor[floor.length - 1]!.calls;
  return {
    gpus: gpus.length,
    rounds_each: ROUNDS,
    repeats: REPEATS,
    probe_interval_ms: INTERVAL_MS,
    main_thread_ms_per_round: {
      probe_only_floor: r3(floorMs),
      with_signals: r3(signalsMs),
      ratio: r2(signalsMs / floorMs),
      signals_extra: r3(signalsMs - floorMs),
      each_repeat: {
        floor: floor.map((r) => r3(r.mainMs)),
        signals: signals.map((r) => r3(r.mainMs)),
      },
    },
    decode_and_evaluate_us_per_round: {
      decode_us: r2(decode),
      evaluate_us: evaluate,
      total_us_p50: r2(decode + evaluate.p50),
    },
    nvml_calls_per_round: {
      probe_only_floor: total(floorCalls),
      with_signals: total(last.calls),
      per_gpu_with_signals: r2(total(last.calls) / gpus.length),
      by_function_with_signals: last.calls,
    },
    signals_read: last.readings.size,
  };
}

try {
  const out = { probe_round_8_gpus: await fixture('demo-8'), probe_round_16_gpus: await fixture('nvswitch-16') };
  process.stdout.write(`${JSON.stringify(out, null, 2)}\n`);
} finally {
  rmSync(dir, { recursive: true, force: true });
}
