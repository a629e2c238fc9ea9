// Shared GPUs under DRA through the built executables: the plugin in DRA mode (test/support/dra-node.ts) and,
// beside it, the MPS unit's program (`mps-control-daemon` with the same options) as the sharing agent, with the
// fake nvidia-cuda-mps-control and the fake nvidia-smi on PATH. Claims carry NVIDIA's GpuConfig as the
// scheduler copies it into status.allocation.devices.config. What the host got is read from the fakes: the
// time-slices nvidia-smi was told (its log and state), each MPS daemon's limits (the fake's state in the
// claim's pipe directory), the compute modes (the fake NVML's stats).
import assert from 'node:assert/strict';
import { existsSync, mkdtempSync, readFileSync, readdirSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { after, before, describe, test } from 'node:test';
import type { Claim, DeviceHealth, NodePrepareResourceResponse } from '../../src/api/dra.ts';
import { HealthStatus } from '../../src/api/dra.ts';
import { buildFakeMpsControl, buildFakeNvidiaSmi } from '../fake-nvml/build.ts';
import type { JsonObject } from '../support/apiserver.ts';
import {
  DRIVER,
  NODE,
  restartPlugin,
  startDraNode,
  waitForSlices,
  prepareClaim,
  unprepareClaim,
  startSharingAgent,
} from '../support/dra-node.ts';
import { unmountUnder } from '../support/mounts.ts';
import type { DraNode } from '../support/dra-node.ts';
import type { PluginProcess } from '../support/sim.ts';
import { onFileChange, waitUntil } from '../support/wait.ts';

const GPU = (
  JSON.parse(readFileSync(join(import.meta.dirname, '..', 'fixtures', 'topologies', 'demo-8.json'), 'utf8')) as {
    gpus: { uuid: string }[];
  }
).gpus.map((g) => g.uuid);

let base = '';
let mpsRoot = '';
let smiLog = '';
let node: DraNode;
let agent: PluginProcess;

function startAgent(): PluginProcess {
  return startSharingAgent(node, join(base, 'agent-state'));
}

before(async () => {
  const [mpsDir, smiDir] = await Promise.all([buildFakeMpsControl(), buildFakeNvidiaSmi()]);
  base = mkdtempSync(join(tmpdir(), 'gdp-dra-sharing-'));
  mpsRoot = join(base, 'mps');
  smiLog = join(base, 'nvidia-smi.log');
  node = await startDraNode({
    args: [`--mps-root=${mpsRoot}`],
    env: {
      PATH: `${mpsDir}:${smiDir}:${process.env.PATH ?? ''}`,
      FAKE_NVIDIA_SMI_LOG: smiLog,
      FAKE_NVIDIA_SMI_STATE: join(base, 'nvidia-smi.json'),
    },
  });
  agent = startAgent();
  await agent.waitForLine(/DRA sharing agent started/);
});

/** The control daemons still running with a pipe under dir (from their environment). */
function daemonsUnder(dir: string): string[] {
  const out: string[] = [];
  for (const pid of readdirSync('/proc').filter((p) => /^\d+$/.test(p))) {
    let env = '';
    try {
      if (!readFileSync(`/proc/${pid}/cmdline`, 'utf8').includes('nvidia-cuda-mps-control')) continue;
      env = readFileSync(`/proc/${pid}/environ`, 'utf8');
    } catch {
      continue; // gone meanwhile
    }
    const pipe = env.split('\0').find((kv) => kv.startsWith('CUDA_MPS_PIPE_DIRECTORY='));
    if (pipe?.startsWith(`CUDA_MPS_PIPE_DIRECTORY=${dir}/`)) out.push(`${pid} ${pipe}`);
  }
  return out;
}

after(async () => {
  agent?.signal('SIGTERM');
  await agent?.exited;
  await node?.stop();
  // Every claim was unprepared: no control daemon of theirs may outlive the test (a stop while a daemon
  // restarts must end the restarted one too).
  const left = daemonsUnder(base);
  for (const d of left) process.kill(Number(d.split(' ')[0]), 'SIGKILL');
  assert.deepEqual(left, [], 'no control daemon left running');
  unmountUnder(base);
  rmSync(base, { recursive: true, force: true });
});

const gpuConfig = (sharing: JsonObject, requests?: string[]): JsonObject => ({
  source: 'FromClaim',
  ...(requests === undefined ? {} : { requests }),
  opaque: {
    driver: DRIVER,
    parameters: { apiVersion: 'resource.nvidia.com/v1beta1', kind: 'GpuConfig', sharing },
  },
});

interface Result {
  request: string;
  device: string;
  shareID?: string;
  consumedCapacity?: JsonObject;
}

function sharedClaim(name: string, results: Result[], config: JsonObject[]): Claim {
  const stored = node.api.putClaim({
    namespace: 'team-a',
    name,
    status: {
      allocation: {
        devices: {
          results: results.map((r) => ({ driver: DRIVER, pool: NODE, ...r }) as unknown as JsonObject),
          config,
        },
      },
    },
  });
  return { namespace: 'team-a', name, uid: String((stored.metadata as JsonObject).uid) };
}

const prepare = (claim: Claim): Promise<NodePrepareResourceResponse> => prepareClaim(node, claim);
const unprepare = (claim: Claim): Promise<void> => unprepareClaim(node, claim);

/** The time-slices nvidia-smi was told, one "uuid n" each, in order. */
function timeSlicesSet(): string[] {
  if (!existsSync(smiLog)) return [];
  return readFileSync(smiLog, 'utf8')
    .split('\n')
    .filter((l) => l.includes('--set-timeslice'))
    .map((l) => (JSON.parse(l) as { argv: string[] }).argv)
    .map((a) => `${a[a.indexOf('-i') + 1]} ${a[a.indexOf('--set-timeslice') + 1]}`);
}

function claimPipe(uid: string): string {
  return join(mpsRoot, 'dra', 'claims', uid, 'mps', 'pipe');
}

/** The fake control daemon's limits, as its state file in the claim's pipe directory holds them. */
function daemonLimits(uid: string): { threads: unknown; pinned: unknown } | null {
  const p = join(claimPipe(uid), 'fake-mps-state.json');
  if (!existsSync(p)) return null;
  const s = JSON.parse(readFileSync(p, 'utf8')) as {
    defaultActiveThreadPercentage?: unknown;
    pinnedMemLimitMiB?: unknown;
  };
  return { threads: s.defaultActiveThreadPercentage, pinned: s.pinnedMemLimitMiB };
}

function health(devices: readonly DeviceHealth[], name: string): HealthStatus | undefined {
  return devices.find((d) => d.device?.device_name === name)?.health;
}

describe('shared GPUs under DRA through the executables', { concurrency: false }, () => {
  test(
    'a TimeSlicing claim gets its interval while prepared and Default back at unprepare; ' +
      'another interval on that GPU is refused naming the holder',
    async () => {
      const first = sharedClaim(
        'ts-long',
        [{ request: 'gpu', device: 'gpu-0', shareID: '11111111-1111-1111-1111-111111111111' }],
        [gpuConfig({ strategy: 'TimeSlicing', timeSlicingConfig: { interval: 'Long' } })],
      );
      const r = await prepare(first);
      assert.equal(r.error, '', r.error);
      assert.deepEqual(timeSlicesSet(), [`${GPU[0]} 3`]);
      const second = sharedClaim(
        'ts-short',
        [{ request: 'gpu', device: 'gpu-0', shareID: '22222222-2222-2222-2222-222222222222' }],
        [gpuConfig({ strategy: 'TimeSlicing', timeSlicingConfig: { interval: 'Short' } })],
      );
      const refused = await prepare(second);
      assert.match(
        refused.error ?? '',
        new RegExp(
          `asks time-slice interval Short on GPU ${GPU[0]}, ` +
            `which claim team-a/ts-long \\(uid ${first.uid}\\) holds at Long`,
        ),
      );
      await unprepare(second);
      await unprepare(first);
      assert.deepEqual(timeSlicesSet(), [`${GPU[0]} 3`, `${GPU[0]} 0`], 'Default once the last claim went');
    },
  );

  test('an MPS claim: its own daemon, limits and CDI spec; its daemon killed → UNHEALTHY, tainted → back', async () => {
    const claim = sharedClaim(
      'mps-one',
      [{ request: 'gpu', device: 'gpu-1' }],
      [
        gpuConfig({
          strategy: 'MPS',
          mpsConfig: { defaultActiveThreadPercentage: 50, defaultPinnedDeviceMemoryLimit: '8Gi' },
        }),
      ],
    );
    const r = await prepare(claim);
    assert.equal(r.error, '', r.error);
    const ids = r.devices?.[0]?.cdi_device_ids ?? [];
    assert.ok(ids.includes(`k8s.gpu-device-plugin/claim=${claim.uid}`), `the claim's CDI ID in ${ids.join(', ')}`);
    const spec = JSON.parse(readFileSync(join(node.cdi, `gpu-device-plugin-claim-${claim.uid}.json`), 'utf8')) as {
      devices: { containerEdits: { env: string[]; mounts: { hostPath: string }[] } }[];
    };
    assert.deepEqual(spec.devices[0]?.containerEdits.env, [`CUDA_MPS_PIPE_DIRECTORY=/mps/${claim.uid}/pipe`]);
    assert.equal(spec.devices[0]?.containerEdits.mounts[0]?.hostPath, claimPipe(claim.uid));
    assert.deepEqual(daemonLimits(claim.uid), { threads: 50, pinned: { '0': 8192 } });
    // The GPU is the claim's alone: EXCLUSIVE_PROCESS while its daemon runs (the agent reads it back from NVML).
    assert.equal(agent.matching(new RegExp(`compute mode set gpu=${GPU[1]} mode=exclusive-process`)).length, 1);
    // Health: the daemon killed, UNHEALTHY and a taint; back once the agent has started it again.
    const pidFile = join(mpsRoot, 'dra', 'claims', claim.uid, 'mps', '.started');
    const pid = Number(readFileSync(pidFile, 'utf8').trim());
    process.kill(pid, 'SIGKILL');
    const down = await node.watcher.waitForHealth(DRIVER, (d) => health(d, 'gpu-1') === HealthStatus.UNHEALTHY);
    assert.match(
      down.find((d) => d.device?.device_name === 'gpu-1')?.message ?? '',
      /MPS control daemon of claim team-a\/mps-one .* does not answer/,
    );
    assert.equal(health(down, 'gpu-0'), HealthStatus.HEALTHY, 'only the claim’s devices');
    await waitForSlices(
      node.api,
      (d) => d.some((x) => x.name === 'gpu-1' && (x.taints ?? []).some((t) => t.key === 'gpu.nvidia.com/mps-daemon')),
      'gpu-1 tainted mps-daemon',
    );
    await node.watcher.waitForHealth(DRIVER, (d) => health(d, 'gpu-1') === HealthStatus.HEALTHY, 20_000);
    await waitForSlices(node.api, (d) => d.some((x) => x.name === 'gpu-1' && x.taints === undefined), 'the taint gone');
    await unprepare(claim);
    assert.equal(existsSync(join(mpsRoot, 'dra', 'claims', claim.uid)), false, "the claim's MPS directory removed");
    assert.equal(agent.matching(new RegExp(`compute mode set gpu=${GPU[1]} mode=default`)).length, 1, 'mode back');
    assert.equal(
      existsSync(join(node.cdi, `gpu-device-plugin-claim-${claim.uid}.json`)),
      false,
      'its CDI spec removed',
    );
  });

  test('three shares of one GPU with MPS: a daemon each held to its consumed memory, in any order', async () => {
    const share = (name: string, id: string, mem: string): Claim =>
      sharedClaim(
        name,
        [{ request: 'gpu', device: 'gpu-2', shareID: id, consumedCapacity: { memory: mem } }],
        [gpuConfig({ strategy: 'MPS' })],
      );
    const a = share('share-a', '33333333-3333-3333-3333-333333333333', '4Gi');
    const b = share('share-b', '44444444-4444-4444-4444-444444444444', '12Gi');
    const c = share('share-c', '55555555-5555-5555-5555-555555555555', '2Gi');
    for (const x of [b, a]) assert.equal((await prepare(x)).error, '', x.name);
    assert.deepEqual(daemonLimits(a.uid)?.pinned, { '0': 4096 });
    assert.deepEqual(agent.matching(new RegExp(`compute mode set gpu=${GPU[2]}`)), [], 'a shared GPU keeps its mode');
    assert.deepEqual(daemonLimits(b.uid)?.pinned, { '0': 12288 });
    await unprepare(a);
    assert.deepEqual(daemonLimits(b.uid)?.pinned, { '0': 12288 }, 'the other share keeps its daemon');
    assert.equal((await prepare(c)).error, '', 'a third share beside the one left');
    assert.deepEqual(daemonLimits(c.uid)?.pinned, { '0': 2048 });
    await unprepare(b);
    assert.deepEqual(daemonLimits(c.uid)?.pinned, { '0': 2048 }, 'the last share keeps its daemon');
    await unprepare(c);
    for (const x of [a, b, c]) assert.equal(existsSync(join(mpsRoot, 'dra', 'claims', x.uid)), false, x.name);
    // A daemon stopped by unprepare is no longer watched: its going is no fault of the GPU.
    assert.deepEqual(node.sim.plugin.matching(/does not answer.*share-[abc]/), []);
  });

  test('a plugin restart keeps MPS and time-sliced claims: the same daemon and interval, cleaned after', async () => {
    const claim = sharedClaim('mps-kept', [{ request: 'gpu', device: 'gpu-3' }], [gpuConfig({ strategy: 'MPS' })]);
    const sliced = sharedClaim(
      'ts-kept',
      [{ request: 'gpu', device: 'gpu-5' }],
      [gpuConfig({ strategy: 'TimeSlicing', timeSlicingConfig: { interval: 'Medium' } })],
    );
    const before = await prepare(claim);
    assert.equal(before.error, '', before.error);
    const slicedBefore = await prepare(sliced);
    assert.equal(slicedBefore.error, '', slicedBefore.error);
    const slices = timeSlicesSet().length;
    assert.equal(timeSlicesSet().at(-1), `${GPU[5]} 2`);
    const pidFile = join(mpsRoot, 'dra', 'claims', claim.uid, 'mps', '.started');
    const pid = readFileSync(pidFile, 'utf8');
    await restartPlugin(node);
    await node.watcher.waitForRegistrations(2, 15_000);
    const again = await prepare(claim);
    assert.deepEqual(again, before, 'answered from the checkpoint');
    assert.deepEqual(await prepare(sliced), slicedBefore);
    assert.equal(readFileSync(pidFile, 'utf8'), pid, 'the same control daemon');
    assert.equal(timeSlicesSet().length, slices, 'no time-slice set again');
    await unprepare(sliced);
    assert.equal(timeSlicesSet().at(-1), `${GPU[5]} 0`, 'Default at unprepare');
    await unprepare(claim);
    await waitUntil(() => !existsSync(pidFile), {
      on: onFileChange(join(mpsRoot, 'dra', 'claims')),
      what: 'the daemon gone',
    });
  });

  test('a sharing config that contradicts itself is refused for that claim, naming the field', async () => {
    const claim = sharedClaim(
      'contradiction',
      [{ request: 'gpu', device: 'gpu-4' }],
      [gpuConfig({ strategy: 'TimeSlicing', mpsConfig: { defaultActiveThreadPercentage: 10 } })],
    );
    const r = await prepare(claim);
    assert.match(r.error ?? '', /mpsConfig/);
    assert.equal(existsSync(join(mpsRoot, 'dra', 'requests', `${claim.uid}.json`)), false, 'nothing asked of the host');
  });
});
