// The DRA sharing agent (the MPS unit's program, root) against a compromised plugin: the plugin can write
// in the agent's tree, so a test plays one — symlinks planted where the agent writes, mounts and removes —
// and checks that nothing outside the tree is written, mounted or removed, and that good claims are still
// served. The agent runs in a private mount namespace (unshare -m), so whatever it mounts stays there;
// its mounts are read from /proc/<pid>/mountinfo.
import assert from 'node:assert/strict';
import { execFileSync } from 'node:child_process';
import {
  existsSync,
  lstatSync,
  mkdirSync,
  mkdtempSync,
  readFileSync,
  readdirSync,
  renameSync,
  rmSync,
  symlinkSync,
  writeFileSync,
} from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { after, before, describe, test } from 'node:test';
import type { Claim, NodePrepareResourceResponse } from '../../src/api/dra.ts';
import { serializeRequest } from '../../src/core/dra-sharing.ts';
import type { HostRequest } from '../../src/core/dra-sharing.ts';
import { buildFakeMpsControl, buildFakeNvidiaSmi } from '../fake-nvml/build.ts';
import type { JsonObject } from '../support/apiserver.ts';
import {
  DRIVER,
  NODE,
  startDraNode,
  prepareClaim,
  unprepareClaim,
  startSharingAgent,
  stopWithAgent,
} from '../support/dra-node.ts';
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
let outside = '';
let node: DraNode;
let agent: PluginProcess;

before(async () => {
  const [mpsDir, smiDir] = await Promise.all([buildFakeMpsControl(), buildFakeNvidiaSmi()]);
  base = mkdtempSync(join(tmpdir(), 'gdp-dra-hostile-'));
  mpsRoot = join(base, 'mps');
  outside = join(base, 'outside');
  mkdirSync(join(outside, 'cron.d'), { recursive: true });
  writeFileSync(join(outside, 'victim'), 'keep\n');
  writeFileSync(join(outside, 'cron.d', 'job'), 'keep\n');
  node = await startDraNode({
    args: [`--mps-root=${mpsRoot}`],
    env: {
      PATH: `${mpsDir}:${smiDir}:${process.env.PATH ?? ''}`,
      FAKE_NVIDIA_SMI_LOG: join(base, 'nvidia-smi.log'),
      FAKE_NVIDIA_SMI_STATE: join(base, 'nvidia-smi.json'),
    },
  });
  // Two MPS claims' shm (8Gi each) at most, whatever this machine's memory.
  agent = startSharingAgent(node, join(base, 'agent-state'), { unshare: true, env: { DRA_MPS_SHM_TOTAL: '16Gi' } });
  await agent.waitForLine(/DRA sharing agent started/);
});

after(() => stopWithAgent(node, agent, base));

/** What is outside the agent's tree, as a sorted list of "path content" (directories listed, files read). */
function outsideState(): string[] {
  const out: string[] = [];
  const walk = (dir: string): void => {
    for (const name of readdirSync(dir).sort()) {
      const p = join(dir, name);
      const s = lstatSync(p);
      if (s.isDirectory()) {
        out.push(`${p}/`);
        walk(p);
      } else out.push(`${p} ${s.isSymbolicLink() ? '->link' : readFileSync(p, 'utf8').trim()}`);
    }
  };
  walk(outside);
  return out;
}

/** The mount points under `dir` in the agent's mount namespace. */
function agentMountsUnder(dir: string): string[] {
  return readFileSync(`/proc/${agent.pid}/mountinfo`, 'utf8')
    .split('\n')
    .map((l) => l.split(' ')[4] ?? '')
    .filter((m) => m === dir || m.startsWith(`${dir}/`));
}

function mpsClaim(name: string, device: string): Claim {
  const stored = node.api.putClaim({
    namespace: 'team-h',
    name,
    status: {
      allocation: {
        devices: {
          results: [{ driver: DRIVER, pool: NODE, request: 'gpu', device } as unknown as JsonObject],
          config: [
            {
              source: 'FromClaim',
              opaque: {
                driver: DRIVER,
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
  });
  return { namespace: 'team-h', name, uid: String((stored.metadata as JsonObject).uid) };
}

/** The runs of nvidia-smi so far, one line each. */
function smiRuns(): string[] {
  const p = join(base, 'nvidia-smi.log');
  return existsSync(p)
    ? readFileSync(p, 'utf8')
        .split('\n')
        .filter((l) => l !== '')
    : [];
}

/** A request written as a compromised plugin would: straight into the requests directory, any content. */
function writeRequest(uid: string, request: HostRequest): void {
  const p = join(mpsRoot, 'dra', 'requests', `${uid}.json`);
  writeFileSync(`${p}.tmp`, serializeRequest({ id: `${uid}-1`, request }));
  renameSync(`${p}.tmp`, p);
}

function answerOf(uid: string): { state: string; error?: string } | null {
  const p = join(mpsRoot, 'dra', 'answers', `${uid}.json`);
  return existsSync(p) ? (JSON.parse(readFileSync(p, 'utf8')) as { state: string; error?: string }) : null;
}

const prepare = (claim: Claim): Promise<NodePrepareResourceResponse> => prepareClaim(node, claim);
const unprepare = (claim: Claim): Promise<void> => unprepareClaim(node, claim);

describe('the DRA sharing agent against a compromised plugin', { concurrency: false }, () => {
  test('an answer temp file planted as a symlink is replaced, not followed', async () => {
    const before = outsideState();
    const claim = mpsClaim('answer-link', 'gpu-0');
    symlinkSync(join(outside, 'victim'), join(mpsRoot, 'dra', 'answers', `${claim.uid}.json.tmp`));
    const r = await prepare(claim);
    assert.equal(r.error, '', r.error);
    assert.deepEqual(outsideState(), before, 'nothing outside the tree written');
    assert.ok(lstatSync(join(mpsRoot, 'dra', 'answers', `${claim.uid}.json`)).isFile(), 'the answer a file of its own');
    await unprepare(claim);
    assert.deepEqual(outsideState(), before);
  });

  test("a claim's directory made a symlink to a host directory: refused, nothing mounted or made there", async () => {
    const before = outsideState();
    const claim = mpsClaim('claim-link', 'gpu-1');
    symlinkSync(join(outside, 'cron.d'), join(mpsRoot, 'dra', 'claims', claim.uid));
    const r = await prepare(claim);
    assert.match(r.error ?? '', /symbolic link/, 'the claim refused, naming the link');
    assert.deepEqual(agentMountsUnder(outside), [], 'no tmpfs over the host directory');
    assert.deepEqual(outsideState(), before, 'nothing outside the tree made or changed');
    await unprepare(claim);
    assert.deepEqual(outsideState(), before, 'nothing outside removed at unprepare');
  });

  test("a claim's .ready planted as a symlink is replaced; the claim is served and ends cleanly", async () => {
    const before = outsideState();
    const claim = mpsClaim('ready-link', 'gpu-2');
    const root = join(mpsRoot, 'dra', 'claims', claim.uid);
    mkdirSync(root);
    symlinkSync(join(outside, 'victim'), join(root, '.ready'));
    const r = await prepare(claim);
    assert.equal(r.error, '', r.error);
    assert.deepEqual(outsideState(), before, 'the host file not truncated');
    await unprepare(claim);
    assert.deepEqual(agentMountsUnder(mpsRoot), [], "the claim's shm unmounted");
    assert.deepEqual(outsideState(), before);
  });

  test("links planted inside a live claim's tree are unlinked at unprepare, never followed into the host", async () => {
    const before = outsideState();
    const claim = mpsClaim('tree-links', 'gpu-5');
    const r = await prepare(claim);
    assert.equal(r.error, '', r.error);
    const root = join(mpsRoot, 'dra', 'claims', claim.uid);
    symlinkSync(join(outside, 'cron.d'), join(root, 'mps', 'planted-dir'));
    symlinkSync(join(outside, 'victim'), join(root, 'mps', 'planted-file'));
    symlinkSync(outside, join(root, 'outside'));
    await unprepare(claim);
    assert.equal(existsSync(root), false, "the claim's tree removed");
    assert.deepEqual(outsideState(), before, 'nothing outside removed or changed');
  });

  test('FIFOs and links named as requests and a forged time-slice record never stall or steer it', async () => {
    execFileSync('mkfifo', [join(mpsRoot, 'dra', 'requests', 'fifo.json')]);
    symlinkSync(join(outside, 'victim'), join(mpsRoot, 'dra', 'requests', 'link.json'));
    writeFileSync(join(mpsRoot, 'dra', 'timeslices.json'), '{"-i 0,1": "Long", "GPU-x": "--help"}\n');
    const claim = mpsClaim('after-fifo', 'gpu-4');
    const r = await prepare(claim);
    assert.equal(r.error, '', r.error);
    await unprepare(claim);
    rmSync(join(mpsRoot, 'dra', 'requests', 'fifo.json'));
    rmSync(join(mpsRoot, 'dra', 'requests', 'link.json'));
  });

  test('GPU ids that are nvidia-smi arguments or not on this node are answered "failed"; none is run', async () => {
    const smiBefore = smiRuns();
    const forged = (uid: string, uuid: string): void =>
      writeRequest(uid, { claim: { namespace: 'team-h', name: uid, uid }, timeSlices: [{ uuid, interval: 'Long' }] });
    forged('forged-args', '-i 0,1,2,3,4,5,6,7');
    forged('forged-help', '--help');
    forged('forged-stranger', 'GPU-99999999-9999-9999-9999-999999999999');
    writeRequest('forged-mps', {
      claim: { namespace: 'team-h', name: 'forged-mps', uid: 'forged-mps' },
      timeSlices: [],
      mps: {
        activeThreadPercentage: 100,
        exclusive: true,
        units: [{ uuid: GPU[5] ?? '', gpuIndex: 0, pinnedMemLimitMiB: 1 }],
      },
    });
    const uids = ['forged-args', 'forged-help', 'forged-stranger', 'forged-mps'];
    await waitUntil(() => uids.every((u) => answerOf(u) !== null), {
      on: onFileChange(join(mpsRoot, 'dra', 'answers')),
      what: 'the forged requests answered',
    });
    for (const u of uids) assert.equal(answerOf(u)?.state, 'failed', u);
    assert.match(String(answerOf('forged-args')?.error), /"-i 0,1,2,3,4,5,6,7" is no whole GPU of this node/);
    assert.match(String(answerOf('forged-mps')?.error), /gpuIndex 0 is not GPU .*'s \(NVML's index is 5\)/);
    assert.deepEqual(smiRuns(), smiBefore, 'nvidia-smi never ran for them');
    assert.deepEqual(agentMountsUnder(join(mpsRoot, 'dra', 'claims')), [], 'no daemon, no shm');
    for (const u of uids) rmSync(join(mpsRoot, 'dra', 'requests', `${u}.json`));
  });

  test('a flood of MPS requests past the shm total: those past it refused by name, the rest served', async () => {
    const uids = ['flood-0', 'flood-1', 'flood-2'];
    for (const [i, uid] of uids.entries()) {
      writeRequest(uid, {
        claim: { namespace: 'team-h', name: uid, uid },
        timeSlices: [],
        mps: {
          activeThreadPercentage: 100,
          exclusive: false,
          units: [{ uuid: GPU[i] ?? '', pinnedMemLimitMiB: 1024 }],
        },
      });
    }
    await waitUntil(() => uids.every((u) => answerOf(u) !== null), {
      on: onFileChange(join(mpsRoot, 'dra', 'answers')),
      what: 'the flood answered',
    });
    const states = uids.map((u) => answerOf(u)?.state);
    assert.deepEqual(states.filter((s) => s === 'ready').length, 2, `two served (${states.join(', ')})`);
    const refused = uids.map(answerOf).find((a) => a?.state === 'failed');
    assert.match(String(refused?.error), /would pass --dra-mps-shm-total \(DRA_MPS_SHM_TOTAL\) of 17179869184 bytes/);
    assert.equal(agentMountsUnder(join(mpsRoot, 'dra', 'claims')).length, 2, 'two shm mounts, no more');
    for (const u of uids) rmSync(join(mpsRoot, 'dra', 'requests', `${u}.json`));
    await waitUntil(() => agentMountsUnder(join(mpsRoot, 'dra', 'claims')).length === 0, {
      on: onFileChange(join(mpsRoot, 'dra', 'answers')),
      what: 'the flood ended',
    });
  });

  test('after all of it, a plain MPS claim is still served', async () => {
    const claim = mpsClaim('good', 'gpu-3');
    const r = await prepare(claim);
    assert.equal(r.error, '', r.error);
    await unprepare(claim);
  });
});
