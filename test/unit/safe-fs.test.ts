// The safe file primitives of a root process in a tree another process may have touched: nothing they do
// follows a planted symlink or leaves the tree, checked with sentinels outside it.
import assert from 'node:assert/strict';
import { execFileSync } from 'node:child_process';
import {
  existsSync,
  lstatSync,
  mkdirSync,
  mkdtempSync,
  readFileSync,
  readdirSync,
  rmSync,
  statSync,
  symlinkSync,
  writeFileSync,
} from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { after, test } from 'node:test';
import {
  componentsBelow,
  ensureDir,
  mountedDevice,
  readRegularFile,
  removeTree,
  safeComponent,
  writeFileSafely,
} from '../../src/system/safe-fs.ts';

const top = mkdtempSync(join(tmpdir(), 'gdp-safe-fs-'));
after(() => rmSync(top, { recursive: true, force: true }));

function tree(name: string): { base: string; outside: string; sentinel: string } {
  const base = join(top, name, 'tree');
  const outside = join(top, name, 'outside');
  mkdirSync(base, { recursive: true });
  mkdirSync(join(outside, 'sub'), { recursive: true });
  const sentinel = join(outside, 'sentinel');
  writeFileSync(sentinel, 'keep\n');
  writeFileSync(join(outside, 'sub', 'deep'), 'keep\n');
  return { base, outside, sentinel };
}

function untouched(outside: string): void {
  assert.equal(readFileSync(join(outside, 'sentinel'), 'utf8'), 'keep\n', 'the sentinel outside is unchanged');
  assert.equal(readFileSync(join(outside, 'sub', 'deep'), 'utf8'), 'keep\n', 'the directory outside is unchanged');
  assert.deepEqual(readdirSync(outside).sort(), ['sentinel', 'sub']);
  assert.equal(statSync(outside).mode & 0o777, 0o755, "the outside directory's mode unchanged");
}

test('componentsBelow and safeComponent refuse a path that leaves the tree and names that are no component', () => {
  assert.deepEqual(componentsBelow('/a/b', '/a/b/c/d'), ['c', 'd']);
  assert.deepEqual(componentsBelow('/a/b', '/a/b'), []);
  assert.throws(() => componentsBelow('/a/b', '/a/b/../c'), /\/a\/b\/\.\.\/c is not under \/a\/b: refused/);
  assert.throws(() => componentsBelow('/a/b', '/etc'), /not under/);
  for (const bad of ['', '.', '..', 'a/b', '/', 'x'.repeat(300), 'a\0b', 'é'])
    assert.equal(safeComponent(bad), false, JSON.stringify(bad));
  assert.equal(safeComponent('0f6c1a2e-7e22-4b3c-9d7e-1c2b3a4d5e6f'), true);
});

test('writeFileSafely replaces a planted .tmp symlink and a symlink at the path, writing only inside', async () => {
  const { base, outside, sentinel } = tree('write');
  symlinkSync(sentinel, join(base, 'a.json.tmp'));
  await writeFileSafely(base, join(base, 'a.json'), '{"x":1}\n');
  assert.equal(readFileSync(join(base, 'a.json'), 'utf8'), '{"x":1}\n');
  symlinkSync(sentinel, join(base, 'b.json'));
  await writeFileSafely(base, join(base, 'b.json'), 'b\n');
  assert.equal(lstatSync(join(base, 'b.json')).isFile(), true, 'the link replaced by a file');
  assert.equal(existsSync(join(base, 'a.json.tmp')), false);
  untouched(outside);
  symlinkSync(outside, join(base, 'dir'));
  await assert.rejects(writeFileSafely(base, join(base, 'dir', 'c.json'), 'c'), /dir is a symbolic link/);
  untouched(outside);
});

test('ensureDir refuses a symlink or a non-directory on the way and sets modes through its descriptor', async () => {
  const { base, outside } = tree('dirs');
  await ensureDir(base, join(base, 'a', 'b'));
  assert.equal(statSync(join(base, 'a', 'b')).mode & 0o7777, 0o755);
  symlinkSync(outside, join(base, 'link'));
  await assert.rejects(ensureDir(base, join(base, 'link', 'x'), 0o700), /link is a symbolic link, not a directory/);
  writeFileSync(join(base, 'file'), '');
  await assert.rejects(ensureDir(base, join(base, 'file')), /file is not a directory: refused/);
  untouched(outside);
});

test('removeTree unlinks symlinks inside without following them and refuses a tree reached through one', async () => {
  const { base, outside, sentinel } = tree('remove');
  const claim = join(base, 'claim');
  mkdirSync(join(claim, 'mps', 'pipe'), { recursive: true });
  symlinkSync(outside, join(claim, 'mps', 'log'));
  symlinkSync(sentinel, join(claim, '.ready'));
  writeFileSync(join(claim, 'mps', 'pipe', 'control'), '');
  await removeTree(base, claim);
  assert.equal(existsSync(claim), false);
  untouched(outside);
  symlinkSync(outside, join(base, 'claim2'));
  await removeTree(base, join(base, 'claim2'));
  assert.equal(existsSync(join(base, 'claim2')), false, 'the link itself removed');
  symlinkSync(outside, join(base, 'claims'));
  await assert.rejects(removeTree(base, join(base, 'claims', 'sub')), /claims is a symbolic link/);
  untouched(outside);
  await removeTree(base, join(base, 'absent'));
});

test('mountedDevice reads the exact mount point, octal escapes decoded, never a prefix', () => {
  const info = [
    '65 44 0:40 / /run/nvidia/mps/dra/claims/u1/shm rw,relatime - tmpfs tmpfs rw',
    '66 44 0:41 / /run/with\\040space rw - tmpfs tmpfs rw',
  ].join('\n');
  assert.equal(mountedDevice(info, '/run/nvidia/mps/dra/claims/u1/shm'), '0:40');
  assert.equal(mountedDevice(info, '/run/with space'), '0:41');
  assert.equal(mountedDevice(info, '/run/nvidia/mps/dra/claims/u1'), null);
});

test('readRegularFile: a small regular file read; a FIFO (no block), link, directory, big file refused', async () => {
  const { base, sentinel } = tree('read');
  writeFileSync(join(base, 'ok.json'), '{"a":1}');
  assert.equal(await readRegularFile(base, join(base, 'ok.json'), 64), '{"a":1}');
  execFileSync('mkfifo', [join(base, 'fifo.json')]);
  await assert.rejects(readRegularFile(base, join(base, 'fifo.json'), 64), /fifo\.json is not a regular file/);
  symlinkSync(sentinel, join(base, 'link.json'));
  await assert.rejects(readRegularFile(base, join(base, 'link.json'), 64), /link\.json is a symbolic link/);
  mkdirSync(join(base, 'dir.json'));
  await assert.rejects(readRegularFile(base, join(base, 'dir.json'), 64), /dir\.json is not a regular file/);
  writeFileSync(join(base, 'big.json'), 'x'.repeat(65));
  await assert.rejects(readRegularFile(base, join(base, 'big.json'), 64), /65 bytes, more than the 64 allowed/);
});
