// MIG instances live on the GPU, not in the process that made them: with FAKE_NVML_MIG_STATE the fake NVML keeps
// its layouts in a file, so what one process creates (or leaves half-made when killed) is what the next process's
// NVML shows, as on a real node. Driven through the real bindings (src/nvml/mig-instances.ts) and the agent's
// partitions (src/mps/mig-partitions.ts): a killed agent's GPU instance, or its GPU instance with a compute
// instance, is found by the next agent at its parent, profile and placement and finished, never made twice.
import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { after, afterEach, before, test } from 'node:test';
import { MigPartitions } from '../../src/mps/mig-partitions.ts';
import { NvmlMigInstances } from '../../src/nvml/mig-instances.ts';
import { Nvml } from '../../src/nvml/nvml.ts';
import { createLogger } from '../../src/system/log.ts';
import { loadKoffi } from '../../src/system/native.ts';
import { buildFakeNvml, LIBRARY_NAME } from '../fake-nvml/build.ts';
import { writeMigMinors } from '../support/mig.ts';

const A100 = 'GPU-c3000000-0000-4000-8000-000000000000';
const H100 = 'GPU-c3000000-0000-4000-8001-000000000001';
const quiet = createLogger({ level: 'error', journal: false, write: () => undefined });
const SRC = join(import.meta.dirname, '..', '..', 'src');

let dir: string;
let library: string;
let stateFile: string;

before(async () => {
  library = join((await buildFakeNvml()).current, LIBRARY_NAME);
  dir = mkdtempSync(join(tmpdir(), 'gdp-mig-state-'));
  const config = join(dir, 'node.json');
  writeFileSync(
    config,
    JSON.stringify({
      gpus: [
        { uuid: A100, name: 'NVIDIA A100-SXM4-40GB', busId: '00000000:07:00.0', minor: 0, mig: { current: true } },
        {
          uuid: H100,
          name: 'NVIDIA H100 80GB HBM3',
          busId: '00000000:0F:00.0',
          minor: 1,
          mig: { current: true, instances: ['1g.10gb'] },
        },
      ],
    }),
  );
  writeMigMinors(join(dir, 'proc'), 2);
  process.env.FAKE_NVML_CONFIG = config;
});
afterEach(() => {
  delete process.env.FAKE_NVML_MIG_STATE;
});
after(() => rmSync(dir, { recursive: true, force: true }));

/** A fresh state file for one test, seen by this process's NVML and by the children it starts. */
function freshState(): string {
  stateFile = join(mkdtempSync(join(dir, 'state-')), 'mig-state');
  process.env.FAKE_NVML_MIG_STATE = stateFile;
  return stateFile;
}

function open(): Nvml {
  return Nvml.open({ koffi: loadKoffi(), driverRoot: '/', log: quiet, library });
}

/** Runs `body` (module code with nvml, port and log in scope) in a child process; its exit status and output. */
function child(body: string, env: Readonly<Record<string, string>> = {}): { status: number | null; out: string } {
  const script = `
    import { NvmlMigInstances } from ${JSON.stringify(join(SRC, 'nvml/mig-instances.ts'))};
    import { Nvml } from ${JSON.stringify(join(SRC, 'nvml/nvml.ts'))};
    import { MigPartitions } from ${JSON.stringify(join(SRC, 'mps/mig-partitions.ts'))};
    import { createLogger } from ${JSON.stringify(join(SRC, 'system/log.ts'))};
    import { loadKoffi } from ${JSON.stringify(join(SRC, 'system/native.ts'))};
    const log = createLogger({ level: 'error', journal: false, write: () => undefined });
    const nvml = Nvml.open({ koffi: loadKoffi(), driverRoot: '/', log, library: ${JSON.stringify(library)} });
    const port = new NvmlMigInstances(nvml, ${JSON.stringify(join(dir, 'proc'))});
    ${body}
  `;
  const r = spawnSync(process.execPath, ['--input-type=module', '-e', script], {
    env: { ...process.env, ...env },
    encoding: 'utf8',
  });
  return { status: r.status, out: `${r.stdout}${r.stderr}` };
}

test('an instance made by one process is on the GPU for the next, beside the fixture’s, until destroyed', async () => {
  freshState();
  const made = child(`
    const gi = await port.createGpuInstance(${JSON.stringify(H100)}, 9, 4, 4);
    const ci = await port.createComputeInstance(${JSON.stringify(H100)}, gi);
    console.log(JSON.stringify({ gi, ci, dev: await port.migDevice(${JSON.stringify(H100)}, gi, ci) }));
    nvml.close();
  `);
  assert.equal(made.status, 0, made.out);
  const first = JSON.parse(made.out) as { gi: number; ci: number; dev: { uuid: string } };
  assert.equal(
    readFileSync(stateFile, 'utf8'),
    [`gpu ${A100} 1 1`, `gpu ${H100} 1 1`, 'gi 0 1 19 0 0', 'gi 1 2 9 4 0', 'ci 0 0 0 1', 'ci 1 1 0 3', ''].join('\n'),
    'both GPUs; on the H100 the fixture’s 1g.10gb and the new 3g.40gb at 4 with its 3-slice compute instance',
  );
  const nvml = open();
  try {
    const port = new NvmlMigInstances(nvml, join(dir, 'proc'));
    assert.deepEqual(await port.gpuInstances(H100), [
      { gi: 1, profileId: 19, start: 0, size: 1, cis: [0] },
      { gi: first.gi, profileId: 9, start: 4, size: 4, cis: [first.ci] },
    ]);
    assert.equal((await port.migDevice(H100, first.gi, first.ci)).uuid, first.dev.uuid, 'same MIG UUID');
    assert.deepEqual(await port.gpuInstances(A100), []);
    await port.destroyComputeInstance(H100, first.gi, first.ci);
    await port.destroyGpuInstance(H100, first.gi);
  } finally {
    nvml.close();
  }
  const after = child(`console.log(JSON.stringify(await port.gpuInstances(${JSON.stringify(H100)})));`);
  assert.equal(after.status, 0, after.out);
  assert.deepEqual(JSON.parse(after.out), [{ gi: 1, profileId: 19, start: 0, size: 1, cis: [0] }]);
});

test('an open session sees another process’s change at its next call; a busy GPU instance is IN_USE', async () => {
  freshState();
  const nvml = open();
  try {
    const port = new NvmlMigInstances(nvml, join(dir, 'proc'));
    assert.equal((await port.gpuInstances(A100)).length, 0);
    const made = child(`
      const gi = await port.createGpuInstance(${JSON.stringify(A100)}, 9, 0, 4);
      console.log(JSON.stringify({ gi, ci: await port.createComputeInstance(${JSON.stringify(A100)}, gi) }));
      nvml.close();
    `);
    assert.equal(made.status, 0, made.out);
    const { gi, ci } = JSON.parse(made.out) as { gi: number; ci: number };
    assert.deepEqual(await port.gpuInstances(A100), [{ gi, profileId: 9, start: 0, size: 4, cis: [ci] }], 'seen');
    // A process runs on it (what `mig <index> busy <gi> 1` keeps in the file): its compute instance stays.
    const busy = (on: 0 | 1): void =>
      writeFileSync(stateFile, readFileSync(stateFile, 'utf8').replace(/^(gi \d+ \d+ 9 0) [01]$/m, `$1 ${on}`));
    busy(1);
    await assert.rejects(port.destroyComputeInstance(A100, gi, ci), /In use by another client \(NVML code 19\)/);
    busy(0);
    await port.destroyComputeInstance(A100, gi, ci);
    await port.destroyGpuInstance(A100, gi);
  } finally {
    nvml.close();
  }
});

/** An agent in a child process asked for claim-k's partition, killed right after `step` succeeded. */
function killedAgent(state: string, step: string): void {
  const k = child(
    `const parts = new MigPartitions({ port, stateDir: ${JSON.stringify(state)}, log });
     await parts.load();
     await parts.ensure('claim-k', [{ device: 'gpu-0-mig-3g20gb-9-4', parentUuid: ${JSON.stringify(A100)},
       giProfileId: 9, start: 4, size: 4 }]);
     console.log('not killed');`,
    { FAKE_NVML_CRASH_AFTER: step },
  );
  assert.equal(k.status, 137, `killed where it was told: ${k.out}`);
}

for (const [step, left] of [
  ['create-gpu-instance', []],
  ['create-compute-instance', [0]],
] as const) {
  test(`killed after ${step}: the next agent finds what it left at that placement and finishes it`, async () => {
    freshState();
    const state = mkdtempSync(join(dir, 'agent-'));
    killedAgent(state, step);
    const nvml = open();
    try {
      const port = new NvmlMigInstances(nvml, join(dir, 'proc'));
      assert.deepEqual(await port.gpuInstances(A100), [{ gi: 1, profileId: 9, start: 4, size: 4, cis: left }]);
      const parts = new MigPartitions({ port, stateDir: state, log: quiet });
      await parts.load();
      const [made] = await parts.ensure('claim-k', [
        { device: 'gpu-0-mig-3g20gb-9-4', parentUuid: A100, giProfileId: 9, start: 4, size: 4 },
      ]);
      assert.deepEqual([made?.gi, made?.ci], [1, 0], 'the killed agent’s instance, not a second one');
      assert.deepEqual(await port.gpuInstances(A100), [{ gi: 1, profileId: 9, start: 4, size: 4, cis: [0] }]);
      await parts.release('claim-k');
      assert.deepEqual(await port.gpuInstances(A100), []);
    } finally {
      nvml.close();
    }
  });
}

test('without a state file an instance made through NVML still outlives nvmlShutdown/nvmlInit in-process', async () => {
  let nvml = open();
  try {
    const gi = await new NvmlMigInstances(nvml, join(dir, 'proc')).createGpuInstance(A100, 19, 6, 1);
    nvml.close();
    nvml = open();
    const port = new NvmlMigInstances(nvml, join(dir, 'proc'));
    assert.deepEqual(await port.gpuInstances(A100), [{ gi, profileId: 19, start: 6, size: 1, cis: [] }]);
    await port.destroyGpuInstance(A100, gi);
    nvml.close();
    nvml = open();
    assert.deepEqual(await new NvmlMigInstances(nvml, join(dir, 'proc')).gpuInstances(A100), [], 'and so does its end');
  } finally {
    nvml.close();
  }
});
