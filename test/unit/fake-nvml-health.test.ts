// Tests of the fake NVML's health states beyond XIDs (test/fake-nvml/fake_health.h) through its real
// C ABI, loaded with koffi as the plugin loads libnvidia-ml.so.1: nvmlFieldValue_t read byte by byte
// (the recovery action with its own return and value type), row remapping, retired pages, ECC
// counters, NVLink links down, PCIe width and replays, clocks-event reasons, the events of those
// types, the fixture keys, the `health` control command, and what an old driver lacks.
import { after, before, test } from 'node:test';
import assert from 'node:assert/strict';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import koffi from 'koffi';
import type { LibraryHandle } from 'koffi';
import { buildFakeNvml, LIBRARY_NAME } from '../fake-nvml/build.ts';
import { TOPOLOGIES } from '../support/sim.ts';

const SUCCESS = 0;
const INVALID_ARGUMENT = 2;
const NOT_SUPPORTED = 3;
const INSUFFICIENT_SIZE = 7;
const TIMEOUT = 10;
const FUNCTION_NOT_FOUND = 13;
const UNKNOWN = 999;
const RECOVERY_FIELD = 230;
const FIELD_VALUE_SIZE = 40;
const EVENT_RETIREMENT = 0x400;
const EVENT_RETIREMENT_FAILURE = 0x800;
const EVENT_RECOVERY = 0x8000;

koffi.pointer('FakeHealthTest_device', koffi.opaque('FakeHealthTest_device_st'));
koffi.pointer('FakeHealthTest_set', koffi.opaque('FakeHealthTest_set_st'));
koffi.struct('FakeHealthTest_event', {
  device: 'FakeHealthTest_device',
  eventType: 'unsigned long long',
  eventData: 'unsigned long long',
  gpuInstanceId: 'unsigned int',
  computeInstanceId: 'unsigned int',
});

function bind(lib: LibraryHandle) {
  const fn = (p: string) => lib.func(p);
  return {
    init: fn('int nvmlInit_v2()'),
    shutdown: fn('int nvmlShutdown()'),
    handleByIndex: fn('int nvmlDeviceGetHandleByIndex_v2(unsigned int i, _Out_ FakeHealthTest_device *d)'),
    fieldValues: fn('int nvmlDeviceGetFieldValues(FakeHealthTest_device d, int n, void *values)'),
    retiredPending: fn('int nvmlDeviceGetRetiredPagesPendingStatus(FakeHealthTest_device d, _Out_ int *pending)'),
    ecc: fn('int nvmlDeviceGetTotalEccErrors(FakeHealthTest_device d, int type, int counter, _Out_ uint64_t *n)'),
    nvlinkState: fn('int nvmlDeviceGetNvLinkState(FakeHealthTest_device d, unsigned int link, _Out_ int *active)'),
    pcieWidth: fn('int nvmlDeviceGetCurrPcieLinkWidth(FakeHealthTest_device d, _Out_ unsigned int *w)'),
    pcieMaxWidth: fn('int nvmlDeviceGetMaxPcieLinkWidth(FakeHealthTest_device d, _Out_ unsigned int *w)'),
    replays: fn('int nvmlDeviceGetPcieReplayCounter(FakeHealthTest_device d, _Out_ unsigned int *n)'),
    throttle: fn('int nvmlDeviceGetCurrentClocksThrottleReasons(FakeHealthTest_device d, _Out_ uint64_t *r)'),
    supportedEvents: fn('int nvmlDeviceGetSupportedEventTypes(FakeHealthTest_device d, _Out_ uint64_t *t)'),
    eventSetCreate: fn('int nvmlEventSetCreate(_Out_ FakeHealthTest_set *s)'),
    registerEvents: fn('int nvmlDeviceRegisterEvents(FakeHealthTest_device d, uint64_t t, FakeHealthTest_set s)'),
    wait: fn('int nvmlEventSetWait(FakeHealthTest_set s, _Inout_ FakeHealthTest_event *e, unsigned int ms)'),
    eventSetFree: fn('int nvmlEventSetFree(FakeHealthTest_set s)'),
  };
}
function bindNewer(lib: LibraryHandle) {
  const fn = (p: string) => lib.func(p);
  return {
    remapped: fn(
      'int nvmlDeviceGetRemappedRows(FakeHealthTest_device d, _Out_ unsigned int ' +
        '*c, _Out_ unsigned int *u, _Out_ unsigned int *p, _Out_ unsigned int *f)',
    ),
    retiredPages: fn(
      'int nvmlDeviceGetRetiredPages_v2(FakeHealthTest_device d, int ' +
        'cause, _Inout_ unsigned int *n, void *addresses, void *timestamps)',
    ),
    clocks: fn('int nvmlDeviceGetCurrentClocksEventReasons(FakeHealthTest_device d, _Out_ uint64_t *r)'),
  };
}
type Api = ReturnType<typeof bind> & ReturnType<typeof bindNewer>;
type OldApi = ReturnType<typeof bind>;

let api: Api;
let oldApi: OldApi;
let tmp = '';
let sessions = 0;

before(async () => {
  const dirs = await buildFakeNvml();
  const lib = koffi.load(path.join(dirs.current, LIBRARY_NAME));
  api = { ...bind(lib), ...bindNewer(lib) };
  oldApi = bind(koffi.load(path.join(dirs.old, LIBRARY_NAME)));
  tmp = fs.mkdtempSync(path.join(os.tmpdir(), 'fake-health-test-'));
});
after(() => fs.rmSync(tmp, { recursive: true, force: true }));

function send(fifo: string, text: string): void {
  const fd = fs.openSync(fifo, fs.constants.O_WRONLY | fs.constants.O_NONBLOCK);
  try {
    fs.writeSync(fd, `${text}\n`);
  } finally {
    fs.closeSync(fd);
  }
}

/** A barrier: commands run in order, so once the stats file exists every earlier one was applied. */
async function settle(fifo: string): Promise<void> {
  const file = path.join(tmp, `stats-${++sessions}.json`);
  send(fifo, `stats ${file}`);
  for (let i = 0; i < 1000 && !fs.existsSync(file); i++) await new Promise((r) => setTimeout(r, 5));
  assert.ok(fs.existsSync(file), 'the fake NVML applied the commands');
}

const A100 = 'NVIDIA A100-SXM4-80GB';
const V100 = 'Tesla V100-SXM2-32GB';
function fixture(gpus: object[], extra: object = {}): object {
  return {
    linkCount: 4,
    gpus: gpus.map((g, i) => ({
      uuid: `GPU-0000000${i}-0000-0000-0000-000000000000`,
      busId: `00000000:0${i + 1}:00.0`,
      name: A100,
      ...g,
    })),
    nvlinks: gpus.length > 1 ? [[0, 1, 2]] : [],
    ...extra,
  };
}

async function session(
  nvml: OldApi,
  config: string | object,
  body: (fifo: string) => Promise<void> | void,
): Promise<void> {
  const file =
    typeof config === 'string' ? path.join(TOPOLOGIES, config) : path.join(tmp, `fixture-${++sessions}.json`);
  if (typeof config !== 'string') fs.writeFileSync(file, JSON.stringify(config));
  const fifo = path.join(tmp, `control-${++sessions}`);
  process.env.FAKE_NVML_CONFIG = file;
  process.env.FAKE_NVML_CONTROL = fifo;
  assert.equal(nvml.init(), SUCCESS);
  try {
    await body(fifo);
  } finally {
    assert.equal(nvml.shutdown(), SUCCESS);
    delete process.env.FAKE_NVML_CONTROL;
  }
}

function gpu(nvml: OldApi, i: number): unknown {
  const out: unknown[] = [null];
  assert.equal(nvml.handleByIndex(i, out), SUCCESS);
  return out[0];
}

interface Field {
  fieldId: number;
  scopeId: number;
  timestamp: bigint;
  valueType: number;
  nvmlReturn: number;
  raw: Buffer;
}

/** nvmlDeviceGetFieldValues on these field ids, each value decoded from nvmlFieldValue_t's bytes. */
function fields(nvml: OldApi, device: unknown, ids: number[]): { rc: number; values: Field[] } {
  const b = Buffer.alloc(FIELD_VALUE_SIZE * ids.length, 0xee);
  ids.forEach((id, i) => {
    b.writeUInt32LE(id, i * FIELD_VALUE_SIZE);
    b.writeUInt32LE(0, i * FIELD_VALUE_SIZE + 4);
  });
  const rc = nvml.fieldValues(device, ids.length, b) as number;
  const values = ids.map((_, i) => {
    const at = i * FIELD_VALUE_SIZE;
    return {
      fieldId: b.readUInt32LE(at),
      scopeId: b.readUInt32LE(at + 4),
      timestamp: b.readBigInt64LE(at + 8),
      valueType: b.readUInt32LE(at + 24),
      nvmlReturn: b.readUInt32LE(at + 28),
      raw: b.subarray(at + 32, at + 40),
    };
  });
  return { rc, values };
}

function recovery(nvml: OldApi, device: unknown): number | string {
  const { rc, values } = fields(nvml, device, [RECOVERY_FIELD]);
  const v = values[0]!;
  if (rc !== SUCCESS) return `call ${rc}`;
  if (v.nvmlReturn !== SUCCESS) return `value ${v.nvmlReturn}`;
  const readers: Record<number, (b: Buffer) => number> = {
    0: (b) => b.readDoubleLE(0),
    1: (b) => b.readUInt32LE(0),
    2: (b) => Number(b.readBigUInt64LE(0)),
    3: (b) => Number(b.readBigUInt64LE(0)),
    4: (b) => Number(b.readBigInt64LE(0)),
    5: (b) => b.readInt32LE(0),
    6: (b) => b.readUInt16LE(0),
  };
  return readers[v.valueType]!(v.raw);
}

function remapped(device: unknown): number[] | number {
  const [c, u, p, f] = [[0], [0], [0], [0]];
  const rc = api.remapped(device, c, u, p, f) as number;
  return rc === SUCCESS ? [c[0]!, u[0]!, p[0]!, f[0]!] : rc;
}

function read1(fn: (d: unknown, out: number[]) => unknown, device: unknown): number | string {
  const out = [0];
  const rc = fn(device, out) as number;
  return rc === SUCCESS ? Number(out[0]) : `rc ${rc}`;
}

function retired(device: unknown, cause: number): { rc: number; count: number } {
  const n = [0];
  const rc = api.retiredPages(device, cause, n, null, null) as number;
  return { rc, count: n[0]! };
}

test('defaults: a healthy GPU at x16; the recovery action read from nvmlFieldValue_t with its own return', async () => {
  await session(api, fixture([{}, { name: V100 }]), () => {
    const a100 = gpu(api, 0);
    const v100 = gpu(api, 1);
    const { rc, values } = fields(api, a100, [RECOVERY_FIELD, 1]);
    assert.equal(rc, SUCCESS);
    assert.equal(values[0]!.fieldId, RECOVERY_FIELD);
    assert.equal(values[0]!.valueType, 1, 'UNSIGNED_INT');
    assert.equal(values[0]!.nvmlReturn, SUCCESS);
    assert.ok(values[0]!.timestamp > 1_600_000_000_000_000n, 'a timestamp in microseconds');
    assert.equal(values[1]!.nvmlReturn, NOT_SUPPORTED, 'a field the fake does not know');
    assert.equal(recovery(api, a100), 0);
    assert.equal(fields(api, a100, []).rc, INVALID_ARGUMENT);
    assert.deepEqual(remapped(a100), [0, 0, 0, 0]);
    assert.equal(remapped(v100), NOT_SUPPORTED, 'no row remapping before Ampere');
    assert.equal(retired(a100, 0).rc, NOT_SUPPORTED, 'no page retirement from Ampere on');
    assert.deepEqual(retired(v100, 1), { rc: SUCCESS, count: 0 });
    assert.equal(read1(api.retiredPending, v100), 0);
    assert.equal(
      read1((d, o) => api.ecc(d, 1, 0, o), a100),
      0,
    );
    assert.equal(read1(api.pcieWidth, a100), 16);
    assert.equal(read1(api.pcieMaxWidth, a100), 16);
    assert.equal(read1(api.replays, a100), 0);
    assert.equal(read1(api.clocks, a100), 0);
    assert.equal(read1(api.throttle, a100), 0);
    assert.equal(
      read1((d, o) => api.nvlinkState(d, 0, o), a100),
      1,
    );
    assert.equal(read1(api.supportedEvents, a100), 0xb, 'the new event types only where configured');
  });
});

test('fixture keys set every state, the value type, and calls unsupported or missing', async () => {
  const health = {
    recoveryAction: 4,
    recoveryActionValueType: 4,
    remappedRows: { corrected: 3, uncorrected: 2, pending: true, failure: false },
    retiredPages: { singleBit: 40, doubleBit: 23, pending: true },
    ecc: { volatileUncorrected: 5, aggregateUncorrected: 7, volatileCorrected: 11, aggregateCorrected: 13 },
    nvlinkDown: [1],
    pcieWidth: 8,
    pcieMaxWidth: 16,
    pcieReplays: 99,
    clocksEventReasons: 0x48,
    unsupported: [],
  };
  const events = ['xid', 'retirement', 'retirement-failure', 'recovery-action'];
  const missing = { unsupported: ['ecc', 'pcie-width', 'recovery-action'], missing: ['clocks', 'nvlink'] };
  await session(api, fixture([{ health, events }, { health: missing }]), () => {
    const d = gpu(api, 0);
    assert.equal(recovery(api, d), 4);
    assert.equal(fields(api, d, [RECOVERY_FIELD]).values[0]!.valueType, 4, 'SIGNED_LONG_LONG');
    assert.deepEqual(remapped(d), [3, 2, 1, 0]);
    assert.deepEqual(retired(d, 0), { rc: INSUFFICIENT_SIZE, count: 40 });
    assert.deepEqual(retired(d, 1), { rc: INSUFFICIENT_SIZE, count: 23 });
    const addresses = new BigUint64Array(23);
    const n = [23];
    assert.equal(api.retiredPages(d, 1, n, addresses, null), SUCCESS);
    assert.equal(new Set(addresses).size, 23, 'distinct page addresses');
    assert.equal(api.retiredPages(d, 2, [0], null, null), INVALID_ARGUMENT, 'an unknown cause');
    assert.equal(read1(api.retiredPending, d), 1);
    assert.deepEqual(
      [
        [1, 0],
        [1, 1],
        [0, 0],
        [0, 1],
      ].map(([t, c]) => read1((x, o) => api.ecc(x, t, c, o), d)),
      [5, 7, 11, 13],
    );
    assert.deepEqual(
      [0, 1, 2].map((l) => read1((x, o) => api.nvlinkState(x, l, o), d)),
      [1, 0, 0],
      'link 1 down; link 2 was never connected',
    );
    assert.deepEqual([read1(api.pcieWidth, d), read1(api.pcieMaxWidth, d), read1(api.replays, d)], [8, 16, 99]);
    assert.equal(read1(api.clocks, d), 0x48);
    assert.equal(read1(api.supportedEvents, d), 0x8 | 0x400 | 0x800 | 0x8000);

    const m = gpu(api, 1);
    assert.equal(recovery(api, m), `value ${NOT_SUPPORTED}`, 'the call works, the field does not');
    assert.equal(
      read1((x, o) => api.ecc(x, 1, 0, o), m),
      `rc ${NOT_SUPPORTED}`,
      'ECC mode off',
    );
    assert.equal(read1(api.pcieWidth, m), `rc ${NOT_SUPPORTED}`);
    assert.equal(read1(api.clocks, m), `rc ${FUNCTION_NOT_FOUND}`);
    assert.equal(
      read1((x, o) => api.nvlinkState(x, 0, o), m),
      `rc ${FUNCTION_NOT_FOUND}`,
    );
    assert.deepEqual(remapped(m), [0, 0, 0, 0], '"unsupported" replaces the board default');
  });
});

test('row remapping answers NOT_SUPPORTED on a MIG-enabled GPU with instances', async () => {
  await session(api, fixture([{ mig: { current: true, instances: ['3g.40gb'] } }, {}]), () => {
    assert.equal(remapped(gpu(api, 0)), NOT_SUPPORTED);
    assert.deepEqual(remapped(gpu(api, 1)), [0, 0, 0, 0]);
  });
});

/** Waits for one event on the set (or TIMEOUT), returning its type and data. */
function next(nvml: OldApi, set: unknown, ms = 2000): { rc: number; type: number; data: number } {
  const e = { device: null, eventType: 0, eventData: 0, gpuInstanceId: 0, computeInstanceId: 0 };
  const rc = nvml.wait(set, e, ms) as number;
  return { rc, type: Number(e.eventType), data: Number(e.eventData) };
}

test('the health command sets and clears each state and fires its event; quiet fires none', async () => {
  const events = ['xid', 'retirement', 'retirement-failure', 'recovery-action'];
  await session(api, fixture([{ events }, { events }]), async (fifo) => {
    const d = gpu(api, 0);
    const set: unknown[] = [null];
    assert.equal(api.eventSetCreate(set), SUCCESS);
    assert.equal(api.registerEvents(d, EVENT_RETIREMENT | EVENT_RETIREMENT_FAILURE | EVENT_RECOVERY, set[0]), SUCCESS);

    send(fifo, 'health 0 recovery-action=1');
    assert.deepEqual(next(api, set[0]), { rc: SUCCESS, type: EVENT_RECOVERY, data: 0 });
    assert.equal(recovery(api, d), 1);
    send(fifo, 'health 0 remap-pending=1 remap-uncorrected=4');
    assert.deepEqual(next(api, set[0]), { rc: SUCCESS, type: EVENT_RETIREMENT, data: 0 });
    assert.deepEqual(remapped(d), [0, 4, 1, 0]);
    send(fifo, 'health 0 remap-failure=1');
    assert.deepEqual(next(api, set[0]), { rc: SUCCESS, type: EVENT_RETIREMENT_FAILURE, data: 0 });
    send(fifo, 'health 0 quiet nvlink-down=0.1 pcie-width=4 pcie-replays=12 clocks=0x80 ecc-volatile=2');
    await settle(fifo);
    assert.equal(next(api, set[0], 50).rc, TIMEOUT, 'quiet: no event');
    assert.deepEqual(
      [0, 1].map((l) => read1((x, o) => api.nvlinkState(x, l, o), d)),
      [0, 0],
    );
    assert.deepEqual([read1(api.pcieWidth, d), read1(api.replays, d), read1(api.clocks, d)], [4, 12, 0x80]);
    assert.equal(
      read1((x, o) => api.ecc(x, 1, 0, o), d),
      2,
    );
    send(fifo, 'health 1 recovery-action=2');
    await settle(fifo);
    assert.equal(next(api, set[0], 50).rc, TIMEOUT, 'another GPU, not registered on this set');

    // A reset clears what a GPU reset clears; the failure and the counters that persist stay.
    send(fifo, 'health 0 reset');
    assert.equal(next(api, set[0]).rc, SUCCESS);
    assert.equal(recovery(api, d), 0);
    assert.deepEqual(remapped(d), [0, 4, 0, 1]);
    assert.equal(
      read1((x, o) => api.ecc(x, 1, 0, o), d),
      0,
    );
    assert.equal(
      read1((x, o) => api.nvlinkState(x, 0, o), d),
      1,
    );
    send(fifo, 'health all clear');
    await settle(fifo);
    assert.deepEqual(remapped(d), [0, 0, 0, 0]);
    assert.equal(recovery(api, gpu(api, 1)), 0);
    assert.deepEqual([read1(api.pcieWidth, d), read1(api.replays, d), read1(api.clocks, d)], [16, 0, 0]);
    send(fifo, 'health 0 unsupported=row-remap,clocks missing=pcie-replay');
    await settle(fifo);
    assert.equal(remapped(d), NOT_SUPPORTED);
    assert.equal(read1(api.clocks, d), `rc ${NOT_SUPPORTED}`);
    assert.equal(read1(api.replays, d), `rc ${FUNCTION_NOT_FOUND}`);
    send(fifo, 'health 0 unsupported=none missing=none');
    await settle(fifo);
    assert.deepEqual(remapped(d), [0, 0, 0, 0]);
    assert.equal(api.eventSetFree(set[0]), SUCCESS);
  });
});

test('a state set through the FIFO outlives shutdown and init, as on a real node', async () => {
  const config = fixture([{}]);
  await session(api, config, async (fifo) => {
    send(fifo, 'health 0 quiet recovery-action=2 retired-sbe=7');
    await settle(fifo);
  });
  await session(api, config, () => {
    assert.equal(recovery(api, gpu(api, 0)), 2);
  });
  await session(api, config, async (fifo) => {
    send(fifo, 'health 0 quiet clear');
    await settle(fifo);
    assert.equal(recovery(api, gpu(api, 0)), 0);
  });
});

test('the old driver lacks the newer calls and the recovery field; the older clocks name answers', async () => {
  await session(oldApi, fixture([{ health: { recoveryAction: 1, clocksEventReasons: 0x8 } }]), () => {
    const d = gpu(oldApi, 0);
    assert.equal(recovery(oldApi, d), `value ${NOT_SUPPORTED}`);
    assert.equal(read1(oldApi.throttle, d), 0x8);
    assert.equal(read1(oldApi.pcieWidth, d), 16);
  });
  const { old } = await buildFakeNvml();
  const lib = koffi.load(path.join(old, LIBRARY_NAME));
  for (const name of [
    'nvmlDeviceGetRemappedRows',
    'nvmlDeviceGetRetiredPages_v2',
    'nvmlDeviceGetCurrentClocksEventReasons',
  ])
    assert.throws(() => lib.func(`int ${name}(void *d)`), /Cannot find function/, name);
});

test('bad health keys and commands are refused', async () => {
  for (const health of [
    { recoveryActionValueType: 7 },
    { remappedRows: { pending: true, bogus: 1 } },
    { unsupported: ['nvlnk'] },
    { nvlinkDown: [99] },
    { colour: 1 },
  ]) {
    const file = path.join(tmp, `bad-${++sessions}.json`);
    fs.writeFileSync(file, JSON.stringify(fixture([{ health }])));
    process.env.FAKE_NVML_CONFIG = file;
    assert.equal(api.init(), UNKNOWN, JSON.stringify(health));
  }
  await session(api, fixture([{}]), async (fifo) => {
    for (const bad of [
      'health 0',
      'health 9 recovery-action=1',
      'health 0 recovery-action',
      'health 0 remap-pending=2',
      'health 0 nvlink-down=x',
      'health 0 colour=1',
      'health 0 recovery-action=1 colour=1',
    ])
      send(fifo, bad);
    await settle(fifo);
    assert.equal(recovery(api, gpu(api, 0)), 0, 'a refused command changes nothing');
  });
});
