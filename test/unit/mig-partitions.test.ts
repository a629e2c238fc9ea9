// Dynamic MIG's privileged side (mps/mig-partitions.ts with core/mig-instances.ts) against an in-process GPU that
// keeps NVML's rules — an overlapping placement is INSUFFICIENT_RESOURCES, a GPU instance with a compute instance
// is IN_USE — and can die right after any change it makes, before the record says so: every crash point is
// finished or undone by the next agent, and an instance someone else made is never touched.
import assert from 'node:assert/strict';
import { mkdtempSync, readFileSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { test } from 'node:test';
import { nextStep } from '../../src/core/mig-instances.ts';
import type { GpuInstanceNow, PartitionRequest } from '../../src/core/mig-instances.ts';
import { MigPartitions } from '../../src/mps/mig-partitions.ts';
import { createLogger } from '../../src/system/log.ts';
import { Crash, FakeGpu } from '../support/fake-mig-port.ts';

const PARENT = 'GPU-aaaaaaaa-aaaa-aaaa-aaaa-aaaaaaaaaaaa';

const quiet = createLogger({ level: 'error', journal: false, write: () => undefined });
const P1: PartitionRequest = { device: 'gpu-0-mig-1g5gb-19-2', parentUuid: PARENT, giProfileId: 19, start: 2, size: 1 };
const P3: PartitionRequest = { device: 'gpu-0-mig-3g20gb-9-4', parentUuid: PARENT, giProfileId: 9, start: 4, size: 4 };

async function agentOn(gpu: FakeGpu, stateDir: string): Promise<MigPartitions> {
  gpu.stateDir = stateDir;
  const m = new MigPartitions({ port: gpu, stateDir, log: quiet });
  await m.load();
  return m;
}

test('a claim gets its partitions made, GPU instance then compute instance; destroyed in the other order', async () => {
  const gpu = new FakeGpu();
  const m = await agentOn(gpu, mkdtempSync(join(tmpdir(), 'gdp-mig-')));
  const made = await m.ensure('claim-a', [P1, P3]);
  assert.deepEqual(
    made.map((x) => [x.device, x.gi, x.ci, x.uuid, x.giCapMinor]),
    [
      [P1.device, 1, 0, 'MIG-1-0', 101],
      [P3.device, 2, 0, 'MIG-2-0', 102],
    ],
  );
  assert.deepEqual(await m.ensure('claim-a', [P1, P3]), made, 'asked again: the same, nothing made');
  assert.equal(gpu.calls.filter((c) => c.startsWith('create')).length, 4);
  await m.release('claim-a');
  assert.deepEqual(gpu.gis, []);
  assert.deepEqual(gpu.calls.slice(-4), ['destroy-ci 1/0', 'destroy-gi 1', 'destroy-ci 2/0', 'destroy-gi 2']);
  assert.deepEqual(m.claims(), []);
});

test('an occupied placement is a clear error for that claim, and someone else’s instance is left alone', async () => {
  const gpu = new FakeGpu();
  gpu.gis.push({ gi: 7, profileId: 19, start: 2, size: 1, cis: [0] });
  const dir = mkdtempSync(join(tmpdir(), 'gdp-mig-'));
  const m = await agentOn(gpu, dir);
  await assert.rejects(
    m.ensure('claim-b', [P1]),
    /MIG partition gpu-0-mig-1g5gb-19-2 \(profile 19 at 2\+1\): .*code 23 Insufficient Resources/,
  );
  assert.deepEqual(m.claims(), [], 'no intent left behind');
  await m.release('claim-b');
  assert.deepEqual(gpu.gis, [{ gi: 7, profileId: 19, start: 2, size: 1, cis: [0] }], 'the foreign instance kept');
  assert.ok(!gpu.calls.some((c) => c.startsWith('destroy')), 'nothing destroyed');
});

for (const point of ['create-gi', 'create-ci'] as const) {
  test(`killed right after ${point}: the next agent finishes it, or undoes it once the claim is gone`, async () => {
    for (const stillWanted of [true, false]) {
      const gpu = new FakeGpu();
      gpu.gis.push({ gi: 9, profileId: 19, start: 0, size: 1, cis: [0] });
      const dir = mkdtempSync(join(tmpdir(), 'gdp-mig-'));
      gpu.crashAfter = point;
      await assert.rejects((await agentOn(gpu, dir)).ensure('claim-c', [P3]), /killed after/);
      // The process died there: whatever its error handling wrote afterwards never happened.
      writeFileSync(join(dir, 'mig-instances.json'), gpu.recordAtCrash ?? '');
      const next = await agentOn(gpu, dir);
      assert.deepEqual(next.claims(), ['claim-c'], 'the record names the half-made claim');
      if (stillWanted) {
        const [made] = await next.ensure('claim-c', [P3]);
        assert.equal(made?.gi, 1, 'the instance made before the kill, finished');
        assert.deepEqual(gpu.gis.find((g) => g.gi === 1)?.cis, [0], 'one compute instance, not two');
        assert.equal(gpu.calls.filter((c) => c.startsWith('create-gi')).length, 1, 'the GPU instance made once');
      } else {
        await next.release('claim-c');
        assert.deepEqual(
          gpu.gis.map((g) => g.gi),
          [9],
          'the half-made instance destroyed, the foreign one kept',
        );
        assert.deepEqual(next.claims(), []);
      }
    }
  });
}

test('a destroy refused as in use keeps the entry, and the next release finishes it', async () => {
  const gpu = new FakeGpu();
  const dir = mkdtempSync(join(tmpdir(), 'gdp-mig-'));
  const m = await agentOn(gpu, dir);
  await m.ensure('claim-d', [P1]);
  gpu.crashAfter = 'destroy-ci';
  await assert.rejects(m.release('claim-d'), Crash);
  writeFileSync(join(dir, 'mig-instances.json'), gpu.recordAtCrash ?? '');
  const next = await agentOn(gpu, dir);
  await next.release('claim-d');
  assert.deepEqual(gpu.gis, []);
  assert.deepEqual(next.claims(), []);
});

test('nextStep never takes an instance that was there before the intent, nor an id reused at another placement', () => {
  const e = { ...P1, claimUid: 'c', before: [3], gi: null, ci: null };
  const foreign: GpuInstanceNow = { gi: 3, profileId: 19, start: 2, size: 1, cis: [0] };
  assert.deepEqual(nextStep(e, [foreign], true), { kind: 'create-gi' });
  assert.deepEqual(nextStep(e, [foreign], false), { kind: 'forget' });
  const recorded = { ...e, gi: 4, ci: 0 };
  const reused: GpuInstanceNow = { gi: 4, profileId: 9, start: 4, size: 4, cis: [0] };
  assert.deepEqual(nextStep(recorded, [reused], false), { kind: 'forget' });
});

test('a record entry that cannot be the agent’s is dropped when read', async () => {
  const dir = mkdtempSync(join(tmpdir(), 'gdp-mig-'));
  writeFileSync(
    join(dir, 'mig-instances.json'),
    JSON.stringify({ entries: [{ device: 'x' }, { ...P1, claimUid: 'c', before: [], gi: 1, ci: 0 }] }),
  );
  const m = await agentOn(new FakeGpu(), dir);
  assert.deepEqual(m.claims(), ['c']);
  assert.match(readFileSync(join(dir, 'mig-instances.json'), 'utf8'), /"device":"x"/, 'not rewritten by reading');
});
