// The socket-directory view check of src/kubelet/watcher.ts: when does the process know that it lost
// the directory it serves in (a systemd service after `kubeadm reset`), and when must it carry on.
import { EventEmitter } from 'node:events';
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { mkdirSync, mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { SocketDirWatcher, mountPoints, viewProblem } from '../../src/kubelet/watcher.ts';
import { createLogger } from '../../src/system/log.ts';
import { onEvent, waitFor } from '../support/wait.ts';

const MOUNTINFO = [
  '266 250 0:39 / / ro,nosuid,relatime shared:1 master:1 - overlay overlay rw',
  '308 266 0:39 /var/lib/kubelet/device-plugins /var/lib/kubelet/device-plugins ' +
    'rw,nosuid,relatime shared:101 master:1 - overlay overlay rw',
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
const never = async (): Promise<boolean> => {
  throw new Error('not needed');
};

test('a kubelet restart (files deleted, directory kept) is no problem', async () => {
  assert.equal(await viewProblem(START, { identity: '39:100', nlink: 2 }, yes, yes), null);
});

test(
  'the private mount gone: deleted (nothing there now) or ' + 'deleted and re-created, even with the same inode number',
  async () => {
    assert.match((await viewProblem(START, null, no, never)) ?? '', /deleted, and its mount .* went with it/);
    assert.match(
      (await viewProblem(START, { identity: '39:222', nlink: 2 }, no, yes)) ?? '',
      /deleted and re-created, and its mount/,
    );
    assert.match((await viewProblem(START, { identity: '39:100', nlink: 2 }, no, yes)) ?? '', /deleted and re-created/);
  },
);

test('link count 0, or a directory that turned read-only (EROFS), is a problem too', async () => {
  assert.match((await viewProblem(START, { identity: '39:100', nlink: 0 }, never, never)) ?? '', /link count 0/);
  assert.match((await viewProblem(START, { identity: '39:100', nlink: 2 }, yes, no)) ?? '', /read-only/);
});

test(
  'without a mount of its own (not under systemd), a ' + 'deleted or re-created directory is just waited for',
  async () => {
    const plain = { identity: '39:100', mounted: false, writable: true };
    assert.equal(await viewProblem(plain, null, never, never), null);
    assert.equal(await viewProblem(plain, { identity: '39:300', nlink: 2 }, never, yes), null);
  },
);

test('a directory that was never writable does not count as lost', async () => {
  assert.equal(
    await viewProblem(
      { identity: '39:100', mounted: false, writable: false },
      { identity: '39:100', nlink: 2 },
      never,
      no,
    ),
    null,
  );
});

// The directory watcher itself, in-process on a real directory (inotify through fs.watch), with the
// periodic check an hour apart: everything below is seen by the watches.
function recorder(): {
  events: string[];
  next: (pred: (e: string) => boolean) => Promise<string>;
  push: (e: string) => void;
} {
  const events: string[] = [];
  const pushed = new EventEmitter();
  return {
    events,
    push: (e) => {
      events.push(e);
      pushed.emit('event');
    },
    // The next event pushed that matches. The deadline is a liveness bound only (its timer also keeps
    // the event loop up: the watches do not).
    next: (pred) => {
      const from = events.length;
      return waitFor(() => events.slice(from).find(pred), {
        on: onEvent(pushed, 'event'),
        deadlineMs: 10000,
        what: () => `an event matching ${pred.toString()}; seen: ${JSON.stringify(events)}`,
      });
    },
  };
}

test(
  "SocketDirWatcher: the kubelet socket going and coming, another plugin's " +
    'socket going, and a re-created directory are all seen by the watch',
  async () => {
    const root = mkdtempSync(join(tmpdir(), 'gdp-watch-'));
    const dir = join(root, 'device-plugins');
    mkdirSync(dir);
    const kubeletSocket = join(dir, 'kubelet.sock');
    const r = recorder();
    const log = createLogger({ level: 'debug', journal: false, write: (l) => r.push(`log: ${l.trimEnd()}`) });
    const w = new SocketDirWatcher({
      kubeletSocket,
      pluginSocket: join(dir, 'gpu-device-plugin-gpu.sock'),
      servedIdentity: () => null,
      attemptedKubelet: () => null,
      onChange: (reason, ours) => r.push(`change: ${reason}${ours ? ' (ours)' : ''}`),
      onKubeletGone: (reason) => r.push(`gone: ${reason}`),
      onOtherSocketRemoved: (name) => r.push(`other gone: ${name}`),
      checkIntervalMs: 3600_000,
      log,
    });
    w.start();
    try {
      await w.opened;
      let seen = r.next((e) => e === 'change: kubelet socket created');
      writeFileSync(kubeletSocket, '');
      await seen;
      seen = r.next((e) => e === 'gone: kubelet socket removed');
      rmSync(kubeletSocket);
      await seen;
      seen = r.next((e) => e.startsWith('other gone'));
      writeFileSync(join(dir, 'not-a-socket.json'), '');
      rmSync(join(dir, 'not-a-socket.json'));
      writeFileSync(join(dir, 'nvidia-gpu.sock'), '');
      rmSync(join(dir, 'nvidia-gpu.sock'));
      assert.equal(await seen, 'other gone: nvidia-gpu.sock');
      // Deleted and re-created three times: the watch follows each new directory.
      for (let i = 0; i < 3; i++) {
        const moved = r.next((e) => /re-created; watching the new one/.test(e));
        rmSync(dir, { recursive: true });
        mkdirSync(dir);
        await moved;
        seen = r.next((e) => e === 'change: kubelet socket created');
        writeFileSync(kubeletSocket, '');
        await seen;
        rmSync(kubeletSocket);
      }
      assert.deepEqual(
        [...new Set(r.events.filter((e) => e.startsWith('other gone')))],
        ['other gone: nvidia-gpu.sock'],
        'only .sock files of others count',
      );
    } finally {
      w.stop();
      rmSync(root, { recursive: true, force: true });
    }
  },
);
