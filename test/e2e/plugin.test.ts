// End-to-end: the built executable on a simulated node (fake NVML + kubelet stand-in), over real gRPC.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import * as grpc from '@grpc/grpc-js';
import { existsSync, mkdirSync, readFileSync, writeFileSync, unlinkSync } from 'node:fs';
import { connect } from 'node:net';
import { join } from 'node:path';
import { randomBytes } from 'node:crypto';
import { SimNode, removeDirRetrying } from '../support/sim.ts';
import { KubeletStandIn } from '../support/kubelet.ts';

const median = (xs: number[]): number => {
  const s = [...xs].sort((a, b) => a - b);
  return s[Math.floor(s.length / 2)] ?? NaN;
};

function grpcCode(err: unknown): number | undefined {
  return (err as { code?: number }).code;
}

test(
  'registers with the kubelet: version, endpoint, resource, ' + 'options, then the full device list with NUMA nodes',
  async () => {
    const node = await SimNode.start({ topology: 'demo-8' });
    try {
      const k = node.kubelet!;
      const reg = k.registrations[0]!;
      assert.equal(reg.request.version, 'v1beta1');
      assert.equal(reg.request.endpoint, 'gpu-device-plugin-gpu.sock');
      assert.equal(reg.request.resource_name, 'nvidia.com/gpu');
      assert.deepEqual(reg.request.options, { pre_start_required: false, get_preferred_allocation_available: true });
      assert.deepEqual(k.pluginOptions(), { pre_start_required: false, get_preferred_allocation_available: true });
      const devices = await k.waitForDevices((d) => d.length === 8);
      assert.deepEqual(
        devices.map((d) => d.ID),
        node.topology.gpus.map((g) => g.uuid),
      );
      assert.ok(devices.every((d) => d.health === 'Healthy'));
      assert.deepEqual(
        devices.map((d) => d.topology?.nodes.map((n) => n.ID)),
        node.topology.gpus.map((g) => [g.numaNode]),
      );
      assert.ok(existsSync(node.pluginSocket));
      await k.preStart({ devices_ids: [devices[0]!.ID] });
    } finally {
      await node.stop();
    }
  },
);

test(
  'Allocate returns NVIDIA_VISIBLE_DEVICES per container ' + 'in order; device specs with --pass-device-specs',
  async () => {
    const dev = join('/tmp', `gdp-devroot-${process.pid}`);
    mkdirSync(join(dev, 'dev'), { recursive: true });
    writeFileSync(join(dev, 'dev', 'nvidiactl'), '');
    writeFileSync(join(dev, 'dev', 'nvidia-uvm'), '');
    const node = await SimNode.start({ topology: 'demo-8', args: ['--pass-device-specs', '--dev-root', dev] });
    try {
      const k = node.kubelet!;
      const u = node.topology.gpus.map((g) => g.uuid);
      const res = await k.allocate({ container_requests: [{ devices_ids: [u[3]!, u[1]!] }, { devices_ids: [u[0]!] }] });
      assert.equal(res.container_responses.length, 2);
      assert.deepEqual(res.container_responses[0]!.envs, { NVIDIA_VISIBLE_DEVICES: `${u[3]},${u[1]}` });
      assert.deepEqual(res.container_responses[1]!.envs, { NVIDIA_VISIBLE_DEVICES: u[0] });
      const g3 = node.topology.gpus[3]!;
      assert.deepEqual(
        res.container_responses[0]!.devices.map((d) => [d.container_path, d.host_path, d.permissions]),
        [
          ['/dev/nvidiactl', `${dev}/dev/nvidiactl`, 'rw'],
          ['/dev/nvidia-uvm', `${dev}/dev/nvidia-uvm`, 'rw'],
          [`/dev/nvidia${g3.minor}`, `${dev}/dev/nvidia${g3.minor}`, 'rw'],
          [`/dev/nvidia${node.topology.gpus[1]!.minor}`, `${dev}/dev/nvidia${node.topology.gpus[1]!.minor}`, 'rw'],
        ],
      );
    } finally {
      await node.stop();
    }
  },
);

test('bad requests fail with INVALID_ARGUMENT naming the offender, and the daemon carries on', async () => {
  const node = await SimNode.start({ topology: 'demo-8' });
  try {
    const k = node.kubelet!;
    const u = node.topology.gpus.map((g) => g.uuid);
    const bad: [Promise<unknown>, RegExp][] = [
      [
        k.allocate({ container_requests: [{ devices_ids: ['GPU-does-not-exist'] }] }),
        /unknown device ID "GPU-does-not-exist"/,
      ],
      [k.allocate({ container_requests: [{ devices_ids: [u[0]!, u[0]!] }] }), /twice/],
      [k.allocate({ container_requests: [{ devices_ids: [] }] }), /lists no device IDs/],
      [
        k.allocate({ container_requests: [{ devices_ids: Array.from({ length: 10000 }, (_, i) => `GPU-${i}`) }] }),
        /asks for 10000 devices, more than the 8/,
      ],
      [
        k.preferred({
          container_requests: [{ available_deviceIDs: [u[0]!], must_include_deviceIDs: [], allocation_size: 2 }],
        }),
        /larger than the 1 available/,
      ],
      [
        k.preferred({
          container_requests: [
            { available_deviceIDs: [u[0]!, u[1]!], must_include_deviceIDs: [u[2]!], allocation_size: 2 },
          ],
        }),
        /not among the available/,
      ],
      [
        k.preferred({
          container_requests: [{ available_deviceIDs: u, must_include_deviceIDs: [u[0]!, u[1]!], allocation_size: 1 }],
        }),
        /smaller than the 2 must-include/,
      ],
      [
        k.preferred({
          container_requests: [{ available_deviceIDs: ['GPU-x'], must_include_deviceIDs: [], allocation_size: 1 }],
        }),
        /"GPU-x" is not one this plugin advertises/,
      ],
    ];
    for (const [p, re] of bad) {
      await assert.rejects(
        p,
        (err: unknown) => grpcCode(err) === grpc.status.INVALID_ARGUMENT && re.test((err as Error).message),
        String(re),
      );
    }
    const ok = await k.allocate({ container_requests: [{ devices_ids: [u[2]!] }] });
    assert.equal(ok.container_responses[0]!.envs.NVIDIA_VISIBLE_DEVICES, u[2]);
    assert.equal(node.plugin.exit, undefined, 'plugin still running');
    assert.equal(node.kubelet!.registrations.length, 1, 'registration kept');
  } finally {
    await node.stop();
  }
});

test(
  'GetPreferredAllocation answers every container with ' +
    'exactly allocation_size IDs including the must-include ones',
  async () => {
    const node = await SimNode.start({ topology: 'demo-8' });
    try {
      const u = node.topology.gpus.map((g) => g.uuid);
      const res = await node.kubelet!.preferred({
        container_requests: [
          { available_deviceIDs: u, must_include_deviceIDs: [u[5]!], allocation_size: 3 },
          { available_deviceIDs: u.slice(0, 4), must_include_deviceIDs: [], allocation_size: 4 },
        ],
      });
      assert.equal(res.container_responses.length, 2);
      const [a, b] = res.container_responses.map((r) => r.deviceIDs);
      assert.equal(a!.length, 3);
      assert.ok(a!.includes(u[5]!));
      assert.ok(a!.every((id) => u.includes(id)));
      assert.equal(new Set(a).size, 3);
      assert.deepEqual([...b!].sort(), u.slice(0, 4).sort());
    } finally {
      await node.stop();
    }
  },
);

test('no NVML calls are made per RPC: facts are read once at start', async () => {
  // The health watcher's own calls (its start-up, its event wait, its probes) are kept out of the
  // window: wait until it is ready, and probe once an hour.
  const node = await SimNode.start({ topology: 'demo-8', args: ['--health-probe-interval=3600'] });
  try {
    await node.plugin.waitForLine(/watching GPU health/);
    const u = node.topology.gpus.map((g) => g.uuid);
    await node.kubelet!.allocate({ container_requests: [{ devices_ids: [u[0]!] }] });
    const before = await node.nvmlStats();
    for (let i = 0; i < 50; i++) {
      await node.kubelet!.allocate({ container_requests: [{ devices_ids: [u[i % 8]!] }] });
      await node.kubelet!.preferred({
        container_requests: [{ available_deviceIDs: u, must_include_deviceIDs: [], allocation_size: 2 }],
      });
    }
    const after = await node.nvmlStats();
    const perRpc = Object.entries(after.calls).filter(
      ([f, n]) => (before.calls[f] ?? 0) !== n && !/^nvmlEventSetWait/.test(f),
    );
    assert.deepEqual(perRpc, [], 'NVML functions called while serving RPCs');
    assert.ok(before.total > 0, 'the stats do count calls');
  } finally {
    await node.stop();
  }
});

test('re-registers after 200 kubelet restarts in a row, with no growth in open file descriptors', async () => {
  const node = await SimNode.start({ topology: 'demo-8' });
  try {
    const k = node.kubelet!;
    await k.waitForDevices((d) => d.length === 8);
    // Warm up, then take the baseline.
    for (let i = 0; i < 5; i++) {
      await k.restart();
      await k.waitForRegistrations(k.registrations.length + 1);
    }
    const fdBefore = node.plugin.fdCount();
    const lat: number[] = [];
    for (let i = 0; i < 200; i++) {
      const n = k.registrations.length;
      await k.restart();
      const reg = await k.waitForRegistrations(n + 1);
      lat.push(reg.at - reg.socketCreatedAt);
      await k.waitForDevices((d) => d.length === 8);
    }
    // Connections of the stand-in's closed clients go away asynchronously: let them settle. A leak of
    // one descriptor per restart would show as 200 more.
    let fdAfter = node.plugin.fdCount();
    for (let i = 0; i < 30 && fdAfter > fdBefore + 10; i++) {
      await new Promise((r) => setTimeout(r, 100));
      fdAfter = node.plugin.fdCount();
    }
    // One registration per restart; a second one within a restart would reset the kubelet's stream for nothing.
    assert.equal(k.registrations.length, 206);
    assert.ok(fdAfter <= fdBefore + 10, `fds grew from ${fdBefore} to ${fdAfter}`);
    assert.ok(existsSync(node.pluginSocket));
    process.stderr.write(
      `# kubelet restart → re-registered: median ${median(lat).toFixed(2)} ms, ` +
        `worst ${Math.max(...lat).toFixed(2)} ms (of 200; measured, not asserted)\n`,
    );
  } finally {
    await node.stop();
  }
});

test('kubelet absent at start: the plugin waits, logs once, and registers as soon as the kubelet comes', async () => {
  const node = await SimNode.start({ topology: 'demo-8', kubelet: false });
  try {
    await node.plugin.waitForLine(/cannot register with the kubelet yet/);
    await new Promise((r) => setTimeout(r, 1500));
    assert.equal(
      node.plugin.matching(/cannot register with the kubelet yet/).length,
      1,
      'one line per state change, not per retry',
    );
    node.kubelet = await KubeletStandIn.start(node.kubeletDir, { wipe: false });
    await node.kubelet.waitForRegistrations(1, 5000);
    await node.kubelet.waitForDevices((d) => d.length === 8);
  } finally {
    await node.stop();
  }
});

test('our socket deleted behind our back is recreated and re-registered', async () => {
  const node = await SimNode.start({ topology: 'demo-8' });
  try {
    unlinkSync(node.pluginSocket);
    await node.kubelet!.waitForRegistrations(2, 5000);
    assert.ok(existsSync(node.pluginSocket));
  } finally {
    await node.stop();
  }
});

test('a kubelet that refuses the registration is retried with backoff, logged once per state change', async () => {
  const node = await SimNode.start({ topology: 'demo-8', kubelet: false });
  try {
    // A "kubelet" that refuses every Register: a server answering with an error.
    const server = new grpc.Server();
    const { registrationService } = await import('../../src/api/proto.ts');
    let calls = 0;
    server.addService(registrationService(), {
      Register: (_c: unknown, cb: grpc.sendUnaryData<unknown>) => {
        calls++;
        cb({ code: grpc.status.UNKNOWN, details: 'resource already registered' });
      },
    });
    await new Promise<void>((res, rej) =>
      server.bindAsync(`unix://${node.kubeletSocket}`, grpc.ServerCredentials.createInsecure(), (e) =>
        e ? rej(e) : res(),
      ),
    );
    await node.plugin.waitForLine(/resource already registered/, 5000);
    await new Promise((r) => setTimeout(r, 1500));
    assert.ok(calls >= 2, `retried (${calls} calls)`);
    assert.ok(calls < 40, `with backoff, not a busy loop (${calls} calls in ~1.5 s)`);
    assert.equal(node.plugin.matching(/resource already registered/).length, 1);
    server.forceShutdown();
    assert.equal(node.plugin.exit, undefined);
  } finally {
    await node.stop();
  }
});

test(
  'random bytes and half-open connections on our socket ' + 'do not crash the plugin or lose its registration',
  async () => {
    const node = await SimNode.start({ topology: 'demo-8' });
    try {
      for (let i = 0; i < 20; i++) {
        await new Promise<void>((resolve) => {
          const s = connect(node.pluginSocket);
          s.resume(); // read what the server says (its GOAWAY), so its close is seen
          s.on('error', () => resolve());
          s.on('close', () => resolve());
          s.on('connect', () => {
            s.write(randomBytes(1 + i * 500));
            if (i % 2 === 0) s.end();
            else setTimeout(() => s.destroy(), 20);
          });
        });
      }
      const u = node.topology.gpus.map((g) => g.uuid);
      const res = await node.kubelet!.allocate({ container_requests: [{ devices_ids: [u[1]!] }] });
      assert.equal(res.container_responses[0]!.envs.NVIDIA_VISIBLE_DEVICES, u[1]);
      assert.equal(node.kubelet!.registrations.length, 1);
      assert.equal(node.plugin.matching(/unexpected error/).length, 0);
    } finally {
      await node.stop();
    }
  },
);

test('thousands of ListAndWatch streams opened and dropped are released', async () => {
  const node = await SimNode.start({ topology: 'demo-8' });
  try {
    const { devicePluginService } = await import('../../src/api/proto.ts');
    const m = devicePluginService().ListAndWatch;
    // Each stream on its own connection, as a kubelet does after each restart; the connection closes after.
    const once = async (): Promise<void> => {
      const client = new grpc.Client(`unix://${node.pluginSocket}`, grpc.credentials.createInsecure(), {
        'grpc.use_local_subchannel_pool': 1,
      });
      await new Promise<void>((resolve, reject) => {
        const s = client.makeServerStreamRequest(m.path, m.requestSerialize, m.responseDeserialize, {});
        s.on('data', () => {
          s.cancel();
          resolve();
        });
        s.on('error', (e: grpc.ServiceError) => (e.code === grpc.status.CANCELLED ? resolve() : reject(e)));
      });
      client.close();
    };
    const round = async (n: number): Promise<void> => {
      await Promise.all(Array.from({ length: n }, () => once()));
    };
    // Warm up: V8 sizes its heap for the load first; growth after that would be a leak.
    for (let r = 0; r < 20; r++) await round(50);
    await new Promise((r) => setTimeout(r, 300));
    const fdBefore = node.plugin.fdCount();
    const rssBefore = node.plugin.rss().totalKiB;
    for (let r = 0; r < 40; r++) await round(50);
    let fdAfter = node.plugin.fdCount();
    for (let i = 0; i < 30 && fdAfter > fdBefore + 10; i++) {
      await new Promise((r) => setTimeout(r, 100));
      fdAfter = node.plugin.fdCount();
    }
    assert.ok(fdAfter <= fdBefore + 10, `fds ${fdBefore} → ${fdAfter} after 2000 streams`);
    const rssAfter = node.plugin.rss().totalKiB;
    assert.ok(rssAfter < rssBefore + 16 * 1024, `RSS ${rssBefore} → ${rssAfter} KiB after 2000 more streams`);
    // The kubelet's own stream is still open and still served.
    assert.equal(node.kubelet!.devices()?.length, 8);
    const u = node.topology.gpus.map((g) => g.uuid);
    await node.kubelet!.allocate({ container_requests: [{ devices_ids: [u[0]!] }] });
    assert.equal(node.kubelet!.registrations.length, 1);
  } finally {
    await node.stop();
  }
});

test(
  'a rapid-reset flood of streams on one connection ' + 'is cut off by the server without harm to the plugin',
  async () => {
    const node = await SimNode.start({ topology: 'demo-8' });
    try {
      const { devicePluginService } = await import('../../src/api/proto.ts');
      const m = devicePluginService().ListAndWatch;
      const client = new grpc.Client(`unix://${node.pluginSocket}`, grpc.credentials.createInsecure(), {
        'grpc.use_local_subchannel_pool': 1,
      });
      const outcomes = await Promise.all(
        Array.from(
          { length: 500 },
          () =>
            new Promise<string>((resolve) => {
              const s = client.makeServerStreamRequest(m.path, m.requestSerialize, m.responseDeserialize, {});
              s.on('data', () => s.cancel());
              s.on('error', (e: grpc.ServiceError) => resolve(e.code === grpc.status.CANCELLED ? 'cancelled' : 'cut'));
              s.on('end', () => resolve('ended'));
            }),
        ),
      );
      client.close();
      assert.equal(outcomes.length, 500);
      const u = node.topology.gpus.map((g) => g.uuid);
      const res = await node.kubelet!.allocate({ container_requests: [{ devices_ids: [u[4]!] }] });
      assert.equal(res.container_responses[0]!.envs.NVIDIA_VISIBLE_DEVICES, u[4]);
      assert.equal(node.kubelet!.registrations.length, 1);
      assert.equal(node.plugin.exit, undefined);
    } finally {
      await node.stop();
    }
  },
);

test('SIGTERM: stops serving, removes the socket, shuts NVML down and exits 0 within 2 s', async () => {
  const node = await SimNode.start({ topology: 'demo-8' });
  try {
    const t0 = performance.now();
    node.plugin.signal('SIGTERM');
    const exit = await node.plugin.exited;
    const took = performance.now() - t0;
    assert.deepEqual(exit, { code: 0, signal: null });
    assert.ok(took < 2000, `took ${took} ms`);
    assert.ok(!existsSync(node.pluginSocket), 'plugin socket removed');
    assert.equal(node.plugin.matching(/nvmlShutdown failed/).length, 0);
    assert.equal(node.plugin.matching(/\bstopped\b/).length, 1);
  } finally {
    await node.stop();
  }
});

test('SIGINT stops it the same way', async () => {
  const node = await SimNode.start({ topology: 'demo-8' });
  try {
    node.plugin.signal('SIGINT');
    assert.deepEqual(await node.plugin.exited, { code: 0, signal: null });
  } finally {
    await node.stop();
  }
});

test('NVML missing: exits non-zero with one clear line naming the library and what to check', async () => {
  const node = await SimNode.start({ topology: 'demo-8', nvml: 'none', waitRegistered: false });
  try {
    const exit = await node.plugin.exited;
    assert.equal(exit.code, 1);
    const errors = node.plugin.matching(/ERROR/);
    assert.equal(errors.length, 1, errors.join('\n'));
    assert.match(errors[0]!, /libnvidia-ml\.so\.1/);
    assert.match(errors[0]!, /is the NVIDIA driver installed/);
    assert.match(errors[0]!, /--driver-root/);
  } finally {
    await node.stop();
  }
});

test('NVML init failing: exits non-zero naming NVML and its reason', async () => {
  const node = await SimNode.start({ topology: 'init-fails', waitRegistered: false });
  try {
    const exit = await node.plugin.exited;
    assert.equal(exit.code, 1);
    const errors = node.plugin.matching(/ERROR/);
    assert.equal(errors.length, 1, errors.join('\n'));
    assert.match(errors[0]!, /nvmlInit_v2 failed: Driver Not Loaded \(NVML code 9\)/);
  } finally {
    await node.stop();
  }
});

test('fail-on-init-error=false: stays up, retries NVML, and registers once the driver appears', async () => {
  const later = join('/tmp', `gdp-late-${process.pid}.json`);
  const node = await SimNode.start({
    topology: 'demo-8',
    waitRegistered: false,
    args: ['--fail-on-init-error=false'],
    env: { FAKE_NVML_CONFIG: later },
  });
  try {
    await node.plugin.waitForLine(/NVML is not available; retrying/);
    assert.equal(node.kubelet!.registrations.length, 0);
    const { readFileSync } = await import('node:fs');
    writeFileSync(later, readFileSync(node.configPath));
    await node.kubelet!.waitForRegistrations(1, 8000);
    await node.kubelet!.waitForDevices((d) => d.length === 8);
    assert.equal(node.plugin.matching(/NVML is not available/).length, 1, 'logged once');
  } finally {
    await node.stop();
    if (existsSync(later)) unlinkSync(later);
  }
});

test(
  'old driver without the newer symbols: starts, takes ' + 'NUMA nodes from sysfs, logs each missing function once',
  async () => {
    const node = await SimNode.start({ topology: 'demo-8', nvml: 'old' });
    try {
      const devices = await node.kubelet!.waitForDevices((d) => d.length === 8);
      assert.deepEqual(
        devices.map((d) => d.topology?.nodes.map((n) => n.ID)),
        node.topology.gpus.map((g) => [g.numaNode]),
      );
      const missing = node.plugin.matching(/NVML lacks a function/);
      assert.ok(
        missing.some((l) => /nvmlDeviceGetNumaNodeId/.test(l)),
        missing.join('\n'),
      );
      const names = missing.map((l) => /function=(\S+)/.exec(l)?.[1]);
      assert.equal(new Set(names).size, names.length, 'each missing function logged once');
    } finally {
      await node.stop();
    }
  },
);

test(
  '--device-id-strategy index still lists UUIDs to the kubelet ' +
    "(as NVIDIA's plugin does) and passes indices to the runtime",
  async () => {
    const node = await SimNode.start({ topology: 'demo-8', args: ['--device-id-strategy=index'] });
    try {
      const devices = await node.kubelet!.waitForDevices((d) => d.length === 8);
      const u = node.topology.gpus.map((g) => g.uuid);
      assert.deepEqual(
        devices.map((d) => d.ID),
        u,
      );
      const res = await node.kubelet!.allocate({ container_requests: [{ devices_ids: [u[6]!, u[2]!] }] });
      assert.equal(res.container_responses[0]!.envs.NVIDIA_VISIBLE_DEVICES, '6,2');
      const pref = await node.kubelet!.preferred({
        container_requests: [{ available_deviceIDs: u, must_include_deviceIDs: [u[5]!], allocation_size: 2 }],
      });
      assert.ok(
        pref.container_responses[0]!.deviceIDs.every((id) => u.includes(id)),
        'GetPreferredAllocation answers in UUIDs too',
      );
    } finally {
      await node.stop();
    }
  },
);

test('bad options stop the start with the option, the value and what is allowed (exit 2)', async () => {
  const node = await SimNode.start({
    topology: 'demo-8',
    waitRegistered: false,
    args: ['--device-id-strategy=serial'],
  });
  try {
    const exit = await node.plugin.exited;
    assert.equal(exit.code, 2);
    assert.match(
      node.plugin.lines.join('\n'),
      /--device-id-strategy: "serial" is not allowed; expected one of uuid, index/,
    );
  } finally {
    await node.stop();
  }
});

test(
  'the socket directory deleted and re-created under a systemd-style ' +
    'private mount: one clear line, exit 1 to be restarted',
  async () => {
    // What ProtectSystem=strict + ReadWritePaths= do, done by hand: in a mount namespace of its own the
    // plugin sees everything read-only, except its socket directory, bind-mounted onto itself. When the
    // directory is deleted outside (`kubeadm reset`), the kernel drops that mount: the plugin now sees
    // the re-created directory through the read-only mount, and listening there fails with EROFS.
    // (test/system/ does the same under a real systemd.)
    const { spawn } = await import('node:child_process');
    const { mkdtempSync, mkdirSync, rmSync } = await import('node:fs');
    const { tmpdir } = await import('node:os');
    const { executable, TOPOLOGIES } = await import('../support/sim.ts');
    const { buildFakeNvml } = await import('../fake-nvml/build.ts');
    const libs = await buildFakeNvml();
    const root = mkdtempSync(join(tmpdir(), 'gdp-ns-'));
    const dir = join(root, 'device-plugins');
    mkdirSync(dir);
    let kubelet = await KubeletStandIn.start(dir);
    const child = spawn(
      'unshare',
      [
        '--mount',
        '--propagation',
        'private',
        'sh',
        '-c',
        'mount --bind "$0" "$0" && mount -o remount,bind,ro "$0" && mount --bind "$1" "$1" ' +
          '&& mount -o remount,bind,rw "$1" && exec "$2" --kubelet-socket "$1/kubelet.sock"',
        root,
        dir,
        executable(),
      ],
      {
        env: {
          PATH: '/usr/bin:/bin',
          LD_LIBRARY_PATH: libs.current,
          FAKE_NVML_CONFIG: join(TOPOLOGIES, 'demo-8.json'),
          DP_DISABLE_HEALTHCHECKS: 'all',
        },
        stdio: ['ignore', 'ignore', 'pipe'],
      },
    );
    let log = '';
    child.stderr.on('data', (c: Buffer) => {
      log += c.toString();
    });
    const exited = new Promise<number | null>((resolve) => child.on('exit', (code) => resolve(code)));
    try {
      await kubelet.waitForRegistrations(1, 20000);
      await kubelet.stop();
      removeDirRetrying(dir);
      mkdirSync(dir);
      kubelet = await KubeletStandIn.start(dir);
      const code = await Promise.race([exited, new Promise<'timeout'>((r) => setTimeout(() => r('timeout'), 20000))]);
      assert.equal(code, 1, log);
      const lost = log.split('\n').filter((l) => /lost the socket directory/.test(l));
      assert.equal(lost.length, 1, log);
      assert.match(
        lost[0]!,
        new RegExp(
          'ERROR lost the socket directory: the directory was deleted( and re-created)?, and its mount ' +
            "in this process's mount namespace went with it; exiting so that systemd restarts the service",
        ),
      );
      assert.doesNotMatch(log, /^E /m, 'grpc prints nothing of its own');
    } finally {
      child.kill('SIGKILL');
      await kubelet.stop();
      rmSync(root, { recursive: true, force: true });
    }
  },
);

test('without a private mount, a deleted and re-created socket directory is simply used again (no exit)', async () => {
  const { mkdirSync } = await import('node:fs');
  const node = await SimNode.start({ topology: 'demo-8' });
  try {
    await node.kubelet!.stop();
    removeDirRetrying(node.kubeletDir);
    mkdirSync(node.kubeletDir);
    node.kubelet = await KubeletStandIn.start(node.kubeletDir);
    await node.kubelet.waitForDevices((d) => d.length === 8, 'nvidia.com/gpu', 20000);
    assert.equal(node.plugin.exit, undefined, node.plugin.lines.join('\n'));
    assert.equal(node.plugin.matching(/lost the socket directory/).length, 0);
  } finally {
    await node.stop();
  }
});

test(
  'stdout and stderr closed under it (journald or the terminal gone): ' +
    'lines are dropped, the daemon keeps serving and does not spin',
  async () => {
    const node = await SimNode.start({ topology: 'demo-8' });
    try {
      const k = node.kubelet!;
      const u = node.topology.gpus.map((g) => g.uuid);
      await node.plugin.waitForLine(/watching GPU health/);
      node.plugin.child.stdout?.destroy();
      node.plugin.child.stderr?.destroy();
      // Things that log: a GPU going unhealthy, and a reload.
      node.nvml('xid 2 79');
      await k.waitForDevices((d) => d[2]?.health === 'Unhealthy');
      node.plugin.signal('SIGHUP');
      await new Promise((res) => setTimeout(res, 1000));
      const r = await k.allocate({ container_requests: [{ devices_ids: [u[0]!] }] });
      assert.equal(r.container_responses[0]?.envs.NVIDIA_VISIBLE_DEVICES, u[0]);
      // CPU time over 3 s of quiet: an idle daemon uses next to none; a write error logged as an
      // uncaught error (whose logging fails again) would keep a core busy.
      const cpu = (): number => {
        const f = readFileSync(`/proc/${node.plugin.pid}/stat`, 'utf8').split(') ')[1]!.split(' ');
        return (Number(f[11]) + Number(f[12])) / 100;
      };
      const before = cpu();
      await new Promise((res) => setTimeout(res, 3000));
      const used = cpu() - before;
      assert.ok(used < 0.3, `the daemon used ${used.toFixed(2)} s of CPU in 3 s of quiet with its output closed`);
      assert.equal(node.plugin.child.exitCode, null, 'the daemon is still running');
    } finally {
      await node.stop();
    }
  },
);

test(
  'memory a burst of RPCs took is given back once the daemon ' +
    'is quiet, once; an idle daemon does not keep collecting',
  async () => {
    const node = await SimNode.start({ topology: 'demo-8', args: ['--log-level=debug'] });
    try {
      const k = node.kubelet!;
      const u = node.topology.gpus.map((g) => g.uuid);
      await node.plugin.waitForLine(/watching GPU health/);
      // Start-up itself grows the heap: let that settle (one compaction at most) first.
      await new Promise((res) => setTimeout(res, 11000));
      const from = node.plugin.lines.length;
      for (let i = 0; i < 3000; i++) {
        await k.allocate({ container_requests: [{ devices_ids: [u[i % 8]!, u[(i + 3) % 8]!] }] });
        await k.preferred({
          container_requests: [{ available_deviceIDs: u, must_include_deviceIDs: [], allocation_size: 1 + (i % 8) }],
        });
      }
      const line = await node.plugin.waitForLine(/gave memory back after a busy spell/, 20000, from);
      assert.match(line, /rss_before_mib=\d+\.\d rss_mib=\d+\.\d ms=\d+\.\d/);
      const after = node.plugin.lines.length;
      // Two more 5 s checks of a quiet daemon: nothing more to give back, so no more collections.
      await new Promise((res) => setTimeout(res, 11000));
      assert.deepEqual(
        node.plugin.lines.slice(after).filter((l) => /gave memory back/.test(l)),
        [],
      );
      const r = await k.allocate({ container_requests: [{ devices_ids: [u[1]!] }] });
      assert.equal(r.container_responses[0]?.envs.NVIDIA_VISIBLE_DEVICES, u[1]);
    } finally {
      await node.stop();
    }
  },
);

test(
  'one registration per kubelet restart, also when the ' + 'restart is answered before the new kubelet socket is there',
  async () => {
    const node = await SimNode.start({ topology: 'demo-8' });
    try {
      const k = node.kubelet!;
      // Our socket's removal is often seen before the kubelet's new socket exists; the registration
      // that answers it must still count as one for the new kubelet. A pause after each lets a second
      // registration for the same restart show up as one more (instead of passing for the next one's).
      for (let i = 0; i < 60; i++) {
        const n = k.registrations.length;
        await k.restart();
        await k.waitForRegistrations(n + 1);
        await new Promise((res) => setTimeout(res, 30));
      }
      // A second registration for a restart would come within milliseconds; leave it time to show.
      await new Promise((res) => setTimeout(res, 500));
      assert.equal(k.registrations.length, 61, 'registrations for 60 restarts (and the start)');
    } finally {
      await node.stop();
    }
  },
);
