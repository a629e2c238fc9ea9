// Partitionable devices in the API server stand-in (test/support/apiserver-counters.ts): a slice's
// sharedCounters and a device's consumesCounters refused on write as the real server refuses them (422 Invalid,
// its messages and field paths, its limits), and poolProblems() finding what the scheduler finds wrong with a
// pool the server accepted: a counter set or counter that does not exist, a name given twice; and the feature
// gate, off before 1.36, under which the server drops those fields without a word.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { ApiServerStandIn } from '../support/apiserver.ts';
import type { Json, JsonObject, Status } from '../support/apiserver.ts';
import { COUNTER_LIMITS, poolProblems } from '../support/apiserver-counters.ts';

const SLICES = '/apis/resource.k8s.io/v1/resourceslices';

async function post(s: ApiServerStandIn, body: JsonObject): Promise<{ code: number; body: JsonObject }> {
  const r = await fetch(new URL(SLICES, s.url), {
    method: 'POST',
    headers: { 'content-type': 'application/json', accept: 'application/json' },
    body: JSON.stringify(body),
  });
  return { code: r.status, body: (await r.json()) as JsonObject };
}

function slice(name: string, spec: JsonObject, gen = 1, count = 1): JsonObject {
  return {
    apiVersion: 'resource.k8s.io/v1',
    kind: 'ResourceSlice',
    metadata: { name },
    spec: {
      driver: 'gpu.example.com',
      nodeName: 'node-a',
      pool: { name: 'node-a', generation: gen, resourceSliceCount: count },
      ...spec,
    },
  };
}

function counters(names: string[], value = '1'): JsonObject {
  return Object.fromEntries(names.map((n) => [n, { value }]));
}

const SLICE_COUNTERS = Array.from({ length: 8 }, (_, i) => `memory-slice-${i}`);

function counterSet(name: string, names: string[] = ['multiprocessors', 'memory', ...SLICE_COUNTERS]): JsonObject {
  return { name, counters: counters(names, '8') };
}

function partition(name: string, consumes: Json[]): JsonObject {
  return {
    name,
    attributes: { type: { string: 'mig' }, profile: { string: '1g.10gb' } },
    capacity: { memory: { value: '10Gi' } },
    consumesCounters: consumes,
  };
}

function uses(set: string, names: string[] = ['multiprocessors', 'memory-slice-0']): JsonObject {
  return { counterSet: set, counters: counters(names) };
}

/** ValidateDNS1123Label's message, word for word (two spaces before "or", as Go's RegexError writes it). */
const LABEL_RULE = [
  "a lowercase RFC 1123 label must consist of lower case alphanumeric characters or '-', and must start and end with ",
  "an alphanumeric character \\(e\\.g\\. 'my-name', {2}or '123-abc', regex used for validation is ",
  "'\\[a-z0-9\\]\\(\\[-a-z0-9\\]\\*\\[a-z0-9\\]\\)\\?'\\)$",
].join('');

const many = (n: number, f: (i: number) => string): string[] => Array.from({ length: n }, (_, i) => f(i));

test('sharedCounters and consumesCounters: each rule of the real server, with its field and message', async (t) => {
  const s = await ApiServerStandIn.start();
  t.after(() => s.stop());
  const sets = (...list: Json[]): JsonObject => ({ sharedCounters: list });
  const devices = (...list: Json[]): JsonObject => ({ devices: list });
  const cases: [string, JsonObject, string, RegExp][] = [
    [
      'counter set beside devices',
      { ...sets(counterSet('gpu-0-counter-set')), ...devices(partition('p', [uses('gpu-0-counter-set')])) },
      'spec',
      /^Invalid value: "": only one of `sharedCounters` or `devices` is allowed$/,
    ],
    [
      'counter sets beside an empty list of devices (a list all the same, as Go decodes it)',
      { ...sets(counterSet('gpu-0-counter-set')), devices: [] },
      'spec',
      /^Invalid value: "": only one of `sharedCounters` or `devices` is allowed$/,
    ],
    [
      'a counter set name in camel case',
      sets(counterSet('memorySlice0')),
      'spec.sharedCounters[0].name',
      new RegExp(`^Invalid value: "memorySlice0": ${LABEL_RULE}`),
    ],
    [
      'a counter set without a name',
      sets({ counters: counters(['memory']) }),
      'spec.sharedCounters[0].name',
      /^Required value$/,
    ],
    [
      'a counter set name of 64 characters',
      sets(counterSet('c'.repeat(64))),
      'spec.sharedCounters[0].name',
      /: must be no more than 63 characters$/,
    ],
    [
      'a counter set with no counters',
      sets({ name: 'gpu-0', counters: {} }),
      'spec.sharedCounters[0].counters',
      /^Required value$/,
    ],
    [
      'a counter name in camel case',
      sets(counterSet('gpu-0', ['copyEngines'])),
      'spec.sharedCounters[0].counters',
      /^Invalid value: "copyEngines": a lowercase RFC 1123 label/,
    ],
    [
      '9 counter sets in one slice',
      sets(...many(9, (i) => `gpu-${i}-counter-set`).map((n) => counterSet(n))),
      'spec.sharedCounters',
      /^Too many: 9: must have at most 8 items$/,
    ],
    [
      '33 counters in one set',
      sets(
        counterSet(
          'gpu-0',
          many(33, (i) => `c-${i}`),
        ),
      ),
      'spec.sharedCounters[0].counters',
      /^Too many: 33: must have at most 32 items$/,
    ],
    [
      'one counter set twice',
      sets(counterSet('gpu-0-counter-set'), counterSet('gpu-0-counter-set')),
      'spec.sharedCounters[1]',
      /^Duplicate value: "gpu-0-counter-set"$/,
    ],
    [
      'a device consuming from 3 counter sets',
      devices(partition('p', [uses('a'), uses('b'), uses('c')])),
      'spec.devices[0].consumesCounters',
      /^Too many: 3: must have at most 2 items$/,
    ],
    [
      'a device consuming from one counter set twice',
      devices(partition('p', [uses('gpu-0'), uses('gpu-0')])),
      'spec.devices[0].consumesCounters[1]',
      /^Duplicate value: "gpu-0"$/,
    ],
    [
      'a consumption naming no counter set',
      devices(partition('p', [{ counters: counters(['memory']) }])),
      'spec.devices[0].consumesCounters[0].counterSet',
      /^Required value$/,
    ],
    [
      'a consumption of no counters',
      devices(partition('p', [{ counterSet: 'gpu-0', counters: {} }])),
      'spec.devices[0].consumesCounters[0].counters',
      /^Required value$/,
    ],
    [
      'a consumed counter in camel case',
      devices(partition('p', [uses('gpu-0', ['memorySlice0'])])),
      'spec.devices[0].consumesCounters[0].counters',
      /^Invalid value: "memorySlice0": a lowercase RFC 1123 label/,
    ],
    [
      'a consumption of 33 counters',
      devices(
        partition('p', [
          uses(
            'gpu-0',
            many(33, (i) => `c-${i}`),
          ),
        ]),
      ),
      'spec.devices[0].consumesCounters[0].counters',
      /^Too many: 33: must have at most 32 items$/,
    ],
    [
      '65 devices consuming counters',
      devices(...many(65, (i) => `p-${i}`).map((n) => partition(n, [uses('gpu-0')]))),
      'spec.devices',
      /^Too many: 65: must have at most 64 items$/,
    ],
  ];
  for (const [what, spec, field, message] of cases) {
    const r = await post(s, slice('x', spec));
    assert.equal(r.code, 422, `${what}: ${JSON.stringify(r.body).slice(0, 300)}`);
    const st = r.body as unknown as Status;
    assert.equal(st.reason, 'Invalid', what);
    const cause = st.details?.causes?.find((c) => c.field === field);
    assert.ok(cause !== undefined, `${what}: no cause for ${field} in ${JSON.stringify(st.details?.causes)}`);
    assert.match(cause.message, message, what);
  }
  assert.equal(s.slices.size, 0, 'nothing invalid was stored');

  // At every limit it is accepted: 8 sets of 32 counters alone in a slice; 64 devices, each consuming 32 counters
  // of each of 2 sets, none of which the server checks exists.
  const full = many(COUNTER_LIMITS.countersPerCounterSet, (i) => `c-${i}`);
  const eight = many(COUNTER_LIMITS.counterSetsPerSlice, (i) => `gpu-${i}-counter-set`).map((n) => counterSet(n, full));
  assert.equal((await post(s, slice('counters', sets(...eight)))).code, 201);
  const two = [uses('gpu-0-counter-set', full), uses('gpu-1-counter-set', full)];
  const parts = many(64, (i) => `p-${i}`).map((n) => partition(n, two));
  assert.equal((await post(s, slice('devices', { ...devices(...parts), nodeName: 'node-b' }))).code, 201);
  const missing = partition('p', [uses('no-such-set')]);
  assert.equal((await post(s, slice('dangling', { ...devices(missing), nodeName: 'node-c' }))).code, 201);
});

test("poolProblems: the scheduler's findings on a pool the server accepted, in the scheduler's words", async () => {
  const sets = slice('node-a-counters', { sharedCounters: [counterSet('gpu-0-counter-set')] }, 2, 2);
  const devs = (...list: JsonObject[]): JsonObject => slice('node-a-devices', { devices: list }, 2, 2);
  const good = partition('gpu-0-mig-1g10gb-19-0', [uses('gpu-0-counter-set')]);
  assert.deepEqual(poolProblems([sets, devs(good)]), []);
  assert.deepEqual(poolProblems([sets, devs(good, partition('p', [uses('gpu-1-counter-set')]))]), [
    'counter set gpu-1-counter-set not found',
  ]);
  assert.deepEqual(poolProblems([sets, devs(partition('p', [uses('gpu-0-counter-set', ['memory-slice-8'])]))]), [
    'counter memory-slice-8 not found in counter set gpu-0-counter-set',
  ]);
  assert.deepEqual(poolProblems([sets, devs(good, good)]), ['duplicate device name gpu-0-mig-1g10gb-19-0']);
  const again = slice('node-a-counters-2', { sharedCounters: [counterSet('gpu-0-counter-set')] }, 2, 3);
  assert.deepEqual(poolProblems([sets, again, devs(good)]), ['duplicate counter set name gpu-0-counter-set']);
  // A slice of an older generation is not part of the pool: its counter set does not count.
  const old = slice('node-a-old', { sharedCounters: [counterSet('gpu-1-counter-set')] }, 1, 1);
  assert.deepEqual(poolProblems([old, sets, devs(partition('p', [uses('gpu-1-counter-set')]))]), [
    'counter set gpu-1-counter-set not found',
  ]);
});

test('the DRAPartitionableDevices gate: off by default before 1.36, the counter fields dropped on write', async (t) => {
  const counterSlice = slice('counters', { sharedCounters: [counterSet('gpu-0-counter-set')] }, 1, 2);
  const deviceSlice = slice('devices', { devices: [partition('p', [uses('gpu-0-counter-set')])] }, 1, 2);
  const stored = async (opts: {
    version: string;
    partitionableDevices?: boolean;
  }): Promise<[JsonObject, JsonObject]> => {
    const s = await ApiServerStandIn.start(opts);
    t.after(() => s.stop());
    const a = await post(s, counterSlice);
    const b = await post(s, deviceSlice);
    assert.deepEqual([a.code, b.code], [201, 201], `${JSON.stringify(a.body)} ${JSON.stringify(b.body)}`);
    const devices = (b.body.spec as JsonObject).devices as JsonObject[];
    return [a.body.spec as JsonObject, devices[0] as JsonObject];
  };
  const [sets135, dev135] = await stored({ version: 'v1.35.4' });
  assert.equal(sets135.sharedCounters, undefined, 'the counter sets dropped: an empty slice');
  assert.equal(dev135.consumesCounters, undefined, 'the partition counts nothing');
  assert.equal(dev135.name, 'p', 'the device itself stays');
  const [setsOn, devOn] = await stored({ version: 'v1.35.4', partitionableDevices: true });
  assert.equal((setsOn.sharedCounters as Json[]).length, 1, 'the gate turned on by the operator');
  assert.equal((devOn.consumesCounters as Json[]).length, 1);
  const [sets136, dev136] = await stored({ version: 'v1.36.0' });
  assert.equal((sets136.sharedCounters as Json[]).length, 1, 'beta, on by default');
  assert.equal((dev136.consumesCounters as Json[]).length, 1);
  const [, devOff] = await stored({ version: 'v1.36.0', partitionableDevices: false });
  assert.equal(devOff.consumesCounters, undefined, 'turned off by the operator');
});
