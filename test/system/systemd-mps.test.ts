// The MPS control daemons' unit (gpu-device-plugin-mps.service) under a real systemd: a Debian 12
// container (test/system/container.ts) with the .deb installed by apt, the fake NVML where a driver
// puts libnvidia-ml.so.1 and the fake nvidia-cuda-mps-control where a driver puts it (/usr/bin).
// The plugin's Wants= starts the unit; it is active before the plugin starts, its shm tmpfs is
// mounted in the host's namespace (where the container runtime binds it into pods), a killed control
// daemon is restarted under the same main process, a reload of the plugin reaches it, an upgrade
// leaves its main PID and its control daemon alone, and a purge stops and removes it. Needs root,
// debootstrap and systemd-nspawn (build/install-tools.sh).
import { after, before, describe, test } from 'node:test';
import type { TestContext } from 'node:test';
import assert from 'node:assert/strict';
import { execFileSync } from 'node:child_process';
import { copyFileSync, existsSync, mkdirSync, mkdtempSync, readFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { buildExecutable } from '../../build/build.ts';
import { PACKAGE, buildDeb, packageVersion, projectVersion } from '../../build/package.ts';
import { buildFakeMpsControl, buildFakeNvml, LIBRARY_NAME, MPS_CONTROL_NAME } from '../fake-nvml/build.ts';
import { TOPOLOGIES } from '../support/sim.ts';
import { Container, cachedRootfs, dependencyNames } from './container.ts';

const ROOT = join(import.meta.dirname, '..', '..');
const UNIT = `${PACKAGE}.service`;
const MPS_UNIT = `${PACKAGE}-mps.service`;
const OPT = '/opt/gdp-mps-test';
const VERSION = projectVersion();
const UPGRADE_VERSION = `${VERSION}+systemdmpstest1`;
const CONFIG = '/etc/gpu-device-plugin/mps.yaml';
const MPS_ROOT = '/run/nvidia/mps';
const APT = 'DEBIAN_FRONTEND=noninteractive apt-get -y -q';

let c: Container | undefined;
let work: string;
const timings: string[] = [];

function box(): Container {
  if (c === undefined) throw new Error('the container did not boot (see the first failure)');
  return c;
}

async function until<T>(what: string, probe: () => Promise<T | undefined>, timeoutMs = 60000): Promise<T> {
  const end = performance.now() + timeoutMs;
  let last: unknown;
  for (;;) {
    try {
      const v = await probe();
      if (v !== undefined) return v;
    } catch (err) {
      last = err;
    }
    if (performance.now() > end) {
      const journal = await box().sh(`journalctl -u ${MPS_UNIT} -u ${UNIT} -o short-precise --no-pager | tail -40`);
      throw new Error(`${what}: not within ${timeoutMs} ms${last instanceof Error ? ` (last error: ${last.message})` : ''}\njournal:\n${journal.stdout}`);
    }
    await new Promise((r) => setTimeout(r, 100));
  }
}

async function show(unit: string, ...props: string[]): Promise<Record<string, string>> {
  const out = await box().run(`systemctl show ${unit} ${props.map((p) => `-p ${p}`).join(' ')}`);
  const r: Record<string, string> = {};
  for (const line of out.split('\n')) {
    const i = line.indexOf('=');
    if (i > 0) r[line.slice(0, i)] = line.slice(i + 1);
  }
  return r;
}

async function controlPid(): Promise<number> {
  return Number((await box().run(`cat ${MPS_ROOT}/nvidia.com/gpu/.started`)).trim());
}

async function mpsJournal(): Promise<string> {
  return box().run(`journalctl -o cat --no-pager _SYSTEMD_UNIT=${MPS_UNIT} + UNIT=${MPS_UNIT}`);
}

function timed(t: TestContext, what: string, ms: number): void {
  const line = `${what}: ${(ms / 1000).toFixed(1)} s`;
  timings.push(line);
  t.diagnostic(line);
}

describe('the MPS unit under a real systemd (Debian 12, systemd-nspawn)', { concurrency: false }, () => {
  before(async () => {
    assert.equal(process.getuid?.(), 0, 'the real-systemd test runs systemd-nspawn, which needs root');
    const t0 = performance.now();
    work = mkdtempSync(join(tmpdir(), 'gdp-systemd-mps-'));
    const opt = join(work, 'opt');
    mkdirSync(opt, { recursive: true });
    const built = join(ROOT, 'dist', PACKAGE);
    if (!existsSync(built)) await buildExecutable();
    const exe = join(work, PACKAGE);
    copyFileSync(built, exe);
    const [deb, , nvml, mps] = await Promise.all([
      buildDeb({ executable: exe, outDir: opt, compression: 'none' }),
      buildDeb({ executable: exe, outDir: opt, version: UPGRADE_VERSION, compression: 'none' }),
      buildFakeNvml(),
      buildFakeMpsControl(),
    ]);
    const depends = execFileSync('dpkg-deb', ['-f', deb, 'Depends'], { encoding: 'utf8' }).trim();
    const rootfs = await cachedRootfs(dependencyNames(depends));
    const fakeNvml = '[Service]\nEnvironment=FAKE_NVML_CONFIG=/etc/fake-nvml/demo-8.json\n';
    c = await Container.boot({
      rootfs: rootfs.path,
      bindRo: [[opt, OPT]],
      files: {
        [`/usr/lib/x86_64-linux-gnu/${LIBRARY_NAME}`]: readFileSync(join(nvml.current, LIBRARY_NAME)),
        [`/usr/bin/${MPS_CONTROL_NAME}`]: readFileSync(join(mps, MPS_CONTROL_NAME)),
        '/etc/fake-nvml/demo-8.json': readFileSync(join(TOPOLOGIES, 'demo-8.json')),
        [`/etc/systemd/system/${UNIT}.d/fake-nvml.conf`]: fakeNvml,
        // The MPS config for the MPS unit only (until the plugin parses sharing.mps itself).
        [`/etc/systemd/system/${MPS_UNIT}.d/fake-nvml.conf`]: `${fakeNvml}Environment=CONFIG_FILE=${CONFIG}\n`,
        [CONFIG]: 'version: v1\nsharing:\n  mps:\n    resources:\n    - name: nvidia.com/gpu\n      replicas: 4\n      devices: [0, 1]\n',
      },
    });
    await box().run(`ldconfig && chmod 0755 /usr/bin/${MPS_CONTROL_NAME}`);
    timings.push(`prepared and booted in ${((performance.now() - t0) / 1000).toFixed(1)} s`);
  });

  after(async () => {
    if (c !== undefined) await c.teardown();
    if (work !== undefined) rmSync(work, { recursive: true, force: true });
    if (timings.length > 0) process.stderr.write(`real-systemd MPS test timings:\n  ${timings.join('\n  ')}\n`);
  });

  test('apt-get install: the plugin\'s Wants= starts the MPS unit, which is active (READY) before the plugin starts', async (t) => {
    const t0 = performance.now();
    await box().run(`cd ${OPT} && ${APT} install ./${PACKAGE}_${packageVersion(VERSION)}_amd64.deb 2>&1`, { timeoutMs: 180000 });
    timed(t, 'apt-get install', performance.now() - t0);
    const m = await show(MPS_UNIT, 'ActiveState', 'StatusText', 'ActiveEnterTimestampMonotonic', 'MainPID');
    assert.equal(m.ActiveState, 'active', JSON.stringify(m));
    assert.equal(m.StatusText, '1 MPS control daemon up: nvidia.com/gpu');
    const p = await show(UNIT, 'ExecMainStartTimestampMonotonic');
    assert.ok(Number(m.ActiveEnterTimestampMonotonic) <= Number(p.ExecMainStartTimestampMonotonic), `MPS active at ${m.ActiveEnterTimestampMonotonic}, plugin started at ${p.ExecMainStartTimestampMonotonic}`);
    // The shm tmpfs is in the host's mount namespace (PID 1's), where pods get it from.
    assert.match(await box().run(`findmnt -n -o FSTYPE,OPTIONS ${MPS_ROOT}/shm`), /^tmpfs\s+rw,nosuid,nodev,noexec,relatime/);
    assert.equal((await box().run(`stat -c %a /run/nvidia ${MPS_ROOT} ${MPS_ROOT}/nvidia.com/gpu/pipe`)).trim().split('\n').join(' '), '755 755 755');
    await box().run(`test -e ${MPS_ROOT}/.ready`);
    // The control daemon is the unit's, in its cgroup, and sees /dev/shm = <root>/shm.
    const pid = await controlPid();
    assert.match(await box().run(`cat /proc/${pid}/cgroup`), new RegExp(MPS_UNIT.replace('.', '\\.')));
    const dev = async (where: string): Promise<string> => (await box().run(where)).trim();
    const own = await dev(`nsenter -t ${pid} -m stat -c %d /dev/shm`);
    assert.equal(own, await dev(`stat -c %d ${MPS_ROOT}/shm`), 'the control daemon\'s /dev/shm is <root>/shm, as its clients\'');
    assert.notEqual(own, await dev('stat -c %d /dev/shm'), 'not the host\'s /dev/shm');
  });

  test('the control daemon killed: restarted by the program, the unit\'s main PID unchanged', async (t) => {
    const main = (await show(MPS_UNIT, 'MainPID')).MainPID;
    const pid = await controlPid();
    const t0 = performance.now();
    await box().run(`kill -9 ${pid}`);
    const again = await until('a new control daemon', async () => {
      const p = await controlPid().catch(() => 0);
      return p !== 0 && p !== pid ? p : undefined;
    });
    timed(t, 'control daemon killed → running again', performance.now() - t0);
    assert.notEqual(again, pid);
    assert.equal((await show(MPS_UNIT, 'MainPID')).MainPID, main);
    assert.match(await mpsJournal(), /MPS control daemon was killed by SIGKILL; every client's CUDA context went with it/);
  });

  test('systemctl reload gpu-device-plugin reaches the MPS unit (ReloadPropagatedFrom=): limits applied again', async () => {
    await box().run(`sed -i 's/replicas: 4/replicas: 2/' ${CONFIG} && systemctl reload ${UNIT}`);
    await until('the MPS unit re-applied the limits', async () => (/SIGHUP: default limits applied again \(changed\)/.test(await mpsJournal()) ? true : undefined));
  });

  test('an upgrade leaves the MPS unit and its control daemon running as they were', async (t) => {
    const before = { main: (await show(MPS_UNIT, 'MainPID')).MainPID, control: await controlPid() };
    const t0 = performance.now();
    await box().run(`cd ${OPT} && ${APT} install ./${PACKAGE}_${packageVersion(UPGRADE_VERSION)}_amd64.deb 2>&1`, { timeoutMs: 180000 });
    timed(t, 'apt-get upgrade', performance.now() - t0);
    assert.equal((await box().run(`dpkg-query -W -f '\${Version}' ${PACKAGE}`)), packageVersion(UPGRADE_VERSION));
    const after = { main: (await show(MPS_UNIT, 'MainPID')).MainPID, control: await controlPid() };
    assert.deepEqual(after, before);
    assert.equal((await show(MPS_UNIT, 'ActiveState')).ActiveState, 'active');
  });

  test('purge stops the MPS unit (quit, shm unmounted, files gone) and removes it', async (t) => {
    const t0 = performance.now();
    await box().run(`rm -rf /etc/systemd/system/${UNIT}.d /etc/systemd/system/${MPS_UNIT}.d && ${APT} purge ${PACKAGE} 2>&1`, { timeoutMs: 120000 });
    timed(t, 'apt-get purge', performance.now() - t0);
    assert.notEqual((await box().sh(`systemctl is-active ${MPS_UNIT}`)).stdout.trim(), 'active');
    assert.equal((await box().sh(`findmnt ${MPS_ROOT}/shm`)).code, 1, 'shm unmounted');
    for (const p of [`${MPS_ROOT}/.ready`, `${MPS_ROOT}/nvidia.com/gpu/.started`, `/usr/lib/systemd/system/${MPS_UNIT}`, '/var/lib/gpu-device-plugin-mps']) {
      assert.equal((await box().sh(`test -e ${p}`)).code, 1, `${p} is gone`);
    }
    assert.match(await mpsJournal(), /MPS control daemons stopped; compute modes back to DEFAULT/);
  });
});
