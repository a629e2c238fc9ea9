// The NVML event wait blocks its thread for seconds. It must run on a thread of its own, not on
// libuv's shared pool: file I/O (which uses that pool) has to go on while the wait is blocked.
// Run by test/e2e/watcher-threads.test.ts with UV_THREADPOOL_SIZE=1, so that a wait on the pool
// would stall every file operation. Proof without timing: the fake NVML counts calls, so we can see
// that the one blocking wait is still the only one made while dozens of pool jobs complete.
import assert from 'node:assert/strict';
import { mkdtempSync, writeFileSync } from 'node:fs';
import { readFile, stat } from 'node:fs/promises';
import { pbkdf2 } from 'node:crypto';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { promisify } from 'node:util';
import { buildFakeNvml } from '../fake-nvml/build.ts';
import { ensureNativeLibrary } from '../../build/native.ts';
import { Nvml } from '../../src/nvml/nvml.ts';
import { EventWatcher } from '../../src/nvml/watcher.ts';
import { createLogger } from '../../src/system/log.ts';
import { loadKoffi } from '../../src/system/native.ts';
import { TOPOLOGIES, fakeNvmlStats, nvmlCommand } from './sim.ts';

export async function main(): Promise<void> {
  const libs = await buildFakeNvml();
  await ensureNativeLibrary();
  const dir = mkdtempSync(join(tmpdir(), 'gdp-watch-'));
  const control = join(dir, 'control');
  process.env.FAKE_NVML_CONFIG = join(TOPOLOGIES, 'demo-8.json');
  process.env.FAKE_NVML_CONTROL = control;
  const lines: string[] = [];
  const log = createLogger({ level: 'debug', journal: false, write: (l) => lines.push(l) });
  let ready!: () => void;
  const isReady = new Promise<void>((r) => {
    ready = r;
  });
  const koffi = loadKoffi();
  const nvml = Nvml.open({ koffi, driverRoot: '/', log, library: join(libs.current, 'libnvidia-ml.so.1') });
  const watcher = EventWatcher.start({
    nvml,
    koffi,
    gpus: Array.from({ length: 8 }, (_, i) => ({ nvmlIndex: i, uuid: `gpu-${i}` })),
    probeIntervalMs: 3_600_000,
    waitTimeoutMs: 3000,
    log,
    onReady: () => ready(),
    onEvents: () => undefined,
    onProbe: () => undefined,
  });
  try {
    await isReady;
    const stats = async (): Promise<Record<string, number>> =>
      (await fakeNvmlStats((command) => nvmlCommand(control, command), dir)).calls;
    // Wait until the health thread is inside its (3 s) wait.
    let before = await stats();
    for (let i = 0; i < 100 && (before.nvmlEventSetWait_v2 ?? 0) === 0; i++) before = await stats();
    assert.equal(before.nvmlEventSetWait_v2, 1, 'the health thread is blocked in its first wait');
    // Pool jobs: with a one-thread pool they would all wait behind a wait that sat on the pool.
    const file = join(dir, 'data');
    writeFileSync(file, 'x'.repeat(65536));
    await Promise.all([
      ...Array.from({ length: 32 }, () => readFile(file)),
      ...Array.from({ length: 32 }, () => stat(file)),
      ...Array.from({ length: 8 }, () => promisify(pbkdf2)('pw', 'salt', 1000, 32, 'sha256')),
    ]);
    const after = await stats();
    assert.equal(after.nvmlEventSetWait_v2, 1, 'all that work finished while the one wait was still blocked');
  } finally {
    await watcher.stop(5000);
    nvml.shutdown();
  }
  assert.deepEqual(
    lines.filter((l) => / (ERROR|WARN) /.test(l)),
    [],
  );
}

await main();
process.stdout.write('pool-probe: ok\n');
