// DRA sharing on the host: the pure request a claim makes (core/dra-sharing.ts), its files and CDI spec, and the
// plugin's side of prepare and unprepare in-process. The agent's side is test/unit/dra-agent.test.ts.
import assert from 'node:assert/strict';
import { mkdirSync, mkdtempSync, readFileSync, rmSync, watch, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { test } from 'node:test';
import {
  answerDir,
  claimCdiSpec,
  hostRequest,
  parseAnswer,
  parseRequest,
  requestDir,
  serializeAnswer,
  serializeRequest,
  timeSliceConflictIn,
  requestedTimeSlices,
} from '../../src/core/dra-sharing.ts';
import type { HostDevice, HostRequest, SharedDevice } from '../../src/core/dra-sharing.ts';
import { DraClaims } from '../../src/dra/claims.ts';
import { HostSharing } from '../../src/dra/sharing.ts';
import type { SharingPrepared } from '../../src/dra/sharing.ts';
import { createLogger } from '../../src/system/log.ts';
import { GiB, SHARING_CLAIM, SHARING_NODE, byIndex, cdiSpec, mpsSharing } from '../support/dra-fixtures.ts';

const NODE = SHARING_NODE;
const CLAIM = SHARING_CLAIM;
const mps = mpsSharing;

test('hostRequest: a claim without TimeSlicing or MPS asks nothing; a device not on the node is an error', () => {
  assert.equal(hostRequest(CLAIM, [{ device: 'gpu-0' }], NODE), null);
  const r = hostRequest(CLAIM, [{ device: 'gpu-9', sharing: mps() }], NODE);
  assert.deepEqual(r, { error: 'device gpu-9 is not on this node now' });
});

test('hostRequest: TimeSlicing sets whole GPUs only (a MIG device has no time-slice)', () => {
  const r = hostRequest(
    CLAIM,
    [
      { device: 'gpu-0', sharing: { strategy: 'TimeSlicing', interval: 'Long' } },
      { device: 'gpu-2-mig-1g10gb-19-0', sharing: { strategy: 'TimeSlicing', interval: 'Long' } },
    ],
    NODE,
  );
  assert.deepEqual(r, { claim: CLAIM, timeSlices: [{ uuid: 'GPU-0', interval: 'Long' }] });
});

test('hostRequest: MPS on a GPU the claim has alone: exclusive, whole memory and 100% unless limited', () => {
  assert.deepEqual(hostRequest(CLAIM, [{ device: 'gpu-0', sharing: mps() }], NODE), {
    claim: CLAIM,
    timeSlices: [],
    mps: {
      activeThreadPercentage: 100,
      exclusive: true,
      units: [{ uuid: 'GPU-0', gpuIndex: 0, pinnedMemLimitMiB: 81920 }],
    },
  });
  const limited = hostRequest(
    CLAIM,
    [
      {
        device: 'gpu-0',
        sharing: mps({ defaultActiveThreadPercentage: 40, defaultPinnedDeviceMemoryLimit: 8 * GiB }),
      },
      {
        device: 'gpu-1',
        sharing: mps({ defaultPinnedDeviceMemoryLimit: 8 * GiB, defaultPerDevicePinnedMemoryLimit: { '0': 2 * GiB } }),
      },
    ],
    NODE,
  );
  assert.ok(limited !== null && !('error' in limited));
  assert.equal(limited.mps?.activeThreadPercentage, 40);
  assert.deepEqual(
    limited.mps?.units.map((u) => [u.uuid, u.pinnedMemLimitMiB]),
    [
      ['GPU-0', 8192],
      ['GPU-1', 2048],
    ],
  );
  const byUuid = hostRequest(
    CLAIM,
    [{ device: 'gpu-1', sharing: mps({ defaultPerDevicePinnedMemoryLimit: { '0': 2 * GiB, 'GPU-1': 3 * GiB } }) }],
    NODE,
  );
  assert.ok(byUuid !== null && !('error' in byUuid));
  assert.equal(byUuid.mps?.units[0]?.pinnedMemLimitMiB, 3072, 'the later key wins');
  const unknown = hostRequest(
    CLAIM,
    [{ device: 'gpu-1', sharing: mps({ defaultPerDevicePinnedMemoryLimit: { '3': GiB } }) }],
    NODE,
  );
  assert.match(
    String((unknown as { error: string }).error),
    /defaultPerDevicePinnedMemoryLimit\["3"\] names no device/,
  );
});

test('hostRequest: MPS on a share is held to its consumed memory and leaves the compute mode alone', () => {
  const share = (consumed: string, extra: object = {}): SharedDevice => ({
    device: 'gpu-1',
    shareId: 'share-1',
    consumedCapacity: { memory: consumed },
    sharing: mps(extra),
  });
  const r = hostRequest(CLAIM, [share('12Gi')], NODE);
  assert.ok(r !== null && !('error' in r));
  assert.deepEqual(r.mps, {
    activeThreadPercentage: 100,
    exclusive: false,
    units: [{ uuid: 'GPU-1', gpuIndex: 1, pinnedMemLimitMiB: 12288 }],
  });
  const lower = hostRequest(CLAIM, [share('12Gi', { defaultPinnedDeviceMemoryLimit: 4 * GiB })], NODE);
  assert.ok(lower !== null && !('error' in lower));
  assert.equal(lower.mps?.units[0]?.pinnedMemLimitMiB, 4096, "the claim's own lower limit stands");
  const higher = hostRequest(CLAIM, [share('12Gi', { defaultPinnedDeviceMemoryLimit: 40 * GiB })], NODE);
  assert.ok(higher !== null && !('error' in higher));
  assert.equal(higher.mps?.units[0]?.pinnedMemLimitMiB, 12288, 'never above the share');
  assert.match(String((hostRequest(CLAIM, [share('lots')], NODE) as { error: string }).error), /"lots" is no positive/);
  const mig = hostRequest(CLAIM, [{ device: 'gpu-2-mig-1g10gb-19-0', sharing: mps() }], NODE);
  assert.ok(mig !== null && !('error' in mig));
  assert.deepEqual(mig.mps?.units, [{ uuid: 'MIG-2a', pinnedMemLimitMiB: 10240 }]);
  assert.equal(mig.mps?.exclusive, false, 'a MIG device has no compute mode of its own');
});

test('request and answer files: written, read back, and refused when wrong', () => {
  const request = hostRequest(CLAIM, [{ device: 'gpu-0', sharing: mps() }], NODE) as HostRequest;
  assert.deepEqual(parseRequest(serializeRequest({ id: 'x1', request })), { id: 'x1', request });
  assert.throws(() => parseRequest('{"version":"other"}'), /not a request of version/);
  assert.throws(
    () =>
      parseRequest(
        serializeRequest({
          id: 'x',
          request: { claim: CLAIM, timeSlices: [{ uuid: 'GPU-0', interval: 'Soon' as 'Long' }] },
        }),
      ),
    /timeSlices\[0\]: needs uuid and interval \(Default, Short, Medium, Long\)/,
  );
  assert.throws(() => parseAnswer('{"version":"gpu-device-plugin.dra-sharing/v1","id":"a","state":"odd"}'), /state/);
});

test('timeSliceConflictIn: a claim holding the GPU at another interval is named; the same interval is fine', () => {
  const long: SharedDevice[] = [
    { device: 'gpu-0', shareId: 's1', sharing: { strategy: 'TimeSlicing', interval: 'Long' } },
  ];
  const short: SharedDevice[] = [
    { device: 'gpu-0', shareId: 's2', sharing: { strategy: 'TimeSlicing', interval: 'Short' } },
  ];
  const checkpoint = { claims: { 'uid-0': { namespace: 'team-b', name: 'first', devices: long } } };
  const why = timeSliceConflictIn(checkpoint, CLAIM, short, NODE);
  assert.match(
    String(why),
    new RegExp(
      String.raw`claim team-a/c1 \(uid uid-1\) asks time-slice interval Short on GPU GPU-0, ` +
        String.raw`which claim team-b/first \(uid uid-0\) holds at Long`,
    ),
  );
  assert.equal(timeSliceConflictIn(checkpoint, CLAIM, long, NODE), null);
  const itself = { ...CLAIM, uid: 'uid-0' };
  assert.equal(timeSliceConflictIn(checkpoint, itself, short, NODE), null, 'a claim never conflicts with itself');
  assert.deepEqual(requestedTimeSlices([hostRequest(CLAIM, long, NODE) as HostRequest]), new Map([['GPU-0', 'Long']]));
});

test("claimCdiSpec: the claim's pipe at /mps/<uid>/pipe with its env, and its own shm as /dev/shm", () => {
  const { id, spec } = claimCdiSpec('/run/nvidia/mps', 'uid-1');
  assert.equal(id, 'k8s.gpu-device-plugin/claim=uid-1');
  const edits = (
    spec as {
      devices: {
        name: string;
        containerEdits: { env: string[]; mounts: { hostPath: string; containerPath: string }[] };
      }[];
    }
  ).devices[0];
  assert.equal(edits?.name, 'uid-1');
  assert.deepEqual(edits?.containerEdits.env, ['CUDA_MPS_PIPE_DIRECTORY=/mps/uid-1/pipe']);
  assert.deepEqual(
    edits?.containerEdits.mounts.map((m) => [m.hostPath, m.containerPath]),
    [
      ['/run/nvidia/mps/dra/claims/uid-1/mps/pipe', '/mps/uid-1/pipe'],
      ['/run/nvidia/mps/dra/claims/uid-1/shm', '/dev/shm'],
    ],
  );
});

// ---- the plugin's side: prepare and unprepare of a sharing claim, in-process ----

class RecordingSharing extends HostSharing {
  readonly asked: HostRequest[] = [];
  /** At each unprepare: whether the claim's daemon was still among those watched. */
  readonly watchedAtUnprepare: boolean[] = [];
  claims: DraClaims | undefined;
  override unavailable(): string | null {
    return null;
  }
  override async prepare(request: HostRequest): Promise<SharingPrepared> {
    this.asked.push(request);
    return { cdiDeviceIds: [`k8s.gpu-device-plugin/claim=${request.claim.uid}`], partitionIds: {} };
  }
  override async unprepare(c: { uid: string }): Promise<string | null> {
    this.watchedAtUnprepare.push(this.claims?.sharingRequests().has(c.uid) ?? true);
    return null;
  }
  override async reconcile(): Promise<void> {}
}

test("unprepare stops watching an MPS claim's daemon before the agent stops it; prepare adds its CDI ID", async () => {
  const dir = mkdtempSync(join(tmpdir(), 'gdp-dra-claims-'));
  writeFileSync(join(dir, 'boot_id'), 'boot-1\n');
  mkdirSync(join(dir, 'cdi'));
  writeFileSync(join(dir, 'cdi', 'nvidia.yaml'), cdiSpec(byIndex(['0', '1', '2'])));
  const log = createLogger({ level: 'error', journal: false, write: () => undefined });
  const sharing = new RecordingSharing({ mpsRoot: join(dir, 'mps'), cdiDir: join(dir, 'cdi'), log });
  const claim = { namespace: 'team-a', name: 'mps', uid: 'uid-mps' };
  const json = {
    metadata: { uid: claim.uid },
    status: {
      allocation: {
        devices: {
          results: [{ request: 'gpu', driver: 'gpu.nvidia.com', pool: 'node-1', device: 'gpu-1' }],
          config: [
            {
              source: 'FromClaim',
              opaque: {
                driver: 'gpu.nvidia.com',
                parameters: {
                  apiVersion: 'resource.nvidia.com/v1beta1',
                  kind: 'GpuConfig',
                  sharing: { strategy: 'MPS' },
                },
              },
            },
          ],
        },
      },
    },
  };
  const claims = new DraClaims({
    driver: 'gpu.nvidia.com',
    nodeName: 'node-1',
    claims: { getResourceClaim: async () => json },
    devices: () => NODE,
    sharing,
    checkpointPath: join(dir, 'checkpoint.json'),
    bootIdPath: join(dir, 'boot_id'),
    cdiDirs: [join(dir, 'cdi')],
    now: Date.now,
    log,
  });
  sharing.claims = claims;
  await claims.open();
  const watched: boolean[] = [];
  claims.onClaimsChanged(() => watched.push(claims.sharingRequests().has(claim.uid)));
  const r = await claims.prepare([claim]);
  assert.equal(r.claims[claim.uid]?.error, '');
  assert.deepEqual(r.claims[claim.uid]?.devices[0]?.cdi_device_ids, [
    'nvidia.com/gpu=1',
    'k8s.gpu-device-plugin/claim=uid-mps',
  ]);
  assert.equal(sharing.asked[0]?.mps?.units[0]?.uuid, 'GPU-1');
  assert.deepEqual(watched, [true], 'watched once prepared');
  await claims.unprepare([claim]);
  assert.deepEqual(sharing.watchedAtUnprepare, [false], 'no longer watched when the agent is asked to stop it');
  assert.deepEqual(watched, [true, false, false], 'listeners heard it leave before the unprepare, and after');
  rmSync(dir, { recursive: true, force: true });
});

test('hostRequest names the claim in one order, whatever object named it: a retried prepare asks the same', () => {
  const fromKubelet = { uid: 'uid-1', namespace: 'team-a', name: 'c1', extra: 'ignored' };
  const a = hostRequest(fromKubelet, [{ device: 'gpu-0', sharing: mps() }], NODE) as HostRequest;
  const b = hostRequest(CLAIM, [{ device: 'gpu-0', sharing: mps() }], NODE) as HostRequest;
  assert.equal(JSON.stringify(a), JSON.stringify(b));
  assert.deepEqual(Object.keys(a.claim), ['namespace', 'name', 'uid']);
});

const PARTITION: HostDevice = {
  name: 'gpu-1-mig-1g10gb-19-3',
  gpuUuid: 'GPU-1',
  gpuIndex: 1,
  minor: 1,
  memoryBytes: 10 * GiB,
  partition: { giProfileId: 19, start: 3, size: 1 },
};
const PART_REQUEST = { device: 'gpu-1-mig-1g10gb-19-3', parentUuid: 'GPU-1', giProfileId: 19, start: 3, size: 1 };

test('hostRequest: a dynamic MIG partition asks the agent to carve it', () => {
  const r = hostRequest(CLAIM, [{ device: 'gpu-1-mig-1g10gb-19-3' }], [...NODE, PARTITION]);
  assert.deepEqual(r, { claim: CLAIM, timeSlices: [], partitions: [PART_REQUEST] });
  const file = parseRequest(serializeRequest({ id: 'x', request: r as HostRequest }));
  assert.deepEqual(file.request, r, 'read back as written');
});

test('hostRequest: a partition shared by MPS names its daemon unit by partition, for the agent to resolve', () => {
  const node = [...NODE, PARTITION];
  const r = hostRequest(
    CLAIM,
    [{ device: 'gpu-1-mig-1g10gb-19-3', sharing: mps({ defaultActiveThreadPercentage: 40 }) }],
    node,
  );
  assert.deepEqual(r, {
    claim: CLAIM,
    timeSlices: [],
    mps: {
      activeThreadPercentage: 40,
      exclusive: false,
      units: [],
      partitionUnits: [{ partition: 'gpu-1-mig-1g10gb-19-3' }],
    },
    partitions: [PART_REQUEST],
  });
  assert.deepEqual(parseRequest(serializeRequest({ id: 'x', request: r as HostRequest })).request, r, 'read back');
  // A limit keyed by the partition's device name (its MIG UUID does not exist yet) or by index.
  for (const key of ['gpu-1-mig-1g10gb-19-3', '0']) {
    const limited = hostRequest(
      CLAIM,
      [{ device: PARTITION.name, sharing: mps({ defaultPerDevicePinnedMemoryLimit: { [key]: 2 * GiB } }) }],
      node,
    ) as HostRequest;
    assert.deepEqual(limited.mps?.partitionUnits, [{ partition: PARTITION.name, pinnedMemLimitMiB: 2048 }], key);
  }
  // Beside a whole GPU under the same daemon: that one by UUID, the partition after it; no compute mode changed.
  const both = hostRequest(
    CLAIM,
    [
      { device: 'gpu-0', sharing: mps() },
      { device: PARTITION.name, sharing: mps() },
    ],
    node,
  ) as HostRequest;
  assert.deepEqual(
    both.mps?.units.map((u) => u.uuid),
    ['GPU-0'],
  );
  assert.equal(both.mps?.exclusive, false);
  // Once made, the node no longer lists the placement: the checkpoint's record asks the very same.
  const recorded = hostRequest(
    CLAIM,
    [
      {
        device: PARTITION.name,
        sharing: mps({ defaultActiveThreadPercentage: 40 }),
        partition: { parentUuid: 'GPU-1', giProfileId: 19, start: 3, size: 1 },
      },
    ],
    NODE,
  );
  assert.deepEqual(recorded, r);
});

test('hostRequest: time-slicing a partition is refused by name (a MIG device shares by MPS)', () => {
  const r = hostRequest(
    CLAIM,
    [{ device: PARTITION.name, sharing: { strategy: 'TimeSlicing', interval: 'Long' } }],
    [...NODE, PARTITION],
  );
  assert.match(
    String((r as { error: string }).error),
    /^device gpu-1-mig-1g10gb-19-3: a dynamic MIG partition has no time-slice of its own; it shares by MPS$/,
  );
});

test('parseRequest: an MPS part without any unit, or a partition unit without its partition, is refused', () => {
  const text = (mpsPart: object): string =>
    JSON.stringify({
      version: 'gpu-device-plugin.dra-sharing/v1',
      id: 'x',
      request: { claim: CLAIM, timeSlices: [], mps: { activeThreadPercentage: 100, exclusive: false, ...mpsPart } },
    });
  assert.throws(() => parseRequest(text({ units: [] })), /request\.mps: names no unit/);
  assert.throws(
    () => parseRequest(text({ units: [], partitionUnits: [{ pinnedMemLimitMiB: 5 }] })),
    /request\.mps\.partitionUnits\[0\]: needs partition/,
  );
});

test('HostSharing: a partition request answered with its instance gets a spec with its capability nodes', async () => {
  const base = mkdtempSync(join(tmpdir(), 'gdp-dra-part-'));
  const mpsRoot = join(base, 'mps');
  const cdiDir = join(base, 'cdi');
  mkdirSync(join(base, 'proc'));
  writeFileSync(join(base, 'proc', 'devices'), 'Character devices:\n195 nvidia\n236 nvidia-caps\n');
  const sharing = new HostSharing({
    mpsRoot,
    cdiDir,
    procRoot: join(base, 'proc'),
    log: createLogger({ level: 'error', journal: false, write: () => undefined }),
  });
  const p = { device: 'gpu-1-mig-1g10gb-19-3', parentUuid: 'GPU-1', giProfileId: 19, start: 3, size: 1 };
  const request: HostRequest = { claim: CLAIM, timeSlices: [], partitions: [p] };
  mkdirSync(answerDir(mpsRoot), { recursive: true });
  // The agent: answers the request it finds, once, naming its id, with the instance it made.
  let answered = false;
  const agent = watch(requestDir(mpsRoot).replace(/\/requests$/, ''), { recursive: true }, () => {
    if (answered) return;
    try {
      const file = parseRequest(readFileSync(join(requestDir(mpsRoot), `${CLAIM.uid}.json`), 'utf8'));
      const made = { ...p, gi: 3, ci: 0, uuid: 'MIG-abc', giCapMinor: 30, ciCapMinor: 31 };
      writeFileSync(
        join(answerDir(mpsRoot), `${CLAIM.uid}.json`),
        serializeAnswer({ id: file.id, state: 'ready', partitions: [made] }),
      );
      answered = true;
    } catch {
      // Not written yet.
    }
  });
  try {
    const r = await sharing.prepare(request);
    assert.deepEqual(r, {
      cdiDeviceIds: [],
      partitionIds: { [p.device]: `k8s.gpu-device-plugin/claim=${CLAIM.uid}-${p.device}` },
    });
    const spec = JSON.parse(readFileSync(join(cdiDir, `gpu-device-plugin-claim-${CLAIM.uid}-mig.json`), 'utf8'));
    assert.deepEqual(
      spec.devices[0].containerEdits.deviceNodes.map((n: { major: number; minor: number }) => [n.major, n.minor]),
      [
        [236, 30],
        [236, 31],
      ],
    );
  } finally {
    agent.close();
  }
});

test('hostRequest: a partition recorded at allocation stays one once its instance exists (a MIG device now)', () => {
  const made: HostDevice = {
    name: 'gpu-1-mig-1g10gb-19-3',
    gpuUuid: 'GPU-1',
    gpuIndex: 1,
    minor: 1,
    memoryBytes: 10 * GiB,
    mig: { uuid: 'MIG-made', index: 0 },
  };
  const partition = { parentUuid: 'GPU-1', giProfileId: 19, start: 3, size: 1 };
  const r = hostRequest(CLAIM, [{ device: 'gpu-1-mig-1g10gb-19-3', partition }], [...NODE, made]);
  assert.deepEqual((r as HostRequest).partitions, [{ device: 'gpu-1-mig-1g10gb-19-3', ...partition }]);
});
