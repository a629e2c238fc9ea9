// The health signals as the operator's commands show them: the daemon's state file carries them and
// reads them back (a malformed list is a clear problem), `info` shows each signal per GPU with value,
// class and since when (from the daemon, or from a probe round), and `check` lists which signals each
// GPU's driver supports, which are not available where, and what is bad now.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { parseStateDocument, stateDocument } from '../../src/core/daemon-state.ts';
import type { DaemonState } from '../../src/core/daemon-state.ts';
import { DEFAULT_SIGNAL_POLICY } from '../../src/core/health-signals.ts';
import type { SignalReading } from '../../src/core/health-signals.ts';
import { signalsCheck } from '../../src/cli/check-signals.ts';
import { infoJson } from '../../src/cli/info-format.ts';
import type { NodeReport } from '../../src/cli/inspect.ts';
import { formatSignals, probedGpu, signalPolicyFor } from '../../src/cli/signals-view.ts';

const UUID = (i: number): string => `GPU-${i}0000000-0000-0000-0000-000000000000`;

const BASE: DaemonState = {
  pid: 1,
  version: 'v',
  startedAt: '2026-01-01T00:00:00.000Z',
  publishedAt: '2026-01-01T00:01:00.000Z',
  driverVersion: '580.159.04',
  devices: [],
  resources: [],
  planProblem: null,
  options: {},
};

const WITH_SIGNALS: DaemonState = {
  ...BASE,
  signals: [
    {
      index: 0,
      uuid: UUID(0),
      signals: [
        {
          signal: 'row-remap',
          status: 'bad',
          class: 'critical',
          value: 'pending (0 corrected, 1 uncorrected)',
          action: 'a row remap waits for a GPU reset: drain the GPU, then reset it (nvidia-smi -r -i 0)',
          since: '2026-01-01T00:00:30.000Z',
        },
        { signal: 'retired-pages', status: 'unavailable', class: 'critical', value: '' },
        { signal: 'clocks', status: 'off', class: 'warn', value: '' },
      ],
    },
  ],
};

function healthy(over: Partial<SignalReading['values']> = {}): SignalReading {
  return {
    atMs: 1000,
    values: {
      'recovery-action': 0,
      'row-remap': { corrected: 0, uncorrected: 0, pending: false, failure: false },
      'retired-pages': 'unavailable',
      'ecc-uncorrectable': 0,
      nvlink: [0, 1],
      'pcie-width': { current: 16, max: 16 },
      'pcie-replay': 0,
      clocks: 1,
      ...over,
    },
  };
}

test("the daemon's state carries each GPU's signals and reads them back; a malformed list is refused by name", () => {
  const back = parseStateDocument(stateDocument(WITH_SIGNALS));
  assert.ok('state' in back);
  assert.deepEqual(back.state, WITH_SIGNALS);
  assert.ok('state' in parseStateDocument(stateDocument(BASE)), 'a state without signals is fine');
  const doc = (signals: unknown): string => JSON.stringify({ format: 1, ...BASE, signals });
  const problem = (signals: unknown): string => {
    const r = parseStateDocument(doc(signals));
    assert.ok('problem' in r, `refused: ${JSON.stringify(signals)}`);
    return r.problem;
  };
  assert.match(problem({}), /signals is not a list of GPUs/);
  assert.match(problem([{ index: '0', uuid: 'u', signals: [] }]), /signals is not a list of GPUs .*entry 0/);
  assert.match(problem([{ index: 0, uuid: 'u' }]), /entry 0/);
  const one = (s: Record<string, unknown>): unknown => [{ index: 3, uuid: 'u', signals: [s] }];
  assert.match(
    problem(one({ signal: 'nvlink', status: 'broken', class: 'warn', value: '' })),
    /GPU 3: nvlink: status "broken"/,
  );
  assert.match(problem(one({ signal: 'nvlink', status: 'ok', class: 'fatal', value: '' })), /class "fatal"/);
  assert.match(problem(one({ signal: 'nvlink', status: 'ok', class: 'warn', value: 2 })), /value is not a string/);
  assert.match(problem(one({ signal: 'nvlink', status: 'ok', class: 'warn', value: '', since: 5 })), /since/);
  assert.match(problem(one({ status: 'ok', class: 'warn', value: '' })), /no signal name/);
  assert.match(problem(['x']), /entry 0/);
});

test("info shows the daemon's signals per GPU with status, class, value, since when and what to do", () => {
  const text = formatSignals({ from: 'daemon', publishedAt: BASE.publishedAt, gpus: WITH_SIGNALS.signals });
  const lines = text.split('\n');
  assert.match(lines[0]!, /Health signals beyond XIDs \(the daemon's, state of 2026-01-01T00:01:00.000Z/);
  assert.match(lines[1]!, /^GPU +SIGNAL +STATUS +CLASS +VALUE +SINCE +ACTION$/);
  assert.match(
    lines[2]!,
    /^0 +row-remap +bad +critical +pending \(0 corrected, 1 uncorrected\) +2026-01-01T00:00:30.000Z +a row remap waits/,
  );
  assert.match(lines[3]!, /^0 +retired-pages +unavailable +critical +- +- +-$/);
  assert.match(lines[4]!, /^0 +clocks +off +warn +- +- +-$/);
  assert.match(
    formatSignals({ from: 'daemon', publishedAt: BASE.publishedAt, gpus: undefined }),
    /the daemon watches none/,
  );
});

test("info without a daemon shows one probe round evaluated by the daemon's rules, or why it could not be read", () => {
  const gpu = probedGpu(
    { index: 2, uuid: UUID(2) },
    healthy({ 'recovery-action': 1, 'pcie-width': { current: 8, max: 16 } }),
    DEFAULT_SIGNAL_POLICY,
  );
  assert.deepEqual(gpu.unavailable, ['retired-pages']);
  const byName = new Map(gpu.signals.map((s) => [s.signal, s]));
  assert.deepEqual(byName.get('recovery-action'), {
    signal: 'recovery-action',
    status: 'bad',
    class: 'critical',
    value: 'GPU_RESET',
    action: "the driver asks for a GPU reset: end the GPU's work, then nvidia-smi -r -i 2",
  });
  assert.equal(byName.get('pcie-width')?.class, 'warn');
  assert.equal(byName.get('pcie-width')?.value, 'x8 of x16');
  assert.equal(byName.get('nvlink')?.value, '2 of 2 up');
  assert.equal(byName.get('clocks')?.status, 'ok', 'idle (0x1) is no hardware slowdown');
  const text = formatSignals({ from: 'probe', round: { ok: true, gpus: [gpu] } });
  assert.match(text, /one probe round just now, no daemon runs/);
  assert.match(text, /\n2 +recovery-action +bad +critical +GPU_RESET +- +the driver asks for a GPU reset/);
  assert.match(text, /\n2 +retired-pages +unavailable +critical +- +- +-\n/);
  assert.equal(
    formatSignals({ from: 'probe', round: { ok: false, error: 'cannot start the health thread' } }),
    'Health signals: not read: cannot start the health thread\n',
  );
});

const REPORT: NodeReport = {
  library: 'libnvidia-ml.so.1',
  driverVersion: '580.159.04',
  gpus: [0, 1].map((i) => ({
    index: i,
    uuid: UUID(i),
    name: 'NVIDIA H200',
    minor: i,
    busId: `00000000:0${i}:00.0`,
    memoryBytes: 2 ** 30,
    numaNode: 0,
    health: 'Healthy' as const,
  })),
  pairs: [
    [null, { pcie: 50, nvlinks: 0, nvswitch: false, score: 10 }],
    [{ pcie: 50, nvlinks: 0, nvswitch: false, score: 10 }, null],
  ],
  mig: null,
};

test('info --json: each GPU with its signals and where they come from; a round that failed says why', () => {
  const gpus = [0, 1].map((i) => probedGpu({ index: i, uuid: UUID(i) }, healthy(), DEFAULT_SIGNAL_POLICY));
  const doc = JSON.parse(
    infoJson(REPORT, undefined, undefined, 'mixed', undefined, { from: 'probe', round: { ok: true, gpus } }),
  ) as {
    gpus: { uuid: string; signals: { signal: string; status: string }[]; signalsFrom: string }[];
  };
  assert.equal(doc.gpus[1]!.signalsFrom, 'probe round');
  assert.equal(doc.gpus[1]!.signals.length, 8);
  assert.deepEqual(
    doc.gpus[1]!.signals.find((s) => s.signal === 'retired-pages'),
    {
      signal: 'retired-pages',
      status: 'unavailable',
      class: 'critical',
      value: '',
    },
  );
  const fromDaemon = JSON.parse(
    infoJson(REPORT, undefined, undefined, 'mixed', undefined, {
      from: 'daemon',
      publishedAt: BASE.publishedAt,
      gpus: WITH_SIGNALS.signals,
    }),
  ) as { gpus: { signals?: { since?: string }[]; signalsFrom?: string }[] };
  assert.equal(fromDaemon.gpus[0]!.signalsFrom, 'daemon');
  assert.equal(fromDaemon.gpus[0]!.signals![0]!.since, '2026-01-01T00:00:30.000Z');
  assert.equal(fromDaemon.gpus[1]!.signals, undefined, 'a GPU the daemon has no signals for');
  const failed = JSON.parse(
    infoJson(REPORT, undefined, undefined, 'mixed', undefined, { from: 'probe', round: { ok: false, error: 'boom' } }),
  ) as { signalsError?: string; gpus: { signals?: unknown }[] };
  assert.equal(failed.signalsError, 'boom');
  assert.equal(failed.gpus[0]!.signals, undefined);
});

test(
  'check lists the signals every GPU supports, the ones not ' +
    'available on which GPU, those turned off, and warns of a bad one',
  () => {
    const all = [0, 1, 2].map((i) =>
      probedGpu(
        { index: i, uuid: UUID(i) },
        healthy({ 'retired-pages': { singleBit: 0, doubleBit: 0, pending: false } }),
        DEFAULT_SIGNAL_POLICY,
      ),
    );
    assert.deepEqual(signalsCheck({ ok: true, gpus: all }), {
      status: 'PASS',
      name: 'health signals',
      detail:
        'supported by the driver on every GPU: recovery-action, row-remap, retired-pages, ecc-uncorrectable, nvlink, ' +
        'pcie-width, pcie-replay, clocks',
    });
    const mixed = [
      probedGpu({ index: 0, uuid: UUID(0) }, healthy(), DEFAULT_SIGNAL_POLICY),
      probedGpu(
        { index: 1, uuid: UUID(1) },
        healthy({ nvlink: 'unavailable', clocks: 'unavailable' }),
        DEFAULT_SIGNAL_POLICY,
      ),
    ];
    const policy = signalPolicyFor({ DP_DISABLE_HEALTHCHECKS: 'pcie-replay' });
    assert.equal(policy.signals['pcie-replay'], 'off');
    assert.equal(policy.signals.nvlink, 'critical');
    const off = [probedGpu({ index: 0, uuid: UUID(0) }, healthy(), policy)];
    assert.match(signalsCheck({ ok: true, gpus: off }).detail, /; turned off: pcie-replay$/);
    const line = signalsCheck({ ok: true, gpus: mixed });
    assert.equal(line.status, 'PASS', 'a signal the driver lacks is no alarm');
    assert.equal(
      line.detail,
      'supported by the driver on every GPU: recovery-action, row-remap, ecc-uncorrectable, pcie-width, pcie-replay; ' +
        'not available: retired-pages on every GPU; nvlink on GPU 1; clocks on GPU 1',
    );
    const bad = signalsCheck({
      ok: true,
      gpus: [
        probedGpu(
          { index: 4, uuid: UUID(4) },
          healthy({ 'row-remap': { corrected: 0, uncorrected: 2, pending: true, failure: false } }),
          DEFAULT_SIGNAL_POLICY,
        ),
      ],
    });
    assert.equal(bad.status, 'WARN');
    assert.match(
      bad.detail,
      /^bad now: GPU 4 row-remap=pending \(0 corrected, 2 uncorrected\) \(critical\); supported/,
    );
    assert.equal(signalsCheck({ ok: false, error: 'no probe round within 10000 ms' }).status, 'WARN');
    assert.deepEqual(signalsCheck({ skipped: 'NVML is not available' }), {
      status: 'SKIP',
      name: 'health signals',
      detail: 'not checked: NVML is not available',
    });
    assert.equal(
      signalPolicyFor({ DP_DISABLE_HEALTHCHECKS: 'bogus' }),
      DEFAULT_SIGNAL_POLICY,
      "an invalid variable is the config line's",
    );
  },
);
