// The plugin's files converge on what they should hold, never on what it remembers writing: the atomic
// file compares with the file on disk before each write (one edited behind our back is written again),
// and the node labels file is written again after a failed write (a backoff, mocked timers here; a real
// read-only mount in a private mount namespace below) and put back when someone removes or edits it.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import { mkdirSync, mkdtempSync, readFileSync, readdirSync, rmSync, statSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join, resolve } from 'node:path';
import type { DaemonState } from '../../src/core/daemon-state.ts';
import { claimCdiSpec, requestDir } from '../../src/core/dra-sharing.ts';
import type { HostRequest } from '../../src/core/dra-sharing.ts';
import { labelsFile, nodeLabels } from '../../src/core/labels.ts';
import { NodeMetrics, renderMetrics } from '../../src/core/metrics.ts';
import type { MetricsSnapshot } from '../../src/core/metrics.ts';
import type { LabelInput } from '../../src/core/labels.ts';
import { NO_SHARING } from '../../src/core/sharing.ts';
import { CheckpointStore } from '../../src/dra/checkpoint.ts';
import { HostSharing } from '../../src/dra/sharing.ts';
import { LABELS_RECHECK_MS, LABELS_RETRY_FIRST_MS, LabelsOutput, MetricsOutput } from '../../src/observe/outputs.ts';
import { STATE_RETRY_FIRST_MS, StateFile } from '../../src/observe/state-file.ts';
import { AtomicFile } from '../../src/system/atomic-file.ts';
import { createLogger } from '../../src/system/log.ts';

const ROOT = resolve(import.meta.dirname, '..', '..');

function input(driverVersion: string): LabelInput {
  return {
    gpus: [
      {
        name: 'Tesla V100-SXM2-32GB',
        memoryBytes: 32768 * 1048576,
        compute: { major: 7, minor: 0 },
        migCapable: false,
        migEnabled: false,
      },
    ],
    driverVersion,
    cudaDriverVersion: 12040,
    machine: 'DGX-1',
    sharing: NO_SHARING,
    migStrategy: 'none',
    migDevices: [],
  };
}

function quietLog(lines: string[] = []): ReturnType<typeof createLogger> {
  return createLogger({ level: 'info', journal: false, write: (l: string) => void lines.push(l) });
}

test('atomic file: a file edited behind our back is written again, though we wrote that content before', async () => {
  const dir = mkdtempSync(join(tmpdir(), 'gdp-converge-'));
  try {
    const path = join(dir, 'labels');
    const f = new AtomicFile(path);
    assert.equal(await f.write('a=1\n'), true);
    writeFileSync(path, 'a=edited\n');
    assert.equal(await f.write('a=1\n'), true, 'the disk differs from what is wanted: written');
    assert.equal(readFileSync(path, 'utf8'), 'a=1\n');
    const ino = statSync(path).ino;
    assert.equal(await f.write('a=1\n'), false, 'the disk holds it: not written');
    assert.equal(statSync(path).ino, ino);
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
});

test('labels file: a failed write is tried again with backoff; a removed or edited file is put back', async (t) => {
  t.mock.timers.enable({ apis: ['setTimeout', 'setInterval'] });
  const dir = mkdtempSync(join(tmpdir(), 'gdp-converge-'));
  const out = new LabelsOutput(join(dir, 'features.d', 'gpu'), false, quietLog());
  try {
    const want = labelsFile(nodeLabels(input('550.54.15')));
    // The directory is not there: the write fails and nothing is on disk.
    await out.update(input('550.54.15'));
    assert.throws(() => readFileSync(out.path, 'utf8'), /ENOENT/);
    mkdirSync(join(dir, 'features.d'));
    t.mock.timers.tick(LABELS_RETRY_FIRST_MS);
    await out.settled();
    assert.equal(readFileSync(out.path, 'utf8'), want, 'written by the retry, with no new node state');
    // Edited, then removed, behind our back: put back at the next look.
    writeFileSync(out.path, 'nvidia.com/gpu.product=forged\n');
    t.mock.timers.tick(LABELS_RECHECK_MS);
    await out.settled();
    assert.equal(readFileSync(out.path, 'utf8'), want, 'an edited file is put back');
    rmSync(out.path);
    t.mock.timers.tick(LABELS_RECHECK_MS);
    await out.settled();
    assert.equal(readFileSync(out.path, 'utf8'), want, 'a removed file is put back');
  } finally {
    await out.stop();
    rmSync(dir, { recursive: true, force: true });
  }
});

test('labels file on a read-only mount (a private mount namespace): the update fails, and once the mount is ' +
  'writable again the retry writes the newest labels', {
  skip: process.getuid?.() !== 0 ? 'needs root for a mount namespace' : false,
}, () => {
  const dir = mkdtempSync(join(tmpdir(), 'gdp-converge-ro-'));
  try {
    const script = `
        import { execFileSync } from 'node:child_process';
        import { readFileSync, watch } from 'node:fs';
        import { LabelsOutput } from ${JSON.stringify(join(ROOT, 'src', 'observe', 'outputs.ts'))};
        import { createLogger } from ${JSON.stringify(join(ROOT, 'src', 'system', 'log.ts'))};
        const dir = process.env.DIR;
        const input = JSON.parse(process.env.INPUT);
        const lines = [];
        const out = new LabelsOutput(dir + '/gpu', false,
          createLogger({ level: 'info', journal: false, write: (l) => void lines.push(l) }));
        await out.update(input.first);
        const first = readFileSync(out.path, 'utf8');
        execFileSync('mount', ['--bind', dir, dir]);
        execFileSync('mount', ['-o', 'remount,ro,bind', dir]);
        await out.update(input.second);
        const during = readFileSync(out.path, 'utf8');
        execFileSync('mount', ['-o', 'remount,rw,bind', dir]);
        // Only the retry's timer writes now: wait for its first touch of the directory, then its end.
        await new Promise((r) => { const w = watch(dir, () => { w.close(); r(); }); });
        await out.settled();
        const after = readFileSync(out.path, 'utf8');
        await out.stop();
        process.stdout.write(JSON.stringify({ first, during, after, lines }));
      `;
    const child = spawnSync(
      'unshare',
      ['-m', '--propagation', 'private', process.execPath, '--input-type=module', '-e', script],
      {
        cwd: ROOT,
        env: {
          PATH: process.env.PATH ?? '/usr/bin:/bin',
          DIR: dir,
          INPUT: JSON.stringify({ first: input('550.54.15'), second: input('560.35.03') }),
        },
        encoding: 'utf8',
        timeout: 30_000,
      },
    );
    assert.equal(child.status, 0, `child failed: ${child.stderr}`);
    const r = JSON.parse(child.stdout) as { first: string; during: string; after: string; lines: string[] };
    assert.equal(r.first, labelsFile(nodeLabels(input('550.54.15'))));
    assert.equal(r.during, r.first, 'the read-only mount kept the old file');
    assert.equal(r.after, labelsFile(nodeLabels(input('560.35.03'))), 'the retry wrote the newest labels');
    assert.ok(
      r.lines.some((l) => /cannot write the node labels file/.test(l) && /read-only file system/i.test(l)),
      `the failure was logged with its cause: ${r.lines.join('\n')}`,
    );
    assert.ok(r.lines.some((l) => /node labels file written again/.test(l)));
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
});

test("sharing: at start, a prepared MPS claim's CDI spec, removed or edited, is written again", async () => {
  const dir = mkdtempSync(join(tmpdir(), 'gdp-converge-cdi-'));
  try {
    const uid = '0b6f4e0c-1f2a-4c1e-9a55-3c1f7e2d9a10';
    const request: HostRequest = {
      claim: { namespace: 'ml', name: 'train', uid },
      timeSlices: [],
      mps: {
        activeThreadPercentage: 100,
        exclusive: true,
        units: [{ uuid: 'GPU-0', gpuIndex: 0, pinnedMemLimitMiB: 1 }],
      },
    };
    const cdiDir = join(dir, 'cdi');
    const sharing = new HostSharing({ mpsRoot: join(dir, 'mps'), cdiDir, log: quietLog() });
    const spec = join(cdiDir, `gpu-device-plugin-claim-${uid}.json`);
    const want = `${JSON.stringify(claimCdiSpec(join(dir, 'mps'), uid).spec, null, 1)}\n`;
    // The CDI directory was emptied (a tmpfs /var/run/cdi wiped while the plugin was down).
    await sharing.reconcile(new Map([[uid, request]]));
    assert.equal(readFileSync(spec, 'utf8'), want, 'a missing spec is written again');
    writeFileSync(spec, '{"cdiVersion":"0.6.0","kind":"forged/claim","devices":[]}\n');
    await sharing.reconcile(new Map([[uid, request]]));
    assert.equal(readFileSync(spec, 'utf8'), want, 'an edited spec is written again');
    const ino = statSync(spec).ino;
    await sharing.reconcile(new Map([[uid, request]]));
    assert.equal(statSync(spec).ino, ino, 'a right spec is left alone');
    assert.equal(await sharing.ensureSpec({ claim: request.claim, timeSlices: [] }), null, 'time-slicing has no spec');
    // A directory that cannot be made: the problem names the directory and the cause.
    writeFileSync(join(dir, 'file'), '');
    const blocked = new HostSharing({ mpsRoot: join(dir, 'mps'), cdiDir: join(dir, 'file', 'cdi'), log: quietLog() });
    assert.match((await blocked.ensureSpec(request)) ?? '', /cannot write the CDI spec .* in .*file\/cdi: .*ENOTDIR/);
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
});

function daemonState(driverVersion: string): DaemonState {
  return {
    pid: process.pid,
    version: '0.0.0-test',
    startedAt: '2026-01-01T00:00:00.000Z',
    publishedAt: '2026-01-01T00:00:01.000Z',
    driverVersion,
    devices: [],
    resources: [],
    planProblem: null,
    options: {},
  };
}

test('state file: its directory removed is made again; a failed write is tried again, newest state', async (t) => {
  t.mock.timers.enable({ apis: ['setTimeout', 'setInterval'] });
  const dir = mkdtempSync(join(tmpdir(), 'gdp-converge-state-'));
  const file = new StateFile(join(dir, 'run', 'state.json'), quietLog());
  try {
    await file.publish(daemonState('550.54.15'));
    assert.match(readFileSync(file.path, 'utf8'), /550\.54\.15/);
    // The runtime directory removed behind our back: made again at the next publish.
    rmSync(join(dir, 'run'), { recursive: true });
    await file.publish(daemonState('550.54.16'));
    assert.match(readFileSync(file.path, 'utf8'), /550\.54\.16/, 'the directory was made again');
    // A file where the directory should be: the write fails; once that is fixed the retry writes the
    // newest state, with no new publish.
    rmSync(join(dir, 'run'), { recursive: true });
    writeFileSync(join(dir, 'run'), '');
    await file.publish(daemonState('560.35.03'));
    rmSync(join(dir, 'run'));
    t.mock.timers.tick(STATE_RETRY_FIRST_MS);
    await file.settled();
    assert.match(readFileSync(file.path, 'utf8'), /560\.35\.03/, 'the retry wrote the newest state');
  } finally {
    await file.remove();
    rmSync(dir, { recursive: true, force: true });
  }
});

test('checkpoint: a file edited behind our back is written again from the claims it holds, not skipped', async () => {
  const dir = mkdtempSync(join(tmpdir(), 'gdp-converge-ckpt-'));
  try {
    const path = join(dir, 'gpu-device-plugin-checkpoint.json');
    const store = await CheckpointStore.open(path, 'boot-1', quietLog());
    await store.put('u-1', { state: 'PrepareCompleted', namespace: 'ml', name: 'train', devices: [] });
    const want = readFileSync(path, 'utf8');
    writeFileSync(path, '{"edited": true}\n');
    await store.persist();
    assert.equal(readFileSync(path, 'utf8'), want, 'persist() compares with the disk');
    rmSync(path);
    await store.remove('u-absent');
    await store.persist();
    assert.equal(readFileSync(path, 'utf8'), want, 'a removed checkpoint is written again');
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
});

test('metrics file: each interval compares with the disk, so an edited or removed file is put back', async () => {
  const dir = mkdtempSync(join(tmpdir(), 'gdp-converge-prom-'));
  const snapshot: MetricsSnapshot = {
    version: '0.0.0-test',
    driverVersion: '550.54.15',
    node: 'node-a',
    gpus: [{ index: 0, uuid: 'GPU-a', healthy: true }],
    resources: [{ name: 'nvidia.com/gpu', devices: 1, healthy: 1 }],
    residentBytes: 1,
  };
  const metrics = new NodeMetrics(() => 1_700_000_000);
  const out = new MetricsOutput({
    path: join(dir, 'gpu.prom'),
    intervalMs: 60_000,
    metrics,
    snapshot: () => snapshot,
    log: quietLog(),
  });
  try {
    await out.write();
    const want = readFileSync(join(dir, 'gpu.prom'), 'utf8');
    assert.equal(want, renderMetrics(metrics, snapshot));
    writeFileSync(join(dir, 'gpu.prom'), '# edited\n');
    await out.write();
    assert.equal(readFileSync(join(dir, 'gpu.prom'), 'utf8'), want, 'an edited file is put back');
    rmSync(join(dir, 'gpu.prom'));
    await out.write();
    assert.equal(readFileSync(join(dir, 'gpu.prom'), 'utf8'), want, 'a removed file is put back');
  } finally {
    out.stop();
    rmSync(dir, { recursive: true, force: true });
  }
});

test('sharing: a request that cannot be put in place is refused by name and leaves no temporary file', async () => {
  const dir = mkdtempSync(join(tmpdir(), 'gdp-converge-req-'));
  try {
    const uid = '0b6f4e0c-1f2a-4c1e-9a55-3c1f7e2d9a11';
    const mpsRoot = join(dir, 'mps');
    const sharing = new HostSharing({ mpsRoot, cdiDir: join(dir, 'cdi'), log: quietLog(), answerTimeoutMs: 1 });
    // Where the request goes, a directory that is not empty: the rename over it fails.
    mkdirSync(join(requestDir(mpsRoot), `${uid}.json`), { recursive: true });
    writeFileSync(join(requestDir(mpsRoot), `${uid}.json`, 'x'), '');
    const r = await sharing.prepare({ claim: { namespace: 'ml', name: 'train', uid }, timeSlices: [] });
    assert.ok('error' in r);
    assert.match(
      r.error,
      /cannot write its time-slicing request for gpu-device-plugin-mps\.service: .*(EISDIR|ENOTEMPTY)/,
    );
    assert.deepEqual(readdirSync(requestDir(mpsRoot)), [`${uid}.json`], 'no temporary file left behind');
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
});
