// Tests of the fake nvidia-smi (test/fake-nvml/nvidia-smi/fake_nvidia_smi.c), run with the command lines
// NVIDIA's DRA driver runs to time-slice a GPU: `-i <uuid> -c DEFAULT`, then
// `compute-policy -i <uuid> --set-timeslice <n>`. Each test has its own state and log files; the GPUs
// are those of a fake NVML topology file.
import { after, before, test } from 'node:test';
import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { buildFakeNvidiaSmi, NVIDIA_SMI_NAME } from '../fake-nvml/build.ts';
import { onFileChange, waitFor } from '../support/wait.ts';

const TOPOLOGY = path.join(import.meta.dirname, '..', 'fixtures', 'topologies', 'bridged-pair-4.json');
const GPUS = (JSON.parse(fs.readFileSync(TOPOLOGY, 'utf8')) as { gpus: { uuid: string; busId: string }[] }).gpus;
const uuid = (i: number): string => GPUS[i]!.uuid;
const busId = (i: number): string => GPUS[i]!.busId.toUpperCase();

let program = '';
let tmpDir = '';
let counter = 0;

before(async () => {
  program = path.join(await buildFakeNvidiaSmi(), NVIDIA_SMI_NAME);
  tmpDir = fs.mkdtempSync(path.join(os.tmpdir(), 'fake-smi-test-'));
});

after(() => {
  if (tmpDir) fs.rmSync(tmpDir, { recursive: true, force: true });
});

type Files = { dir: string; state: string; log: string; env: NodeJS.ProcessEnv };

function files(extra: NodeJS.ProcessEnv = {}): Files {
  const dir = path.join(tmpDir, `t${++counter}`);
  fs.mkdirSync(dir);
  const state = path.join(dir, 'state.json');
  const log = path.join(dir, 'calls.log');
  const env: NodeJS.ProcessEnv = {
    PATH: process.env.PATH,
    FAKE_NVML_CONFIG: TOPOLOGY,
    FAKE_NVIDIA_SMI_STATE: state,
    FAKE_NVIDIA_SMI_LOG: log,
    ...extra,
  };
  return { dir, state, log, env };
}

type Result = { status: number | null; stdout: string; stderr: string };

function run(f: { env: NodeJS.ProcessEnv }, args: string[]): Promise<Result> {
  return new Promise((resolve, reject) => {
    const child = spawn(program, args, { env: f.env, stdio: ['ignore', 'pipe', 'pipe'] });
    let stdout = '';
    let stderr = '';
    child.stdout.setEncoding('utf8').on('data', (s: string) => (stdout += s));
    child.stderr.setEncoding('utf8').on('data', (s: string) => (stderr += s));
    child.on('error', reject);
    child.on('close', (status) => resolve({ status, stdout, stderr }));
  });
}

type LogLine = { time: string; pid: number; argv: string[]; status: number | null };
const logLines = (f: Files): LogLine[] =>
  fs.existsSync(f.log)
    ? fs
        .readFileSync(f.log, 'utf8')
        .split('\n')
        .filter((l) => l.length > 0)
        .map((l) => JSON.parse(l) as LogLine)
    : [];

type State = { gpus: Record<string, { timeslice: number; computeMode: string }> };
const state = (f: Files): State => JSON.parse(fs.readFileSync(f.state, 'utf8')) as State;
const timeslices = (f: Files): number[] => GPUS.map((g) => state(f).gpus[g.uuid]?.timeslice ?? -1);

const setTimeslice = (i: number, n: number | string): string[] => [
  'compute-policy',
  '-i',
  uuid(i),
  '--set-timeslice',
  String(n),
];

const HELP = `
    Compute Policy -- Control and list compute policies.

    Usage: nvidia-smi compute-policy [options]

    Options include:
    [-i | --id]: GPU device ID's. Provide comma
                 separated values for more than one device

    [-l | --list]: List all compute policies

    [ | --set-timeslice]: Set timeslice config for a GPU:
                          0=DEFAULT, 1=SHORT, 2=MEDIUM, 3=LONG

    [-h | --help]: Display help information

`;

test('built under the real name, and executable', () => {
  assert.equal(path.basename(program), 'nvidia-smi');
  fs.accessSync(program, fs.constants.X_OK);
});

test('compute-policy alone or with -h prints the real help text (status 0), without a driver', async () => {
  const f = files({ FAKE_NVML_CONFIG: '' });
  assert.deepEqual(await run(f, ['compute-policy']), { status: 0, stdout: HELP, stderr: '' });
  assert.deepEqual(await run(f, ['compute-policy', '--help']), { status: 0, stdout: HELP, stderr: '' });
});

test("NVIDIA's command line sets one GPU's time-slice: kept in the state, read back by -l, logged", async () => {
  const f = files();
  const set = await run(f, setTimeslice(1, 2));
  assert.deepEqual(set, {
    status: 0,
    stdout: `Set timeslice to 2 (Medium) for GPU ${busId(1)}.\nAll done.\n`,
    stderr: '',
  });
  assert.deepEqual(timeslices(f), [0, 2, 0, 0], 'only the GPU named');

  const list = await run(f, ['compute-policy', '-l']);
  assert.equal(list.status, 0);
  assert.equal(
    list.stdout,
    GPUS.map(
      (g, i) =>
        `GPU ${g.busId.toUpperCase()}\n    Timeslice                             : ${i === 1 ? 'Medium' : 'Default'}\n`,
    ).join(''),
  );
  assert.equal(
    (await run(f, ['compute-policy', '--list', '--id', uuid(1)])).stdout,
    `${list.stdout.split('\n').slice(2, 4).join('\n')}\n`,
  );

  const lines = logLines(f);
  assert.deepEqual(
    lines.map((l) => [l.argv, l.status]),
    [
      [setTimeslice(1, 2), 0],
      [['compute-policy', '-l'], 0],
      [['compute-policy', '--list', '--id', uuid(1)], 0],
    ],
  );
  for (const line of lines) {
    assert.match(line.time, /^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z$/);
    assert.ok(line.pid > 0);
  }
});

test('a GPU named by index, bus id (any case) or a comma list; --set-timeslice=<n>; no -i: every GPU', async () => {
  const f = files();
  assert.equal((await run(f, ['compute-policy', '-i', '0', '--set-timeslice=3'])).status, 0);
  assert.equal((await run(f, ['compute-policy', '-i', busId(2).toLowerCase(), '--set-timeslice', '1'])).status, 0);
  assert.deepEqual(timeslices(f), [3, 0, 1, 0]);
  assert.equal((await run(f, ['compute-policy', `--id=${uuid(1)},3`, '--set-timeslice', '2'])).status, 0);
  assert.deepEqual(timeslices(f), [3, 2, 1, 2]);
  const all = await run(f, ['compute-policy', '--set-timeslice', '0']);
  assert.equal(all.status, 0);
  assert.equal(all.stdout.split('\n').filter((l) => l.startsWith('Set timeslice to 0 (Default)')).length, 4);
  assert.deepEqual(timeslices(f), [0, 0, 0, 0]);
});

test('an unknown GPU: "No devices were found", status 6, nothing changed', async () => {
  const f = files();
  await run(f, setTimeslice(0, 1));
  const missing = 'GPU-00000000-0000-0000-0000-000000000000';
  for (const id of [missing, '4', `${uuid(1)},${missing}`, '00000000:99:00.0']) {
    const result = await run(f, ['compute-policy', '-i', id, '--set-timeslice', '3']);
    assert.deepEqual(result, { status: 6, stdout: '', stderr: 'No devices were found\n' }, id);
  }
  assert.deepEqual(timeslices(f), [1, 0, 0, 0]);
  assert.deepEqual((await run(f, ['-i', missing, '-c', 'DEFAULT'])).status, 6);
  assert.deepEqual(
    logLines(f).map((l) => l.status),
    [0, 6, 6, 6, 6, 6],
  );
});

test('a bad value or a bad combination of options is refused with status 2 and changes nothing', async () => {
  const f = files();
  await run(f, setTimeslice(0, 2));
  for (const value of ['4', '-1', 'long', 'LONG', '', '1.0', '2x']) {
    const result = await run(f, setTimeslice(0, value));
    assert.deepEqual(
      result,
      {
        status: 2,
        stdout: '',
        stderr: `Invalid timeslice value "${value}". Valid values: 0=DEFAULT, 1=SHORT, 2=MEDIUM, 3=LONG\n`,
      },
      value,
    );
  }
  const combination = "Invalid combination of input arguments. Please run 'nvidia-smi compute-policy -h' for help.\n";
  for (const args of [
    ['compute-policy', '-l', '--set-timeslice', '1'],
    ['compute-policy', '-i', uuid(0)],
    ['compute-policy', '-i'],
    ['compute-policy', '--set-timeslice'],
    ['compute-policy', '--frobnicate'],
  ]) {
    assert.deepEqual(await run(f, args), { status: 2, stdout: '', stderr: combination }, args.join(' '));
  }
  const other = await run(f, ['-q']);
  assert.equal(other.status, 2);
  assert.match(other.stderr, /this fake models only `-i <id> -c <mode>` and `compute-policy`/);
  assert.deepEqual(timeslices(f), [2, 0, 0, 0]);
});

test('compute mode, as NVIDIA sets it before the time-slice: the real texts, kept per GPU', async () => {
  const f = files();
  assert.deepEqual(await run(f, ['-i', uuid(2), '-c', 'EXCLUSIVE_PROCESS']), {
    status: 0,
    stdout: `Set compute mode to EXCLUSIVE_PROCESS for GPU ${busId(2)}.\nAll done.\n`,
    stderr: '',
  });
  assert.equal(state(f).gpus[uuid(2)]?.computeMode, 'EXCLUSIVE_PROCESS');
  assert.deepEqual(await run(f, ['-i', uuid(2), '-c', 'DEFAULT']), {
    status: 0,
    stdout: `Set compute mode to DEFAULT for GPU ${busId(2)}.\nAll done.\n`,
    stderr: '',
  });
  assert.equal((await run(f, ['--id=1', '--compute-mode=3'])).status, 0);
  assert.deepEqual(
    GPUS.map((g) => state(f).gpus[g.uuid]?.computeMode),
    ['DEFAULT', 'EXCLUSIVE_PROCESS', 'DEFAULT', 'DEFAULT'],
  );
  const bad = await run(f, ['-i', uuid(0), '-c', 'EXCLUSIVE_THREAD']);
  assert.deepEqual(bad, {
    status: 2,
    stdout: '',
    stderr: 'Invalid compute mode "EXCLUSIVE_THREAD". Valid values: 0/DEFAULT, 2/PROHIBITED, 3/EXCLUSIVE_PROCESS\n',
  });
});

test("a GPU's configured compute mode is where it starts", async () => {
  const topology = path.join(tmpDir, 'exclusive.json');
  fs.writeFileSync(
    topology,
    JSON.stringify({ gpus: [{ uuid: uuid(0), name: 'NVIDIA A100-SXM4-80GB', busId: busId(0), computeMode: 3 }] }),
  );
  const f = files({ FAKE_NVML_CONFIG: topology });
  assert.equal((await run(f, setTimeslice(0, 1))).status, 0);
  assert.deepEqual(state(f), { gpus: { [uuid(0)]: { timeslice: 1, computeMode: 'EXCLUSIVE_PROCESS' } } });
});

test('no driver: the real message, status 9; no state file: a change is refused, reads see Default', async () => {
  const noDriver = files({ FAKE_NVML_CONFIG: path.join(tmpDir, 'absent.json') });
  assert.deepEqual(await run(noDriver, setTimeslice(0, 1)), {
    status: 9,
    stdout: '',
    stderr:
      "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver. " +
      'Make sure that the latest NVIDIA driver is installed and running.\n',
  });

  const noState = files({ FAKE_NVIDIA_SMI_STATE: '' });
  const refused = await run(noState, setTimeslice(0, 1));
  assert.equal(refused.status, 1);
  assert.match(refused.stderr, /^fake nvidia-smi: FAKE_NVIDIA_SMI_STATE is not set/);
  assert.equal((await run(noState, ['-i', '0', '-c', '0'])).status, 1);
  const list = await run(noState, ['compute-policy', '-l', '-i', '0']);
  assert.deepEqual(list, {
    status: 0,
    stdout: `GPU ${busId(0)}\n    Timeslice                             : Default\n`,
    stderr: '',
  });
  assert.equal(fs.existsSync(noState.state), false);
});

test('runs at the same time: one whole log line each; each GPU ends at the value of its last logged run', async () => {
  const f = files();
  const runs = [];
  for (let round = 0; round < 6; round++) {
    for (let i = 0; i < GPUS.length; i++) runs.push(run(f, setTimeslice(i, (i + round) % 4)));
  }
  const results = await Promise.all(runs);
  assert.ok(results.every((r) => r.status === 0));
  const lines = logLines(f);
  assert.equal(lines.length, runs.length, 'one whole line per run');
  // Each GPU ends with the value of the last run that set it, in the log's order.
  const last = new Map<string, number>();
  for (const line of lines) last.set(line.argv[2]!, Number(line.argv[4]));
  assert.deepEqual(
    timeslices(f),
    GPUS.map((g) => last.get(g.uuid)),
  );
});

test('FAKE_NVIDIA_SMI_HANG=1: the run logs itself with status null and waits until it is killed', async () => {
  const f = files({ FAKE_NVIDIA_SMI_HANG: '1' });
  const child = spawn(program, setTimeslice(0, 1), { env: f.env, stdio: 'ignore' });
  const closed = new Promise<NodeJS.Signals | null>((resolve) => child.on('close', (_code, signal) => resolve(signal)));
  const line = await waitFor(() => logLines(f)[0], { on: onFileChange(f.dir), what: 'the hanging run logged' });
  assert.deepEqual(line.argv, setTimeslice(0, 1));
  assert.equal(line.status, null);
  child.kill('SIGKILL');
  assert.equal(await closed, 'SIGKILL');
  assert.equal(fs.existsSync(f.state), false, 'nothing set');
});
