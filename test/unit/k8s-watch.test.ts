// k8s/watch.ts against the API server stand-in's watch (events, bookmarks, a cut, 410 Gone from an
// ERROR event and from a compacted resourceVersion), the stand-in's faults as KubeClient sees them
// (reset, a 409 and a 429 Status, an answer later than the client's timeout, a restart on the same
// port), and the pure comparison of listed slices with the confirmed ones (dra/slice-writer.ts).
import { afterEach, test } from 'node:test';
import assert from 'node:assert/strict';
import { KubeApiError, KubeClient, KubeUnreachableError } from '../../src/k8s/client.ts';
import { listNodeSlicesAt, nodeSliceSelector, RESOURCE_API } from '../../src/k8s/resources.ts';
import type { ResourceSlice } from '../../src/k8s/resources.ts';
import { openWatch } from '../../src/k8s/watch.ts';
import type { WatchEvent } from '../../src/k8s/watch.ts';
import { driftText, untouched } from '../../src/dra/slice-writer.ts';
import type { Confirmed } from '../../src/dra/slice-writer.ts';
import { ApiServerStandIn } from '../support/apiserver.ts';
import { onEvent, waitUntil } from '../support/wait.ts';
import { EventEmitter } from 'node:events';

const SLICES = `${RESOURCE_API}/resourceslices`;
const stands: { api: ApiServerStandIn; client: KubeClient }[] = [];

async function start(): Promise<{ api: ApiServerStandIn; client: KubeClient }> {
  const api = await ApiServerStandIn.start();
  const client = new KubeClient({ server: api.url, source: 'test' });
  stands.push({ api, client });
  return { api, client };
}

afterEach(async () => {
  for (const s of stands.splice(0)) {
    s.client.close();
    await s.api.stop();
  }
});

const slice = (name: string, node = 'n1'): ResourceSlice => ({
  metadata: { name },
  spec: {
    driver: 'gpu.nvidia.com',
    nodeName: node,
    pool: { name: node, generation: 1, resourceSliceCount: 1 },
    devices: [{ name: 'gpu-0' }],
  },
});

test('watch: ADDED, MODIFIED, DELETED and BOOKMARK of the selected slices only; a cut ends it as broken', async () => {
  const { api, client } = await start();
  const list = await listNodeSlicesAt(client, 'n1', 'gpu.nvidia.com');
  const seen = new EventEmitter();
  const events: string[] = [];
  const w = await openWatch<ResourceSlice>(client, {
    path: SLICES,
    fieldSelector: nodeSliceSelector('n1', 'gpu.nvidia.com'),
    resourceVersion: list.resourceVersion,
    onEvent: (e: WatchEvent<ResourceSlice>) => {
      events.push(`${e.type} ${e.object.metadata.name ?? ''}`);
      seen.emit('event');
    },
  });
  await client.request('POST', SLICES, { body: slice('other', 'n2') });
  await client.request('POST', SLICES, { body: slice('mine') });
  api.editSlice('mine', (s) => {
    (s.spec as { devices: unknown[] }).devices = [{ name: 'gpu-1' }];
  });
  api.removeSlice('mine');
  api.bookmark();
  await waitUntil(() => events.length === 4, { on: onEvent(seen, 'event'), what: `4 events, got ${events}` });
  assert.deepEqual(events, ['ADDED mine', 'MODIFIED mine', 'DELETED mine', 'BOOKMARK ']);
  assert.equal(api.cutWatches(), 1);
  assert.equal((await w.ended).how, 'broken');
});

test('watch: an ERROR event with 410 ends it as gone; a watch from a compacted resourceVersion too', async () => {
  const { api, client } = await start();
  const { resourceVersion } = await listNodeSlicesAt(client, 'n1', 'gpu.nvidia.com');
  const opts = { path: SLICES, resourceVersion, onEvent: () => undefined };
  const w = await openWatch<ResourceSlice>(client, opts);
  await waitUntil(() => api.watches.openCount === 1, { on: onEvent(api, 'watch'), what: 'open' });
  api.cutWatches(true);
  const end = await w.ended;
  assert.equal(end.how, 'gone');
  await client.request('POST', SLICES, { body: slice('a') });
  api.compact();
  const old = await openWatch<ResourceSlice>(client, opts);
  const e2 = await old.ended;
  assert.deepEqual(e2.how === 'gone' ? /too old resource version/.test(e2.message) : e2, true);
  // From the current resourceVersion (a fresh list), the watch opens.
  const fresh = await listNodeSlicesAt(client, 'n1', 'gpu.nvidia.com');
  const ok = await openWatch<ResourceSlice>(client, { ...opts, resourceVersion: fresh.resourceVersion });
  await waitUntil(() => api.watches.openCount === 1, { on: onEvent(api, 'watch'), what: 'open again' });
  ok.stop();
  assert.equal((await ok.ended).how, 'closed');
});

test('faults: a reset, a 409 and a 429 as Status, an answer past the timeout, a restart on the same port', async () => {
  const { api, client } = await start();
  // A GET whose connection was reset is sent once more (client-go's rule), a second reset is reported.
  api.fault({ method: 'GET', path: SLICES, action: { kind: 'reset' } });
  assert.equal((await client.request<{ kind: string }>('GET', SLICES)).kind, 'ResourceSliceList');
  api.fault({ method: 'GET', path: SLICES, times: 2, action: { kind: 'reset' } });
  await assert.rejects(client.request('GET', SLICES), KubeUnreachableError);
  api.fault({ method: 'PUT', path: /\/resourceslices\/x$/, action: { kind: 'status', code: 409 } });
  await assert.rejects(client.request('PUT', `${SLICES}/x`, { body: slice('x') }), (e: unknown) => {
    assert.ok(e instanceof KubeApiError);
    assert.equal(e.code, 409);
    assert.equal(e.reason, 'Conflict');
    assert.match(e.serverMessage, /the object has been modified/);
    return true;
  });
  // A Retry-After within the client's cap is waited out; one past it is the caller's to back off.
  api.fault({ path: SLICES, times: 2, action: { kind: 'status', code: 429, retryAfterS: 0 } });
  assert.equal((await client.request<{ kind: string }>('GET', SLICES)).kind, 'ResourceSliceList', 'sent again');
  api.fault({ path: SLICES, times: 2, action: { kind: 'status', code: 429, retryAfterS: 3600 } });
  for (let i = 0; i < 2; i++) {
    await assert.rejects(client.request('GET', SLICES), (e: unknown) => e instanceof KubeApiError && e.code === 429);
  }
  assert.equal((await client.request<{ kind: string }>('GET', SLICES)).kind, 'ResourceSliceList', 'only 2 faulted');
  api.fault({ path: SLICES, action: { kind: 'delay', ms: 300 } });
  await assert.rejects(
    client.request('GET', SLICES, { timeoutMs: 50 }),
    (e: unknown) => e instanceof KubeUnreachableError && e.errno === 'ETIMEDOUT',
  );
  const url = api.url;
  await api.restart();
  assert.equal(api.url, url);
  assert.equal((await client.request<{ kind: string }>('GET', SLICES)).kind, 'ResourceSliceList');
});

test('untouched / driftText: the confirmed uid and resourceVersion decide, never the JSON', () => {
  const listed = (name: string, uid: string, rv: string): ResourceSlice => ({
    metadata: { name, uid, resourceVersion: rv },
    spec: slice(name).spec,
  });
  const confirmed: Confirmed = {
    key: 'k',
    generation: 1,
    devices: 8,
    slices: new Map([['s0', { uid: 'u0', resourceVersion: '10' }]]),
  };
  assert.equal(untouched([listed('s0', 'u0', '10')], confirmed), true);
  assert.equal(untouched([], confirmed), false);
  assert.equal(driftText([], confirmed), 's0 deleted');
  assert.equal(driftText([listed('s0', 'u9', '10')], confirmed), 's0 re-created');
  assert.equal(driftText([listed('s0', 'u0', '11')], confirmed), 's0 changed');
  assert.equal(driftText([listed('s0', 'u0', '10'), listed('s1', 'u1', '12')], confirmed), 's1 added');
  assert.equal(untouched([listed('s0', 'u0', '10'), listed('s1', 'u1', '12')], confirmed), false);
});
