// Dynamic MIG's NVML calls (src/nvml/mig-instances.ts) through the real bindings on the fake NVML's real ABI, on
// an A100-40GB and an H100-80GB in MIG mode: placements in memory slices, an overlap refused as NVML refuses it,
// a GPU instance with a compute instance in use, the MIG device's UUID and capability minors read back, and the
// agent's partitions (mps/mig-partitions.ts) made and destroyed through them; a kill right after the GPU instance
// is made, in a child process, is finished by the next agent.
import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { after, before, test } from 'node:test';
import { NvmlError } from '../../src/nvml/errors.ts';
import { NvmlMigInstances } from '../../src/nvml/mig-instances.ts';
import { Nvml } from '../../src/nvml/nvml.ts';
import { MigPartitions } from '../../src/mps/mig-partitions.ts';
import { createLogger } from '../../src/system/log.ts';
import { loadKoffi } from '../../src/system/native.ts';
import { buildFakeNvml, LIBRARY_NAME } from '../fake-nvml/build.ts';
import { writeMigMinors } from '../support/mig.ts';

const A100 = 'GPU-a1000000-0000-4000-8000-000000000000';
const H100 = 'GPU-a1000000-0000-4000-8001-000000000001';
const quiet = createLogger({ level: 'error', journal: false, write: () => undefined });

let dir: string;
let library: string;

before(async () => {
  library = join((await buildFakeNvml()).current, LIBRARY_NAME);
  dir = mkdtempSync(join(tmpdir(), 'gdp-mig-instances-'));
  const config = join(dir, 'node.json');
  writeFileSync(
    config,
    JSON.stringify({
      gpus: [
        { uuid: A100, name: 'NVIDIA A100-SXM4-40GB', busId: '00000000:07:00.0', minor: 0, mig: { current: true } },
        { uuid: H100, name: 'NVIDIA H100 80GB HBM3', busId: '00000000:0F:00.0', minor: 1, mig: { current: true } },
      ],
    }),
  );
  writeMigMinors(join(dir, 'proc'), 2);
  process.env.FAKE_NVML_CONFIG = config;
});
after(() => rmSync(dir, { recursive: true, force: true }));

function open(): Nvml {
  return Nvml.open({ koffi: loadKoffi(), driverRoot: '/', log: quiet, library });
}

test('a 3g instance at slices 4-7 and its compute instance: made, read back with UUID and minors, gone', async () => {
  const nvml = open();
  try {
    const mig = new NvmlMigInstances(nvml, join(dir, 'proc'));
    assert.deepEqual(await mig.gpuInstances(A100), []);
    const gi = await mig.createGpuInstance(A100, 9, 4, 4);
    assert.equal(gi, 1);
    assert.deepEqual(await mig.gpuInstances(A100), [{ gi: 1, profileId: 9, start: 4, size: 4, cis: [] }]);
    const ci = await mig.createComputeInstance(A100, gi);
    assert.equal(ci, 0);
    const dev = await mig.migDevice(A100, gi, ci);
    assert.match(dev.uuid, /^MIG-a1000000-0000-4000-8000-0000000[0-9a-f]{5}$/);
    assert.deepEqual([dev.giCapMinor, dev.ciCapMinor], [3 + 9, 3 + 9 + 1], 'gpu0/gi1/access and gpu0/gi1/ci0/access');
    await assert.rejects(mig.destroyGpuInstance(A100, gi), (e: unknown) => {
      assert.ok(e instanceof NvmlError);
      assert.match(
        e.message,
        /^nvmlGpuInstanceDestroy failed for GPU-a\S+: In use by another client \(NVML code 19\)$/,
      );
      return true;
    });
    await mig.destroyComputeInstance(A100, gi, ci);
    await mig.destroyGpuInstance(A100, gi);
    assert.deepEqual(await mig.gpuInstances(A100), []);
  } finally {
    nvml.close();
  }
});

test('placements are NVML’s: an overlap or a start the profile lacks is refused; a free one is not', async () => {
  const nvml = open();
  try {
    const mig = new NvmlMigInstances(nvml, join(dir, 'proc'));
    const gi = await mig.createGpuInstance(H100, 14, 2, 2); // 2g.20gb at slices 2-3
    await assert.rejects(mig.createGpuInstance(H100, 9, 0, 4), /Insufficient resources \(NVML code 23\)/);
    await assert.rejects(mig.createGpuInstance(H100, 14, 1, 2), /Invalid Argument \(NVML code 2\)/);
    const other = await mig.createGpuInstance(H100, 9, 4, 4); // 3g.40gb at slices 4-7
    assert.deepEqual(
      (await mig.gpuInstances(H100)).map((g) => [g.gi, g.profileId, g.start, g.size]),
      [
        [gi, 14, 2, 2],
        [other, 9, 4, 4],
      ],
    );
    for (const g of [gi, other]) await mig.destroyGpuInstance(H100, g);
  } finally {
    nvml.close();
  }
});

test('the agent’s partitions through the real calls: made once, found again, destroyed at release', async () => {
  const nvml = open();
  try {
    const port = new NvmlMigInstances(nvml, join(dir, 'proc'));
    const state = mkdtempSync(join(dir, 'state-'));
    const parts = new MigPartitions({ port, stateDir: state, log: quiet });
    await parts.load();
    const p = { device: 'gpu-0-mig-1g5gb-19-3', parentUuid: A100, giProfileId: 19, start: 3, size: 1 };
    const [made] = await parts.ensure('claim-x', [p]);
    assert.equal(made?.start, 3);
    assert.deepEqual(await parts.ensure('claim-x', [p]), [made], 'asked again: the same instance');
    await parts.release('claim-x');
    assert.deepEqual(await port.gpuInstances(A100), []);
  } finally {
    nvml.close();
  }
});

test('killed right after the GPU instance was made (FAKE_NVML_CRASH_AFTER): the next agent finishes it', async () => {
  const state = mkdtempSync(join(dir, 'crash-'));
  const script = `
    import { NvmlMigInstances } from ${JSON.stringify(join(import.meta.dirname, '../../src/nvml/mig-instances.ts'))};
    import { Nvml } from ${JSON.stringify(join(import.meta.dirname, '../../src/nvml/nvml.ts'))};
    import { MigPartitions } from ${JSON.stringify(join(import.meta.dirname, '../../src/mps/mig-partitions.ts'))};
    import { createLogger } from ${JSON.stringify(join(import.meta.dirname, '../../src/system/log.ts'))};
    import { loadKoffi } from ${JSON.stringify(join(import.meta.dirname, '../../src/system/native.ts'))};
    const log = createLogger({ level: 'error', journal: false, write: () => undefined });
    const nvml = Nvml.open({ koffi: loadKoffi(), driverRoot: '/', log, library: ${JSON.stringify(library)} });
    const port = new NvmlMigInstances(nvml, ${JSON.stringify(join(dir, 'proc'))});
    const parts = new MigPartitions({ port, stateDir: ${JSON.stringify(state)}, log });
    await parts.load();
    const p = { device: 'gpu-1-mig-7g80gb-0-0', giProfileId: 0, start: 0, size: 8 };
    await parts.ensure('claim-k', [{ ...p, parentUuid: ${JSON.stringify(H100)} }]);
    console.log('not killed');
  `;
  const child = spawnSync(process.execPath, ['--input-type=module', '-e', script], {
    env: { ...process.env, FAKE_NVML_CRASH_AFTER: 'create-gpu-instance' },
    encoding: 'utf8',
  });
  assert.equal(child.status, 137, `killed where it was told: ${child.stdout}${child.stderr}`);
  // What the kill left: the intent, written before the GPU instance was made, and no id (never recorded).
  const record = JSON.parse(readFileSync(join(state, 'mig-instances.json'), 'utf8')) as {
    entries: { claimUid: string; gi: number | null }[];
  };
  assert.deepEqual(
    record.entries.map((e) => [e.claimUid, e.gi]),
    [['claim-k', null]],
  );
  // The fake's instances live in its process, so the next agent's GPU is bare again: it finishes the claim from
  // the intent without taking anything of anyone else's.
  const nvml = open();
  try {
    const port = new NvmlMigInstances(nvml, join(dir, 'proc'));
    const parts = new MigPartitions({ port, stateDir: state, log: quiet });
    await parts.load();
    assert.deepEqual(parts.claims(), ['claim-k']);
    const [made] = await parts.ensure('claim-k', [
      { device: 'gpu-1-mig-7g80gb-0-0', parentUuid: H100, giProfileId: 0, start: 0, size: 8 },
    ]);
    assert.equal(made?.size, 8);
    await parts.release('claim-k');
    assert.deepEqual(await port.gpuInstances(H100), []);
  } finally {
    nvml.close();
  }
});
