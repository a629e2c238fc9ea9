// The NVML event wait blocks its thread for seconds; it must not sit on libuv's shared pool, which
// file I/O needs. test/support/pool-probe.ts proves it in a process whose pool has ONE thread.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import { join } from 'node:path';
import { ROOT } from '../support/sim.ts';

test('file I/O goes on while the watcher is blocked in nvmlEventSetWait, even with a one-thread libuv pool', () => {
  const r = spawnSync(process.execPath, [join(ROOT, 'test', 'support', 'pool-probe.ts')], {
    env: { ...process.env, UV_THREADPOOL_SIZE: '1' },
    encoding: 'utf8',
    timeout: 60000,
  });
  assert.equal(r.status, 0, `pool probe failed:\n${r.stdout}\n${r.stderr}`);
  assert.match(r.stdout, /pool-probe: ok/);
});
