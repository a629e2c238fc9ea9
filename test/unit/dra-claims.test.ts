// The pure part of DRA's kubelet side: what a ResourceClaim allocates to this node (src/core/dra-claims.ts),
// the CDI name of a device in the toolkit's spec under each --device-name-strategy (src/core/dra-cdi.ts),
// the checkpoint's format and the boot-ID rule (src/core/dra-checkpoint.ts), and the health list
// (src/core/dra-health.ts).
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { cdiDeviceId, cdiNameCandidates } from '../../src/core/dra-cdi.ts';
import type { CdiSpec } from '../../src/core/dra-cdi.ts';
import { checkpointForBoot, parseCheckpoint, serializeCheckpoint } from '../../src/core/dra-checkpoint.ts';
import type { Checkpoint } from '../../src/core/dra-checkpoint.ts';
import { allocatedDevices } from '../../src/core/dra-claims.ts';
import type { ClaimRef, DraNodeDevice } from '../../src/core/dra-claims.ts';
import { deviceHealthList, sameHealth } from '../../src/core/dra-health.ts';
import { freshHealthState } from '../../src/core/health-tracker.ts';
import type { UnitHealth } from '../../src/core/snapshot.ts';

const claim: ClaimRef = { namespace: 'ns', name: 'c', uid: 'u-1' };
const gpu0: DraNodeDevice = { name: 'gpu-0', gpuUuid: 'GPU-a', gpuIndex: 0, minor: 0 };
const gpu1: DraNodeDevice = { name: 'gpu-3', gpuUuid: 'GPU-b', gpuIndex: 1, minor: 3 };
const mig: DraNodeDevice = {
  name: 'gpu-3-mig-1g10gb-19-0',
  gpuUuid: 'GPU-b',
  gpuIndex: 1,
  minor: 3,
  mig: { uuid: 'MIG-x', index: 2 },
};
const devices = [gpu0, gpu1, mig];
const claimJson = (results: unknown, uid = 'u-1'): unknown => ({
  metadata: { uid },
  status: { allocation: { devices: { results } } },
});

test('allocatedDevices: ours only, one entry per device with every request; refusals name what was wrong', () => {
  assert.deepEqual(
    allocatedDevices(
      claimJson([
        { request: 'a', driver: 'gpu.nvidia.com', pool: 'n', device: 'gpu-3' },
        { request: 'b', driver: 'gpu.nvidia.com', pool: 'n', device: 'gpu-3' },
        { request: 'nic', driver: 'nic.example.com', pool: 'elsewhere', device: 'eth0' },
        { request: 'c', driver: 'gpu.nvidia.com', pool: 'n', device: 'gpu-3-mig-1g10gb-19-0' },
      ]),
      claim,
      'gpu.nvidia.com',
      'n',
      devices,
    ),
    {
      devices: [
        { device: 'gpu-3', pool: 'n', requests: ['a', 'b'] },
        { device: 'gpu-3-mig-1g10gb-19-0', pool: 'n', requests: ['c'] },
      ],
    },
  );
  assert.deepEqual(allocatedDevices(claimJson([]), claim, 'gpu.nvidia.com', 'n', devices), { devices: [] });
  const err = (json: unknown): string => {
    const v = allocatedDevices(json, claim, 'gpu.nvidia.com', 'n', devices);
    assert.ok('error' in v, JSON.stringify(v));
    return v.error;
  };
  assert.match(
    err({ metadata: { uid: 'u-1' }, status: {} }),
    /ResourceClaim ns\/c \(uid u-1\) is not allocated \(status\.allocation is missing\)/,
  );
  assert.match(err({ metadata: { uid: 'u-1' } }), /is not allocated/);
  assert.match(err(claimJson([], 'u-2')), /has a claim of that name with uid u-2/);
  assert.match(err({ status: {} }), /with uid \(none\)/);
  assert.match(err('nope'), /not an object/);
  assert.match(err(claimJson('x')), /results is not a list/);
  assert.match(err(claimJson([7])), /results\[0\] is not an object/);
  assert.match(
    err(claimJson([{ driver: 'gpu.nvidia.com', pool: 'n', device: 'gpu-0' }])),
    /results\[0\] lacks request, pool or device/,
  );
  assert.match(
    err(claimJson([{ request: 'r', driver: 'gpu.nvidia.com', pool: 'm', device: 'gpu-0' }])),
    /device gpu-0 of pool m, which is not this node's: driver gpu\.nvidia\.com on this node serves pool n only/,
  );
  assert.match(
    err(claimJson([{ request: 'r', driver: 'gpu.nvidia.com', pool: 'n', device: 'gpu-9' }])),
    /device gpu-9, which node n does not have now \(its devices: gpu-0, gpu-3, gpu-3-mig-1g10gb-19-0\)/,
  );
  const none = allocatedDevices(
    claimJson([{ request: 'r', driver: 'gpu.nvidia.com', pool: 'n', device: 'gpu-0' }]),
    claim,
    'gpu.nvidia.com',
    'n',
    [],
  );
  assert.ok('error' in none && /its devices: none/.test(none.error));
});

const API = 'resource.nvidia.com/v1beta1';
const withConfig = (results: unknown, config: unknown): unknown => ({
  metadata: { uid: 'u-1' },
  status: { allocation: { devices: { results, config } } },
});
const result = (request: string, device: string, extra: object = {}): unknown => ({
  request,
  driver: 'gpu.nvidia.com',
  pool: 'n',
  device,
  ...extra,
});
const opaque = (source: string, parameters: unknown, requests?: string[]): unknown => ({
  source,
  ...(requests === undefined ? {} : { requests }),
  opaque: { driver: 'gpu.nvidia.com', parameters },
});
const timeSlice = (interval: string): unknown => ({
  apiVersion: API,
  kind: 'GpuConfig',
  sharing: { strategy: 'TimeSlicing', timeSlicingConfig: { interval } },
});
const mps = (mpsConfig: unknown, kind = 'GpuConfig'): unknown => ({
  apiVersion: API,
  kind,
  sharing: { strategy: 'MPS', mpsConfig },
});
const verdict = (json: unknown) => allocatedDevices(json, claim, 'gpu.nvidia.com', 'n', devices);
const refusal = (json: unknown): string => {
  const v = verdict(json);
  assert.ok('error' in v, JSON.stringify(v));
  return v.error;
};

test('allocatedDevices: each device with its shareID, consumed capacity and the sharing its requests get', () => {
  const share = { shareID: 's-1', consumedCapacity: { memory: '10Gi' } };
  assert.deepEqual(
    verdict(
      withConfig(
        [
          result('a', 'gpu-0', share),
          result('b', 'gpu-3'),
          result('m', 'gpu-3-mig-1g10gb-19-0'),
          { request: 'nic', driver: 'nic.example.com', pool: 'x', device: 'eth0' },
        ],
        [
          opaque('FromClaim', timeSlice('Short'), ['a']),
          opaque('FromClass', timeSlice('Long')),
          { source: 'FromClaim', opaque: { driver: 'nic.example.com', parameters: { mtu: 9000 } } },
          opaque('FromClass', mps({ defaultActiveThreadPercentage: 20 }, 'MigDeviceConfig')),
        ],
      ),
    ),
    {
      devices: [
        {
          device: 'gpu-0',
          pool: 'n',
          requests: ['a'],
          shared: 'shareID',
          shareId: 's-1',
          consumedCapacity: { memory: '10Gi' },
          sharing: { strategy: 'TimeSlicing', interval: 'Short' },
        },
        { device: 'gpu-3', pool: 'n', requests: ['b'], sharing: { strategy: 'TimeSlicing', interval: 'Long' } },
        {
          device: 'gpu-3-mig-1g10gb-19-0',
          pool: 'n',
          requests: ['m'],
          sharing: { strategy: 'MPS', defaultActiveThreadPercentage: 20 },
        },
      ],
    },
  );
  // Two shares of one device are two entries, each with its own shareID; results without one still merge.
  const shares = verdict(
    claimJson([
      result('a', 'gpu-0', { shareID: 's-1', consumedCapacity: { memory: '4Gi' } }),
      result('b', 'gpu-0', { shareID: 's-2', consumedCapacity: { memory: '8Gi' } }),
      result('c', 'gpu-3'),
      result('d', 'gpu-3'),
    ]),
  );
  assert.ok('devices' in shares);
  assert.deepEqual(
    shares.devices.map((d) => [d.device, d.requests, d.shareId, d.consumedCapacity?.memory, d.shared]),
    [
      ['gpu-0', ['a'], 's-1', '4Gi', 'shareID'],
      ['gpu-0', ['b'], 's-2', '8Gi', 'shareID'],
      ['gpu-3', ['c', 'd'], undefined, undefined, undefined],
    ],
  );
});

test('allocatedDevices refuses a claim whose configuration is wrong, naming the field', () => {
  assert.equal(
    refusal(
      withConfig(
        [result('r', 'gpu-0')],
        [opaque('FromClass', timeSlice('Long')), opaque('FromClaim', mps({ defaultActiveThreadPercentage: 150 }))],
      ),
    ),
    'ResourceClaim ns/c (uid u-1): status.allocation.devices.config[1].opaque.parameters.sharing.mpsConfig.' +
      "defaultActiveThreadPercentage: 150 is not within 0..100 (the percentage of the GPU's threads a client may use)",
  );
  assert.match(
    refusal(withConfig([result('r', 'gpu-0')], [opaque('FromClaim', { apiVersion: API, kind: 'VfioDeviceConfig' })])),
    /config\[0\]\.opaque\.parameters\.kind: "VfioDeviceConfig" is not supported by this driver/,
  );
  assert.match(
    refusal(withConfig([result('m', 'gpu-3-mig-1g10gb-19-0')], [opaque('FromClaim', timeSlice('Short'), ['m'])])),
    /a GpuConfig names request m, whose device gpu-3-mig-1g10gb-19-0 is a MIG device/,
  );
  assert.match(
    refusal(claimJson([result('r', 'gpu-0', { shareID: 's', consumedCapacity: { memory: 10 } })])),
    /results\[0\]\.consumedCapacity is not a map of quantities \(strings\)/,
  );
  // Two requests of one device that resolve to different sharings.
  assert.equal(
    refusal(
      withConfig(
        [result('a', 'gpu-0'), result('b', 'gpu-0')],
        [opaque('FromClaim', timeSlice('Short'), ['a']), opaque('FromClaim', timeSlice('Long'), ['b'])],
      ),
    ),
    'ResourceClaim ns/c (uid u-1): device gpu-0 is configured two ways: request a with TimeSlicing ' +
      '{"interval":"Short"} (status.allocation.devices.config[0]), request b with TimeSlicing {"interval":"Long"} ' +
      "(status.allocation.devices.config[1]); the configurations that apply to one device's requests must agree",
  );
  assert.match(
    refusal(withConfig([result('a', 'gpu-0'), result('b', 'gpu-0')], [opaque('FromClaim', timeSlice('Short'), ['a'])])),
    new RegExp(
      String.raw`request a with TimeSlicing \{"interval":"Short"\} \(status\.allocation\.devices\.config\[0\]\), ` +
        'request b with no sharing;',
    ),
  );
  // The same sharing from two configs is one sharing.
  const same = verdict(
    withConfig(
      [result('a', 'gpu-0'), result('b', 'gpu-0')],
      [opaque('FromClaim', timeSlice('Short'), ['a']), opaque('FromClaim', timeSlice('Short'), ['b'])],
    ),
  );
  assert.ok('devices' in same && same.devices[0]?.sharing?.strategy === 'TimeSlicing');
});

test("allocatedDevices: an MPS per-device limit names one of the configuration's devices by UUID or index", () => {
  const limits = (keys: Record<string, string>): unknown =>
    withConfig(
      [result('r', 'gpu-0'), result('r', 'gpu-3')],
      [opaque('FromClaim', mps({ defaultPerDevicePinnedMemoryLimit: keys }))],
    );
  const ok = verdict(limits({ 'GPU-b': '1Gi', 0: '2Gi' }));
  assert.ok('devices' in ok, JSON.stringify(ok));
  assert.deepEqual(ok.devices[0]?.sharing, {
    strategy: 'MPS',
    defaultPerDevicePinnedMemoryLimit: { 0: 2 * 1024 ** 3, 'GPU-b': 1024 ** 3 },
  });
  assert.equal(
    refusal(limits({ 'GPU-z': '1Gi' })),
    'ResourceClaim ns/c (uid u-1): status.allocation.devices.config[0].opaque.parameters.sharing.mpsConfig.' +
      'defaultPerDevicePinnedMemoryLimit["GPU-z"]: names no device of the configuration (GPU-a, GPU-b); ' +
      'a key is one of their UUIDs or an index 0..1 into them sorted',
  );
  assert.match(refusal(limits({ 2: '1Gi' })), /defaultPerDevicePinnedMemoryLimit\["2"\]: names no device/);
  // A MIG device is keyed by its own UUID.
  const mig = verdict(
    withConfig(
      [result('m', 'gpu-3-mig-1g10gb-19-0')],
      [opaque('FromClaim', mps({ defaultPerDevicePinnedMemoryLimit: { 'MIG-x': '1Gi' } }, 'MigDeviceConfig'))],
    ),
  );
  assert.ok('devices' in mig, JSON.stringify(mig));
});

const spec = (path: string, names: [string, string[]][]): CdiSpec => ({
  path,
  kind: 'nvidia.com/gpu',
  devices: names.map(([name, deviceNodes]) => ({ name, deviceNodes })),
});

test('CDI names under each --device-name-strategy: index, uuid, type-index; a MIG device as <gpu>:<mig>', () => {
  assert.deepEqual(cdiNameCandidates(gpu1), ['1', 'GPU-b', 'gpu1']);
  assert.deepEqual(cdiNameCandidates(mig), ['1:2', 'MIG-x', 'mig1:2']);
  const dirs = ['/etc/cdi'];
  assert.deepEqual(
    cdiDeviceId(
      gpu1,
      [
        spec('/etc/cdi/a.yaml', [
          ['0', ['/dev/nvidia0']],
          ['1', ['/dev/nvidia3']],
          ['all', []],
        ]),
      ],
      dirs,
    ),
    { id: 'nvidia.com/gpu=1' },
  );
  assert.deepEqual(cdiDeviceId(gpu1, [spec('/etc/cdi/a.yaml', [['GPU-b', ['/dev/nvidia3']]])], dirs), {
    id: 'nvidia.com/gpu=GPU-b',
  });
  assert.deepEqual(cdiDeviceId(gpu1, [spec('/etc/cdi/a.yaml', [['gpu1', []]])], dirs), { id: 'nvidia.com/gpu=gpu1' });
  assert.deepEqual(
    cdiDeviceId(mig, [spec('/etc/cdi/a.yaml', [['1:2', ['/dev/nvidia3', '/dev/nvidia-caps/nvidia-cap30']]])], dirs),
    { id: 'nvidia.com/gpu=1:2' },
  );
  assert.deepEqual(cdiDeviceId(mig, [spec('/etc/cdi/a.yaml', [['MIG-x', []]])], dirs), { id: 'nvidia.com/gpu=MIG-x' });
  // Several specs (another vendor's kind is not looked at; the first name that is found wins).
  const other: CdiSpec = {
    path: '/etc/cdi/nic.yaml',
    kind: 'example.com/nic',
    devices: [{ name: '1', deviceNodes: [] }],
  };
  assert.deepEqual(cdiDeviceId(gpu1, [other, spec('/var/run/cdi/b.json', [['GPU-b', []]])], dirs), {
    id: 'nvidia.com/gpu=GPU-b',
  });
});

test(
  'CDI refusals: no spec of the kind (unreadable files named), ' +
    "no device for it, an index whose device node is another GPU's",
  () => {
    const dirs = ['/etc/cdi', '/var/run/cdi'];
    const none = cdiDeviceId(gpu0, [{ path: '/etc/cdi/broken.yaml', error: 'has no kind' }], dirs);
    assert.ok('error' in none);
    assert.match(
      none.error,
      new RegExp(
        String.raw`^no CDI spec of kind nvidia\.com\/gpu in \/etc\/cdi or \/var\/run\/cdi; ` +
          String.raw`unreadable spec files: \/etc\/cdi\/broken\.yaml \(has no kind\): .*GPU ` +
          '0 \\(GPU-a\\); run `nvidia-ctk cdi generate --output=\\/var\\/run\\/cdi\\/nvidia\\.yaml` ' +
          '\\(or `systemctl restart nvidia-cdi-refresh\\.service`',
      ),
    );
    const missing = cdiDeviceId(
      mig,
      [
        spec('/var/run/cdi/nvidia.yaml', [
          ['0', []],
          ['1', []],
        ]),
      ],
      dirs,
    );
    assert.ok('error' in missing);
    assert.match(
      missing.error,
      new RegExp(
        String.raw`^the CDI spec \/var\/run\/cdi\/nvidia\.yaml has no device for MIG device 1:2 ` +
          String.raw`\(MIG-x\) of GPU GPU-b \(looked for 1:2, MIG-x, mig1:2\): it was generated before`,
      ),
    );
    const stale = cdiDeviceId(gpu1, [spec('/var/run/cdi/nvidia.yaml', [['1', ['/dev/nvidia1']]])], dirs);
    assert.ok('error' in stale);
    assert.match(stale.error, /is stale: its device 1 has \/dev\/nvidia1, but GPU 1 \(GPU-b\) is \/dev\/nvidia3/);
  },
);

test(
  'CDI after a GPU left the bus: an index-named spec of before ' +
    'the removal still names a present GPU by its device node',
  () => {
    const dirs = ['/var/run/cdi'];
    // Generated with GPUs 0, 1, 2 (/dev/nvidia0..2); GPU 0 left, so the GPU at /dev/nvidia1 is NVML index 0 now.
    const before = spec('/var/run/cdi/nvidia.yaml', [
      ['0', ['/dev/nvidia0']],
      ['1', ['/dev/nvidia1']],
      ['2', ['/dev/nvidia2']],
      ['all', ['/dev/nvidia0', '/dev/nvidia1', '/dev/nvidia2']],
    ]);
    const moved: DraNodeDevice = { name: 'gpu-1', gpuUuid: 'GPU-m', gpuIndex: 0, minor: 1 };
    assert.deepEqual(cdiDeviceId(moved, [before], dirs), { id: 'nvidia.com/gpu=1' });
    const typeIndex = spec('/var/run/cdi/nvidia.yaml', [
      ['gpu0', ['/dev/nvidia0']],
      ['gpu1', ['/dev/nvidia1']],
    ]);
    assert.deepEqual(cdiDeviceId(moved, [typeIndex], dirs), { id: 'nvidia.com/gpu=gpu1' });
    // No entry carries the GPU's device node: still stale, naming the entry at its index now.
    const other = spec('/var/run/cdi/nvidia.yaml', [['0', ['/dev/nvidia0']]]);
    const stale = cdiDeviceId(moved, [other], dirs);
    assert.ok('error' in stale);
    assert.match(stale.error, /is stale: its device 0 has \/dev\/nvidia0, but GPU 0 \(GPU-m\) is \/dev\/nvidia1/);
  },
);

test('checkpoint: round trip; a damaged file is refused naming what is wrong; another boot voids every record', () => {
  const c: Checkpoint = {
    bootId: 'b1',
    claims: {
      'u-1': {
        state: 'PrepareCompleted',
        namespace: 'ns',
        name: 'c',
        devices: [{ requests: ['r'], pool: 'n', device: 'gpu-0', cdiDeviceIds: ['nvidia.com/gpu=0'] }],
      },
      'u-2': { state: 'PrepareStarted', namespace: 'ns', name: 'd', devices: [] },
    },
  };
  assert.deepEqual(parseCheckpoint(serializeCheckpoint(c)), c);
  assert.throws(() => parseCheckpoint('{'), /not JSON/);
  assert.throws(() => parseCheckpoint('[]'), /not a JSON object/);
  assert.throws(
    () => parseCheckpoint('{"version":"v0","bootId":"b","claims":{}}'),
    /version is "v0", expected "gpu-device-plugin\.dra\/v1"/,
  );
  const v = '"version":"gpu-device-plugin.dra/v1"';
  assert.throws(() => parseCheckpoint(`{${v},"claims":{}}`), /bootId is not a string/);
  assert.throws(() => parseCheckpoint(`{${v},"bootId":"b","claims":[]}`), /claims is not an object/);
  assert.throws(
    () =>
      parseCheckpoint(`{${v},"bootId":"b","claims":{"u":{"state":"Done","namespace":"a","name":"b","devices":[]}}}`),
    /claim u: state "Done" is neither PrepareStarted nor PrepareCompleted/,
  );
  assert.throws(
    () =>
      parseCheckpoint(
        `{${v},"bootId":"b","claims":{"u":{"state":"PrepareStarted",` +
          `"namespace":"a","name":"b","devices":[{"device":"x"}]}}}`,
      ),
    /claim u: a device lacks requests, pool, device or cdiDeviceIds/,
  );
  assert.deepEqual(checkpointForBoot(c, 'b1'), { checkpoint: c, voided: 0 });
  assert.deepEqual(checkpointForBoot(c, 'b2'), { checkpoint: { bootId: 'b2', claims: {} }, voided: 2 });
  assert.deepEqual(checkpointForBoot(null, 'b2'), { checkpoint: { bootId: 'b2', claims: {} }, voided: 0 });
});

test('checkpoint: a device keeps its shareID, consumed capacity and sharing; each is checked when read', () => {
  const shared: Checkpoint = {
    bootId: 'b1',
    claims: {
      'u-1': {
        state: 'PrepareCompleted',
        namespace: 'ns',
        name: 'c',
        devices: [
          {
            requests: ['r'],
            pool: 'n',
            device: 'gpu-0',
            cdiDeviceIds: ['nvidia.com/gpu=0'],
            shared: 'shareID',
            shareId: 's-1',
            consumedCapacity: { memory: '10Gi' },
            sharing: { strategy: 'MPS', defaultActiveThreadPercentage: 50, defaultPinnedDeviceMemoryLimit: 1048576 },
          },
          {
            requests: ['t'],
            pool: 'n',
            device: 'gpu-1',
            cdiDeviceIds: ['nvidia.com/gpu=1'],
            sharing: { strategy: 'TimeSlicing', interval: 'Long' },
          },
        ],
      },
    },
  };
  assert.deepEqual(parseCheckpoint(serializeCheckpoint(shared)), shared);
  const v = '"version":"gpu-device-plugin.dra/v1"';
  const withDevice = (extra: string): string =>
    `{${v},"bootId":"b","claims":{"u":{"state":"PrepareCompleted","namespace":"a","name":"b","devices":[` +
    `{"requests":["r"],"pool":"n","device":"gpu-0","cdiDeviceIds":[]${extra}}]}}}`;
  // A record written before these fields existed still reads.
  assert.deepEqual(parseCheckpoint(withDevice('')).claims.u?.devices, [
    { requests: ['r'], pool: 'n', device: 'gpu-0', cdiDeviceIds: [] },
  ]);
  assert.throws(() => parseCheckpoint(withDevice(',"shareId":7')), /claim u: device gpu-0: shareId is not a string/);
  assert.throws(
    () => parseCheckpoint(withDevice(',"consumedCapacity":{"memory":10}')),
    /claim u: device gpu-0: consumedCapacity is not a map of quantities/,
  );
  assert.throws(
    () => parseCheckpoint(withDevice(',"sharing":{"strategy":"TimeSlicing","interval":"Eternal"}')),
    /claim u: device gpu-0: sharing interval "Eternal" is not Default, Short, Medium, Long/,
  );
  assert.throws(
    () => parseCheckpoint(withDevice(',"shared":"yes"')),
    /claim u: device gpu-0: shared is neither adminAccess nor shareID/,
  );
});

test(
  'health list: a GPU by its UUID, a MIG device by its own; ' +
    'all unhealthy while the driver is down; times in seconds',
  () => {
    const sick: UnitHealth = {
      state: { ...freshHealthState(), health: 'Unhealthy' },
      reason: 'critical XID 31',
      since: 1_700_000_500_900,
    };
    const fresh: UnitHealth = { state: freshHealthState(), reason: null, since: null };
    const snap = {
      driverVersion: '550.54.15',
      gpuHealth: new Map([
        ['GPU-a', fresh],
        ['GPU-b', fresh],
      ]),
      migHealth: new Map([['MIG-x', sick]]),
      health: new Map([
        ['GPU-a', 'Healthy' as const],
        ['GPU-b', 'Healthy' as const],
        ['MIG-x', 'Unhealthy' as const],
      ]),
    };
    const list = deviceHealthList(snap, devices, 1_700_000_000);
    assert.deepEqual(list, [
      { device: 'gpu-0', health: 'Healthy', lastUpdated: 1_700_000_000, message: '' },
      { device: 'gpu-3', health: 'Healthy', lastUpdated: 1_700_000_000, message: '' },
      { device: 'gpu-3-mig-1g10gb-19-0', health: 'Unhealthy', lastUpdated: 1_700_000_500, message: 'critical XID 31' },
    ]);
    const down = deviceHealthList(
      {
        ...snap,
        driverVersion: null,
        health: new Map([
          ['GPU-a', 'Unhealthy' as const],
          ['GPU-b', 'Unhealthy' as const],
          ['MIG-x', 'Unhealthy' as const],
        ]),
      },
      devices,
      1_700_000_000,
    );
    assert.deepEqual(
      down.map((d) => [d.health, d.message]),
      [
        ['Unhealthy', 'the NVIDIA driver does not answer'],
        ['Unhealthy', 'the NVIDIA driver does not answer'],
        ['Unhealthy', 'the NVIDIA driver does not answer (last: critical XID 31)'],
      ],
    );
    assert.equal(sameHealth(list, deviceHealthList(snap, devices, 1_700_000_000)), true);
    assert.equal(sameHealth(list, down), false);
    assert.equal(sameHealth(list, list.slice(1)), false);
  },
);

test('allocatedDevices: a dynamic MIG partition is a MIG device to the configurations, as a static one is', () => {
  const partition: DraNodeDevice = {
    name: 'gpu-0-mig-3g20gb-9-4',
    gpuUuid: 'GPU-a',
    gpuIndex: 0,
    minor: 0,
    partition: { giProfileId: 9, start: 4, size: 4 },
  };
  const on = (config: unknown[]) =>
    allocatedDevices(withConfig([result('p', partition.name)], config), claim, 'gpu.nvidia.com', 'n', [
      ...devices,
      partition,
    ]);
  const recorded = { parentUuid: 'GPU-a', giProfileId: 9, start: 4, size: 4 };
  // A MigDeviceConfig applies (by its request or as the class's default), its per-device key the device name.
  const limits = { defaultPerDevicePinnedMemoryLimit: { [partition.name]: '2Gi' } };
  assert.deepEqual(on([opaque('FromClaim', mps(limits, 'MigDeviceConfig'), ['p'])]), {
    devices: [
      {
        device: partition.name,
        pool: 'n',
        requests: ['p'],
        sharing: { strategy: 'MPS', defaultPerDevicePinnedMemoryLimit: { [partition.name]: 2 * 2 ** 30 } },
        partition: recorded,
      },
    ],
  });
  // A GpuConfig for whole GPUs does not apply to it, and one naming its request is refused by name; strategy
  // TimeSlicing in a MigDeviceConfig sets nothing, as on any MIG device.
  const unshared = { devices: [{ device: partition.name, pool: 'n', requests: ['p'], partition: recorded }] };
  assert.deepEqual(on([opaque('FromClass', timeSlice('Long'))]), unshared);
  const migTimeSlicing = { apiVersion: API, kind: 'MigDeviceConfig', sharing: { strategy: 'TimeSlicing' } };
  assert.deepEqual(on([opaque('FromClaim', migTimeSlicing, ['p'])]), unshared);
  const refused = on([opaque('FromClaim', timeSlice('Long'), ['p'])]);
  assert.match(
    'error' in refused ? refused.error : '',
    /a GpuConfig names request p, whose device gpu-0-mig-3g20gb-9-4 is a MIG device: a GpuConfig applies to whole/,
  );
});
