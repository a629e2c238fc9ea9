// The time-slice adapter (src/mps/timeslice.ts) against the fake nvidia-smi
// (test/fake-nvml/nvidia-smi/fake_nvidia_smi.c) on a fake NVML topology's GPUs.
import { after, before, test } from 'node:test';
import assert from 'node:assert/strict';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { changesToApply, type TimeSliceInterval, wantedTimeSlices } from '../../src/core/dra-timeslice.ts';
import {
  applyTimeSlice,
  applyTimeSliceChanges,
  TimeSliceError,
  type TimeSliceOptions,
} from '../../src/mps/timeslice.ts';
import { createLogger } from '../../src/system/log.ts';
import { buildFakeNvidiaSmi, NVIDIA_SMI_NAME } from '../fake-nvml/build.ts';
import { onProcessExit } from '../support/process-exit.ts';
import { onFileChange, waitFor, waitUntil } from '../support/wait.ts';

const TOPOLOGY = path.join(import.meta.dirname, '..', 'fixtures', 'topologies', 'bridged-pair-4.json');
const GPUS = (JSON.parse(fs.readFileSync(TOPOLOGY, 'utf8')) as { gpus: { uuid: string }[] }).gpus.map((g) => g.uuid);
const MISSING = 'GPU-00000000-0000-0000-0000-000000000000';

let program = '';
let tmpDir = '';
let counter = 0;

before(async () => {
  program = path.join(await buildFakeNvidiaSmi(), NVIDIA_SMI_NAME);
  tmpDir = fs.mkdtempSync(path.join(os.tmpdir(), 'timeslice-test-'));
});

after(() => {
  if (tmpDir) fs.rmSync(tmpDir, { recursive: true, force: true });
});

type Setup = { dir: string; state: string; log: string; lines: string[]; opts: TimeSliceOptions };

function setup(extra: NodeJS.ProcessEnv = {}, timeoutMs?: number): Setup {
  const dir = path.join(tmpDir, `t${++counter}`);
  fs.mkdirSync(dir);
  const state = path.join(dir, 'state.json');
  const log = path.join(dir, 'calls.log');
  const lines: string[] = [];
  const env = {
    PATH: process.env.PATH,
    FAKE_NVML_CONFIG: TOPOLOGY,
    FAKE_NVIDIA_SMI_STATE: state,
    FAKE_NVIDIA_SMI_LOG: log,
    ...extra,
  };
  const logger = createLogger({ level: 'debug', journal: false, write: (line) => lines.push(line) });
  return {
    dir,
    state,
    log,
    lines,
    opts: { nvidiaSmi: program, log: logger, env, ...(timeoutMs ? { timeoutMs } : {}) },
  };
}

type Call = { pid: number; argv: string[]; status: number | null };
const calls = (s: Setup): Call[] =>
  fs.existsSync(s.log)
    ? fs
        .readFileSync(s.log, 'utf8')
        .split('\n')
        .filter((l) => l.length > 0)
        .map((l) => JSON.parse(l) as Call)
    : [];
const timeslice = (s: Setup, uuid: string): number | undefined =>
  (JSON.parse(fs.readFileSync(s.state, 'utf8')) as { gpus: Record<string, { timeslice: number }> }).gpus[uuid]
    ?.timeslice;

test("applyTimeSlice runs NVIDIA's command line for the GPU and logs what it set", async () => {
  const s = setup();
  await applyTimeSlice({ uuid: GPUS[2]! }, 'Long', s.opts);
  assert.deepEqual(
    calls(s).map((c) => [c.argv, c.status]),
    [[['compute-policy', '-i', GPUS[2], '--set-timeslice', '3'], 0]],
  );
  assert.equal(timeslice(s, GPUS[2]!), 3);
  assert.equal(timeslice(s, GPUS[0]!), 0);
  assert.equal(s.lines.length, 1);
  assert.match(s.lines[0]!, /time-slice set/);
  assert.match(s.lines[0]!, new RegExp(`gpu=${GPUS[2]}`));
  assert.match(s.lines[0]!, /interval=Long/);
});

test("a failure carries the GPU, the command and the program's own words", async () => {
  const s = setup();
  const error = await applyTimeSlice({ uuid: MISSING }, 'Short', s.opts).then(
    () => assert.fail('an unknown GPU must fail'),
    (e: unknown) => e,
  );
  assert.ok(error instanceof TimeSliceError);
  assert.equal(error.gpuUuid, MISSING);
  assert.equal(error.interval, 'Short');
  assert.equal(error.status, 6);
  assert.deepEqual(error.command, [program, 'compute-policy', '-i', MISSING, '--set-timeslice', '1']);
  assert.equal(error.output, 'No devices were found');
  assert.equal(
    error.message,
    `setting time-slice Short on GPU ${MISSING} failed: \`${program} compute-policy -i ${MISSING} ` +
      '--set-timeslice 1` exited with status 6: No devices were found',
  );
  assert.deepEqual(s.lines, [], 'nothing logged as set');

  const noDriver = setup({ FAKE_NVML_CONFIG: path.join(tmpDir, 'absent.json') });
  const driverError = await applyTimeSlice({ uuid: GPUS[0]! }, 'Medium', noDriver.opts).catch((e: unknown) => e);
  assert.ok(driverError instanceof TimeSliceError);
  assert.equal(driverError.status, 9);
  assert.match(driverError.message, /couldn't communicate with the NVIDIA driver/);
});

test('a program that cannot run fails with the reason and no status', async () => {
  const s = setup();
  const missing = path.join(tmpDir, 'no-such-nvidia-smi');
  const error = await applyTimeSlice({ uuid: GPUS[0]! }, 'Long', { ...s.opts, nvidiaSmi: missing }).catch(
    (e: unknown) => e,
  );
  assert.ok(error instanceof TimeSliceError);
  assert.equal(error.status, null);
  assert.match(error.message, /could not run: spawn .*no-such-nvidia-smi ENOENT/);
});

test('a hanging nvidia-smi: the event loop runs on, and the timeout kills it and fails', async () => {
  const s = setup({ FAKE_NVIDIA_SMI_HANG: '1' }, 300);
  let settled = false;
  const pending = applyTimeSlice({ uuid: GPUS[1]! }, 'Medium', s.opts).then(
    () => assert.fail('a hanging run must fail'),
    (e: unknown) => {
      settled = true;
      return e;
    },
  );
  const call = await waitFor(() => calls(s)[0], { on: onFileChange(s.dir), what: 'the hanging run logged' });
  await new Promise((resolve) => setImmediate(resolve));
  assert.equal(settled, false, 'the run is still going while the loop turns');
  const error = await pending;
  assert.ok(error instanceof TimeSliceError);
  assert.equal(error.status, null);
  assert.match(error.message, /did not finish within 300 ms and was killed$/);
  // Ended: gone, or a zombie until Node reaps it (the exit trigger fires as it ends, before the reaping).
  await waitUntil(
    () => {
      try {
        return fs.readFileSync(`/proc/${call.pid}/stat`, 'utf8').split(') ')[1]?.startsWith('Z') === true;
      } catch {
        return true;
      }
    },
    { on: onProcessExit(call.pid), what: 'the hanging nvidia-smi has ended' },
  );
});

test("claims prepared then unprepared: the plan's changes applied in order, the GPU back at Default", async () => {
  const s = setup();
  const claim = (uid: string, gpuUuid: string, interval: TimeSliceInterval) => ({
    claimUid: uid,
    namespace: 'ns',
    name: uid,
    gpuUuid,
    interval,
  });
  const prepared = [claim('a', GPUS[0]!, 'Short'), claim('b', GPUS[3]!, 'Long')];
  const applied = wantedTimeSlices(prepared, GPUS);
  await applyTimeSliceChanges(changesToApply(new Map(), applied), s.opts);
  assert.deepEqual(
    GPUS.map((g) => timeslice(s, g)),
    [1, 0, 0, 3],
  );
  await applyTimeSliceChanges(changesToApply(applied, wantedTimeSlices(prepared.slice(1), GPUS)), s.opts);
  assert.deepEqual(
    GPUS.map((g) => timeslice(s, g)),
    [0, 0, 0, 3],
  );
  assert.deepEqual(
    calls(s).map((c) => c.argv[2]),
    [GPUS[0], GPUS[3], GPUS[0]],
    "set in UUID order, then the unprepared claim's GPU back to Default",
  );
});

test('applyTimeSliceChanges stops at the first failure', async () => {
  const s = setup();
  const error = await applyTimeSliceChanges(
    changesToApply(
      new Map(),
      new Map<string, TimeSliceInterval>([
        [GPUS[0]!, 'Long'],
        [MISSING, 'Long'],
        ['GPU-ffffffff-ffff-ffff-ffff-ffffffffffff', 'Long'],
      ]),
    ),
    s.opts,
  ).catch((e: unknown) => e);
  assert.ok(error instanceof TimeSliceError);
  assert.equal(error.gpuUuid, MISSING);
  assert.deepEqual(
    calls(s).map((c) => c.status),
    [6],
    'the changes run in UUID order: GPU-0000… first, and nothing after it',
  );
});
