// src/nvml/compute-mode.ts against the fake NVML's real ABI, from source: the modes read and set
// through the typed functions land in the library (its stats show them by UUID), and every failure
// is an NvmlError naming the call, the GPU, NVML's code and text.
import { after, before, test } from 'node:test';
import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { buildFakeNvml, LIBRARY_NAME } from '../fake-nvml/build.ts';
import { computeModeName, getComputeMode, NVML_COMPUTE_MODE, setComputeMode } from '../../src/nvml/compute-mode.ts';
import { NVML, NvmlError } from '../../src/nvml/errors.ts';
import { Nvml } from '../../src/nvml/nvml.ts';
import { createLogger } from '../../src/system/log.ts';
import { loadKoffi } from '../../src/system/native.ts';
import { ROOT, TOPOLOGIES, fakeNvmlStats, nvmlCommand } from '../support/sim.ts';

const UUIDS = ['GPU-7c5c1c52-0000-4000-8000-000000000a00', 'GPU-7c5c1c52-0000-4000-8000-000000000a01'] as const;

let dir: string;
let control: string;
let library: string;

before(async () => {
  library = join((await buildFakeNvml()).current, LIBRARY_NAME);
  dir = mkdtempSync(join(tmpdir(), 'gdp-compute-mode-'));
  control = join(dir, 'control');
  const config = join(dir, 'two.json');
  writeFileSync(
    config,
    JSON.stringify({
      gpus: [
        { uuid: UUIDS[0], name: 'NVIDIA A100-SXM4-40GB', busId: '00000000:07:00.0' },
        { uuid: UUIDS[1], name: 'NVIDIA A100-SXM4-40GB', busId: '00000000:0F:00.0', computeMode: 2 },
      ],
    }),
  );
  process.env.FAKE_NVML_CONFIG = config;
  process.env.FAKE_NVML_CONTROL = control;
});
after(() => rmSync(dir, { recursive: true, force: true }));

/** The fake NVML's stats, once it has applied every command sent before. */
async function stats(): Promise<{ computeModes: Record<string, number>; calls: Record<string, number> }> {
  return fakeNvmlStats((command) => nvmlCommand(control, command), dir);
}

function open(): Nvml {
  const log = createLogger({ level: 'debug', journal: false, write: () => {} });
  return Nvml.open({ koffi: loadKoffi(), driverRoot: '/', log, library });
}

test("computeModeName knows nvml.h's four modes and nothing else", () => {
  assert.deepEqual([0, 1, 2, 3].map(computeModeName), [
    'default',
    'exclusive-thread',
    'prohibited',
    'exclusive-process',
  ]);
  assert.equal(computeModeName(4), undefined);
  assert.equal(computeModeName(-1), undefined);
  assert.deepEqual(Object.values(NVML_COMPUTE_MODE), [0, 1, 2, 3]);
});

test('getComputeMode reads the configured modes; setComputeMode changes them in the library', async () => {
  const nvml = open();
  try {
    const h0 = nvml.handleByIndex(0);
    const h1 = nvml.handleByIndex(1);
    assert.equal(getComputeMode(nvml, h0, { index: 0 }), 'default');
    assert.equal(getComputeMode(nvml, h1, { index: 1 }), 'prohibited');

    setComputeMode(nvml, h0, { index: 0 }, 'exclusive-process');
    setComputeMode(nvml, h1, { index: 1 }, 'default');
    assert.equal(getComputeMode(nvml, h0, { index: 0 }), 'exclusive-process');
    assert.equal(getComputeMode(nvml, h1, { index: 1 }), 'default');
    const seen = await stats();
    assert.deepEqual(seen.computeModes, { [UUIDS[0]]: 3, [UUIDS[1]]: 0 });
    assert.equal(seen.calls.nvmlDeviceSetComputeMode, 2);

    setComputeMode(nvml, h0, { index: 0 }, 'default');
    assert.deepEqual((await stats()).computeModes, { [UUIDS[0]]: 0, [UUIDS[1]]: 0 });
  } finally {
    nvml.close();
  }
});

test("a failed call is an NvmlError naming the call, the GPU, the code and NVML's text", async () => {
  const nvml = open();
  try {
    const h1 = nvml.handleByIndex(1);
    const gpu = { index: 1, uuid: UUIDS[1] };
    setComputeMode(nvml, h1, gpu, 'prohibited'); // modes outlive the earlier tests' sessions, as on a node
    nvmlCommand(control, 'lost 1');
    await stats();
    for (const call of [
      () => getComputeMode(nvml, h1, gpu),
      () => setComputeMode(nvml, h1, gpu, 'exclusive-process'),
    ]) {
      assert.throws(call, (error: unknown) => {
        assert.ok(error instanceof NvmlError);
        assert.equal(error.code, NVML.ERROR_GPU_IS_LOST);
        assert.deepEqual(error.gpu, gpu);
        assert.match(
          error.message,
          /^nvmlDevice(Get|Set)ComputeMode failed for GPU 1 GPU-7c5c1c52-0000-4000-8000-000000000a01: GPU is lost/,
        );
        assert.match(error.message, /\(NVML code 15\)$/);
        return true;
      });
    }
    nvmlCommand(control, 'back 1');
    await stats();
    assert.equal(getComputeMode(nvml, h1, gpu), 'prohibited', 'a refused set changed nothing');
  } finally {
    nvml.close();
  }
});

test('setComputeMode as a user other than root: NO_PERMISSION, and the error says root is needed', {
  skip: process.getuid?.() !== 0 ? 'needs root to run a child as another user' : false,
}, () => {
  // The fake checks geteuid(), so this runs the typed function in a child running as nobody (65534).
  const script = `
    import { getComputeMode, setComputeMode } from ${JSON.stringify(join(ROOT, 'src', 'nvml', 'compute-mode.ts'))};
    import { Nvml } from ${JSON.stringify(join(ROOT, 'src', 'nvml', 'nvml.ts'))};
    import { createLogger } from ${JSON.stringify(join(ROOT, 'src', 'system', 'log.ts'))};
    import { loadKoffi } from ${JSON.stringify(join(ROOT, 'src', 'system', 'native.ts'))};
    const nvml = Nvml.open({ koffi: loadKoffi(), driverRoot: '/', library: process.env.LIB,
      log: createLogger({ level: 'error', journal: false, write: () => {} }) });
    const h = nvml.handleByIndex(0);
    let error;
    try { setComputeMode(nvml, h, { index: 0 }, 'exclusive-process'); } catch (e) { error = e; }
    const after = getComputeMode(nvml, h, { index: 0 });
    process.stdout.write(JSON.stringify({ name: error?.name, code: error?.code, message: error?.message, after }));
    nvml.close();
  `;
  const child = spawnSync(process.execPath, ['--input-type=module', '-e', script], {
    cwd: ROOT,
    uid: 65534,
    gid: 65534,
    env: {
      PATH: process.env.PATH ?? '/usr/bin:/bin',
      LIB: library,
      FAKE_NVML_CONFIG: join(TOPOLOGIES, 'single.json'),
    },
    encoding: 'utf8',
    timeout: 30_000,
  });
  assert.equal(child.status, 0, `child failed: ${child.stderr}`);
  const result = JSON.parse(child.stdout) as { name: string; code: number; message: string; after: string };
  assert.equal(result.name, 'NvmlError');
  assert.equal(result.code, NVML.ERROR_NO_PERMISSION);
  assert.equal(
    result.message,
    'nvmlDeviceSetComputeMode failed for GPU 0: Insufficient Permissions (setting ' +
      'EXCLUSIVE_PROCESS, 3); setting a compute mode needs root (NVML code 4)',
  );
  assert.equal(result.after, 'default');
});
