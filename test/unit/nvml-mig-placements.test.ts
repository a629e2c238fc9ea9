// What dynamic MIG reads of a MIG-mode GPU through the real bindings on the fake NVML's real ABI
// (src/nvml/mig-instances.ts readPartitionable): every profile with NVML's placements in memory slices, as the MIG
// user guide's tables give them for an A100-40GB and an H100-80GB, and the GPU instances someone else made with
// their placements. A GPU not in MIG mode still lists its placements (NVML answers regardless of the mode) but
// refuses to make an instance with NOT_SUPPORTED, named with the call and the GPU.
import assert from 'node:assert/strict';
import { mkdirSync, mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { after, before, test } from 'node:test';
import type { Gpu } from '../../src/core/devices.ts';
import type { PartitionableGpu } from '../../src/core/dynamic-mig.ts';
import { NvmlError } from '../../src/nvml/errors.ts';
import { NvmlMigInstances, readPartitionable } from '../../src/nvml/mig-instances.ts';
import { Nvml } from '../../src/nvml/nvml.ts';
import { createLogger } from '../../src/system/log.ts';
import { loadKoffi } from '../../src/system/native.ts';
import { buildFakeNvml, LIBRARY_NAME } from '../fake-nvml/build.ts';
import { writeMigMinors } from '../support/mig.ts';

const GIB = 1024 ** 3;
const GPUS = [
  { uuid: 'GPU-b2000000-0000-4000-8000-000000000000', name: 'NVIDIA A100-SXM4-40GB', gib: 40, mig: [] },
  { uuid: 'GPU-b2000000-0000-4000-8001-000000000001', name: 'NVIDIA H100 80GB HBM3', gib: 80, mig: [] },
  {
    uuid: 'GPU-b2000000-0000-4000-8002-000000000002',
    name: 'NVIDIA H100 80GB HBM3',
    gib: 80,
    mig: ['3g.40gb', '1g.10gb'],
  },
  { uuid: 'GPU-b2000000-0000-4000-8003-000000000003', name: 'NVIDIA A100-SXM4-40GB', gib: 40, mig: null },
] as const;
const quiet = createLogger({ level: 'error', journal: false, write: () => undefined });

let dir: string;
let library: string;

before(async () => {
  library = join((await buildFakeNvml()).current, LIBRARY_NAME);
  dir = mkdtempSync(join(tmpdir(), 'gdp-mig-placements-'));
  const config = join(dir, 'node.json');
  const gpus = GPUS.map((g, i) => ({
    uuid: g.uuid,
    name: g.name,
    busId: `00000000:${(0x10 + i).toString(16).toUpperCase()}:00.0`,
    minor: i,
    mig: g.mig === null ? { current: false } : { current: true, instances: g.mig },
  }));
  writeFileSync(config, JSON.stringify({ gpus }));
  writeMigMinors(join(dir, 'proc'), GPUS.length);
  process.env.FAKE_NVML_CONFIG = config;
});
after(() => rmSync(dir, { recursive: true, force: true }));

/** readPartitionable of the GPU at `index`, through a fresh NVML session. */
function partitionable(index: number): PartitionableGpu {
  const nvml = Nvml.open({ koffi: loadKoffi(), driverRoot: '/', log: quiet, library });
  try {
    const g = GPUS[index];
    assert.ok(g !== undefined);
    const gpu: Gpu = {
      index,
      uuid: g.uuid,
      name: g.name,
      minor: index,
      busId: '',
      memoryBytes: g.gib * GIB,
      numaNode: null,
    };
    const read = readPartitionable(nvml, nvml.handleByIndex(index), gpu);
    assert.ok(read !== null, 'this driver has the placement call');
    return read;
  } finally {
    nvml.close();
  }
}

/** Each profile as "name (id): starts/size", the way the MIG user guide's placement tables read. */
function table(p: PartitionableGpu): string[] {
  return p.profiles.map((x) => {
    const sizes = [...new Set(x.placements.map((pl) => pl.size))].join(',');
    return `${x.name} (${x.id}): ${x.placements.map((pl) => pl.start).join(',')}/${sizes}`;
  });
}

test('an A100-40GB: each profile at the starts of its placement table, sized in memory slices', () => {
  assert.deepEqual(table(partitionable(0)).sort(), [
    '1g.10gb (15): 0,2,4,6/2',
    '1g.5gb (19): 0,1,2,3,4,5,6/1',
    '1g.5gb+me (20): 0,1,2,3,4,5,6/1',
    '2g.10gb (14): 0,2,4/2',
    '3g.20gb (9): 0,4/4',
    '4g.20gb (5): 0/4',
    '7g.40gb (0): 0/8',
  ]);
  assert.deepEqual(partitionable(0).instances, []);
});

test('an H100-80GB: the same geometry under its own names; 3g spans four memory slices, 7g all eight', () => {
  assert.deepEqual(table(partitionable(1)).sort(), [
    '1g.10gb (19): 0,1,2,3,4,5,6/1',
    '1g.10gb+me (20): 0,1,2,3,4,5,6/1',
    '1g.20gb (15): 0,2,4,6/2',
    '2g.20gb (14): 0,2,4/2',
    '3g.40gb (9): 0,4/4',
    '4g.40gb (5): 0/4',
    '7g.80gb (0): 0/8',
  ]);
});

test('instances made by someone else are read with their profile and placement, the profiles left as they are', () => {
  const read = partitionable(2);
  assert.deepEqual(read.instances, [
    { giId: 1, profileId: 9, placement: { start: 0, size: 4 } },
    { giId: 2, profileId: 19, placement: { start: 4, size: 1 } },
  ]);
  assert.deepEqual(table(read), table(partitionable(1)), 'possible placements do not shrink with what is used');
});

test('a GPU not in MIG mode lists its placements but making an instance is NOT_SUPPORTED, named', async () => {
  assert.equal(table(partitionable(3)).length, 7);
  const nvml = Nvml.open({ koffi: loadKoffi(), driverRoot: '/', log: quiet, library });
  try {
    const mig = new NvmlMigInstances(nvml, join(dir, 'proc'));
    const uuid = GPUS[3].uuid;
    await assert.rejects(mig.createGpuInstance(uuid, 19, 0, 1), (e: unknown) => {
      assert.ok(e instanceof NvmlError);
      assert.equal(e.code, 3);
      assert.equal(e.func, 'nvmlDeviceCreateGpuInstanceWithPlacement');
      assert.equal(e.gpu?.uuid, uuid);
      return true;
    });
    assert.deepEqual(await mig.gpuInstances(uuid), []);
  } finally {
    nvml.close();
  }
});

test('capability minors that cannot be read: the error names the GPU, the instances and the file', async () => {
  const nvml = Nvml.open({ koffi: loadKoffi(), driverRoot: '/', log: quiet, library });
  const uuid = GPUS[0].uuid;
  const mig = new NvmlMigInstances(nvml, join(dir, 'proc'));
  const gi = await mig.createGpuInstance(uuid, 19, 5, 1);
  const ci = await mig.createComputeInstance(uuid, gi);
  try {
    assert.equal((await mig.migDevice(uuid, gi, ci)).giCapMinor, 3 + gi * 9, 'read from the driver’s table');
    const bare = mkdtempSync(join(dir, 'no-proc-'));
    await assert.rejects(
      new NvmlMigInstances(nvml, bare).migDevice(uuid, gi, ci),
      new RegExp(
        `^Error: cannot read the capability minors of GPU ${uuid} \\(minor 0\\) GI ${gi} CI ${ci} from ` +
          `${bare}/driver/nvidia-caps/mig-minors: .*ENOENT`,
      ),
    );
    const partial = mkdtempSync(join(dir, 'partial-proc-'));
    mkdirSync(join(partial, 'driver', 'nvidia-caps'), { recursive: true });
    writeFileSync(join(partial, 'driver', 'nvidia-caps', 'mig-minors'), 'config 1\nmonitor 2\n');
    await assert.rejects(
      new NvmlMigInstances(nvml, partial).migDevice(uuid, gi, ci),
      new RegExp(`mig-minors has no gpu0/gi${gi}/access or gpu0/gi${gi}/ci${ci}/access line for GPU ${uuid}`),
    );
  } finally {
    await mig.destroyComputeInstance(uuid, gi, ci);
    await mig.destroyGpuInstance(uuid, gi);
    nvml.close();
  }
});
