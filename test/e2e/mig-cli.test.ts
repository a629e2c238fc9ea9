// `info` and `check` on MIG nodes, from the built executable against the fake NVML: each GPU's MIG
// mode and MIG devices with the resource they go to, validity for the chosen strategy, and the
// mig-minors file that --pass-device-specs needs.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { execFile } from 'node:child_process';
import { mkdtempSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { buildFakeNvml } from '../fake-nvml/build.ts';
import { migUuid, writeMigMinors } from '../support/mig.ts';
import { KubeletStandIn } from '../support/kubelet.ts';
import { TOPOLOGIES, executable, loadTopology, writeSysfs } from '../support/sim.ts';

async function run(
  args: string[],
  opts: { nvml?: 'current' | 'old'; env?: Record<string, string> } = {},
): Promise<{ status: number | null; stdout: string; stderr: string; dir: string }> {
  const libs = await buildFakeNvml();
  const dir = mkdtempSync(join(tmpdir(), 'gdp-mig-cli-'));
  const env: Record<string, string> = {
    PATH: '/nonexistent',
    TMPDIR: dir,
    SYSFS_ROOT: join(dir, 'sys'),
    LD_LIBRARY_PATH: opts.nvml === 'old' ? libs.old : libs.current,
    FAKE_NVML_CONFIG: join(TOPOLOGIES, 'mig-mixed-4.json'),
    ...opts.env,
  };
  writeSysfs(join(dir, 'sys'), loadTopology('mig-mixed-4'));
  return new Promise((resolve) => {
    execFile(executable(), args, { env, encoding: 'utf8', timeout: 30000 }, (err, stdout, stderr) => {
      const status =
        err === null ? 0 : typeof (err as { code?: unknown }).code === 'number' ? (err as { code: number }).code : null;
      resolve({ status, stdout, stderr, dir });
    });
  });
}

const topo = loadTopology('mig-mixed-4');
const mig = (gpu: number, profile: string, gi: number): string => migUuid(topo.gpus[gpu]!.uuid, profile, gi);

test("info shows each GPU's MIG mode and every MIG device with profile, UUID, GI/CI, memory and resource", async () => {
  const r = await run(['info', '--mig-strategy=mixed']);
  assert.equal(r.status, 0, r.stderr);
  assert.match(r.stdout, /^MIG \(resources as advertised with --mig-strategy=mixed\):$/m);
  assert.match(r.stdout, /^0 +enabled +5$/m);
  assert.match(r.stdout, /^2 +disabled +0$/m);
  assert.match(r.stdout, /^3 +enabled +0$/m);
  assert.match(
    r.stdout,
    new RegExp(
      `^0 +2 +1g\\.10gb\\+me +${mig(0, '1g.10gb+me', 3)} +3 +0 +9728 MiB +nvidia\\.com/mig-1g\\.10gb\\.me$`,
      'm',
    ),
  );
  assert.match(r.stdout, new RegExp(`^0 +4 +1c\\.2g\\.20gb +${mig(0, '2g.20gb', 5)} +5 +0 +19968 MiB +-$`, 'm'));
  assert.match(
    r.stdout,
    new RegExp(`^1 +1 +1g\\.20gb +${mig(1, '1g.20gb', 2)} +2 +0 +20096 MiB +nvidia\\.com/mig-1g\\.20gb$`, 'm'),
  );
  assert.match(r.stdout, /^note: GPU 3 .* has MIG enabled but no MIG devices; it is skipped until it has some$/m);
  const single = await run(['info', '--mig-strategy=single']);
  assert.match(single.stdout, /^not valid for --mig-strategy=single: .*GPU 2 has MIG disabled/m);
});

test('info --json carries the MIG modes and devices', async () => {
  const r = await run(['info', '--json', '--mig-strategy=mixed']);
  assert.equal(r.status, 0, r.stderr);
  const j = JSON.parse(r.stdout) as {
    mig: {
      strategy: string;
      modes: ({ current: boolean; pending: boolean } | null)[];
      devices: { uuid: string; parent: number; gi: number; ci: number; profile: string; resource: string | null }[];
    };
  };
  assert.equal(j.mig.strategy, 'mixed');
  assert.deepEqual(j.mig.modes, [
    { current: true, pending: true },
    { current: true, pending: true },
    { current: false, pending: false },
    { current: true, pending: true },
  ]);
  assert.equal(j.mig.devices.length, 9);
  assert.deepEqual(j.mig.devices[2], {
    parent: 0,
    index: 2,
    uuid: mig(0, '1g.10gb+me', 3),
    gi: 3,
    ci: 0,
    giProfileId: 20,
    placementStart: 6,
    placementSize: 1,
    profile: '1g.10gb+me',
    giSlices: 1,
    ciSlices: 1,
    memoryBytes: 9728 * 1048576,
    multiprocessors: 14,
    engines: { copy: 1, decoder: 1, encoder: 0, jpeg: 1, ofa: 1 },
    resource: 'nvidia.com/mig-1g.10gb.me',
  });
  const old = await run(['info', '--json'], { nvml: 'old' });
  assert.equal((JSON.parse(old.stdout) as { mig: unknown }).mig, null);
});

test('check: validity for the strategy, and mig-minors when device specs are on', async () => {
  const mixed = await run(['check', '--mig-strategy=mixed']);
  assert.match(
    mixed.stdout,
    new RegExp(
      String.raw`^PASS +mig +--mig-strategy=mixed: 3 GPUs in MIG mode; nvidia\.com\/mig-1g\.10gb=4, ` +
        String.raw`nvidia\.com\/mig-1g\.10gb\.me=1, nvidia\.com\/mig-2g\.20gb=1, nvidia\.com\/mig-3g\.40gb=1, ` +
        String.raw`nvidia\.com\/mig-1g\.20gb=1; 1 MIG device of profile 1c\.2g\.20gb not advertised`,
      'm',
    ),
  );
  const single = await run(['check', '--mig-strategy=single']);
  // The daemon refuses to start on this node with single: a configuration error (exit 2), in the daemon's words.
  assert.equal(single.status, 2);
  assert.match(
    single.stdout,
    new RegExp(
      '^FAIL +config fit +the daemon refuses to start: --mig-strategy=single needs every GPU in MIG ' +
        'mode .*GPU 3 has MIG enabled but no MIG devices.* — fix: change --mig-strategy, or the GPUs',
      'm',
    ),
  );
  const noMinors = await run(['check', '--mig-strategy=mixed', '--pass-device-specs'], {
    env: { PROC_ROOT: '/nonexistent-proc' },
  });
  assert.match(noMinors.stdout, /^FAIL +mig-minors +cannot read \/nonexistent-proc\/driver\/nvidia-caps\/mig-minors/m);
  assert.match(
    noMinors.stdout,
    new RegExp(
      '^FAIL +config fit +the daemon refuses to start: cannot read ' +
        String.raw`\/nonexistent-proc\/.*--pass-device-specs cannot give MIG devices their capability nodes`,
      'm',
    ),
  );
  assert.equal(noMinors.status, 1, 'the node, not the configuration');
  const proc = mkdtempSync(join(tmpdir(), 'gdp-mig-proc-'));
  writeMigMinors(proc, 4);
  const withMinors = await run(['check', '--mig-strategy=mixed', '--pass-device-specs'], { env: { PROC_ROOT: proc } });
  assert.match(withMinors.stdout, /^PASS +mig-minors +capability nodes found for all 9 MIG devices$/m);
  const old = await run(['check', '--mig-strategy=mixed'], { nvml: 'old' });
  // The daemon starts there (every GPU whole), so this is a warning, not a failure.
  assert.match(
    old.stdout,
    new RegExp(
      '^WARN +mig +--mig-strategy=mixed, but this driver has no MIG functions: ' +
        'every GPU is advertised whole — fix: upgrade the NVIDIA driver',
      'm',
    ),
  );
  const none = await run(['check']);
  assert.doesNotMatch(none.stdout, /^(PASS|FAIL) +mig/m);
});

test('info traces pods holding MIG devices (by MIG UUID and by index ID) to their parent GPU', async () => {
  const dir = mkdtempSync(join(tmpdir(), 'gdp-mig-pods-'));
  const kubelet = await KubeletStandIn.start(dir);
  const socket = join(dir, 'pod-resources.sock');
  await kubelet.servePodResources(socket);
  kubelet.pods = [
    {
      name: 'infer',
      namespace: 'ml',
      containers: [
        { name: 'a', devices: [{ resource_name: 'nvidia.com/mig-1g.20gb', device_ids: [mig(1, '1g.20gb', 2)] }] },
      ],
    },
    {
      name: 'batch',
      namespace: 'ml',
      containers: [{ name: 'b', devices: [{ resource_name: 'nvidia.com/mig-1g.10gb.me', device_ids: ['0:2'] }] }],
    },
  ];
  try {
    const r = await run(['info', '--json', '--mig-strategy=mixed', '--pod-resources-socket', socket]);
    assert.equal(r.status, 0, r.stderr);
    const j = JSON.parse(r.stdout) as {
      gpus: { heldBy: { pod: string; deviceId: string }[] }[];
      podResources: { otherDevices: unknown[] };
    };
    assert.deepEqual(
      j.gpus[1]?.heldBy.map((h) => `${h.pod} ${h.deviceId}`),
      [`infer ${mig(1, '1g.20gb', 2)}`],
    );
    assert.deepEqual(
      j.gpus[0]?.heldBy.map((h) => `${h.pod} ${h.deviceId}`),
      ['batch 0:2'],
    );
    assert.deepEqual(j.podResources.otherDevices, [], 'no MIG device of this node is filed as foreign');
  } finally {
    await kubelet.stop();
  }
});

test('info shows the GPUs dynamic MIG covers, with their free placements beside the instances there', async () => {
  const fixture = { FAKE_NVML_CONFIG: join(TOPOLOGIES, 'mig-dynamic-16.json') };
  const text = await run(['info', '--mig-strategy=mixed'], { env: fixture });
  assert.equal(text.status, 0, text.stderr);
  assert.match(text.stdout, /^Dynamic MIG \(DRA with dra.dynamicMig\): placements free beside the instances there$/m);
  const json = await run(['info', '--json', '--mig-strategy=mixed'], { env: fixture });
  type Row = { gpu: number; uuid: string; profiles: number; free: number; instances: number };
  const p = (JSON.parse(json.stdout) as { mig: { partitionable: Row[] } }).mig.partitionable;
  assert.equal(p.length, 15, 'every GPU in MIG mode, not the one outside it');
  // GPU 0 holds a 3g.20gb at memory slices 0-3: only placements in 4-7 are free (1g×3, 1g+me×3, 1g.10gb×2, 2g, 3g).
  assert.deepEqual([p[0]?.gpu, p[0]?.profiles, p[0]?.free, p[0]?.instances], [0, 7, 10, 1]);
  assert.equal(p[1]?.free, 25, 'a bare A100-40GB offers 25 placements (7 + 3 + 2 + 1 + 1 + 7 + 4)');
});
