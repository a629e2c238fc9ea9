// IMEX channels end to end: the built executable, a dev root with (or without) the channel's device
// node, and the kubelet stand-in's Allocate over real gRPC; info and check show the channels.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { execFile } from 'node:child_process';
import { mkdirSync, mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { buildFakeNvml } from '../fake-nvml/build.ts';
import { SimNode, TOPOLOGIES, executable, loadTopology, writeSysfs } from '../support/sim.ts';

/** A dev root with /dev/nvidiactl and, when asked, IMEX channel 0. */
function devRoot(withChannel: boolean): string {
  const root = mkdtempSync(join(tmpdir(), 'gdp-imex-'));
  mkdirSync(join(root, 'dev', 'nvidia-caps-imex-channels'), { recursive: true });
  writeFileSync(join(root, 'dev', 'nvidiactl'), '');
  if (withChannel) writeFileSync(join(root, 'dev', 'nvidia-caps-imex-channels', 'channel0'), '');
  return root;
}

async function run(
  args: string[],
  env: Record<string, string>,
): Promise<{ status: number | null; stdout: string; stderr: string }> {
  const libs = await buildFakeNvml();
  const dir = mkdtempSync(join(tmpdir(), 'gdp-imex-cli-'));
  writeSysfs(join(dir, 'sys'), loadTopology('demo-8'));
  return new Promise((resolve) => {
    execFile(
      executable(),
      args,
      {
        env: {
          PATH: '/nonexistent',
          TMPDIR: dir,
          SYSFS_ROOT: join(dir, 'sys'),
          LD_LIBRARY_PATH: libs.current,
          FAKE_NVML_CONFIG: join(TOPOLOGIES, 'demo-8.json'),
          ...env,
        },
        encoding: 'utf8',
        timeout: 30000,
      },
      (err, stdout, stderr) => {
        rmSync(dir, { recursive: true, force: true });
        resolve({
          status:
            err === null
              ? 0
              : typeof (err as { code?: unknown }).code === 'number'
                ? (err as { code: number }).code
                : null,
          stdout,
          stderr,
        });
      },
    );
  });
}

test('channel 0 present: every container gets NVIDIA_IMEX_CHANNELS, the CDI device and the device spec', async () => {
  const dev = devRoot(true);
  const node = await SimNode.start({
    topology: 'demo-8',
    args: ['--dev-root', dev, '--pass-device-specs', '--device-list-strategy', 'envvar,cdi-cri'],
    env: { IMEX_CHANNEL_IDS: '0', IMEX_REQUIRED: 'true' },
  });
  try {
    assert.equal(
      node.plugin.matching(/IMEX channels passed to every container.*channels=0/).length,
      1,
      node.plugin.lines.join('\n'),
    );
    const u = node.topology.gpus.map((g) => g.uuid);
    const res = await node.kubelet!.allocate({
      container_requests: [{ devices_ids: [u[2]!] }, { devices_ids: [u[5]!] }],
    });
    for (const [i, c] of res.container_responses.entries()) {
      const gpu = i === 0 ? node.topology.gpus[2]! : node.topology.gpus[5]!;
      assert.deepEqual(c.envs, { NVIDIA_VISIBLE_DEVICES: gpu.uuid, NVIDIA_IMEX_CHANNELS: '0' });
      assert.deepEqual(
        c.cdi_devices.map((d) => d.name),
        [`k8s.device-plugin.nvidia.com/gpu=${gpu.uuid}`, 'k8s.device-plugin.nvidia.com/imex-channel=0'],
      );
      assert.deepEqual(
        c.devices.map((d) => [d.container_path, d.host_path, d.permissions]),
        [
          ['/dev/nvidiactl', `${dev}/dev/nvidiactl`, 'rw'],
          [`/dev/nvidia${gpu.minor}`, `${dev}/dev/nvidia${gpu.minor}`, 'rw'],
          ['/dev/nvidia-caps-imex-channels/channel0', `${dev}/dev/nvidia-caps-imex-channels/channel0`, 'rw'],
        ],
      );
    }
  } finally {
    await node.stop();
    rmSync(dev, { recursive: true, force: true });
  }
});

test('channel 0 missing: skipped with a warning naming the device node; the plugin serves without it', async () => {
  const dev = devRoot(false);
  const node = await SimNode.start({ topology: 'demo-8', args: ['--dev-root', dev, '--imex-channel-ids', '0'] });
  try {
    const warn = node.plugin.matching(/IMEX channel skipped/);
    assert.equal(warn.length, 1, node.plugin.lines.join('\n'));
    assert.ok(warn[0]!.includes(`${dev}/dev/nvidia-caps-imex-channels/channel0 does not exist`), warn.join('\n'));
    const u = node.topology.gpus[0]!.uuid;
    const res = await node.kubelet!.allocate({ container_requests: [{ devices_ids: [u] }] });
    assert.deepEqual(res.container_responses[0]!.envs, { NVIDIA_VISIBLE_DEVICES: u });
  } finally {
    await node.stop();
    rmSync(dev, { recursive: true, force: true });
  }
});

test(
  'channel 0 missing with --imex-required: the start stops ' + '(exit 1) saying which node and why; nothing registers',
  async () => {
    const dev = devRoot(false);
    const node = await SimNode.start({
      topology: 'demo-8',
      waitRegistered: false,
      args: ['--dev-root', dev],
      env: { IMEX_CHANNEL_IDS: '0', IMEX_REQUIRED: 'true' },
    });
    try {
      const exit = await node.plugin.exited;
      assert.deepEqual(exit, { code: 1, signal: null });
      const line = node.plugin.matching(/cannot start/)[0] ?? '';
      assert.ok(
        line.includes(
          `IMEX channel 0: ${dev}/dev/nvidia-caps-imex-channels/channel0 does not exist, and --imex-required is set`,
        ),
        node.plugin.lines.join('\n'),
      );
      assert.equal(node.kubelet!.registrations.length, 0);
    } finally {
      await node.stop();
      rmSync(dev, { recursive: true, force: true });
    }
  },
);

test('an IMEX channel list other than [] or [0] stops the start with exit 2, naming what is allowed', async () => {
  const r = await run(['--imex-channel-ids', '0,1'], {});
  assert.equal(r.status, 2);
  assert.match(r.stderr, /--imex-channel-ids: "0,1" is not allowed; only \[0\] or none \(empty\) is supported/);
});

test('info and check show the channels: present, missing, or none configured', async () => {
  const dev = devRoot(true);
  const missing = devRoot(false);
  try {
    const none = await run(['info'], {});
    assert.equal(none.status, 0, none.stderr);
    assert.match(none.stdout, /^IMEX channels: none configured \(--imex-channel-ids\)$/m);
    const present = await run(['info', '--imex-channel-ids=0', '--dev-root', dev], {});
    assert.equal(present.status, 0, present.stderr);
    assert.match(present.stdout, /^IMEX channels: 0 configured$/m);
    assert.match(
      present.stdout,
      /^ {2}channel 0 {2}\/dev\/nvidia-caps-imex-channels\/channel0 {2}present: passed to every container$/m,
    );
    const json = await run(['info', '--json', '--dev-root', missing], { IMEX_CHANNEL_IDS: '0', IMEX_REQUIRED: 'true' });
    assert.equal(json.status, 0, json.stderr);
    assert.deepEqual((JSON.parse(json.stdout) as { imex: unknown }).imex, {
      configured: [0],
      required: true,
      channels: [],
      missing: [`IMEX channel 0: ${missing}/dev/nvidia-caps-imex-channels/channel0 does not exist`],
    });

    const ok = await run(['check', '--imex-channel-ids=0', '--dev-root', dev], {});
    assert.match(
      ok.stdout,
      new RegExp(`^PASS {2}imex +channel 0 present under ${dev}; passed to every container$`, 'm'),
    );
    assert.match(ok.stdout, /--imex-channel-ids=0 {2}\(command line\)/);
    const bad = await run(['check', '--imex-channel-ids=0', '--imex-required', '--dev-root', missing], {});
    assert.equal(bad.status, 1);
    assert.match(
      bad.stdout,
      new RegExp(
        `^FAIL {2}imex +IMEX channel 0: ${missing}/dev/nvidia-caps-imex-channels/channel0 does ` +
          `not exist: the plugin will not start \\(--imex-required\\) — fix: start the IMEX daemon`,
        'm',
      ),
    );
    assert.match(bad.stdout, /--imex-required=true {2}\(command line\)/);
  } finally {
    rmSync(dev, { recursive: true, force: true });
    rmSync(missing, { recursive: true, force: true });
  }
});
