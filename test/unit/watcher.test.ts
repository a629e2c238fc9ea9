// The socket-directory view check of src/kubelet/watcher.ts: when does the process know that it lost
// the directory it serves in (a systemd service after `kubeadm reset`), and when must it carry on.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { mountPoints, viewProblem } from '../../src/kubelet/watcher.ts';

const MOUNTINFO = [
  '266 250 0:39 / / ro,nosuid,relatime shared:1 master:1 - overlay overlay rw',
  '308 266 0:39 /var/lib/kubelet/device-plugins /var/lib/kubelet/device-plugins rw,nosuid,relatime shared:101 master:1 - overlay overlay rw',
  '309 266 0:40 / /run/with\\040space rw - tmpfs tmpfs rw',
].join('\n');

test('mountinfo: mount points are the fifth field, octal escapes decoded', () => {
  const m = mountPoints(MOUNTINFO);
  assert.ok(m.has('/var/lib/kubelet/device-plugins'));
  assert.ok(m.has('/run/with space'));
  assert.ok(m.has('/'));
  assert.equal(m.size, 3);
});

const START = { identity: '39:100', mounted: true, writable: true };
const yes = async (): Promise<boolean> => true;
const no = async (): Promise<boolean> => false;
const never = async (): Promise<boolean> => { throw new Error('not needed'); };

test('a kubelet restart (files deleted, directory kept) is no problem', async () => {
  assert.equal(await viewProblem(START, { identity: '39:100', nlink: 2 }, yes, yes), null);
});

test('the private mount gone: deleted (nothing there now) or deleted and re-created, even with the same inode number', async () => {
  assert.match(await viewProblem(START, null, no, never) ?? '', /deleted, and its mount .* went with it/);
  assert.match(await viewProblem(START, { identity: '39:222', nlink: 2 }, no, yes) ?? '', /deleted and re-created, and its mount/);
  assert.match(await viewProblem(START, { identity: '39:100', nlink: 2 }, no, yes) ?? '', /deleted and re-created/);
});

test('link count 0, or a directory that turned read-only (EROFS), is a problem too', async () => {
  assert.match(await viewProblem(START, { identity: '39:100', nlink: 0 }, never, never) ?? '', /link count 0/);
  assert.match(await viewProblem(START, { identity: '39:100', nlink: 2 }, yes, no) ?? '', /read-only/);
});

test('without a mount of its own (not under systemd), a deleted or re-created directory is just waited for', async () => {
  const plain = { identity: '39:100', mounted: false, writable: true };
  assert.equal(await viewProblem(plain, null, never, never), null);
  assert.equal(await viewProblem(plain, { identity: '39:300', nlink: 2 }, never, yes), null);
});

test('a directory that was never writable does not count as lost', async () => {
  assert.equal(await viewProblem({ identity: '39:100', mounted: false, writable: false }, { identity: '39:100', nlink: 2 }, never, no), null);
});
