// The named concurrency helpers (src/system/timers.ts) on node:test's mocked timers: a timer owner
// that replaces timers by name and disposes every one, and a coalescing serial queue.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { CoalescingQueue, KeyedQueue, TimerOwner } from '../../src/system/timers.ts';

test(
  'TimerOwner: a timer set again under its name replaces ' + 'the first; dispose clears every one and wakes sleepers',
  async (ctx) => {
    ctx.mock.timers.enable({ apis: ['setTimeout', 'setInterval'] });
    const t = new TimerOwner();
    const fired: string[] = [];
    t.after('a', 100, () => fired.push('a1'));
    t.after('a', 200, () => fired.push('a2'));
    t.every('b', 50, () => fired.push('b'));
    ctx.mock.timers.tick(100);
    assert.deepEqual(fired, ['b', 'b'], 'a1 was replaced');
    ctx.mock.timers.tick(100);
    assert.deepEqual(fired, ['b', 'b', 'b', 'a2', 'b']);
    assert.equal(t.has('a'), false, 'a one-shot timer forgets itself');
    let woke = false;
    const sleeping = t.sleep('nap', 10_000).then(() => {
      woke = true;
    });
    t.dispose();
    await sleeping;
    assert.ok(woke, 'dispose wakes a sleeper');
    ctx.mock.timers.tick(10_000);
    assert.deepEqual(fired, ['b', 'b', 'b', 'a2', 'b'], 'nothing fires after dispose');
    t.after('c', 1, () => fired.push('c'));
    ctx.mock.timers.tick(1);
    assert.equal(fired.includes('c'), false, 'nothing is set after dispose');
  },
);

test(
  'CoalescingQueue: one run at a time; requests during a run fold into one ' +
    'more, merged; each caller waits for a run that started after it asked',
  async () => {
    const runs: string[][] = [];
    let release: (() => void) | undefined;
    const q = new CoalescingQueue<string[]>(
      async (reasons) => {
        runs.push(reasons);
        await new Promise<void>((r) => {
          release = r;
        });
      },
      (a, b) => [...a, ...b],
    );
    const first = q.request(['start']);
    assert.ok(q.busy);
    const second = q.request(['x']);
    const third = q.request(['y']);
    assert.equal(second, third, 'folded into one pending run');
    release!();
    await first;
    assert.deepEqual(runs, [['start'], ['x', 'y']]);
    release!();
    await second;
    assert.equal(q.busy, false);
    const failing = new CoalescingQueue<number>(
      async (n) => {
        if (n === 1) throw new Error('run 1 failed');
      },
      (a) => a,
    );
    await assert.rejects(failing.request(1), /run 1 failed/);
    await failing.request(2);
    await failing.close();
    await failing.request(3);
  },
);

test('KeyedQueue: one key runs its jobs in order, each to its own result; other keys run beside it', async () => {
  const q = new KeyedQueue<string>();
  const events: string[] = [];
  const gates = new Map<string, () => void>();
  const job =
    (name: string, fail = false) =>
    async (): Promise<string> => {
      events.push(`start ${name}`);
      await new Promise<void>((r) => gates.set(name, r));
      events.push(`end ${name}`);
      if (fail) throw new Error(`${name} failed`);
      return name;
    };
  const a1 = q.run('a', job('a1', true));
  const a2 = q.run('a', job('a2'));
  const b1 = q.run('b', job('b1'));
  await new Promise<void>((r) => setImmediate(r));
  assert.deepEqual(events, ['start a1', 'start b1'], 'a2 waits for a1; b1 does not');
  gates.get('a1')!();
  await assert.rejects(a1, /a1 failed/);
  await new Promise<void>((r) => setImmediate(r));
  assert.deepEqual(events.slice(2), ['end a1', 'start a2'], 'a2 runs after a1, which failed');
  gates.get('a2')!();
  gates.get('b1')!();
  assert.deepEqual(await Promise.all([a2, b1]), ['a2', 'b1']);
  await q.drain();
});
