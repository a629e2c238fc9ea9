// sd_notify from the executable to a datagram socket, as systemd would receive it.
import { MAX_BACKOFF_MS } from '../../src/nvml/session.ts';
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { copyFileSync, mkdirSync } from 'node:fs';
import { join } from 'node:path';
import { tmpdir } from 'node:os';
import { SimNode } from '../support/sim.ts';
import { NotifySocket } from '../support/notify-socket.ts';
import { LIBRARY_NAME, buildFakeNvml } from '../fake-nvml/build.ts';
import { sockaddrUn, watchdogInterval } from '../../src/system/notify.ts';

for (const kind of ['path', 'abstract'] as const) {
  test(
    `READY=1 once registered, STATUS with device counts, ` +
      `WATCHDOG=1, STOPPING=1 on stop, in that order (${kind} socket)`,
    async () => {
      const name = `gdp-notify-${process.pid}-${Date.now()}`;
      const sock = new NotifySocket(kind === 'path' ? join(tmpdir(), `${name}.sock`) : `@${name}`);
      const node = await SimNode.start({
        topology: 'demo-8',
        env: { NOTIFY_SOCKET: sock.path, WATCHDOG_USEC: '200000' },
      });
      try {
        await sock.waitFor(/READY=1/);
        await node.plugin.waitForLine(/watching GPU health/);
        const ready = sock.messages.findIndex((m) => /READY=1/.test(m));
        assert.match(sock.messages[ready]!, /STATUS=registered; 8 of 8 GPUs healthy/);
        assert.ok(
          sock.messages.slice(0, ready).every((m) => !/READY=1/.test(m)),
          'READY=1 sent once',
        );
        assert.match(sock.messages[0]!, /^STATUS=starting/);
        await new Promise((r) => setTimeout(r, 350));
        assert.ok(
          sock.messages.filter((m) => m === 'WATCHDOG=1').length >= 2,
          `watchdog fed every WATCHDOG_USEC/2: ${JSON.stringify(sock.messages)}`,
        );
        node.nvml('xid 1 79');
        await sock.waitFor(/STATUS=registered; 7 of 8 GPUs healthy/);
        node.plugin.signal('SIGTERM');
        assert.equal((await node.plugin.exited).code, 0);
        await sock.waitFor(/STOPPING=1/);
        const last = sock.messages.filter((m) => m !== 'WATCHDOG=1').at(-1);
        assert.match(last ?? '', /^STOPPING=1/);
        assert.equal(sock.messages.filter((m) => /READY=1/.test(m)).length, 1);
      } finally {
        sock.close();
        await node.stop();
      }
    },
  );
}

test(
  'without a kubelet, READY=1 still comes (within 10 s) ' + 'saying what it waits for, so a start never blocks apt',
  async () => {
    const sock = new NotifySocket(`@gdp-notify-nok-${process.pid}-${Date.now()}`);
    const node = await SimNode.start({ topology: 'demo-8', kubelet: false, env: { NOTIFY_SOCKET: sock.path } });
    try {
      const ready = await sock.waitFor(/READY=1/, 20000);
      assert.match(ready, /STATUS=waiting for the kubelet; retrying/);
      assert.equal(node.plugin.exit, undefined);
    } finally {
      sock.close();
      await node.stop();
    }
  },
);

test('STATUS says "registered" only while registered: a kubelet restart flips it to waiting, then back', async () => {
  const sock = new NotifySocket(`@gdp-notify-lost-${process.pid}-${Date.now()}`);
  const node = await SimNode.start({ topology: 'demo-8', env: { NOTIFY_SOCKET: sock.path } });
  try {
    await sock.waitFor(/READY=1\nSTATUS=registered; 8 of 8 GPUs healthy/);
    const before = sock.messages.length;
    await node.kubelet!.restart({ downMs: 1500 });
    await node.kubelet!.waitForRegistrations(2);
    await sock.waitFor(/^STATUS=registered; 8 of 8 GPUs healthy$/, 10000, before);
    const statuses = sock.messages.slice(before).filter((m) => m.startsWith('STATUS='));
    const lost = statuses.indexOf('STATUS=waiting for the kubelet; 8 of 8 GPUs healthy');
    assert.ok(lost >= 0, `no STATUS=waiting after the kubelet went: ${JSON.stringify(statuses)}`);
    assert.match(statuses.at(-1) ?? '', /^STATUS=registered/);
  } finally {
    sock.close();
    await node.stop();
  }
});

test('sockaddr_un and WATCHDOG_USEC are read as systemd writes them', () => {
  const a = sockaddrUn('/run/systemd/notify');
  assert.equal(a.readUInt16LE(0), 1);
  assert.equal(a.toString('utf8', 2, a.length - 1), '/run/systemd/notify');
  assert.equal(a[a.length - 1], 0);
  const b = sockaddrUn('@abstract');
  assert.equal(b[2], 0);
  assert.equal(b.toString('utf8', 3), 'abstract');
  assert.throws(() => sockaddrUn(`/${'x'.repeat(200)}`), /longer than a unix socket path/);
  assert.equal(watchdogInterval({ WATCHDOG_USEC: '30000000' }, 42), 30000);
  assert.equal(watchdogInterval({ WATCHDOG_USEC: '30000000', WATCHDOG_PID: '7' }, 42), null);
  assert.equal(watchdogInterval({ WATCHDOG_USEC: '30000000', WATCHDOG_PID: '42' }, 42), 30000);
  assert.equal(watchdogInterval({}, 42), null);
});

test(
  'with --fail-on-init-error=false (as the packaged service runs) and no driver: READY, STATUS says ' +
    'it waits for the NVIDIA driver, and the same process registers the GPUs once the driver appears',
  async () => {
    const sock = new NotifySocket(`@gdp-notify-nodriver-${process.pid}-${Date.now()}`);
    // The loader's directory exists from the start (glibc remembers a missing one as missing).
    const node = await SimNode.start({
      topology: 'demo-8',
      nvml: 'none',
      waitRegistered: false,
      args: ['--fail-on-init-error=false'],
      env: { NOTIFY_SOCKET: sock.path },
      beforePlugin: async (n) => {
        mkdirSync(join(n.dir, 'no-nvml'));
      },
    });
    try {
      await node.plugin.waitForLine(/WARN NVML is not available; retrying \(fail-on-init-error is false\)/);
      await sock.waitFor(/STATUS=waiting for the NVIDIA driver \(NVML cannot be loaded yet\); retrying/);
      assert.doesNotMatch(sock.messages.join('\n'), /waiting for the kubelet/);
      // The driver is installed: the library appears where the loader looks.
      const { current } = await buildFakeNvml();
      copyFileSync(join(current, LIBRARY_NAME), join(node.dir, 'no-nvml', LIBRARY_NAME));
      // The next retry finds it: up to MAX_BACKOFF_MS after the last one (the retries back off while the driver is
      // missing, further on a loaded machine where the copy comes late), then the registration.
      await node.kubelet!.waitForDevices(
        (d) => d.length === 8 && d.every((x) => x.health === 'Healthy'),
        'nvidia.com/gpu',
        MAX_BACKOFF_MS + 30000,
      );
      await sock.waitFor(/STATUS=registered; 8 of 8 GPUs healthy/, 10000);
      assert.equal(node.plugin.exit, undefined, 'one process all along');
      assert.equal(sock.messages.filter((m) => /READY=1/.test(m)).length, 1);
    } finally {
      sock.close();
      await node.stop();
    }
  },
);
