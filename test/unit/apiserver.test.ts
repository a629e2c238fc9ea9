// The API server stand-in (test/support/apiserver.ts): ResourceSlice CRUD with resourceVersion
// conflicts, the API server's validation rules, the stored form (canonical quantities, unknown
// fields dropped), bearer-token authorization (401/403), ResourceClaims and Nodes, and down/up;
// consumable capacity (requestPolicy), allocations' shares and configs, DeviceClasses.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { request } from 'node:http';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import {
  ApiServerStandIn,
  HttpError,
  LIMITS,
  canonicalQuantity,
  isExtendedResourceName,
} from '../support/apiserver.ts';
import type { Json, JsonObject, Status } from '../support/apiserver.ts';

interface Reply {
  code: number;
  body: JsonObject;
  headers: Record<string, string | string[] | undefined>;
}

/** One HTTP request to the stand-in, on a connection of its own (no keep-alive pool to go stale across down()). */
function call(
  s: ApiServerStandIn,
  method: string,
  path: string,
  opts: { token?: string; body?: Json } = {},
): Promise<Reply> {
  const payload = opts.body === undefined ? undefined : Buffer.from(JSON.stringify(opts.body));
  const u = new URL(path, s.url);
  return new Promise((resolve, reject) => {
    const req = request(
      {
        ...(s.socketPath !== undefined ? { socketPath: s.socketPath } : { host: u.hostname, port: u.port }),
        agent: false,
        method,
        path: u.pathname + u.search,
        headers: {
          accept: 'application/json',
          ...(payload !== undefined
            ? { 'content-type': 'application/json', 'content-length': String(payload.length) }
            : {}),
          ...(opts.token !== undefined ? { authorization: `Bearer ${opts.token}` } : {}),
        },
      },
      (res) => {
        const chunks: Buffer[] = [];
        res.on('data', (c: Buffer) => chunks.push(c));
        res.on('end', () =>
          resolve({
            code: res.statusCode ?? 0,
            body: JSON.parse(Buffer.concat(chunks).toString('utf8')) as JsonObject,
            headers: res.headers,
          }),
        );
      },
    );
    req.on('error', reject);
    req.end(payload);
  });
}

const SLICES = '/apis/resource.k8s.io/v1/resourceslices';

function slice(name: string, over: JsonObject = {}, devices: Json[] = [gpu('gpu-0')]): JsonObject {
  return {
    apiVersion: 'resource.k8s.io/v1',
    kind: 'ResourceSlice',
    metadata: { name },
    spec: {
      driver: 'gpu.example.com',
      nodeName: 'node-a',
      pool: { name: 'node-a', generation: 1, resourceSliceCount: 1 },
      devices,
      ...over,
    },
  };
}

function gpu(name: string, extra: JsonObject = {}): JsonObject {
  return {
    name,
    attributes: {
      type: { string: 'gpu' },
      driverVersion: { version: '580.65.6' },
      'resource.kubernetes.io/pciBusID': { string: '0000:65:00.0' },
    },
    capacity: { memory: { value: '80Gi' } },
    ...extra,
  };
}

function counterSet(name: string): JsonObject {
  return { name, counters: { multiprocessors: { value: '98' }, 'memory-slice-0': { value: '1' } } };
}

function consumption(counterSet: string): JsonObject {
  return { counterSet, counters: { 'memory-slice-0': { value: '1' } } };
}

function meta(o: JsonObject): JsonObject {
  return o.metadata as JsonObject;
}

function asStatus(r: Reply): Status {
  assert.equal(r.body.kind, 'Status', JSON.stringify(r.body));
  return r.body as unknown as Status;
}

test(
  'ResourceSlices: create fills metadata, get and list ' + 'read it back, fieldSelector filters, delete removes',
  async (t) => {
    const s = await ApiServerStandIn.start();
    t.after(() => s.stop());
    const created = await call(s, 'POST', SLICES, { body: slice('node-a-gpu') });
    assert.equal(created.code, 201);
    const m = meta(created.body);
    assert.equal(m.name, 'node-a-gpu');
    assert.match(String(m.uid), /^[0-9a-f-]{36}$/);
    assert.equal(m.generation, 1);
    assert.match(String(m.resourceVersion), /^\d+$/);
    assert.match(String(m.creationTimestamp), /^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ$/);

    const gen = await call(s, 'POST', SLICES, {
      body: {
        ...slice(''),
        metadata: { generateName: 'node-b-gpu.example.com-' },
        spec: { ...(slice('x').spec as JsonObject), nodeName: 'node-b', driver: 'other.example.com' },
      },
    });
    assert.equal(gen.code, 201, JSON.stringify(gen.body));
    assert.match(String(meta(gen.body).name), /^node-b-gpu\.example\.com-[bcdfghjklmnpqrstvwxz2456789]{5}$/);

    const got = await call(s, 'GET', `${SLICES}/node-a-gpu`);
    assert.equal(got.code, 200);
    assert.deepEqual(got.body, created.body);

    const all = await call(s, 'GET', SLICES);
    assert.equal(all.body.kind, 'ResourceSliceList');
    assert.equal(all.body.apiVersion, 'resource.k8s.io/v1');
    const items = all.body.items as JsonObject[];
    assert.equal(items.length, 2);
    assert.equal(items[0]?.kind, undefined, "list items carry no kind, as the real server's");

    const mine = await call(
      s,
      'GET',
      `${SLICES}?fieldSelector=${encodeURIComponent('spec.nodeName=node-a,spec.driver=gpu.example.com')}`,
    );
    assert.deepEqual(
      (mine.body.items as JsonObject[]).map((i) => meta(i).name),
      ['node-a-gpu'],
    );
    const notMine = await call(
      s,
      'GET',
      `${SLICES}?fieldSelector=${encodeURIComponent('spec.driver!=gpu.example.com')}`,
    );
    assert.deepEqual(
      (notMine.body.items as JsonObject[]).map((i) => (i.spec as JsonObject).driver),
      ['other.example.com'],
    );
    const badSel = await call(s, 'GET', `${SLICES}?fieldSelector=spec.pool.name%3Dx`);
    assert.equal(badSel.code, 400);
    assert.equal(asStatus(badSel).message, 'field label not supported: spec.pool.name');

    const del = await call(s, 'DELETE', `${SLICES}/node-a-gpu`);
    assert.equal(del.code, 200);
    assert.equal(asStatus(del).status, 'Success');
    const gone = await call(s, 'GET', `${SLICES}/node-a-gpu`);
    assert.equal(gone.code, 404);
    assert.deepEqual(gone.body, {
      kind: 'Status',
      apiVersion: 'v1',
      metadata: {},
      status: 'Failure',
      message: 'resourceslices.resource.k8s.io "node-a-gpu" not found',
      reason: 'NotFound',
      details: { name: 'node-a-gpu', group: 'resource.k8s.io', kind: 'resourceslices' },
      code: 404,
    });
  },
);

test(
  'ResourceSlices: a stale resourceVersion is a 409 Conflict, a ' +
    'second create 409 AlreadyExists; the generation follows the spec',
  async (t) => {
    const s = await ApiServerStandIn.start();
    t.after(() => s.stop());
    const first = (await call(s, 'POST', SLICES, { body: slice('a') })).body;
    const dup = await call(s, 'POST', SLICES, { body: slice('a') });
    assert.equal(dup.code, 409);
    assert.equal(asStatus(dup).reason, 'AlreadyExists');
    assert.equal(asStatus(dup).message, 'resourceslices.resource.k8s.io "a" already exists');

    // Two writers read the same version; the first update wins, the second conflicts.
    const bumped = {
      ...first,
      spec: { ...(first.spec as JsonObject), pool: { name: 'node-a', generation: 2, resourceSliceCount: 1 } },
    };
    const ok = await call(s, 'PUT', `${SLICES}/a`, { body: bumped });
    assert.equal(ok.code, 200);
    assert.notEqual(meta(ok.body).resourceVersion, meta(first).resourceVersion);
    assert.equal(meta(ok.body).generation, 2);
    assert.equal(meta(ok.body).uid, meta(first).uid);
    const stale = await call(s, 'PUT', `${SLICES}/a`, { body: bumped });
    assert.equal(stale.code, 409);
    assert.deepEqual(stale.body, {
      kind: 'Status',
      apiVersion: 'v1',
      metadata: {},
      status: 'Failure',
      message:
        'Operation cannot be fulfilled on resourceslices.resource.k8s.io "a": the object ' +
        'has been modified; please apply your changes to the latest version and try again',
      reason: 'Conflict',
      details: { name: 'a', group: 'resource.k8s.io', kind: 'resourceslices' },
      code: 409,
    });

    // The same object again: nothing is written, the resourceVersion stays.
    const same = await call(s, 'PUT', `${SLICES}/a`, { body: ok.body });
    assert.equal(same.code, 200);
    assert.deepEqual(same.body, ok.body);
    // Without a resourceVersion the update is unconditional; a label change bumps the version, not the generation.
    const unconditional = { ...ok.body, metadata: { name: 'a', labels: { tier: 'gpu' } } };
    const labelled = await call(s, 'PUT', `${SLICES}/a`, { body: unconditional });
    assert.equal(labelled.code, 200);
    assert.notEqual(meta(labelled.body).resourceVersion, meta(ok.body).resourceVersion);
    assert.equal(meta(labelled.body).generation, 2);

    assert.equal((await call(s, 'PUT', `${SLICES}/missing`, { body: slice('missing') })).code, 404);
    const wrongName = await call(s, 'PUT', `${SLICES}/a`, { body: slice('b') });
    assert.equal(wrongName.code, 400);
    assert.match(String(asStatus(wrongName).message), /does not match the name on the URL/);

    const cur = (await call(s, 'GET', `${SLICES}/a`)).body;
    const pre = await call(s, 'DELETE', `${SLICES}/a`, {
      body: {
        kind: 'DeleteOptions',
        apiVersion: 'v1',
        preconditions: { resourceVersion: meta(first).resourceVersion ?? null },
      },
    });
    assert.equal(pre.code, 409);
    assert.match(String(asStatus(pre).message), /Precondition failed: ResourceVersion in precondition/);
    assert.equal(
      (
        await call(s, 'DELETE', `${SLICES}/a`, {
          body: { preconditions: { resourceVersion: meta(cur).resourceVersion ?? null } },
        })
      ).code,
      200,
    );
  },
);

test("ResourceSlices: the API server's validation answers 422 Invalid with the field of each cause", async (t) => {
  const s = await ApiServerStandIn.start();
  t.after(() => s.stop());
  const many = (n: number, extra: JsonObject = {}): Json[] =>
    Array.from({ length: n }, (_, i) => gpu(`gpu-${i}`, extra));
  const taint = { taints: [{ key: 'gpu.example.com/xid', value: '79', effect: 'NoSchedule' }] };
  const attrs33: JsonObject = Object.fromEntries(Array.from({ length: 32 }, (_, i) => [`a${i}`, { int: i }]));
  const cases: [string, JsonObject, string, RegExp][] = [
    ['device name not a DNS label', slice('x', {}, [gpu('GPU_0')]), 'spec.devices[0].name', /RFC 1123 label/],
    [
      'duplicate device names',
      slice('x', {}, [gpu('gpu-0'), gpu('gpu-0')]),
      'spec.devices[1].name',
      /Duplicate value: "gpu-0"/,
    ],
    [
      '129 devices',
      slice('x', {}, many(LIMITS.devicesPerSlice + 1)),
      'spec.devices',
      /Too many: 129: must have at most 128 items/,
    ],
    [
      '65 devices with taints',
      slice('x', {}, many(LIMITS.devicesPerSliceWithTaintsOrCounters + 1, taint)),
      'spec.devices',
      /must have at most 64 items/,
    ],
    [
      'no pool name',
      slice('x', { pool: { generation: 0, resourceSliceCount: 1 } }),
      'spec.pool.name',
      /Required value/,
    ],
    [
      'resourceSliceCount 0',
      slice('x', { pool: { name: 'p', generation: 0, resourceSliceCount: 0 } }),
      'spec.pool.resourceSliceCount',
      /Invalid value: 0: must be greater than zero/,
    ],
    [
      'negative generation',
      slice('x', { pool: { name: 'p', generation: -1, resourceSliceCount: 1 } }),
      'spec.pool.generation',
      /Invalid value: -1: must be greater than or equal to zero/,
    ],
    [
      'nodeName and allNodes',
      slice('x', { allNodes: true }),
      'spec',
      new RegExp(
        'Invalid value: "\\{`nodeName`, `allNodes`\\}": exactly one of `nodeName`, `nodeSelector`, ' +
          '`allNodes`, `perDeviceNodeSelection` is required, but multiple fields are set',
      ),
    ],
    ['no node selection', slice('x', { nodeName: null }), 'spec', /exactly one of/],
    ['no driver', slice('x', { driver: '' }), 'spec.driver', /Required value/],
    [
      'driver too long',
      slice('x', { driver: `${'d'.repeat(60)}.com` }),
      'spec.driver',
      /Too long: may not be more than 63/,
    ],
    [
      'attribute name not a C identifier',
      slice('x', {}, [gpu('gpu-0', { attributes: { 'cuda-cc': { string: '9.0' } } })]),
      'spec.devices[0].attributes[cuda-cc]',
      /a valid C identifier must start with alphabetic character/,
    ],
    [
      'string over 64',
      slice('x', {}, [gpu('gpu-0', { attributes: { productName: { string: 'x'.repeat(65) } } })]),
      'spec.devices[0].attributes[productName].string',
      /Too long: may not be more than 64 bytes/,
    ],
    [
      'version not semver',
      slice('x', {}, [gpu('gpu-0', { attributes: { cc: { version: '9.0' } } })]),
      'spec.devices[0].attributes[cc].version',
      /Invalid value: "9.0": must be a string compatible with semver.org spec 2.0.0/,
    ],
    [
      'two values',
      slice('x', {}, [gpu('gpu-0', { attributes: { t: { string: 'a', int: 1 } } })]),
      'spec.devices[0].attributes[t]',
      /exactly one value must be specified/,
    ],
    [
      '33 attributes and capacities',
      slice('x', {}, [gpu('gpu-0', { attributes: attrs33 })]),
      'spec.devices[0]',
      /Invalid value: 33: the total number of attributes and capacities must not exceed 32/,
    ],
    [
      'taint effect',
      slice('x', {}, [gpu('gpu-0', { taints: [{ key: 'k', effect: 'PreferNoSchedule' }] })]),
      'spec.devices[0].taints[0].effect',
      /Unsupported value: "PreferNoSchedule"/,
    ],
    [
      '17 taints',
      slice('x', {}, [
        gpu('gpu-0', { taints: Array.from({ length: 17 }, (_, i) => ({ key: `k${i}`, effect: 'None' })) }),
      ]),
      'spec.devices[0].taints',
      /at most 16/,
    ],
    // Partitionable devices: counter sets in slices of their own, the devices consuming them.
    [
      'counter sets beside devices',
      slice('x', { sharedCounters: [counterSet('gpu-0-counter-set')] }),
      'spec',
      /only one of `sharedCounters` or `devices` is allowed/,
    ],
    [
      '9 counter sets',
      slice('x', { sharedCounters: Array.from({ length: 9 }, (_, i) => counterSet(`gpu-${i}-counter-set`)) }, []),
      'spec.sharedCounters',
      /Too many: 9: must have at most 8 items/,
    ],
    [
      'a counter set named twice',
      slice('x', { sharedCounters: [counterSet('s'), counterSet('s')] }, []),
      'spec.sharedCounters[1]',
      /Duplicate value: "s"/,
    ],
    [
      'a counter set without counters',
      slice('x', { sharedCounters: [{ name: 's', counters: {} }] }, []),
      'spec.sharedCounters[0].counters',
      /Required value/,
    ],
    [
      'a counter named as a capacity is (memorySlice0)',
      slice('x', { sharedCounters: [{ name: 's', counters: { memorySlice0: { value: '1' } } }] }, []),
      'spec.sharedCounters[0].counters',
      /RFC 1123 label/,
    ],
    [
      'a device consuming three counter sets',
      slice('x', {}, [gpu('p', { consumesCounters: ['a', 'b', 'c'].map((n) => consumption(n)) })]),
      'spec.devices[0].consumesCounters',
      /Too many: 3: must have at most 2 items/,
    ],
    [
      'a device consuming one counter set twice',
      slice('x', {}, [gpu('p', { consumesCounters: [consumption('a'), consumption('a')] })]),
      'spec.devices[0].consumesCounters[1]',
      /Duplicate value: "a"/,
    ],
    [
      '65 devices consuming counters',
      slice('x', {}, many(65, { consumesCounters: [consumption('a')] })),
      'spec.devices',
      /must have at most 64 items/,
    ],
  ];
  for (const [what, body, field, message] of cases) {
    const r = await call(s, 'POST', SLICES, { body });
    assert.equal(r.code, 422, `${what}: ${JSON.stringify(r.body).slice(0, 300)}`);
    const st = asStatus(r);
    assert.equal(st.reason, 'Invalid', what);
    assert.equal(st.details?.kind, 'ResourceSlice', what);
    const cause = st.details?.causes?.find((c) => c.field === field);
    assert.ok(cause !== undefined, `${what}: no cause for ${field} in ${JSON.stringify(st.details?.causes)}`);
    assert.match(cause.message, message, what);
    assert.match(String(st.message), /^ResourceSlice\.resource\.k8s\.io "x" is invalid: /, what);
  }
  assert.equal(s.slices.size, 0, 'nothing invalid was stored');
  // Counter sets alone in their slice (no devices field: an empty list is a list, refused beside them), and
  // devices consuming them in another, are accepted.
  const sets = Array.from({ length: 8 }, (_, i) => counterSet(`gpu-${i}-counter-set`));
  const alone = slice('counters', { sharedCounters: sets, devices: null }, []);
  assert.equal((await call(s, 'POST', SLICES, { body: alone })).code, 201);
  const partition = gpu('p', { consumesCounters: [consumption('gpu-0-counter-set')] });
  assert.equal(
    (await call(s, 'POST', SLICES, { body: slice('parts', { nodeName: 'node-c' }, [partition]) })).code,
    201,
  );
  for (const name of ['counters', 'parts']) await call(s, 'DELETE', `${SLICES}/${name}`);
  // At the limits it is accepted.
  assert.equal((await call(s, 'POST', SLICES, { body: slice('full', {}, many(128)) })).code, 201);
  assert.equal(
    (await call(s, 'POST', SLICES, { body: slice('tainted', { nodeName: 'node-b' }, many(64, taint)) })).code,
    201,
  );

  // Driver, pool name and node name are immutable.
  const stored = (await call(s, 'GET', `${SLICES}/full`)).body;
  for (const [change, field] of [
    [{ driver: 'new.example.com' }, 'spec.driver'],
    [{ nodeName: 'node-z' }, 'spec.nodeName'],
    [{ pool: { name: 'other', generation: 2, resourceSliceCount: 1 } }, 'spec.pool.name'],
  ] as const) {
    const r = await call(s, 'PUT', `${SLICES}/full`, {
      body: { ...stored, spec: { ...(stored.spec as JsonObject), ...change } },
    });
    assert.equal(r.code, 422, field);
    assert.deepEqual(
      asStatus(r).details?.causes?.map((c) => [c.field, /field is immutable/.test(c.message)]),
      [[field, true]],
    );
  }
});

test(
  'the server stores its own form: canonical quantities, ' + 'unknown fields dropped with a warning, timeAdded filled',
  async (t) => {
    const s = await ApiServerStandIn.start();
    t.after(() => s.stop());
    const body = slice('x', {}, [
      gpu('gpu-0', {
        capacity: { memory: { value: '32768Mi' }, sms: { value: 132 } },
        flavour: 'extra',
        taints: [{ key: 'gpu.example.com/xid', value: '79', effect: 'NoSchedule' }],
      }),
    ]);
    const r = await call(s, 'POST', SLICES, { body });
    assert.equal(r.code, 201, JSON.stringify(r.body));
    const dev = ((r.body.spec as JsonObject).devices as JsonObject[])[0] ?? {};
    assert.deepEqual(dev.capacity, { memory: { value: '32Gi' }, sms: { value: '132' } });
    assert.equal(dev.flavour, undefined);
    assert.equal(r.headers.warning, '299 - "unknown field \\"spec.devices[0].flavour\\""');
    const taints = dev.taints as JsonObject[];
    assert.match(String(taints[0]?.timeAdded), /^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ$/);
    // What was sent is not what is read back: a driver must compare meaning, not JSON.
    assert.notDeepEqual(r.body.spec, body.spec);

    const strict = await call(s, 'POST', `${SLICES}?fieldValidation=Strict`, {
      body: { ...slice('y'), spec: { ...(slice('y').spec as JsonObject), colour: 'red' } },
    });
    assert.equal(strict.code, 400);
    assert.match(String(asStatus(strict).message), /strict decoding error: unknown field "spec.colour"/);
    const badQ = await call(s, 'POST', SLICES, {
      body: slice('z', {}, [gpu('gpu-0', { capacity: { memory: { value: '80 GiB' } } })]),
    });
    assert.equal(badQ.code, 400);
    assert.match(String(asStatus(badQ).message), /quantities must match the regular expression/);

    const table: [string, string | undefined][] = [
      ['32768Mi', '32Gi'],
      ['80Gi', '80Gi'],
      ['1536Mi', '1536Mi'],
      ['0.5Gi', '512Mi'],
      ['512', '512'],
      ['0.5Ki', '512'],
      ['2000', '2k'],
      ['1.5G', '1500M'],
      ['0.5', '500m'],
      ['1e3', '1e3'],
      ['1.5e3', '1500'],
      ['12e6', '12e6'],
      ['0', '0'],
      ['-2Ki', '-2Ki'],
      ['80 GiB', undefined],
      ['1.5n', undefined],
    ];
    for (const [q, want] of table) assert.equal(canonicalQuantity(q), want, q);
  },
);

test(
  'bearer tokens: none is 401, a token without the verb ' + 'is 403 with the real message, an allowed one passes',
  async (t) => {
    const s = await ApiServerStandIn.start({
      tokens: {
        'tok-driver': { user: 'system:node:node-a', allow: ['* resourceslices', 'get resourceclaims', 'get nodes'] },
        'tok-readonly': { user: 'viewer', allow: ['get resourceslices', 'list resourceslices'] },
      },
    });
    t.after(() => s.stop());
    const none = await call(s, 'GET', SLICES);
    assert.equal(none.code, 401);
    assert.deepEqual(none.body, {
      kind: 'Status',
      apiVersion: 'v1',
      metadata: {},
      status: 'Failure',
      message: 'Unauthorized',
      reason: 'Unauthorized',
      code: 401,
    });
    assert.equal((await call(s, 'GET', SLICES, { token: 'nope' })).code, 401);

    const denied = await call(s, 'POST', SLICES, { token: 'tok-readonly', body: slice('a') });
    assert.equal(denied.code, 403);
    assert.deepEqual(denied.body, {
      kind: 'Status',
      apiVersion: 'v1',
      metadata: {},
      status: 'Failure',
      message:
        'resourceslices.resource.k8s.io is forbidden: User "viewer" cannot create ' +
        'resource "resourceslices" in API group "resource.k8s.io" at the cluster scope',
      reason: 'Forbidden',
      details: { group: 'resource.k8s.io', kind: 'resourceslices' },
      code: 403,
    });
    const claimDenied = await call(s, 'GET', '/apis/resource.k8s.io/v1/namespaces/default/resourceclaims/c1', {
      token: 'tok-readonly',
    });
    assert.equal(claimDenied.code, 403);
    assert.equal(
      asStatus(claimDenied).message,
      'resourceclaims.resource.k8s.io "c1" is forbidden: User "viewer" cannot get ' +
        'resource "resourceclaims" in API group "resource.k8s.io" in the namespace "default"',
    );
    const nodeDenied = await call(s, 'GET', '/api/v1/nodes/node-a', { token: 'tok-readonly' });
    assert.equal(
      asStatus(nodeDenied).message,
      'nodes "node-a" is forbidden: User "viewer" cannot get resource "nodes" in API group "" at the cluster scope',
    );

    assert.equal((await call(s, 'POST', SLICES, { token: 'tok-driver', body: slice('a') })).code, 201);
    assert.equal((await call(s, 'GET', `${SLICES}/a`, { token: 'tok-readonly' })).code, 200);
    assert.equal((await call(s, 'DELETE', `${SLICES}/a`, { token: 'tok-readonly' })).code, 403);
    assert.deepEqual(s.requests.map((r) => [r.method, r.user ?? null, r.code]).slice(-3), [
      ['POST', 'system:node:node-a', 201],
      ['GET', 'viewer', 200],
      ['DELETE', 'viewer', 403],
    ]);
  },
);

test(
  'ResourceClaims and Nodes: get what the test seeded, 404 ' +
    'for the rest; watch (but of slices) and PATCH say they are not modelled',
  async (t) => {
    const s = await ApiServerStandIn.start();
    t.after(() => s.stop());
    const status: JsonObject = {
      allocation: {
        devices: { results: [{ request: 'gpu', driver: 'gpu.example.com', pool: 'node-a', device: 'gpu-0' }] },
      },
    };
    const seeded = s.putClaim({ namespace: 'ml', name: 'train', status });
    s.putNode('node-a', { 'kubernetes.io/hostname': 'node-a' });
    const claim = await call(s, 'GET', '/apis/resource.k8s.io/v1/namespaces/ml/resourceclaims/train');
    assert.equal(claim.code, 200);
    assert.equal(claim.body.kind, 'ResourceClaim');
    assert.equal(meta(claim.body).uid, meta(seeded).uid);
    assert.deepEqual(claim.body.status, status);
    const other = await call(s, 'GET', '/apis/resource.k8s.io/v1/namespaces/other/resourceclaims/train');
    assert.equal(other.code, 404);
    assert.equal(asStatus(other).message, 'resourceclaims.resource.k8s.io "train" not found');
    const node = await call(s, 'GET', '/api/v1/nodes/node-a');
    assert.equal(node.body.kind, 'Node');
    assert.equal(asStatus(await call(s, 'GET', '/api/v1/nodes/node-z')).message, 'nodes "node-z" not found');
    const unknown = await call(s, 'GET', '/apis/resource.k8s.io/v1beta1/resourceslices');
    assert.equal(unknown.code, 404);
    assert.equal(asStatus(unknown).message, 'the server could not find the requested resource');
    const watch = await call(s, 'GET', '/apis/resource.k8s.io/v1/deviceclasses?watch=true');
    assert.equal(watch.code, 405);
    assert.match(String(asStatus(watch).message), /watch is modelled .* for resourceslices only/);
    assert.equal((await call(s, 'PATCH', `${SLICES}/x`, { body: {} })).code, 405);
    assert.equal((await call(s, 'PUT', '/api/v1/nodes/node-a', { body: node.body })).code, 405);
  },
);

test('down() refuses connections, up() serves again on the same address with the same state', async (t) => {
  const s = await ApiServerStandIn.start();
  t.after(() => s.stop());
  assert.equal((await call(s, 'POST', SLICES, { body: slice('a') })).code, 201);
  const url = s.url;
  await s.down();
  await assert.rejects(call(s, 'GET', SLICES), (err: NodeJS.ErrnoException) => err.code === 'ECONNREFUSED');
  await s.up();
  assert.equal(s.url, url);
  const back = await call(s, 'GET', `${SLICES}/a`);
  assert.equal(back.code, 200);
});

test(
  'a unix socket listener works the same, and the ' + "kubelet's slice clean-up deletes by node and driver",
  async (t) => {
    const dir = mkdtempSync(join(tmpdir(), 'gdp-api-'));
    t.after(() => rmSync(dir, { recursive: true, force: true }));
    const s = await ApiServerStandIn.start({ socketPath: join(dir, 'api.sock') });
    t.after(() => s.stop());
    assert.equal((await call(s, 'POST', SLICES, { body: slice('a') })).code, 201);
    assert.equal((await call(s, 'POST', SLICES, { body: slice('b', { driver: 'nic.example.com' }) })).code, 201);
    assert.equal((await call(s, 'POST', SLICES, { body: slice('c', { nodeName: 'node-b' }) })).code, 201);
    await s.down();
    await assert.rejects(call(s, 'GET', SLICES));
    await s.up();
    assert.equal(s.deleteNodeSlices('node-a', 'gpu.example.com'), 1);
    assert.deepEqual([...s.slices.keys()].sort(), ['b', 'c']);
    assert.equal(s.deleteNodeSlices('node-a'), 1);
    const left = await call(s, 'GET', SLICES);
    assert.deepEqual(
      (left.body.items as JsonObject[]).map((i) => meta(i).name),
      ['c'],
    );
    // The same over HTTP, as the kubelet does it: DELETE on the collection with a fieldSelector.
    assert.equal((await call(s, 'POST', SLICES, { body: slice('d') })).code, 201);
    const wiped = await call(s, 'DELETE', `${SLICES}?fieldSelector=${encodeURIComponent('spec.nodeName=node-b')}`);
    assert.equal(wiped.code, 200);
    assert.deepEqual(
      (wiped.body.items as JsonObject[]).map((i) => meta(i).name),
      ['c'],
    );
    assert.deepEqual([...s.slices.keys()], ['d']);
  },
);

/** The 422's causes as `field: message` lines, or the thrown error's message when it was no 422. */
function causesOf(r: Reply): string[] {
  const st = asStatus(r);
  assert.equal(st.code, 422, JSON.stringify(st));
  return (st.details?.causes ?? []).map((c) => `${c.field}: ${c.message}`);
}

const shared = (policy: Json, extra: JsonObject = { allowMultipleAllocations: true }): JsonObject =>
  gpu('gpu-0', { ...extra, capacity: { memory: { value: '80Gi', requestPolicy: policy } } });
const POLICY = 'spec.devices[0].capacity[memory].requestPolicy';

test('consumable capacity: a requestPolicy needs allowMultipleAllocations; its rules are the real ones', async (t) => {
  const s = await ApiServerStandIn.start();
  t.after(() => s.stop());
  const bad = async (policy: Json, extra?: JsonObject): Promise<string[]> =>
    causesOf(await call(s, 'POST', SLICES, { body: slice('x', {}, [shared(policy, extra)]) }));
  assert.deepEqual(await bad({ default: '8Gi' }, {}), [`${POLICY}: Forbidden: allowMultipleAllocations must be true`]);
  assert.deepEqual(await bad({ default: '8Gi' }, { allowMultipleAllocations: false }), [
    `${POLICY}: Forbidden: allowMultipleAllocations must be true`,
  ]);
  assert.deepEqual(await bad({ default: '8Gi', validValues: ['8Gi'], validRange: { min: '1Gi' } }), [
    `${POLICY}: Forbidden: exactly one policy can be specified, ` +
      'cannot specify "validValues" and "validRange" at the same time',
  ]);
  assert.deepEqual(await bad({ validValues: ['8Gi'] }), [
    `${POLICY}.default: Required value: required when validValues is defined`,
  ]);
  assert.deepEqual(await bad({ validRange: { min: '1Gi' } }), [
    `${POLICY}.default: Required value: required when validRange is defined`,
  ]);
  assert.deepEqual(await bad({ default: '8Gi', validValues: ['16Gi', '8Gi', '96Gi'] }), [
    `${POLICY}.validValues[1]: Invalid value: "8Gi": values must be sorted in ascending order`,
    `${POLICY}.validValues[2]: Invalid value: "96Gi": option is larger than capacity value: 80Gi`,
  ]);
  assert.deepEqual(await bad({ default: '8Gi', validValues: ['4Gi', '4096Mi', '16Gi'] }), [
    `${POLICY}.validValues[1]: Duplicate value: "4294967296"`,
    `${POLICY}.validValues: Invalid value: "8Gi": default value is not valid according to the requestPolicy`,
  ]);
  const eleven = Array.from({ length: 11 }, (_, i) => `${i + 1}Gi`);
  assert.deepEqual(await bad({ default: '1Gi', validValues: eleven }), [
    `${POLICY}.validValues: Too many: 11: must have at most 10 items`,
    `${POLICY}.validValues: Invalid value: "1Gi": default value is not valid according to the requestPolicy`,
  ]);
  assert.deepEqual(await bad({ default: '8Gi', validRange: { max: '16Gi' } }), [
    `${POLICY}.validRange.min: Required value: required when validRange is defined`,
  ]);
  assert.deepEqual(await bad({ default: '90Gi', validRange: { min: '96Gi', max: '88Gi' } }), [
    `${POLICY}.validRange.min: Invalid value: "96Gi": min is larger than capacity value: 80Gi`,
    `${POLICY}.validRange.default: Invalid value: "90Gi": default is less than min: 96Gi`,
    `${POLICY}.validRange.max: Invalid value: "96Gi": min is larger than max: 88Gi`,
    `${POLICY}.validRange.max: Invalid value: "88Gi": max is larger than capacity value: 80Gi`,
    `${POLICY}.validRange.default: Invalid value: "90Gi": default is more than max: 88Gi`,
  ]);
  assert.deepEqual(await bad({ default: '8Gi', validRange: { min: '4Gi', step: '0' } }), [
    `${POLICY}.validRange.step: Invalid value: "0": must be greater than zero`,
  ]);
  assert.deepEqual(await bad({ default: '8Gi', validRange: { min: '4Gi', step: '80Gi' } }), [
    `${POLICY}.validRange.step: Invalid value: "80Gi": one step 84Gi is larger than capacity value: 80Gi`,
    `${POLICY}.validRange.step: Invalid value: "8Gi": value is not a multiple of a given step (80Gi) from (4Gi)`,
  ]);
  assert.deepEqual(await bad({ default: '6Gi', validRange: { min: '4Gi', max: '63Gi', step: '4Gi' } }), [
    `${POLICY}.validRange.step: Invalid value: "6Gi": value is not a multiple of a given step (4Gi) from (4Gi)`,
    `${POLICY}.validRange.step: Invalid value: "63Gi": value is not a multiple of a given step (4Gi) from (4Gi)`,
  ]);
  assert.deepEqual(await bad({ default: '8Gi', validRange: { min: '-4Gi', step: '4Gi' } }), [
    `${POLICY}.validRange.min: Invalid value: "-4Gi": must be greater than or equal to 0`,
  ]);
  assert.deepEqual(await bad({ default: '8Gi' }, { allowMultipleAllocations: 'yes' }), [
    'spec.devices[0].allowMultipleAllocations: Invalid value: "yes": must be a boolean',
    `${POLICY}: Forbidden: allowMultipleAllocations must be true`,
  ]);

  // Accepted, stored with every quantity canonical and unknown fields dropped.
  const good = shared({ default: '8192Mi', validRange: { min: '4096Mi', max: '65536Mi', step: '4096Mi', by: 1 } });
  const created = await call(s, 'POST', SLICES, {
    body: slice('ok', {}, [
      good,
      shared({ default: '16Gi', validValues: ['8Gi', '16384Mi'] }, { name: 'gpu-1', allowMultipleAllocations: true }),
    ]),
  });
  assert.equal(created.code, 201, JSON.stringify(created.body));
  const [dev0, dev1] = (created.body.spec as JsonObject).devices as [JsonObject, JsonObject];
  assert.equal(dev0.allowMultipleAllocations, true);
  assert.deepEqual((dev0.capacity as JsonObject).memory, {
    value: '80Gi',
    requestPolicy: { default: '8Gi', validRange: { min: '4Gi', max: '64Gi', step: '4Gi' } },
  });
  assert.deepEqual(((dev1.capacity as JsonObject).memory as JsonObject).requestPolicy, {
    default: '16Gi',
    validValues: ['8Gi', '16Gi'],
  });
  assert.match(
    String(created.headers.warning),
    /unknown field \\?"spec\.devices\[0\]\.capacity\[memory\]\.requestPolicy\.validRange\.by\\?"/,
  );
  // A device that allows multiple allocations needs no capacity at all.
  const bare = { name: 'gpu-2', allowMultipleAllocations: true };
  assert.equal((await call(s, 'POST', SLICES, { body: slice('bare', {}, [bare]) })).code, 201);
  // A quantity that is none fails decoding, before validation.
  const notQ = await call(s, 'POST', SLICES, { body: slice('y', {}, [shared({ default: 'lots' })]) });
  assert.equal(notQ.code, 400);
});

const SHARE = '5f0c2a1e-8d3b-4c6a-9e7f-1a2b3c4d5e6f';
const opaque = (parameters: Json, driver = 'gpu.nvidia.com'): JsonObject => ({ opaque: { driver, parameters } });
const GPU_CONFIG = { apiVersion: 'resource.nvidia.com/v1beta1', kind: 'GpuConfig', sharing: { strategy: 'MPS' } };

test("seeded ResourceClaims: the allocation's shareID, consumedCapacity and config, as checked", async (t) => {
  const s = await ApiServerStandIn.start();
  t.after(() => s.stop());
  const result = (extra: JsonObject = {}): JsonObject => ({
    request: 'gpu',
    driver: 'gpu.nvidia.com',
    pool: 'node-a',
    device: 'gpu-0',
    ...extra,
  });
  const seed = (devices: JsonObject, spec?: JsonObject): JsonObject =>
    s.putClaim({
      namespace: 'ml',
      name: 'train',
      ...(spec === undefined ? {} : { spec }),
      status: { allocation: { devices } },
    });
  const refused = (devices: JsonObject, spec?: JsonObject): string[] => {
    try {
      seed(devices, spec);
    } catch (err) {
      assert.ok(err instanceof HttpError, String(err));
      assert.equal(err.status.code, 422);
      assert.match(String(err.status.message), /^ResourceClaim\.resource\.k8s\.io "train" is invalid: /);
      return (err.status.details?.causes ?? []).map((c) => `${c.field}: ${c.message}`);
    }
    assert.fail('accepted');
  };
  const R = 'status.allocation.devices.results[0]';
  const C = 'status.allocation.devices.config[0]';
  assert.deepEqual(refused({ results: [result({ shareID: SHARE.toUpperCase() })] }), [
    `${R}.shareID: Invalid value: "${SHARE.toUpperCase()}": uid must be in RFC 4122 normalized form, ` +
      '`xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx` with lowercase hexadecimal characters',
  ]);
  assert.deepEqual(refused({ results: [result({ shareID: 'share-1' })] }), [
    `${R}.shareID: Invalid value: "share-1": error validating uid: invalid UUID length: 7`,
  ]);
  assert.deepEqual(refused({ results: [result({ shareID: SHARE.replace(/-/g, '') })] }), [
    `${R}.shareID: Invalid value: "${SHARE.replace(/-/g, '')}": uid must be in RFC 4122 normalized form, ` +
      '`xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx` with lowercase hexadecimal characters',
  ]);
  assert.deepEqual(refused({ results: [result({ device: 'GPU 0', driver: 'gpu_nvidia' })] }).length, 2);
  assert.throws(
    () => seed({ results: [result({ consumedCapacity: { memory: 'a lot' } })] }),
    (err: unknown) => err instanceof HttpError && err.status.code === 400,
  );
  assert.deepEqual(
    refused(
      { results: [result({ request: 'other' })] },
      { devices: { requests: [{ name: 'gpu', exactly: { deviceClassName: 'gpu.nvidia.com' } }] } },
    ),
    [
      `${R}.request: Invalid value: "other": must be the name of a request in the claim ` +
        "or the name of a request and a subrequest separated by '/'",
    ],
  );
  assert.deepEqual(refused({ results: [result()], config: [{ requests: ['gpu'], ...opaque(GPU_CONFIG) }] }), [
    `${C}.source: Required value`,
  ]);
  assert.deepEqual(
    refused({ results: [result()], config: [{ source: 'FromNode', requests: ['gpu', 'gpu'], ...opaque(GPU_CONFIG) }] }),
    [
      `${C}.source: Unsupported value: "FromNode": supported values: "FromClaim", "FromClass"`,
      `${C}.requests[1]: Duplicate value: "gpu"`,
    ],
  );
  assert.deepEqual(refused({ results: [result()], config: [{ source: 'FromClaim' }] }), [
    `${C}.opaque: Required value`,
  ]);
  assert.deepEqual(refused({ results: [result()], config: [{ source: 'FromClass', ...opaque(['x']) }] }), [
    `${C}.opaque.parameters: Invalid value: "<value omitted>": must be a valid JSON object`,
  ]);
  assert.deepEqual(
    refused({ results: [result()], config: [{ source: 'FromClass', ...opaque({ blob: 'x'.repeat(10 * 1024) }) }] }),
    [`${C}.opaque.parameters: Too long: may not be more than 10240 bytes`],
  );
  assert.deepEqual(refused({ results: [result()], config: [{ source: 'FromClass', ...opaque(GPU_CONFIG, '') }] }), [
    `${C}.opaque.driver: Required value`,
  ]);

  // Accepted: a share with its consumed capacity canonical, class and claim configs; the spec made for it.
  const stored = seed({
    results: [result({ shareID: SHARE, consumedCapacity: { memory: '16384Mi' } })],
    config: [
      { source: 'FromClass', ...opaque(GPU_CONFIG) },
      { source: 'FromClaim', requests: ['gpu'], ...opaque(GPU_CONFIG) },
    ],
  });
  const devices = ((stored.status as JsonObject).allocation as JsonObject).devices as JsonObject;
  assert.deepEqual((devices.results as JsonObject[])[0]?.consumedCapacity, { memory: '16Gi' });
  assert.equal((devices.results as JsonObject[])[0]?.shareID, SHARE);
  assert.deepEqual(stored.spec, {
    devices: { requests: [{ name: 'gpu', exactly: { deviceClassName: 'gpu.nvidia.com' } }] },
  });
  const read = await call(s, 'GET', '/apis/resource.k8s.io/v1/namespaces/ml/resourceclaims/train');
  assert.deepEqual(read.body.status, stored.status);
});

const CLASSES = '/apis/resource.k8s.io/v1/deviceclasses';
const deviceClass = (name: string, spec: JsonObject): JsonObject => ({
  apiVersion: 'resource.k8s.io/v1',
  kind: 'DeviceClass',
  metadata: { name },
  spec,
});

test('DeviceClasses: create, get, list, delete; selectors, config, extendedResourceName validated', async (t) => {
  const s = await ApiServerStandIn.start();
  t.after(() => s.stop());
  const cel = (expression: string): JsonObject => ({ cel: { expression } });
  const spec = {
    selectors: [cel("device.driver == 'gpu.nvidia.com'")],
    config: [opaque({ ...GPU_CONFIG, sharing: { strategy: 'TimeSlicing', timeSlicingConfig: { interval: 'Long' } } })],
    extendedResourceName: 'nvidia.com/mig-1g.10gb.me',
    unknownField: true,
  };
  const created = await call(s, 'POST', CLASSES, { body: deviceClass('mig-1g.10gb.me.nvidia.com', spec) });
  assert.equal(created.code, 201, JSON.stringify(created.body));
  assert.equal(meta(created.body).generation, 1);
  assert.equal((created.body.spec as JsonObject).unknownField, undefined);
  assert.match(String(created.headers.warning), /unknown field \\?"spec\.unknownField\\?"/);
  const again = await call(s, 'POST', CLASSES, { body: deviceClass('mig-1g.10gb.me.nvidia.com', spec) });
  assert.equal(again.code, 409);
  assert.equal(asStatus(again).reason, 'AlreadyExists');
  // The same extended resource name on a second class is no error: the newest class serves it.
  assert.equal((await call(s, 'POST', CLASSES, { body: deviceClass('b.example.com', spec) })).code, 201);
  const list = await call(s, 'GET', CLASSES);
  assert.equal(list.body.kind, 'DeviceClassList');
  assert.deepEqual(
    (list.body.items as JsonObject[]).map((i) => [meta(i).name, i.kind ?? null]),
    [
      ['b.example.com', null],
      ['mig-1g.10gb.me.nvidia.com', null],
    ],
  );
  assert.equal((await call(s, 'GET', `${CLASSES}/b.example.com`)).body.kind, 'DeviceClass');
  assert.equal((await call(s, 'DELETE', `${CLASSES}/b.example.com`)).code, 200);
  assert.equal((await call(s, 'GET', `${CLASSES}/b.example.com`)).code, 404);
  assert.equal((await call(s, 'PUT', `${CLASSES}/b.example.com`, { body: {} })).code, 405);

  const bad = async (name: string, sp: JsonObject): Promise<string[]> =>
    causesOf(await call(s, 'POST', CLASSES, { body: deviceClass(name, sp) }));
  assert.deepEqual(await bad('Not_A_Name', {}), [
    'metadata.name: Invalid value: "Not_A_Name": a lowercase RFC 1123 subdomain must consist of lower case ' +
      "alphanumeric characters, '-' or '.', and must start and end with an alphanumeric character",
  ]);
  assert.deepEqual(await bad('x', { selectors: [{}, cel('')] }), [
    'spec.selectors[0].cel: Required value',
    'spec.selectors[1].cel.expression: Required value: compilation failed',
  ]);
  assert.deepEqual(await bad('x', { selectors: [cel(`'${'a'.repeat(10 * 1024)}' == ''`)] }), [
    'spec.selectors[0].cel.expression: Too long: may not be more than 10240 bytes',
  ]);
  assert.deepEqual(await bad('x', { config: [{}, opaque(null)] }), [
    'spec.config[0].opaque: Required value',
    'spec.config[1].opaque.parameters: Required value',
  ]);
  for (const name of [
    'gpu',
    'kubernetes.io/gpu',
    'example.kubernetes.io/gpu',
    'requests.example.com/gpu',
    'a/b/c',
    'nvidia.com/mig+1',
  ])
    assert.deepEqual(await bad('x', { extendedResourceName: name }), [
      `spec.extendedResourceName: Invalid value: ${JSON.stringify(name)}: must be a valid extended resource name`,
    ]);
  assert.ok(isExtendedResourceName('nvidia.com/gpu'));
  assert.ok(isExtendedResourceName('nvidia.com/mig-7g.80gb'));
  // Seeded the same way.
  assert.equal(meta(s.putDeviceClass(deviceClass('gpu.nvidia.com', {}))).name, 'gpu.nvidia.com');
  assert.throws(
    () => s.putDeviceClass(deviceClass('gpu.nvidia.com', {})),
    (err: unknown) => err instanceof HttpError && err.status.reason === 'AlreadyExists',
  );
});
