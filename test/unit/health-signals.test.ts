// The health signals' pure core (src/core/health-signals.ts): each signal's verdict, class, value,
// reason and taint; what clears by itself; the PCIe replay rate over the last minute; the NVLink
// expectation; transitions; the policy with the environment; and the config file's `health` section.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { readConfigFile } from '../../src/config/config.ts';
import { parseHealthSection } from '../../src/config/health-signals.ts';
import { CONFIG_SCHEMA } from '../../src/config/parse-options.ts';
import { parseHealthSettings } from '../../src/core/health-policy.ts';
import {
  DEFAULT_SIGNAL_POLICY,
  SignalBook,
  SIGNAL_NAMES,
  badSignals,
  describeSignalTransition,
  evaluateGpuSignals,
  isLabelValue,
  needsNodeReboot,
  signalPolicyWithEnvironment,
  signalTaints,
  signalTransitions,
  toLabelValue,
  unavailableSignals,
  watchesAnySignal,
} from '../../src/core/health-signals.ts';
import type { GpuSignals, SignalPolicy, SignalReading, SignalValues, Unread } from '../../src/core/health-signals.ts';

type Values = { [K in keyof SignalValues]: SignalValues[K] | Unread };
const HEALTHY: Values = {
  'recovery-action': 0,
  'row-remap': { corrected: 0, uncorrected: 0, pending: false, failure: false },
  'retired-pages': { singleBit: 0, doubleBit: 0, pending: false },
  'ecc-uncorrectable': 0,
  nvlink: [0, 1, 2, 3],
  'pcie-width': { current: 16, max: 16 },
  'pcie-replay': 0,
  clocks: 0,
};

const reading = (over: Partial<Values> = {}, atMs = 0): SignalReading => ({ atMs, values: { ...HEALTHY, ...over } });

/** Evaluates readings in order from nothing, returning every evaluation. */
function run(readings: SignalReading[], policy: SignalPolicy = DEFAULT_SIGNAL_POLICY, index = 3): GpuSignals[] {
  const out: GpuSignals[] = [];
  let g: GpuSignals | undefined;
  for (const r of readings) {
    g = evaluateGpuSignals(g, r, policy, index);
    out.push(g);
  }
  return out;
}
const once = (over: Partial<Values>, policy?: SignalPolicy): GpuSignals => run([reading(over)], policy)[0]!;

test('a healthy reading has every signal ok, no bad signal, no taint', () => {
  const g = once({});
  for (const s of SIGNAL_NAMES) assert.equal(g.states[s].status, 'ok', s);
  assert.deepEqual(badSignals(g), []);
  assert.deepEqual(signalTaints(g, 'gpu.nvidia.com'), []);
  assert.equal(needsNodeReboot(g), false);
});

test('recovery actions: 1-4 and unknown ones critical, 5 a warning, each named, with what to do', () => {
  const cases: [number, string, 'critical' | 'warn', RegExp][] = [
    [1, 'GPU_RESET', 'critical', /nvidia-smi -r -i 3/],
    [2, 'NODE_REBOOT', 'critical', /reboot/],
    [3, 'DRAIN_P2P', 'critical', /peer-to-peer/],
    [4, 'DRAIN_AND_RESET', 'critical', /no new work.*nvidia-smi -r -i 3/],
    [5, 'RECOVER_IMEX_DOMAIN', 'warn', /IMEX/],
    [9, 'ACTION_9', 'critical', /action 9.*nvidia-smi -r -i 3/],
  ];
  for (const [action, name, cls, reason] of cases) {
    const s = once({ 'recovery-action': action }).states['recovery-action'];
    assert.equal(s.bad, true, name);
    assert.equal(s.value, name);
    assert.equal(s.class, cls, name);
    assert.match(s.reason, reason, name);
    assert.equal(s.clearsItself, true);
    assert.deepEqual(s.taint, { name: 'recovery-action', value: name });
  }
  assert.equal(once({ 'recovery-action': 2 }).states['recovery-action'].bad, true);
  assert.equal(needsNodeReboot(once({ 'recovery-action': 2 })), true);
  assert.equal(needsNodeReboot(once({ 'recovery-action': 1 })), false);
});

test('row remap: pending clears by itself after a reset, a failure needs a repair', () => {
  const pending = once({ 'row-remap': { corrected: 2, uncorrected: 1, pending: true, failure: false } });
  const s = pending.states['row-remap'];
  assert.equal(s.class, 'critical');
  assert.equal(s.taint?.value, 'pending');
  assert.equal(s.clearsItself, true);
  assert.match(s.reason, /nvidia-smi -r -i 3/);
  assert.match(s.value, /2 corrected, 1 uncorrected/);
  const failed = once({ 'row-remap': { corrected: 0, uncorrected: 9, pending: true, failure: true } });
  assert.equal(failed.states['row-remap'].taint?.value, 'failed');
  assert.equal(failed.states['row-remap'].clearsItself, false);
  assert.match(failed.states['row-remap'].reason, /repair.*RMA.*does not clear by itself/);
});

test('retired pages: pending and the 63-page limit critical (the limit never clears), 15 double-bit a warning', () => {
  const at = (singleBit: number, doubleBit: number, pending = false) =>
    once({ 'retired-pages': { singleBit, doubleBit, pending } }).states['retired-pages'];
  assert.equal(at(10, 4).bad, false);
  assert.equal(at(10, 4, true).taint?.value, 'pending');
  assert.equal(at(10, 4, true).clearsItself, true);
  assert.equal(at(50, 13).taint?.value, 'limit');
  assert.equal(at(50, 13).class, 'critical');
  assert.equal(at(50, 13).clearsItself, false);
  assert.equal(at(48, 14).bad, false, '62 pages are below the limit');
  assert.equal(at(0, 15).class, 'warn');
  assert.equal(at(0, 15).taint?.value, 'double-bit');
  assert.equal(at(0, 14).bad, false);
});

test('volatile uncorrectable ECC errors above 0 are critical and clear when the counter restarts', () => {
  const [bad, cleared] = run([reading({ 'ecc-uncorrectable': 3 }), reading({ 'ecc-uncorrectable': 0 }, 1000)]);
  assert.equal(bad!.states['ecc-uncorrectable'].value, '3');
  assert.equal(bad!.states['ecc-uncorrectable'].taint?.value, 'volatile');
  assert.equal(bad!.states['ecc-uncorrectable'].class, 'critical');
  assert.equal(cleared!.states['ecc-uncorrectable'].bad, false);
  assert.equal(cleared!.states['ecc-uncorrectable'].value, '0', 'an operator reads the count, also when it is 0');
});

test('NVLink: links active when first seen are expected; one down is critical, named in the taint; back clears', () => {
  const [first, down, back, more] = run([
    reading({ nvlink: [0, 3, 7, 9] }),
    reading({ nvlink: [9] }, 1000),
    reading({ nvlink: [0, 3, 7, 9] }, 2000),
    reading({ nvlink: [0, 1, 3, 7, 9] }, 3000),
  ]);
  assert.equal(first!.states.nvlink.bad, false);
  assert.deepEqual(first!.memory.expectedLinks, [0, 3, 7, 9]);
  assert.equal(down!.states.nvlink.bad, true);
  assert.equal(down!.states.nvlink.value, '0,3,7 down');
  assert.deepEqual(signalTaints(down, 'gpu.nvidia.com'), [
    { key: 'gpu.nvidia.com/nvlink-down', value: '0.3.7', effect: 'NoSchedule' },
  ]);
  assert.equal(back!.states.nvlink.bad, false);
  assert.equal(more!.states.nvlink.bad, false, 'a link more than expected is no fault');
  // A GPU whose NVLink could not be read at first learns its links from the first reading that can.
  const [failed, later, lost] = run([
    reading({ nvlink: 'failed' }),
    reading({ nvlink: [1, 2] }, 1000),
    reading({ nvlink: [1] }, 2000),
  ]);
  assert.equal(failed!.states.nvlink.status, 'unknown');
  assert.equal(later!.states.nvlink.bad, false);
  assert.equal(lost!.states.nvlink.value, '2 down');
});

test('PCIe width below its maximum is a warning with a label-safe taint', () => {
  const s = once({ 'pcie-width': { current: 8, max: 16 } }).states['pcie-width'];
  assert.equal(s.class, 'warn');
  assert.equal(s.value, 'x8 of x16');
  assert.deepEqual(s.taint, { name: 'pcie-width', value: 'x8-of-x16' });
  assert.equal(once({ 'pcie-width': { current: 16, max: 16 } }).states['pcie-width'].bad, false);
  assert.equal(once({ 'pcie-width': { current: 0, max: 16 } }).states['pcie-width'].bad, false, 'no link width read');
});

test('PCIe replays: more than the limit within the last minute, counted over the readings of that minute', () => {
  const counts = (points: [number, number][], policy?: SignalPolicy) =>
    run(
      points.map(([at, n]) => reading({ 'pcie-replay': n }, at)),
      policy,
    ).map((g) => g.states['pcie-replay']);
  // 8 a minute is the limit: not above it.
  assert.deepEqual(
    counts([
      [0, 100],
      [30_000, 104],
      [60_000, 108],
    ]).map((s) => s.bad),
    [false, false, false],
  );
  const fast = counts([
    [0, 100],
    [30_000, 105],
    [60_000, 110],
    [90_000, 111],
    [150_000, 112],
  ]);
  assert.deepEqual(
    fast.map((s) => s.bad),
    [false, false, true, false, false],
  );
  assert.equal(fast[2]!.value, '10/min');
  assert.equal(fast[2]!.taint?.value, 'above-limit');
  assert.equal(fast[2]!.class, 'warn');
  // A probe interval above a minute: the growth scaled to a minute.
  assert.equal(
    counts([
      [0, 0],
      [300_000, 50],
    ])[1]!.value,
    '10/min',
  );
  // A counter that went back (a reset) starts afresh.
  assert.equal(
    counts([
      [0, 500],
      [10_000, 2],
      [20_000, 5],
    ])[2]!.bad,
    false,
  );
  const strict = { ...DEFAULT_SIGNAL_POLICY, pcieReplaysPerMinute: 2 };
  assert.equal(
    counts(
      [
        [0, 0],
        [10_000, 3],
      ],
      strict,
    )[1]!.bad,
    true,
  );
});

test('clocks: the hardware slowdown bits are a warning; software ones are not', () => {
  assert.equal(once({ clocks: 0x4 | 0x20 }).states.clocks.bad, false);
  const s = once({ clocks: 0x8 | 0x80 | 0x4 }).states.clocks;
  assert.equal(s.class, 'warn');
  assert.equal(s.value, 'hw-slowdown,hw-power-brake');
  assert.equal(s.taint?.value, 'hw-slowdown.hw-power-brake');
  assert.equal(once({ clocks: 0x40 }).states.clocks.value, 'hw-thermal-slowdown');
});

test('unavailable sources are never bad; a failed read keeps the previous state', () => {
  const g = once({ 'row-remap': 'unavailable', 'recovery-action': 'unavailable' });
  assert.equal(g.states['row-remap'].status, 'unavailable');
  assert.equal(g.states['row-remap'].bad, false);
  assert.deepEqual(unavailableSignals(reading({ 'row-remap': 'unavailable', clocks: 'unavailable' })), [
    'row-remap',
    'clocks',
  ]);
  const [bad, failed] = run([reading({ 'ecc-uncorrectable': 2 }), reading({ 'ecc-uncorrectable': 'failed' }, 1000)]);
  assert.equal(bad!.states['ecc-uncorrectable'].bad, true);
  assert.deepEqual(failed!.states['ecc-uncorrectable'], bad!.states['ecc-uncorrectable']);
  assert.equal(once({ clocks: 'failed' }).states.clocks.status, 'unknown');
});

test('the policy: off turns a signal off, warn makes a critical state a warning', () => {
  const policy: SignalPolicy = {
    ...DEFAULT_SIGNAL_POLICY,
    signals: { ...DEFAULT_SIGNAL_POLICY.signals, 'ecc-uncorrectable': 'off', 'recovery-action': 'warn' },
  };
  const g = once({ 'ecc-uncorrectable': 5, 'recovery-action': 1 }, policy);
  assert.equal(g.states['ecc-uncorrectable'].status, 'off');
  assert.equal(g.states['ecc-uncorrectable'].bad, false);
  assert.equal(g.states['recovery-action'].class, 'warn');
  assert.deepEqual(badSignals(g, 'critical'), []);
  assert.deepEqual(signalTaints(g, 'gpu.nvidia.com'), [
    { key: 'gpu.nvidia.com/recovery-action', value: 'GPU_RESET', effect: 'None' },
  ]);
});

test('every bad state has a valid taint value, a reason and a value', () => {
  const g = once({
    'recovery-action': 77,
    'row-remap': { corrected: 1, uncorrected: 1, pending: true, failure: true },
    'retired-pages': { singleBit: 99, doubleBit: 99, pending: true },
    'ecc-uncorrectable': 123456789,
    nvlink: [],
    'pcie-width': { current: 1, max: 32 },
    clocks: 0xff,
  });
  for (const s of badSignals(g)) {
    assert.ok(s.taint !== undefined && isLabelValue(s.taint.value), `${s.signal}: ${s.taint?.value}`);
    assert.notEqual(s.reason, '');
    assert.notEqual(s.value, '');
  }
  assert.equal(toLabelValue('-x8/x16 '), 'x8-x16');
  assert.equal(toLabelValue('a'.repeat(70)).length, 63);
  assert.equal(isLabelValue('x8/x16'), false);
  assert.equal(isLabelValue(''), true);
});

test('transitions: bad, changed, cleared, and unavailable said once', () => {
  const [a, b, c, d] = run([
    reading({ 'row-remap': 'unavailable' }),
    reading({ 'row-remap': 'unavailable', 'recovery-action': 1 }, 1000),
    reading({ 'row-remap': 'unavailable', 'recovery-action': 2 }, 2000),
    reading({ 'row-remap': 'unavailable' }, 3000),
  ]);
  assert.deepEqual(
    signalTransitions(undefined, a!).map((t) => [t.signal, t.kind]),
    [['row-remap', 'unavailable']],
  );
  assert.deepEqual(
    signalTransitions(a, b!).map((t) => [t.signal, t.kind]),
    [['recovery-action', 'bad']],
  );
  const changed = signalTransitions(b, c!);
  assert.deepEqual(
    changed.map((t) => [t.signal, t.kind, t.before?.value, t.state.value]),
    [['recovery-action', 'changed', 'GPU_RESET', 'NODE_REBOOT']],
  );
  // A counter moving on while bad is no transition (its taint stays); its class changing is.
  const [e1, e2] = run([reading({ 'ecc-uncorrectable': 1 }), reading({ 'ecc-uncorrectable': 9 }, 1000)]);
  assert.deepEqual(signalTransitions(e1, e2!), []);
  const cleared = signalTransitions(c, d!);
  assert.deepEqual(
    cleared.map((t) => [t.signal, t.kind]),
    [['recovery-action', 'cleared']],
  );
  const line = describeSignalTransition(signalTransitions(a, b!)[0]!, { index: 3, uuid: 'GPU-x' });
  assert.equal(line.level, 'error');
  assert.equal(line.message, 'GPU health signal bad');
  assert.deepEqual(
    { gpu: line.fields.gpu, uuid: line.fields.uuid, signal: line.fields.signal, value: line.fields.value },
    { gpu: 3, uuid: 'GPU-x', signal: 'recovery-action', value: 'GPU_RESET' },
  );
  assert.match(String(line.fields.action), /nvidia-smi -r -i 3/);
  assert.equal(describeSignalTransition(cleared[0]!, { index: 3, uuid: 'GPU-x' }).level, 'info');
  assert.equal(
    describeSignalTransition(signalTransitions(undefined, a!)[0]!, { index: 3, uuid: 'GPU-x' }).level,
    'info',
  );
});

test('the environment: signal names beside XIDs; "all" names every signal, "xids" none; enable wins', () => {
  const s = parseHealthSettings('nvlink, 74,PCIE-WIDTH', 'clocks');
  assert.deepEqual([...s.disabledSignals], ['nvlink', 'pcie-width']);
  assert.deepEqual([...s.enabledSignals], ['clocks']);
  assert.deepEqual([...s.ignoredXids].includes(74), true);
  assert.equal(s.allDisabled, false);
  assert.deepEqual([...parseHealthSettings('xids', undefined).disabledSignals], []);
  assert.deepEqual([...parseHealthSettings('all', undefined).disabledSignals], [...SIGNAL_NAMES]);
  assert.deepEqual([...parseHealthSettings(undefined, 'all').enabledSignals], [...SIGNAL_NAMES]);
  assert.throws(
    () => parseHealthSettings('nvlnk', undefined),
    /^Error: DP_DISABLE_HEALTHCHECKS: "nvlnk" is not an XID/,
  );

  const offInFile: SignalPolicy = {
    ...DEFAULT_SIGNAL_POLICY,
    signals: { ...DEFAULT_SIGNAL_POLICY.signals, clocks: 'off', nvlink: 'warn' },
  };
  const p = signalPolicyWithEnvironment(offInFile, parseHealthSettings('all', 'clocks,nvlink'));
  assert.equal(p.signals.clocks, 'warn', 'enabled at its default class where the file turned it off');
  assert.equal(p.signals.nvlink, 'warn', "enabled at the file's class");
  assert.equal(p.signals['row-remap'], 'off');
  assert.equal(watchesAnySignal(p), true);
  assert.equal(
    watchesAnySignal(signalPolicyWithEnvironment(DEFAULT_SIGNAL_POLICY, parseHealthSettings('all', ''))),
    false,
  );
  assert.deepEqual(signalPolicyWithEnvironment(DEFAULT_SIGNAL_POLICY, parseHealthSettings(undefined, undefined)), {
    ...DEFAULT_SIGNAL_POLICY,
  });
});

test("the config file's health section: defaults, overrides, refusals naming key, value and what is allowed", () => {
  assert.deepEqual(parseHealthSection(undefined), DEFAULT_SIGNAL_POLICY);
  assert.deepEqual(parseHealthSection(null), DEFAULT_SIGNAL_POLICY);
  const p = parseHealthSection({ signals: { clocks: 'off', 'row-remap': 'warn' }, pcieReplaysPerMinute: 20 });
  assert.equal(p.signals.clocks, 'off');
  assert.equal(p.signals['row-remap'], 'warn');
  assert.equal(p.signals.nvlink, 'critical');
  assert.equal(p.pcieReplaysPerMinute, 20);
  assert.deepEqual(parseHealthSection({}), DEFAULT_SIGNAL_POLICY);
  const refusals: [unknown, string][] = [
    [{ signals: { nvlnk: 'off' } }, 'health.signals.nvlnk: unknown signal; expected one of recovery-action, row-remap'],
    [
      { signals: { nvlink: 'warning' } },
      'health.signals.nvlink: "warning" is not allowed; expected critical, warn, off',
    ],
    [{ signals: { nvlink: true } }, 'health.signals.nvlink: true is not allowed; expected critical, warn, off'],
    [{ signals: ['nvlink'] }, 'health.signals: a list is not a map'],
    [{ pcieReplaysPerMinute: -1 }, 'health.pcieReplaysPerMinute: -1 is not allowed; expected a number from 0 to'],
    [{ pcieReplaysPerMinute: '8' }, 'health.pcieReplaysPerMinute: "8" is not allowed'],
    [{ signal: {} }, 'health.signal: unknown key; expected one of signals, pcieReplaysPerMinute'],
    ['on', 'health: "on" is not a map'],
  ];
  for (const [value, message] of refusals)
    assert.throws(
      () => parseHealthSection(value),
      (err: Error) => err.message.startsWith(message),
      message,
    );
  // The caller's own failure (the config file's reader names the file).
  assert.throws(
    () =>
      parseHealthSection({ signals: { x: 'off' } }, (path, message) => {
        throw new RangeError(`config file /etc/x.yaml: ${path}: ${message}`);
      }),
    { name: 'RangeError', message: /^config file \/etc\/x.yaml: health.signals.x: unknown signal/ },
  );
});

test('a signal book keeps each GPU by UUID: transitions per reading, the NVLink expectation kept, forget', () => {
  const book = new SignalBook();
  const gpu = { uuid: 'GPU-a', index: 0 };
  assert.deepEqual(book.apply(gpu, reading({ nvlink: [0, 1] }), DEFAULT_SIGNAL_POLICY), []);
  const down = book.apply(gpu, reading({ nvlink: [1] }, 1000), DEFAULT_SIGNAL_POLICY);
  assert.deepEqual(
    down.map((t) => [t.signal, t.kind, t.state.taint?.value]),
    [['nvlink', 'bad', '0']],
  );
  assert.equal(book.get('GPU-a')?.states.nvlink.bad, true);
  assert.deepEqual(book.uuids(), ['GPU-a']);
  book.forget('GPU-a');
  assert.equal(book.get('GPU-a'), undefined);
  assert.deepEqual(book.apply(gpu, reading({ nvlink: [1] }, 2000), DEFAULT_SIGNAL_POLICY), [], 'first seen again');
});

test('health.signals.<name>: off unquoted in the config file (YAML 1.1 reads it as false) turns the signal off', () => {
  const text = 'version: v1\nhealth:\n  signals:\n    clocks: off\n    nvlink: warn\n';
  const values = readConfigFile('/etc/gpu-device-plugin/config.yaml', CONFIG_SCHEMA, () => text);
  assert.equal(values.health?.signals.clocks, 'off');
  assert.equal(values.health?.signals.nvlink, 'warn');
  assert.throws(
    () => readConfigFile('/c.yaml', CONFIG_SCHEMA, () => 'version: v1\nhealth:\n  signals:\n    clocks: on\n'),
    /health\.signals\.clocks: true is not allowed; expected critical, warn, off/,
  );
});
