import { test } from 'node:test';
import assert from 'node:assert/strict';
import { Registrar } from '../../src/kubelet/registrar.ts';
import { createLogger, formatLine } from '../../src/system/log.ts';

function memoryLog(): { lines: string[]; log: ReturnType<typeof createLogger> } {
  const lines: string[] = [];
  return { lines, log: createLogger({ level: 'debug', journal: false, write: (l) => lines.push(l) }) };
}

const tick = (ms: number): Promise<void> => new Promise((r) => setTimeout(r, ms));

test('a failing kubelet is retried with growing backoff and logged once per distinct problem', async () => {
  const { lines, log } = memoryLog();
  let calls = 0;
  const r = new Registrar({
    log,
    ensureServing: async () => undefined,
    register: async () => { calls++; throw new Error('connect ENOENT kubelet.sock'); },
    initialBackoffMs: 5,
    maxBackoffMs: 40,
  });
  r.kick('start');
  await tick(300);
  r.stop();
  assert.ok(calls >= 4 && calls <= 14, `backoff 5→40 ms gives a handful of tries in 300 ms, got ${calls}`);
  assert.equal(lines.filter((l) => l.includes('cannot register')).length, 1);
  assert.equal(r.current, 'stopped');
  const after = calls;
  await tick(100);
  assert.equal(calls, after, 'no attempts after stop');
});

test('a kick during backoff tries at once; a kick during an attempt queues exactly one more', async () => {
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
  await tick(20);
  assert.equal(calls, 1);
  assert.equal(r.current, 'waiting');
  fail = false;
  r.kick('kubelet socket created');
  await tick(20);
  assert.equal(calls, 2, 'tried at once despite a 10 s backoff');
  r.kick('again');
  r.kick('and again');
  release?.();
  await tick(20);
  assert.equal(calls, 3, 'one queued attempt for several kicks');
  release?.();
  await tick(20);
  assert.equal(r.current, 'registered');
  assert.equal(r.registrationCount, 2);
  r.stop();
});

test('a kick while registered reports the registration lost, once, before trying again', async () => {
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
  await tick(20);
  fail = true;
  r.kick('plugin socket removed');
  await tick(60);
  assert.equal(r.current, 'waiting');
  r.kick('kubelet socket changed');
  fail = false;
  await tick(40);
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
