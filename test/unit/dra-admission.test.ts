// What the DRA sharing agent admits of a request (core/dra-admission.ts): each refusal names the field, the
// device or the limit, and what would be right; an admitted request carries NVML's indexes, not the plugin's.
import assert from 'node:assert/strict';
import { test } from 'node:test';
import { admitRequest, resolveMpsUnits } from '../../src/core/dra-admission.ts';
import type { AdmissionLimits, HostInventory } from '../../src/core/dra-admission.ts';
import type { HostMps, HostRequest } from '../../src/core/dra-sharing.ts';

const G0 = 'GPU-11111111-1111-1111-1111-111111111111';
const G1 = 'GPU-22222222-2222-2222-2222-222222222222';
const M1 = 'MIG-33333333-3333-3333-3333-333333333333';
const INVENTORY: HostInventory = new Map([
  [G0, { uuid: G0, gpuUuid: G0, gpuIndex: 0, memoryMiB: 40960 }],
  [G1, { uuid: G1, gpuUuid: G1, gpuIndex: 1, memoryMiB: 40960 }],
  [M1, { uuid: M1, gpuUuid: G1, memoryMiB: 4864 }],
]);
const GiB = 2 ** 30;
const LIMITS: AdmissionLimits = { maxClaimsPerGpu: 3, shmBytesPerClaim: 8 * GiB, shmBytesTotal: 16 * GiB };

let n = 0;
function claim(uid = `c${++n}`) {
  return { namespace: 'team-a', name: `claim-${uid}`, uid };
}
const timeSlice = (gpu: string, uid?: string): HostRequest => ({
  claim: claim(uid),
  timeSlices: [{ uuid: gpu, interval: 'Long' }],
});
const daemon = (
  units: HostRequest['mps'] extends infer M ? (M extends { units: infer U } ? U : never) : never,
  exclusive = false,
  uid?: string,
): HostRequest => ({
  claim: claim(uid),
  timeSlices: [],
  mps: { activeThreadPercentage: 50, exclusive, units },
});
const error = (r: ReturnType<typeof admitRequest>): string => ('error' in r ? r.error : 'admitted');

test('a request naming only devices NVML lists, values in range, is admitted with NVML’s index', () => {
  const r = admitRequest(daemon([{ uuid: G1, pinnedMemLimitMiB: 1024 }], true), [], INVENTORY, LIMITS);
  assert.ok('request' in r);
  assert.deepEqual(r.request.mps?.units, [{ uuid: G1, gpuIndex: 1, pinnedMemLimitMiB: 1024 }]);
  const mig = admitRequest(daemon([{ uuid: M1, pinnedMemLimitMiB: 4864 }]), [], INVENTORY, LIMITS);
  assert.ok('request' in mig);
  assert.deepEqual(mig.request.mps?.units, [{ uuid: M1, pinnedMemLimitMiB: 4864 }]);
});

test('GPU ids that are not this node’s — an nvidia-smi argument, another index list, a stranger — are refused', () => {
  for (const id of ['-i 0,1,2,3,4,5,6,7', '--help', '0', 'GPU-99999999-9999-9999-9999-999999999999']) {
    assert.match(
      error(admitRequest(timeSlice(id), [], INVENTORY, LIMITS)),
      /^timeSlices\[0\]: ".*" is no whole GPU of this node \(NVML lists it not\)$/,
    );
    assert.match(
      error(admitRequest(daemon([{ uuid: id, pinnedMemLimitMiB: 1 }]), [], INVENTORY, LIMITS)),
      /^mps\.units\[0\]: ".*" is no GPU or MIG device of this node/,
    );
  }
  assert.match(error(admitRequest(timeSlice(M1), [], INVENTORY, LIMITS)), /is no whole GPU of this node/);
});

test('values out of range and forged indexes are refused naming the field and the range', () => {
  const cases: [HostRequest, RegExp][] = [
    [daemon([{ uuid: G0, pinnedMemLimitMiB: 0 }]), /pinnedMemLimitMiB 0 is not a whole number from 1 to 40960/],
    [daemon([{ uuid: G0, pinnedMemLimitMiB: 40961 }]), /pinnedMemLimitMiB 40961 .* from 1 to 40960 \(its memory\)/],
    [daemon([{ uuid: G0, gpuIndex: 1, pinnedMemLimitMiB: 5 }]), /gpuIndex 1 is not GPU .*'s \(NVML's index is 0\)/],
    [daemon([{ uuid: M1, gpuIndex: 1, pinnedMemLimitMiB: 5 }]), /is a MIG device, which has no compute mode/],
    [daemon([{ uuid: M1, pinnedMemLimitMiB: 5 }], true), /an exclusive daemon is for whole GPUs only/],
    [
      daemon([
        { uuid: G0, pinnedMemLimitMiB: 5 },
        { uuid: G0, pinnedMemLimitMiB: 6 },
      ]),
      /mps.units names one device twice/,
    ],
    [
      {
        ...daemon([{ uuid: G0, pinnedMemLimitMiB: 5 }]),
        mps: { activeThreadPercentage: 101, exclusive: false, units: [{ uuid: G0, pinnedMemLimitMiB: 5 }] },
      },
      /activeThreadPercentage 101 is not a whole number from 1 to 100/,
    ],
    [
      {
        claim: claim(),
        timeSlices: [
          { uuid: G0, interval: 'Long' },
          { uuid: G0, interval: 'Long' },
        ],
      },
      /GPU .* named twice/,
    ],
  ];
  for (const [r, want] of cases) assert.match(error(admitRequest(r, [], INVENTORY, LIMITS)), want);
});

test('claims named as Kubernetes never names one are refused: a path, "..", 300 bytes, a bad namespace', () => {
  for (const uid of ['..', 'a/b', 'x'.repeat(300), 'UPPER', '']) {
    assert.match(error(admitRequest(timeSlice(G0, uid), [], INVENTORY, LIMITS)), /is not a Kubernetes UID/);
  }
  const bad = { ...timeSlice(G0), claim: { namespace: '../etc', name: 'x', uid: 'u1' } };
  assert.match(error(admitRequest(bad, [], INVENTORY, LIMITS)), /namespace "..\/etc" is not a Kubernetes namespace/);
});

test('an exclusive MPS claim gets a GPU alone: refused beside a holder, and nobody joins it', () => {
  const ts = timeSlice(G0, 'holder');
  assert.match(
    error(admitRequest(daemon([{ uuid: G0, pinnedMemLimitMiB: 5 }], true), [ts], INVENTORY, LIMITS)),
    /an exclusive MPS daemon needs GPU .* alone, but claim team-a\/claim-holder \(uid holder\) has it/,
  );
  const alone = daemon([{ uuid: G1, pinnedMemLimitMiB: 5 }], true, 'alone');
  assert.match(
    error(admitRequest(daemon([{ uuid: M1, pinnedMemLimitMiB: 5 }]), [alone], INVENTORY, LIMITS)),
    /GPU GPU-2.* is held alone \(exclusive MPS\) by claim team-a\/claim-alone \(uid alone\)/,
  );
  // The same claim's request again (a retried prepare) is not its own rival.
  assert.ok('request' in admitRequest(alone, [alone], INVENTORY, LIMITS));
});

test('claims per GPU and the shm total are limits, refused naming the option', () => {
  const held = [timeSlice(G0), timeSlice(G0), timeSlice(G0)];
  assert.match(
    error(admitRequest(timeSlice(G0), held, INVENTORY, LIMITS)),
    /GPU .* is held by 3 claims already, the most --dra-max-claims-per-gpu \(DRA_MAX_CLAIMS_PER_GPU\) allows is 3/,
  );
  assert.ok('request' in admitRequest(timeSlice(G1), held, INVENTORY, LIMITS), 'another GPU is free');
  const daemons = [daemon([{ uuid: G0, pinnedMemLimitMiB: 5 }]), daemon([{ uuid: M1, pinnedMemLimitMiB: 5 }])];
  assert.match(
    error(admitRequest(daemon([{ uuid: G1, pinnedMemLimitMiB: 5 }]), daemons, INVENTORY, LIMITS)),
    /3 MPS claims with a 8589934592-byte shm each would pass --dra-mps-shm-total \(DRA_MPS_SHM_TOTAL\) of 17179869184/,
  );
  assert.ok('request' in admitRequest(timeSlice(G1), daemons, INVENTORY, LIMITS), 'a time-slice needs no shm');
});

// ---- MPS on a dynamic MIG partition: a unit named by partition until the agent made the instance ----

const PART = { device: 'gpu-1-mig-1g5gb-19-3', parentUuid: G1, giProfileId: 19, start: 3, size: 1 };
const onPartition = (partitionUnits: unknown[], exclusive = false, partitions = [PART]): HostRequest =>
  ({
    claim: claim(),
    timeSlices: [],
    mps: { activeThreadPercentage: 30, exclusive, units: [], partitionUnits },
    partitions,
  }) as HostRequest;

test('a unit named by partition is admitted only for a partition of the same request, once, never exclusive', () => {
  const ok = admitRequest(onPartition([{ partition: PART.device, pinnedMemLimitMiB: 2048 }]), [], INVENTORY, LIMITS);
  assert.ok('request' in ok, error(ok));
  assert.deepEqual(ok.request.mps?.partitionUnits, [{ partition: PART.device, pinnedMemLimitMiB: 2048 }]);
  assert.equal(
    error(admitRequest(onPartition([{ partition: 'gpu-0-mig-1g5gb-19-0' }]), [], INVENTORY, LIMITS)),
    'mps.partitionUnits[0]: "gpu-0-mig-1g5gb-19-0" is none of the request\'s partitions',
  );
  assert.equal(
    error(admitRequest(onPartition([{ partition: PART.device }], false, []), [], INVENTORY, LIMITS)),
    'mps.partitionUnits[0]: "gpu-1-mig-1g5gb-19-3" is none of the request\'s partitions',
  );
  assert.equal(
    error(admitRequest(onPartition([{ partition: PART.device }, { partition: PART.device }]), [], INVENTORY, LIMITS)),
    'mps.partitionUnits[1]: partition gpu-1-mig-1g5gb-19-3 named twice',
  );
  assert.match(
    error(admitRequest(onPartition([{ partition: PART.device }], true), [], INVENTORY, LIMITS)),
    /^mps\.partitionUnits\[0\]: gpu-1-mig-1g5gb-19-3 is a MIG device; an exclusive daemon is for whole GPUs only$/,
  );
  for (const l of [0, 1.5, 40961])
    assert.equal(
      error(admitRequest(onPartition([{ partition: PART.device, pinnedMemLimitMiB: l }]), [], INVENTORY, LIMITS)),
      `mps.partitionUnits[0]: pinnedMemLimitMiB ${l} is not a whole number from 1 to 40960 (its GPU's memory)`,
    );
});

test('once made, a unit named by partition resolves to its MIG device, with its own memory or its limit', () => {
  const made = [{ ...PART, gi: 3, ci: 0, uuid: M1, giCapMinor: 30, ciCapMinor: 31 }];
  const mps = {
    activeThreadPercentage: 30,
    exclusive: false,
    units: [{ uuid: G0, pinnedMemLimitMiB: 1024 }],
    partitionUnits: [{ partition: PART.device }],
  };
  assert.deepEqual(resolveMpsUnits(mps, made, INVENTORY), {
    activeThreadPercentage: 30,
    exclusive: false,
    units: [
      { uuid: G0, pinnedMemLimitMiB: 1024 },
      { uuid: M1, pinnedMemLimitMiB: 4864 },
    ],
  });
  const limited = { ...mps, partitionUnits: [{ partition: PART.device, pinnedMemLimitMiB: 4000 }] };
  assert.deepEqual((resolveMpsUnits(limited, made, INVENTORY) as HostMps).units[1], {
    uuid: M1,
    pinnedMemLimitMiB: 4000,
  });
  const over = { ...mps, partitionUnits: [{ partition: PART.device, pinnedMemLimitMiB: 8192 }] };
  assert.deepEqual(resolveMpsUnits(over, made, INVENTORY), {
    error: `mps.partitionUnits[0] (${PART.device}): pinnedMemLimitMiB 8192 is more than its MIG device's 4864 MiB`,
  });
  assert.deepEqual(resolveMpsUnits(mps, [], INVENTORY), {
    error: `mps.partitionUnits[0] (${PART.device}): no MIG device was made for it`,
  });
  assert.deepEqual(resolveMpsUnits(mps, [{ ...made[0], uuid: 'MIG-gone' }] as typeof made, INVENTORY), {
    error: `mps.partitionUnits[0] (${PART.device}): its MIG device MIG-gone is not listed by NVML`,
  });
});
