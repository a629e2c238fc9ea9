// The MPS control client (src/mps/control-client.ts) against the fake nvidia-cuda-mps-control, which
// has the real program's command line: a daemon started with -d, commands through the client, and
// the failures an operator meets (no daemon, a refused command, a program that does not exist).
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { mkdtemp, rm, mkdir, symlink } from 'node:fs/promises';
import { spawnSync } from 'node:child_process';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { buildFakeMpsControl, MPS_CONTROL_NAME } from '../fake-nvml/build.ts';
import { findMpsControl, mpsCommand, mpsEnvironment, MpsControlError } from '../../src/mps/control-client.ts';

test('commands reach a running daemon, and a missing daemon is a clear error', async () => {
  const program = path.join(await buildFakeMpsControl(), MPS_CONTROL_NAME);
  const dir = await mkdtemp(path.join(tmpdir(), 'mps-client-'));
  const dirs = { pipeDir: path.join(dir, 'pipe'), logDir: path.join(dir, 'log') };
  try {
    await assert.rejects(
      mpsCommand(program, dirs, 'get_default_active_thread_percentage'),
      (e: unknown) =>
        e instanceof MpsControlError &&
        /Cannot find MPS control daemon process/.test(e.message) &&
        e.message.includes(dirs.pipeDir),
    );
    const started = spawnSync(program, ['-d'], { env: mpsEnvironment(dirs, ['0', '1']) });
    assert.equal(started.status, 0, String(started.stderr));
    assert.equal(await mpsCommand(program, dirs, 'set_default_active_thread_percentage 25'), '25.0');
    assert.equal(await mpsCommand(program, dirs, 'get_default_active_thread_percentage'), '25.0');
    await mpsCommand(program, dirs, 'set_default_device_pinned_mem_limit 1 4096M');
    assert.equal(await mpsCommand(program, dirs, 'get_default_device_pinned_mem_limit 1'), '4096M');
    await assert.rejects(mpsCommand(program, dirs, 'set_default_active_thread_percentage 250'), /status 1: .*/);
    await mpsCommand(program, dirs, 'quit');
    await assert.rejects(
      mpsCommand(program, dirs, 'get_default_active_thread_percentage'),
      /Cannot find MPS control daemon process/,
    );
  } finally {
    await rm(dir, { recursive: true, force: true });
  }
});

test('the program is found under the driver root before PATH, and a missing one names where it looked', async () => {
  const program = path.join(await buildFakeMpsControl(), MPS_CONTROL_NAME);
  const root = await mkdtemp(path.join(tmpdir(), 'mps-root-'));
  try {
    const none = await findMpsControl(root, '/nonexistent-bin');
    assert.ok(
      'looked' in none &&
        none.looked.includes(path.join(root, 'usr/bin', MPS_CONTROL_NAME)) &&
        none.looked.includes(path.join('/nonexistent-bin', MPS_CONTROL_NAME)),
    );
    const onPath = await findMpsControl(root, path.dirname(program));
    assert.deepEqual(onPath, { path: program });
    await mkdir(path.join(root, 'usr/bin'), { recursive: true });
    await symlink(program, path.join(root, 'usr/bin', MPS_CONTROL_NAME));
    assert.deepEqual(await findMpsControl(root, path.dirname(program)), {
      path: path.join(root, 'usr/bin', MPS_CONTROL_NAME),
    });
    await assert.rejects(
      mpsCommand(path.join(root, 'missing'), { pipeDir: root, logDir: root }, 'get_server_list'),
      /cannot run .*missing/,
    );
  } finally {
    await rm(root, { recursive: true, force: true });
  }
});
