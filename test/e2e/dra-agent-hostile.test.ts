// The DRA sharing agent (the MPS unit's program, root) against a compromised plugin: the plugin can write
// in the agent's tree, so a test plays one — symlinks planted where the agent writes, mounts and removes —
// and checks that nothing outside the tree is written, mounted or removed, and that good claims are still
// served. The agent runs in a private mount namespace (unshare -m), so whatever it mounts stays there;
// its mounts are read from /proc/<pid>/mountinfo.
import assert from 'node:assert/strict';
import { execFileSync } from 'node:child_process';
import {
  lstatSync,
  mkdirSync,
  mkdtempSync,
  readFileSync,
  readdirSync,
  rmSync,
  symlinkSync,
  writeFileSync,
} from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { after, before, describe, test } from 'node:test';
import type { Claim, NodePrepareResourceResponse } from '../../src/api/dra.ts';
import { buildFakeMpsControl, buildFakeNvidiaSmi } from '../fake-nvml/build.ts';
import type { JsonObject } from '../support/apiserver.ts';
import { DRIVER, NODE, launchOf, startDraNode, prepareClaim, unprepareClaim } from '../support/dra-node.ts';
import type { DraNode } from '../support/dra-node.ts';
import { unmountUnder } from '../support/mounts.ts';
import { PluginProcess, executable } from '../support/sim.ts';

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
  const { args, env } = launchOf(node.sim.plugin);
  delete env.NOTIFY_SOCKET;
  // The fake NVML's control FIFO is the plugin's: a second reader would take commands meant for it.
  delete env.FAKE_NVML_CONTROL;
  agent = new PluginProcess(
    'unshare',
    ['-m', '--propagation', 'private', executable(), 'mps-control-daemon', ...args],
    env,
  );
  await agent.waitForLine(/DRA sharing agent started/);
});

after(async () => {
  agent?.signal('SIGTERM');
  await agent?.exited;
  await node?.stop();
  unmountUnder(base);
  rmSync(base, { recursive: true, force: true });
});

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

  test('after all of it, a plain MPS claim is still served', async () => {
    const claim = mpsClaim('good', 'gpu-3');
    const r = await prepare(claim);
    assert.equal(r.error, '', r.error);
    await unprepare(claim);
  });
});
