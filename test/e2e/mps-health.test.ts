// MPS health end to end, through the built executable with the fake NVML, the kubelet stand-in and
// the fake nvidia-cuda-mps-control (started here with -d in the pipe directory core/mps.ts names, as
// the control daemon unit would): a plugin started before its daemon registers its replicas
// Unhealthy and waits; the daemon starting makes them Healthy; the daemon killed (SIGKILL, or quit)
// or hung (SIGSTOP) makes them Unhealthy within a few seconds, and back Healthy; SIGHUP with another
// replica count serves the new list. Each wait is on the list the kubelet receives; times are printed.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { execFile, spawnSync } from 'node:child_process';
import { chmodSync, mkdirSync, mkdtempSync, readdirSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { dirname, join } from 'node:path';
import { buildFakeMpsControl, buildFakeNvml, MPS_CONTROL_NAME } from '../fake-nvml/build.ts';
import { NotifySocket } from '../support/notify-socket.ts';
import { onFileChange, waitUntil } from '../support/wait.ts';
import { SimNode, TOPOLOGIES, executable, loadTopology, writeSysfs } from '../support/sim.ts';
import { mpsPaths } from '../../src/core/mps.ts';
import { mpsCommand, mpsEnvironment } from '../../src/mps/control-client.ts';

/** The plugin's metrics file once its mps_daemon_up sample has this value (the file is written after each snapshot). */
async function daemonUp(prom: string, value: 0 | 1, timeoutMs = 10000): Promise<void> {
  const want = `gpu_device_plugin_mps_daemon_up{resource="nvidia.com/gpu"} ${value}`;
  const text = (): string => {
    try {
      return readFileSync(prom, 'utf8');
    } catch {
      return '';
    }
  };
  await waitUntil(() => text().split('\n').includes(want), {
    on: onFileChange(dirname(prom)),
    deadlineMs: timeoutMs,
    what: () => `"${want}" in the metrics file:\n${text()}`,
  });
}

/** `gpu-device-plugin info` against a running simulated node (it shows the daemon's published state). */
async function info(node: SimNode): Promise<string> {
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
  return new Promise((resolve, reject) => {
    execFile(
      executable(),
      ['info', '--pod-resources-socket', join(node.dir, 'no-pod-resources.sock')],
      { env, encoding: 'utf8', timeout: 30000 },
      (err, stdout, stderr) => {
        if (err !== null) reject(new Error(`info failed: ${err.message}\n${stdout}${stderr}`));
        else resolve(stdout);
      },
    );
  });
}

/** How many nvidia-cuda-mps-control clients the plugin runs right now (its child processes). */
function controlClients(pid: number): number {
  let n = 0;
  for (const task of readdirSync(`/proc/${pid}/task`)) {
    for (const child of readFileSync(`/proc/${pid}/task/${task}/children`, 'utf8')
      .split(' ')
      .filter((x) => x !== '')) {
      try {
        if (readFileSync(`/proc/${child}/comm`, 'utf8').trim().startsWith('nvidia-cuda-mps')) n++;
      } catch {
        // exited meanwhile
      }
    }
  }
  return n;
}

const config = (replicas: number): string =>
  `version: v1\nsharing:\n  mps:\n    resources:\n    - name: nvidia.com/gpu\n      replicas: ${replicas}\n`;
const all =
  (health: 'Healthy' | 'Unhealthy', n: number) =>
  (d: readonly { health: string }[]): boolean =>
    d.length === n && d.every((x) => x.health === health);

test(
  'MPS replicas: Unhealthy until the daemon answers, Unhealthy within ' +
    'seconds of it dying, Healthy when back; SIGHUP serves a new replica count',
  async (t) => {
    const bin = await buildFakeMpsControl();
    const program = join(bin, MPS_CONTROL_NAME);
    const base = mkdtempSync(join(tmpdir(), 'gdp-mps-'));
    chmodSync(base, 0o755);
    const root = join(base, 'mps');
    mkdirSync(root, { mode: 0o755 });
    const cfg = join(base, 'config.yaml');
    writeFileSync(cfg, config(2));
    const dirs = mpsPaths(root, 'nvidia.com/gpu');
    const startDaemon = (): void => {
      const r = spawnSync(program, ['-d'], { env: mpsEnvironment(dirs) });
      assert.equal(r.status, 0, `fake control daemon did not start: ${String(r.stderr)}`);
    };
    const prom = join(base, 'gpu-device-plugin.prom');
    const sock = new NotifySocket(`@gdp-notify-mps-${process.pid}-${Date.now()}`);
    const node = await SimNode.start({
      topology: 'bridged-pair-4',
      args: ['--config-file', cfg, '--mps-root', root, '--metrics-file', prom, '--metrics-interval', '1'],
      env: { PATH: bin, NOTIFY_SOCKET: sock.path },
    });
    try {
      const k = node.kubelet!;
      const gpus = node.topology.gpus.length;
      // Started first: registered, every replica Unhealthy, and the plugin waits (it does not exit).
      const first = await k.waitForDevices((d) => d.length === gpus * 2);
      assert.ok(
        first.every((d) => d.health === 'Unhealthy'),
        JSON.stringify(first.map((d) => d.health)),
      );
      const warn = await node.plugin.waitForLine(/WARN MPS control daemon does not answer/);
      assert.match(warn, /resource=nvidia\.com\/gpu/);
      assert.match(warn, /Cannot find MPS control daemon process/);
      await daemonUp(prom, 0);
      // systemd hears why: STATUS names the daemon and the client's reason.
      await sock.waitFor(
        new RegExp(
          '^STATUS=registered; 4 of 4 GPUs healthy; MPS daemon for ' +
            String.raw`nvidia\.com\/gpu not answering: .*Cannot find MPS control daemon process$`,
          'm',
        ),
        10000,
      );

      // The same process serves the replicas once the daemon answers: it waited, it did not exit.
      let at = performance.now();
      startDaemon();
      await k.waitForDevices(all('Healthy', gpus * 2));
      const upMs = performance.now() - at;
      await node.plugin.waitForLine(/INFO MPS control daemon answers/);
      await daemonUp(prom, 1);
      await sock.waitFor(/^STATUS=registered; 4 of 4 GPUs healthy$/m, 10000);

      // SIGKILL the daemon: the pid it wrote in the pipe directory.
      const pid = Number(readFileSync(join(dirs.pipeDir, 'nvidia-cuda-mps-control.pid'), 'utf8').trim());
      assert.ok(pid > 1, `pid file holds ${pid}`);
      const from = node.plugin.lines.length;
      at = performance.now();
      process.kill(pid, 'SIGKILL');
      await k.waitForDevices(all('Unhealthy', gpus * 2));
      const killedMs = performance.now() - at;
      await daemonUp(prom, 0);
      const gone = await node.plugin.waitForLine(/WARN MPS control daemon does not answer/, 10000, from);
      assert.match(gone, /reason=/);

      at = performance.now();
      startDaemon();
      await k.waitForDevices(all('Healthy', gpus * 2));
      const backMs = performance.now() - at;

      // quit: the same.
      at = performance.now();
      await mpsCommand(program, dirs, 'quit');
      await k.waitForDevices(all('Unhealthy', gpus * 2));
      const quitMs = performance.now() - at;
      const beforeLast = node.plugin.lines.length;
      startDaemon();
      await k.waitForDevices(all('Healthy', gpus * 2));
      await node.plugin.waitForLine(/INFO MPS control daemon answers/, 10000, beforeLast);

      // A hung daemon (SIGSTOP: its socket still accepts, nothing answers): the 2 s timeout, one client at a time.
      const hungPid = Number(readFileSync(join(dirs.pipeDir, 'nvidia-cuda-mps-control.pid'), 'utf8').trim());
      const beforeHang = node.plugin.lines.length;
      at = performance.now();
      process.kill(hungPid, 'SIGSTOP');
      let hungMs = 0;
      try {
        await k.waitForDevices(all('Unhealthy', gpus * 2));
        hungMs = performance.now() - at;
        const hung = await node.plugin.waitForLine(/WARN MPS control daemon does not answer/, 10000, beforeHang);
        assert.match(hung, /no answer within 2000 ms/);
        const clients = controlClients(node.plugin.child.pid!);
        assert.ok(clients <= 1, `${clients} control clients at once: questions pile up`);
      } finally {
        process.kill(hungPid, 'SIGCONT');
      }
      at = performance.now();
      await k.waitForDevices(all('Healthy', gpus * 2));
      const resumedMs = performance.now() - at;

      // One log line per transition: four times gone (at start, SIGKILL, quit, hung), four times back.
      await node.plugin.waitForLine(/INFO MPS control daemon answers/, 10000, beforeHang);
      assert.equal(node.plugin.matching(/INFO MPS control daemon answers/).length, 4);
      assert.equal(
        node.plugin.matching(/WARN MPS control daemon does not answer/).length,
        4,
        node.plugin.matching(/MPS control daemon/).join('\n'),
      );

      // SIGHUP with 3 replicas: the new list, healthy (the daemon answers).
      writeFileSync(cfg, config(3));
      node.plugin.signal('SIGHUP');
      const three = await k.waitForDevices((d) => d.length === gpus * 3);
      assert.ok(
        three.every((d) => d.health === 'Healthy'),
        JSON.stringify(three.map((d) => d.health)),
      );

      // info: the daemon's state and the limits for 3 replicas (RTX A6000, 49140 MiB: 16380 MiB each).
      const shown = await info(node);
      assert.match(
        shown,
        new RegExp(
          String.raw`^nvidia\.com\/gpu +answering +\d{4}-\d\d-\d\dT[\d:.]+Z +3 +33% +GPU ` +
            '0: 16380 MiB, GPU 1: 16380 MiB, GPU 2: 16380 MiB, GPU 3: 16380 MiB$',
          'm',
        ),
        shown,
      );

      t.diagnostic(
        `MPS health watch: daemon started → Healthy ${upMs.toFixed(0)} ms; SIGKILL ` +
          `→ Unhealthy ${killedMs.toFixed(0)} ms; restarted → Healthy ${backMs.toFixed(0)} ` +
          `ms; quit → Unhealthy ${quitMs.toFixed(0)} ms; hung (SIGSTOP) → ` +
          `Unhealthy ${hungMs.toFixed(0)} ms; resumed → Healthy ${resumedMs.toFixed(0)} ms`,
      );
      assert.ok(killedMs < 10000 && quitMs < 10000 && hungMs < 10000, 'Unhealthy within a few seconds');
    } finally {
      await mpsCommand(program, dirs, 'quit').catch(() => undefined);
      await node.stop();
      sock.close();
      rmSync(base, { recursive: true, force: true });
    }
  },
);

/** `gpu-device-plugin check` as the operator runs it, on a topology file, with the fake control program on PATH. */
async function check(
  dir: string,
  topology: string,
  args: readonly string[],
  path: string,
): Promise<{ status: number | null; stdout: string }> {
  const libs = await buildFakeNvml();
  const sys = join(dir, 'sys');
  writeSysfs(sys, loadTopology(topology));
  const env: Record<string, string> = {
    PATH: path,
    TMPDIR: dir,
    SYSFS_ROOT: sys,
    LD_LIBRARY_PATH: libs.current,
    FAKE_NVML_CONFIG: topology,
    SYSTEMD_UNIT_ROOT: join(dir, 'root'),
    CDI_SPEC_DIRS: join(dir, 'cdi'),
    GPU_DEVICE_PLUGIN_STATE_FILE: join(dir, 'state.json'),
  };
  return new Promise((resolve) => {
    execFile(executable(), ['check', ...args], { env, encoding: 'utf8', timeout: 30000 }, (err, stdout) => {
      resolve({
        status:
          err === null
            ? 0
            : typeof (err as { code?: unknown }).code === 'number'
              ? (err as { code: number }).code
              : null,
        stdout,
      });
    });
  });
}
const checkLine = (out: string, name: string): string =>
  out.split('\n').find((l) => new RegExp(`^(PASS|WARN|FAIL|SKIP)  ${name} `).test(l)) ??
  `(no "${name}" line in:\n${out})`;

test(
  "check: the MPS root 0755 all the way, the control program, each daemon's " +
    'answer and each MPS GPU in EXCLUSIVE_PROCESS, each failure with its fix',
  async () => {
    const bin = await buildFakeMpsControl();
    const program = join(bin, MPS_CONTROL_NAME);
    const base = mkdtempSync(join(tmpdir(), 'gdp-mps-check-'));
    chmodSync(base, 0o755);
    const root = join(base, 'mps');
    mkdirSync(root, { mode: 0o755 });
    const cfg = join(base, 'config.yaml');
    writeFileSync(cfg, config(2));
    // GPUs 0–2 in EXCLUSIVE_PROCESS as the control daemon unit leaves them; GPU 3 left in DEFAULT.
    const topo = JSON.parse(readFileSync(join(TOPOLOGIES, 'bridged-pair-4.json'), 'utf8')) as {
      gpus: Record<string, unknown>[];
    };
    topo.gpus.forEach((g, i) => {
      g.computeMode = i < 3 ? 3 : 0;
    });
    const topology = join(base, 'topology.json');
    writeFileSync(topology, JSON.stringify(topo));
    const dirs = mpsPaths(root, 'nvidia.com/gpu');
    try {
      const r0 = await check(base, topology, ['--config-file', cfg, '--mps-root', root], bin);
      assert.match(
        checkLine(r0.stdout, 'mps root'),
        /^FAIL .*nvidia\.com does not exist — fix: start gpu-device-plugin-mps/,
      );
      assert.match(checkLine(r0.stdout, 'mps control'), new RegExp(`^PASS  mps control +found ${program}$`));
      assert.match(
        checkLine(r0.stdout, 'mps daemons'),
        new RegExp(
          String.raw`^FAIL .*not answering: nvidia\.com\/gpu .*Cannot find MPS control ` +
            'daemon process; their replicas are advertised Unhealthy — fix: ' +
            'start the control daemons: systemctl start gpu-device-plugin-mps',
        ),
      );
      assert.match(
        checkLine(r0.stdout, 'compute mode'),
        new RegExp(
          String.raw`^FAIL {2}compute mode +GPU 3 \(nvidia\.com\/gpu\) is DEFAULT; ` +
            'MPS needs EXCLUSIVE_PROCESS — fix: restart gpu-device-plugin-mps',
        ),
      );
      assert.equal(r0.status, 1, 'the node is at fault, not the configuration');
      const started = spawnSync(program, ['-d'], { env: mpsEnvironment(dirs) });
      assert.equal(started.status, 0, String(started.stderr));
      chmodSync(join(root, 'nvidia.com'), 0o750);
      const r1 = await check(base, topology, ['--config-file', cfg, '--mps-root', root], bin);
      assert.match(
        checkLine(r1.stdout, 'mps root'),
        new RegExp(
          `^FAIL .*${join(root, 'nvidia.com')} has mode 0750: a pod that does not run as ` +
            `root cannot reach the pipe through it — fix: chmod 755 ${join(root, 'nvidia.com')}$`,
        ),
      );
      assert.match(
        checkLine(r1.stdout, 'mps daemons'),
        /^PASS {2}mps daemons +the control daemon of nvidia\.com\/gpu answers get_default_active_thread_percentage$/,
      );
      chmodSync(join(root, 'nvidia.com'), 0o755);
      const r2 = await check(base, topology, ['--config-file', cfg, '--mps-root', root], bin);
      assert.match(
        checkLine(r2.stdout, 'mps root'),
        /^PASS {2}mps root +.* reachable by every user \(0755 all the way\)$/,
      );
      // Without the program: it says where it looked.
      const r3 = await check(base, topology, ['--config-file', cfg, '--mps-root', root], '/nonexistent');
      assert.match(
        checkLine(r3.stdout, 'mps control'),
        new RegExp(
          String.raw`^FAIL {2}mps control +nvidia-cuda-mps-control not found \(looked at ` +
            String.raw`.*\/nonexistent\/nvidia-cuda-mps-control\) — fix: install the NVIDIA driver's utilities`,
        ),
      );
    } finally {
      await mpsCommand(program, dirs, 'quit').catch(() => undefined);
      rmSync(base, { recursive: true, force: true });
    }
  },
);
