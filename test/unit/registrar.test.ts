import { test } from 'node:test';
import assert from 'node:assert/strict';
import { Registrar } from '../../src/kubelet/registrar.ts';
import { createLogger, formatLine } from '../../src/system/log.ts';

function memoryLog(): { lines: string[]; log: ReturnType<typeof createLogger> } {
  const lines: string[] = [];
  return { lines, log: createLogger({ level: 'debug', journal: false, write: (l) => lines.push(l) }) };
}

/** Lets the registrar's promise chains run (setImmediate is not among the mocked timers). */
const settle = (): Promise<void> => new Promise((r) => setImmediate(r));

test('a failing kubelet is retried with growing backoff and logged once per distinct problem', async (t) => {
  t.mock.timers.enable({ apis: ['setTimeout', 'Date'] });
  const { lines, log } = memoryLog();
  const callsAt: number[] = [];
  const r = new Registrar({
    log,
    ensureServing: async () => undefined,
    register: async () => { callsAt.push(Date.now()); throw new Error('connect ENOENT kubelet.sock'); },
    initialBackoffMs: 5,
    maxBackoffMs: 40,
  });
  r.kick('start');
  await settle();
  // Each retry is due when the backoff before it ran out: advance to it, one at a time.
  const waits = [5, 10, 20, 40, 40, 40, 40];
  for (let i = 0; i < waits.length; i++) {
    t.mock.timers.tick(waits[i]! - 1);
    await settle();
    assert.equal(callsAt.length, i + 1, `retry ${i + 1} not before its backoff of ${waits[i]} ms ran out`);
    t.mock.timers.tick(1);
    await settle();
    assert.equal(callsAt.length, i + 2, `retry ${i + 1} once its backoff ran out`);
  }
  const gaps = callsAt.slice(1).map((at, i) => at - callsAt[i]!);
  assert.deepEqual(gaps, waits, 'doubling from 5 ms, capped at 40 ms');
  assert.equal(lines.filter((l) => l.includes('cannot register')).length, 1);
  r.stop();
  assert.equal(r.current, 'stopped');
  const after = callsAt.length;
  t.mock.timers.tick(1000);
  await settle();
  assert.equal(callsAt.length, after, 'no attempts after stop');
});

test('a kick during backoff tries at once; a kick during an attempt queues exactly one more', async (t) => {
  t.mock.timers.enable({ apis: ['setTimeout'] });
  const { log } = memoryLog();
  let calls = 0;
  let fail = true;
  let release: (() => void) | undefined;
  const r = new Registrar({
    log,
    ensureServing: async () => undefined,
    register: async () => {
      calls++;
      if (fail) throw new Error('down');
      await new Promise<void>((res) => { release = res; });
    },
    initialBackoffMs: 10000,
  });
  r.kick('start');
  await settle();
  assert.equal(calls, 1);
  assert.equal(r.current, 'waiting');
  fail = false;
  r.kick('kubelet socket created');
  await settle();
  assert.equal(calls, 2, 'tried at once despite a 10 s backoff (no time has passed)');
  assert.equal(r.current, 'registering');
  r.kick('again');
  r.kick('and again');
  release?.();
  await settle();
  assert.equal(calls, 3, 'one queued attempt for several kicks');
  release?.();
  await settle();
  assert.equal(r.current, 'registered');
  assert.equal(r.registrationCount, 2);
  t.mock.timers.tick(60000);
  await settle();
  assert.equal(calls, 3, 'nothing more once registered');
  r.stop();
});

test('a kick while registered reports the registration lost, once, before trying again', async (t) => {
  t.mock.timers.enable({ apis: ['setTimeout'] });
  const { log } = memoryLog();
  const events: string[] = [];
  let fail = false;
  const r = new Registrar({
    log,
    ensureServing: async () => undefined,
    register: async () => { if (fail) throw new Error('listen EROFS'); },
    onRegistered: () => events.push('registered'),
    onUnregistered: (reason) => events.push(`lost: ${reason}`),
    initialBackoffMs: 5,
    maxBackoffMs: 10,
  });
  r.kick('start');
  await settle();
  assert.equal(r.current, 'registered');
  fail = true;
  r.kick('plugin socket removed');
  await settle();
  for (let i = 0; i < 5; i++) {
    t.mock.timers.tick(10);
    await settle();
  }
  assert.equal(r.current, 'waiting');
  r.kick('kubelet socket changed');
  await settle();
  fail = false;
  t.mock.timers.tick(10);
  await settle();
  assert.equal(r.current, 'registered');
  r.stop();
  assert.deepEqual(events, ['registered', 'lost: plugin socket removed', 'registered']);
});

test('log lines carry level, message and key=value context, quoted when needed', () => {
  const now = new Date('2026-01-02T03:04:05.000Z');
  assert.equal(formatLine('info', 'registered', { reason: 'kubelet socket created', attempts: 2 }, false, now),
    '2026-01-02T03:04:05.000Z INFO registered reason="kubelet socket created" attempts=2');
  assert.equal(formatLine('warn', 'x', { list: ['a', 'b'], none: null }, true, now), '<4>WARN x list=a,b none=-');
  assert.equal(formatLine('error', 'multi\nline', {}, false, now), '2026-01-02T03:04:05.000Z ERROR multi\\nline');
});
