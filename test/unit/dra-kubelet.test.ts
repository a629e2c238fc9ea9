// The DRA kubelet plugin (src/dra/mode.ts's DraKubeletPlugin) in-process, driven over real gRPC by the kubelet's
// plugin-watcher stand-in (test/support/plugin-watcher.ts), with claims from the API server stand-in
// and CDI specs, checkpoint and boot ID in a temporary directory: registration (GetInfo, the version
// chosen), prepare/unprepare of one GPU, two GPUs and a MIG device, idempotence, refusals (a foreign
// device, a UID mismatch, a missing or stale CDI spec), another driver's results ignored, the
// checkpoint across a restart of the plugin and across a reboot, re-registration after the sockets or
// the registry directory are deleted (timed) and after a kubelet restart, and the health stream.
import { EventEmitter, once } from 'node:events';
import { test } from 'node:test';
import assert from 'node:assert/strict';
import {
  existsSync,
  mkdirSync,
  mkdtempSync,
  readdirSync,
  readFileSync,
  rmSync,
  unlinkSync,
  writeFileSync,
} from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { HealthStatus } from '../../src/api/dra.ts';
import type { Claim, NodeWatchResourcesResponse } from '../../src/api/dra.ts';
import type { Gpu } from '../../src/core/devices.ts';
import { freshHealthState } from '../../src/core/health-tracker.ts';
import type { MigDevice, MigLayout } from '../../src/core/mig.ts';
import { NO_SHARING } from '../../src/core/sharing.ts';
import { buildSnapshot, withHealth } from '../../src/core/snapshot.ts';
import { diff } from '../../src/core/snapshot-diff.ts';
import type { NodeScan, NodeSnapshot } from '../../src/core/snapshot.ts';
import { CHECKPOINT_FILE } from '../../src/dra/checkpoint.ts';
import type { ClaimReader } from '../../src/dra/claims.ts';
import { DraKubeletPlugin } from '../../src/dra/kubelet-plugin.ts';
import { SUPPORTED_VERSIONS } from '../../src/dra/registration.ts';
import type { AppliedSnapshot, NodeSettings } from '../../src/node/consumer.ts';
import { createLogger } from '../../src/system/log.ts';
import { SlicePublisher } from '../../src/dra/slice-publisher.ts';
import { KubeClient } from '../../src/k8s/client.ts';
import { getResourceClaim } from '../../src/k8s/resources.ts';
import { ApiServerStandIn } from '../support/apiserver.ts';
import type { JsonObject } from '../support/apiserver.ts';
import { byIndex, cdiSpec } from '../support/dra-fixtures.ts';
import { DraClient, PluginWatcherStandIn } from '../support/plugin-watcher.ts';
import type { WatcherOptions } from '../support/plugin-watcher.ts';
import { onEvent, waitUntil } from '../support/wait.ts';

const DRIVER = 'gpu.nvidia.com';
const NODE = 'node-a';
const MiB = 1024 * 1024;
const uuid = (i: number): string => `GPU-0000000${i}-aaaa-4000-8000-000000000000`;
const gpu = (i: number): Gpu => ({
  index: i,
  uuid: uuid(i),
  name: 'NVIDIA A100-SXM4-80GB',
  minor: i,
  busId: `00000000:0${i}:00.0`,
  memoryBytes: 81920 * MiB,
  numaNode: 0,
});
const MIG_UUID = 'MIG-22222222-bbbb-4000-8000-000000000000';
const migDev: MigDevice = {
  parent: 2,
  index: 0,
  uuid: MIG_UUID,
  gi: 5,
  ci: 0,
  profile: '1g.10gb',
  giProfileId: 19,
  placementStart: 0,
  giSlices: 1,
  ciSlices: 1,
  memoryBytes: 9728 * MiB,
  multiprocessors: 14,
  engines: { copy: 1, decoder: 0, encoder: 0, jpeg: 0, ofa: 0 },
};
/** Named by core/dra-devices.ts, as NVIDIA's DRA driver names it. */
const MIG_NAME = 'gpu-2-mig-1g10gb-19-0';

/** Three GPUs, the third in MIG mode with one 1g.10gb device. */
function nodeScan(): NodeScan {
  const gpus = [gpu(0), gpu(1), gpu(2)];
  const mig: MigLayout = { modes: [null, null, { current: true, pending: true }], devices: [migDev] };
  return {
    driverVersion: '550.54.15',
    gpus,
    mig,
    migCapabilities: new Map([[MIG_UUID, ['/dev/nvidia-caps/nvidia-cap21']]]),
    nvlinks: gpus.map((g) => ({ busId: g.busId, links: [] })),
    pcie: gpus.map((_, i) => gpus.map((_, j) => (i === j ? -1 : 40))),
  };
}

const settings: NodeSettings = {
  plan: { deviceIdStrategy: 'uuid', migStrategy: 'mixed', sharing: NO_SHARING },
};

function applied(snapshot: NodeSnapshot, previous: NodeSnapshot | null, reason: string): AppliedSnapshot {
  return { snapshot, change: diff(previous, snapshot), reason, reregister: null, settings };
}

const FULL_SPEC = byIndex(['0', '1', '2:0']);

interface Setup {
  root: string;
  registry: string;
  plugins: string;
  cdi: string;
  bootId: string;
  api: ApiServerStandIn;
  reads: { count: number };
  lines: string[];
  /** Resolves once the plugin logged n lines matching re (the test's timeout bounds it). */
  waitForLine(re: RegExp, n?: number): Promise<void>;
  plugin: DraKubeletPlugin;
  watcher: PluginWatcherStandIn;
  snapshot: NodeSnapshot;
  newPlugin(): Promise<DraKubeletPlugin>;
  claim(name: string, results: JsonObject[], uid?: string): Claim;
  done(): Promise<void>;
}

async function setup(watcherOpts: WatcherOptions = {}, checkIntervalMs = 60_000): Promise<Setup> {
  const root = mkdtempSync(join(tmpdir(), 'dra-kubelet-'));
  const registry = join(root, 'plugins_registry');
  const plugins = join(root, 'plugins');
  const cdi = join(root, 'cdi');
  for (const d of [registry, plugins, cdi]) mkdirSync(d);
  const bootId = join(root, 'boot_id');
  writeFileSync(bootId, 'boot-1\n');
  writeFileSync(join(cdi, 'nvidia.yaml'), cdiSpec(FULL_SPEC));
  const api = await ApiServerStandIn.start();
  const reads = { count: 0 };
  // The claim reader the daemon gets: src/k8s's client, counting its reads.
  const kube = new KubeClient({ server: api.url, source: 'test' });
  const claims: ClaimReader = {
    getResourceClaim(namespace, name) {
      reads.count++;
      return getResourceClaim(kube, namespace, name);
    },
  };
  const lines: string[] = [];
  const logged = new EventEmitter();
  const count = (re: RegExp): number => lines.filter((l) => re.test(l)).length;
  const log = createLogger({
    level: 'debug',
    journal: false,
    write: (l) => {
      lines.push(l);
      logged.emit('line');
    },
  });
  const waitForLine = (re: RegExp, n = 1): Promise<void> =>
    waitUntil(() => count(re) >= n, { on: onEvent(logged, 'line'), what: `${n} log lines matching ${re}` });
  const snapshot = buildSnapshot(nodeScan(), null, false);
  const plugins_: DraKubeletPlugin[] = [];
  const newPlugin = async (): Promise<DraKubeletPlugin> => {
    const p = new DraKubeletPlugin({
      driver: DRIVER,
      nodeName: NODE,
      registryDir: registry,
      pluginsDir: plugins,
      claims,
      cdiDirs: [cdi],
      bootIdPath: bootId,
      checkIntervalMs,
      log,
      now: () => 1_700_000_000_000,
    });
    plugins_.push(p);
    await p.apply(applied(snapshot, null, 'start'));
    return p;
  };
  const plugin = await newPlugin();
  const watcher = await PluginWatcherStandIn.start(registry, watcherOpts);
  await watcher.waitForRegistrations(1);
  const t: Setup = {
    root,
    registry,
    plugins,
    cdi,
    bootId,
    api,
    reads,
    lines,
    waitForLine,
    plugin,
    watcher,
    snapshot,
    newPlugin,
    claim(name, results, uid) {
      const stored = api.putClaim({
        namespace: 'team-a',
        name,
        ...(uid === undefined ? {} : { uid }),
        status: { allocation: { devices: { results } } },
      });
      return { namespace: 'team-a', name, uid: (stored.metadata as { uid: string }).uid };
    },
    async done() {
      await t.watcher.stop();
      for (const p of plugins_) await p.stop();
      kube.close();
      await api.stop();
      rmSync(root, { recursive: true, force: true });
    },
  };
  return t;
}

const result = (device: string, request = 'gpu', driver = DRIVER, pool = NODE): JsonObject => ({
  request,
  driver,
  pool,
  device,
});
const checkpointOf = (
  t: Setup,
): { bootId: string; claims: Record<string, { state: string; devices: { device: string }[] }> } =>
  JSON.parse(readFileSync(join(t.plugins, DRIVER, CHECKPOINT_FILE), 'utf8'));

test(
  'registers through the plugin watcher: GetInfo names the ' +
    'driver, dra.sock and the services; the kubelet picks v1',
  async () => {
    const t = await setup();
    try {
      const reg = t.watcher.registered(DRIVER)!;
      assert.equal(reg.info.type, 'DRAPlugin');
      assert.equal(reg.info.name, DRIVER);
      assert.equal(reg.info.endpoint, join(t.plugins, DRIVER, 'dra.sock'));
      assert.deepEqual(reg.info.supported_versions, [
        'v1.DRAPlugin',
        'v1beta1.DRAPlugin',
        'v1.DRAResourceHealth',
        'v1alpha1.DRAResourceHealth',
      ]);
      assert.deepEqual([...SUPPORTED_VERSIONS], reg.info.supported_versions);
      assert.equal(reg.socket, join(t.registry, `${DRIVER}-reg.sock`));
      assert.equal(reg.version, 'v1');
      assert.equal(t.plugin.registered, true);
      assert.equal(t.plugin.registrations, 1);
      assert.ok(
        t.lines.some((l) => / INFO registered with the kubelet .*driver=gpu\.nvidia\.com/.test(l)),
        t.lines.join('\n'),
      );
    } finally {
      await t.done();
    }
  },
);

test('a kubelet that speaks only v1beta1 gets v1beta1, and prepares through it', async () => {
  const t = await setup({ versions: ['v1beta1'] });
  try {
    assert.equal(t.watcher.registered(DRIVER)!.version, 'v1beta1');
    const c = t.claim('one', [result('gpu-1')]);
    const r = await t.watcher.client(DRIVER).prepare([c]);
    assert.deepEqual(r.claims[c.uid], {
      devices: [
        { request_names: ['gpu'], pool_name: NODE, device_name: 'gpu-1', cdi_device_ids: ['nvidia.com/gpu=1'] },
      ],
      error: '',
    });
    // v1beta1 has no share_id: a share is answered without it.
    const share = t.claim('share', [{ ...result('gpu-0'), shareID: 'aaaaaaaa-0000-4000-8000-000000000003' }]);
    const shared = await t.watcher.client(DRIVER).prepare([share]);
    assert.equal(shared.claims[share.uid]!.error, '');
    assert.equal(shared.claims[share.uid]!.devices[0]!.share_id, undefined);
  } finally {
    await t.done();
  }
});

test(
  "prepare: one GPU, two GPUs, a MIG device — CDI IDs of the toolkit's " +
    'spec, recorded before the answer; unprepare removes the record',
  async () => {
    const t = await setup();
    try {
      // `one` shares gpu-0 with `two` as an admin's claim (admin access): one device, two claims.
      const one = t.claim('one', [{ ...result('gpu-0'), adminAccess: true }]);
      const two = t.claim('two', [result('gpu-0', 'a'), result('gpu-1', 'b'), result('gpu-1', 'c')]);
      const mig = t.claim('mig', [result(MIG_NAME, 'small')]);
      const client = t.watcher.client(DRIVER);
      const r = await client.prepare([one, two, mig]);
      assert.deepEqual(r.claims[one.uid], {
        devices: [
          { request_names: ['gpu'], pool_name: NODE, device_name: 'gpu-0', cdi_device_ids: ['nvidia.com/gpu=0'] },
        ],
        error: '',
      });
      assert.deepEqual(r.claims[two.uid], {
        devices: [
          { request_names: ['a'], pool_name: NODE, device_name: 'gpu-0', cdi_device_ids: ['nvidia.com/gpu=0'] },
          { request_names: ['b', 'c'], pool_name: NODE, device_name: 'gpu-1', cdi_device_ids: ['nvidia.com/gpu=1'] },
        ],
        error: '',
      });
      assert.deepEqual(r.claims[mig.uid], {
        devices: [
          { request_names: ['small'], pool_name: NODE, device_name: MIG_NAME, cdi_device_ids: ['nvidia.com/gpu=2:0'] },
        ],
        error: '',
      });
      const cp = checkpointOf(t);
      assert.equal(cp.bootId, 'boot-1');
      assert.deepEqual(Object.keys(cp.claims).sort(), [one.uid, two.uid, mig.uid].sort());
      assert.ok(Object.values(cp.claims).every((c) => c.state === 'PrepareCompleted'));
      assert.deepEqual(
        cp.claims[two.uid]!.devices.map((d) => d.device),
        ['gpu-0', 'gpu-1'],
      );
      const u = await client.unprepare([one, mig]);
      assert.deepEqual(u.claims, { [one.uid]: { error: '' }, [mig.uid]: { error: '' } });
      assert.deepEqual(Object.keys(checkpointOf(t).claims), [two.uid]);
      assert.deepEqual(
        t.plugin.preparedClaims().map((c) => [c.name, c.state, c.devices]),
        [['two', 'PrepareCompleted', ['gpu-0', 'gpu-1']]],
      );
    } finally {
      await t.done();
    }
  },
);

test(
  'idempotent: a prepared claim is answered again without asking the API server, ' +
    'concurrent prepares read it once, unprepare twice and of an unknown claim succeed',
  async () => {
    const t = await setup();
    try {
      const c = t.claim('one', [result('gpu-0')]);
      const client = t.watcher.client(DRIVER);
      const [a, b] = await Promise.all([client.prepare([c]), client.prepare([c])]);
      assert.equal(t.reads.count, 1, 'the second call for the same claim waited for the first and used its record');
      assert.deepEqual(a, b);
      t.api.deleteClaim('team-a', 'one');
      const again = await client.prepare([c]);
      assert.deepEqual(again, a);
      assert.equal(t.reads.count, 1);
      assert.deepEqual((await client.unprepare([c])).claims[c.uid], { error: '' });
      assert.deepEqual((await client.unprepare([c])).claims[c.uid], { error: '' });
      assert.deepEqual(
        (await client.unprepare([{ namespace: 'x', name: 'never', uid: 'no-such-uid' }])).claims['no-such-uid'],
        { error: '' },
      );
      assert.deepEqual(checkpointOf(t).claims, {});
    } finally {
      await t.done();
    }
  },
);

test(
  'refused per claim: a device of another node, a device this node does not ' +
    "have, a re-created claim (UID mismatch); another driver's results are ignored",
  async () => {
    const t = await setup();
    try {
      const foreignPool = t.claim('foreign-pool', [result('gpu-0', 'gpu', DRIVER, 'node-b')]);
      const unknown = t.claim('unknown', [result('gpu-7')]);
      const stale = t.claim('stale', [result('gpu-0')]);
      const staleUid = { ...stale, uid: 'the-old-uid' };
      const mixed = t.claim('mixed', [result('nic-0', 'nic', 'nic.example.com', NODE), result('gpu-1')]);
      const only = t.claim('other-only', [result('nic-0', 'nic', 'nic.example.com', NODE)]);
      const r = await t.watcher.client(DRIVER).prepare([foreignPool, unknown, staleUid, mixed, only]);
      assert.match(
        r.claims[foreignPool.uid]!.error,
        new RegExp(
          "device gpu-0 of pool node-b, which is not this node's: " +
            String.raw`driver gpu\.nvidia\.com on this node serves pool node-a only`,
        ),
      );
      assert.deepEqual(r.claims[foreignPool.uid]!.devices, []);
      assert.match(
        r.claims[unknown.uid]!.error,
        new RegExp(
          'allocates device gpu-7, which node node-a does not have ' +
            String.raw`now \(its devices: gpu-0, gpu-1, gpu-2-mig-1g10gb-19-0\)`,
        ),
      );
      assert.match(
        r.claims['the-old-uid']!.error,
        new RegExp(`uid ${stale.uid}: the claim the kubelet asked for was deleted and re-created`),
      );
      assert.deepEqual(r.claims[mixed.uid], {
        devices: [
          { request_names: ['gpu'], pool_name: NODE, device_name: 'gpu-1', cdi_device_ids: ['nvidia.com/gpu=1'] },
        ],
        error: '',
      });
      assert.deepEqual(r.claims[only.uid], { devices: [], error: '' });
      const cp = checkpointOf(t);
      assert.deepEqual(Object.keys(cp.claims).sort(), [mixed.uid, only.uid].sort(), 'refused claims are not recorded');
      const missing = await t.watcher.client(DRIVER).prepare([{ namespace: 'team-a', name: 'nope', uid: 'u-1' }]);
      assert.match(
        missing.claims['u-1']!.error,
        new RegExp(
          String.raw`cannot read ResourceClaim team-a\/nope from the API server: GET ` +
            String.raw`\/apis\/resource\.k8s\.io\/v1\/namespaces\/team-a\/resourceclaims\/nope: ` +
            String.raw`404 NotFound: resourceclaims\.resource\.k8s\.io "nope" not found`,
        ),
      );
      assert.ok(t.lines.some((l) => / WARN cannot prepare a DRA claim .*gpu-7/.test(l)));
    } finally {
      await t.done();
    }
  },
);

test(
  'CDI: no spec → the error says what to run; a spec without the MIG device ' +
    'or with another GPU at an index → stale, never an answer without the GPU',
  async () => {
    const t = await setup();
    try {
      const client = t.watcher.client(DRIVER);
      unlinkSync(join(t.cdi, 'nvidia.yaml'));
      const c = t.claim('one', [result('gpu-0')]);
      const none = await client.prepare([c]);
      assert.deepEqual(none.claims[c.uid]!.devices, []);
      assert.match(
        none.claims[c.uid]!.error,
        new RegExp(
          String.raw`no CDI spec of kind nvidia\.com\/gpu in .*cdi: .*GPU 0 ` +
            String.raw`\(GPU-00000000.*nvidia-ctk cdi generate --output=\/var\/run\/cdi\/nvidia\.yaml`,
        ),
      );
      // Generated before MIG was enabled on GPU 2: it has GPU 2 whole, no 2:0.
      writeFileSync(
        join(t.cdi, 'nvidia.yaml'),
        cdiSpec([
          { name: '0', node: '/dev/nvidia0' },
          { name: '1', node: '/dev/nvidia1' },
          { name: '2', node: '/dev/nvidia2' },
        ]),
      );
      const m = t.claim('mig', [result(MIG_NAME)]);
      const noMig = await client.prepare([m]);
      assert.match(
        noMig.claims[m.uid]!.error,
        new RegExp(
          String.raw`has no device for MIG device 2:0 \(MIG-2222.*looked for 2:0, MIG-2222[^,]*, mig2:0\): ` +
            'it was generated before the GPUs or the MIG layout changed; run `nvidia-ctk cdi generate',
        ),
      );
      // Index 1 now names another GPU (the spec predates a GPU leaving): /dev/nvidia5 is not GPU 1's.
      writeFileSync(
        join(t.cdi, 'nvidia.yaml'),
        cdiSpec([
          { name: '0', node: '/dev/nvidia0' },
          { name: '1', node: '/dev/nvidia5' },
        ]),
      );
      const g = t.claim('g1', [result('gpu-1')]);
      const wrong = await client.prepare([g]);
      assert.match(
        wrong.claims[g.uid]!.error,
        /the CDI spec .*nvidia\.yaml is stale: its device 1 has \/dev\/nvidia5, but GPU 1 .* is \/dev\/nvidia1/,
      );
      // A spec by UUID (--device-name-strategy=uuid) serves too; the first claim now prepares (it was retried).
      writeFileSync(join(t.cdi, 'nvidia.yaml'), cdiSpec([{ name: uuid(0), node: '/dev/nvidia0' }]));
      const ok = await client.prepare([c]);
      assert.deepEqual(
        ok.claims[c.uid]!.devices.map((d) => d.cdi_device_ids),
        [[`nvidia.com/gpu=${uuid(0)}`]],
      );
    } finally {
      await t.done();
    }
  },
);

test(
  'a GPU left the bus: a claim for a GPU still present is prepared ' +
    'with the index-named spec of before (its device node matches)',
  async () => {
    const t = await setup();
    try {
      // GPU 0 leaves: NVML numbers the others anew (the GPU at /dev/nvidia1 is index 0, the MIG parent index 1).
      const scan = nodeScan();
      const gone = buildSnapshot(
        {
          ...scan,
          gpus: [
            { ...scan.gpus[1]!, index: 0 },
            { ...scan.gpus[2]!, index: 1 },
          ],
          mig: { modes: [null, { current: true, pending: true }], devices: [{ ...migDev, parent: 1 }] },
          nvlinks: scan.nvlinks.slice(1),
          pcie: [
            [-1, 40],
            [40, -1],
          ],
        },
        t.snapshot,
        false,
      );
      await t.plugin.apply(applied(gone, t.snapshot, 're-discovery: a GPU left'));
      const c = t.claim('present', [result('gpu-1')]);
      const r = await t.watcher.client(DRIVER).prepare([c]);
      assert.deepEqual(r.claims[c.uid], {
        devices: [
          { request_names: ['gpu'], pool_name: NODE, device_name: 'gpu-1', cdi_device_ids: ['nvidia.com/gpu=1'] },
        ],
        error: '',
      });
    } finally {
      await t.done();
    }
  },
);

test(
  'a device the checkpoint holds for another claim is refused, naming ' +
    'the device and the holder, unless the allocation says it may be shared',
  async () => {
    const t = await setup();
    try {
      const client = t.watcher.client(DRIVER);
      const first = t.claim('first', [result('gpu-0')]);
      assert.equal((await client.prepare([first])).claims[first.uid]!.error, '');
      const second = t.claim('second', [result('gpu-0'), result(MIG_NAME, 'other')]);
      const refused = await client.prepare([second]);
      assert.deepEqual(refused.claims[second.uid]!.devices, []);
      assert.match(
        refused.claims[second.uid]!.error,
        new RegExp(`device gpu-0 is already prepared for claim team-a/first \\(uid ${first.uid}\\)`),
      );
      assert.deepEqual(Object.keys(checkpointOf(t).claims), [first.uid], 'a refused claim is not recorded');
      // Admin access (a monitoring claim) may use a device in use, and a claim in use is not refused
      // because of an admin-access holder.
      const admin = t.claim('admin', [{ ...result('gpu-0'), adminAccess: true }]);
      assert.equal((await client.prepare([admin])).claims[admin.uid]!.error, '');
      // A shareable device's results carry a shareID: each share may be prepared.
      const shareA = t.claim('share-a', [{ ...result('gpu-1'), shareID: 'aaaaaaaa-0000-4000-8000-000000000001' }]);
      const shareB = t.claim('share-b', [{ ...result('gpu-1'), shareID: 'aaaaaaaa-0000-4000-8000-000000000002' }]);
      const shared = await client.prepare([shareA, shareB]);
      assert.equal(shared.claims[shareA.uid]!.error, '');
      assert.equal(shared.claims[shareB.uid]!.error, '');
      // Each share is answered with its shareID (v1) and recorded with it.
      assert.equal(shared.claims[shareA.uid]!.devices[0]!.share_id, 'aaaaaaaa-0000-4000-8000-000000000001');
      assert.equal(shared.claims[shareB.uid]!.devices[0]!.share_id, 'aaaaaaaa-0000-4000-8000-000000000002');
      const recorded = checkpointOf(t).claims[shareB.uid]!.devices[0] as { shareId?: string };
      assert.equal(recorded.shareId, 'aaaaaaaa-0000-4000-8000-000000000002');
      // An exclusive claim of a device prepared as shared elsewhere is refused too.
      const exclusive = t.claim('exclusive', [result('gpu-1')]);
      assert.match(
        (await client.prepare([exclusive])).claims[exclusive.uid]!.error,
        /device gpu-1 is already prepared for claim team-a\/share-/,
      );
      // Once the holder is unprepared, the second claim prepares.
      await client.unprepare([first]);
      const later = await client.prepare([second]);
      assert.equal(later.claims[second.uid]!.error, '');
    } finally {
      await t.done();
    }
  },
);

test(
  "prepare reads NVIDIA's GpuConfig from the allocation: a bad one refuses the claim naming the field, a good " +
    'one without an MPS root is refused saying so',
  async () => {
    const t = await setup();
    try {
      const client = t.watcher.client(DRIVER);
      const withConfig = (name: string, interval: string): Claim => {
        const stored = t.api.putClaim({
          namespace: 'team-a',
          name,
          status: {
            allocation: {
              devices: {
                results: [result('gpu-0')],
                config: [
                  {
                    source: 'FromClaim',
                    requests: ['gpu'],
                    opaque: {
                      driver: DRIVER,
                      parameters: {
                        apiVersion: 'resource.nvidia.com/v1beta1',
                        kind: 'GpuConfig',
                        sharing: { strategy: 'TimeSlicing', timeSlicingConfig: { interval } },
                      },
                    },
                  },
                ],
              },
            },
          },
        });
        return { namespace: 'team-a', name, uid: (stored.metadata as { uid: string }).uid };
      };
      const bad = withConfig('bad', 'Eternal');
      const refused = (await client.prepare([bad])).claims[bad.uid]!;
      assert.deepEqual(refused.devices, []);
      assert.match(
        refused.error,
        new RegExp(
          String.raw`status\.allocation\.devices\.config\[0\]\.opaque\.parameters\.sharing\.timeSlicingConfig\.` +
            'interval: "Eternal" is not a time-slice interval; it is Default, Short, Medium or Long',
        ),
      );
      // A valid one needs the host set up by the MPS unit's agent (test/e2e/dra-sharing.test.ts): without
      // an MPS root to write its request under, it is refused saying so.
      const good = withConfig('good', 'Long');
      assert.match(
        (await client.prepare([good])).claims[good.uid]!.error,
        /claim team-a\/good: it asks for time-slicing, which needs the MPS root \(--mps-root, MPS_ROOT/,
      );
      assert.equal(existsSync(join(t.plugins, DRIVER, CHECKPOINT_FILE)), false, 'a refused claim is not recorded');
    } finally {
      await t.done();
    }
  },
);

test(
  'the checkpoint outlives the plugin object: prepare → stop → a new ' +
    'plugin answers and unprepares; a different boot ID voids every record',
  async () => {
    const t = await setup();
    try {
      const c = t.claim('one', [result('gpu-0')]);
      const d = t.claim('two', [result('gpu-1')]);
      const first = await t.watcher.client(DRIVER).prepare([c, d]);
      await t.plugin.stop();
      await t.watcher.waitForDeregistrations(1);
      const second = await t.newPlugin();
      await t.watcher.waitForRegistrations(2);
      assert.deepEqual(
        second
          .preparedClaims()
          .map((x) => x.name)
          .sort(),
        ['one', 'two'],
      );
      const reads = t.reads.count;
      assert.deepEqual(await t.watcher.client(DRIVER).prepare([c]), { claims: { [c.uid]: first.claims[c.uid] } });
      assert.equal(t.reads.count, reads, 'answered from the checkpoint');
      assert.deepEqual((await t.watcher.client(DRIVER).unprepare([c])).claims[c.uid], { error: '' });
      assert.deepEqual(Object.keys(checkpointOf(t).claims), [d.uid]);
      // The node rebooted: the record of `two` is void.
      await second.stop();
      await t.watcher.waitForDeregistrations(2);
      writeFileSync(t.bootId, 'boot-2\n');
      const third = await t.newPlugin();
      await t.watcher.waitForRegistrations(3);
      assert.deepEqual(third.preparedClaims(), []);
      assert.deepEqual(checkpointOf(t), { version: 'gpu-device-plugin.dra/v1', bootId: 'boot-2', claims: {} });
      assert.ok(
        t.lines.some((l) =>
          / INFO the node rebooted since the DRA checkpoint was written: its prepared claims are void .*voided=1/.test(
            l,
          ),
        ),
        t.lines.join('\n'),
      );
      await t.watcher.client(DRIVER).prepare([d]);
      assert.equal(t.reads.count, reads + 1, 'read from the API server again');
    } finally {
      await t.done();
    }
  },
);

test('an unreadable checkpoint is moved aside and named in the log; the plugin starts with no claims', async () => {
  const t = await setup();
  try {
    await t.plugin.stop();
    const path = join(t.plugins, DRIVER, CHECKPOINT_FILE);
    writeFileSync(path, '{"version":');
    const p = await t.newPlugin();
    assert.deepEqual(p.preparedClaims(), []);
    assert.ok(
      t.lines.some((l) =>
        new RegExp(
          ' ERROR the DRA checkpoint cannot be read; moved ' +
            String.raw`aside.*movedTo=.*gpu-device-plugin-checkpoint\.json\.unreadable-`,
        ).test(l),
      ),
      t.lines.join('\n'),
    );
  } finally {
    await t.done();
  }
});

test(
  'registration socket deleted → served again and registered again ' +
    'at once; dra.sock deleted → served again; listeners hear both',
  async () => {
    const t = await setup();
    try {
      const events: string[] = [];
      t.plugin.onRegistered(() => events.push('registered'));
      t.plugin.onRegistrationLost((why) => events.push(`lost: ${why}`));
      const times: number[] = [];
      for (let i = 0; i < 5; i++) {
        const before = performance.now();
        unlinkSync(join(t.registry, `${DRIVER}-reg.sock`));
        const reg = await t.watcher.waitForRegistrations(2 + i);
        times.push(reg.at - before);
      }
      assert.equal(t.plugin.registrations, 6);
      assert.equal(events.filter((e) => e === 'registered').length, 5);
      assert.equal(events.filter((e) => e.startsWith('lost: our registration socket was removed')).length, 5);
      times.sort((a, b) => a - b);
      console.log(
        `# registration socket deleted → registered again: ` +
          `median ${times[2]!.toFixed(1)} ms, max ${times[4]!.toFixed(1)} ms (n=5)`,
      );
      // dra.sock removed: served again, and prepare works through the same registration.
      unlinkSync(join(t.plugins, DRIVER, 'dra.sock'));
      await t.waitForLine(/ INFO dra\.sock was removed; serving it again/);
      // The registered client's connection was cut with the old server and is in gRPC's reconnect
      // back-off (the kubelet retries a failed prepare with the pod's next sync): dial afresh.
      const c = t.claim('after', [result('gpu-0')]);
      const fresh = new DraClient(t.watcher.registered(DRIVER)!.endpoint, 'v1');
      const r = await fresh.prepare([c], 5000);
      fresh.close();
      assert.equal(r.claims[c.uid]!.error, '');
      // The whole registry directory wiped and re-created (the parent's watch follows it).
      const n = t.watcher.registrations.length;
      await t.watcher.stop();
      rmSync(t.registry, { recursive: true });
      mkdirSync(t.registry);
      t.watcher = await PluginWatcherStandIn.start(t.registry);
      await t.watcher.waitForRegistrations(1);
      assert.equal(t.plugin.registrations, n + 1);
    } finally {
      await t.done();
    }
  },
);

test(
  'the kubelet restarts: the new plugin watcher finds ' + 'our socket and registers us again; listeners hear it',
  async () => {
    const t = await setup();
    try {
      let heard = 0;
      t.plugin.onRegistered(() => heard++);
      await t.watcher.stop();
      const before = performance.now();
      t.watcher = await PluginWatcherStandIn.start(t.registry);
      const reg = await t.watcher.waitForRegistrations(1);
      console.log(`# kubelet stand-in restarted → registered: ${(reg.at - before).toFixed(1)} ms`);
      assert.equal(heard, 1);
      assert.equal(t.plugin.registrations, 2);
      const c = t.claim('one', [result('gpu-0')]);
      assert.equal((await t.watcher.client(DRIVER).prepare([c])).claims[c.uid]!.error, '');
    } finally {
      await t.done();
    }
  },
);

test(
  'the health stream: the complete list on open, a new message when a ' +
    'device turns unhealthy (with the reason) or leaves; closed cleanly on stop',
  async () => {
    const t = await setup();
    try {
      const all = await t.watcher.waitForHealth(DRIVER, (d) => d.length === 3);
      assert.deepEqual(
        all.map((d) => [d.device?.pool_name, d.device?.device_name, d.health]),
        [
          [NODE, 'gpu-0', HealthStatus.HEALTHY],
          [NODE, 'gpu-1', HealthStatus.HEALTHY],
          [NODE, MIG_NAME, HealthStatus.HEALTHY],
        ],
      );
      assert.equal(all[0]!.last_updated_time, 1_700_000_000);
      const sick = withHealth(
        t.snapshot,
        new Map([
          [
            uuid(1),
            {
              state: { ...freshHealthState(), health: 'Unhealthy', lastXid: 79 },
              reason: 'critical XID 79 (GPU has fallen off the bus)',
              since: 1_700_000_123_000,
            },
          ],
        ]),
      );
      const messages = t.watcher.health.get(DRIVER)!.messages;
      await t.plugin.apply(applied(sick, t.snapshot, 'health changed'));
      const now = await t.watcher.waitForHealth(DRIVER, (d) => d[1]?.health === HealthStatus.UNHEALTHY);
      assert.deepEqual(
        { ...now[1], device: now[1]!.device },
        {
          device: { pool_name: NODE, device_name: 'gpu-1' },
          health: HealthStatus.UNHEALTHY,
          last_updated_time: 1_700_000_123,
          health_check_timeout_seconds: 30,
          message: 'critical XID 79 (GPU has fallen off the bus)',
        },
      );
      assert.equal(now[0]!.health, HealthStatus.HEALTHY);
      assert.equal(t.watcher.health.get(DRIVER)!.messages, messages + 1);
      // The same health again: no message.
      await t.plugin.apply(applied(sick, sick, 'config reloaded'));
      const c = t.claim('one', [result('gpu-0')]);
      await t.watcher.client(DRIVER).prepare([c]);
      assert.equal(t.watcher.health.get(DRIVER)!.messages, messages + 1);
      // A long reason is cut to 1024 characters.
      const long = withHealth(
        sick,
        new Map([
          [
            uuid(0),
            {
              state: { ...freshHealthState(), health: 'Unhealthy' },
              reason: 'x'.repeat(3000),
              since: 1_700_000_200_000,
            },
          ],
        ]),
      );
      await t.plugin.apply(applied(long, sick, 'health changed'));
      const cut = await t.watcher.waitForHealth(DRIVER, (d) => d[0]?.health === HealthStatus.UNHEALTHY);
      assert.equal(cut[0]!.message.length, 1024);
      // GPU 1 leaves the node: the next list no longer has it.
      const scan = nodeScan();
      const gone = buildSnapshot(
        {
          ...scan,
          gpus: [scan.gpus[0]!, scan.gpus[2]!],
          mig: { modes: [null, { current: true, pending: true }], devices: [{ ...migDev, parent: 1 }] },
          nvlinks: scan.nvlinks.slice(0, 2),
          pcie: [
            [-1, 40],
            [40, -1],
          ],
        },
        long,
        false,
      );
      await t.plugin.apply(applied(gone, long, 're-discovery: a GPU left'));
      const two = await t.watcher.waitForHealth(DRIVER, (d) => d.length === 2);
      assert.deepEqual(
        two.map((d) => [d.device?.device_name, d.health]),
        [
          ['gpu-0', HealthStatus.UNHEALTHY],
          [MIG_NAME, HealthStatus.HEALTHY],
        ],
      );
      // A stream of our own (the stand-in drops its stream when the registration socket goes, which
      // may come first): on stop it ends with status OK, not an error.
      const own = new DraClient(t.watcher.registered(DRIVER)!.endpoint, 'v1');
      const stream = own.watchHealth('v1alpha1');
      const first = await new Promise<NodeWatchResourcesResponse>((resolve) => stream.once('data', resolve));
      assert.equal(first.devices.length, 2);
      const end = new Promise<string>((resolve) => {
        stream.on('data', () => undefined);
        stream.on('error', (err) => resolve(`error ${err.message}`));
        stream.on('status', (st: { code: number }) => resolve(`status ${st.code}`));
      });
      await t.plugin.stop();
      assert.equal(await end, 'status 0');
      own.close();
    } finally {
      await t.done();
    }
  },
);

test('a 1.37 kubelet reads the v1 health stream; a v1alpha1 stream open beside it gets the same lists', async () => {
  const t = await setup({ healthVersions: ['v1', 'v1alpha1'] });
  try {
    assert.equal(t.watcher.registered(DRIVER)!.healthVersion, 'v1');
    const all = await t.watcher.waitForHealth(DRIVER, (d) => d.length === 3);
    assert.ok(all.every((d) => d.health === HealthStatus.HEALTHY));
    const old = new DraClient(t.watcher.registered(DRIVER)!.endpoint, 'v1');
    const alpha = old.watchHealth('v1alpha1');
    const lists: NodeWatchResourcesResponse[] = [];
    alpha.on('data', (m: NodeWatchResourcesResponse) => lists.push(m));
    alpha.on('error', () => undefined);
    await waitUntil(() => lists.length === 1, { on: onEvent(alpha, 'data'), what: 'the v1alpha1 list' });
    assert.deepEqual(lists[0]!.devices, all);
    const sick = withHealth(
      t.snapshot,
      new Map([
        [
          uuid(0),
          {
            state: { ...freshHealthState(), health: 'Unhealthy', lastXid: 48 },
            reason: 'critical XID 48',
            since: 1_700_000_050_000,
          },
        ],
      ]),
    );
    await t.plugin.apply(applied(sick, t.snapshot, 'health changed'));
    const v1 = await t.watcher.waitForHealth(DRIVER, (d) => d[0]?.health === HealthStatus.UNHEALTHY);
    await waitUntil(() => lists.length === 2, { on: onEvent(alpha, 'data'), what: 'the second v1alpha1 list' });
    assert.deepEqual(lists[1]!.devices, v1);
    assert.equal(v1[0]!.message, 'critical XID 48');
    alpha.cancel();
    old.close();
  } finally {
    await t.done();
  }
});

test(
  'no registry directory at start (kubelet not there yet): the start ' +
    'goes on, says so once, and registers when the directory appears',
  async () => {
    const t = await setup();
    try {
      await t.plugin.stop();
      await t.watcher.stop();
      rmSync(t.registry, { recursive: true });
      const p = await t.newPlugin();
      assert.equal(p.registered, false);
      assert.equal(
        t.lines.filter((l) =>
          / WARN cannot serve the DRA sockets yet; trying again when the directories change .*plugins_registry/.test(l),
        ).length,
        1,
        t.lines.join('\n'),
      );
      mkdirSync(t.registry);
      t.watcher = await PluginWatcherStandIn.start(t.registry);
      await t.watcher.waitForRegistrations(1);
      assert.equal(p.registered, true);
      await t.waitForLine(/ INFO serving the DRA sockets again/);
    } finally {
      await t.done();
    }
  },
);

test(
  'a kubelet that refuses the registration: its error is ' + 'logged at ERROR and listeners hear the registration lost',
  async () => {
    const t = await setup();
    try {
      const lost: string[] = [];
      t.plugin.onRegistrationLost((why) => lost.push(why));
      await t.watcher.stop();
      // A kubelet speaking no DRAPlugin version we offer (none at all, here).
      t.watcher = await PluginWatcherStandIn.start(t.registry, { versions: [] });
      const r = await t.watcher.waitForRejections(1);
      assert.equal(r.notified, true);
      await t.waitForLine(/ ERROR the kubelet refused the DRA plugin's registration /);
      assert.equal(t.plugin.registered, false);
      assert.equal(lost.length, 1);
      assert.match(
        lost[0]!,
        new RegExp(
          '^the kubelet refused the registration: RegisterPlugin error -- ' +
            'plugin validation failed .*none of services supported by the plugin',
        ),
      );
      assert.ok(
        t.lines.some(
          (l) => l.includes(' ERROR the kubelet refused') && l.includes('none of services supported by the plugin'),
        ),
      );
    } finally {
      await t.done();
    }
  },
);

test(
  'leak-free: 40 deletions of the registration socket and ' +
    'dra.sock leave the open file descriptors where they were',
  async () => {
    const t = await setup();
    try {
      const fds = (): number => readdirSync('/proc/self/fd').length;
      // One round first, so that lazily made things (grpc-js's channels, the watches) exist.
      unlinkSync(join(t.registry, `${DRIVER}-reg.sock`));
      await t.watcher.waitForRegistrations(2);
      const before = fds();
      for (let i = 0; i < 40; i++) {
        const n = t.watcher.registrations.length;
        unlinkSync(join(t.plugins, DRIVER, 'dra.sock'));
        // A pass of the plugin under way may have looked at dra.sock just before it went and at the
        // registration socket just after: it serves the registration socket again (a registration),
        // and dra.sock on its next pass. So wait for both; the registration socket may already be
        // gone again when the next round removes it.
        rmSync(join(t.registry, `${DRIVER}-reg.sock`), { force: true });
        await t.watcher.waitForRegistrations(n + 1);
        await t.waitForLine(/ INFO dra\.sock was removed; serving it again/, i + 1);
      }
      const after = fds();
      console.log(`# open fds: ${before} before, ${after} after 40 re-serves of both sockets`);
      assert.ok(after <= before + 4, `open fds grew from ${before} to ${after}`);
      assert.ok(t.plugin.registrations >= 42, `${t.plugin.registrations} registrations`);
    } finally {
      await t.done();
    }
  },
);

test(
  'the plugin directory wiped: made again, dra.sock served again, ' +
    'the checkpoint written again with the claims still prepared',
  async () => {
    const t = await setup();
    try {
      const c = t.claim('one', [result('gpu-0')]);
      const first = await t.watcher.client(DRIVER).prepare([c]);
      rmSync(join(t.plugins, DRIVER), { recursive: true });
      await t.waitForLine(/ INFO dra\.sock was removed; serving it again/);
      assert.ok(t.lines.some((l) => / INFO the DRA plugin directory was deleted; created it again/.test(l)));
      assert.deepEqual(Object.keys(checkpointOf(t).claims), [c.uid]);
      const fresh = new DraClient(t.watcher.registered(DRIVER)!.endpoint, 'v1');
      const reads = t.reads.count;
      assert.deepEqual(await fresh.prepare([c]), first);
      assert.equal(t.reads.count, reads);
      fresh.close();
    } finally {
      await t.done();
    }
  },
);

test('the checkpoint removed or edited by someone else while the plugin runs: written again at the next check', {
  timeout: 20_000,
}, async () => {
  const t = await setup({}, 50);
  try {
    const c = t.claim('one', [result('gpu-0')]);
    await t.watcher.client(DRIVER).prepare([c]);
    const path = join(t.plugins, DRIVER, CHECKPOINT_FILE);
    const want = readFileSync(path, 'utf8');
    rmSync(path);
    await t.waitForLine(/ WARN the DRA checkpoint was removed or changed by someone else; written again/);
    assert.equal(readFileSync(path, 'utf8'), want, 'the removed checkpoint is back, with the claim');
    writeFileSync(path, '{"version":"gpu-device-plugin.dra/v1","bootId":"boot-1","claims":{}}\n');
    await t.waitForLine(/ WARN the DRA checkpoint was removed or changed by someone else; written again/, 2);
    assert.equal(readFileSync(path, 'utf8'), want, 'the edited checkpoint is put right');
  } finally {
    await t.done();
  }
});

test("with the slice publisher listening: the kubelet's start " +
  "deletes the node's slices, our registration republishes them", {
  timeout: 20_000,
}, async () => {
  const t = await setup();
  const kube = new KubeClient({ server: t.api.url, source: 'test' });
  const pub = new SlicePublisher({
    client: kube,
    nodeName: NODE,
    log: createLogger({ level: 'error', journal: false, write: () => {} }),
    sysfsRoot: t.root,
  });
  try {
    t.api.putNode(NODE);
    t.plugin.onRegistered(() => pub.republish());
    pub.apply(applied(t.snapshot, null, 'start'));
    await pub.whenSynced();
    const ours = (): string[] =>
      [...t.api.slices.values()]
        .filter((s) => (s.spec as { nodeName?: string }).nodeName === NODE)
        .flatMap((s) => ((s.spec as { devices?: { name: string }[] }).devices ?? []).map((d) => d.name));
    assert.deepEqual(ours(), ['gpu-0', 'gpu-1', MIG_NAME]);
    const synced = pub.status().synced;
    await t.watcher.stop();
    // The kubelet starts: it deletes every slice of its node, then registers the plugins it finds.
    t.watcher = await PluginWatcherStandIn.start(t.registry, { slices: { janitor: t.api, nodeName: NODE } });
    assert.equal(t.watcher.wipes[0]?.deleted, 1);
    await t.watcher.waitForRegistrations(1);
    while (pub.status().synced === synced) await once(pub.events, 'synced');
    assert.deepEqual(ours(), ['gpu-0', 'gpu-1', MIG_NAME]);
  } finally {
    await pub.stop();
    kube.close();
    await t.done();
  }
});
