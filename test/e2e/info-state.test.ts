// `info` shows what the running daemon reports: the daemon publishes its state on every
// applied snapshot and registration change, and `info` reads it instead of probing NVML; with no
// daemon (a stale file) it falls back to NVML and says so.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { execFile } from 'node:child_process';
import { mkdirSync, mkdtempSync, readFileSync, rmSync, statSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { buildFakeNvml } from '../fake-nvml/build.ts';
import { SimNode, TOPOLOGIES, executable, loadTopology, writeSysfs } from '../support/sim.ts';
import { onFileChange, waitFor } from '../support/wait.ts';

interface Run {
  status: number | null;
  stdout: string;
  stderr: string;
}

async function info(node: SimNode, args: string[] = []): Promise<Run> {
  const libs = await buildFakeNvml();
  const env: Record<string, string> = {
    PATH: '/nonexistent',
    TMPDIR: node.dir,
    SYSFS_ROOT: node.sysfs,
    LD_LIBRARY_PATH: libs.current,
    FAKE_NVML_CONFIG: node.configPath,
    SYSTEMD_UNIT_ROOT: join(node.dir, 'root'),
    GPU_DEVICE_PLUGIN_STATE_FILE: node.stateFile,
  };
  return new Promise((resolve) => {
    execFile(
      executable(),
      ['info', '--pod-resources-socket', join(node.dir, 'no-pod-resources.sock'), ...args],
      { env, encoding: 'utf8', timeout: 30000 },
      (err, stdout, stderr) => {
        const status =
          err === null
            ? 0
            : typeof (err as { code?: unknown }).code === 'number'
              ? (err as { code: number }).code
              : null;
        resolve({ status, stdout, stderr });
      },
    );
  });
}

interface StateDoc {
  pid: number;
  devices: { uuid: string; health: string; reason?: string; since?: string }[];
  resources: { name: string; registered: boolean }[];
}

/** Resolves with the daemon's state file once it satisfies pred (watching its directory for the rename). */
function stateWhere(node: SimNode, pred: (s: StateDoc) => boolean, timeoutMs = 10000): Promise<StateDoc> {
  const read = (): StateDoc | undefined => {
    try {
      const s = JSON.parse(readFileSync(node.stateFile, 'utf8')) as StateDoc;
      return pred(s) ? s : undefined;
    } catch {
      return undefined;
    }
  };
  return waitFor(read, {
    on: onFileChange(node.dir),
    deadlineMs: timeoutMs,
    what: () => {
      try {
        return `state file ${node.stateFile} matching; it holds: ${readFileSync(node.stateFile, 'utf8')}`;
      } catch (e) {
        return `state file ${node.stateFile} matching; it holds: ${String(e)}`;
      }
    },
  });
}

test(
  "after XID 79 the kubelet sees GPU 2 Unhealthy, and so does info (the daemon's published " +
    'state, with the reason); with the daemon gone info falls back to NVML and says so',
  async () => {
    const node = await SimNode.start({ topology: 'demo-8' });
    try {
      const k = node.kubelet!;
      await k.waitForDevices((d) => d.length === 8);
      // Events sent before the health watcher is ready are lost, as with NVML.
      await node.plugin.waitForLine(/watching GPU health/, 10000);
      const u = node.topology.gpus.map((g) => g.uuid);
      node.nvml('xid 2 79');
      await k.waitForDevices((d) => d[2]?.health === 'Unhealthy', 'nvidia.com/gpu', 5000);
      const published = await stateWhere(node, (s) => s.devices.find((d) => d.uuid === u[2])?.health === 'Unhealthy');
      assert.equal(published.pid, node.plugin.pid);
      assert.equal(statSync(node.stateFile).mode & 0o777, 0o600, 'root-only');

      const r = await info(node);
      assert.equal(r.status, 0, r.stderr);
      assert.match(
        r.stdout,
        new RegExp(
          `^Daemon: pid ${node.plugin.pid}, version \\S+, running since \\S+; ` +
            `state of \\S+ \\(${node.stateFile}\\); driver 550\\.54\\.15\\.$`,
          'm',
        ),
      );
      assert.match(r.stdout, /^nvidia\.com\/gpu +yes +\S+ +8 +7$/m);
      assert.match(
        r.stdout,
        new RegExp(`^GPU 2 +${u[2]} +Unhealthy +\\S+ +critical XID 79 \\(GPU has fallen off the bus\\)`, 'm'),
      );
      // The GPU table's HEALTH is the daemon's too (NVML's probe of GPU 2 still answers).
      assert.match(r.stdout, new RegExp(`^2 +${u[2]} .* Unhealthy$`, 'm'));
      assert.match(r.stdout, new RegExp(`^3 +${u[3]} .* Healthy$`, 'm'));
      // The daemon was started with --kubelet-socket; info, run without
      // it, says the daemon's value differs from what it would be now.
      assert.match(
        r.stdout,
        new RegExp(
          `^Options in force that differ .*--kubelet-socket=${node.kubeletSocket} ` +
            `\\(now /var/lib/kubelet/device-plugins/kubelet\\.sock\\)`,
          'm',
        ),
      );
      assert.doesNotMatch(r.stdout, /--device-id-strategy=uuid \(now/);

      const j = JSON.parse((await info(node, ['--json'])).stdout) as {
        daemon: {
          running: boolean;
          pid: number;
          resources: { name: string; registered: boolean }[];
          options: Record<string, string>;
        };
        gpus: { uuid: string; health: string; healthFrom: string }[];
      };
      assert.equal(j.daemon.running, true);
      assert.equal(j.daemon.pid, node.plugin.pid);
      assert.deepEqual(
        j.daemon.resources.map((x) => [x.name, x.registered]),
        [['nvidia.com/gpu', true]],
      );
      assert.equal(j.daemon.options['kubelet-socket'], node.kubeletSocket);
      assert.deepEqual(j.gpus.map((g) => g.health[0]).join(''), 'HHUHHHHH');
      assert.ok(j.gpus.every((g) => g.healthFrom === 'daemon'));

      // Killed: the file stays behind, but its pid is gone; info does not believe it.
      await node.plugin.kill();
      const stale = await info(node);
      assert.equal(stale.status, 0, stale.stderr);
      assert.match(
        stale.stdout,
        new RegExp(
          `^Daemon: not running \\(its state file ${node.stateFile} is stale \\(process ${published.pid} ` +
            `is not running\\)\\)\\. HEALTH below is whether NVML answered a probe just now`,
          'm',
        ),
      );
      assert.match(stale.stdout, new RegExp(`^2 +${u[2]} .* Healthy$`, 'm'));
      const sj = JSON.parse((await info(node, ['--json'])).stdout) as {
        daemon: { running: boolean; note: string };
        gpus: { healthFrom: string }[];
      };
      assert.equal(sj.daemon.running, false);
      assert.match(sj.daemon.note, /stale/);
      assert.ok(sj.gpus.every((g) => g.healthFrom === 'nvml probe'));
    } finally {
      await node.stop();
    }
  },
);

test(
  'info --json is valid JSON with an error field when NVML cannot ' +
    'be read, and the state file is removed when the daemon stops',
  async () => {
    const node = await SimNode.start({ topology: 'demo-8' });
    try {
      await stateWhere(node, (s) => s.resources.some((r) => r.registered));
      node.plugin.signal('SIGTERM');
      await node.plugin.exited;
      assert.throws(() => statSync(node.stateFile), /ENOENT/, 'a clean stop removes the state file');
      const r = await new Promise<Run>((resolve) => {
        execFile(
          executable(),
          ['info', '--json'],
          {
            env: {
              PATH: '/nonexistent',
              SYSTEMD_UNIT_ROOT: join(node.dir, 'root'),
              GPU_DEVICE_PLUGIN_STATE_FILE: node.stateFile,
              LD_LIBRARY_PATH: join(node.dir, 'none'),
            },
            encoding: 'utf8',
            timeout: 30000,
          },
          (err, stdout, stderr) => {
            resolve({ status: err === null ? 0 : (err as { code: number }).code, stdout, stderr });
          },
        );
      });
      assert.equal(r.status, 1);
      const j = JSON.parse(r.stdout) as { error: string; daemon: { running: boolean; note: string } };
      assert.match(j.error, /^NVML: cannot load NVML/);
      assert.equal(j.daemon.running, false);
      assert.match(j.daemon.note, /no state file/);
    } finally {
      await node.stop();
    }
  },
);

test(
  'info reads the environment files the unit reads (and ' + '--env-file), as the service would see its options',
  async () => {
    const libs = await buildFakeNvml();
    const dir = mkdtempSync(join(tmpdir(), 'gdp-info-env-'));
    try {
      writeSysfs(join(dir, 'sys'), loadTopology('demo-8'));
      mkdirSync(join(dir, 'root', 'etc', 'default'), { recursive: true });
      writeFileSync(
        join(dir, 'root', 'etc', 'default', 'gpu-device-plugin'),
        '# as the package ships it, edited\nPOD_RESOURCES_SOCKET="/nonexistent/from-default-file.sock"\n',
      );
      const env = {
        PATH: '/nonexistent',
        TMPDIR: dir,
        SYSFS_ROOT: join(dir, 'sys'),
        LD_LIBRARY_PATH: libs.current,
        FAKE_NVML_CONFIG: join(TOPOLOGIES, 'demo-8.json'),
        SYSTEMD_UNIT_ROOT: join(dir, 'root'),
        GPU_DEVICE_PLUGIN_STATE_FILE: join(dir, 'state.json'),
      };
      const go = (args: string[]): Promise<Run> =>
        new Promise((resolve) => {
          execFile(executable(), ['info', ...args], { env, encoding: 'utf8', timeout: 30000 }, (err, stdout, stderr) =>
            resolve({ status: err === null ? 0 : (err as { code: number }).code, stdout, stderr }),
          );
        });
      const r = await go([]);
      assert.equal(r.status, 0, r.stderr);
      assert.match(r.stdout, /^Pods: not shown; .*\/nonexistent\/from-default-file\.sock does not exist/m);
      assert.match(r.stdout, new RegExp(`^Daemon: not running \\(no state file at ${join(dir, 'state.json')}\\)`, 'm'));
      const other = join(dir, 'other.env');
      writeFileSync(other, 'POD_RESOURCES_SOCKET=/nonexistent/from-env-file.sock\n');
      const r2 = await go(['--env-file', other]);
      assert.match(r2.stdout, /^Pods: not shown; .*\/nonexistent\/from-env-file\.sock does not exist/m);
    } finally {
      rmSync(dir, { recursive: true, force: true });
    }
  },
);
