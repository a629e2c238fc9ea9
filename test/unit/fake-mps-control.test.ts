// Tests of the fake nvidia-cuda-mps-control (test/fake-nvml/mps-control/fake_mps_control.c), run as
// the plugin will run the real one: `-d` or `-f` for the control daemon, and one command written to
// the stdin of the client, with CUDA_MPS_PIPE_DIRECTORY and CUDA_MPS_LOG_DIRECTORY set. Every test
// has directories of its own and stops the daemons it started (by their pid file).
import { after, before, test } from 'node:test';
import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { buildFakeMpsControl, MPS_CONTROL_NAME } from '../fake-nvml/build.ts';
import { onProcessExit } from '../support/process-exit.ts';
import { onEvent, waitUntil } from '../support/wait.ts';

let program = '';
let tmpDir = '';
let dirCounter = 0;
const started = new Set<number>();

before(async () => {
  program = path.join(await buildFakeMpsControl(), MPS_CONTROL_NAME);
  tmpDir = fs.mkdtempSync(path.join(os.tmpdir(), 'fake-mps-test-'));
});

after(() => {
  // Only daemons these tests started, by their own pid (never 0 or a group).
  for (const pid of started) {
    if (pid <= 0) continue;
    try {
      process.kill(pid, 'SIGKILL');
    } catch {
      // already gone
    }
  }
  if (tmpDir) fs.rmSync(tmpDir, { recursive: true, force: true });
});

type Dirs = { pipe: string; log: string; env: NodeJS.ProcessEnv };

/** Fresh pipe and log directories (not created: the daemon creates them, as the real one does). */
function dirs(extra: NodeJS.ProcessEnv = {}): Dirs {
  const base = path.join(tmpDir, `d${++dirCounter}`);
  const pipe = path.join(base, 'pipe');
  const log = path.join(base, 'log');
  const env: NodeJS.ProcessEnv = {
    PATH: process.env.PATH,
    CUDA_MPS_PIPE_DIRECTORY: pipe,
    CUDA_MPS_LOG_DIRECTORY: log,
    ...extra,
  };
  return { pipe, log, env };
}

type Result = { status: number | null; signal: NodeJS.Signals | null; stdout: string; stderr: string };

/** Runs the program to its end (asynchronously), with `input` (if any) on its stdin. */
function run(d: Dirs, args: string[], input?: string): Promise<Result> {
  return new Promise((resolve, reject) => {
    const child = spawn(program, args, { env: d.env, stdio: ['pipe', 'pipe', 'pipe'] });
    let stdout = '';
    let stderr = '';
    child.stdout.setEncoding('utf8').on('data', (s: string) => (stdout += s));
    child.stderr.setEncoding('utf8').on('data', (s: string) => (stderr += s));
    child.on('error', reject);
    child.on('close', (status, signal) => resolve({ status, signal, stdout, stderr }));
    // A program that ends without reading its input (-d, a usage error) closes the pipe early.
    child.stdin.on('error', (error: NodeJS.ErrnoException) => {
      if (error.code !== 'EPIPE') reject(error);
    });
    if (input === undefined) child.stdin.end();
    else child.stdin.end(input);
  });
}

/** One command through the client, as `echo <command> | nvidia-cuda-mps-control`. */
function client(d: Dirs, command: string): Promise<Result> {
  return run(d, [], `${command}\n`);
}

/** Starts a daemon with -d; it has returned once it listens. */
async function startDaemon(d: Dirs): Promise<number> {
  const result = await run(d, ['-d']);
  assert.deepEqual(result, { status: 0, signal: null, stdout: '', stderr: '' }, '-d succeeds silently');
  const pid = Number(fs.readFileSync(path.join(d.pipe, 'nvidia-cuda-mps-control.pid'), 'utf8'));
  assert.ok(Number.isInteger(pid) && pid > 0);
  started.add(pid);
  return pid;
}

type State = {
  pid: number;
  running: boolean;
  foreground: boolean;
  commands: number;
  cudaVisibleDevices: string | null;
  defaultActiveThreadPercentage: number;
  pinnedMemLimitMiB: Record<string, number>;
};

function state(d: Dirs): State {
  return JSON.parse(fs.readFileSync(path.join(d.pipe, 'fake-mps-state.json'), 'utf8')) as State;
}

/** control.log as [pid, text] pairs, each line checked against the real daemon's format. */
function logLines(d: Dirs): [number, string][] {
  const text = fs.readFileSync(path.join(d.log, 'control.log'), 'utf8');
  return text
    .split('\n')
    .filter((line) => line !== '')
    .map((line) => {
      const m = /^\[\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d{3} Control +(\d+)\] (.*)$/.exec(line);
      assert.ok(m, `control.log line in the real format: ${line}`);
      return [Number(m[1]), m[2] ?? ''];
    });
}

function logTexts(d: Dirs): string[] {
  return logLines(d).map(([, text]) => text);
}

/** Whether the process runs (an ended one that its parent has not reaped yet, a zombie, does not). */
function alive(pid: number): boolean {
  try {
    return !/^\d+ \(.*\) Z /.test(fs.readFileSync(`/proc/${pid}/stat`, 'utf8'));
  } catch {
    return false;
  }
}

/** Waits until the process has ended (waited on through its pidfd). */
const ended = (pid: number, what: string): Promise<void> =>
  waitUntil(() => !alive(pid), { on: onProcessExit(pid), what });

const NO_DAEMON: Result = { status: 1, signal: null, stdout: '', stderr: 'Cannot find MPS control daemon process\n' };

// ---------------------------------------------------------------------------------------------

test('built under the real name, and executable', () => {
  assert.equal(path.basename(program), 'nvidia-cuda-mps-control');
  fs.accessSync(program, fs.constants.X_OK);
});

test('no daemon: the client fails like the real one (its message, status 1) and creates nothing', async () => {
  const d = dirs();
  for (const command of ['get_server_list', 'quit', 'get_default_active_thread_percentage']) {
    assert.deepEqual(await client(d, command), NO_DAEMON, command);
  }
  assert.equal(fs.existsSync(d.pipe), false);
  assert.equal(fs.existsSync(d.log), false);
});

test(
  '-d returns once the daemon listens: socket, lock, pid file ' +
    'and the start lines of control.log; a second -d is refused',
  async () => {
    const d = dirs();
    const pid = await startDaemon(d);
    assert.ok(alive(pid));
    assert.notEqual(pid, 0);
    assert.ok(fs.statSync(path.join(d.pipe, 'control')).isSocket(), 'the control socket, as the real one names it');
    assert.ok(fs.existsSync(path.join(d.pipe, 'control_lock')));
    assert.deepEqual(logLines(d), [
      [pid, `Starting control daemon using socket ${path.join(d.pipe, 'control')}`],
      [pid, `To connect CUDA applications to this daemon, set env CUDA_MPS_PIPE_DIRECTORY=${d.pipe}`],
    ]);
    assert.deepEqual(state(d), {
      pid,
      running: true,
      foreground: false,
      commands: 0,
      cudaVisibleDevices: null,
      defaultActiveThreadPercentage: 100,
      pinnedMemLimitMiB: {},
    });

    assert.deepEqual(await run(d, ['-d']), {
      status: 1,
      signal: null,
      stdout: '',
      stderr: 'An instance of this daemon is already running\n',
    });
    assert.deepEqual(await run(d, ['-f']), {
      status: 1,
      signal: null,
      stdout: '',
      stderr: 'An instance of this daemon is already running\n',
    });
    assert.ok(alive(pid), 'the first daemon still runs');
    assert.deepEqual(await client(d, 'quit'), { status: 0, signal: null, stdout: '', stderr: '' });
  },
);

test('every command: answers as the real daemon gives them, state kept, one Cmd line each in control.log', async () => {
  const d = dirs();
  const pid = await startDaemon(d);
  const ok = (stdout: string): Result => ({ status: 0, signal: null, stdout, stderr: '' });

  assert.deepEqual(await client(d, 'get_server_list'), ok(''), 'no MPS server runs without CUDA clients');
  assert.deepEqual(await client(d, 'get_default_active_thread_percentage'), ok('100.0\n'));
  assert.deepEqual(await client(d, 'set_default_active_thread_percentage 25'), ok('25.0\n'));
  assert.deepEqual(await client(d, 'get_default_active_thread_percentage'), ok('25.0\n'));
  assert.deepEqual(await client(d, 'set_default_active_thread_percentage 33.3'), ok('33.3\n'));
  assert.deepEqual(await client(d, 'set_default_device_pinned_mem_limit 0 4096M'), ok(''));
  assert.deepEqual(await client(d, 'set_default_device_pinned_mem_limit 1 2G'), ok(''));
  assert.deepEqual(await client(d, 'get_default_device_pinned_mem_limit 0'), ok('4096M\n'));
  assert.deepEqual(await client(d, 'get_default_device_pinned_mem_limit 1'), ok('2048M\n'));
  assert.deepEqual(await client(d, 'get_default_device_pinned_mem_limit 2'), ok(''), 'none set');
  assert.deepEqual(await client(d, '  set_default_device_pinned_mem_limit 0 8000M  '), ok(''), 'surrounding blanks');

  // The state file is written before the answer, so it is current when the client returns.
  assert.deepEqual(state(d), {
    pid,
    running: true,
    foreground: false,
    commands: 11,
    cudaVisibleDevices: null,
    defaultActiveThreadPercentage: 33.3,
    pinnedMemLimitMiB: { '0': 8000, '1': 2048 },
  });
  const texts = logTexts(d);
  assert.deepEqual(
    texts.filter((t) => t.startsWith('Cmd:')),
    [
      'Cmd:get_server_list',
      'Cmd:get_default_active_thread_percentage',
      'Cmd:set_default_active_thread_percentage 25',
      'Cmd:get_default_active_thread_percentage',
      'Cmd:set_default_active_thread_percentage 33.3',
      'Cmd:set_default_device_pinned_mem_limit 0 4096M',
      'Cmd:set_default_device_pinned_mem_limit 1 2G',
      'Cmd:get_default_device_pinned_mem_limit 0',
      'Cmd:get_default_device_pinned_mem_limit 1',
      'Cmd:get_default_device_pinned_mem_limit 2',
      'Cmd:set_default_device_pinned_mem_limit 0 8000M',
    ],
  );
  // One exchange, line by line, as the real control.log shows it.
  const at = texts.indexOf('Cmd:set_default_active_thread_percentage 25');
  assert.deepEqual(texts.slice(at - 2, at + 3), [
    'Accepting connection...',
    'NEW UI',
    'Cmd:set_default_active_thread_percentage 25',
    '25.0',
    'UI closed',
  ]);
  const pinned = texts.indexOf('Cmd:set_default_device_pinned_mem_limit 0 4096M');
  assert.deepEqual(
    texts.slice(pinned, pinned + 2),
    ['Cmd:set_default_device_pinned_mem_limit 0 4096M', 'UI closed'],
    'no answer line',
  );
  assert.ok(
    logLines(d).every(([p]) => p === pid),
    'every line from the daemon',
  );
  assert.equal((await client(d, 'quit')).status, 0);
});

test(
  'arguments are checked: a refusal names what was wrong ' + 'and what is right (status 1), and changes nothing',
  async () => {
    const d = dirs();
    await startDaemon(d);
    await client(d, 'set_default_active_thread_percentage 50');
    await client(d, 'set_default_device_pinned_mem_limit 0 1024M');
    const before = state(d);
    const refusals: [string, RegExp][] = [
      ['set_default_active_thread_percentage 101', /^Invalid percentage "101": want a number from 0 to 100$/],
      ['set_default_active_thread_percentage -1', /^Invalid percentage "-1": want a number from 0 to 100$/],
      ['set_default_active_thread_percentage ten', /^Invalid percentage "ten"/],
      ['set_default_active_thread_percentage 50%', /^Invalid percentage "50%"/],
      ['set_default_active_thread_percentage nan', /^Invalid percentage "nan"/],
      [
        'set_default_active_thread_percentage',
        /^usage: set_default_active_thread_percentage <percentage from 0 to 100>$/,
      ],
      ['set_default_active_thread_percentage 10 20', /^usage: set_default_active_thread_percentage/],
      [
        'set_default_device_pinned_mem_limit 0 4096',
        /^Invalid limit "4096": want a positive whole number of MiB or GiB, e\.g\. 4096M or 4G$/,
      ],
      ['set_default_device_pinned_mem_limit 0 0M', /^Invalid limit "0M"/],
      ['set_default_device_pinned_mem_limit 0 1.5G', /^Invalid limit "1\.5G"/],
      ['set_default_device_pinned_mem_limit 0 4096K', /^Invalid limit "4096K"/],
      ['set_default_device_pinned_mem_limit 0 M', /^Invalid limit "M"/],
      ['set_default_device_pinned_mem_limit x 4096M', /^Invalid device "x": want a device index from 0 to 63$/],
      ['set_default_device_pinned_mem_limit 64 4096M', /^Invalid device "64"/],
      [
        'set_default_device_pinned_mem_limit 0',
        /^usage: set_default_device_pinned_mem_limit <device> <limit, e\.g\. 4096M or 4G>$/,
      ],
      ['get_default_device_pinned_mem_limit', /^usage: get_default_device_pinned_mem_limit <device>$/],
      ['get_default_active_thread_percentage 5', /takes no argument/],
      ['get_server_list all', /takes no argument/],
      ['quit now', /^usage: quit \[-t <timeout in seconds>\]$/],
      ['start_server -uid 1000', /^start_server is a real MPS command that this fake does not model$/],
      ['get_client_list 42', /does not model/],
      ['frobnicate', /^Unknown command "frobnicate"$/],
      ['a b c d e', /^Too many arguments$/],
    ];
    for (const [command, message] of refusals) {
      const result = await client(d, command);
      assert.equal(result.status, 1, command);
      assert.equal(result.stdout, '', command);
      assert.match(result.stderr.trimEnd(), message, command);
    }
    const after = state(d);
    assert.equal(after.commands, before.commands + refusals.length, 'each refusal was a command the daemon saw');
    assert.deepEqual({ ...after, commands: 0 }, { ...before, commands: 0 }, 'nothing changed');
    assert.deepEqual((await client(d, 'get_default_active_thread_percentage')).stdout, '50.0\n');

    // The client itself takes one command per run (the real one reads an interactive session).
    const two = await run(d, [], 'get_server_list\nget_server_list\n');
    assert.deepEqual(two, {
      status: 1,
      signal: null,
      stdout: '',
      stderr: 'fake nvidia-cuda-mps-control: got 2 commands on stdin; this fake takes one per run\n',
    });
    assert.deepEqual(
      await run(d, [], '\n  \n'),
      { status: 0, signal: null, stdout: '', stderr: '' },
      'an empty session',
    );
    const usage = await run(d, ['-x']);
    assert.equal(usage.status, 1);
    assert.match(usage.stderr, /^usage: nvidia-cuda-mps-control \[-d \| -f\]/);
    assert.equal((await client(d, 'quit -t 5')).status, 0, 'quit takes the real -t <seconds>');
  },
);

test('CUDA_VISIBLE_DEVICES of the daemon: its devices, numbered from 0, are the ones limits can name', async () => {
  const visible = 'GPU-aaaaaaaa-0000-0000-0000-000000000001,GPU-aaaaaaaa-0000-0000-0000-000000000002';
  const d = dirs({ CUDA_VISIBLE_DEVICES: visible });
  await startDaemon(d);
  assert.equal(state(d).cudaVisibleDevices, visible);
  assert.equal((await client(d, 'set_default_device_pinned_mem_limit 1 1024M')).status, 0);
  const refused = await client(d, 'set_default_device_pinned_mem_limit 2 1024M');
  assert.equal(refused.status, 1);
  assert.equal(
    refused.stderr,
    `Invalid device "2": the daemon's devices are 0 to 1 (CUDA_VISIBLE_DEVICES=${visible})\n`,
  );
  assert.deepEqual(state(d).pinnedMemLimitMiB, { '1': 1024 });
  assert.equal((await client(d, 'quit')).status, 0);
});

test(
  'quit: the daemon has let go of socket, lock and pid file ' +
    'when the client returns; a new one starts with the defaults',
  async () => {
    const d = dirs();
    const pid = await startDaemon(d);
    await client(d, 'set_default_active_thread_percentage 10');
    await client(d, 'set_default_device_pinned_mem_limit 0 512M');
    assert.deepEqual(await client(d, 'quit'), { status: 0, signal: null, stdout: '', stderr: '' });
    assert.equal(fs.existsSync(path.join(d.pipe, 'control')), false, 'socket removed');
    assert.equal(fs.existsSync(path.join(d.pipe, 'nvidia-cuda-mps-control.pid')), false, 'pid file removed');
    assert.equal(state(d).running, false);
    assert.deepEqual(logTexts(d).slice(-4), ['NEW UI', 'Cmd:quit', 'UI closed', 'Exit']);
    assert.deepEqual(await client(d, 'get_server_list'), NO_DAEMON);
    await ended(pid, 'the daemon process ended');
    started.delete(pid);

    // The limits are the daemon's: like the real one's, they are lost with it.
    const second = await startDaemon(d);
    assert.notEqual(second, pid);
    assert.equal((await client(d, 'get_default_active_thread_percentage')).stdout, '100.0\n');
    assert.deepEqual(state(d).pinnedMemLimitMiB, {});
    assert.equal((await client(d, 'quit')).status, 0);
  },
);

test(
  '-f runs the daemon in the foreground: log lines on ' + 'stdout too, clients served, SIGTERM ends it cleanly',
  async () => {
    const d = dirs();
    const child = spawn(program, ['-f'], { env: d.env, stdio: ['ignore', 'pipe', 'pipe'] });
    const pid = child.pid;
    assert.ok(pid !== undefined && pid > 0, 'the foreground daemon was spawned');
    started.add(pid);
    let stdout = '';
    child.stdout.setEncoding('utf8').on('data', (s: string) => (stdout += s));
    const exited = new Promise<[number | null, NodeJS.Signals | null]>((resolve) =>
      child.on('exit', (code, signal) => resolve([code, signal])),
    );
    const printed = (text: string): Promise<void> =>
      waitUntil(() => stdout.includes(text), {
        on: onEvent(child.stdout, 'data'),
        what: `${JSON.stringify(text)} on stdout`,
      });
    await printed('To connect CUDA applications to this daemon');
    assert.equal(state(d).foreground, true);
    assert.equal(state(d).pid, pid);

    assert.equal((await client(d, 'set_default_active_thread_percentage 50')).stdout, '50.0\n');
    await printed('UI closed');
    assert.match(stdout, /^\[\d{4}-\d\d-\d\d [\d:.]+ Control +\d+\] Cmd:set_default_active_thread_percentage 50$/m);
    assert.equal(
      stdout,
      fs.readFileSync(path.join(d.log, 'control.log'), 'utf8'),
      'stdout carries the control.log lines',
    );

    child.kill('SIGTERM');
    assert.deepEqual(await exited, [0, null]);
    started.delete(pid);
    assert.equal(fs.existsSync(path.join(d.pipe, 'control')), false);
    assert.deepEqual(await client(d, 'get_server_list'), NO_DAEMON);
    assert.equal(logTexts(d).at(-1), 'Exit');

    // quit ends a foreground daemon as well, with status 0.
    const again = spawn(program, ['-f'], { env: d.env, stdio: ['ignore', 'pipe', 'ignore'] });
    again.stdout.resume();
    const againPid = again.pid;
    assert.ok(againPid !== undefined && againPid > 0, 'the second foreground daemon was spawned');
    started.add(againPid);
    const againExited = new Promise<number | null>((resolve) => again.on('exit', (code) => resolve(code)));
    await waitUntil(() => fs.existsSync(path.join(d.pipe, 'control')), {
      on: onEvent(again.stdout, 'data'),
      what: 'the second foreground daemon listens',
    });
    assert.equal((await client(d, 'quit')).status, 0);
    assert.equal(await againExited, 0);
    started.delete(againPid);
  },
);

test(
  'a daemon killed with SIGKILL leaves its socket ' + 'behind: clients find no daemon, and -d starts afresh',
  async () => {
    const d = dirs();
    const pid = await startDaemon(d);
    process.kill(pid, 'SIGKILL');
    await ended(pid, 'the killed daemon is gone');
    started.delete(pid);
    assert.ok(fs.existsSync(path.join(d.pipe, 'control')), 'the stale socket stays');
    assert.deepEqual(await client(d, 'get_default_active_thread_percentage'), NO_DAEMON);
    const next = await startDaemon(d);
    assert.equal((await client(d, 'get_default_active_thread_percentage')).stdout, '100.0\n');
    assert.equal(state(d).pid, next);
    assert.equal((await client(d, 'quit')).status, 0);
  },
);

test('a pipe directory too long for a unix socket is refused with the reason', async () => {
  const d = dirs();
  const long = path.join(tmpDir, 'x'.repeat(120));
  const result = await run({ ...d, env: { ...d.env, CUDA_MPS_PIPE_DIRECTORY: long } }, ['-d']);
  assert.equal(result.status, 1);
  assert.match(result.stderr, /is too long for a unix socket path/);
});
