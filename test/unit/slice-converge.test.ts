// dra/slice-publisher.ts converging on what the API server holds, in-process against the API server
// stand-in with injected faults (apiserver-faults.ts) and its watch (apiserver-watch.ts): the
// kubelet's wipe followed by failed requests, a slice deleted or edited by another client, a taint
// change whose write fails, the watch cut and 410 Gone, and no write loop from our own writes.
import { afterEach, test } from 'node:test';
import assert from 'node:assert/strict';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { withHealth } from '../../src/core/snapshot.ts';
import { diff } from '../../src/core/snapshot-diff.ts';
import type { NodeSnapshot } from '../../src/core/snapshot.ts';
import { freshHealthState } from '../../src/core/health-tracker.ts';
import { NO_SHARING } from '../../src/core/sharing.ts';
import { KubeClient } from '../../src/k8s/client.ts';
import { SlicePublisher, sliceName } from '../../src/dra/slice-publisher.ts';
import type { AppliedSnapshot } from '../../src/node/consumer.ts';
import { createLogger } from '../../src/system/log.ts';
import { ApiServerStandIn } from '../support/apiserver.ts';
import type { ApiServerOptions, JsonObject } from '../support/apiserver.ts';
import type { FaultAction } from '../support/apiserver-faults.ts';
import { fixtureSnapshot } from '../support/node-scan.ts';
import { onEvent, waitFor, waitUntil } from '../support/wait.ts';

const NODE = 'node-a';
const SLICE = sliceName(NODE, 'gpu.nvidia.com', 0);
const SLICES = '/apis/resource.k8s.io/v1/resourceslices';

function applied(snapshot: NodeSnapshot, previous: NodeSnapshot | null): AppliedSnapshot {
  return {
    snapshot,
    change: diff(previous, snapshot),
    reason: 'test',
    reregister: null,
    settings: { plan: { deviceIdStrategy: 'uuid', sharing: NO_SHARING, migStrategy: 'none' } },
  };
}

interface Rig {
  api: ApiServerStandIn;
  pub: SlicePublisher;
  lines: string[];
  client: KubeClient;
  sysfs: string;
}
const rigs: Rig[] = [];

async function start(
  watch: boolean,
  more: { resyncMs?: number; tokens?: ApiServerOptions['tokens'] } = {},
): Promise<Rig> {
  const api = await ApiServerStandIn.start(more.tokens !== undefined ? { tokens: more.tokens } : {});
  api.putNode(NODE);
  const lines: string[] = [];
  const log = createLogger({ level: 'info', journal: false, write: (l) => lines.push(l) });
  const sysfs = mkdtempSync(join(tmpdir(), 'gdp-converge-sysfs-'));
  const client = new KubeClient({
    server: api.url,
    source: 'test kubeconfig',
    ...(more.tokens !== undefined ? { token: 'node' } : {}),
  });
  const pub = new SlicePublisher({
    client,
    nodeName: NODE,
    log,
    backoff: { initialMs: 5, maxMs: 40 },
    sysfsRoot: sysfs,
    watch,
    ...(more.resyncMs !== undefined ? { resyncMs: more.resyncMs } : {}),
  });
  const r = { api, pub, lines, client, sysfs };
  rigs.push(r);
  return r;
}

afterEach(async () => {
  for (const r of rigs.splice(0)) {
    await r.pub.stop();
    r.client.close();
    await r.api.stop();
    rmSync(r.sysfs, { recursive: true, force: true });
  }
});

const writes = (api: ApiServerStandIn): string[] =>
  api.requests.filter((r) => r.method !== 'GET').map((r) => `${r.method} ${r.code}`);
const generation = (api: ApiServerStandIn): unknown =>
  ((api.slices.get(SLICE)?.spec as JsonObject | undefined)?.pool as JsonObject | undefined)?.generation;
const count = (lines: string[], re: RegExp): number => lines.filter((l) => re.test(l)).length;

/** Published, and (watch) the watch of our slices open; without it only republish() and failures sync. */
async function published(watch = true): Promise<Rig & { s: NodeSnapshot }> {
  const r = await start(watch);
  const s = await fixtureSnapshot('nvswitch-8.json');
  r.pub.apply(applied(s, null));
  await r.pub.whenSynced();
  if (watch)
    await waitUntil(() => r.api.watches.openCount === 1, { on: onEvent(r.api, 'watch'), what: 'the watch opened' });
  return { ...r, s };
}

/** The slice is there again, as the publisher's log says. */
async function back(r: Rig): Promise<void> {
  await waitFor(() => r.api.slices.get(SLICE), {
    on: onEvent(r.api, 'request'),
    what: () => `the slice back; requests: ${r.api.requests.map((q) => `${q.method} ${q.path} ${q.code}`).join('; ')}`,
  });
  await r.pub.whenSynced();
}

for (const [n, action] of [
  [0, undefined],
  [1, { kind: 'reset' }],
  [3, { kind: 'status', code: 503 }],
  [3, { kind: 'reset' }],
] as const) {
  test(`the kubelet's wipe, then ${n} failed request(s) (${action?.kind ?? 'none'}${
    action?.kind === 'status' ? ` ${action.code}` : ''
  }): the slices come back, at most one WARN and an INFO for it`, async () => {
    const r = await published(false);
    if (action !== undefined) r.api.fault({ method: 'GET', path: SLICES, times: n, action: action as FaultAction });
    assert.equal(r.api.deleteNodeSlices(NODE), 1);
    r.pub.republish();
    await back(r);
    assert.equal(generation(r.api), 2);
    // A GET reset on a reused keep-alive connection may be retried by Node's HTTP client itself.
    const warns = count(r.lines, /WARN.*does not answer/);
    assert.ok(warns <= 1, `one WARN at most: ${r.lines.join('')}`);
    if (action?.kind === 'status') assert.equal(warns, 1);
    assert.equal(count(r.lines, /INFO.*answers again/), warns, 'one INFO for each WARN');
    assert.deepEqual(writes(r.api), ['POST 201', 'POST 201'], 'one write for the wipe, whatever failed before it');
  });
}

test('a failed write (503 on the update) after a taint change: retried from a fresh list, it lands', async () => {
  const r = await published(false);
  r.api.fault({ method: 'PUT', path: `${SLICES}/${SLICE}`, action: { kind: 'status', code: 503 } });
  const uuid = r.s.gpus[2]?.uuid as string;
  const sick = withHealth(
    r.s,
    new Map([
      [uuid, { state: { ...freshHealthState(), health: 'Unhealthy', lastXid: 79 }, reason: 'XID 79', since: 1 }],
    ]),
  );
  r.pub.apply(applied(sick, r.s));
  await waitUntil(() => r.pub.status().failures === 1, { on: onEvent(r.pub.events, 'failed'), what: 'the failure' });
  await r.pub.whenSynced();
  const devices = (r.api.slices.get(SLICE)?.spec as JsonObject | undefined)?.devices as JsonObject[];
  assert.deepEqual(
    ((devices[2]?.taints ?? []) as JsonObject[]).map((t) => t.value),
    ['79'],
  );
  assert.deepEqual(writes(r.api), ['POST 201', 'PUT 503', 'PUT 200']);
});

test('a slice deleted by another client is restored by the watch, once, with no republish', async () => {
  const r = await published();
  r.api.removeSlice(SLICE);
  await back(r);
  assert.equal(generation(r.api), 2);
  assert.deepEqual(writes(r.api), ['POST 201', 'POST 201']);
  assert.equal(count(r.lines, /ResourceSlices restored/), 1);
});

test('a slice edited by another client is restored; our own writes and bookmarks cause no further write', async () => {
  const r = await published();
  r.api.editSlice(SLICE, (s) => {
    (s.spec as JsonObject).devices = ((s.spec as JsonObject).devices as JsonObject[]).slice(0, 3);
  });
  await waitUntil(
    () =>
      ((r.api.slices.get(SLICE)?.spec as JsonObject | undefined)?.devices as JsonObject[] | undefined)?.length === 8,
    {
      on: onEvent(r.api, 'request'),
      what: 'the edit undone',
    },
  );
  await r.pub.whenSynced();
  // A list and a bookmark after our own write: nothing to write.
  const lists = r.api.requests.length;
  r.api.bookmark();
  r.pub.republish();
  await waitUntil(() => r.api.requests.length > lists, { on: onEvent(r.api, 'request'), what: 'the republish list' });
  await r.pub.whenSynced();
  assert.deepEqual(writes(r.api), ['POST 201', 'PUT 200'], 'the edit undone once, nothing more');
});

test('the watch cut: watched again from its resourceVersion, and a deletion after it is restored', async () => {
  const r = await published();
  const opened = r.api.watches.opened;
  assert.equal(r.api.cutWatches(), 1);
  await waitUntil(() => r.api.watches.openCount === 1 && r.api.watches.opened > opened, {
    on: onEvent(r.api, 'watch'),
    what: 'the watch opened again',
  });
  const rewatch = r.api.requests.filter((q) => q.path.includes('watch=true')).at(-1);
  assert.match(rewatch?.path ?? '', /resourceVersion=\d+/);
  r.api.removeSlice(SLICE);
  await back(r);
  assert.equal(count(r.lines, /ResourceSlices restored/), 1);
});

test('410 Gone (history compacted, an ERROR event): listed again, and a deletion meanwhile is restored', async () => {
  const r = await published();
  const lists = r.api.requests.filter((q) => q.method === 'GET' && !q.path.includes('watch=true')).length;
  // The slice goes while the watch is down; the history that held it is compacted away.
  r.api.cutWatches();
  r.api.fault({ method: 'GET', path: SLICES, query: { watch: 'true' }, action: { kind: 'reset' } });
  r.api.removeSlice(SLICE);
  r.api.compact();
  await back(r);
  const relists = r.api.requests.filter((q) => q.method === 'GET' && !q.path.includes('watch=true')).length;
  assert.ok(relists > lists, 'listed again');
  assert.equal(count(r.lines, /ResourceSlices restored/), 1);
  // A 410 ERROR event on an open watch: listed again, nothing written.
  await waitUntil(() => r.api.watches.openCount === 1, { on: onEvent(r.api, 'watch'), what: 'watching again' });
  const before = writes(r.api).length;
  const opened = r.api.watches.opened;
  r.api.compact();
  r.api.cutWatches(true);
  await waitUntil(() => r.api.watches.opened > opened, { on: onEvent(r.api, 'watch'), what: 'watching after 410' });
  await r.pub.whenSynced();
  assert.equal(writes(r.api).length, before);
});

test('credentials that may not watch: one WARN naming the RBAC; a deleted slice is still restored', async () => {
  const allow = ['get nodes', 'list resourceslices', 'create resourceslices', 'update resourceslices'];
  const r = await start(true, { resyncMs: 50, tokens: { node: { user: 'system:node:node-a', allow } } });
  // The watch's own relist after each refusal would restore it too; the resync is what is left without it.
  const s = await fixtureSnapshot('nvswitch-8.json');
  r.pub.apply(applied(s, null));
  await r.pub.whenSynced();
  await waitUntil(() => r.api.requests.filter((q) => q.path.includes('watch=true') && q.code === 403).length >= 2, {
    on: onEvent(r.api, 'request'),
    what: 'the watch refused twice',
  });
  assert.equal(count(r.lines, /WARN.*may not watch our ResourceSlices.*RBAC/), 1);
  r.api.removeSlice(SLICE);
  await back(r);
  assert.equal(count(r.lines, /ResourceSlices restored/), 1);
});

test('no watch: the resync restores a deleted slice, and writes nothing when all is as confirmed', async () => {
  const r = await start(false, { resyncMs: 20 });
  const s = await fixtureSnapshot('nvswitch-8.json');
  r.pub.apply(applied(s, null));
  await r.pub.whenSynced();
  const lists = r.api.requests.length;
  await waitUntil(() => r.api.requests.length >= lists + 3, { on: onEvent(r.api, 'request'), what: '3 resyncs' });
  assert.deepEqual(writes(r.api), ['POST 201'], 'resyncs that find the slices as confirmed write nothing');
  r.api.removeSlice(SLICE);
  await back(r);
  assert.deepEqual(writes(r.api), ['POST 201', 'POST 201']);
  assert.equal(r.api.watches.opened, 0);
});
