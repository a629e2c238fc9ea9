// dra/slice-watch.ts's loop with a fake client and mocked timers: a list that fails is retried after
// the backoff (doubling to the cap), a watch is opened from the list's resourceVersion, a watch the
// server ends at once is not re-opened in a busy loop, 410 relists at once, a re-watch that fails
// relists, stop() ends it all, and a 401 is one ERROR until a list succeeds (one INFO then).
import { test } from 'node:test';
import type { TestContext } from 'node:test';
import assert from 'node:assert/strict';
import { PassThrough } from 'node:stream';
import type { IncomingMessage } from 'node:http';
import { KubeApiError, KubeUnreachableError } from '../../src/k8s/client.ts';
import type { KubeClient } from '../../src/k8s/client.ts';
import { SliceWatch } from '../../src/dra/slice-watch.ts';
import { createLogger } from '../../src/system/log.ts';

type Step = 'list-fails' | 'list-401' | 'list' | 'watch-gone' | 'watch-fails' | 'watch-open' | 'watch-ends';

/** A client that answers each call by the next scripted step, and records the calls. */
function fakeClient(script: Step[]) {
  const calls: string[] = [];
  const streams: PassThrough[] = [];
  const next = (kind: 'list' | 'watch'): Step => {
    const s = script.shift();
    if (s === undefined) throw new Error(`no scripted answer for a ${kind}`);
    return s;
  };
  const client = {
    server: 'https://api.test',
    async request(method: string, path: string) {
      calls.push(`LIST`);
      const s = next('list');
      if (s === 'list-fails')
        throw new KubeUnreachableError(method, path, 'https://api.test', 'ECONNREFUSED', 'refused');
      if (s === 'list-401') throw new KubeApiError(method, path, 401, 'Unauthorized', 'Unauthorized', []);
      return { metadata: { resourceVersion: String(100 + calls.length) }, items: [] };
    },
    async stream(path: string, query: Record<string, string>) {
      calls.push(`WATCH rv=${query.resourceVersion}`);
      const s = next('watch');
      if (s === 'watch-gone') throw new KubeApiError('GET', path, 410, 'Expired', 'too old resource version', []);
      if (s === 'watch-fails') throw new KubeUnreachableError('GET', path, 'https://api.test', 'ECONNRESET', 'reset');
      const res = new PassThrough();
      streams.push(res);
      if (s === 'watch-ends') queueMicrotask(() => res.end());
      return Object.assign(res, { setTimeout: () => res }) as unknown as IncomingMessage;
    },
  };
  return { client: client as unknown as KubeClient, calls, streams };
}

/** Lets the loop's promises run (no timer fires: they are mocked). */
async function settle(): Promise<void> {
  for (let i = 0; i < 20; i++) await new Promise<void>((r) => setImmediate(r));
}

function watchOn(t: TestContext, script: Step[]) {
  t.mock.timers.enable({ apis: ['setTimeout', 'Date'] });
  const f = fakeClient(script);
  const lines: string[] = [];
  const log = createLogger({ level: 'debug', journal: false, write: (l) => lines.push(l) });
  const lists: number[] = [];
  const w = new SliceWatch({
    client: f.client,
    nodeName: 'n1',
    driver: 'gpu.nvidia.com',
    log,
    backoff: { initialMs: 1000, maxMs: 4000 },
    onList: (items) => lists.push(items.length),
    onEvent: () => undefined,
  });
  t.after(() => w.stop());
  return { ...f, w, lists, lines };
}

test('a failing list is retried after 1 s, 2 s, 4 s, 4 s (the cap), then watched from its version', async (t) => {
  const f = watchOn(t, ['list-fails', 'list-fails', 'list-fails', 'list-fails', 'list', 'watch-open']);
  f.w.start();
  await settle();
  assert.deepEqual(f.calls, ['LIST']);
  for (const [ms, n] of [
    [999, 1],
    [1, 2],
    [2000, 3],
    [4000, 4],
    [4000, 5],
  ] as const) {
    t.mock.timers.tick(ms);
    await settle();
    assert.equal(f.calls.length, n + (n === 5 ? 1 : 0), `after ${ms} ms more: ${f.calls.join(', ')}`);
  }
  assert.deepEqual(f.calls.slice(-2), ['LIST', 'WATCH rv=105']);
  assert.deepEqual(f.lists, [0]);
});

test('a watch the server ends at once is re-opened after the backoff, not in a busy loop', async (t) => {
  const f = watchOn(t, ['list', 'watch-ends', 'watch-ends', 'watch-open']);
  f.w.start();
  await settle();
  assert.deepEqual(f.calls, ['LIST', 'WATCH rv=101']);
  t.mock.timers.tick(1000);
  await settle();
  assert.deepEqual(f.calls, ['LIST', 'WATCH rv=101', 'WATCH rv=101']);
  t.mock.timers.tick(1999);
  await settle();
  assert.equal(f.calls.length, 3, 'the second wait is doubled');
  t.mock.timers.tick(1);
  await settle();
  assert.deepEqual(f.calls.at(-1), 'WATCH rv=101');
});

test('410 on the watch lists again at once; a re-watch that fails lists again after the backoff', async (t) => {
  const f = watchOn(t, ['list', 'watch-gone', 'list', 'watch-fails', 'list', 'watch-open']);
  f.w.start();
  await settle();
  assert.deepEqual(f.calls, ['LIST', 'WATCH rv=101', 'LIST', 'WATCH rv=103']);
  t.mock.timers.tick(1000);
  await settle();
  assert.deepEqual(f.calls.slice(4), ['LIST', 'WATCH rv=105']);
  assert.deepEqual(f.lists, [0, 0, 0]);
  f.w.stop();
  f.streams.at(-1)?.end();
  await settle();
  assert.equal(f.calls.length, 6, 'nothing after stop()');
});

test('a 401 is one ERROR naming the credentials (not the RBAC) until a list succeeds, then one INFO', async (t) => {
  const f = watchOn(t, ['list-401', 'list-401', 'list-401', 'list', 'watch-fails', 'list-401', 'list', 'watch-open']);
  const said = (re: RegExp): string[] => f.lines.filter((l) => re.test(l));
  f.w.start();
  await settle();
  for (const ms of [1000, 2000, 4000]) {
    t.mock.timers.tick(ms);
    await settle();
  }
  assert.deepEqual(f.calls, ['LIST', 'LIST', 'LIST', 'LIST', 'WATCH rv=104']);
  assert.equal(said(/ERROR DRA: the API server does not accept our credentials \(401/).length, 1, f.lines.join(''));
  assert.equal(said(/RBAC/).length, 0, 'a 401 is no missing grant');
  assert.equal(said(/INFO DRA: the API server accepts our credentials again/).length, 1, f.lines.join(''));
  // Refused again later (another rotation): said again, and its end too.
  t.mock.timers.tick(4000);
  await settle();
  t.mock.timers.tick(4000);
  await settle();
  assert.deepEqual(f.calls.slice(5), ['LIST', 'LIST', 'WATCH rv=107']);
  assert.equal(said(/ERROR DRA: the API server does not accept our credentials/).length, 2, f.lines.join(''));
  assert.equal(said(/INFO DRA: the API server accepts our credentials again/).length, 2, f.lines.join(''));
});
