import { test } from 'node:test';
import assert from 'node:assert/strict';
import * as grpc from '@grpc/grpc-js';
import { Registrar } from '../../src/kubelet/registrar.ts';
import { registerProblem } from '../../src/kubelet/registration.ts';
import { listenProblem } from '../../src/kubelet/socket-server.ts';
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
    register: async () => {
      callsAt.push(Date.now());
      throw new Error('connect ENOENT kubelet.sock');
    },
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
      await new Promise<void>((res) => {
        release = res;
      });
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
    register: async () => {
      if (fail) throw new Error('listen EROFS');
    },
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

test(
  'after a loss, failures stay at debug and the new ' + 'registration is the one line; a long loss is one WARN',
  async (t) => {
    t.mock.timers.enable({ apis: ['setTimeout'] });
    const { lines, log } = memoryLog();
    const events: string[] = [];
    let fail = false;
    const r = new Registrar({
      log,
      ensureServing: async () => undefined,
      register: async () => {
        if (fail) throw new Error('no kubelet socket at /x/kubelet.sock (is the kubelet running?)');
      },
      onUnregistered: (reason) => events.push(`lost: ${reason}`),
      initialBackoffMs: 50,
      maxBackoffMs: 5000,
      quietMs: 30000,
    });
    r.kick('start');
    await settle();
    assert.equal(r.current, 'registered');
    const above = (): string[] => lines.filter((l) => / (INFO|WARN|ERROR) /.test(l));
    const before = above().length;

    // A routine restart: the kubelet goes (nothing to register with),
    // our socket is deleted (a kick that fails), it comes back.
    r.lost('kubelet socket removed');
    assert.equal(r.current, 'idle', 'no attempt while there is no kubelet');
    r.lost('kubelet socket removed (periodic check)');
    assert.deepEqual(events, ['lost: kubelet socket removed'], 'reported once');
    fail = true;
    r.kick('plugin socket removed');
    await settle();
    t.mock.timers.tick(150);
    await settle();
    assert.equal(r.current, 'waiting');
    fail = false;
    r.kick('kubelet socket created');
    await settle();
    assert.equal(r.current, 'registered');
    assert.deepEqual(
      above()
        .slice(before)
        .map((l) => l.replace(/^\S+ /, '').trimEnd()),
      ['INFO registered with the kubelet reason="kubelet socket created" attempts=3'],
    );

    // A kubelet away for longer than quietMs: one WARN, then the INFO when it is back.
    const mark = above().length;
    r.lost('kubelet socket removed');
    fail = true;
    r.kick('plugin socket removed');
    for (let i = 0; i < 40; i++) {
      t.mock.timers.tick(1000);
      await settle();
    }
    fail = false;
    r.kick('kubelet socket created');
    await settle();
    const later = above()
      .slice(mark)
      .map((l) => l.replace(/^\S+ /, '').trimEnd());
    assert.equal(later.length, 2, later.join('\n'));
    assert.match(
      later[0]!,
      new RegExp(
        '^WARN still not registered with the kubelet; retrying reason="kubelet socket removed" ' +
          String.raw`error="no kubelet socket at \/x\/kubelet.sock \(is the kubelet running\?\)" waited_ms=30000$`,
      ),
    );
    assert.match(later[1]!, /^INFO registered with the kubelet reason="kubelet socket created"/);
    r.stop();
  },
);

test("Register failures are said once, by what went wrong, without grpc-js's own text", () => {
  const sock = '/var/lib/kubelet/device-plugins/kubelet.sock';
  const raw = `No connection established. Last error: Error: connect ENOENT ${sock}. Resolution note: `;
  assert.equal(
    registerProblem(sock, grpc.status.UNAVAILABLE, raw, 10000),
    `no kubelet socket at ${sock} (is the kubelet running?)`,
  );
  assert.match(
    registerProblem(sock, grpc.status.UNAVAILABLE, `connect ECONNREFUSED ${sock}`, 10000),
    /ECONNREFUSED; the kubelet is stopping or starting/,
  );
  assert.equal(
    registerProblem(sock, grpc.status.CANCELLED, 'Call cancelled', 10000),
    `the kubelet at ${sock} went away during the Register call`,
  );
  assert.equal(
    registerProblem(sock, grpc.status.UNKNOWN, 'resource already registered', 10000),
    `the kubelet at ${sock} refused the registration: resource already registered (gRPC UNKNOWN)`,
  );
  assert.match(
    registerProblem(sock, grpc.status.DEADLINE_EXCEEDED, 'Deadline exceeded after 10.001s', 10000),
    /did not answer the Register call within 10000 ms$/,
  );
  for (const code of [grpc.status.UNAVAILABLE, grpc.status.CANCELLED, grpc.status.DEADLINE_EXCEEDED]) {
    const text = registerProblem(sock, code, raw, 10000);
    assert.equal(text.split(sock).length - 1, 1, `the socket named once: ${text}`);
    assert.doesNotMatch(text, /No connection established|Resolution note|Call cancelled/);
  }
  assert.equal(
    listenProblem('No address added out of total 1 resolved errors: [listen EROFS: read-only file system /d/x.sock]'),
    'read-only file system (EROFS)',
  );
  assert.equal(listenProblem('something else'), 'something else');
});

test('log lines carry level, message and key=value context, quoted when needed', () => {
  const now = new Date('2026-01-02T03:04:05.000Z');
  assert.equal(
    formatLine('info', 'registered', { reason: 'kubelet socket created', attempts: 2 }, false, now),
    '2026-01-02T03:04:05.000Z INFO registered reason="kubelet socket created" attempts=2',
  );
  assert.equal(formatLine('warn', 'x', { list: ['a', 'b'], none: null }, true, now), '<4>WARN x list=a,b none=-');
  assert.equal(formatLine('error', 'multi\nline', {}, false, now), '2026-01-02T03:04:05.000Z ERROR multi\\nline');
});
