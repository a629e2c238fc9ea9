// DRA mode end to end: the built executable (x64) with the fake NVML, the kubelet's plugin
// watcher stand-in (real gRPC: registration, DRAPlugin, the health stream) and the API server
// stand-in (real JSON over HTTP, a bearer token with the RBAC's permissions), as a node runs it:
// registration, the ResourceSlices it publishes, claims prepared and unprepared (CDI specs written as
// `nvidia-ctk cdi generate` writes them), kubelet restarts, an API server down at start, an XID, a GPU
// removed, a restart of the plugin keeping its claims, credentials that may not do the job, consumable
// capacity from the config file (published, changed by a reload, refused when it does not fit), and the
// health stream as a 1.37 kubelet reads it (v1).
// Timings are printed as test diagnostics.
import assert from 'node:assert/strict';
import { execFile, execFileSync, spawn } from 'node:child_process';
import type { ChildProcess } from 'node:child_process';
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { describe, test } from 'node:test';
import type { TestContext } from 'node:test';
import { HealthStatus } from '../../src/api/dra.ts';
import type { JsonObject } from '../support/apiserver.ts';
import { NotifySocket } from '../support/notify-socket.ts';
import { PluginWatcherStandIn } from '../support/plugin-watcher.ts';
import { PluginProcess, executable, monotonicMs } from '../support/sim.ts';
import {
  DRIVER,
  NODE,
  READ_ONLY,
  claimOn,
  devicesOf,
  generationOf,
  launchOf,
  median,
  monotonicOf,
  restartPlugin,
  slicesOf,
  startDraNode,
  unhealthy,
  waitForSlices,
} from '../support/dra-node.ts';
import type { DraNode, SliceDevice } from '../support/dra-node.ts';

/** `gpu-device-plugin info` on the node (the daemon's environment; extra arguments after). */
function runInfo(node: DraNode, env: NodeJS.ProcessEnv, args: readonly string[] = []): Promise<string> {
  return new Promise((resolve, reject) => {
    execFile(
      executable(),
      ['info', '--pod-resources-socket', join(node.sim.dir, 'no-pod-resources.sock'), ...args],
      { env, encoding: 'utf8', timeout: 30_000 },
      (err, stdout, stderr) => {
        if (err !== null) reject(new Error(`info failed: ${err.message}\n${stdout}\n${stderr}`));
        else resolve(stdout);
      },
    );
  });
}

describe('DRA mode through the executable', { concurrency: false }, () => {
  test(
    'registers with the plugin watcher and publishes the 8 GPUs of demo-8 ' +
      'as ResourceSlices; STATUS says so; a second instance is refused',
    async (t: TestContext) => {
      const sock = new NotifySocket(`@gdp-dra-${process.pid}`);
      const node = await startDraNode({ env: { NOTIFY_SOCKET: sock.path } });
      try {
        const reg = node.watcher.registered(DRIVER);
        assert.ok(reg, 'registered');
        assert.equal(reg.endpoint, join(node.plugins, DRIVER, 'dra.sock'));
        assert.equal(reg.version, 'v1');
        t.diagnostic(`start → registered: ${(monotonicOf(reg.at) - node.sim.plugin.spawnedAt).toFixed(0)} ms`);
        const devices = await waitForSlices(node.api, (d) => d.length === 8, 'with 8 devices');
        const t0 = monotonicMs();
        t.diagnostic(`start → 8 devices published: ${(t0 - node.sim.plugin.spawnedAt).toFixed(0)} ms`);
        assert.deepEqual(devices.map((d) => d.name).sort(), [
          'gpu-0',
          'gpu-1',
          'gpu-2',
          'gpu-3',
          'gpu-4',
          'gpu-5',
          'gpu-6',
          'gpu-7',
        ]);
        const g0 = devices.find((d) => d.name === 'gpu-0');
        assert.equal(g0?.attributes?.uuid?.string, 'GPU-96a13516-8351-38da-1b3b-bd53058e4ee4');
        assert.equal(g0?.capacity?.memory?.value, '32Gi');
        // The node facts are read in DRA mode with no node labels and no config file.
        assert.match(String(g0?.attributes?.cudaComputeCapability?.version), /^\d+\.\d+\.0$/);
        assert.match(String(g0?.attributes?.cudaDriverVersion?.version), /^\d+\.\d+\.\d+$/);
        assert.equal(g0?.taints, undefined);
        // The DGX-1 layout: the two fully linked quads are one domain each (GPUs 0 and 5 are linked
        // only through others), on every device.
        const domainOf = (n: string): number | undefined =>
          devices.find((d) => d.name === n)?.attributes?.nvlinkDomain?.int;
        assert.deepEqual(
          [0, 1, 2, 3, 4, 5, 6, 7].map((i) => domainOf(`gpu-${i}`)),
          [0, 0, 0, 0, 4, 4, 4, 4],
        );
        const slices = slicesOf(node.api);
        assert.equal(slices.length, 1);
        assert.equal((slices[0]!.metadata as JsonObject).name, `${NODE}-${DRIVER}-0`);
        assert.deepEqual(((slices[0]!.spec as JsonObject).pool as JsonObject).name, NODE);
        await node.sim.plugin.waitForLine(/DRA: ResourceSlices published/);
        assert.match(await node.sim.plugin.waitForLine(/registered with the kubelet/), /driver=gpu\.nvidia\.com/);
        // systemd hears it: READY=1 with the registration, then the devices published.
        assert.match(
          await sock.waitFor(/READY=1/),
          new RegExp(
            String.raw`STATUS=registered with the kubelet \(DRA, driver gpu\.nvidia\.com\); ` +
              '(no devices published yet|8 devices published); 8 of 8 GPUs healthy',
          ),
        );
        await sock.waitFor(
          new RegExp(
            String.raw`^STATUS=registered with the kubelet \(DRA, driver ` +
              String.raw`gpu\.nvidia\.com\); 8 devices published; 8 of 8 GPUs healthy$`,
          ),
        );
        // One instance per node: a second one on the same directories is refused (exit 3), naming the first.
        const { args, env } = launchOf(node.sim.plugin);
        delete env.NOTIFY_SOCKET;
        const second = new PluginProcess(executable(), args, env);
        const exit = await second.exited;
        assert.equal(exit.code, 3, second.lines.join('\n'));
        assert.match(
          second.lines.join('\n'),
          new RegExp(
            `another gpu-device-plugin \\(PID ${node.sim.plugin.pid}\\) already serves the socket ` +
              `directory ${node.plugins}/gpu\\.nvidia\\.com; .*another --dra-driver-name or --kubelet-plugins-dir`,
          ),
        );
        assert.ok(node.watcher.registered(DRIVER), 'the first one stays registered');
        assert.equal(node.watcher.registrations.length, 1, 'and was not replaced');
      } finally {
        await node.stop();
        sock.close();
      }
    },
  );

  test(
    'prepares and unprepares claims: one GPU, two NVLinked GPUs ' +
      '(same nvlinkDomain), a foreign device refused; info lists them',
    async () => {
      const node = await startDraNode();
      try {
        const devices = await waitForSlices(node.api, (d) => d.length === 8, 'with 8 devices');
        const client = node.watcher.client(DRIVER);
        const one = claimOn(node.api, 'one-gpu', [{ request: 'gpu', device: 'gpu-3' }]);
        const r1 = await client.prepare([one]);
        assert.deepEqual(r1.claims[one.uid], {
          devices: [
            { request_names: ['gpu'], pool_name: NODE, device_name: 'gpu-3', cdi_device_ids: ['nvidia.com/gpu=3'] },
          ],
          error: '',
        });
        // As the scheduler with `matchAttribute: gpu.nvidia.com/nvlinkDomain` would: two GPUs of one domain.
        const domain = devices.find((d) => d.name === 'gpu-4')?.attributes?.nvlinkDomain?.int;
        const pair = devices
          .filter((d) => d.name !== 'gpu-3' && d.attributes?.nvlinkDomain?.int === domain)
          .slice(0, 2)
          .map((d) => d.name);
        assert.equal(pair.length, 2);
        const two = claimOn(
          node.api,
          'nvlinked-pair',
          pair.map((device) => ({ request: 'pair', device })),
        );
        const r2 = await client.prepare([two]);
        assert.equal(r2.claims[two.uid]?.error, '');
        assert.deepEqual(
          r2.claims[two.uid]?.devices.map((d) => [d.device_name, d.cdi_device_ids]),
          pair.map((n) => [n, [`nvidia.com/gpu=${n.slice(4)}`]]),
        );
        // A claim allocated a device this node does not have.
        const foreign = claimOn(node.api, 'foreign', [{ request: 'gpu', device: 'gpu-9' }]);
        const rf = await client.prepare([foreign]);
        assert.deepEqual(rf.claims[foreign.uid]?.devices, []);
        assert.match(rf.claims[foreign.uid]?.error ?? '', /gpu-9/);
        // info: the prepared claims, from the state file the daemon publishes.
        await node.sim.plugin.waitForLine(/prepared a DRA claim.*nvlinked-pair/);
        const info = await runInfo(node, launchOf(node.sim.plugin).env);
        assert.match(info, /DRA claims prepared by the daemon:/);
        assert.match(info, new RegExp(`team-a/one-gpu +${one.uid} +gpu-3 +\\d{4}-\\d\\d-\\d\\dT[0-9:.]+Z +prepared`));
        assert.match(info, new RegExp(`team-a/nvlinked-pair +${two.uid} +${pair.join(',')} +\\d{4}-`));
        assert.doesNotMatch(info, /foreign/);
        assert.match(info, /gpu\.nvidia\.com \(DRA\) +yes/);
        const u = await client.unprepare([one, two]);
        assert.deepEqual(u.claims, { [one.uid]: { error: '' }, [two.uid]: { error: '' } });
        assert.equal(node.sim.plugin.matching(/unprepared a DRA claim/).length, 2);
      } finally {
        await node.stop();
      }
    },
  );

  test(
    'MIG (mixed): the MIG devices published with their ' + 'profiles, and a claim of one prepared with its CDI ID',
    async () => {
      const names = ['0', '1', '2', '3', '0:0', '0:1', '0:2', '0:3', '1:0', '1:1', '1:2', '1:3'];
      const node = await startDraNode({ topology: 'mig-mixed-4', args: ['--mig-strategy=mixed'], cdiNames: names });
      try {
        const devices = await waitForSlices(
          node.api,
          (d) => d.some((x) => x.name.includes('-mig-')),
          'with MIG devices',
        );
        const migs = devices
          .filter((d) => d.name.includes('-mig-'))
          .map((d) => d.name)
          .sort();
        assert.ok(migs.includes('gpu-0-mig-1g10gb-19-0'), migs.join(' '));
        assert.ok(
          migs.some((n) => n.startsWith('gpu-1-mig-3g40gb-')),
          migs.join(' '),
        );
        // The GPUs without MIG are whole devices; the ones in MIG mode are not.
        assert.ok(devices.some((d) => d.name === 'gpu-2'));
        assert.ok(!devices.some((d) => d.name === 'gpu-0'));
        const mig = devices.find((d) => d.name === 'gpu-0-mig-1g10gb-19-0');
        assert.equal(mig?.attributes?.profile?.string, '1g.10gb');
        const c = claimOn(node.api, 'small', [{ request: 'small', device: 'gpu-0-mig-1g10gb-19-0' }]);
        const r = await node.watcher.client(DRIVER).prepare([c]);
        assert.equal(r.claims[c.uid]?.error, '');
        assert.match(r.claims[c.uid]?.devices[0]?.cdi_device_ids[0] ?? '', /^nvidia\.com\/gpu=0:\d$/);
      } finally {
        await node.stop();
      }
    },
  );

  test('MIG (single) on MIG devices of different profiles starts and publishes them as mixed does', async () => {
    const node = await startDraNode({ topology: 'mig-mixed-4', args: ['--mig-strategy=single'] });
    try {
      const devices = await waitForSlices(node.api, (d) => d.some((x) => x.name.includes('-mig-')), 'with MIG devices');
      const migs = devices.filter((d) => d.name.includes('-mig-')).map((d) => d.name);
      assert.ok(migs.includes('gpu-0-mig-1g10gb-19-0'), migs.join(' '));
      assert.ok(
        migs.some((n) => n.startsWith('gpu-1-mig-3g40gb-')),
        migs.join(' '),
      );
      assert.ok(devices.some((d) => d.name === 'gpu-2'));
      assert.equal(node.sim.plugin.exit, undefined);
    } finally {
      await node.stop();
    }
  });

  test('a kubelet restart: registered again and the slices it wiped published again', async (t: TestContext) => {
    const node = await startDraNode();
    try {
      await waitForSlices(node.api, (d) => d.length === 8, 'with 8 devices');
      const times: number[] = [];
      const republish: number[] = [];
      for (let i = 0; i < 3; i++) {
        await node.watcher.stop();
        const before = node.api.requests.length;
        const fromLine = node.sim.plugin.lines.length;
        const t0 = performance.now();
        // The kubelet deletes its node's slices at its start (the stand-in does the same).
        node.watcher = await PluginWatcherStandIn.start(node.registry, {
          slices: { janitor: node.api, nodeName: NODE, wipeDelayMs: 60_000 },
        });
        assert.equal(node.watcher.wipes[0]?.deleted, 1, 'the kubelet wiped the slice');
        const reg = await node.watcher.waitForRegistrations(1);
        times.push(reg.at - t0);
        await waitForSlices(node.api, (d) => d.length === 8, 'published again');
        republish.push(performance.now() - t0);
        assert.ok(
          node.api.requests.slice(before).some((r) => r.method === 'POST' && r.path.includes('resourceslices')),
          'created again',
        );
        // The log travels through stderr, the slices through HTTP: the line may come after them. The
        // plugin's watch may see the wipe before the registration: then it restores them.
        await node.sim.plugin.waitForLine(/DRA: ResourceSlices (published again|restored)/, 10_000, fromLine);
      }
      t.diagnostic(
        `kubelet restart → registered: median ${median(times).toFixed(1)} ` +
          `ms (${times.map((x) => x.toFixed(1)).join(', ')})`,
      );
      t.diagnostic(
        `kubelet restart → slices published again: median ${median(republish).toFixed(1)} ` +
          `ms (${republish.map((x) => x.toFixed(1)).join(', ')})`,
      );
    } finally {
      await node.stop();
    }
  });

  test(
    'an API server down at start: one WARN, registered ' + 'anyway, slices published once it answers',
    async (t: TestContext) => {
      const sock = new NotifySocket(`@gdp-dra-down-${process.pid}`);
      const node = await startDraNode({ apiDown: true, env: { NOTIFY_SOCKET: sock.path } });
      try {
        assert.ok(node.watcher.registered(DRIVER));
        await node.sim.plugin.waitForLine(/WARN DRA: the API server does not answer at start; starting anyway/);
        await node.sim.plugin.waitForLine(/registered with the kubelet/);
        assert.equal(slicesOf(node.api).length, 0);
        await sock.waitFor(
          new RegExp(
            String.raw`STATUS=registered with the kubelet \(DRA, driver gpu\.nvidia\.com\); no ` +
              String.raw`devices published yet \(the API server does not answer\); 8 of 8 GPUs healthy`,
          ),
        );
        const t0 = performance.now();
        await node.api.up();
        await waitForSlices(node.api, (d) => d.length === 8, 'once the API server is up', 60_000);
        t.diagnostic(
          `API server up → slices published: ${(performance.now() - t0).toFixed(0)} ms (the publisher's backoff)`,
        );
        await node.sim.plugin.waitForLine(/the API server answers again/);
        assert.equal(
          node.sim.plugin.matching(/WARN DRA: the API server does not answer;/).length,
          1,
          'one WARN while it is down, not one per retry',
        );
        await sock.waitFor(
          new RegExp(
            String.raw`STATUS=registered with the kubelet \(DRA, driver ` +
              String.raw`gpu\.nvidia\.com\); 8 devices published; 8 of 8 GPUs healthy`,
          ),
        );
      } finally {
        await node.stop();
        sock.close();
      }
    },
  );

  test(
    'an XID taints the device in its slice and makes it UNHEALTHY ' +
      'in the health stream; a GPU removed updates the slice in place',
    async (t: TestContext) => {
      const node = await startDraNode();
      try {
        await waitForSlices(node.api, (d) => d.length === 8, 'with 8 devices');
        await node.watcher.waitForHealth(
          DRIVER,
          (d) => d.length === 8 && d.every((x) => x.health === HealthStatus.HEALTHY),
        );
        const name = String((slicesOf(node.api)[0]!.metadata as JsonObject).name);
        const uid = String((slicesOf(node.api)[0]!.metadata as JsonObject).uid);
        const gen0 = generationOf(node.api);
        const taintMs: number[] = [];
        const healthMs: number[] = [];
        for (const gpu of [2, 3, 4]) {
          const name = `gpu-${gpu}`;
          const t0 = performance.now();
          node.sim.nvml(`xid ${gpu} 48`);
          const tainted = await waitForSlices(
            node.api,
            (d) => (d.find((x) => x.name === name)?.taints?.length ?? 0) > 0,
            `with ${name} tainted`,
          );
          taintMs.push(performance.now() - t0);
          assert.deepEqual(
            tainted.find((x) => x.name === name)?.taints?.map((x) => [x.key, x.value, x.effect]),
            [[`${DRIVER}/xid`, '48', 'NoSchedule']],
          );
          assert.ok(
            tainted.filter((x) => x.name.localeCompare(name) > 0).every((x) => x.taints === undefined),
            'the GPUs not hit stay untainted',
          );
          await node.watcher.waitForHealth(DRIVER, (d) => unhealthy(d, name));
          healthMs.push(performance.now() - t0);
        }
        t.diagnostic(
          `XID → taint in the slice: median ${median(taintMs).toFixed(1)} ms ` +
            `(${taintMs.map((x) => x.toFixed(1)).join(', ')}); XID → UNHEALTHY in the health stream: ` +
            `median ${median(healthMs).toFixed(1)} ms (${healthMs.map((x) => x.toFixed(1)).join(', ')})`,
        );
        assert.ok(generationOf(node.api) > gen0);

        const gen1 = generationOf(node.api);
        node.sim.nvml('remove 5');
        node.sim.plugin.signal('SIGHUP');
        const shrunk = await waitForSlices(node.api, (d) => d.length === 7, 'with 7 devices');
        assert.ok(!shrunk.some((d) => d.name === 'gpu-5'));
        const meta = slicesOf(node.api)[0]!.metadata as JsonObject;
        assert.equal(meta.name, name, 'the same slice');
        assert.equal(meta.uid, uid, 'updated in place, not deleted and created');
        assert.ok(generationOf(node.api) > gen1, 'a higher pool generation');
      } finally {
        await node.stop();
      }
    },
  );

  test(
    'a plugin restart keeps the prepared claims: prepare answers ' +
      'from the checkpoint without the API server, unprepare works',
    async (t: TestContext) => {
      const node = await startDraNode();
      try {
        await waitForSlices(node.api, (d) => d.length === 8, 'with 8 devices');
        const c = claimOn(node.api, 'kept', [{ request: 'gpu', device: 'gpu-1' }]);
        const first = await node.watcher.client(DRIVER).prepare([c]);
        assert.equal(first.claims[c.uid]?.error, '');
        const regs = node.watcher.registrations.length;
        const launch = launchOf(node.sim.plugin);
        const draArgs = launch.args.filter((a) =>
          /^--(kubelet-api|kubeconfig|node-name|kubelet-plugins-dir|kubelet-plugins-registry)=/.test(a),
        );
        let offline = '';
        const t0 = performance.now();
        await restartPlugin(node, () => {
          // No daemon: info reads the claims from the checkpoint the daemon left.
          offline = execFileSync(
            executable(),
            ['info', '--pod-resources-socket', join(node.sim.dir, 'no-pod-resources.sock'), ...draArgs],
            { env: launch.env, encoding: 'utf8', timeout: 30_000 },
          );
        });
        assert.match(offline, /Daemon: not running/);
        assert.match(
          offline,
          new RegExp(
            `DRA claims in the checkpoint .*gpu-device-plugin-checkpoint\\.json \\(prepared ` +
              `before the daemon stopped\\):\\n.*\\n.*team-a/kept +${c.uid} +gpu-1 +\\d{4}-`,
          ),
        );
        const reg = await node.watcher.waitForRegistrations(regs + 1, 15_000);
        t.diagnostic(`plugin restart (SIGTERM → registered again): ${(reg.at - t0).toFixed(0)} ms`);
        await node.sim.plugin.waitForLine(/prepared DRA claims from the checkpoint.* claims=1 /);
        const reads = (): number =>
          node.api.requests.filter((r) => r.method === 'GET' && r.path.includes('/resourceclaims/')).length;
        const before = reads();
        const again = await node.watcher.client(DRIVER).prepare([c]);
        assert.deepEqual(again.claims[c.uid], first.claims[c.uid]);
        assert.equal(reads(), before, 'answered from the checkpoint: no ResourceClaim read');
        const u = await node.watcher.client(DRIVER).unprepare([c]);
        assert.deepEqual(u.claims[c.uid], { error: '' });
        await node.sim.plugin.waitForLine(/unprepared a DRA claim.*kept/);
        await node.sim.plugin.waitForLine(/unprepared a DRA claim/);
        assert.match(await runInfo(node, launchOf(node.sim.plugin).env), /DRA claims prepared by the daemon: none\./);
      } finally {
        await node.stop();
      }
    },
  );

  test(
    'consumable capacity: every GPU published with allowMultipleAllocations and the memory policy, ' +
      'republished by a reload that changes it, a reload that does not fit refused; a 1.37 kubelet reads v1 health',
    async () => {
      const policy = (d: string): string =>
        `dra:\n  consumableCapacity:\n    memory:\n      default: ${d}\n      validRange: {min: 1Gi, step: 1Gi}\n`;
      const node = await startDraNode({ config: policy('8Gi'), healthVersions: ['v1', 'v1alpha1'] });
      try {
        const shared = (d: SliceDevice[], def: string): boolean =>
          d.length === 8 &&
          d.every(
            (x) =>
              x.allowMultipleAllocations === true &&
              JSON.stringify(x.capacity?.memory) ===
                JSON.stringify({
                  value: '32Gi',
                  requestPolicy: { default: def, validRange: { min: '1Gi', step: '1Gi' } },
                }),
          );
        await waitForSlices(node.api, (d) => shared(d, '8Gi'), 'with every GPU shared, default 8Gi');
        assert.equal(node.watcher.registered(DRIVER)?.healthVersion, 'v1');
        await node.watcher.waitForHealth(
          DRIVER,
          (d) => d.length === 8 && d.every((x) => x.health === HealthStatus.HEALTHY),
        );
        writeFileSync(node.configPath, policy('4Gi'));
        node.sim.plugin.signal('SIGHUP');
        await waitForSlices(node.api, (d) => shared(d, '4Gi'), 'with every GPU shared, default 4Gi');
        const gen = generationOf(node.api);
        // More than the GPUs' 32Gi: refused, the running policy kept.
        const from = node.sim.plugin.lines.length;
        writeFileSync(node.configPath, policy('40Gi'));
        node.sim.plugin.signal('SIGHUP');
        const refused = await node.sim.plugin.waitForLine(/config reload refused/, 10_000, from);
        assert.match(refused, /dra\.consumableCapacity\.memory\.default: 40Gi is more than GPU 0's/);
        assert.equal(generationOf(node.api), gen);
        assert.ok(shared(devicesOf(node.api), '4Gi'));
      } finally {
        await node.stop();
      }
    },
  );

  test('a consumable capacity larger than a GPU stops the start: exit 2 naming the key and the GPU', async () => {
    const config = 'dra:\n  consumableCapacity:\n    memory: {default: 8Gi, validValues: [8Gi, 64Gi]}\n';
    const node = await startDraNode({ config, waitRegistered: false });
    try {
      const exit = await node.sim.plugin.exited;
      assert.equal(exit.code, 2, node.sim.plugin.lines.join('\n'));
      assert.match(
        node.sim.plugin.lines.find((l) => /cannot start/.test(l)) ?? '',
        /config file .*config\.yaml: dra\.consumableCapacity\.memory\.validValues\[1\]: 64Gi is more than GPU 0's/,
      );
    } finally {
      await node.stop();
    }
  });

  test('credentials that may not do the job: exit 2 naming the permissions and the RBAC shipped', async () => {
    const node = await startDraNode({ grant: READ_ONLY, waitRegistered: false });
    try {
      const exit = await node.sim.plugin.exited;
      assert.equal(exit.code, 2, node.sim.plugin.lines.join('\n'));
      const line = node.sim.plugin.lines.find((l) => /cannot start/.test(l)) ?? '';
      assert.match(
        line,
        new RegExp(
          String.raw`may not create resourceslices\.resource\.k8s\.io, update ` +
            String.raw`resourceslices\.resource\.k8s\.io, delete ` +
            String.raw`resourceslices\.resource\.k8s\.io, get resourceclaims\.resource\.k8s\.io`,
        ),
      );
      assert.match(line, /\/usr\/share\/doc\/gpu-device-plugin\/dra\/rbac\.yaml/);
      assert.equal(node.watcher.registrations.length, 0, 'never registered');
    } finally {
      await node.stop();
    }
  });

  test('a kubeconfig that cannot be used: exit 2 naming the problem', async () => {
    const node = await startDraNode();
    try {
      await restartPlugin(node, () =>
        writeFileSync(node.kubeconfigPath, 'apiVersion: v1\nkind: Config\nclusters: []\n'),
      );
      const exit = await node.sim.plugin.exited;
      assert.equal(exit.code, 2, node.sim.plugin.lines.join('\n'));
      assert.match(
        node.sim.plugin.lines.find((l) => /cannot start/.test(l)) ?? '',
        new RegExp(`--kubeconfig: ${node.kubeconfigPath} has no current-context`),
      );
    } finally {
      await node.stop();
    }
  });
  test(
    'the driver directory deleted under a systemd-style ' + 'private mount: one clear line, exit 1 to be restarted',
    async () => {
      // As ProtectSystem=strict with the DRA drop-in's ReadWritePaths= (done by hand, as plugin.test.ts
      // does for the device-plugin directory): in a mount namespace of its own the plugin sees the node's
      // folder read-only except the two DRA directories, bind-mounted onto themselves. Deleting the
      // driver's directory outside drops that mount; the plugin cannot serve there again and exits 1.
      const node = await startDraNode();
      const outside = mkdtempSync(join(tmpdir(), 'gdp-dra-ns-'));
      let child: ChildProcess | undefined;
      try {
        const { args, env } = launchOf(node.sim.plugin);
        node.sim.plugin.signal('SIGTERM');
        assert.equal((await node.sim.plugin.exited).code, 0);
        const driverDir = join(node.plugins, DRIVER);
        const regs = node.watcher.registrations.length;
        child = spawn(
          'unshare',
          [
            '--mount',
            '--propagation',
            'private',
            'sh',
            '-c',
            'mount --bind "$0" "$0" && mount -o remount,bind,ro "$0" && for d in "$1" "$2"; do mount ' +
              '--bind "$d" "$d" && mount -o remount,bind,rw "$d" || exit 9; done; shift 2; exec "$@"',
            node.sim.dir,
            node.registry,
            driverDir,
            executable(),
            ...args,
          ],
          {
            env: {
              ...env,
              PATH: '/usr/bin:/bin',
              TMPDIR: outside,
              GPU_DEVICE_PLUGIN_STATE_FILE: join(outside, 'state.json'),
              FAKE_NVML_CONTROL: join(outside, 'nvml-control'),
            },
            stdio: ['ignore', 'ignore', 'pipe'],
          },
        );
        let log = '';
        child.stderr?.on('data', (c: Buffer) => {
          log += c.toString();
        });
        const exited = new Promise<number | null>((resolve) => child?.on('exit', (code) => resolve(code)));
        await node.watcher.waitForRegistrations(regs + 1, 20_000).catch((err: unknown) => {
          throw new Error(`${(err as Error).message}\n${log}`);
        });
        rmSync(driverDir, { recursive: true, force: true });
        let timer: NodeJS.Timeout | undefined;
        const code = await Promise.race([
          exited,
          new Promise<'timeout'>((r) => {
            timer = setTimeout(() => r('timeout'), 20_000);
          }),
        ]);
        clearTimeout(timer);
        assert.equal(code, 1, log);
        const lost = log.split('\n').filter((l) => /lost the socket directory/.test(l));
        assert.equal(lost.length, 1, log);
        // The reason it exits, not a retry that will never come.
        assert.deepEqual(
          log.split('\n').filter((l) => /cannot serve the DRA sockets yet/.test(l)),
          [],
          log,
        );
        assert.match(
          lost[0]!,
          new RegExp(
            `ERROR lost the socket directory: the directory was deleted.*its mount in this process's ` +
              `mount namespace went with it; exiting so that systemd restarts the service.*dir=${driverDir}`,
          ),
        );
      } finally {
        child?.kill('SIGKILL');
        rmSync(outside, { recursive: true, force: true });
        await node.stop();
      }
    },
  );
});
