// dra/slice-publisher.ts in-process against the API server stand-in (real JSON, validation,
// resourceVersion conflicts, tokens, down/up): publish the 8-GPU and MIG fixtures, changes as
// in-place updates with a higher pool generation, no rewrite when nothing changed, taints on an XID
// and gone on recovery, a server down at start, a conflict, the kubelet's wipe and republish(),
// surplus slices, and credentials that may not write.
import { afterEach, beforeEach, test } from 'node:test';
import assert from 'node:assert/strict';
import { once } from 'node:events';
import { mkdirSync, mkdtempSync, rmSync, symlinkSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { buildSnapshot, withHealth } from '../../src/core/snapshot.ts';
import { diff } from '../../src/core/snapshot-diff.ts';
import type { NodeScan, NodeSnapshot } from '../../src/core/snapshot.ts';
import type { MigStrategy } from '../../src/core/mig.ts';
import { freshHealthState } from '../../src/core/health-tracker.ts';
import { NO_SHARING, SharingError } from '../../src/core/sharing.ts';
import { KubeClient } from '../../src/k8s/client.ts';
import { accessProblem, pcieRootOfPath, SlicePublisher, sliceName } from '../../src/dra/slice-publisher.ts';
import type { AppliedSnapshot, NodeSettings } from '../../src/node/consumer.ts';
import { createLogger } from '../../src/system/log.ts';
import { ApiServerStandIn } from '../support/apiserver.ts';
import type { ApiServerOptions, JsonObject } from '../support/apiserver.ts';
import { fixtureSnapshot, scanFixture } from '../support/node-scan.ts';

const NODE = 'node-a';
const SLICE = sliceName(NODE, 'gpu.nvidia.com', 0);

function settings(migStrategy: MigStrategy = 'none'): NodeSettings {
  return {
    plan: { deviceIdStrategy: 'uuid', sharing: NO_SHARING, migStrategy },
  };
}

function applied(
  snapshot: NodeSnapshot,
  previous: NodeSnapshot | null,
  migStrategy: MigStrategy = 'none',
): AppliedSnapshot {
  return {
    snapshot,
    change: diff(previous, snapshot),
    reason: 'test',
    reregister: null,
    settings: settings(migStrategy),
  };
}

interface Rig {
  api: ApiServerStandIn;
  pub: SlicePublisher;
  lines: string[];
  sysfs: string;
  client: KubeClient;
}

let rig: Rig | undefined;

async function start(opts: ApiServerOptions = {}, tokenFile?: string, down = false): Promise<Rig> {
  const api = await ApiServerStandIn.start(opts);
  api.putNode(NODE);
  if (down) await api.down();
  const lines: string[] = [];
  const log = createLogger({ level: 'info', journal: false, write: (l) => lines.push(l) });
  const sysfs = mkdtempSync(join(tmpdir(), 'gdp-pub-sysfs-'));
  const client = new KubeClient({
    server: api.url,
    source: 'test kubeconfig',
    ...(tokenFile !== undefined ? { tokenFile } : {}),
  });
  const pub = new SlicePublisher({
    client,
    nodeName: NODE,
    log,
    backoff: { initialMs: 5, maxMs: 40 },
    sysfsRoot: sysfs,
  });
  rig = { api, pub, lines, sysfs, client };
  return rig;
}

beforeEach(() => {
  rig = undefined;
});
afterEach(async () => {
  if (rig === undefined) return;
  await rig.pub.stop();
  rig.client.close();
  await rig.api.stop();
  rmSync(rig.sysfs, { recursive: true, force: true });
});

const stored = (api: ApiServerStandIn, name = SLICE): JsonObject => {
  const s = api.slices.get(name);
  assert.ok(s !== undefined, `no slice ${name}; slices: ${[...api.slices.keys()].join(', ')}`);
  return s;
};
const spec = (s: JsonObject): JsonObject => s.spec as JsonObject;
const meta = (s: JsonObject): JsonObject => s.metadata as JsonObject;
const pool = (s: JsonObject): JsonObject => spec(s).pool as JsonObject;
const devices = (s: JsonObject): JsonObject[] => spec(s).devices as JsonObject[];
const writes = (api: ApiServerStandIn): string[] =>
  api.requests.filter((r) => r.method !== 'GET').map((r) => `${r.method} ${r.code}`);
const count = (lines: string[], re: RegExp): number => lines.filter((l) => re.test(l)).length;

test(
  '8-GPU fixture: one slice owned by the Node, pool named after ' +
    'it, generation 1; applying the same node again writes nothing',
  async () => {
    const { api, pub, lines, sysfs } = await start();
    const s = await fixtureSnapshot('nvswitch-8.json');
    // GPU 0's PCIe root from sysfs, as the kernel lays it out.
    mkdirSync(join(sysfs, 'devices', 'pci0000:00', '0000:00:01.0', '0000:07:00.0'), { recursive: true });
    mkdirSync(join(sysfs, 'bus', 'pci', 'devices'), { recursive: true });
    symlinkSync(
      join(sysfs, 'devices', 'pci0000:00', '0000:00:01.0', '0000:07:00.0'),
      join(sysfs, 'bus', 'pci', 'devices', '0000:07:00.0'),
    );
    assert.equal(pub.apply(applied(s, null)), undefined, 'apply never waits on the API server');
    await pub.whenSynced();
    const slice = stored(api);
    const node = api.requests.find((r) => r.path === `/api/v1/nodes/${NODE}`);
    assert.ok(node !== undefined);
    assert.deepEqual(
      (meta(slice).ownerReferences as JsonObject[]).map((o) => [o.kind, o.name, typeof o.uid]),
      [['Node', NODE, 'string']],
    );
    assert.deepEqual(pool(slice), { name: NODE, generation: 1, resourceSliceCount: 1 });
    assert.equal(spec(slice).nodeName, NODE);
    assert.equal(spec(slice).driver, 'gpu.nvidia.com');
    assert.deepEqual(
      devices(slice).map((d) => d.name),
      ['gpu-0', 'gpu-1', 'gpu-2', 'gpu-3', 'gpu-4', 'gpu-5', 'gpu-6', 'gpu-7'],
    );
    assert.deepEqual((devices(slice)[0]!.attributes as JsonObject)['resource.kubernetes.io/pcieRoot'], {
      string: 'pci0000:00',
    });
    assert.deepEqual(writes(api), ['POST 201']);
    // The same node again, and a health-only snapshot that changes nothing: no write.
    pub.apply(applied(s, s));
    pub.apply(
      applied(
        withHealth(s, new Map([[s.gpus[3]?.uuid as string, { state: freshHealthState(), reason: null, since: null }]])),
        s,
      ),
    );
    await pub.whenSynced();
    await once(pub.events, 'synced');
    assert.deepEqual(writes(api), ['POST 201']);
    assert.equal(count(lines, /ResourceSlices published/), 1);
  },
);

test(
  'MIG fixture (mixed): the MIG devices and the MIG-disabled ' +
    'GPU, accepted by the server; a note for what is left out',
  async () => {
    const { api, pub, lines } = await start();
    const s = await fixtureSnapshot('mig-mixed-4.json', 'mixed');
    pub.apply(applied(s, null, 'mixed'));
    await pub.whenSynced();
    assert.deepEqual(
      devices(stored(api)).map((d) => d.name),
      [
        'gpu-0-mig-1g10gb-19-0',
        'gpu-0-mig-1g10gb-19-1',
        'gpu-0-mig-1g10gb-me-20-6',
        'gpu-0-mig-2g20gb-14-2',
        'gpu-1-mig-3g40gb-9-0',
        'gpu-1-mig-1g20gb-15-6',
        'gpu-1-mig-1g10gb-19-4',
        'gpu-1-mig-1g10gb-19-5',
        'gpu-2',
      ],
    );
    assert.equal(count(lines, /DRA: device not published/), 2);
  },
);

test(
  'a GPU removed: the same slice (name, uid) updated in place ' +
    'with a higher pool generation, never deleted and created',
  async () => {
    const { api, pub } = await start();
    const scan = await scanFixture('nvswitch-8.json', false);
    const s1 = buildSnapshot(scan, null, false);
    pub.apply(applied(s1, null));
    await pub.whenSynced();
    const uid = meta(stored(api)).uid;
    const less: NodeScan = {
      ...scan,
      gpus: scan.gpus.filter((_, i) => i !== 5),
      nvlinks: scan.nvlinks.filter((_, i) => i !== 5),
      pcie: scan.pcie.filter((_, i) => i !== 5).map((r) => r.filter((_, j) => j !== 5)),
    };
    const s2 = buildSnapshot(less, s1, false);
    pub.apply(applied(s2, s1));
    await pub.whenSynced();
    const slice = stored(api);
    assert.equal(meta(slice).uid, uid);
    assert.equal(pool(slice).generation, 2);
    assert.deepEqual(
      devices(slice).map((d) => d.name),
      ['gpu-0', 'gpu-1', 'gpu-2', 'gpu-3', 'gpu-4', 'gpu-6', 'gpu-7'],
    );
    assert.deepEqual(writes(api), ['POST 201', 'PUT 200']);
    assert.equal(pub.status().generation, 2);
  },
);

test(
  'an XID taints the device; the server fills timeAdded ' + 'and we do not rewrite for it; recovery removes the taint',
  async () => {
    const { api, pub } = await start();
    const s = await fixtureSnapshot('nvswitch-8.json');
    const g2 = s.gpus[2]?.uuid as string;
    pub.apply(applied(s, null));
    await pub.whenSynced();
    const sick = withHealth(
      s,
      new Map([
        [
          g2,
          {
            state: { ...freshHealthState(), health: 'Unhealthy', lastXid: 79, quietStartMs: 5 },
            reason: 'XID 79',
            since: 5,
          },
        ],
      ]),
    );
    pub.apply(applied(sick, s));
    await pub.whenSynced();
    const taints = devices(stored(api))[2]?.taints as JsonObject[];
    assert.deepEqual(
      taints.map((t) => [t.key, t.value, t.effect, typeof t.timeAdded]),
      [['gpu.nvidia.com/xid', '79', 'NoSchedule', 'string']],
    );
    assert.equal(pool(stored(api)).generation, 2);
    // The server's copy differs from ours (timeAdded): another snapshot of the same node writes nothing.
    pub.apply(applied(sick, sick));
    await once(pub.events, 'synced');
    assert.deepEqual(writes(api), ['POST 201', 'PUT 200']);
    const well = withHealth(sick, new Map([[g2, { state: freshHealthState(), reason: 'recovered', since: 9 }]]));
    pub.apply(applied(well, sick));
    await pub.whenSynced();
    assert.equal(devices(stored(api))[2]?.taints, undefined);
    assert.equal(pool(stored(api)).generation, 3);
  },
);

test(
  'the API server down at start: apply returns at once, retries with backoff, ' +
    'one WARN; when it is back the node is published and one INFO says so',
  async () => {
    const { api, pub, lines } = await start({}, undefined, true);
    const s = await fixtureSnapshot('nvswitch-8.json');
    pub.apply(applied(s, null));
    // Several failed attempts, not one line each.
    while (pub.status().failures < 4) await once(pub.events, 'failed');
    assert.equal(count(lines, /WARN.*the API server does not answer/), 1);
    assert.match(pub.status().failing ?? '', /cannot reach the API server/);
    await api.up();
    await pub.whenSynced();
    assert.deepEqual(pool(stored(api)), { name: NODE, generation: 1, resourceSliceCount: 1 });
    assert.equal(count(lines, /INFO.*the API server answers again/), 1);
    assert.equal(count(lines, /WARN/), 1);
    // It goes away again after a publish: one more WARN, one more INFO, and the change lands.
    await api.down();
    const sick = withHealth(
      s,
      new Map([
        [
          s.gpus[0]?.uuid as string,
          { state: { ...freshHealthState(), health: 'Unhealthy', lost: true }, reason: 'lost', since: 1 },
        ],
      ]),
    );
    pub.apply(applied(sick, s));
    const failed = pub.status().failures;
    while (pub.status().failures < failed + 3) await once(pub.events, 'failed');
    await api.up();
    await pub.whenSynced();
    assert.deepEqual(devices(stored(api))[0]?.taints !== undefined, true);
    assert.equal(count(lines, /WARN.*the API server does not answer/), 2);
    assert.equal(count(lines, /INFO.*the API server answers again/), 2);
  },
);

test(
  '409 Conflict (another writer between our read and ' + 'our update): read again and retry, the change lands',
  async () => {
    const { api, pub } = await start();
    const s = await fixtureSnapshot('nvswitch-8.json');
    pub.apply(applied(s, null));
    await pub.whenSynced();
    // The watch of our slices lists first; then it watches.
    await api.waitForRequests((r) => r.path.includes('watch=true'));
    // Right after the publisher's next list is answered, someone else updates the slice.
    let meddled = false;
    api.on('request', () => {
      const last = api.requests.at(-1);
      if (meddled || last?.method !== 'GET' || !last.path.startsWith('/apis/resource.k8s.io/v1/resourceslices?'))
        return;
      meddled = true;
      const cur = stored(api);
      api.slices.set(SLICE, { ...cur, metadata: { ...meta(cur), resourceVersion: '999999' } });
    });
    const sick = withHealth(
      s,
      new Map([
        [
          s.gpus[1]?.uuid as string,
          {
            state: { ...freshHealthState(), health: 'Unhealthy', lastXid: 48, permanent: true },
            reason: 'XID 48',
            since: 1,
          },
        ],
      ]),
    );
    pub.apply(applied(sick, s));
    await pub.whenSynced();
    assert.deepEqual(writes(api), ['POST 201', 'PUT 409', 'PUT 200']);
    assert.deepEqual(
      (devices(stored(api))[1]!.taints as JsonObject[]).map((t) => t.value),
      ['48'],
    );
    assert.equal(pub.status().failures, 0);
  },
);

test(
  "the kubelet wipes the node's slices at its start: " + 'republish() writes them again with a higher generation',
  async () => {
    const { api, pub, lines } = await start();
    const s = await fixtureSnapshot('nvswitch-8.json');
    pub.apply(applied(s, null));
    await pub.whenSynced();
    assert.equal(api.deleteNodeSlices(NODE), 1);
    pub.republish();
    await pub.whenSynced();
    assert.deepEqual(pool(stored(api)), { name: NODE, generation: 2, resourceSliceCount: 1 });
    assert.equal(devices(stored(api)).length, 8);
    assert.deepEqual(writes(api), ['POST 201', 'POST 201']);
    assert.equal(count(lines, /ResourceSlices published again/), 1);
  },
);

test('slices of ours under other names: one reused in place (same uid), the surplus deleted', async () => {
  const { api, pub } = await start();
  const seed = (name: string, gen: number): string => {
    const body = {
      metadata: { name },
      spec: {
        driver: 'gpu.nvidia.com',
        nodeName: NODE,
        pool: { name: NODE, generation: gen, resourceSliceCount: 2 },
        devices: [],
      },
    };
    api.slices.set(name, {
      ...body,
      metadata: { name, uid: `uid-${name}`, resourceVersion: '5' },
    } as unknown as JsonObject);
    return name;
  };
  seed(`${NODE}-gpu.nvidia.com-x7k2p`, 4);
  seed(`${NODE}-gpu.nvidia.com-q9z4t`, 4);
  // Another driver's slice on this node is none of ours.
  api.slices.set('other', {
    metadata: { name: 'other', uid: 'o', resourceVersion: '5' },
    spec: {
      driver: 'nic.example.com',
      nodeName: NODE,
      pool: { name: NODE, generation: 1, resourceSliceCount: 1 },
      devices: [],
    },
  });
  const s = await fixtureSnapshot('nvswitch-8.json');
  pub.apply(applied(s, null));
  await pub.whenSynced();
  assert.deepEqual([...api.slices.keys()].sort(), [`${NODE}-gpu.nvidia.com-q9z4t`, 'other']);
  const kept = stored(api, `${NODE}-gpu.nvidia.com-q9z4t`);
  assert.equal(meta(kept).uid, `uid-${NODE}-gpu.nvidia.com-q9z4t`);
  assert.deepEqual(pool(kept), { name: NODE, generation: 5, resourceSliceCount: 1 });
  assert.deepEqual(writes(api), ['PUT 200', 'DELETE 200']);
});

test(
  'credentials that may not write: the access check names what is missing; the ' +
    'publisher logs one ERROR, keeps the node going, and publishes once allowed',
  async () => {
    const tokens = {
      viewer: { user: 'system:node:node-a', allow: ['list resourceslices', 'get nodes'] },
      node: { user: 'system:node:node-a', allow: ['* resourceslices', 'get resourceclaims', 'get nodes'] },
    };
    const dir = mkdtempSync(join(tmpdir(), 'gdp-pub-token-'));
    const tokenFile = join(dir, 'token');
    writeFileSync(tokenFile, 'viewer');
    const { api, pub, lines } = await start({ tokens }, tokenFile);
    const viewer = new KubeClient({
      server: api.url,
      token: 'viewer',
      source: '/etc/gpu-device-plugin/kubeconfig (context node)',
    });
    const node = new KubeClient({ server: api.url, token: 'node', source: 'k' });
    const problem = await accessProblem(viewer);
    assert.equal(
      problem,
      `the credentials in /etc/gpu-device-plugin/kubeconfig (context node) may not create ` +
        `resourceslices.resource.k8s.io, update resourceslices.resource.k8s.io, delete ` +
        `resourceslices.resource.k8s.io, get resourceclaims.resource.k8s.io on ${api.url}; ` +
        `DRA mode needs them (apply the RBAC shipped with the package for this node's user)`,
    );
    assert.equal(await accessProblem(node), null);
    viewer.close();
    node.close();
    const s = await fixtureSnapshot('nvswitch-8.json');
    pub.apply(applied(s, null));
    while (pub.status().failures < 3) await once(pub.events, 'failed');
    assert.equal(
      count(
        lines,
        /ERROR DRA: the API server refuses our credentials.*403 Forbidden: .*cannot create resource .*resourceslices/,
      ),
      1,
      lines.join(''),
    );
    assert.equal(count(lines, /ERROR/), 1);
    assert.equal(api.slices.size, 0);
    // The RBAC is fixed (here: the token file now holds a token that may write): the next retry publishes.
    writeFileSync(tokenFile, 'node');
    await pub.whenSynced();
    assert.equal(devices(stored(api)).length, 8);
    assert.equal(count(lines, /INFO DRA: the API server answers again/), 1);
    rmSync(dir, { recursive: true, force: true });
  },
);

test(
  'a node the API server does not know: one ERROR naming ' + 'it and what to check; published once the Node exists',
  async () => {
    const { api, pub, lines } = await start();
    const s = await fixtureSnapshot('nvswitch-8.json');
    const otherClient = new KubeClient({ server: api.url, source: 't' });
    const other = new SlicePublisher({
      client: otherClient,
      nodeName: 'node-z',
      log: createLogger({ level: 'info', journal: false, write: (l) => lines.push(l) }),
      backoff: { initialMs: 5, maxMs: 20 },
    });
    try {
      other.apply(applied(s, null));
      while (other.status().failures < 3) await once(other.events, 'failed');
      assert.equal(
        count(
          lines,
          new RegExp(
            'ERROR DRA: ResourceSlices cannot be published for a node the API server ' +
              'does not know .*has no Node named .*node-z.*is the node name right',
          ),
        ),
        1,
        lines.join(''),
      );
      api.putNode('node-z');
      await other.whenSynced();
      assert.equal(devices(stored(api, sliceName('node-z', 'gpu.nvidia.com', 0))).length, 8);
    } finally {
      await other.stop();
      otherClient.close();
    }
    void pub;
  },
);

test('pcieRoot from a sysfs path: the pci<domain>:<bus> of the root complex', () => {
  assert.equal(pcieRootOfPath('/sys/devices/pci0000:00/0000:00:01.0/0000:07:00.0'), 'pci0000:00');
  assert.equal(pcieRootOfPath('/sys/devices/pci0001:80/0001:80:02.0/0001:81:00.0'), 'pci0001:80');
  assert.equal(pcieRootOfPath('/sys/devices/platform/foo'), null);
  assert.equal(sliceName('x'.repeat(253), 'gpu.nvidia.com', 0).length, 253);
});

test(
  'a stop while a request hangs: halt() and closing the ' + 'client end it at once, with no warning and no retry',
  async () => {
    const { createServer } = await import('node:http');
    const hang = createServer(() => {
      /* never answers */
    });
    await new Promise<void>((r) => hang.listen(0, '127.0.0.1', r));
    const lines: string[] = [];
    const log = createLogger({ level: 'info', journal: false, write: (l) => lines.push(l) });
    const client = new KubeClient({
      server: `http://127.0.0.1:${(hang.address() as { port: number }).port}`,
      source: 'test kubeconfig',
    });
    const pub = new SlicePublisher({ client, nodeName: NODE, log, backoff: { initialMs: 5, maxMs: 40 } });
    try {
      const requested = once(hang, 'request');
      pub.apply(applied(await fixtureSnapshot('nvswitch-8.json'), null));
      await requested;
      pub.halt();
      client.close();
      await pub.stop();
      assert.deepEqual(
        lines.filter((l) => / (WARN|ERROR) /.test(l)),
        [],
        'nothing reported for a request the stop ended',
      );
    } finally {
      client.close();
      hang.closeAllConnections();
      await new Promise<void>((r) => hang.close(() => r()));
    }
  },
);

const SHARES = { memory: { default: 8 * 2 ** 30, validRange: { min: 2 ** 30, step: 2 ** 30 } } };

function withCapacity(a: AppliedSnapshot, capacity: NodeSettings['plan']['consumableCapacity']): AppliedSnapshot {
  return {
    ...a,
    settings: { plan: { ...a.settings.plan, ...(capacity === undefined ? {} : { consumableCapacity: capacity }) } },
  };
}

test(
  'consumable capacity: a reload that turns it on, changes it or turns it off republishes; ' +
    'one that does not fit the GPUs is refused and the slices stay',
  async () => {
    const { api, pub } = await start();
    const s = await fixtureSnapshot('nvswitch-8.json');
    pub.apply(applied(s, null));
    await pub.whenSynced();
    assert.equal(devices(stored(api))[0]!.allowMultipleAllocations, undefined);
    pub.apply(withCapacity(applied(s, s), SHARES));
    await pub.whenSynced();
    assert.equal(pool(stored(api)).generation, 2);
    for (const d of devices(stored(api))) {
      assert.equal(d.allowMultipleAllocations, true);
      assert.deepEqual((d.capacity as JsonObject).memory, {
        value: '80Gi',
        requestPolicy: { default: '8Gi', validRange: { min: '1Gi', step: '1Gi' } },
      });
    }
    const four = { memory: { ...SHARES.memory, default: 4 * 2 ** 30 } };
    pub.apply(withCapacity(applied(s, s), four));
    await pub.whenSynced();
    assert.equal(pool(stored(api)).generation, 3);
    assert.deepEqual(
      (((devices(stored(api))[0]!.capacity as JsonObject).memory as JsonObject).requestPolicy as JsonObject).default,
      '4Gi',
    );
    // Larger than the GPUs' 80Gi: refused, naming the key and the GPU; nothing written.
    const huge = { memory: { default: 96 * 2 ** 30, validValues: [96 * 2 ** 30] } };
    assert.throws(
      () => pub.apply(withCapacity(applied(s, s), huge)),
      (e: unknown) =>
        e instanceof SharingError &&
        e.path === 'dra.consumableCapacity.memory.default' &&
        /96Gi is more than GPU 0's \(GPU-[0-9a-f-]+\) memory \(80Gi\)/.test(e.message),
    );
    await pub.whenSynced();
    assert.equal(pool(stored(api)).generation, 3);
    pub.apply(applied(s, s));
    await pub.whenSynced();
    assert.equal(pool(stored(api)).generation, 4);
    assert.ok(devices(stored(api)).every((d) => d.allowMultipleAllocations === undefined));
    assert.deepEqual((devices(stored(api))[0]!.capacity as JsonObject).memory, { value: '80Gi' });
  },
);

test('dynamic MIG where the server drops counter sets (1.35, gate off): an ERROR, no partitions', async () => {
  const publish = async (gate: boolean | undefined): Promise<{ api: ApiServerStandIn; lines: string[] }> => {
    const { api, pub, lines } = await start({
      version: 'v1.35.4',
      ...(gate !== undefined ? { partitionableDevices: gate } : {}),
    });
    pub.setServerVersion({ major: 1, minor: 35 });
    const a = applied(await fixtureSnapshot('mig-dynamic-16.json', 'mixed'), null, 'mixed');
    pub.apply({ ...a, settings: { plan: { ...a.settings.plan, dynamicMig: true } } });
    await pub.whenSynced();
    return { api, lines };
  };
  const { api, lines } = await publish(undefined);
  const all = [...api.slices.values()];
  const names = all.flatMap((sl) => devices(sl) ?? []).map((d) => d.name);
  assert.ok(!all.some((sl) => spec(sl).sharedCounters !== undefined), 'no counter-set slice');
  assert.ok(!names.includes('gpu-2-mig-3g20gb-9-4'), 'no partition, which would count nothing');
  assert.ok(names.includes('gpu-0-mig-3g20gb-9-0'), 'the existing instance as a MIG device');
  assert.ok(
    all.every(
      (sl) =>
        pool(sl).resourceSliceCount === all.length && pool(sl).generation === pool(all[0] as JsonObject).generation,
    ),
  );
  const refused = / ERROR DRA: dra\.dynamicMig needs the API server.s DRAPartitionableDevices feature gate/;
  assert.equal(count(lines, refused), 1, lines.join('\n'));
  // The same version with the gate turned on keeps the counter sets: partitions are published.
  await rig?.pub.stop();
  rig?.client.close();
  await rig?.api.stop();
  const on = await publish(true);
  const onNames = [...on.api.slices.values()].flatMap((sl) => devices(sl) ?? []).map((d) => d.name);
  assert.ok(onNames.includes('gpu-2-mig-3g20gb-9-4'));
  assert.equal(count(on.lines, /DRAPartitionableDevices/), 0);
});
