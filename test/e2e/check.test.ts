// `check` is the daemon's own validation: run from the built executable against the fake
// NVML, with the unit's environment files and sandbox, the CDI specs and the socket directory it reads.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { execFile } from 'node:child_process';
import { chmodSync, mkdirSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { createServer } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { buildFakeNvml } from '../fake-nvml/build.ts';
import { loadYaml } from '../../src/config/config.ts';
import { ApiServerStandIn } from '../support/apiserver.ts';
import type { JsonObject } from '../support/apiserver.ts';
import { tokenKubeconfig } from '../support/dra-fixtures.ts';
import { SimNode, TOPOLOGIES, executable, loadTopology, writeSysfs } from '../support/sim.ts';

interface Run {
  status: number | null;
  stdout: string;
  stderr: string;
}

/** Runs the executable against demo-8; `unitRoot` stands for / when the unit and /etc/default are looked for. */
async function run(args: string[], dir: string, extraEnv: Record<string, string> = {}): Promise<Run> {
  const libs = await buildFakeNvml();
  const sys = join(dir, 'sys');
  writeSysfs(sys, loadTopology('demo-8'));
  const env: Record<string, string> = {
    PATH: '/nonexistent',
    TMPDIR: dir,
    SYSFS_ROOT: sys,
    LD_LIBRARY_PATH: libs.current,
    FAKE_NVML_CONFIG: join(TOPOLOGIES, 'demo-8.json'),
    SYSTEMD_UNIT_ROOT: join(dir, 'root'),
    CDI_SPEC_DIRS: join(dir, 'cdi'),
    GPU_DEVICE_PLUGIN_STATE_FILE: join(dir, 'state.json'),
    ...extraEnv,
  };
  return new Promise((resolve) => {
    execFile(executable(), args, { env, encoding: 'utf8', timeout: 30000 }, (err, stdout, stderr) => {
      const status =
        err === null ? 0 : typeof (err as { code?: unknown }).code === 'number' ? (err as { code: number }).code : null;
      resolve({ status, stdout, stderr });
    });
  });
}

function line(out: string, name: string): string {
  return (
    out
      .split('\n')
      .find((l) =>
        new RegExp(`^(PASS|WARN|FAIL|SKIP|INFO)  ${name.replace(/[.*+?^${}()|[\]\\/]/g, '\\$&')} `).test(l),
      ) ?? `(no "${name}" line in:\n${out})`
  );
}

const UUIDS = loadTopology('demo-8').gpus.map((g) => g.uuid);

test(
  'check fails a time-slicing list naming a GPU the node lacks ' +
    'with exit 2 and the key, as the daemon refuses the same file',
  async () => {
    const dir = mkdtempSync(join(tmpdir(), 'gdp-check-fit-'));
    try {
      const misfit = join(dir, 'misfit.yaml');
      writeFileSync(misfit, 'sharing:\n  timeSlicing:\n    resources: [{name: gpu, replicas: 2, devices: [0, 9]}]\n');
      const r = await run(['check', '--config-file', misfit], dir);
      assert.equal(r.status, 2, r.stdout + r.stderr);
      assert.match(
        line(r.stdout, 'config fit'),
        new RegExp(
          '^FAIL {2}config fit +the daemon refuses to start: ' +
            String.raw`sharing\.timeSlicing\.resources\[0\]\.devices\[1\]: GPU 9 is not on this ` +
            String.raw`node .* — fix: change sharing\.timeSlicing\.resources\[0\]\.devices\[1\] in `,
        ),
      );
      assert.doesNotMatch(r.stdout, /All checks passed/);
      // The daemon, given the same file, refuses to start with the same words.
      const node = await SimNode.start({ topology: 'demo-8', waitRegistered: false, args: ['--config-file', misfit] });
      try {
        assert.notEqual((await node.plugin.exited).code, 0);
        assert.match(
          node.plugin.matching(/cannot start/)[0] ?? '',
          /sharing\.timeSlicing\.resources\[0\]\.devices\[1\]: GPU 9 is not on this node/,
        );
      } finally {
        await node.stop();
      }
    } finally {
      rmSync(dir, { recursive: true, force: true });
    }
  },
);

test(
  'check fails two time-slicing entries sharing one GPU (exit 2, naming the ' +
    'second entry); a fitting file passes the fit and the daemon starts with it',
  async () => {
    const dir = mkdtempSync(join(tmpdir(), 'gdp-check-overlap-'));
    try {
      const overlap = join(dir, 'overlap.yaml');
      writeFileSync(
        overlap,
        'sharing:\n  timeSlicing:\n    resources:\n      - {name: gpu, replicas: 2, devices: ' +
          '[0, 1]}\n      - {name: gpu, rename: gpu.big, replicas: 4, devices: [1, 2]}\n',
      );
      const r = await run(['check', '--config-file', overlap], dir);
      assert.equal(r.status, 2, r.stdout);
      assert.match(
        line(r.stdout, 'config fit'),
        new RegExp(
          '^FAIL {2}config fit +the daemon refuses to start: ' +
            String.raw`sharing\.timeSlicing\.resources\[1\]\.devices: GPU 1 is ` +
            String.raw`already shared by sharing\.timeSlicing\.resources\[0\]`,
        ),
      );

      const fits = join(dir, 'fits.yaml');
      writeFileSync(
        fits,
        'sharing:\n  timeSlicing:\n    resources:\n      - {name: gpu, replicas: 2, ' +
          'devices: [0, 1]}\n      - {name: gpu, rename: gpu.big, replicas: 4, devices: [2]}\n',
      );
      const ok = await run(['check', '--config-file', fits], dir);
      assert.match(
        line(ok.stdout, 'config fit'),
        new RegExp(
          String.raw`^PASS {2}config fit +the daemon would advertise nvidia\.com\/gpu=9 ` +
            String.raw`\(replicas of 7 GPUs\), nvidia\.com\/gpu\.big=4 \(replicas of 1 GPUs\)$`,
        ),
      );
      const node = await SimNode.start({ topology: 'demo-8', args: ['--config-file', fits] });
      try {
        await node.kubelet!.waitForRegistrations(2);
        assert.deepEqual(node.kubelet!.registrations.map((x) => x.request.resource_name).sort(), [
          'nvidia.com/gpu',
          'nvidia.com/gpu.big',
        ]);
      } finally {
        await node.stop();
      }
    } finally {
      rmSync(dir, { recursive: true, force: true });
    }
  },
);

test("check reads the unit's environment files as systemd does and names the file each option came from", async () => {
  const dir = mkdtempSync(join(tmpdir(), 'gdp-check-env-'));
  try {
    mkdirSync(join(dir, 'root', 'etc', 'default'), { recursive: true });
    const deb = join(dir, 'root', 'etc', 'default', 'gpu-device-plugin');
    writeFileSync(
      deb,
      '# options\nDEVICE_ID_STRATEGY="index"\n  LOG_LEVEL = debug ' +
        " \nexport MIG_STRATEGY=mixed\nHEALTH_PROBE_INTERVAL='7'\n",
    );
    const r = await run(['check'], dir);
    assert.match(
      line(r.stdout, 'environment files'),
      new RegExp(`^WARN  environment files +${deb}:4: systemd does not take "export"`),
    );
    assert.match(r.stdout, new RegExp(`--device-id-strategy=index {2}\\(environment file ${deb}\\)`));
    assert.match(r.stdout, new RegExp(`--log-level=debug {2}\\(environment file ${deb}\\)`));
    assert.match(r.stdout, new RegExp(`--health-probe-interval=7 {2}\\(environment file ${deb}\\)`));
    assert.match(r.stdout, /--mig-strategy=none {2}\(default\)/, 'an export line is ignored, as systemd ignores it');

    // --env-file names the files instead (repeatable; a later one wins), and a missing one fails as a
    // configuration error.
    const a = join(dir, 'a.env');
    const b = join(dir, 'b.env');
    writeFileSync(a, 'DEVICE_ID_STRATEGY=uuid\nPASS_DEVICE_SPECS=true\n');
    writeFileSync(b, 'DEVICE_ID_STRATEGY=index\n');
    const r2 = await run(['check', '--env-file', a, `--env-file=${b}`], dir);
    assert.match(r2.stdout, new RegExp(`--device-id-strategy=index {2}\\(environment file ${b}\\)`));
    assert.match(r2.stdout, new RegExp(`--pass-device-specs=true {2}\\(environment file ${a}\\)`));
    assert.match(line(r2.stdout, 'environment files'), new RegExp(`^PASS  environment files +read ${a}, ${b}$`));
    // Node itself stops a single executable given --env-file with a missing file (exit 9) before the program
    // runs, so a file that may be missing is named with --environment-file, the same option under a name Node leaves
    // alone.
    const r3 = await run(['check', '--environment-file', join(dir, 'missing.env')], dir);
    assert.equal(r3.status, 2);
    assert.match(line(r3.stdout, 'environment files'), /^FAIL {2}environment files +\S+missing\.env does not exist/);
    // The shell's own setting wins for this run, and check says the service does not see it.
    const r4 = await run(['check'], dir, { DEVICE_ID_STRATEGY: 'uuid' });
    assert.match(r4.stdout, /--device-id-strategy=uuid {2}\(environment of this shell; the service does not see it\)/);
    assert.match(
      line(r4.stdout, 'shell environment'),
      /^WARN {2}shell environment +DEVICE_ID_STRATEGY set in this shell/,
    );
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
});

test(
  "check judges writability by the unit's sandbox: a directory root " +
    'may write is read-only for the service until a drop-in adds it',
  async () => {
    const dir = mkdtempSync(join(tmpdir(), 'gdp-check-sandbox-'));
    try {
      const unitDir = join(dir, 'root', 'usr', 'lib', 'systemd', 'system');
      mkdirSync(unitDir, { recursive: true });
      writeFileSync(
        join(unitDir, 'gpu-device-plugin.service'),
        '[Service]\nExecStart=/usr/bin/gpu-device-plugin\nProtectSystem=strict\n' +
          'ReadWritePaths=-/var/lib/kubelet/device-plugins\nRuntimeDirectory=gpu-device-plugin\n',
      );
      const metricsDir = join(dir, 'metrics');
      mkdirSync(metricsDir);
      const args = ['check', '--metrics-file', join(metricsDir, 'gpu.prom')];
      const r = await run(args, dir);
      assert.equal(r.status, 1, r.stdout);
      assert.match(
        line(r.stdout, 'metrics file'),
        new RegExp(
          `^FAIL  metrics file +${metricsDir}: read-only for the service: ` +
            `ProtectSystem=strict .*\\(unit: ${unitDir}/gpu-device-plugin\\.service\\) — ` +
            `fix: add ReadWritePaths=${metricsDir} with \`systemctl edit gpu-device-plugin\``,
        ),
      );
      const dropins = join(dir, 'root', 'etc', 'systemd', 'system', 'gpu-device-plugin.service.d');
      mkdirSync(dropins, { recursive: true });
      writeFileSync(join(dropins, 'metrics.conf'), `[Service]\nReadWritePaths=${metricsDir}\n`);
      const r2 = await run(args, dir);
      assert.match(
        line(r2.stdout, 'metrics file'),
        new RegExp(
          `^PASS  metrics file +${metricsDir} is writable for the service \\(ReadWritePaths=${metricsDir}\\)$`,
        ),
      );
      // The state file for info is where the unit's RuntimeDirectory= puts $RUNTIME_DIRECTORY.
      const renamed = join(dir, 'renamed');
      mkdirSync(join(renamed, 'etc', 'systemd', 'system'), { recursive: true });
      writeFileSync(
        join(renamed, 'etc', 'systemd', 'system', 'gpu-device-plugin.service'),
        '[Service]\nProtectSystem=strict\nRuntimeDirectory=gdp-renamed-for-test\n',
      );
      const r4 = await run(['check'], dir, { SYSTEMD_UNIT_ROOT: renamed, GPU_DEVICE_PLUGIN_STATE_FILE: '' });
      assert.match(
        line(r4.stdout, 'state file'),
        /^SKIP {2}state file +\/run\/gdp-renamed-for-test is created by systemd when the service starts/,
      );
      // Without an installed unit, the unit we ship decides: its /tmp is private, so a file there reaches no reader.
      const r3 = await run(['check', '--metrics-file', join(metricsDir, 'gpu.prom')], dir, {
        SYSTEMD_UNIT_ROOT: join(dir, 'nothing-installed'),
      });
      assert.match(
        line(r3.stdout, 'metrics file'),
        new RegExp(
          '^FAIL {2}metrics file +.*PrivateTmp=yes gives the service ' +
            String.raw`its own empty \/tmp.*the unit shipped with this version`,
        ),
      );
    } finally {
      rmSync(dir, { recursive: true, force: true });
    }
  },
);

test(
  "check looks for a CDI spec naming the node's GPUs with a CDI strategy, the " +
    "device nodes with --pass-device-specs, and NVIDIA's plugin in the socket directory",
  async () => {
    const dir = mkdtempSync(join(tmpdir(), 'gdp-check-cdi-'));
    const sockDir = join(dir, 'device-plugins');
    mkdirSync(sockDir);
    const foreign = createServer(() => undefined);
    try {
      mkdirSync(join(dir, 'cdi'));
      const args = ['check', '--device-list-strategy', 'cdi-cri', '--kubelet-socket', join(sockDir, 'kubelet.sock')];
      let r = await run(args, dir);
      assert.match(
        line(r.stdout, 'cdi spec'),
        new RegExp(
          '^FAIL {2}cdi spec +--device-list-strategy=cdi-cri asks the runtime ' +
            String.raw`for k8s\.device-plugin\.nvidia\.com\/gpu=<id>, but no CDI spec ` +
            '.* — fix: generate one: `nvidia-ctk cdi generate --vendor ' +
            String.raw`k8s\.device-plugin\.nvidia\.com --class gpu --device-name-strategy uuid`,
        ),
      );
      // nvidia-ctk's default kind is not the one Allocate names.
      writeFileSync(
        join(dir, 'cdi', 'nvidia.yaml'),
        `cdiVersion: 0.5.0\nkind: nvidia.com/gpu\ndevices:\n${UUIDS.map((u) => `  - name: ${u}\n`).join('')}`,
      );
      r = await run(args, dir);
      assert.match(line(r.stdout, 'cdi spec'), /^FAIL {2}cdi spec .*found \S+nvidia\.yaml \(kind nvidia\.com\/gpu\)/);
      writeFileSync(
        join(dir, 'cdi', 'ours.json'),
        JSON.stringify({
          cdiVersion: '0.5.0',
          kind: 'k8s.device-plugin.nvidia.com/gpu',
          devices: UUIDS.slice(0, 7).map((name) => ({ name, containerEdits: {} })),
        }),
      );
      r = await run(args, dir);
      assert.match(
        line(r.stdout, 'cdi spec'),
        new RegExp(
          `^FAIL  cdi spec +\\S+ours\\.json \\(k8s\\.device-plugin\\.nvidia\\.com/gpu\\) ` +
            `does not name 1 of the 8 devices .*: ${UUIDS[7]};`,
        ),
      );
      writeFileSync(
        join(dir, 'cdi', 'ours.json'),
        JSON.stringify({
          cdiVersion: '0.5.0',
          kind: 'k8s.device-plugin.nvidia.com/gpu',
          devices: UUIDS.map((name) => ({ name, containerEdits: {} })),
        }),
      );
      r = await run(args, dir);
      assert.match(line(r.stdout, 'cdi spec'), /^PASS {2}cdi spec +\S+ours\.json names all 8 devices/);

      // IMEX channels go to the runtime as CDI devices of their own kind.
      const imexRoot = join(dir, 'imexroot');
      mkdirSync(join(imexRoot, 'dev', 'nvidia-caps-imex-channels'), { recursive: true });
      writeFileSync(join(imexRoot, 'dev', 'nvidia-caps-imex-channels', 'channel0'), '');
      r = await run([...args, '--imex-channel-ids=0', '--dev-root', imexRoot], dir);
      assert.match(
        line(r.stdout, 'cdi imex spec'),
        new RegExp(
          '^FAIL {2}cdi imex spec +containers are given ' +
            String.raw`k8s\.device-plugin\.nvidia\.com\/imex-channel=0, which no CDI spec names`,
        ),
      );
      writeFileSync(
        join(dir, 'cdi', 'imex.yaml'),
        'cdiVersion: 0.5.0\nkind: k8s.device-plugin.nvidia.com/imex-channel\ndevices:\n  - name: "0"\n',
      );
      r = await run([...args, '--imex-channel-ids=0', '--dev-root', imexRoot], dir);
      assert.match(line(r.stdout, 'cdi imex spec'), /^PASS {2}cdi imex spec /);

      const devRoot = join(dir, 'devroot');
      mkdirSync(join(devRoot, 'dev'), { recursive: true });
      for (const n of ['nvidiactl', ...[0, 1, 2, 3, 4, 5, 6].map((i) => `nvidia${i}`)])
        writeFileSync(join(devRoot, 'dev', n), '');
      r = await run(['check', '--pass-device-specs', '--dev-root', devRoot], dir);
      assert.match(
        line(r.stdout, 'device nodes'),
        new RegExp(
          `^FAIL  device nodes +--pass-device-specs passes 9 nodes ` +
            `under --dev-root=${devRoot}; missing: ${devRoot}/dev/nvidia7 —`,
        ),
      );

      await new Promise<void>((resolve) => foreign.listen(join(sockDir, 'nvidia-gpu.sock'), resolve));
      r = await run(args, dir);
      assert.match(
        line(r.stdout, 'other plugin'),
        new RegExp(
          String.raw`^FAIL {2}other plugin +\S+nvidia-gpu\.sock answers: NVIDIA's ` +
            String.raw`device plugin runs here and registers nvidia\.com\/gpu too`,
        ),
      );
    } finally {
      foreign.close();
      rmSync(dir, { recursive: true, force: true });
    }
  },
);

test(
  'check --json: every check with name, status and detail, ' + 'valid JSON also when the configuration is refused',
  async () => {
    const dir = mkdtempSync(join(tmpdir(), 'gdp-check-json-'));
    try {
      const r = await run(['check', '--json', '--device-id-strategy', 'serial'], dir);
      assert.equal(r.status, 2);
      const j = JSON.parse(r.stdout) as {
        checks: { name: string; status: string; detail: string }[];
        options: { flag: string; origin: string }[];
        exitCode: number;
      };
      assert.equal(j.exitCode, 2);
      assert.ok(
        j.checks.every(
          (c) => ['PASS', 'WARN', 'FAIL', 'SKIP', 'INFO'].includes(c.status) && c.name !== '' && c.detail !== '',
        ),
      );
      assert.deepEqual(j.checks.find((c) => c.name === 'config')?.status, 'FAIL');
      assert.match(
        j.checks.find((c) => c.name === 'config')?.detail ?? '',
        /--device-id-strategy: "serial" is not allowed/,
      );
      assert.equal(j.checks.find((c) => c.name === 'gpus')?.status, 'PASS');
      assert.equal(
        j.checks.find((c) => c.name === 'config fit')?.status,
        'SKIP',
        'a refused configuration is not planned with the defaults instead',
      );
      const bad = await run(['check', '--json', '--env-file'], dir);
      assert.equal(bad.status, 2);
      assert.match((JSON.parse(bad.stdout) as { error: string }).error, /--env-file needs a file name/);
    } finally {
      rmSync(dir, { recursive: true, force: true });
    }
  },
);

test(
  'check run as another user than root warns, and says SKIP ' +
    '(not PASS) for the writability only root could confirm',
  async () => {
    const dir = mkdtempSync(join(tmpdir(), 'gdp-check-nonroot-'));
    try {
      chmodSync(dir, 0o777);
      const unitDir = join(dir, 'root', 'etc', 'systemd', 'system');
      mkdirSync(unitDir, { recursive: true });
      writeFileSync(
        join(unitDir, 'gpu-device-plugin.service'),
        `[Service]\nProtectSystem=strict\nReadWritePaths=${dir}/metrics\n`,
      );
      mkdirSync(join(dir, 'metrics'));
      mkdirSync(join(dir, 'labels'));
      const env = {
        PATH: '/nonexistent',
        TMPDIR: dir,
        SYSTEMD_UNIT_ROOT: join(dir, 'root'),
        GPU_DEVICE_PLUGIN_STATE_FILE: join(dir, 'state.json'),
      };
      const r = await new Promise<Run>((resolve) => {
        execFile(
          '/usr/bin/setpriv',
          [
            '--reuid=65534',
            '--regid=65534',
            '--clear-groups',
            executable(),
            'check',
            '--metrics-file',
            join(dir, 'metrics', 'gpu.prom'),
            '--nfd-features-file',
            join(dir, 'labels', 'gpu'),
          ],
          { env, encoding: 'utf8', timeout: 30000 },
          (err, stdout, stderr) => {
            resolve({ status: err === null ? 0 : (err as { code: number }).code, stdout, stderr });
          },
        );
      });
      assert.match(
        line(r.stdout, 'privileges'),
        /^WARN {2}privileges +running as uid 65534, not root as the service does/,
      );
      assert.match(
        line(r.stdout, 'metrics file'),
        new RegExp(
          `^SKIP  metrics file +${dir}/metrics exists and the unit's sandbox allows writing \\(ReadWritePaths=` +
            `${dir}/metrics\\); whether root may write there was not checked: not running as root$`,
        ),
      );
      // What the sandbox forbids needs no root to know.
      assert.match(
        line(r.stdout, 'labels file'),
        new RegExp(`^FAIL  labels file +${dir}/labels: read-only for the service: ProtectSystem=strict`),
      );
    } finally {
      rmSync(dir, { recursive: true, force: true });
    }
  },
);

test(
  "check --kubelet-api=dra through the executable: the sandbox's network until the drop-in " +
    "is linked, the API server over TCP, the toolkit's CDI spec against the GPUs NVML sees, the DeviceClasses",
  async () => {
    const dir = mkdtempSync(join(tmpdir(), 'gdp-check-dra-'));
    const api = createServer((s) => s.destroy());
    try {
      await new Promise<void>((resolve) => api.listen(0, '127.0.0.1', resolve));
      const port = (api.address() as { port: number }).port;
      const repo = join(import.meta.dirname, '..', '..');
      const unitDir = join(dir, 'root', 'etc', 'systemd', 'system');
      mkdirSync(join(unitDir, 'gpu-device-plugin.service.d'), { recursive: true });
      writeFileSync(
        join(unitDir, 'gpu-device-plugin.service'),
        readFileSync(join(repo, 'systemd', 'gpu-device-plugin.service'), 'utf8'),
      );
      // This test's files are in /tmp, which the unit makes private: a drop-in of the test's own shows them.
      writeFileSync(
        join(unitDir, 'gpu-device-plugin.service.d', 'zz-test.conf'),
        `[Service]\nPrivateTmp=no\nReadWritePaths=${dir}/registry ${dir}/plugins/gpu.nvidia.com\n`,
      );
      for (const d of ['registry', 'plugins/gpu.nvidia.com', 'cdi']) mkdirSync(join(dir, d), { recursive: true });
      const kc = join(dir, 'kubeconfig');
      writeFileSync(
        kc,
        `apiVersion: v1\nkind: Config\ncurrent-context: n\ncontexts: [{name: n, context: ` +
          `{cluster: c, user: u}}]\nclusters: [{name: c, cluster: {server: "https://127.0.0.1:${port}", ` +
          `certificate-authority-data: Zm9v}}]\nusers: [{name: u, user: {token: abc}}]\n`,
      );
      chmodSync(kc, 0o600);
      const args = [
        'check',
        '--kubelet-api=dra',
        `--kubeconfig=${kc}`,
        '--node-name=gpu-node-1',
        `--kubelet-plugins-registry=${dir}/registry`,
        `--kubelet-plugins-dir=${dir}/plugins`,
      ];
      const index = (n: number): string =>
        `cdiVersion: 0.5.0\nkind: nvidia.com/gpu\n` +
        `devices:\n${[...Array(n).keys()].map((i) => `  - name: "${i}"\n`).join('')}  - name: all\n`;
      writeFileSync(join(dir, 'cdi', 'nvidia.yaml'), index(7));
      let r = await run(args, dir);
      assert.match(
        line(r.stdout, 'kubeconfig'),
        new RegExp(
          `^PASS  kubeconfig +${kc}: context n, server https://127\\.0\\.0\\.1:${port} ` +
            `\\(embedded CA\\), user u with a bearer token$`,
        ),
      );
      assert.match(
        line(r.stdout, 'sandbox network'),
        new RegExp(
          '^FAIL {2}sandbox network +the service could not reach ' +
            String.raw`127\.0\.0\.1:\d+: PrivateNetwork=yes .* — fix: link the DRA ` +
            String.raw`drop-in: mkdir -p \/etc\/systemd\/system\/gpu-device-plugin\.service\.d ` +
            String.raw`&& ln -s \/usr\/share\/gpu-device-plugin\/dra\.conf `,
        ),
      );
      assert.match(
        line(r.stdout, 'api server'),
        new RegExp(`^PASS  api server +127\\.0\\.0\\.1:${port} accepts TCP connections`),
      );
      assert.match(line(r.stdout, 'plugins registry'), /^PASS {2}plugins registry /);
      assert.match(line(r.stdout, 'plugin directory'), /^PASS {2}plugin directory /);
      assert.match(
        line(r.stdout, 'cdi spec'),
        new RegExp(
          `^FAIL  cdi spec +\\S+nvidia\\.yaml \\(nvidia\\.com/gpu\\) names ` +
            `neither the UUID nor the index of GPU 7 \\(${UUIDS[7]}\\): it is stale`,
        ),
      );
      assert.match(
        line(r.stdout, 'device-plugin mode'),
        /^INFO {2}device-plugin mode +device-plugin mode would need: KUBELET_API=device-plugin/,
      );
      assert.doesNotMatch(
        r.stdout,
        /^\w+ {2}(socket directory|kubelet) /m,
        'no device-plugin socket checks in DRA mode',
      );
      assert.equal(r.status, 1, r.stdout);

      writeFileSync(
        join(unitDir, 'gpu-device-plugin.service.d', 'dra.conf'),
        readFileSync(join(repo, 'systemd', 'dra.conf'), 'utf8'),
      );
      writeFileSync(join(dir, 'cdi', 'nvidia.yaml'), index(8));
      r = await run(args, dir);
      assert.match(
        line(r.stdout, 'sandbox network'),
        new RegExp(
          "^PASS {2}sandbox network +the unit's sandbox lets the service " +
            String.raw`reach 127\.0\.0\.1:\d+ \(PrivateNetwork=no, AF_INET allowed\)`,
        ),
      );
      assert.match(
        line(r.stdout, 'cdi spec'),
        /^PASS {2}cdi spec +\S+nvidia\.yaml names all 8 GPUs as nvidia\.com\/gpu=<index or UUID>/,
      );
      await new Promise<void>((resolve) => api.close(() => resolve()));
      r = await run(args, dir);
      assert.match(line(r.stdout, 'api server'), /^FAIL {2}api server +127\.0\.0\.1:\d+: .*ECONNREFUSED/);
      // The DeviceClasses cannot be listed then: a note, not a second failure.
      assert.match(
        line(r.stdout, 'device classes'),
        /^INFO {2}device classes +not checked: the API server did not answer: .*ECONNREFUSED/,
      );

      // Against an API server that answers: the class whole GPUs need, lacking, then there.
      const stand = await ApiServerStandIn.start();
      try {
        writeFileSync(kc, tokenKubeconfig(stand.url, 'abc'));
        chmodSync(kc, 0o600);
        r = await run(args, dir);
        assert.match(
          line(r.stdout, 'device classes'),
          new RegExp(
            '^WARN {2}device classes +the cluster lacks DeviceClass gpu\\.nvidia\\.com \\(for 8 whole GPUs\\): ' +
              'pods asking nvidia\\.com/gpu are not served through DRA on this node — fix: kubectl apply ' +
              '-f /usr/share/doc/gpu-device-plugin/dra/deviceclass\\.yaml$',
          ),
        );
        assert.match(line(r.stdout, 'sharing classes'), /^INFO {2}sharing classes +the cluster lacks time-sliced/);
        const shipped = loadYaml().parse(readFileSync(join(repo, 'packaging', 'dra', 'deviceclass.yaml'), 'utf8'));
        stand.putDeviceClass(shipped as JsonObject);
        r = await run(args, dir);
        assert.match(
          line(r.stdout, 'device classes'),
          /^PASS {2}device classes +the cluster has gpu\.nvidia\.com for the devices this node publishes$/,
        );
      } finally {
        await stand.stop();
      }

      // The device-plugin mode's run says what DRA would need.
      r = await run(['check'], dir);
      assert.match(
        line(r.stdout, 'DRA mode'),
        new RegExp(
          '^INFO {2}DRA mode +to switch this node to DRA: KUBELET_API=dra and KUBECONFIG=<a ' +
            "node-scoped kubeconfig> in .*; the unit's sandbox already allows it;",
        ),
      );
    } finally {
      api.close();
      rmSync(dir, { recursive: true, force: true });
    }
  },
);
