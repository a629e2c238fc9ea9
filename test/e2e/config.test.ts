// End-to-end: the config file, device-list strategies and time-slicing, through the built executable
// on a simulated node (fake NVML + kubelet stand-in), over real gRPC; and SIGHUP reloads.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import * as grpc from '@grpc/grpc-js';
import { execFileSync } from 'node:child_process';
import { copyFileSync, existsSync, mkdirSync, mkdtempSync, rmSync, statSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { SimNode } from '../support/sim.ts';
import { LIBRARY_NAME, buildFakeNvml } from '../fake-nvml/build.ts';
import type * as M from '../../src/api/messages.ts';

const FIXTURES = join(import.meta.dirname, '..', 'fixtures', 'config');

/** A folder for config files, removed by the caller. */
function configDir(): string {
  return mkdtempSync(join(tmpdir(), 'gdp-config-'));
}

const grpcCode = (err: unknown): number | undefined => (err as { code?: number }).code;
const healthOf = (d: readonly M.Device[]): string => d.map((x) => (x.health === 'Healthy' ? 'H' : 'U')).join('');

test('volume-mounts with the index strategy: the exact Allocate response', async () => {
  const node = await SimNode.start({
    topology: 'demo-8',
    args: ['--device-list-strategy=volume-mounts', '--device-id-strategy=index'],
  });
  try {
    const u = node.topology.gpus.map((g) => g.uuid);
    const res = await node.kubelet!.allocate({ container_requests: [{ devices_ids: [u[5]!, u[2]!] }] });
    assert.deepEqual(res.container_responses, [
      {
        envs: { NVIDIA_VISIBLE_DEVICES: '/var/run/nvidia-container-devices' },
        mounts: [
          { container_path: '/var/run/nvidia-container-devices/5', host_path: '/dev/null', read_only: true },
          { container_path: '/var/run/nvidia-container-devices/2', host_path: '/dev/null', read_only: true },
        ],
        devices: [],
        annotations: {},
        cdi_devices: [],
      },
    ]);
  } finally {
    await node.stop();
  }
});

test(
  "NVIDIA's config file with only CDI strategies: the annotation " +
    'and cdi_devices, no variable, mounts or device specs',
  async () => {
    const dir = configDir();
    const file = join(dir, 'config.yaml');
    writeFileSync(
      file,
      [
        'version: v1',
        'flags:',
        '  migStrategy: none',
        '  plugin:',
        '    passDeviceSpecs: true',
        '    deviceListStrategy: [cdi-annotations, cdi-cri]',
        '    deviceIDStrategy: uuid',
        '    cdiAnnotationPrefix: cdi.example.org/',
      ].join('\n'),
    );
    const node = await SimNode.start({ topology: 'demo-8', args: ['--config-file', file] });
    try {
      const u = node.topology.gpus.map((g) => g.uuid);
      const res = await node.kubelet!.allocate({
        container_requests: [{ devices_ids: [u[1]!, u[6]!] }, { devices_ids: [u[0]!] }],
      });
      const names = (ids: string[]): string[] => ids.map((id) => `k8s.device-plugin.nvidia.com/gpu=${id}`);
      res.container_responses.forEach((r, i) => {
        const ids = i === 0 ? [u[1]!, u[6]!] : [u[0]!];
        assert.deepEqual(r.envs, {});
        assert.deepEqual(r.mounts, []);
        assert.deepEqual(r.devices, []);
        assert.deepEqual(
          r.cdi_devices,
          names(ids).map((name) => ({ name })),
        );
        const keys = Object.keys(r.annotations);
        assert.equal(keys.length, 1);
        assert.match(
          keys[0]!,
          /^cdi\.example\.org\/nvidia-device-plugin_[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$/,
        );
        assert.equal(r.annotations[keys[0]!], names(ids).join(','));
      });
      assert.notDeepEqual(
        Object.keys(res.container_responses[0]!.annotations),
        Object.keys(res.container_responses[1]!.annotations),
      );
    } finally {
      await node.stop();
      rmSync(dir, { recursive: true, force: true });
    }
  },
);

test(
  "NVIDIA's own config file (YAML and JSON fixtures) starts the " +
    'plugin with 4 replicas per GPU under nvidia.com/gpu.shared',
  async () => {
    for (const name of ['nvidia-v1.yaml', 'nvidia-v1.json']) {
      const node = await SimNode.start({ topology: 'demo-8', env: { CONFIG_FILE: join(FIXTURES, name) } });
      try {
        const k = node.kubelet!;
        assert.deepEqual(
          k.registrations.map((r) => [r.request.resource_name, r.request.endpoint]),
          [['nvidia.com/gpu.shared', 'gpu-device-plugin-gpu.shared.sock']],
        );
        const devices = await k.waitForDevices((d) => d.length === 32, 'nvidia.com/gpu.shared');
        assert.equal(devices[5]!.ID, `${node.topology.gpus[1]!.uuid}::1`);
        assert.ok(
          node.plugin.matching(/config file keys for GPU feature discovery are not used by this plugin/).length === 1,
        );
      } finally {
        await node.stop();
      }
    }
  },
);

test(
  'replicas end to end: IDs advertised, preferred spread, Allocate ' +
    'lists each GPU once, health of a GPU marks all its replicas',
  async () => {
    const dir = configDir();
    const file = join(dir, 'config.json');
    writeFileSync(
      file,
      JSON.stringify({
        version: 'v1',
        sharing: { timeSlicing: { resources: [{ name: 'nvidia.com/gpu', replicas: 4 }] } },
      }),
    );
    const node = await SimNode.start({ topology: 'demo-8', args: ['--config-file', file, '--pass-device-specs'] });
    try {
      const k = node.kubelet!;
      const u = node.topology.gpus.map((g) => g.uuid);
      assert.equal(k.registrations[0]!.request.resource_name, 'nvidia.com/gpu');
      assert.equal(k.registrations[0]!.request.endpoint, 'gpu-device-plugin-gpu.sock');
      const devices = await k.waitForDevices((d) => d.length === 32);
      assert.deepEqual(
        devices.map((d) => d.ID),
        u.flatMap((id) => [0, 1, 2, 3].map((n) => `${id}::${n}`)),
      );
      assert.deepEqual(
        devices.map((d) => d.topology?.nodes.map((x) => x.ID)),
        node.topology.gpus.flatMap((g) => [0, 1, 2, 3].map(() => [g.numaNode])),
      );

      // Distributed (the default): two replicas come from two GPUs, the least used first.
      const ids = devices.map((d) => d.ID);
      const pref = await k.preferred({
        container_requests: [
          {
            available_deviceIDs: ids.filter((id) => !id.startsWith(u[0]!)),
            must_include_deviceIDs: [],
            allocation_size: 2,
          },
        ],
      });
      assert.deepEqual(pref.container_responses[0]!.deviceIDs, [`${u[1]}::0`, `${u[2]}::0`]);

      const res = await k.allocate({
        container_requests: [{ devices_ids: [`${u[3]}::2`, `${u[3]}::0`, `${u[1]}::1`] }],
      });
      // envvar (the default), exactly: the variable, and with --pass-device-specs the GPUs' nodes
      // (the control nodes only where they exist on this host).
      const minors = [3, 1].map((i) => `/dev/nvidia${node.topology.gpus[i]!.minor}`);
      const control = ['/dev/nvidiactl', '/dev/nvidia-uvm', '/dev/nvidia-uvm-tools', '/dev/nvidia-modeset'].filter(
        (p) => existsSync(p),
      );
      assert.deepEqual(res.container_responses, [
        {
          envs: { NVIDIA_VISIBLE_DEVICES: `${u[3]},${u[1]}` },
          mounts: [],
          devices: [...control, ...minors].map((p) => ({ container_path: p, host_path: p, permissions: 'rw' })),
          annotations: {},
          cdi_devices: [],
        },
      ]);

      await node.plugin.waitForLine(/watching GPU health/, 10000);
      node.nvml('xid 2 79');
      const after = await k.waitForDevices((d) => d[8]?.health === 'Unhealthy', 'nvidia.com/gpu', 5000);
      assert.equal(healthOf(after), 'HHHHHHHHUUUUHHHHHHHHHHHHHHHHHHHH');
      // The log comes through another pipe than the list: wait for it, and for any twin written with it.
      await node.plugin.waitForLine(/GPU unhealthy/, 5000);
      await new Promise((res) => setTimeout(res, 200));
      assert.equal(node.plugin.matching(/GPU unhealthy/).length, 1, 'one GPU, one transition, whatever its replicas');
    } finally {
      await node.stop();
      rmSync(dir, { recursive: true, force: true });
    }
  },
);

test(
  'renameByDefault with some GPUs shared: nvidia.com/gpu keeps the others whole, ' +
    'nvidia.com/gpu.shared has the replicas; packed; failRequestsGreaterThanOne',
  async () => {
    const dir = configDir();
    const file = join(dir, 'config.yaml');
    writeFileSync(
      file,
      [
        'version: v1',
        'flags:',
        '  plugin:',
        '    sharedDevicesAllocationPolicy: packed',
        'sharing:',
        '  timeSlicing:',
        '    renameByDefault: true',
        '    failRequestsGreaterThanOne: true',
        '    resources:',
        '    - name: gpu',
        '      replicas: 3',
        '      devices: [0, 1]',
      ].join('\n'),
    );
    const node = await SimNode.start({ topology: 'demo-8', args: ['--config-file', file] });
    try {
      const k = node.kubelet!;
      const u = node.topology.gpus.map((g) => g.uuid);
      await k.waitForRegistrations(2);
      assert.deepEqual(k.registrations.map((r) => [r.request.resource_name, r.request.endpoint]).sort(), [
        ['nvidia.com/gpu', 'gpu-device-plugin-gpu.sock'],
        ['nvidia.com/gpu.shared', 'gpu-device-plugin-gpu.shared.sock'],
      ]);
      assert.ok(existsSync(join(node.kubeletDir, 'gpu-device-plugin-gpu.shared.sock')));
      const whole = await k.waitForDevices((d) => d.length === 6, 'nvidia.com/gpu');
      assert.deepEqual(
        whole.map((d) => d.ID),
        u.slice(2),
      );
      const shared = await k.waitForDevices((d) => d.length === 6, 'nvidia.com/gpu.shared');
      assert.deepEqual(
        shared.map((d) => d.ID),
        [`${u[0]}::0`, `${u[0]}::1`, `${u[0]}::2`, `${u[1]}::0`, `${u[1]}::1`, `${u[1]}::2`],
      );

      // Packed: GPU 1 already has a replica in use, so it is filled first.
      const avail = shared.map((d) => d.ID).filter((id) => id !== `${u[1]}::0`);
      const pref = await k.preferred(
        { container_requests: [{ available_deviceIDs: avail, must_include_deviceIDs: [], allocation_size: 1 }] },
        'nvidia.com/gpu.shared',
      );
      assert.deepEqual(pref.container_responses[0]!.deviceIDs, [`${u[1]}::1`]);

      const one = await k.allocate({ container_requests: [{ devices_ids: [`${u[0]}::2`] }] }, 'nvidia.com/gpu.shared');
      assert.deepEqual(one.container_responses[0]!.envs, { NVIDIA_VISIBLE_DEVICES: u[0] });
      await assert.rejects(
        k.allocate({ container_requests: [{ devices_ids: [`${u[0]}::0`, `${u[1]}::0`] }] }, 'nvidia.com/gpu.shared'),
        (err: unknown) =>
          grpcCode(err) === grpc.status.INVALID_ARGUMENT &&
          new RegExp(
            'container request 0 asks for 2 shared GPU replicas of ' +
              String.raw`nvidia.com\/gpu.shared; failRequestsGreaterThanOne allows 1 per container`,
          ).test((err as Error).message),
      );
      // Whole GPUs on the other resource are not limited.
      const two = await k.allocate({ container_requests: [{ devices_ids: [u[2]!, u[3]!] }] }, 'nvidia.com/gpu');
      assert.equal(two.container_responses[0]!.envs.NVIDIA_VISIBLE_DEVICES, `${u[2]},${u[3]}`);
    } finally {
      await node.stop();
      rmSync(dir, { recursive: true, force: true });
    }
  },
);

test(
  'SIGHUP: a good file re-registers with the new replica count keeping ' +
    'health; a bad one is refused in one line and the running config kept',
  async () => {
    const dir = configDir();
    const file = join(dir, 'config.yaml');
    const replicas = (n: number | string): string =>
      `version: v1\nsharing:\n  timeSlicing:\n    resources:\n    - name: nvidia.com/gpu\n      replicas: ${n}\n`;
    writeFileSync(file, replicas(2));
    const node = await SimNode.start({ topology: 'demo-8', args: ['--config-file', file] });
    try {
      const k = node.kubelet!;
      await k.waitForDevices((d) => d.length === 16);
      await node.plugin.waitForLine(/watching GPU health/, 10000);
      node.nvml('xid 5 79');
      await k.waitForDevices((d) => d[10]?.health === 'Unhealthy', 'nvidia.com/gpu', 5000);

      writeFileSync(file, replicas(4));
      const n = k.registrations.length;
      node.plugin.signal('SIGHUP');
      const reg = await k.waitForRegistrations(n + 1);
      assert.equal(reg.request.resource_name, 'nvidia.com/gpu');
      const devices = await k.waitForDevices((d) => d.length === 32);
      assert.equal(
        healthOf(devices),
        `${'H'.repeat(20)}UUUU${'H'.repeat(8)}`,
        'GPU 5 stays unhealthy, now in all 4 of its replicas',
      );
      await node.plugin.waitForLine(/config reloaded .*changed=sharing/);
      await node.plugin.waitForLine(/registered with the kubelet .*reason="config reloaded"/);

      const before = node.plugin.lines.length;
      writeFileSync(file, replicas(0));
      node.plugin.signal('SIGHUP');
      const line = await node.plugin.waitForLine(/config reload refused/, 5000, before);
      assert.match(
        line,
        /sharing\.timeSlicing\.resources\[0\]\.replicas: 0 is not allowed; expected an integer from 1 to 1024/,
      );
      await new Promise((r) => setTimeout(r, 300));
      const said = node.plugin.lines.slice(before);
      assert.equal(said.filter((l) => /config|SIGHUP/.test(l)).length, 1, `one line: ${said.join('\n')}`);
      assert.equal(said.filter((l) => /registered with the kubelet/.test(l)).length, 0, 'no re-registration');
      assert.equal(k.registrations.length, n + 1, 'registration kept');
      assert.equal(k.devices()?.length, 32, 'running config kept');
      const u = node.topology.gpus.map((g) => g.uuid);
      const res = await k.allocate({ container_requests: [{ devices_ids: [`${u[7]}::3`] }] });
      assert.equal(res.container_responses[0]!.envs.NVIDIA_VISIBLE_DEVICES, u[7]);
      assert.equal(node.plugin.exit, undefined);
    } finally {
      await node.stop();
      rmSync(dir, { recursive: true, force: true });
    }
  },
);

test('SIGHUP: renaming moves the replicas to a new resource and socket, and the old one goes', async () => {
  const dir = configDir();
  const file = join(dir, 'config.yaml');
  writeFileSync(file, 'sharing:\n  timeSlicing:\n    resources: [{name: gpu, replicas: 2}]\n');
  const node = await SimNode.start({ topology: 'demo-8', args: ['--config-file', file] });
  try {
    const k = node.kubelet!;
    await k.waitForDevices((d) => d.length === 16);
    writeFileSync(
      file,
      'sharing:\n  timeSlicing:\n    renameByDefault: true\n    resources: [{name: gpu, replicas: 2}]\n',
    );
    node.plugin.signal('SIGHUP');
    const reg = await k.waitForRegistrations(2);
    assert.equal(reg.request.resource_name, 'nvidia.com/gpu.shared');
    await k.waitForDevices((d) => d.length === 16, 'nvidia.com/gpu.shared');
    await node.plugin.waitForLine(/resource no longer advertised .*resource=nvidia.com\/gpu\b/);
    assert.ok(!existsSync(node.pluginSocket), 'the old socket is removed');
    assert.ok(existsSync(join(node.kubeletDir, 'gpu-device-plugin-gpu.shared.sock')));
  } finally {
    await node.stop();
    rmSync(dir, { recursive: true, force: true });
  }
});

test('SIGHUP without a config file: logs that there is nothing to reload and carries on', async () => {
  const node = await SimNode.start({ topology: 'demo-8' });
  try {
    node.plugin.signal('SIGHUP');
    await node.plugin.waitForLine(/there is no config file to reload/);
    assert.equal(node.plugin.exit, undefined);
    assert.equal(node.kubelet!.registrations.length, 1);
    const u = node.topology.gpus.map((g) => g.uuid);
    await node.kubelet!.allocate({ container_requests: [{ devices_ids: [u[0]!] }] });
  } finally {
    await node.stop();
  }
});

test(
  'bad config at start: exit 2 with the key path; a selection ' +
    'that does not fit the node: exit 2 too, naming the key once',
  async () => {
    const dir = configDir();
    try {
      const bad = join(dir, 'bad.yaml');
      writeFileSync(bad, 'flags:\n  plugin:\n    deviceListStrategy: [envvar, cdi]\n');
      let node = await SimNode.start({ topology: 'demo-8', waitRegistered: false, env: { CONFIG_FILE: bad } });
      try {
        assert.equal((await node.plugin.exited).code, 2);
        assert.match(
          node.plugin.lines.join('\n'),
          new RegExp(
            `config file ${bad}: flags\\.plugin\\.deviceListStrategy: "cdi" \\(in "envvar,cdi"\\) ` +
              `is not allowed; expected one or more of envvar, volume-mounts, cdi-annotations, cdi-cri`,
          ),
        );
      } finally {
        await node.stop();
      }
      const misfit = join(dir, 'misfit.yaml');
      writeFileSync(misfit, 'sharing:\n  timeSlicing:\n    resources: [{name: gpu, replicas: 2, devices: [0, 9]}]\n');
      node = await SimNode.start({ topology: 'demo-8', waitRegistered: false, args: ['--config-file', misfit] });
      try {
        assert.equal((await node.plugin.exited).code, 2);
        const said = node.plugin.matching(/cannot start/);
        assert.equal(said.length, 1, node.plugin.lines.join('\n'));
        assert.match(
          said[0]!,
          new RegExp(
            `cannot start error="config file ${misfit}: ` +
              `sharing\\.timeSlicing\\.resources\\[0\\]\\.devices\\[1\\]: GPU 9 is ` +
              `not on this node \\(its GPUs: indices 0, 1, 2, 3, 4, 5, 6, 7\\)"$`,
          ),
        );
        assert.equal(node.plugin.lines.join('\n').split('GPU 9 is not on this node').length, 2, 'the message once');
        assert.equal(node.kubelet!.registrations.length, 0);
      } finally {
        await node.stop();
      }
      // Two entries sharing one GPU: the same.
      const twice = join(dir, 'twice.yaml');
      writeFileSync(
        twice,
        'sharing:\n  timeSlicing:\n    renameByDefault: true\n    resources:\n      - {name: gpu, ' +
          'replicas: 2, devices: [0, 1]}\n      - {name: gpu, rename: other, replicas: 3, devices: [1]}\n',
      );
      node = await SimNode.start({ topology: 'demo-8', waitRegistered: false, args: ['--config-file', twice] });
      try {
        assert.equal((await node.plugin.exited).code, 2, node.plugin.lines.join('\n'));
        const said = node.plugin.matching(/cannot start/);
        assert.equal(said.length, 1, node.plugin.lines.join('\n'));
        assert.match(said[0]!, new RegExp(`config file ${twice}: sharing\\.timeSlicing\\.resources\\[1\\]`));
        assert.equal(node.kubelet!.registrations.length, 0);
      } finally {
        await node.stop();
      }
      node = await SimNode.start({ topology: 'demo-8', waitRegistered: false, args: ['--gds-enabled'] });
      try {
        assert.equal((await node.plugin.exited).code, 2);
        assert.match(
          node.plugin.lines.join('\n'),
          /--gds-enabled: not supported by this plugin \(NVIDIA's --gds-enabled\)/,
        );
      } finally {
        await node.stop();
      }
    } finally {
      rmSync(dir, { recursive: true, force: true });
    }
  },
);

test(
  'the config file must be a regular file of at most 1 MiB, checked before reading: /dev/zero, ' +
    'a FIFO, a directory and a 2 MB file are refused at once (exit 2) naming the path and the rule',
  async () => {
    const dir = configDir();
    try {
      const fifo = join(dir, 'fifo');
      execFileSync('mkfifo', [fifo]);
      const big = join(dir, 'big.yaml');
      writeFileSync(big, `# ${'x'.repeat(2_000_000)}\nversion: v1\n`);
      for (const [file, what] of [
        ['/dev/zero', 'is a character device'],
        [fifo, 'is a FIFO'],
        [dir, 'is a directory'],
        [big, `is ${statSync(big).size} bytes`],
      ]) {
        const node = await SimNode.start({ topology: 'demo-8', waitRegistered: false, args: ['--config-file', file!] });
        try {
          assert.equal((await node.plugin.exited).code, 2, node.plugin.lines.join('\n'));
          assert.deepEqual(node.plugin.lines, [
            `gpu-device-plugin: config file ${file} ${what}; expected a regular ` +
              `file of at most 1 MiB (1048576 bytes); check --config-file (CONFIG_FILE)`,
          ]);
        } finally {
          await node.stop();
        }
      }
    } finally {
      rmSync(dir, { recursive: true, force: true });
    }
  },
);

test(
  'started without a driver (--fail-on-init-error=false, as the service runs): a config ' +
    'that does not fit the GPUs the driver then shows ends the start with exit 2, once',
  async () => {
    const dir = configDir();
    const misfit = join(dir, 'misfit.yaml');
    writeFileSync(misfit, 'sharing:\n  timeSlicing:\n    resources: [{name: gpu, replicas: 2, devices: [0, 9]}]\n');
    // The loader's directory exists from the start (glibc remembers a missing one as missing).
    const node = await SimNode.start({
      topology: 'demo-8',
      nvml: 'none',
      waitRegistered: false,
      args: ['--fail-on-init-error=false', '--config-file', misfit],
      beforePlugin: async (n) => {
        mkdirSync(join(n.dir, 'no-nvml'));
      },
    });
    try {
      await node.plugin.waitForLine(/WARN NVML is not available; retrying/);
      const { current } = await buildFakeNvml();
      copyFileSync(join(current, LIBRARY_NAME), join(node.dir, 'no-nvml', LIBRARY_NAME));
      assert.equal((await node.plugin.exited).code, 2, node.plugin.lines.join('\n'));
      const said = node.plugin.matching(/GPU 9 is not on this node/);
      assert.equal(said.length, 1, node.plugin.lines.join('\n'));
      assert.match(
        said[0]!,
        new RegExp(
          `ERROR cannot start error="config file ${misfit}: ` +
            `sharing\\.timeSlicing\\.resources\\[0\\]\\.devices\\[1\\]: GPU 9 is not on this node`,
        ),
      );
      assert.equal(node.kubelet!.registrations.length, 0);
    } finally {
      await node.stop();
      rmSync(dir, { recursive: true, force: true });
    }
  },
);

test(
  'started without a driver with time-slicing that names GPUs: it waits for the ' +
    'driver (nothing to check the GPUs against yet), then advertises the replicas',
  async () => {
    const dir = configDir();
    const fits = join(dir, 'fits.yaml');
    writeFileSync(fits, 'sharing:\n  timeSlicing:\n    resources: [{name: gpu, replicas: 2, devices: [0, 1]}]\n');
    const node = await SimNode.start({
      topology: 'demo-8',
      nvml: 'none',
      waitRegistered: false,
      args: ['--fail-on-init-error=false', '--config-file', fits],
      beforePlugin: async (n) => {
        mkdirSync(join(n.dir, 'no-nvml'));
      },
    });
    try {
      await node.plugin.waitForLine(/WARN NVML is not available; retrying/);
      const { current } = await buildFakeNvml();
      copyFileSync(join(current, LIBRARY_NAME), join(node.dir, 'no-nvml', LIBRARY_NAME));
      const u = node.topology.gpus.map((g) => g.uuid);
      const devices = await node.kubelet!.waitForDevices((d) => d.length === 10, 'nvidia.com/gpu', 30000);
      assert.deepEqual(
        devices.map((d) => d.ID).filter((id) => id.includes('::')),
        [`${u[0]}::0`, `${u[0]}::1`, `${u[1]}::0`, `${u[1]}::1`],
      );
      assert.equal(node.plugin.exit, undefined);
      assert.deepEqual(node.plugin.matching(/ERROR|not on this node/), []);
    } finally {
      await node.stop();
      rmSync(dir, { recursive: true, force: true });
    }
  },
);
