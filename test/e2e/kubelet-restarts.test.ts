// End-to-end: the built executable against the kubelet stand-in (real gRPC, the kubelet's blocking
// dial), through kubelet restarts: graceful ones back to back, and ones after the socket directory was
// deleted and re-created.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { existsSync, mkdirSync, rmSync, unlinkSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { dirname, join } from 'node:path';
import { buildFakeNvml } from '../fake-nvml/build.ts';
import { NotifySocket } from '../support/notify-socket.ts';
import { KubeletStandIn } from '../support/kubelet.ts';
import { PluginProcess, SimNode, TOPOLOGIES, executable, removeDirRetrying } from '../support/sim.ts';

const median = (xs: number[]): number => {
  const s = [...xs].sort((a, b) => a - b);
  return s[Math.floor(s.length / 2)] ?? NaN;
};

test(
  '100 graceful kubelet restarts back to back: every ' + 'Register the kubelet gets finds our socket served',
  async () => {
    const node = await SimNode.start({ topology: 'demo-8' });
    try {
      const k = node.kubelet!;
      await k.waitForDevices((d) => d.length === 8);
      const lat: number[] = [];
      const dial: number[] = [];
      for (let i = 0; i < 100; i++) {
        const n = k.registrations.length;
        // The old kubelet removes kubelet.sock; the new one deletes our socket, then serves kubelet.sock.
        await k.restart();
        // Liveness bound only: a registration the kubelet's dial timeout (10 s) ended would show as a
        // rejection below, not as a timeout here.
        const reg = await k.waitForRegistrations(n + 1, 30000);
        lat.push(reg.at - reg.socketCreatedAt);
        dial.push(reg.dialMs);
        await k.waitForDevices((d) => d.length === 8);
        assert.ok(existsSync(node.pluginSocket), `restart ${i + 1}: our socket is there`);
      }
      // A Register whose dial found no socket to connect to within the kubelet's timeout fails: none did.
      assert.deepEqual(
        k.rejected.map((r) => r.reason),
        [],
        'every Register the kubelet received succeeded',
      );
      const u = node.topology.gpus.map((g) => g.uuid);
      const res = await k.allocate({ container_requests: [{ devices_ids: [u[0]!] }] });
      assert.equal(res.container_responses[0]!.envs.NVIDIA_VISIBLE_DEVICES, u[0]);
      process.stderr.write(
        `# graceful restart → re-registered: median ${median(lat).toFixed(1)} ` +
          `ms, worst ${Math.max(...lat).toFixed(1)} ms; ` +
          `the kubelet's dial had to retry ${dial.filter((ms) => ms > 500).length} times, ` +
          `waiting at worst ${Math.max(...dial).toFixed(0)} ms (of 100; measured, not asserted)\n`,
      );
    } finally {
      await node.stop();
    }
  },
);

test(
  'the socket directory deleted and re-created 5 times: ' +
    'every kubelet start after it is seen by the directory watch',
  async () => {
    // The periodic check is an hour away: only the watch can see the kubelet come back.
    const node = await SimNode.start({ topology: 'demo-8', args: ['--socket-check-interval', '3600'] });
    try {
      const k = node.kubelet!;
      await k.waitForDevices((d) => d.length === 8);
      for (let i = 0; i < 5; i++) {
        const n = k.registrations.length;
        await k.stopKubelet();
        removeDirRetrying(node.kubeletDir);
        mkdirSync(node.kubeletDir);
        await k.startKubelet();
        await k.waitForRegistrations(n + 1, 30000);
        await k.waitForDevices((d) => d.length === 8);
      }
      assert.equal(
        node.plugin.matching(/the socket directory was re-created; watching the new one/).length,
        5,
        node.plugin.lines.join('\n'),
      );
      // Then routine restarts, in the directory made last.
      for (let i = 0; i < 3; i++) {
        const n = k.registrations.length;
        await k.restart();
        await k.waitForRegistrations(n + 1, 30000);
      }
      await k.waitForDevices((d) => d.length === 8);
      assert.ok(existsSync(node.pluginSocket));
      assert.equal(node.plugin.exit, undefined);
      assert.equal(node.plugin.matching(/lost the socket directory/).length, 0);
    } finally {
      await node.stop();
    }
  },
);

test('STATUS leaves "registered" as soon as the kubelet goes, and comes back with it', async () => {
  const sock = new NotifySocket(`@gdp-notify-kgone-${process.pid}-${Date.now()}`);
  const node = await SimNode.start({ topology: 'demo-8', env: { NOTIFY_SOCKET: sock.path } });
  try {
    const k = node.kubelet!;
    await sock.waitFor(/READY=1/, 10000);
    await sock.waitFor(/^STATUS=registered/m, 10000);
    // The kubelet stops (its socket removed, its stream closed) and stays away: no wipe, so our
    // socket stays, and nothing but the kubelet's going can tell.
    let from = sock.messages.length;
    await k.stopKubelet();
    await sock.waitFor(/^STATUS=(?!registered)/m, 10000, from);
    from = sock.messages.length;
    await k.startKubelet();
    await k.waitForRegistrations(2);
    await sock.waitFor(/^STATUS=registered/m, 10000, from);
  } finally {
    sock.close();
    await node.stop();
  }
});

test(
  'the kubelet cutting its ListAndWatch stream (its socket ' + 'stays): STATUS says so, and the plugin registers again',
  async () => {
    const sock = new NotifySocket(`@gdp-notify-kcut-${process.pid}-${Date.now()}`);
    const node = await SimNode.start({ topology: 'demo-8', env: { NOTIFY_SOCKET: sock.path } });
    try {
      const k = node.kubelet!;
      await k.waitForDevices((d) => d.length === 8);
      await sock.waitFor(/^STATUS=registered/m, 10000);
      const from = sock.messages.length;
      k.cutStream();
      await k.waitForRegistrations(2);
      await k.waitForDevices((d) => d.length === 8);
      await sock.waitFor(/^STATUS=registered/m, 10000, from);
      const statuses = sock.messages.slice(from).filter((m) => m.startsWith('STATUS='));
      assert.match(
        statuses[0] ?? '',
        /^STATUS=(?!registered)/,
        `the loss was reported before the new registration: ${JSON.stringify(statuses)}`,
      );
      assert.match(
        await node.plugin.waitForLine(
          /registered with the kubelet .*reason="the kubelet closed its ListAndWatch stream"/,
        ),
        /attempts=1/,
      );
    } finally {
      sock.close();
      await node.stop();
    }
  },
);

test(
  'a routine kubelet restart logs one INFO line and no gRPC ' +
    'text; a missing socket directory is said once, as missing',
  async () => {
    const node = await SimNode.start({ topology: 'demo-8' });
    try {
      const k = node.kubelet!;
      await k.waitForDevices((d) => d.length === 8);
      await node.plugin.waitForLine(/watching GPU health/);
      // The health thread's first round says once which signals these V100s lack (row remapping): a
      // start-up line, before the restarts.
      await node.plugin.waitForLine(/GPU health signal not available on this GPU gpu=7 .*signal=row-remap/);
      const start = node.plugin.lines.length;
      for (let i = 0; i < 20; i++) {
        const from = node.plugin.lines.length;
        const n = k.registrations.length;
        await k.restart();
        await k.waitForRegistrations(n + 1);
        // The plugin's own line for it (the kubelet's answer reaches the plugin after the kubelet counted it).
        await node.plugin.waitForLine(/registered with the kubelet/, 10000, from);
        await k.waitForDevices((d) => d.length === 8);
      }
      const lines = node.plugin.lines.slice(start);
      assert.equal(
        lines.filter((l) => / INFO registered with the kubelet /.test(l)).length,
        20,
        'one line per restart',
      );
      assert.deepEqual(
        lines.filter((l) => !/ INFO registered with the kubelet /.test(l)),
        [],
        'and nothing else',
      );
      assert.deepEqual(
        node.plugin.matching(/No connection established|Call cancelled|Resolution note|No address added/),
        [],
      );
    } finally {
      await node.stop();
    }
    const libs = await buildFakeNvml();
    const missing = join(tmpdir(), `gdp-missing-${process.pid}`, 'device-plugins');
    const plugin = new PluginProcess(executable(), ['--kubelet-socket', join(missing, 'kubelet.sock')], {
      PATH: '/nonexistent',
      LD_LIBRARY_PATH: libs.current,
      FAKE_NVML_CONFIG: join(TOPOLOGIES, 'demo-8.json'),
      DP_DISABLE_HEALTHCHECKS: 'all',
    });
    try {
      const line = await plugin.waitForLine(/cannot register with the kubelet yet/);
      assert.match(line, /^\S+ WARN .*error="the socket directory \S+ does not exist/);
      // The directory and a kubelet come: the plugin's retries (each one looks again) find them.
      mkdirSync(missing, { recursive: true });
      const kubelet = await KubeletStandIn.start(missing, { wipe: false });
      try {
        await kubelet.waitForRegistrations(1, 20000);
      } finally {
        await kubelet.stop();
      }
      const aboutIt = plugin.lines.filter(
        (l) => l.includes(missing) && !/ INFO (starting|registered with the kubelet) /.test(l),
      );
      assert.equal(aboutIt.length, 1, plugin.lines.join('\n'));
      assert.equal(aboutIt[0]!.split(missing).length - 1, 1, 'the directory is named once in the line');
      assert.deepEqual(plugin.matching(/permission denied|EACCES/), []);
    } finally {
      await plugin.kill();
      rmSync(dirname(missing), { recursive: true, force: true });
    }
  },
);

test(
  'our socket replaced after the kubelet connected for our ' +
    'Register, before its answer: the plugin registers again',
  async () => {
    const node = await SimNode.start({ topology: 'demo-8', args: ['--log-level', 'debug'] });
    try {
      const k = node.kubelet!;
      await k.waitForDevices((d) => d.length === 8);
      let release: (() => void) | undefined;
      const held = new Promise<void>((resolve) => {
        k.holdRegister = () => {
          k.holdRegister = undefined;
          resolve();
          return new Promise<void>((r) => {
            release = r;
          });
        };
      });
      // The kubelet cuts its stream: the plugin registers again, and the kubelet holds that Register
      // with its new stream open on our server.
      k.cutStream();
      await within(held, 15000, "the plugin's Register after the cut stream");
      await k.waitForDevices((d) => d.length === 8);
      const n = k.registrations.length;
      const broken = new Promise<void>((resolve) => k.once('stream-broken', () => resolve()));
      const from = node.plugin.lines.length;
      // Our socket deleted now: the plugin serves a new one at once, which cuts the kubelet's stream.
      unlinkSync(node.pluginSocket);
      await node.plugin.waitForLine(/DEBUG serving /, 10000, from);
      await within(broken, 15000, "the kubelet's stream cut by our new server");
      release!();
      // The held Register succeeds, but the stream it opened is gone: the plugin must register again.
      await k.waitForRegistrations(n + 2, 15000);
      await k.waitForDevices((d) => d.length === 8);
      assert.deepEqual(
        k.registrations.slice(n).map((r) => r.request.endpoint),
        ['gpu-device-plugin-gpu.sock', 'gpu-device-plugin-gpu.sock'],
      );
    } finally {
      await node.stop();
    }
  },
);

/** The promise, or a failure naming what never happened (so a test fails instead of hanging). */
function within<T>(p: Promise<T>, ms: number, what: string): Promise<T> {
  let timer: NodeJS.Timeout | undefined;
  const late = new Promise<never>((_, reject) => {
    timer = setTimeout(() => reject(new Error(`${what}: not within ${ms} ms`)), ms);
  });
  return Promise.race([p, late]).finally(() => clearTimeout(timer));
}
