// core/dra-slices.ts: the node's pool as NVIDIA's DRA driver describes devices, the
// standard attributes, the NVLink domain, taints from health, and the cut into slices — on snapshots
// read from the fixtures by the real scan over the fake NVML, and checked against the API server
// stand-in's validation (which refuses what the real server refuses).
import { after, before, test } from 'node:test';
import assert from 'node:assert/strict';
import {
  cudaVersionOf,
  MAX_DEVICES_PER_SLICE,
  nvlinkDomains,
  poolContent,
  semverOf,
  standardBusId,
  taintsOf,
} from '../../src/core/dra-slices.ts';
import type { PoolContent, SliceDevice } from '../../src/core/dra-slices.ts';
import { buildSnapshot, withHealth } from '../../src/core/snapshot.ts';
import type { NodeScan, NodeSnapshot, UnitHealth } from '../../src/core/snapshot.ts';
import { freshHealthState } from '../../src/core/health-tracker.ts';
import { KubeApiError, KubeClient } from '../../src/k8s/client.ts';
import { createSlice } from '../../src/k8s/resources.ts';
import { ApiServerStandIn } from '../support/apiserver.ts';
import type { JsonObject } from '../support/apiserver.ts';
import { fixtureSnapshot } from '../support/node-scan.ts';
import { migUuid } from '../support/mig.ts';

let api: ApiServerStandIn;
let client: KubeClient;
before(async () => {
  api = await ApiServerStandIn.start();
  client = new KubeClient({ server: api.url, source: 'test' });
});
after(async () => {
  client.close();
  await api.stop();
});

let sliceNo = 0;
/** Creates the pool's slices on the stand-in (the real validation); returns them as stored. */
async function publish(c: PoolContent, node = 'node-a'): Promise<JsonObject[]> {
  const out: JsonObject[] = [];
  for (const devices of c.slices) {
    const stored = await createSlice(client, {
      metadata: { name: `test-${++sliceNo}` },
      spec: {
        driver: 'gpu.nvidia.com',
        nodeName: node,
        pool: { name: c.pool, generation: 1, resourceSliceCount: c.slices.length },
        devices,
      },
    });
    out.push(stored as unknown as JsonObject);
  }
  return out;
}

const device = (c: PoolContent, name: string): SliceDevice => {
  const d = c.slices.flat().find((x) => x.name === name);
  assert.ok(
    d !== undefined,
    `no device ${name} in ${c.slices
      .flat()
      .map((x) => x.name)
      .join(', ')}`,
  );
  return d;
};

test('versions as strict semver; bus ids in the standard form', () => {
  assert.equal(semverOf('550.54.15'), '550.54.15');
  assert.equal(semverOf('535.104.05'), '535.104.5');
  assert.equal(semverOf('560.28'), '560.28.0');
  assert.equal(semverOf('r550-beta'), null);
  assert.equal(cudaVersionOf(12040), '12.4.0');
  assert.equal(cudaVersionOf(12080), '12.8.0');
  assert.equal(standardBusId('00000000:0F:00.0'), '0000:0f:00.0');
  assert.equal(standardBusId('0000:07:00.0'), '0000:07:00.0');
});

test(
  "8-GPU fixture: one slice, whole GPUs described as NVIDIA's " +
    'DRA driver does, one NVLink domain; the stand-in accepts it',
  async () => {
    const s = await fixtureSnapshot('nvswitch-8.json');
    const c = poolContent(s, {
      nodeName: 'node-a',
      migStrategy: 'none',
      pcieRoots: new Map([['00000000:07:00.0', 'pci0000:00']]),
    });
    assert.equal(c.pool, 'node-a');
    assert.equal(c.slices.length, 1);
    assert.deepEqual(c.notes, []);
    assert.deepEqual(
      c.slices[0]?.map((d) => d.name),
      ['gpu-0', 'gpu-1', 'gpu-2', 'gpu-3', 'gpu-4', 'gpu-5', 'gpu-6', 'gpu-7'],
    );
    assert.deepEqual(device(c, 'gpu-0'), {
      name: 'gpu-0',
      attributes: {
        type: { string: 'gpu' },
        uuid: { string: 'GPU-09e82cf9-5843-cd6f-cb89-39a442403932' },
        productName: { string: 'NVIDIA A100-SXM4-80GB' },
        cudaComputeCapability: { version: '8.0.0' },
        driverVersion: { version: '550.54.15' },
        cudaDriverVersion: { version: '12.4.0' },
        'resource.kubernetes.io/pciBusID': { string: '0000:07:00.0' },
        'resource.kubernetes.io/pcieRoot': { string: 'pci0000:00' },
        'resource.kubernetes.io/numaNode': { int: 0 },
        nvlinkDomain: { int: 0 },
      },
      capacity: { memory: { value: '80Gi' } },
    });
    // Only what was read: no pcieRoot where sysfs gave none; NUMA 1 for the second half.
    assert.equal(device(c, 'gpu-5').attributes['resource.kubernetes.io/pcieRoot'], undefined);
    assert.deepEqual(device(c, 'gpu-5').attributes['resource.kubernetes.io/numaNode'], { int: 1 });
    const stored = await publish(c);
    const devices = (stored[0]!.spec as JsonObject).devices as JsonObject[];
    // Written in the canonical form the server stores, so what it returns reads the same.
    assert.deepEqual((devices[0]!.capacity as JsonObject).memory, { value: '80Gi' });
  },
);

test(
  'MIG fixture (mixed): MIG devices with parentUUID, profile, engines, ' +
    'memory and the memory slices they occupy; the MIG-disabled GPU whole',
  async () => {
    const s = await fixtureSnapshot('mig-mixed-4.json', 'mixed');
    const c = poolContent(s, { nodeName: 'node-mig', migStrategy: 'mixed' });
    const parent = s.gpus[0]?.uuid as string;
    assert.deepEqual(device(c, 'gpu-0-mig-2g20gb-14-2'), {
      name: 'gpu-0-mig-2g20gb-14-2',
      attributes: {
        type: { string: 'mig' },
        uuid: { string: migUuid(parent, '2g.20gb', 4) },
        parentUUID: { string: parent },
        profile: { string: '2g.20gb' },
        productName: { string: 'NVIDIA A100-SXM4-80GB' },
        cudaComputeCapability: { version: '8.0.0' },
        driverVersion: { version: '550.54.15' },
        cudaDriverVersion: { version: '12.4.0' },
        'resource.kubernetes.io/pciBusID': { string: '0000:07:00.0' },
        'resource.kubernetes.io/numaNode': { int: 0 },
      },
      capacity: {
        multiprocessors: { value: '28' },
        copyEngines: { value: '2' },
        decoders: { value: '1' },
        encoders: { value: '0' },
        jpegEngines: { value: '0' },
        ofaEngines: { value: '0' },
        memory: { value: '19968Mi' },
        memorySlice2: { value: '1' },
        memorySlice3: { value: '1' },
      },
    });
    assert.deepEqual(
      Object.keys(device(c, 'gpu-1-mig-3g40gb-9-0').capacity).filter((k) => k.startsWith('memorySlice')),
      ['memorySlice0', 'memorySlice1', 'memorySlice2', 'memorySlice3'],
    );
    // Without the placement's size from the driver, no memory slices: never its compute slices in their place.
    const unsized = s.mig.devices.map(({ placementSize: _size, ...m }) => m);
    const c2 = poolContent(
      { ...s, mig: { ...s.mig, devices: unsized } },
      { nodeName: 'node-mig', migStrategy: 'mixed' },
    );
    const cap = device(c2, 'gpu-1-mig-3g40gb-9-0').capacity;
    assert.deepEqual(
      Object.keys(cap).filter((k) => k.startsWith('memorySlice')),
      [],
    );
    assert.equal(cap.multiprocessors?.value, device(c, 'gpu-1-mig-3g40gb-9-0').capacity.multiprocessors?.value);
    assert.deepEqual(device(c, 'gpu-2').attributes.type, { string: 'gpu' });
    assert.equal(c.slices.flat().length, 9);
    for (const d of c.slices.flat())
      assert.ok(Object.keys(d.attributes).length + Object.keys(d.capacity).length <= 32, d.name);
    // No NVLink domain: no links on this node, and MIG devices never get one.
    assert.ok(c.slices.flat().every((d) => d.attributes.nvlinkDomain === undefined));
    await publish(c, 'node-mig');
  },
);

test(
  'NVLink domains: one for a fabric, the two full quads of a cube ' +
    'mesh, the linked pair only on a bridged node, none without NVLink',
  async () => {
    assert.deepEqual(nvlinkDomains(await fixtureSnapshot('nvswitch-8.json')), [0, 0, 0, 0, 0, 0, 0, 0]);
    assert.deepEqual(nvlinkDomains(await fixtureSnapshot('nvswitch-16.json')), new Array(16).fill(0));
    // DGX-1: GPU 0 reaches GPU 5 only through GPU 1 or 4; one value would let a claim take both.
    const dgx1 = await fixtureSnapshot('dgx1-v100.json');
    const domains = nvlinkDomains(dgx1);
    assert.deepEqual(domains, [0, 0, 0, 0, 4, 4, 4, 4]);
    for (let i = 0; i < 8; i++)
      for (let j = i + 1; j < 8; j++)
        if (domains[i] === domains[j]) assert.ok(directLinks(dgx1, i, j) > 0, `GPUs ${i} and ${j} share a domain`);
    assert.deepEqual(nvlinkDomains(await fixtureSnapshot('bridged-pair-4.json')), [null, 1, 1, null]);
    assert.deepEqual(nvlinkDomains(await fixtureSnapshot('pcie-2socket-8.json')), new Array(8).fill(null));
    const bridged = poolContent(await fixtureSnapshot('bridged-pair-4.json'), { nodeName: 'n', migStrategy: 'none' });
    assert.deepEqual(
      bridged.slices.flat().map((d) => d.attributes.nvlinkDomain),
      [undefined, { int: 1 }, { int: 1 }, undefined],
    );
  },
);

/** Direct NVLinks between GPUs i and j, as GPU i reports them. */
function directLinks(s: Pick<NodeSnapshot, 'nvlinks'>, i: number, j: number): number {
  const far = s.nvlinks[j]?.busId.toLowerCase();
  return (s.nvlinks[i]?.links ?? []).filter((l) => l.remote === 'gpu' && l.remoteBusId.toLowerCase() === far).length;
}

/** A node of n GPUs with the given direct NVLinks (one link per pair listed, `count` for more). */
function linkedNode(
  n: number,
  pairs: readonly (readonly [number, number, number?])[],
): Pick<NodeSnapshot, 'gpus' | 'nvlinks'> {
  const busId = (i: number): string => `00000000:${(i + 1).toString(16).padStart(2, '0')}:00.0`;
  const links = Array.from({ length: n }, () => [] as { remoteBusId: string; remote: 'gpu' }[]);
  for (const [a, b, count = 1] of pairs)
    for (let k = 0; k < count; k++) {
      links[a]?.push({ remoteBusId: busId(b), remote: 'gpu' });
      links[b]?.push({ remoteBusId: busId(a), remote: 'gpu' });
    }
  return {
    gpus: Array.from({ length: n }, (_, i) => ({ minor: i, busId: busId(i) }) as NodeSnapshot['gpus'][number]),
    nvlinks: links.map((l, i) => ({ busId: busId(i), links: l })),
  };
}

test(
  'NVLink domains: the largest fully linked groups first, then the ' +
    'most links, then the smallest minors; a GPU left over has none',
  () => {
    const quad = (o: number): [number, number][] => [
      [o, o + 1],
      [o, o + 2],
      [o, o + 3],
      [o + 1, o + 2],
      [o + 1, o + 3],
      [o + 2, o + 3],
    ];
    // GPU 8 is linked to one GPU of each quad: in no group where every pair is linked once the quads are taken.
    assert.deepEqual(nvlinkDomains(linkedNode(9, [...quad(0), ...quad(4), [8, 1], [8, 5]])), [
      0,
      0,
      0,
      0,
      4,
      4,
      4,
      4,
      null,
    ]);
    // A chain 0-1-2-3: pairs, never the chain; the pair with more links wins a tie of size.
    assert.deepEqual(
      nvlinkDomains(
        linkedNode(4, [
          [0, 1],
          [1, 2],
          [2, 3],
        ]),
      ),
      [0, 0, 2, 2],
    );
    assert.deepEqual(
      nvlinkDomains(
        linkedNode(3, [
          [0, 1],
          [1, 2, 4],
        ]),
      ),
      [null, 1, 1],
    );
    // Equal size and links: the smaller minors.
    assert.deepEqual(
      nvlinkDomains(
        linkedNode(3, [
          [0, 1],
          [1, 2],
        ]),
      ),
      [0, 0, null],
    );
    // A triangle beats the pair it overlaps.
    assert.deepEqual(
      nvlinkDomains(
        linkedNode(4, [
          [0, 1, 6],
          [1, 2],
          [2, 3],
          [1, 3],
        ]),
      ),
      [null, 1, 1, 1],
    );
  },
);

const unhealthy = (over: Partial<UnitHealth['state']>): UnitHealth => ({
  state: { ...freshHealthState(), health: 'Unhealthy', ...over },
  reason: 'test',
  since: 1,
});

test(
  'taints: XID → gpu.nvidia.com/xid=<XID>, lost → gpu-lost, double-bit ' +
    'ECC and a silent driver → unhealthy=<why>; healthy again → none',
  async () => {
    const s = await fixtureSnapshot('nvswitch-8.json');
    const [g0, g1, g2] = s.gpus.map((g) => g.uuid) as [string, string, string];
    const sick = withHealth(
      s,
      new Map([
        [g0, unhealthy({ lastXid: 79 })],
        [g1, unhealthy({ lost: true, permanent: true })],
        [g2, unhealthy({ permanent: true })],
      ]),
    );
    const c = poolContent(sick, { nodeName: 'node-t', migStrategy: 'none' });
    assert.deepEqual(device(c, 'gpu-0').taints, [{ key: 'gpu.nvidia.com/xid', value: '79', effect: 'NoSchedule' }]);
    assert.deepEqual(device(c, 'gpu-1').taints, [{ key: 'gpu.nvidia.com/gpu-lost', effect: 'NoSchedule' }]);
    assert.deepEqual(device(c, 'gpu-2').taints, [
      { key: 'gpu.nvidia.com/unhealthy', value: 'double-bit-ecc', effect: 'NoSchedule' },
    ]);
    assert.equal(device(c, 'gpu-3').taints, undefined);
    const stored = await publish(c, 'node-t');
    const taints = ((stored[0]!.spec as JsonObject).devices as JsonObject[])[0]?.taints as JsonObject[];
    assert.equal(typeof taints[0]?.timeAdded, 'string', 'the server fills timeAdded');
    // Recovered: the taint goes.
    const well = withHealth(sick, new Map([[g0, { state: freshHealthState(), reason: 'recovered', since: 2 }]]));
    assert.equal(device(poolContent(well, { nodeName: 'node-t', migStrategy: 'none' }), 'gpu-0').taints, undefined);
    // The driver stops answering: every device Unhealthy, said so.
    const down = buildSnapshot(null, s, false);
    assert.deepEqual(taintsOf(down, g0, 'gpu.nvidia.com'), [
      { key: 'gpu.nvidia.com/unhealthy', value: 'driver-not-answering', effect: 'NoSchedule' },
    ]);
    assert.deepEqual(taintsOf(well, g0, 'gpu.nvidia.com'), []);
    // While the driver is down the devices keep the last driver version they were seen with.
    const downPool = poolContent(down, { nodeName: 'node-t', migStrategy: 'none', lastDriverVersion: '550.54.15' });
    assert.deepEqual(device(downPool, 'gpu-0').attributes.driverVersion, { version: '550.54.15' });
    assert.equal(device(downPool, 'gpu-0').taints?.length, 1);
  },
);

test("a MIG device's own XID taints that MIG device only; its siblings and the whole GPUs stay untainted", async () => {
  const s = await fixtureSnapshot('mig-mixed-4.json', 'mixed');
  const m = s.mig.devices[3];
  assert.ok(m !== undefined);
  const sick = withHealth(s, new Map([[m.uuid, unhealthy({ lastXid: 94 })]]));
  const c = poolContent(sick, { nodeName: 'n', migStrategy: 'mixed' });
  assert.deepEqual(
    c.slices
      .flat()
      .filter((d) => d.taints !== undefined)
      .map((d) => [d.name, d.taints]),
    [['gpu-0-mig-2g20gb-14-2', [{ key: 'gpu.nvidia.com/xid', value: '94', effect: 'NoSchedule' }]]],
  );
});

/** A node of n whole GPUs (no NVLink), as a scan would give it. */
function bigNode(n: number): NodeSnapshot {
  const gpus = Array.from({ length: n }, (_, i) => ({
    index: i,
    uuid: `GPU-00000000-0000-4000-8000-${String(i).padStart(12, '0')}`,
    name: 'NVIDIA H100 80GB HBM3',
    minor: i,
    busId: `00000000:${(i + 1).toString(16).padStart(2, '0')}:00.0`,
    memoryBytes: 80 * 2 ** 30,
    numaNode: null,
  }));
  const scan: NodeScan = {
    driverVersion: '550.54.15',
    gpus,
    nvlinks: gpus.map((g) => ({ busId: g.busId, links: [] })),
    pcie: gpus.map(() => gpus.map(() => -1)),
  };
  return buildSnapshot(scan, null, false);
}

test(
  'limits: at most 64 devices a slice (the limit with taints), so 150 devices make 3 slices ' +
    'of one pool that the server accepts tainted or not; 65 tainted in one slice it refuses',
  async () => {
    const s = bigNode(150);
    const c = poolContent(s, { nodeName: 'node-big', migStrategy: 'none' });
    assert.deepEqual(
      c.slices.map((x) => x.length),
      [64, 64, 22],
    );
    assert.equal(MAX_DEVICES_PER_SLICE, 64);
    await publish(c, 'node-big');
    const all = withHealth(s, new Map(s.gpus.map((g) => [g.uuid, unhealthy({ lastXid: 48 })])));
    const tainted = poolContent(all, { nodeName: 'node-big', migStrategy: 'none' });
    assert.deepEqual(
      tainted.slices.map((x) => x.length),
      [64, 64, 22],
    );
    await publish(tainted, 'node-big');
    // Why 64: the real limit the stand-in enforces.
    await assert.rejects(
      createSlice(client, {
        metadata: { name: 'too-many' },
        spec: {
          driver: 'gpu.nvidia.com',
          nodeName: 'node-big',
          pool: { name: 'x', generation: 1, resourceSliceCount: 1 },
          devices: tainted.slices.flat().slice(0, 65),
        },
      }),
      (err: unknown) =>
        err instanceof KubeApiError &&
        err.code === 422 &&
        err.reason === 'Invalid' &&
        err.causes.some((c2) => c2.field === 'spec.devices'),
    );
  },
);

test('an empty node still has its pool: one slice without devices', () => {
  const c = poolContent(bigNode(0), { nodeName: 'node-empty', migStrategy: 'none' });
  assert.deepEqual(c.slices, [[]]);
});

const SHARES = { memory: { default: 8 * 2 ** 30, validRange: { min: 2 ** 30, step: 2 ** 30 } } };

test(
  'consumable capacity: every whole GPU allows several allocations, its memory carrying the request ' +
    'policy; the stand-in stores both',
  async () => {
    const s = await fixtureSnapshot('nvswitch-8.json');
    const off = poolContent(s, { nodeName: 'node-a', migStrategy: 'none' });
    const on = poolContent(s, { nodeName: 'node-a', migStrategy: 'none', consumableCapacity: SHARES });
    assert.deepEqual(on.notes, []);
    for (const d of on.slices.flat()) {
      assert.equal(d.allowMultipleAllocations, true, d.name);
      assert.deepEqual(d.capacity.memory, {
        value: '80Gi',
        requestPolicy: { default: '8Gi', validRange: { min: '1Gi', step: '1Gi' } },
      });
    }
    // Off (the default): the devices exactly as without the setting.
    assert.ok(off.slices.flat().every((d) => !('allowMultipleAllocations' in d)));
    assert.deepEqual(device(off, 'gpu-3').capacity, { memory: { value: '80Gi' } });
    const stored = await publish(on);
    const first = ((stored[0]!.spec as JsonObject).devices as JsonObject[])[0]!;
    assert.equal(first.allowMultipleAllocations, true);
    assert.deepEqual((first.capacity as JsonObject).memory, {
      value: '80Gi',
      requestPolicy: { default: '8Gi', validRange: { min: '1Gi', step: '1Gi' } },
    });
  },
);

test('consumable capacity leaves MIG devices as they are; valid values are written as listed', async () => {
  const s = await fixtureSnapshot('mig-mixed-4.json', 'mixed');
  const values = { memory: { default: 20 * 2 ** 30, validValues: [10 * 2 ** 30, 20 * 2 ** 30, 40 * 2 ** 30] } };
  const plain = poolContent(s, { nodeName: 'node-mig', migStrategy: 'mixed' });
  const c = poolContent(s, { nodeName: 'node-mig', migStrategy: 'mixed', consumableCapacity: values });
  assert.deepEqual(device(c, 'gpu-2').capacity.memory, {
    value: '80Gi',
    requestPolicy: { default: '20Gi', validValues: ['10Gi', '20Gi', '40Gi'] },
  });
  assert.equal(device(c, 'gpu-2').allowMultipleAllocations, true);
  const mig = c.slices.flat().filter((d) => d.name.includes('-mig-'));
  assert.ok(mig.length > 0);
  for (const d of mig) assert.deepEqual(d, device(plain, d.name));
  await publish(c, 'node-mig');
});

test('a GPU too small for the policy is published for one allocation at a time, with a note', async () => {
  const s = await fixtureSnapshot('nvswitch-8.json');
  const small: NodeSnapshot = { ...s, gpus: s.gpus.map((g, i) => (i === 5 ? { ...g, memoryBytes: 4 * 2 ** 30 } : g)) };
  const c = poolContent(small, { nodeName: 'node-a', migStrategy: 'none', consumableCapacity: SHARES });
  assert.deepEqual(device(c, 'gpu-5').capacity, { memory: { value: '4Gi' } });
  assert.equal(device(c, 'gpu-5').allowMultipleAllocations, undefined);
  assert.equal(device(c, 'gpu-4').allowMultipleAllocations, true);
  assert.equal(c.notes.length, 1);
  assert.match(c.notes[0] ?? '', /^device gpu-5 is published for one allocation at a time: .*default.*4Gi/);
  await publish(c);
});
