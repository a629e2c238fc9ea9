// End-to-end MIG: the built executable on simulated MIG nodes (fake NVML with MIG, kubelet stand-in,
// real gRPC): the strategies on uniform, mixed and empty layouts with exact resource names, IDs and
// socket files; Allocate with index IDs and device specs; per-MIG-device health; the preferred
// choice; the old driver without MIG symbols.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { existsSync, mkdirSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { migUuid, writeMigMinors } from '../support/mig.ts';
import { SimNode, loadTopology } from '../support/sim.ts';
import { onFileChange, waitUntil } from '../support/wait.ts';

const MIXED = loadTopology('mig-mixed-4');
const UNIFORM = loadTopology('mig-uniform-2');

const g = (topo: typeof MIXED, i: number): string => topo.gpus[i]!.uuid;

async function waitResources(node: SimNode, n: number): Promise<Map<string, string[]>> {
  await node.kubelet!.waitForRegistrations(n, 15000);
  const out = new Map<string, string[]>();
  for (const r of node.kubelet!.registrations) {
    const name = r.request.resource_name;
    const devices = await node.kubelet!.waitForDevices((d) => d.length > 0, name);
    out.set(
      name,
      devices.map((d) => d.ID),
    );
  }
  return out;
}

test(
  'mixed: one resource and socket per full profile, ' + 'MIG-disabled GPUs whole, sub-instances and empty GPUs skipped',
  async () => {
    const node = await SimNode.start({
      topology: 'mig-mixed-4',
      args: ['--mig-strategy', 'mixed'],
      waitRegistered: false,
    });
    try {
      const resources = await waitResources(node, 6);
      assert.deepEqual(Object.fromEntries(resources), {
        'nvidia.com/gpu': [g(MIXED, 2)],
        'nvidia.com/mig-1g.10gb': [
          migUuid(g(MIXED, 0), '1g.10gb', 1),
          migUuid(g(MIXED, 0), '1g.10gb', 2),
          migUuid(g(MIXED, 1), '1g.10gb', 3),
          migUuid(g(MIXED, 1), '1g.10gb', 4),
        ],
        'nvidia.com/mig-1g.10gb.me': [migUuid(g(MIXED, 0), '1g.10gb+me', 3)],
        'nvidia.com/mig-1g.20gb': [migUuid(g(MIXED, 1), '1g.20gb', 2)],
        'nvidia.com/mig-2g.20gb': [migUuid(g(MIXED, 0), '2g.20gb', 4)],
        'nvidia.com/mig-3g.40gb': [migUuid(g(MIXED, 1), '3g.40gb', 1)],
      });
      for (const r of node.kubelet!.registrations) {
        const file = `gpu-device-plugin-${r.request.resource_name.slice('nvidia.com/'.length)}.sock`;
        assert.equal(r.request.endpoint, file);
        assert.ok(existsSync(join(node.kubeletDir, file)), file);
      }
      const numa = node.kubelet!.devices('nvidia.com/mig-1g.10gb')!.map((d) => d.topology?.nodes[0]?.ID);
      assert.deepEqual(numa, [0, 0, 0, 0], "the parent's NUMA node");
      assert.match(node.plugin.matching(/MIG note=/).join('\n'), /1 MIG device of profile 1c\.2g\.20gb not advertised/);
      assert.match(
        node.plugin.matching(/MIG note=/).join('\n'),
        new RegExp(`GPU 3 \\(${g(MIXED, 3)}\\) has MIG enabled but no MIG devices`),
      );
    } finally {
      await node.stop();
    }
  },
);

test('single on a uniform node: every MIG device as nvidia.com/gpu, by UUID or <gpu>:<mig>', async () => {
  for (const [ids, expected] of [
    [
      'uuid',
      [
        migUuid(g(UNIFORM, 0), '3g.40gb', 1),
        migUuid(g(UNIFORM, 0), '3g.40gb', 2),
        migUuid(g(UNIFORM, 1), '3g.40gb', 1),
        migUuid(g(UNIFORM, 1), '3g.40gb', 2),
      ],
    ],
    // The kubelet gets MIG UUIDs whatever the strategy (as from
    // NVIDIA's plugin); index names only what the runtime receives.
    [
      'index',
      [
        migUuid(g(UNIFORM, 0), '3g.40gb', 1),
        migUuid(g(UNIFORM, 0), '3g.40gb', 2),
        migUuid(g(UNIFORM, 1), '3g.40gb', 1),
        migUuid(g(UNIFORM, 1), '3g.40gb', 2),
      ],
    ],
  ] as const) {
    const node = await SimNode.start({
      topology: 'mig-uniform-2',
      args: ['--mig-strategy=single', `--device-id-strategy=${ids}`],
    });
    try {
      const devices = await node.kubelet!.waitForDevices((d) => d.length === 4);
      assert.deepEqual(
        devices.map((d) => d.ID),
        expected,
      );
      assert.deepEqual(
        devices.map((d) => d.topology?.nodes[0]?.ID),
        [0, 0, 1, 1],
      );
      assert.equal(node.kubelet!.registrations.length, 1);
      assert.equal(node.kubelet!.registrations[0]!.request.endpoint, 'gpu-device-plugin-gpu.sock');
    } finally {
      await node.stop();
    }
  }
});

test(
  'single on a mixed node stops the start (exit 2, a configuration error, as ' +
    'check says) naming the GPUs and what differs; none advertises GPUs whole',
  async () => {
    const node = await SimNode.start({
      topology: 'mig-mixed-4',
      args: ['--mig-strategy=single'],
      waitRegistered: false,
    });
    try {
      const exit = await node.plugin.exited;
      assert.equal(exit.code, 2);
      const line = node.plugin.matching(/cannot start/)[0] ?? '';
      assert.match(line, /GPU 2 has MIG disabled while GPU 0, 1, 3 have it enabled/);
      assert.match(line, /GPU 3 has MIG enabled but no MIG devices/);
      assert.match(line, /MIG devices differ in profile: 1g\.10gb on GPU 0, 1;/);
      assert.equal(node.kubelet!.registrations.length, 0);
    } finally {
      await node.stop();
    }
    const none = await SimNode.start({ topology: 'mig-mixed-4', args: ['--mig-strategy=none'] });
    try {
      const devices = await none.kubelet!.waitForDevices((d) => d.length === 4);
      assert.deepEqual(
        devices.map((d) => d.ID),
        MIXED.gpus.map((x) => x.uuid),
      );
    } finally {
      await none.stop();
    }
  },
);

test('empty layouts: single refuses to start, mixed advertises nothing and says why', async () => {
  const empty = { ...UNIFORM, gpus: UNIFORM.gpus.map((x) => ({ ...x, mig: { current: true } })) };
  const file = join(process.env.TMPDIR ?? '/tmp', `mig-empty-${process.pid}.json`);
  writeFileSync(file, JSON.stringify(empty));
  const single = await SimNode.start({ topology: file, args: ['--mig-strategy=single'], waitRegistered: false });
  try {
    assert.equal((await single.plugin.exited).code, 2);
    assert.match(single.plugin.matching(/cannot start/)[0] ?? '', /GPU 0, 1 have MIG enabled but no MIG devices/);
  } finally {
    await single.stop();
  }
  const mixed = await SimNode.start({ topology: file, args: ['--mig-strategy=mixed'], waitRegistered: false });
  try {
    await mixed.plugin.waitForLine(/nothing to advertise/);
    assert.equal(mixed.plugin.matching(/has MIG enabled but no MIG devices; it is skipped/).length, 2);
    assert.equal(mixed.kubelet!.registrations.length, 0);
    assert.equal(mixed.plugin.exit, undefined, 'still running, waiting for a layout');
  } finally {
    await mixed.stop();
  }
});

test(
  'Allocate: one and two MIG devices on one and two ' + 'parents, index IDs, device specs with the capability nodes',
  async () => {
    const dev = join(process.env.TMPDIR ?? '/tmp', `gdp-mig-devroot-${process.pid}`);
    mkdirSync(join(dev, 'dev'), { recursive: true });
    writeFileSync(join(dev, 'dev', 'nvidiactl'), '');
    const proc = join(dev, 'proc');
    writeMigMinors(proc, 4);
    const node = await SimNode.start({
      topology: 'mig-mixed-4',
      args: [
        '--mig-strategy=mixed',
        '--device-id-strategy=index',
        '--pass-device-specs',
        '--dev-root',
        dev,
        '--device-list-strategy=envvar,cdi-annotations',
      ],
      env: { PROC_ROOT: proc },
      waitRegistered: false,
    });
    try {
      await node.kubelet!.waitForRegistrations(6, 15000);
      const k = node.kubelet!;
      const ids = await k.waitForDevices((d) => d.length === 4, 'nvidia.com/mig-1g.10gb');
      // Listed by MIG UUID (the index strategy names only what the runtime gets): 0:0, 0:1, 1:2, 1:3.
      assert.ok(
        ids.every((d) => d.ID.startsWith('MIG-')),
        ids.map((d) => d.ID).join(' '),
      );
      const [m00, m01, m12, m13] = ids.map((d) => d.ID);
      const res = await k.allocate(
        { container_requests: [{ devices_ids: [m01!] }, { devices_ids: [m00!, m13!] }] },
        'nvidia.com/mig-1g.10gb',
      );
      const [one, two] = res.container_responses;
      assert.equal(one!.envs.NVIDIA_VISIBLE_DEVICES, '0:1');
      assert.equal(two!.envs.NVIDIA_VISIBLE_DEVICES, '0:0,1:3');
      // GPU 0 (minor 0) GI 2 → caps 21/22; GI 1 → 12/13; GPU 1 (minor 1) GI 4 → 174/175.
      assert.deepEqual(
        one!.devices.map((d) => [d.container_path, d.host_path, d.permissions]),
        [
          ['/dev/nvidiactl', `${dev}/dev/nvidiactl`, 'rw'],
          ['/dev/nvidia0', `${dev}/dev/nvidia0`, 'rw'],
          ['/dev/nvidia-caps/nvidia-cap21', `${dev}/dev/nvidia-caps/nvidia-cap21`, 'rw'],
          ['/dev/nvidia-caps/nvidia-cap22', `${dev}/dev/nvidia-caps/nvidia-cap22`, 'rw'],
        ],
      );
      assert.deepEqual(
        two!.devices.map((d) => d.container_path),
        [
          '/dev/nvidiactl',
          '/dev/nvidia0',
          '/dev/nvidia-caps/nvidia-cap12',
          '/dev/nvidia-caps/nvidia-cap13',
          '/dev/nvidia1',
          '/dev/nvidia-caps/nvidia-cap174',
          '/dev/nvidia-caps/nvidia-cap175',
        ],
      );
      assert.deepEqual(Object.values(two!.annotations), [
        'k8s.device-plugin.nvidia.com/gpu=0:0,k8s.device-plugin.nvidia.com/gpu=1:3',
      ]);
      // Two on one parent.
      const same = await k.allocate({ container_requests: [{ devices_ids: [m12!, m13!] }] }, 'nvidia.com/mig-1g.10gb');
      assert.deepEqual(
        same.container_responses[0]!.devices.map((d) => d.container_path),
        [
          '/dev/nvidiactl',
          '/dev/nvidia1',
          '/dev/nvidia-caps/nvidia-cap165',
          '/dev/nvidia-caps/nvidia-cap166',
          '/dev/nvidia-caps/nvidia-cap174',
          '/dev/nvidia-caps/nvidia-cap175',
        ],
      );
      // +me lives under its own resource; foreign and unknown IDs are refused by name.
      const [mMe] = (await k.waitForDevices((d) => d.length === 1, 'nvidia.com/mig-1g.10gb.me')).map((d) => d.ID);
      const me = await k.allocate({ container_requests: [{ devices_ids: [mMe!] }] }, 'nvidia.com/mig-1g.10gb.me');
      assert.equal(me.container_responses[0]!.envs.NVIDIA_VISIBLE_DEVICES, '0:2');
      await assert.rejects(
        k.allocate({ container_requests: [{ devices_ids: [mMe!] }] }, 'nvidia.com/mig-1g.10gb'),
        new RegExp(`INVALID_ARGUMENT.*unknown device ID "${mMe}"`, 's'),
      );
      // The runtime's names are not IDs the kubelet can use.
      await assert.rejects(
        k.allocate({ container_requests: [{ devices_ids: ['0:2'] }] }, 'nvidia.com/mig-1g.10gb'),
        /unknown device ID "0:2"/,
      );
    } finally {
      await node.stop();
    }
  },
);

test('--pass-device-specs without a readable mig-minors stops the start naming the file', async () => {
  const node = await SimNode.start({
    topology: 'mig-uniform-2',
    args: ['--mig-strategy=single', '--pass-device-specs'],
    env: { PROC_ROOT: '/nonexistent-proc' },
    waitRegistered: false,
  });
  try {
    assert.equal((await node.plugin.exited).code, 1);
    assert.match(
      node.plugin.matching(/cannot start/)[0] ?? '',
      /cannot read \/nonexistent-proc\/driver\/nvidia-caps\/mig-minors .*--pass-device-specs needs/,
    );
  } finally {
    await node.stop();
  }
});

const healthOf = (node: SimNode, resource: string): string =>
  (node.kubelet!.devices(resource) ?? []).map((d) => (d.health === 'Healthy' ? 'H' : 'U')).join('');

test(
  'health: an XID on a MIG device marks only it, two on one parent are both ' +
    'reported, a whole-GPU XID marks all of its MIG devices, a NULL one everything',
  async () => {
    const node = await SimNode.start({
      topology: 'mig-mixed-4',
      args: ['--mig-strategy=mixed'],
      waitRegistered: false,
    });
    try {
      const k = node.kubelet!;
      await k.waitForRegistrations(6, 15000);
      await node.plugin.waitForLine(/watching GPU health/, 10000);
      const r1g = 'nvidia.com/mig-1g.10gb';
      await k.waitForDevices((d) => d.length === 4, r1g);
      node.nvml('xid 0 94 2 0'); // GPU 0, GI 2: the second 1g.10gb
      await k.waitForDevices((d) => d[1]?.health === 'Unhealthy', r1g, 5000);
      assert.equal(healthOf(node, r1g), 'HUHH');
      assert.equal(
        healthOf(node, 'nvidia.com/mig-1g.10gb.me'),
        'H',
        "the same parent's other MIG devices stay healthy",
      );
      assert.equal(healthOf(node, 'nvidia.com/mig-2g.20gb'), 'H');
      node.nvml('xid 0 94 1 0'); // GPU 0, GI 1: a second unhealthy MIG device on the same parent
      await k.waitForDevices((d) => d[0]?.health === 'Unhealthy', r1g, 5000);
      assert.equal(healthOf(node, r1g), 'UUHH');
      await node.plugin.waitForLine(/MIG device unhealthy .*gi=1 ci=0/);
      assert.equal(node.plugin.matching(/MIG device unhealthy/).length, 2);
      node.nvml('xid 1 79'); // GPU 1 as a whole (0xFFFFFFFF)
      await k.waitForDevices((d) => d[3]?.health === 'Unhealthy', r1g, 5000);
      assert.equal(healthOf(node, r1g), 'UUUU');
      // Each resource has its own stream: each sees the change on its own.
      await k.waitForDevices((d) => d[0]?.health === 'Unhealthy', 'nvidia.com/mig-3g.40gb', 5000);
      await k.waitForDevices((d) => d[0]?.health === 'Unhealthy', 'nvidia.com/mig-1g.20gb', 5000);
      assert.equal(healthOf(node, 'nvidia.com/mig-2g.20gb'), 'H');
      assert.equal(healthOf(node, 'nvidia.com/gpu'), 'H');
      node.nvml('xid all 48');
      await k.waitForDevices((d) => d[0]?.health === 'Unhealthy', 'nvidia.com/gpu', 5000);
      await k.waitForDevices((d) => d[0]?.health === 'Unhealthy', 'nvidia.com/mig-2g.20gb', 5000);
      await k.waitForDevices((d) => d[0]?.health === 'Unhealthy', 'nvidia.com/mig-1g.10gb.me', 5000);
    } finally {
      await node.stop();
    }
  },
);

test(
  'health: an XID naming a GI/CI the node does not have marks nothing, ' +
    'is logged, and after a MIG re-scan marks the instance that now exists',
  async () => {
    const node = await SimNode.start({
      topology: 'mig-mixed-4',
      args: ['--mig-strategy=mixed'],
      waitRegistered: false,
    });
    try {
      const k = node.kubelet!;
      await k.waitForRegistrations(6, 15000);
      await node.plugin.waitForLine(/watching GPU health/, 10000);
      const r1g = 'nvidia.com/mig-1g.10gb';
      await k.waitForDevices((d) => d.length === 4, r1g);
      // GPU 0 has no GPU instance 9: nothing is marked (NVIDIA's plugin ignores it), one line says so,
      // the node is looked at again, and after that the event is ignored for good.
      node.nvml('xid 0 94 9 0');
      const first = await node.plugin.waitForLine(/event names a device the node snapshot does not hold/);
      assert.match(first, new RegExp(`gpu=0 uuid=${g(MIXED, 0)}.* xid=94 gi=9 ci=0`));
      await node.plugin.waitForLine(/event still names no device of this node after looking again; ignored .*gi=9/);
      assert.equal(healthOf(node, r1g), 'HHHH');
      for (const r of ['nvidia.com/gpu', 'nvidia.com/mig-1g.10gb.me', 'nvidia.com/mig-2g.20gb']) {
        // Each resource's list reaches the stand-in on its own stream: wait for it before reading it.
        await k.waitForDevices((d) => d.length > 0, r);
        assert.equal(healthOf(node, r), 'H', r);
      }
      assert.deepEqual(node.plugin.matching(/(GPU|MIG device) unhealthy/), []);
      // GPU 3 is in MIG mode without instances; one is made, and an XID names it before the plugin
      // has seen it: the re-scan the event asks for finds it, and then it is marked.
      node.nvml('mig 3 on 1g.10gb');
      await node.nvmlStats();
      node.nvml('xid 3 94 1 0');
      const five = await k.waitForDevices((d) => d.length === 5 && d[4]?.health === 'Unhealthy', r1g, 10000);
      assert.equal(five.map((d) => (d.health === 'Healthy' ? 'H' : 'U')).join(''), 'HHHHU');
      assert.match(
        await node.plugin.waitForLine(/MIG device unhealthy/),
        new RegExp(`gpu=3 uuid=${g(MIXED, 3)} mig=MIG-.* gi=1 ci=0 xid=94`),
      );
    } finally {
      await node.stop();
    }
  },
);

test(
  'health: with --mig-strategy=none a GPU left in MIG mode is ' +
    'served whole and takes an XID naming one of its MIG instances',
  async () => {
    const node = await SimNode.start({ topology: 'mig-mixed-4', args: ['--mig-strategy=none'] });
    try {
      await node.plugin.waitForLine(/watching GPU health/, 10000);
      const k = node.kubelet!;
      await k.waitForDevices((d) => d.length === 4);
      node.nvml('xid 0 95 3 0');
      const devices = await k.waitForDevices((d) => d[0]?.health === 'Unhealthy', 'nvidia.com/gpu', 5000);
      assert.deepEqual(
        devices.map((d) => d.health),
        ['Unhealthy', 'Healthy', 'Healthy', 'Healthy'],
      );
      assert.match(await node.plugin.waitForLine(/GPU unhealthy gpu=0 /), /xid=95/);
    } finally {
      await node.stop();
    }
  },
);

test('health: a lost GPU marks its MIG devices unhealthy', async () => {
  const node = await SimNode.start({
    topology: 'mig-uniform-2',
    args: ['--mig-strategy=single', '--health-probe-interval=0.1'],
  });
  try {
    const k = node.kubelet!;
    await node.plugin.waitForLine(/watching GPU health/, 10000);
    node.nvml('lost 1');
    await k.waitForDevices((d) => d[3]?.health === 'Unhealthy', 'nvidia.com/gpu', 5000);
    assert.equal(healthOf(node, 'nvidia.com/gpu'), 'HHUU');
  } finally {
    await node.stop();
  }
});

test('GetPreferredAllocation for a MIG resource: packed fills one GPU, distributed spreads', async () => {
  for (const [policy, expected] of [
    ['packed', ['0:0', '0:1']],
    ['distributed', ['0:0', '1:2']],
  ] as const) {
    const node = await SimNode.start({
      topology: 'mig-mixed-4',
      args: ['--mig-strategy=mixed', '--device-id-strategy=index', `--shared-devices-allocation-policy=${policy}`],
      waitRegistered: false,
    });
    try {
      const k = node.kubelet!;
      await k.waitForRegistrations(6, 15000);
      // The kubelet's IDs are MIG UUIDs; in list order they are the devices 0:0, 0:1, 1:2, 1:3.
      const names = ['0:0', '0:1', '1:2', '1:3'];
      const listed = (await k.waitForDevices((d) => d.length === 4, 'nvidia.com/mig-1g.10gb')).map((d) => d.ID);
      const id = (n: string): string => listed[names.indexOf(n)]!;
      const res = await k.preferred(
        { container_requests: [{ available_deviceIDs: listed, must_include_deviceIDs: [], allocation_size: 2 }] },
        'nvidia.com/mig-1g.10gb',
      );
      assert.deepEqual(res.container_responses[0]!.deviceIDs, expected.map(id), policy);
      const must = await k.preferred(
        {
          container_requests: [
            { available_deviceIDs: listed, must_include_deviceIDs: [id('1:3')], allocation_size: 2 },
          ],
        },
        'nvidia.com/mig-1g.10gb',
      );
      assert.deepEqual(
        must.container_responses[0]!.deviceIDs,
        (policy === 'packed' ? ['1:2', '1:3'] : ['0:0', '1:3']).map(id),
        policy,
      );
    } finally {
      await node.stop();
    }
  }
});

test('old driver without MIG symbols under mixed: one log line, every GPU advertised whole', async () => {
  const node = await SimNode.start({ topology: 'mig-mixed-4', nvml: 'old', args: ['--mig-strategy=mixed'] });
  try {
    const devices = await node.kubelet!.waitForDevices((d) => d.length === 4);
    assert.deepEqual(
      devices.map((d) => d.ID),
      MIXED.gpus.map((x) => x.uuid),
    );
    assert.equal(node.kubelet!.registrations.length, 1);
    const lines = node.plugin.matching(/MIG|nvmlDeviceGetMigMode/);
    assert.equal(lines.length, 1, lines.join('\n'));
    assert.match(
      lines[0] ?? '',
      new RegExp(
        'WARN this NVIDIA driver has no MIG functions; MIG is off and ' +
          'every GPU is advertised whole missing=nvmlDeviceGetMigMode',
      ),
    );
  } finally {
    await node.stop();
  }
});

test('time-slicing of MIG resources by name, from the config file; SIGHUP applies a change to them', async () => {
  const file = join(process.env.TMPDIR ?? '/tmp', `mig-ts-${process.pid}.yaml`);
  const config = (replicas: number): string =>
    [
      'version: v1',
      'flags:',
      '  migStrategy: mixed',
      'sharing:',
      '  timeSlicing:',
      '    resources:',
      `      - name: nvidia.com/mig-1g.10gb`,
      `        replicas: ${replicas}`,
      '      - name: nvidia.com/mig-3g.40gb',
      '        rename: mig-3g.40gb.shared',
      '        replicas: 3',
      '',
    ].join('\n');
  writeFileSync(file, config(2));
  const node = await SimNode.start({ topology: 'mig-mixed-4', args: ['--config-file', file], waitRegistered: false });
  try {
    const k = node.kubelet!;
    await k.waitForRegistrations(6, 15000);
    const names = k.registrations.map((r) => r.request.resource_name).sort();
    assert.deepEqual(names, [
      'nvidia.com/gpu',
      'nvidia.com/mig-1g.10gb',
      'nvidia.com/mig-1g.10gb.me',
      'nvidia.com/mig-1g.20gb',
      'nvidia.com/mig-2g.20gb',
      'nvidia.com/mig-3g.40gb.shared',
    ]);
    const m0 = migUuid(g(MIXED, 0), '1g.10gb', 1);
    const m1 = migUuid(g(MIXED, 1), '1g.10gb', 3);
    const ids = (await k.waitForDevices((d) => d.length === 8, 'nvidia.com/mig-1g.10gb')).map((d) => d.ID);
    assert.deepEqual(ids.slice(0, 2), [`${m0}::0`, `${m0}::1`]);
    const shared = await k.waitForDevices((d) => d.length === 3, 'nvidia.com/mig-3g.40gb.shared');
    assert.deepEqual(
      shared.map((d) => d.ID),
      [0, 1, 2].map((n) => `${migUuid(g(MIXED, 1), '3g.40gb', 1)}::${n}`),
    );
    const res = await k.allocate(
      { container_requests: [{ devices_ids: [`${m0}::1`, `${m0}::0`, `${m1}::0`] }] },
      'nvidia.com/mig-1g.10gb',
    );
    assert.equal(res.container_responses[0]!.envs.NVIDIA_VISIBLE_DEVICES, `${m0},${m1}`, 'each MIG device once');
    writeFileSync(file, config(3));
    node.plugin.signal('SIGHUP');
    const after = await k.waitForDevices((d) => d.length === 12, 'nvidia.com/mig-1g.10gb');
    assert.equal(after[2]!.ID, `${m0}::2`);
  } finally {
    await node.stop();
  }
});

test(
  're-layout under open streams: the next snapshot adds and removes mig-* ' +
    'resources and leaves other GPUs alone; pending mode is logged only',
  async () => {
    for (const trigger of ['SIGHUP', 'timer'] as const) {
      const node = await SimNode.start({
        topology: 'mig-mixed-4',
        args: ['--mig-strategy=mixed', ...(trigger === 'timer' ? ['--rediscover-interval=0.2'] : [])],
        waitRegistered: false,
      });
      try {
        const k = node.kubelet!;
        await k.waitForRegistrations(6, 15000);
        await k.waitForDevices((d) => d.length === 4, 'nvidia.com/mig-1g.10gb');
        for (const r of ['nvidia.com/gpu', 'nvidia.com/mig-2g.20gb', 'nvidia.com/mig-1g.10gb.me'])
          await k.waitForDevices((d) => d.length === 1, r);
        const untouched = ['nvidia.com/gpu', 'nvidia.com/mig-2g.20gb', 'nvidia.com/mig-1g.10gb.me'];
        const before = Object.fromEntries(untouched.map((r) => [r, k.updates(r)]));
        const registrations = k.registrations.length;
        // GPU 1 (the H100) is re-partitioned into one 7g.80gb, as nvidia-mig-parted would.
        const t0 = performance.now();
        node.nvml('mig 1 on 7g.80gb');
        if (trigger === 'SIGHUP') {
          await node.nvmlStats();
          node.plugin.signal('SIGHUP');
        }
        const seven = await k.waitForDevices((d) => d.length === 1, 'nvidia.com/mig-7g.80gb', 10000);
        const oneG = await k.waitForDevices((d) => d.length === 2, 'nvidia.com/mig-1g.10gb', 10000);
        const ms = performance.now() - t0;
        assert.deepEqual(
          seven.map((d) => d.ID),
          [migUuid(g(MIXED, 1), '7g.80gb', 1)],
        );
        assert.deepEqual(
          oneG.map((d) => d.ID),
          [migUuid(g(MIXED, 0), '1g.10gb', 1), migUuid(g(MIXED, 0), '1g.10gb', 2)],
        );
        // The new resource registered once; the vanished ones stopped and their sockets went.
        assert.equal(k.registrations.length, registrations + 1);
        assert.equal(k.registrations.at(-1)!.request.resource_name, 'nvidia.com/mig-7g.80gb');
        await node.plugin.waitForLine(/resource no longer advertised resource=nvidia\.com\/mig-1g\.20gb/);
        await node.plugin.waitForLine(/resource no longer advertised resource=nvidia\.com\/mig-3g\.40gb/);
        await waitUntil(() => !existsSync(join(node.kubeletDir, 'gpu-device-plugin-mig-3g.40gb.sock')), {
          on: onFileChange(node.kubeletDir),
          what: "the vanished resource's socket is removed",
        });
        assert.ok(existsSync(join(node.kubeletDir, 'gpu-device-plugin-mig-7g.80gb.sock')));
        // Other GPUs' resources saw no new list at all.
        assert.deepEqual(Object.fromEntries(untouched.map((r) => [r, k.updates(r)])), before);
        // Allocate follows at once: the vanished devices are refused by name, the new one is served.
        await assert.rejects(
          k.allocate(
            { container_requests: [{ devices_ids: [migUuid(g(MIXED, 1), '1g.10gb', 3)] }] },
            'nvidia.com/mig-1g.10gb',
          ),
          /MIG-/,
        );
        const res = await k.allocate(
          { container_requests: [{ devices_ids: [seven[0]!.ID] }] },
          'nvidia.com/mig-7g.80gb',
        );
        assert.equal(res.container_responses[0]!.envs.NVIDIA_VISIBLE_DEVICES, seven[0]!.ID);
        // Health follows the new layout: an XID naming the new instance marks it.
        await node.plugin.waitForLine(/watching GPU health/);
        node.nvml('xid 1 94 1 0');
        await k.waitForDevices((d) => d[0]?.health === 'Unhealthy', 'nvidia.com/mig-7g.80gb', 5000);
        // A pending mode change is logged and changes nothing.
        const lines = node.plugin.lines.length;
        node.nvml('mig 3 pending 0');
        if (trigger === 'SIGHUP') {
          await node.nvmlStats();
          node.plugin.signal('SIGHUP');
        } else node.nvml('mig 2 pending 1');
        await node.plugin.waitForLine(
          /MIG mode change pending change="GPU 3 .*enabled now and disabled after the next GPU reset/,
          10000,
          lines,
        );
        assert.equal(k.registrations.length, registrations + 1);
        process.stderr.write(`# re-layout (${trigger}) → new lists at the kubelet: ${ms.toFixed(0)} ms\n`);
      } finally {
        await node.stop();
      }
    }
  },
);

test(
  'single: a node that stops being uniform after start is ' +
    'reported and withdrawn, and comes back when uniform again',
  async () => {
    const node = await SimNode.start({ topology: 'mig-uniform-2', args: ['--mig-strategy=single'] });
    try {
      const k = node.kubelet!;
      await k.waitForDevices((d) => d.length === 4);
      node.nvml('mig 1 on 3g.40gb 2g.20gb');
      await node.nvmlStats();
      node.plugin.signal('SIGHUP');
      const line = await node.plugin.waitForLine(
        /the node no longer fits the MIG strategy; its devices are withdrawn/,
        10000,
      );
      assert.match(line, /MIG devices differ in profile: 3g\.40gb on GPU 0, 1; 2g\.20gb on GPU 1/);
      await node.plugin.waitForLine(/resource no longer advertised resource=nvidia\.com\/gpu/);
      await waitUntil(() => !existsSync(node.pluginSocket), {
        on: onFileChange(node.kubeletDir),
        what: 'the socket of nvidia.com/gpu is removed: nothing half-advertised',
      });
      const registrations = k.registrations.length;
      node.nvml('mig 1 on 3g.40gb 3g.40gb');
      await node.nvmlStats();
      node.plugin.signal('SIGHUP');
      await k.waitForRegistrations(registrations + 1, 10000);
      const devices = await k.waitForDevices((d) => d.length === 4);
      assert.deepEqual(
        devices.map((d) => d.ID),
        [
          migUuid(g(UNIFORM, 0), '3g.40gb', 1),
          migUuid(g(UNIFORM, 0), '3g.40gb', 2),
          migUuid(g(UNIFORM, 1), '3g.40gb', 1),
          migUuid(g(UNIFORM, 1), '3g.40gb', 2),
        ],
      );
    } finally {
      await node.stop();
    }
  },
);
