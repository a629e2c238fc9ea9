// The operator subcommands, run from the built executable against the fake NVML.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { execFile } from 'node:child_process';
import { mkdirSync, mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { buildFakeNvml } from '../fake-nvml/build.ts';
import { PluginProcess, SimNode, TOPOLOGIES, executable, loadTopology, writeSysfs } from '../support/sim.ts';
import { OPTION_SPECS } from '../../src/config/option-table.ts';
import { KubeletStandIn } from '../support/kubelet.ts';

async function run(
  args: string[],
  topology: string | null,
  extraEnv: Record<string, string> = {},
): Promise<{ status: number | null; stdout: string; stderr: string }> {
  const libs = await buildFakeNvml();
  const dir = mkdtempSync(join(tmpdir(), 'gdp-cli-'));
  // The unit and its environment files are looked for under a root of the test's own: a unit whose
  // sandbox lets the service write where these tests put the kubelet's directory (under /tmp).
  const unitDir = join(dir, 'root', 'etc', 'systemd', 'system');
  mkdirSync(unitDir, { recursive: true });
  writeFileSync(
    join(unitDir, 'gpu-device-plugin.service'),
    `[Service]\nProtectSystem=strict\nReadWritePaths=${tmpdir()}\nRuntimeDirectory=gpu-device-plugin\n`,
  );
  const env: Record<string, string> = {
    PATH: '/nonexistent',
    TMPDIR: dir,
    SYSFS_ROOT: join(dir, 'sys'),
    SYSTEMD_UNIT_ROOT: join(dir, 'root'),
    GPU_DEVICE_PLUGIN_STATE_FILE: join(dir, 'state.json'),
    ...extraEnv,
  };
  if (topology !== null) {
    env.LD_LIBRARY_PATH = libs.current;
    env.FAKE_NVML_CONFIG = join(TOPOLOGIES, `${topology}.json`);
    writeSysfs(join(dir, 'sys'), loadTopology(topology));
  }
  // Asynchronous: the kubelet stand-in lives in this process and must keep answering meanwhile.
  return new Promise((resolve) => {
    execFile(executable(), args, { env, encoding: 'utf8', timeout: 30000 }, (err, stdout, stderr) => {
      const status =
        err === null ? 0 : typeof (err as { code?: unknown }).code === 'number' ? (err as { code: number }).code : null;
      resolve({ status, stdout, stderr });
    });
  });
}

test('info shows the GPUs, the topology matrix as nvidia-smi topo -m does, and the pair scores', async () => {
  const topo = loadTopology('demo-8');
  const r = await run(['info'], 'demo-8');
  assert.equal(r.status, 0, r.stderr);
  for (const g of topo.gpus)
    assert.match(
      r.stdout,
      new RegExp(`${g.uuid}\\s+${g.name}\\s+${g.memoryMiB} MiB\\s+${g.busId}\\s+${g.numaNode}\\s+Healthy`),
    );
  assert.match(r.stdout, /^GPU0 +X +NV1 +NV1 +NV2 +NV2 +SYS +SYS +SYS +0$/m);
  assert.match(r.stdout, /^GPU7 +SYS +SYS +SYS +NV1 +NV2 +NV1 +NV2 +X +1$/m);
  // GPU2–GPU3: two NVLinks and one PCIe switch: 2×100 + 50.
  assert.match(r.stdout, /^GPU2 +120 +220 +- +250 /m);
});

test('info --json is for scripts: GPUs and every pair with NVLinks, NVSwitch, PCIe level and score', async () => {
  const r = await run(['info', '--json'], 'nvswitch-8');
  assert.equal(r.status, 0, r.stderr);
  const j = JSON.parse(r.stdout) as {
    driverVersion: string;
    gpus: { uuid: string; health: string }[];
    topology: ({ nvlinks: number; nvswitch: boolean; pcie: number; score: number; label: string } | null)[][];
  };
  assert.equal(j.gpus.length, 8);
  assert.equal(j.topology[0]![0], null);
  const p = j.topology[0]![5]!;
  assert.equal(p.nvswitch, true, 'NVSwitch fabric seen');
  assert.ok(p.nvlinks > 0, 'GPUs on the switch fabric count as NVLinked');
  assert.equal(p.label, `NV${p.nvlinks}`);
  assert.equal(p.score, p.nvlinks * 100 + 10);
  assert.ok(j.gpus.every((g) => g.health === 'Healthy'));
});

test('info without NVML fails with the reason and what to check', async () => {
  const r = await run(['info'], null);
  assert.equal(r.status, 1);
  assert.match(r.stderr, /cannot load NVML \(libnvidia-ml\.so\.1\).*--driver-root/);
});

test('check passes on a healthy node with a kubelet, and shows where each option came from', async () => {
  const node = await SimNode.start({ topology: 'demo-8', kubelet: false });
  try {
    await node.plugin.kill();
    node.kubelet = await KubeletStandIn.start(node.kubeletDir);
    const r = await run(['check', '--kubelet-socket', node.kubeletSocket], 'demo-8', { DEVICE_ID_STRATEGY: 'index' });
    assert.equal(r.status, 0, r.stdout + r.stderr);
    assert.match(r.stdout, /^PASS {2}config /m);
    assert.match(r.stdout, /^PASS {2}nvml +loaded libnvidia-ml\.so\.1, driver 550\.54\.15$/m);
    assert.match(r.stdout, /^PASS {2}gpus +8 found, all answering NVML$/m);
    assert.match(r.stdout, /^PASS {2}socket directory /m);
    assert.match(r.stdout, /^PASS {2}kubelet +.*kubelet\.sock answers$/m);
    assert.match(r.stdout, /--kubelet-socket=\S+ {2}\(command line\)/);
    assert.match(r.stdout, /--device-id-strategy=index {2}\(environment of this shell; the service does not see it\)/);
    assert.match(r.stdout, /--pass-device-specs=false {2}\(default\)/);
    // This root has a unit of the test's own but not the package's files: the sandboxes are not compared.
    assert.match(r.stdout, /^SKIP {2}sandbox of gpu-device-plugin\.service +the package's .* is not installed/m);
    assert.match(r.stdout, /All checks passed \(1 warning, 2 not checked \(SKIP\)\)\./);
    assert.equal(node.kubelet.registrations.length, 0, 'check registers nothing');
  } finally {
    await node.stop();
  }
});

test(
  'check fails usefully with no NVML, no kubelet and ' + 'a bad option, and exits 2 (a configuration error)',
  async () => {
    const r = await run(
      ['check', '--kubelet-socket', '/nonexistent/dir/kubelet.sock', '--device-id-strategy', 'serial'],
      null,
    );
    assert.equal(r.status, 2);
    assert.match(
      r.stdout,
      /^FAIL {2}config +--device-id-strategy: "serial" is not allowed; expected one of uuid, index — fix: /m,
    );
    assert.match(
      r.stdout,
      /^FAIL {2}nvml +cannot load NVML.* — fix: install the NVIDIA driver, or point --driver-root/m,
    );
    assert.match(r.stdout, /^SKIP {2}gpus +not checked/m);
    assert.match(r.stdout, /^SKIP {2}config fit +not checked against the GPUs: NVML is not available/m);
    assert.match(r.stdout, /^FAIL {2}socket directory /m);
    assert.match(r.stdout, /^FAIL {2}kubelet +.* does not exist — fix: is the kubelet running\?/m);
    assert.match(r.stdout, /4 of \d+ checks failed; .*not checked \(SKIP\)\./);
  },
);

test('check reads the config file and names it as the origin of what it set', async () => {
  const node = await SimNode.start({ topology: 'demo-8', kubelet: false });
  try {
    await node.plugin.kill();
    node.kubelet = await KubeletStandIn.start(node.kubeletDir);
    const cfg = join(TOPOLOGIES, '..', 'config', 'nvidia-v1.yaml');
    const r = await run(['check', '--kubelet-socket', node.kubeletSocket], 'demo-8', { CONFIG_FILE: cfg });
    // The file asks for cdi-annotations and --pass-device-specs: this host has neither a CDI spec nor /dev/nvidia*.
    assert.equal(r.status, 1, r.stdout + r.stderr);
    assert.deepEqual(
      r.stdout
        .split('\n')
        .filter((l) => l.startsWith('FAIL'))
        .map((l) => l.split(/\s{2,}/)[1]),
      ['cdi spec', 'device nodes'],
    );
    assert.match(
      r.stdout,
      new RegExp(`--pass-device-specs=true {2}\\(config file ${cfg.replace(/[.*+?^${}()|[\]\\/]/g, '\\$&')}\\)`),
    );
    assert.match(
      r.stdout,
      /--config-file=\S+nvidia-v1\.yaml {2}\(environment of this shell; the service does not see it\)/,
    );
    assert.doesNotMatch(r.stdout, /=null /);
  } finally {
    await node.stop();
  }
});

test(
  'info with the PodResources socket: which ' + 'namespace/pod/container holds each GPU, replica and other device',
  async () => {
    const dir = mkdtempSync(join(tmpdir(), 'gdp-pods-'));
    const kubelet = await KubeletStandIn.start(dir);
    const socket = join(dir, 'pod-resources.sock');
    await kubelet.servePodResources(socket);
    const u = loadTopology('demo-8').gpus.map((g) => g.uuid);
    kubelet.pods = [
      {
        name: 'train-0',
        namespace: 'ml',
        containers: [
          {
            name: 'trainer',
            devices: [
              { resource_name: 'nvidia.com/gpu', device_ids: [u[3]!, u[5]!], topology: { nodes: [{ ID: 0 }] } },
            ],
          },
        ],
      },
      {
        name: 'notebook',
        namespace: 'default',
        containers: [
          { name: 'jupyter', devices: [{ resource_name: 'nvidia.com/gpu', device_ids: [`${u[1]}::2`] }] },
          { name: 'sidecar', devices: [{ resource_name: 'example.com/nic', device_ids: ['nic0'] }] },
        ],
      },
      {
        name: 'mig-user',
        namespace: 'ml',
        containers: [
          {
            name: 'infer',
            devices: [
              { resource_name: 'nvidia.com/mig-1g.10gb', device_ids: ['MIG-5c4b2a1e-0000-1111-2222-333344445555'] },
            ],
          },
        ],
      },
    ];
    try {
      const r = await run(['info', '--pod-resources-socket', socket], 'demo-8');
      assert.equal(r.status, 0, r.stderr);
      assert.match(r.stdout, /PODS \(namespace\/pod\/container\)/);
      assert.match(r.stdout, new RegExp(`^3 +${u[3]} .* Healthy +ml/train-0/trainer$`, 'm'));
      assert.match(r.stdout, new RegExp(`^5 +${u[5]} .* Healthy +ml/train-0/trainer$`, 'm'));
      assert.match(r.stdout, new RegExp(`^1 +${u[1]} .* Healthy +default/notebook/jupyter \\(replica 2\\)$`, 'm'));
      assert.match(r.stdout, new RegExp(`^0 +${u[0]} .* Healthy +-$`, 'm'));
      assert.match(
        r.stdout,
        /^MIG-5c4b2a1e-0000-1111-2222-333344445555 +nvidia\.com\/mig-1g\.10gb +ml\/mig-user\/infer$/m,
      );
      assert.doesNotMatch(r.stdout, /nic0|sidecar/);

      const j = JSON.parse((await run(['info', '--json', '--pod-resources-socket', socket], 'demo-8')).stdout) as {
        gpus: {
          uuid: string;
          heldBy: { namespace: string; pod: string; container: string; deviceId: string; replica?: number }[];
        }[];
        podResources: { available: boolean; otherDevices: { deviceId: string }[] };
      };
      assert.equal(j.podResources.available, true);
      assert.deepEqual(j.gpus[1]!.heldBy, [
        {
          namespace: 'default',
          pod: 'notebook',
          container: 'jupyter',
          resource: 'nvidia.com/gpu',
          deviceId: `${u[1]}::2`,
          replica: 2,
        },
      ]);
      assert.deepEqual(
        j.gpus[3]!.heldBy.map((h) => `${h.namespace}/${h.pod}/${h.container}`),
        ['ml/train-0/trainer'],
      );
      assert.deepEqual(j.gpus[0]!.heldBy, []);
      assert.deepEqual(
        j.podResources.otherDevices.map((d) => d.deviceId),
        ['MIG-5c4b2a1e-0000-1111-2222-333344445555'],
      );
      assert.equal(kubelet.podListCalls, 2);
    } finally {
      await kubelet.stop();
    }
  },
);

test('info without the PodResources socket says so in one line and shows the rest', async () => {
  const r = await run(['info', '--pod-resources-socket', '/nonexistent/pod-resources/kubelet.sock'], 'demo-8');
  assert.equal(r.status, 0, r.stderr);
  const lines = r.stdout.split('\n').filter((l) => /PodResources/.test(l));
  assert.equal(lines.length, 1);
  assert.match(lines[0]!, /^Pods: not shown; .*\/nonexistent\/pod-resources\/kubelet\.sock does not exist/);
  assert.match(r.stdout, /^GPU7 +SYS/m);
  const j = JSON.parse(
    (await run(['info', '--json', '--pod-resources-socket', '/nonexistent/x.sock'], 'demo-8')).stdout,
  ) as { podResources: { available: boolean; error: string }; gpus: unknown[] };
  assert.equal(j.podResources.available, false);
  assert.match(j.podResources.error, /does not exist/);
  assert.equal(j.gpus.length, 8);
});

test('check tests the directories of the labels and metrics files when they are configured', async () => {
  const dir = mkdtempSync(join(tmpdir(), 'gdp-check-files-'));
  // An installed unit (under the test's root) whose sandbox lets the service write into dir.
  const unitDir = join(dir, 'root', 'etc', 'systemd', 'system');
  mkdirSync(unitDir, { recursive: true });
  writeFileSync(join(unitDir, 'gpu-device-plugin.service'), `[Service]\nProtectSystem=strict\nReadWritePaths=${dir}\n`);
  const r = await run(
    [
      'check',
      '--nfd-features-file',
      join(dir, 'missing', 'gpu-device-plugin'),
      '--metrics-file',
      join(dir, 'gpu-device-plugin.prom'),
    ],
    'demo-8',
    { SYSTEMD_UNIT_ROOT: join(dir, 'root') },
  );
  assert.equal(r.status, 1);
  assert.match(
    r.stdout,
    new RegExp(
      `^FAIL  labels file +${dir}/missing: .*ENOENT.* — fix: is ` +
        `Node Feature Discovery installed\\? create the directory`,
      'm',
    ),
  );
  assert.match(
    r.stdout,
    new RegExp(`^PASS  metrics file +${dir} is writable for the service \\(ReadWritePaths=${dir}\\)$`, 'm'),
  );
  const plain = await run(['check'], 'demo-8');
  assert.doesNotMatch(plain.stdout, /labels file|metrics file {2}/);
});

test(
  'a second plugin in the same socket directory refuses to start in one line naming the ' +
    "first one's PID (exit 3); the first keeps serving, and a crash leaves no stale lock",
  async () => {
    const node = await SimNode.start({ topology: 'demo-8' });
    try {
      const k = node.kubelet!;
      await k.waitForDevices((d) => d.length === 8);
      // As an operator troubleshoots: the same socket, by hand, with debug logging.
      const second = await run(['--kubelet-socket', node.kubeletSocket, '--log-level=debug'], 'demo-8');
      assert.equal(second.status, 3, second.stdout + second.stderr);
      const lines = (second.stdout + second.stderr).split('\n').filter((l) => l !== '');
      assert.equal(lines.length, 1, lines.join('\n'));
      assert.match(
        lines[0]!,
        new RegExp(
          `ERROR another gpu-device-plugin \\(PID ${node.plugin.pid}\\) ` +
            `already serves the socket directory ${node.kubeletDir}; stop it first`,
        ),
      );
      assert.equal(k.registrations.length, 1, 'the first plugin was not made to register again');
      assert.equal(node.plugin.exit, undefined);
      // A plugin killed outright (no clean stop) leaves no lock: the next one starts and registers.
      await node.plugin.kill();
      const again = new PluginProcess(executable(), ['--kubelet-socket', node.kubeletSocket], {
        PATH: '/nonexistent',
        LD_LIBRARY_PATH: (await buildFakeNvml()).current,
        FAKE_NVML_CONFIG: join(TOPOLOGIES, 'demo-8.json'),
        SYSFS_ROOT: node.sysfs,
        TMPDIR: node.dir,
      });
      try {
        await k.waitForRegistrations(2);
        assert.equal(again.exit, undefined, again.lines.join('\n'));
      } finally {
        await again.kill();
      }
    } finally {
      await node.stop();
    }
  },
);

test(
  'durations: 0x10, 1e3 and 5sec are refused (exit 2) saying ' +
    'what is right, 5m is 300 s, and --help shows every range',
  async () => {
    for (const [args, env, re] of [
      [
        ['--health-probe-interval=0x10'],
        {},
        new RegExp(
          '^gpu-device-plugin: --health-probe-interval: "0x10" is not a duration; ' +
            String.raw`expected a decimal number of seconds \(5, 0\.5\) or a duration with ` +
            String.raw`units ms, s, m, h \(500ms, 30s, 5m, 1h30m\), from 0\.05 to 3600 seconds$`,
        ),
      ],
      [
        [],
        { HEALTH_PROBE_INTERVAL: '1e3' },
        /^gpu-device-plugin: environment variable HEALTH_PROBE_INTERVAL: "1e3" is not a duration; /,
      ],
      [
        ['--metrics-interval', '5sec'],
        {},
        /^gpu-device-plugin: --metrics-interval: "5sec" is not a duration; .*from 1 to 3600 seconds$/,
      ],
      [
        ['--socket-check-interval=2h'],
        {},
        new RegExp(
          String.raw`^gpu-device-plugin: --socket-check-interval: "2h" \(7200 ` +
            String.raw`seconds\) is out of range; expected from 0\.1 to 3600 seconds$`,
        ),
      ],
    ] as [string[], Record<string, string>, RegExp][]) {
      const r = await run(['--kubelet-socket', '/nonexistent/kubelet.sock', ...args], null, env);
      assert.equal(r.status, 2, r.stderr);
      assert.equal(r.stderr.split('\n').filter((l) => l !== '').length, 1, r.stderr);
      assert.match(r.stderr.trim(), re);
    }
    const node = await SimNode.start({
      topology: 'demo-8',
      args: ['--health-probe-interval=5m', '--rediscover-interval=1m30s'],
    });
    try {
      const start = await node.plugin.waitForLine(/INFO starting /);
      assert.match(start, / health_probe_interval=300 /);
      assert.match(start, / rediscover_interval=90 /);
    } finally {
      await node.stop();
    }
    const help = await run(['--help'], null);
    assert.equal(help.status, 0);
    for (const s of OPTION_SPECS) {
      if (s.kind.type === 'seconds')
        assert.ok(help.stdout.includes(`--${s.flag} (duration from ${s.kind.min} to ${s.kind.max} seconds`), s.flag);
    }
  },
);

test(
  "the start line gives every option's value in force, " + 'and where each one that is not the default came from',
  async () => {
    const dir = mkdtempSync(join(tmpdir(), 'gdp-start-line-'));
    const cfg = join(dir, 'config.yaml');
    writeFileSync(cfg, 'version: v1\nflags:\n  plugin:\n    passDeviceSpecs: true\n');
    const node = await SimNode.start({
      topology: 'demo-8',
      args: ['--config-file', cfg],
      env: { DEVICE_ID_STRATEGY: 'index' },
    });
    try {
      const start = await node.plugin.waitForLine(/INFO starting /);
      for (const s of OPTION_SPECS) assert.match(start, new RegExp(` ${s.flag.replace(/-/g, '_')}=\\S`), s.flag);
      assert.match(start, / device_id_strategy=index /);
      assert.match(start, / pass_device_specs=true /);
      assert.match(start, / log_level=info /);
      assert.match(
        start,
        new RegExp(
          `set_by="kubelet-socket=command line, device-id-strategy=environment, ` +
            `pass-device-specs=config file ${cfg}, config-file=command line"`,
        ),
      );
    } finally {
      await node.stop();
      rmSync(dir, { recursive: true, force: true });
    }
  },
);

test(
  'info --help and check --help print their usage and exit 0 (check runs ' +
    'nothing); an option before a subcommand says where the subcommand goes',
  async () => {
    const info = await run(['info', '--help'], null);
    assert.equal(info.status, 0, info.stderr);
    assert.match(info.stdout, /^Usage: gpu-device-plugin info \[--json\] \[options\]$/m);
    assert.equal(info.stderr, '');
    const check = await run(['check', '--help'], null);
    assert.equal(check.status, 0, check.stderr);
    assert.match(check.stdout, /^Usage: gpu-device-plugin check \[options\]$/m);
    assert.doesNotMatch(check.stdout, /^(PASS|FAIL) {2}/m, 'no check ran');
    const top = await run(['--help'], null);
    assert.match(top.stdout, /gpu-device-plugin info \[--json\] \[options\]/);
    assert.match(top.stdout, /^Exit status: 0 a clean stop; 1 .*; 2 a configuration error/m);
    const before = await run(['--log-level=debug', 'info'], null);
    assert.equal(before.status, 2);
    assert.equal(
      before.stderr,
      'gpu-device-plugin: the subcommand info goes first, before ' +
        'its options: gpu-device-plugin info --log-level=debug\n',
    );
  },
);
