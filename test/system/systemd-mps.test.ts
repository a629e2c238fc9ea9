// Both units with MPS under a real systemd: a Debian 12 container (test/system/container.ts) with the
// .deb installed by apt, the fake NVML where a driver puts libnvidia-ml.so.1, the fake
// nvidia-cuda-mps-control where a driver puts it (/usr/bin), and the kubelet stand-in
// (test/system/kubelet-main.ts) running as a transient unit. MPS is configured as the README tells an
// operator: the config file with sharing.mps, named by CONFIG_FILE in the package's environment file
// (the one both units read; MPS_ROOT comes from it). The plugin's Wants= starts the MPS unit, active
// before the plugin starts; the plugin registers its MPS replicas Unhealthy until the daemon answers,
// then Healthy; Allocate through the stand-in gives the pipe variable and the two mounts, whose host
// paths exist; a killed control daemon turns the replicas Unhealthy and Healthy again once the unit
// restarts it under the same main process; a reload of the plugin changes its list and reaches the
// MPS unit; an upgrade restarts the plugin and leaves the MPS unit's main PID and its control daemon
// alone; a purge stops and removes both. Needs root, debootstrap and systemd-nspawn
// (build/install-tools.sh).
import { after, before, describe, test } from 'node:test';
import type { TestContext } from 'node:test';
import assert from 'node:assert/strict';
import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import { environmentFile } from '../../build/docs.ts';
import { ENV_FILE, PACKAGE, packageVersion } from '../../build/package.ts';
import { TOPOLOGIES } from '../support/sim.ts';
import type { Container } from './container.ts';
import type { StandInAllocation, StandInState } from './kubelet-main.ts';
import { journalOnFailure } from './journal-on-failure.ts';
import { OPT, type PackagedNode, UNIT, VERSION, bootWithPackage } from './packaged-node.ts';
import { LiveUnit } from './unit.ts';

const MPS_UNIT = `${PACKAGE}-mps.service`;
const UPGRADE_VERSION = `${VERSION}+systemdmpstest1`;
const CONFIG = '/etc/gpu-device-plugin/config.yaml';
const MPS_ROOT = '/run/nvidia/mps';
const KUBELET_DIR = '/var/lib/kubelet/device-plugins';
const STATE = '/run/kubelet-standin.json';
const GPUS = 8;
/** sharing.mps on GPUs 0 and 1: their replicas under nvidia.com/gpu, the other 6 GPUs whole beside them. */
const mpsConfig = (replicas: number): string =>
  `version: v1\nsharing:\n  mps:\n    resources:\n    - name: ` +
  `nvidia.com/gpu\n      replicas: ${replicas}\n      devices: [0, 1]\n`;

let node: PackagedNode | undefined;
const timings: string[] = [];

function box(): Container {
  if (node === undefined) throw new Error('the container did not boot (see the first failure)');
  return node.container;
}

/** Waits on what the units did; a timeout shows both units' and the stand-in's journals. */
const { until } = new LiveUnit(box, UNIT, PACKAGE, [MPS_UNIT, 'kubelet-standin*']);

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

async function standIn(): Promise<StandInState | null> {
  const r = await box().sh(`cat ${STATE} 2>/dev/null`);
  return r.code === 0 && r.stdout !== '' ? (JSON.parse(r.stdout) as StandInState) : null;
}

type Listed = { id: string; health: string }[];

/**
 * The stand-in's nvidia.com/gpu list once it has `replicas` MPS replicas (IDs <uuid>::<n>) in `health`
 * beside the 6 whole GPUs. The whole GPUs are checked Healthy only while the daemon answers: a silent
 * daemon makes every device of its resource Unhealthy (core/snapshot.ts resourceHealth), whole GPUs
 * listed under the same name included.
 */
async function listed(replicas: number, health: 'Healthy' | 'Unhealthy', timeoutMs = 60000): Promise<Listed> {
  return until(
    `the stand-in lists ${replicas} MPS replicas ${health} (and ${GPUS - 2} whole GPUs)`,
    async () => {
      const s = await standIn();
      const d = s?.devices;
      if (s === null || s.registrations.length === 0 || s.streamBroken || d == null) return undefined;
      const shared = d.filter((x) => x.id.includes('::'));
      const whole = d.filter((x) => !x.id.includes('::'));
      return shared.length === replicas &&
        whole.length === GPUS - 2 &&
        shared.every((x) => x.health === health) &&
        (health === 'Unhealthy' || whole.every((x) => x.health === 'Healthy'))
        ? d
        : undefined;
    },
    timeoutMs,
  );
}

/** Allocate through the stand-in, as the kubelet does for one container. */
async function allocate(ids: string[]): Promise<StandInAllocation> {
  const n = (await standIn())?.allocations.length ?? 0;
  await box().run(
    `printf '%s' '${JSON.stringify({ resource: 'nvidia.com/gpu', ids })}' ` +
      `> ${STATE}.allocate && systemctl kill -s SIGUSR2 kubelet-standin`,
  );
  return until("the stand-in's Allocate answered", async () => (await standIn())?.allocations[n]);
}

function timed(t: TestContext, what: string, ms: number): void {
  const line = `${what}: ${(ms / 1000).toFixed(1)} s`;
  timings.push(line);
  t.diagnostic(line);
}

describe('both units with MPS under a real systemd (Debian 12, ' +
  'systemd-nspawn), the kubelet stand-in in the container', {
  concurrency: false,
}, () => {
  journalOnFailure(() => node?.container, ['kubelet-standin.service']);

  before(async () => {
    // The operator's MPS setup, per the README: the config file, and CONFIG_FILE in the package's
    // environment file (which sets MPS_ROOT) — read by both units.
    const envFile = `${environmentFile(ENV_FILE.deb)}\nCONFIG_FILE=${CONFIG}\n`;
    assert.match(envFile, new RegExp(`^MPS_ROOT=${MPS_ROOT}$`, 'm'), "the package's environment file sets MPS_ROOT");
    node = await bootWithPackage({
      name: 'mps',
      bundles: { kubelet: 'kubelet-main.ts' },
      otherVersions: [UPGRADE_VERSION],
      fakeMpsControl: true,
      // The simulated driver's GPUs, told to both units alike (the fake NVML reads them from its environment).
      fakeNvmlUnits: [UNIT, MPS_UNIT],
      files: { [ENV_FILE.deb]: envFile, [CONFIG]: mpsConfig(4) },
      // The environment file is a conffile the operator edited before installing: dpkg keeps the operator's.
      dpkgOptions: ['--force-confold'],
      install: false,
      timings,
    });
    // The kubelet is up before the package comes.
    await box().run(
      `systemd-run --unit kubelet-standin --quiet ${OPT}/node ${OPT}/kubelet.cjs ${KUBELET_DIR} ${STATE}`,
    );
    await until('the stand-in serves kubelet.sock', async () => ((await standIn()) !== null ? true : undefined));
  });

  after(async () => {
    await node?.teardown();
    if (timings.length > 0) process.stderr.write(`real-systemd MPS test timings:\n  ${timings.join('\n  ')}\n`);
  });

  test(
    "apt-get install with MPS configured: the plugin's Wants= starts the MPS unit, active (READY) " +
      'before the plugin starts; the plugin registers 8 MPS replicas, Healthy once the daemon answers',
    async (t) => {
      const t0 = performance.now();
      await node!.install();
      timed(t, 'apt-get install', performance.now() - t0);
      await until('the plugin registered', async () =>
        ((await standIn())?.registrations.length ?? 0) > 0 ? true : undefined,
      );
      timed(t, 'install → registered', performance.now() - t0);
      const healthy = await listed(8, 'Healthy');
      timed(t, 'install → 8 MPS replicas Healthy', performance.now() - t0);
      const uuids = (
        JSON.parse(readFileSync(join(TOPOLOGIES, 'demo-8.json'), 'utf8')) as { gpus: { uuid: string }[] }
      ).gpus.map((g) => g.uuid);
      assert.deepEqual(
        healthy.map((d) => d.id),
        [...[0, 1].flatMap((g) => [0, 1, 2, 3].map((n) => `${uuids[g]}::${n}`)), ...uuids.slice(2)],
      );
      assert.equal((await show(UNIT, 'ActiveState')).ActiveState, 'active');
      const m = await show(MPS_UNIT, 'ActiveState', 'StatusText', 'ActiveEnterTimestampMonotonic', 'MainPID');
      assert.equal(m.ActiveState, 'active', JSON.stringify(m));
      assert.equal(m.StatusText, '1 MPS control daemon up: nvidia.com/gpu');
      const p = await show(UNIT, 'ExecMainStartTimestampMonotonic');
      assert.ok(
        Number(m.ActiveEnterTimestampMonotonic) <= Number(p.ExecMainStartTimestampMonotonic),
        `MPS active at ${m.ActiveEnterTimestampMonotonic}, plugin started at ${p.ExecMainStartTimestampMonotonic}`,
      );
      // The shm tmpfs is in the host's mount namespace (PID 1's), where pods get it from.
      assert.match(
        await box().run(`findmnt -n -o FSTYPE,OPTIONS ${MPS_ROOT}/shm`),
        /^tmpfs\s+rw,nosuid,nodev,noexec,relatime/,
      );
      assert.equal(
        (await box().run(`stat -c %a /run/nvidia ${MPS_ROOT} ${MPS_ROOT}/nvidia.com/gpu/pipe`))
          .trim()
          .split('\n')
          .join(' '),
        '755 755 755',
      );
      await box().run(`test -e ${MPS_ROOT}/.ready`);
      // The control daemon is the unit's, in its cgroup, and sees /dev/shm = <root>/shm.
      const pid = await controlPid();
      assert.match(await box().run(`cat /proc/${pid}/cgroup`), new RegExp(MPS_UNIT.replace('.', '\\.')));
      const dev = async (where: string): Promise<string> => (await box().run(where)).trim();
      const own = await dev(`nsenter -t ${pid} -m stat -c %d /dev/shm`);
      assert.equal(
        own,
        await dev(`stat -c %d ${MPS_ROOT}/shm`),
        "the control daemon's /dev/shm is <root>/shm, as its clients'",
      );
      assert.notEqual(own, await dev('stat -c %d /dev/shm'), "not the host's /dev/shm");
      // What each unit's sandbox exposes, for the record.
      for (const unit of [UNIT, MPS_UNIT]) {
        const exposure = /Overall exposure level for \S+: (.*)/.exec(
          await box().run(`systemd-analyze security --no-pager ${unit} 2>&1 | tail -1`),
        )?.[1];
        assert.ok(exposure !== undefined, `systemd-analyze security ${unit} says an exposure`);
        timings.push(`systemd-analyze security ${unit}: ${exposure}`);
        t.diagnostic(`systemd-analyze security ${unit}: ${exposure}`);
      }
    },
  );

  test(
    'Allocate through the stand-in: CUDA_MPS_PIPE_DIRECTORY and ' +
      'the pipe and shm mounts, whose host paths exist on the node',
    async () => {
      const id = (await listed(8, 'Healthy'))[2]!.id;
      const a = await allocate([id]);
      assert.equal(a.error, undefined, a.error ?? '');
      const [c0] = a.response!.container_responses;
      assert.equal(c0!.envs.CUDA_MPS_PIPE_DIRECTORY, '/mps/nvidia.com/gpu/pipe');
      assert.deepEqual(
        c0!.mounts.map((m) => [m.host_path, m.container_path]),
        [
          [`${MPS_ROOT}/nvidia.com/gpu/pipe`, '/mps/nvidia.com/gpu/pipe'],
          [`${MPS_ROOT}/shm`, '/dev/shm'],
        ],
      );
      for (const m of c0!.mounts) await box().run(`test -d ${m.host_path}`);
      // failRequestsGreaterThanOne (MPS's default): two replicas in one container are refused.
      const two = await allocate([id, (await listed(8, 'Healthy'))[3]!.id]);
      assert.match(two.error ?? '', /maximum request size for shared resources is 1/);
    },
  );

  test(
    'the control daemon killed: the replicas go Unhealthy, and ' +
      'Healthy again once the unit restarts it under the same main PID',
    async (t) => {
      const main = (await show(MPS_UNIT, 'MainPID')).MainPID;
      const pid = await controlPid();
      await listed(8, 'Healthy');
      // The unit's program restarts a dead control daemon after 1 s, about as often as the plugin asks
      // (every second): held (SIGSTOP) while the daemon is killed, so that the test sees the plugin notice
      // it whatever the race; let go, it restarts it as it would have.
      const t0 = performance.now();
      await box().run(`kill -STOP ${main} && kill -9 ${pid}`);
      try {
        await listed(8, 'Unhealthy', 20000);
        timed(t, 'control daemon killed → replicas Unhealthy', performance.now() - t0);
      } finally {
        await box().run(`kill -CONT ${main}`);
      }
      const t1 = performance.now();
      const again = await until('a new control daemon', async () => {
        const p = await controlPid().catch(() => 0);
        return p !== 0 && p !== pid ? p : undefined;
      });
      timed(t, 'unit let go → control daemon running again', performance.now() - t1);
      await listed(8, 'Healthy');
      timed(t, 'unit let go → replicas Healthy', performance.now() - t1);
      assert.notEqual(again, pid);
      assert.equal((await show(MPS_UNIT, 'MainPID')).MainPID, main);
      assert.match(
        await mpsJournal(),
        /MPS control daemon was killed by SIGKILL; every client's CUDA context went with it/,
      );
    },
  );

  test(
    'systemctl reload gpu-device-plugin with 2 replicas: the plugin lists 4, ' +
      'the MPS unit re-applies the limits (ReloadPropagatedFrom=), no new main PIDs',
    async (t) => {
      const before = { plugin: (await show(UNIT, 'MainPID')).MainPID, mps: (await show(MPS_UNIT, 'MainPID')).MainPID };
      const t0 = performance.now();
      await box().run(`sed -i 's/replicas: 4/replicas: 2/' ${CONFIG} && systemctl reload ${UNIT}`);
      await listed(4, 'Healthy');
      timed(t, 'reload → 4 replicas listed', performance.now() - t0);
      await until('the MPS unit re-applied the limits', async () =>
        /SIGHUP: default limits applied again \(changed\)/.test(await mpsJournal()) ? true : undefined,
      );
      assert.deepEqual(
        { plugin: (await show(UNIT, 'MainPID')).MainPID, mps: (await show(MPS_UNIT, 'MainPID')).MainPID },
        before,
      );
    },
  );

  test(
    'an upgrade restarts the plugin and leaves the MPS ' + 'unit and its control daemon running as they were',
    async (t) => {
      const before = { main: (await show(MPS_UNIT, 'MainPID')).MainPID, control: await controlPid() };
      const plugin = (await show(UNIT, 'MainPID')).MainPID;
      const t0 = performance.now();
      await node!.install(UPGRADE_VERSION);
      timed(t, 'apt-get upgrade', performance.now() - t0);
      assert.equal(await box().run(`dpkg-query -W -f '\${Version}' ${PACKAGE}`), packageVersion(UPGRADE_VERSION));
      const after = { main: (await show(MPS_UNIT, 'MainPID')).MainPID, control: await controlPid() };
      assert.deepEqual(after, before);
      assert.equal((await show(MPS_UNIT, 'ActiveState')).ActiveState, 'active');
      assert.notEqual((await show(UNIT, 'MainPID')).MainPID, plugin, 'the plugin was restarted by the upgrade');
      await listed(4, 'Healthy');
      timed(t, 'upgrade → replicas listed Healthy by the new plugin', performance.now() - t0);
    },
  );

  test('purge stops both units (the MPS unit: quit, shm unmounted, files gone) and removes them', async (t) => {
    const t0 = performance.now();
    await box().run(
      `rm -rf /etc/systemd/system/${UNIT}.d /etc/systemd/system/${MPS_UNIT}.d && ${node!.apt} purge ${PACKAGE} 2>&1`,
      { timeoutMs: 120000 },
    );
    timed(t, 'apt-get purge', performance.now() - t0);
    assert.notEqual((await box().sh(`systemctl is-active ${MPS_UNIT}`)).stdout.trim(), 'active');
    assert.notEqual((await box().sh(`systemctl is-active ${UNIT}`)).stdout.trim(), 'active');
    assert.equal((await box().sh(`findmnt ${MPS_ROOT}/shm`)).code, 1, 'shm unmounted');
    for (const p of [
      `${MPS_ROOT}/.ready`,
      `${MPS_ROOT}/nvidia.com/gpu/.started`,
      `/usr/lib/systemd/system/${MPS_UNIT}`,
      `/usr/lib/systemd/system/${UNIT}`,
      '/var/lib/gpu-device-plugin-mps',
    ]) {
      assert.equal((await box().sh(`test -e ${p}`)).code, 1, `${p} is gone`);
    }
    assert.match(await mpsJournal(), /MPS control daemons stopped; compute modes back to DEFAULT/);
  });
});
