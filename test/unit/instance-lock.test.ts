import { test } from 'node:test';
import assert from 'node:assert/strict';
import { mkdirSync, mkdtempSync, readFileSync, rmSync, statSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { AlreadyRunningError, InstanceLock, lockHolder, procLocksDevice } from '../../src/system/instance-lock.ts';
import { loadKoffi } from '../../src/system/native.ts';

test(
  '/proc/locks: the FLOCK write lock on the inode, by device ' +
    'as the kernel writes it; waiters and other inodes skipped',
  () => {
    // makedev(254, 0) and makedev(8, 1) in the kernel's new encoding, as stat gives them.
    assert.equal(procLocksDevice(0xfe00n), 'fe:00');
    assert.equal(procLocksDevice(0x801n), '08:01');
    // glibc's makedev(0x1067, 0x2345): major's low 12 bits at 8, high bits at 32; minor's low byte at 0, the
    // rest at 12.
    assert.equal(procLocksDevice((0x067n << 8n) | (0x1000n << 32n) | 0x45n | (0x2300n << 12n)), '1067:2345');
    const text = [
      '1: POSIX  ADVISORY  WRITE 111 fe:00:42 0 EOF',
      '2: FLOCK  ADVISORY  WRITE 222 08:01:42 0 EOF',
      '3: FLOCK  ADVISORY  WRITE 333 fe:00:42 0 EOF',
      '3: -> FLOCK  ADVISORY  WRITE 444 fe:00:42 0 EOF',
      '4: FLOCK  ADVISORY  WRITE 555 fe:00:43 0 EOF',
    ].join('\n');
    assert.equal(lockHolder(text, 0xfe00n, 42n), 333);
    assert.equal(lockHolder(text, 0xfe00n, 43n), 555);
    // A device shown differently (overlayfs): the inode alone when one lock names it, else unknown.
    assert.equal(lockHolder(text, 0x1234n, 43n), 555);
    assert.equal(lockHolder(text, 0x1234n, 42n), null);
    assert.equal(lockHolder(text, 0xfe00n, 7n), null);
  },
);

test(
  'flock on the directory: a second lock is refused naming this process, ' +
    'released on release(), and a re-created directory is locked afresh',
  async () => {
    const root = mkdtempSync(join(tmpdir(), 'gdp-lock-'));
    const dir = join(root, 'device-plugins');
    const koffi = loadKoffi();
    const first = new InstanceLock(koffi, dir);
    const second = new InstanceLock(koffi, dir);
    try {
      assert.deepEqual(await first.tryLock(), { state: 'missing' });
      mkdirSync(dir);
      const held = await first.tryLock();
      assert.equal(held.state, 'held');
      const busy = await second.tryLock();
      assert.equal(busy.state, 'busy');
      if (busy.state === 'busy') {
        assert.ok(busy.error instanceof AlreadyRunningError);
        assert.equal(busy.error.pid, process.pid);
        assert.match(
          busy.error.message,
          new RegExp(
            `^another gpu-device-plugin \\(PID ${process.pid}\\) already serves the socket directory ${dir}; `,
          ),
        );
      }
      // Deleted and re-created (kubeadm reset): the new directory is free until the holder locks it.
      rmSync(dir, { recursive: true });
      mkdirSync(dir);
      const relocked = await first.tryLock();
      assert.equal(relocked.state, 'held');
      // The old directory's inode stays open under the lock, so its number cannot be reused meanwhile.
      assert.ok(
        held.state === 'held' && relocked.state === 'held' && relocked.identity !== held.identity,
        'the new inode is locked',
      );
      assert.equal((await second.tryLock()).state, 'busy');
      first.release();
      assert.equal((await second.tryLock()).state, 'held');
      assert.ok(statSync(dir).isDirectory());
    } finally {
      first.release();
      second.release();
      rmSync(root, { recursive: true, force: true });
    }
  },
);

test('follow(): the holder locks a re-created directory when it appears, and hears when another plugin got it first', {
  timeout: 10000,
}, async () => {
  const root = mkdtempSync(join(tmpdir(), 'gdp-lock-follow-'));
  const dir = join(root, 'device-plugins');
  mkdirSync(dir);
  const koffi = loadKoffi();
  const first = new InstanceLock(koffi, dir);
  const other = new InstanceLock(koffi, dir);
  try {
    assert.equal((await first.tryLock()).state, 'held');
    // Re-created: followed, the new directory is locked by the holder (the other one is refused).
    rmSync(dir, { recursive: true });
    mkdirSync(dir);
    const st = statSync(dir, { bigint: true });
    let busy: AlreadyRunningError | undefined;
    first.follow((err) => {
      busy = err;
    }, 5);
    // Watched from /proc/locks, without taking the lock: the new inode becomes this process's.
    while (lockHolder(readFileSync('/proc/locks', 'utf8'), st.dev, st.ino) !== process.pid)
      await new Promise((r) => setImmediate(r));
    assert.equal((await other.tryLock()).state, 'busy');
    assert.equal(busy, undefined, 'the holder re-locked its own directory');
    first.release();
    // Deleted again and taken by another plugin before the holder looks: the holder is told.
    const second = new InstanceLock(koffi, dir);
    assert.equal((await second.tryLock()).state, 'held');
    const third = new InstanceLock(koffi, dir);
    const refused = await new Promise<AlreadyRunningError>((resolve) => third.follow(resolve, 5));
    assert.equal(refused.pid, process.pid);
    assert.equal(third.held, false);
    second.release();
  } finally {
    first.release();
    other.release();
    rmSync(root, { recursive: true, force: true });
  }
});
