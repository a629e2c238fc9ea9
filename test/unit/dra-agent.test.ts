// The MPS unit's DRA sharing agent (mps/dra-agent.ts) in-process, on real files in a temporary MPS root, with a
// fake MPS host, a recorded time-slice setter and a fixed NVML inventory: requests served, refused by admission
// (core/dra-admission.ts) with their reason and once per id, the time-slice record in the agent's own directory.
// Waits are on the agent's syncs.
import assert from 'node:assert/strict';
import { EventEmitter } from 'node:events';
import { existsSync, mkdirSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { test } from 'node:test';
import type { HostInventory, HostUnit } from '../../src/core/dra-admission.ts';
import {
  answerDir,
  claimMpsRoot,
  hostRequest,
  parseAnswer,
  requestDir,
  serializeRequest,
} from '../../src/core/dra-sharing.ts';
import type { HostRequest } from '../../src/core/dra-sharing.ts';
import { DraSharingAgent } from '../../src/mps/dra-agent.ts';
import type { MigPort } from '../../src/mps/mig-partitions.ts';
import { FakeGpu } from '../support/fake-mig-port.ts';
import { createLogger } from '../../src/system/log.ts';
import { GiB, SHARING_CLAIM, SHARING_NODE, mpsSharing } from '../support/dra-fixtures.ts';
import { FakeHost } from '../support/fake-mps-host.ts';
import { onEvent, waitUntil } from '../support/wait.ts';

/** What NVML lists: the three GPUs whole and GPU-2's MIG device. */
const INVENTORY: HostInventory = new Map([
  ['GPU-0', { uuid: 'GPU-0', gpuUuid: 'GPU-0', gpuIndex: 0, memoryMiB: 81920 }],
  ['GPU-1', { uuid: 'GPU-1', gpuUuid: 'GPU-1', gpuIndex: 1, memoryMiB: 81920 }],
  ['GPU-2', { uuid: 'GPU-2', gpuUuid: 'GPU-2', gpuIndex: 2, memoryMiB: 81920 }],
  ['MIG-2a', { uuid: 'MIG-2a', gpuUuid: 'GPU-2', memoryMiB: 10240 }],
]);
const NODE = SHARING_NODE;
const CLAIM = SHARING_CLAIM;
const mps = mpsSharing;
// ---- the agent ----

interface AgentRig {
  root: string;
  agent: DraSharingAgent;
  hosts: Map<string, FakeHost>;
  slices: string[];
  syncs: EventEmitter;
  failSlice: Set<string>;
  /** The agent's log lines at error level. */
  errors: string[];
  write(uid: string, id: string, request: HostRequest): void;
  answer(uid: string): ReturnType<typeof parseAnswer> | null;
  synced(n: number): Promise<void>;
}

const LIMITS = { maxClaimsPerGpu: 4, shmBytesPerClaim: GiB, shmBytesTotal: 3 * GiB };

async function rig(
  root = mkdtempSync(join(tmpdir(), 'gdp-dra-agent-')),
  limits = LIMITS,
  migPort?: MigPort,
  inventory: () => HostInventory = () => INVENTORY,
): Promise<AgentRig> {
  const hosts = new Map<string, FakeHost>();
  const slices: string[] = [];
  const failSlice = new Set<string>();
  const syncs = new EventEmitter();
  const errors: string[] = [];
  let count = 0;
  const agent = new DraSharingAgent({
    mpsRoot: root,
    stateDir: join(root, 'state'),
    inventory: async () => inventory(),
    limits,
    ...(migPort === undefined ? {} : { migPort }),
    hostFor: (claimRoot) => {
      const h = new FakeHost();
      hosts.set(claimRoot, h);
      return h;
    },
    setTimeSlice: async (uuid, interval) => {
      if (failSlice.has(uuid)) throw new Error(`nvidia-smi: GPU ${uuid} refused`);
      slices.push(`${uuid} ${interval}`);
    },
    log: createLogger({ level: 'error', journal: false, write: (line) => errors.push(line) }),
    rescanMs: 3_600_000,
    onSynced: () => {
      count++;
      syncs.emit('synced');
    },
  });
  const r: AgentRig = {
    root,
    agent,
    hosts,
    slices,
    syncs,
    failSlice,
    errors,
    write: (uid, id, request) => {
      mkdirSync(requestDir(root), { recursive: true });
      writeFileSync(join(requestDir(root), `${uid}.json`), serializeRequest({ id, request }));
    },
    answer: (uid) => {
      const p = join(answerDir(root), `${uid}.json`);
      return existsSync(p) ? parseAnswer(readFileSync(p, 'utf8')) : null;
    },
    synced: (n) => waitUntil(() => count >= n, { on: onEvent(syncs, 'synced'), what: `${n} syncs` }),
  };
  await agent.start();
  return r;
}

test('agent: an MPS request gets its own daemon under the claim root with its limits; gone, it stops', async () => {
  const r = await rig();
  try {
    const request = hostRequest(
      CLAIM,
      [
        {
          device: 'gpu-0',
          sharing: mps({ defaultActiveThreadPercentage: 25, defaultPinnedDeviceMemoryLimit: 8 * GiB }),
        },
      ],
      NODE,
    ) as HostRequest;
    r.write('uid-1', 'first', request);
    await waitUntil(() => r.answer('uid-1')?.id === 'first', { on: onEvent(r.syncs, 'synced'), what: 'the answer' });
    assert.deepEqual(r.answer('uid-1'), { id: 'first', state: 'ready' });
    const claimRoot = claimMpsRoot(r.root, 'uid-1');
    const host = r.hosts.get(claimRoot);
    assert.ok(host, 'a host for the claim root');
    assert.deepEqual(
      host.actions.filter((a) => a.startsWith('mode') || a.startsWith('cmd')),
      [
        'mode GPU-0 exclusive-process',
        `cmd ${claimRoot}/mps/pipe set_default_device_pinned_mem_limit 0 8192M`,
        `cmd ${claimRoot}/mps/pipe set_default_active_thread_percentage 25`,
      ],
    );
    assert.ok(host.actions.includes(`mount ${claimRoot}/shm`), 'its own shm');
    // Written again with the same content (a retried prepare): answered, the daemon left alone.
    r.write('uid-1', 'second', request);
    await waitUntil(() => r.answer('uid-1')?.id === 'second', { on: onEvent(r.syncs, 'synced'), what: 'answer 2' });
    assert.equal(host.children.length, 1, 'not started again');
    rmSync(join(requestDir(r.root), 'uid-1.json'));
    await waitUntil(() => r.answer('uid-1') === null, { on: onEvent(r.syncs, 'synced'), what: 'the answer removed' });
    assert.ok(host.actions.includes(`cmd ${claimRoot}/mps/pipe quit`), 'told to quit');
    assert.ok(host.actions.includes('mode GPU-0 default'), 'compute mode back');
    assert.ok(host.actions.includes(`umount ${claimRoot}/shm`));
    assert.equal(existsSync(claimRoot), false, 'its directory removed');
  } finally {
    await r.agent.stop();
  }
});

test('agent: two shares of one GPU get a daemon each, neither touching the compute mode', async () => {
  const r = await rig();
  try {
    const share = (uid: string, gib: number): HostRequest =>
      hostRequest(
        { ...CLAIM, uid, name: uid },
        [{ device: 'gpu-1', shareId: `s-${uid}`, consumedCapacity: { memory: `${gib}Gi` }, sharing: mps() }],
        NODE,
      ) as HostRequest;
    r.write('a', 'a1', share('a', 4));
    r.write('b', 'b1', share('b', 8));
    await waitUntil(() => r.answer('a')?.state === 'ready' && r.answer('b')?.state === 'ready', {
      on: onEvent(r.syncs, 'synced'),
      what: 'both answered',
    });
    const limits = ['a', 'b'].map((uid) =>
      r.hosts.get(claimMpsRoot(r.root, uid))?.actions.find((x) => x.includes('pinned_mem_limit')),
    );
    assert.match(String(limits[0]), /set_default_device_pinned_mem_limit 0 4096M$/);
    assert.match(String(limits[1]), /set_default_device_pinned_mem_limit 0 8192M$/);
    for (const h of r.hosts.values()) assert.equal(h.actions.filter((a) => a.startsWith('mode')).length, 0);
  } finally {
    await r.agent.stop();
  }
});

test('agent: time-slices follow the requests, Default when the last goes; a failure names the GPU', async () => {
  const r = await rig();
  try {
    const ts = (uid: string, device: string, interval: 'Long' | 'Short'): HostRequest =>
      hostRequest({ ...CLAIM, uid }, [{ device, sharing: { strategy: 'TimeSlicing', interval } }], NODE) as HostRequest;
    r.write('a', 'a1', ts('a', 'gpu-0', 'Long'));
    await waitUntil(() => r.answer('a')?.state === 'ready', { on: onEvent(r.syncs, 'synced'), what: 'a ready' });
    assert.deepEqual(r.slices, ['GPU-0 Long']);
    assert.deepEqual(JSON.parse(readFileSync(join(r.root, 'state', 'timeslices.json'), 'utf8')), { 'GPU-0': 'Long' });
    assert.equal(existsSync(join(r.root, 'dra', 'timeslices.json')), false, 'nothing where the plugin could write');
    r.failSlice.add('GPU-1');
    r.write('b', 'b1', ts('b', 'gpu-1', 'Short'));
    await waitUntil(() => r.answer('b') !== null, { on: onEvent(r.syncs, 'synced'), what: 'b answered' });
    const b = r.answer('b');
    assert.equal(b?.state, 'failed');
    assert.match(b?.state === 'failed' ? b.error : '', /time-slice of GPU GPU-1: nvidia-smi: GPU GPU-1 refused/);
    rmSync(join(requestDir(r.root), 'a.json'));
    await waitUntil(() => r.slices.includes('GPU-0 Default'), { on: onEvent(r.syncs, 'synced'), what: 'GPU-0 back' });
  } finally {
    await r.agent.stop();
  }
});

test('agent: restarted, it puts back a time-slice it set whose request went while it was down', async () => {
  const root = mkdtempSync(join(tmpdir(), 'gdp-dra-agent-'));
  mkdirSync(join(root, 'state'), { recursive: true });
  mkdirSync(join(root, 'dra'), { recursive: true });
  // Beside the GPU it set, entries that cannot be its own are ignored; a record where the plugin writes (an earlier
  // version's place) is never read, only removed.
  const gpu = 'GPU-96a13516-8351-38da-1b3b-bd53058e4ee4';
  const other = 'GPU-0b1c2d3e-8351-38da-1b3b-bd53058e4ee4';
  writeFileSync(
    join(root, 'state', 'timeslices.json'),
    JSON.stringify({ [gpu]: 'Medium', '-i 0,1': 'Long', 'GPU-2': '--help' }),
  );
  writeFileSync(join(root, 'dra', 'timeslices.json'), JSON.stringify({ [other]: 'Long' }));
  const r = await rig(root);
  try {
    await r.synced(1);
    assert.deepEqual(r.slices, [`${gpu} Default`]);
    assert.deepEqual(JSON.parse(readFileSync(join(root, 'state', 'timeslices.json'), 'utf8')), {});
    assert.equal(existsSync(join(root, 'dra', 'timeslices.json')), false, 'the old record removed');
  } finally {
    await r.agent.stop();
  }
});

const exclusiveMps = (uid: string, device = 'gpu-0'): HostRequest =>
  hostRequest({ ...CLAIM, uid, name: uid }, [{ device, sharing: mps() }], NODE) as HostRequest;

test('agent: a request naming a GPU NVML does not list is answered "failed" once; the others are served', async () => {
  const r = await rig();
  try {
    const good = exclusiveMps('good', 'gpu-1');
    const forged: HostRequest = {
      claim: { ...CLAIM, uid: 'forged' },
      timeSlices: [{ uuid: '-i 0,1', interval: 'Long' }],
    };
    r.write('forged', 'f1', forged);
    r.write('good', 'g1', good);
    await waitUntil(() => r.answer('good')?.state === 'ready' && r.answer('forged') !== null, {
      on: onEvent(r.syncs, 'synced'),
      what: 'both answered',
    });
    assert.deepEqual(r.answer('forged'), {
      id: 'f1',
      state: 'failed',
      error: 'timeSlices[0]: "-i 0,1" is no whole GPU of this node (NVML lists it not)',
    });
    assert.deepEqual(r.slices, [], 'no time-slice set for it');
    const synced = r.agent.syncCount;
    await r.agent.syncNow();
    await r.agent.syncNow();
    assert.ok(r.agent.syncCount >= synced + 2);
    assert.equal(r.errors.filter((l) => l.includes('refused a DRA sharing request')).length, 1, 'refused once');
    // Written again under a new id: looked at again, and refused again with the reason.
    r.write('forged', 'f2', forged);
    await waitUntil(() => r.answer('forged')?.id === 'f2', { on: onEvent(r.syncs, 'synced'), what: 'f2 answered' });
    assert.equal(r.answer('forged')?.state, 'failed');
    // Its claim unprepared: the answer goes too, which is what the plugin's unprepare waits for.
    rmSync(join(requestDir(r.root), 'forged.json'));
    await waitUntil(() => r.answer('forged') === null, { on: onEvent(r.syncs, 'synced'), what: 'the answer removed' });
  } finally {
    await r.agent.stop();
  }
});

test('agent: a file that is no request is answered "failed" when it names its id, and never stalls', async () => {
  const r = await rig();
  try {
    mkdirSync(requestDir(r.root), { recursive: true });
    writeFileSync(join(requestDir(r.root), 'broken.json'), JSON.stringify({ version: 'x', id: 'b1' }));
    writeFileSync(join(requestDir(r.root), 'garbage.json'), 'not json at all');
    r.write('good', 'g1', exclusiveMps('good'));
    await waitUntil(() => r.answer('good')?.state === 'ready' && r.answer('broken') !== null, {
      on: onEvent(r.syncs, 'synced'),
      what: 'answers',
    });
    const broken = r.answer('broken');
    assert.equal(broken?.state, 'failed');
    assert.match(broken?.state === 'failed' ? broken.error : '', /its request is not valid: not a request of version/);
    assert.equal(r.answer('garbage'), null, 'nothing to answer it by');
    await r.agent.syncNow();
    assert.equal(r.errors.filter((l) => l.includes('garbage')).length, 1, 'logged once');
  } finally {
    await r.agent.stop();
  }
});

test("agent: a second exclusive MPS claim on a GPU is refused; the first one's end is what sets it back", async () => {
  const r = await rig();
  try {
    r.write('first', 'a1', exclusiveMps('first'));
    await waitUntil(() => r.answer('first')?.state === 'ready', { on: onEvent(r.syncs, 'synced'), what: 'first' });
    r.write('second', 'b1', exclusiveMps('second'));
    await waitUntil(() => r.answer('second') !== null, { on: onEvent(r.syncs, 'synced'), what: 'second answered' });
    const second = r.answer('second');
    assert.match(
      second?.state === 'failed' ? second.error : '',
      /GPU GPU-0 is held alone \(exclusive MPS\) by claim team-a\/first \(uid first\)/,
    );
    assert.equal(r.hosts.has(claimMpsRoot(r.root, 'second')), false, 'no daemon, no compute mode for it');
    rmSync(join(requestDir(r.root), 'first.json'));
    await waitUntil(() => r.answer('first') === null, { on: onEvent(r.syncs, 'synced'), what: 'first ended' });
    const modes = r.hosts.get(claimMpsRoot(r.root, 'first'))?.actions.filter((a) => a.startsWith('mode'));
    assert.deepEqual(modes, ['mode GPU-0 exclusive-process', 'mode GPU-0 default']);
  } finally {
    await r.agent.stop();
  }
});

test('agent: claims per GPU and the MPS shm total are refused past the limits, naming the option', async () => {
  const r = await rig(undefined, { maxClaimsPerGpu: 2, shmBytesPerClaim: GiB, shmBytesTotal: 2 * GiB });
  try {
    const share = (uid: string): HostRequest =>
      hostRequest(
        { ...CLAIM, uid, name: uid },
        [{ device: 'gpu-1', shareId: `s-${uid}`, consumedCapacity: { memory: '1Gi' }, sharing: mps() }],
        NODE,
      ) as HostRequest;
    r.write('a', 'a1', share('a'));
    r.write('b', 'b1', share('b'));
    r.write('c', 'c1', share('c'));
    r.write('d', 'd1', exclusiveMps('d', 'gpu-0'));
    await waitUntil(() => ['a', 'b', 'c', 'd'].every((u) => r.answer(u) !== null), {
      on: onEvent(r.syncs, 'synced'),
      what: 'all answered',
    });
    assert.deepEqual(
      ['a', 'b'].map((u) => r.answer(u)?.state),
      ['ready', 'ready'],
    );
    const c = r.answer('c');
    assert.match(
      c?.state === 'failed' ? c.error : '',
      /the most --dra-max-claims-per-gpu \(DRA_MAX_CLAIMS_PER_GPU\) allows is 2/,
    );
    const d = r.answer('d');
    assert.match(d?.state === 'failed' ? d.error : '', /would pass --dra-mps-shm-total \(DRA_MPS_SHM_TOTAL\)/);
  } finally {
    await r.agent.stop();
  }
});

test('agent: MIG partitions made for a claim, answered with UUIDs, kept over a restart, gone at its end', async () => {
  const gpu = new FakeGpu();
  const root = mkdtempSync(join(tmpdir(), 'gdp-dra-agent-'));
  const claim = { ...CLAIM, uid: 'mig-claim', name: 'mig-claim' };
  const request: HostRequest = {
    claim,
    timeSlices: [],
    partitions: [{ device: 'gpu-1-mig-3g40gb-9-4', parentUuid: 'GPU-1', giProfileId: 9, start: 4, size: 4 }],
  };
  let r = await rig(root, LIMITS, gpu);
  r.write('mig-claim', 'm1', request);
  await waitUntil(() => r.answer('mig-claim') !== null, { on: onEvent(r.syncs, 'synced'), what: 'the answer' });
  const answer = r.answer('mig-claim');
  assert.equal(answer?.state, 'ready');
  assert.deepEqual(
    answer?.state === 'ready' ? answer.partitions?.map((p) => [p.device, p.uuid, p.giCapMinor, p.ciCapMinor]) : [],
    [['gpu-1-mig-3g40gb-9-4', 'MIG-1-0', 101, 201]],
  );
  // The agent's own stop leaves the partition to the next agent, which answers without making another.
  await r.agent.stop();
  assert.equal(gpu.gis.length, 1, "kept over the agent's restart");
  r = await rig(root, LIMITS, gpu);
  try {
    await r.synced(1);
    assert.equal(r.answer('mig-claim')?.state, 'ready');
    assert.equal(gpu.calls.filter((c) => c.startsWith('create-gi')).length, 1, 'made once');
    rmSync(join(requestDir(root), 'mig-claim.json'));
    await waitUntil(() => r.answer('mig-claim') === null, { on: onEvent(r.syncs, 'synced'), what: 'ended' });
    assert.deepEqual(gpu.gis, [], 'destroyed when the claim ended');
  } finally {
    await r.agent.stop();
  }
});

test('agent: a partition on a GPU NVML does not list, or with no MIG calls at all, is refused by name', async () => {
  const r = await rig(undefined, LIMITS);
  try {
    const ask = (uid: string, parentUuid: string): HostRequest => ({
      claim: { ...CLAIM, uid, name: uid },
      timeSlices: [],
      partitions: [{ device: 'gpu-1-mig-1g10gb-19-0', parentUuid, giProfileId: 19, start: 0, size: 1 }],
    });
    r.write('stranger', 's1', ask('stranger', 'GPU-9'));
    r.write('no-calls', 'n1', ask('no-calls', 'GPU-1'));
    await waitUntil(() => r.answer('stranger') !== null && r.answer('no-calls') !== null, {
      on: onEvent(r.syncs, 'synced'),
      what: 'both answered',
    });
    const s = r.answer('stranger');
    assert.match(s?.state === 'failed' ? s.error : '', /partitions\[0\]: "GPU-9" is no whole GPU of this node/);
    const n = r.answer('no-calls');
    assert.match(
      n?.state === 'failed' ? n.error : '',
      /cannot make MIG partitions: the driver's NVML has no MIG instance/,
    );
  } finally {
    await r.agent.stop();
  }
});

// ---- MPS on a dynamic MIG partition: the daemon's unit named by partition, resolved once the instance is made ----

/** What NVML lists with the fake GPU's instances (on GPU-1): each made MIG device, 20 GiB. */
const withMade = (gpu: FakeGpu) => (): HostInventory =>
  new Map([
    ...INVENTORY,
    ...gpu.gis.flatMap((g) =>
      g.cis.map((ci): [string, HostUnit] => [
        `MIG-${g.gi}-${ci}`,
        { uuid: `MIG-${g.gi}-${ci}`, gpuUuid: 'GPU-1', memoryMiB: 20480 },
      ]),
    ),
  ]);

const PART_DEVICE = 'gpu-1-mig-3g40gb-9-4';
const partitionMps = (uid: string): HostRequest =>
  hostRequest(
    { ...CLAIM, uid, name: uid },
    [
      {
        device: PART_DEVICE,
        sharing: mps({ defaultActiveThreadPercentage: 30 }),
        partition: { parentUuid: 'GPU-1', giProfileId: 9, start: 4, size: 4 },
      },
    ],
    NODE,
  ) as HostRequest;

/** The fake GPU's calls, with whether the claim's control daemon was still up at each destroy. */
function watchedPort(gpu: FakeGpu, hosts: () => Map<string, FakeHost>, order: string[]): MigPort {
  const up = (): boolean => [...hosts().values()].some((h) => h.children.some((c) => !c.quit && !c.killed));
  return {
    gpuInstances: () => gpu.gpuInstances(),
    createGpuInstance: (p, id, start, size) => gpu.createGpuInstance(p, id, start, size),
    createComputeInstance: (p, gi) => gpu.createComputeInstance(p, gi),
    migDevice: (p, gi, ci) => gpu.migDevice(p, gi, ci),
    destroyComputeInstance: (p, gi, ci) => {
      order.push(`destroy-ci, daemon ${up() ? 'up' : 'stopped'}`);
      return gpu.destroyComputeInstance(p, gi, ci);
    },
    destroyGpuInstance: (p, gi) => gpu.destroyGpuInstance(p, gi),
  };
}

test('agent: MPS on a partition: its daemon serves the MIG UUID made, stopped before the instance goes', async () => {
  const gpu = new FakeGpu();
  const root = mkdtempSync(join(tmpdir(), 'gdp-dra-agent-'));
  gpu.stateDir = join(root, 'state');
  const order: string[] = [];
  let r = await rig(
    root,
    LIMITS,
    watchedPort(gpu, () => r.hosts, order),
    withMade(gpu),
  );
  // One try for both agents: whichever is running when an assertion fails is stopped (a live one keeps the process).
  try {
    r.write('mig-mps', 'p1', partitionMps('mig-mps'));
    await waitUntil(() => r.answer('mig-mps') !== null, { on: onEvent(r.syncs, 'synced'), what: 'the answer' });
    const answer = r.answer('mig-mps');
    assert.deepEqual(answer?.state === 'ready' ? answer.partitions?.map((p) => p.uuid) : answer, ['MIG-1-0']);
    const claimRoot = claimMpsRoot(root, 'mig-mps');
    const host = r.hosts.get(claimRoot);
    assert.deepEqual(
      host?.plans.map((p) => p.gpus.map((g) => [g.uuid, g.pinnedMemLimitMiB])),
      [[['MIG-1-0', 20480]]],
      'one daemon, for the MIG device made, with its whole memory',
    );
    assert.deepEqual(
      host?.actions.filter((a) => a.startsWith('mode') || (a.startsWith('cmd') && !a.endsWith('quit'))),
      [
        `cmd ${claimRoot}/mps/pipe set_default_device_pinned_mem_limit 0 20480M`,
        `cmd ${claimRoot}/mps/pipe set_default_active_thread_percentage 30`,
      ],
      'no compute mode touched: a MIG device has none',
    );
    // The agent's own stop ends the daemon and leaves the instance; the next agent starts the daemon again for it.
    await r.agent.stop();
    r = await rig(
      root,
      LIMITS,
      watchedPort(gpu, () => r.hosts, order),
      withMade(gpu),
    );
    await r.synced(1);
    assert.equal(r.answer('mig-mps')?.state, 'ready');
    assert.deepEqual(
      r.hosts.get(claimRoot)?.plans.map((p) => p.gpus.map((g) => g.uuid)),
      [['MIG-1-0']],
    );
    assert.equal(gpu.calls.filter((c) => c.startsWith('create-gi')).length, 1, 'the instance made once');
    // The claim ends: its daemon stopped first, then the compute and GPU instance destroyed.
    rmSync(join(requestDir(root), 'mig-mps.json'));
    await waitUntil(() => r.answer('mig-mps') === null, { on: onEvent(r.syncs, 'synced'), what: 'ended' });
    assert.deepEqual(order, ['destroy-ci, daemon stopped']);
    assert.deepEqual(gpu.gis, [], 'destroyed');
    assert.equal(existsSync(claimRoot), false, "the claim's MPS directory removed");
  } finally {
    await r.agent.stop();
  }
});

test('agent: killed between GPU instance and record, the next agent finishes it and starts the daemon', async () => {
  const gpu = new FakeGpu();
  const root = mkdtempSync(join(tmpdir(), 'gdp-dra-agent-'));
  gpu.stateDir = join(root, 'state');
  gpu.crashAfter = 'create-gi';
  let r = await rig(root, LIMITS, gpu, withMade(gpu));
  try {
    r.write('mig-mps', 'p1', partitionMps('mig-mps'));
    await waitUntil(() => gpu.recordAtCrash !== null, { on: onEvent(r.syncs, 'synced'), what: 'the crash' });
    await r.agent.stop();
    // What the killed process left on disk: its record as it was at the crash, and no daemon ever started.
    writeFileSync(join(root, 'state', 'mig-instances.json'), gpu.recordAtCrash ?? '');
    assert.deepEqual(
      [...r.hosts.values()].flatMap((h) => h.plans),
      [],
      'no daemon before the instance is complete',
    );
    rmSync(join(answerDir(root), 'mig-mps.json'), { force: true });
    r = await rig(root, LIMITS, gpu, withMade(gpu));
    await waitUntil(() => r.answer('mig-mps')?.state === 'ready', { on: onEvent(r.syncs, 'synced'), what: 'ready' });
    assert.equal(gpu.calls.filter((c) => c.startsWith('create-gi')).length, 1, 'the instance taken, not made again');
    const host = r.hosts.get(claimMpsRoot(root, 'mig-mps'));
    assert.deepEqual(
      host?.plans.map((p) => p.gpus.map((g) => g.uuid)),
      [['MIG-1-0']],
    );
  } finally {
    await r.agent.stop();
  }
});

test('agent: a unit named by a partition the request does not carve is refused, nothing made', async () => {
  const gpu = new FakeGpu();
  const r = await rig(undefined, LIMITS, gpu, withMade(gpu));
  try {
    const good = partitionMps('stray');
    const mpsPart = good.mps as NonNullable<HostRequest['mps']>;
    const stray = { ...good, mps: { ...mpsPart, partitionUnits: [{ partition: 'gpu-1-mig-1g10gb-19-0' }] } };
    r.write('stray', 's1', stray);
    await waitUntil(() => r.answer('stray') !== null, { on: onEvent(r.syncs, 'synced'), what: 'the answer' });
    const a = r.answer('stray');
    assert.equal(
      a?.state === 'failed' ? a.error : a?.state,
      'mps.partitionUnits[0]: "gpu-1-mig-1g10gb-19-0" is none of the request\'s partitions',
    );
    assert.deepEqual(gpu.calls, [], 'nothing made');
  } finally {
    await r.agent.stop();
  }
});
