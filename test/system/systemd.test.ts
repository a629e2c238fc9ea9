// The .deb under a real systemd: a Debian 12 container (test/system/container.ts) with systemd 252 as
// PID 1, the package installed with apt from the file, the fake NVML where a driver package puts
// libnvidia-ml.so.1, and the kubelet stand-in (test/system/kubelet-main.ts) as a transient unit.
// Every check runs against the live unit: its sandbox, reload, kubelet restarts, the socket
// directory deleted and re-created (`kubeadm reset`), the watchdog, stop and start, an upgrade and a
// purge. Needs root, debootstrap and systemd-nspawn (build/install-tools.sh); never skipped: a
// container that cannot boot fails the run.
import { after, before, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { ENV_FILE, PACKAGE, packageVersion } from '../../build/package.ts';
import { LIBRARY_NAME } from '../fake-nvml/build.ts';
import type { Container } from './container.ts';
import type { StandInState } from './kubelet-main.ts';
import { journalOnFailure } from './journal-on-failure.ts';
import { OPT, type PackagedNode, UNIT, VERSION, bootWithPackage } from './packaged-node.ts';
import { LiveUnit, timer } from './unit.ts';

const DIR = '/var/lib/kubelet/device-plugins';
const STATE = '/run/kubelet-standin.json';
/** The upgrade: same executable, a higher package version ("+" sorts after the release in dpkg). */
const UPGRADE_VERSION = `${VERSION}+systemdtest1`;
const CONFIG = '/etc/gpu-device-plugin/config.yaml';
const GPUS = 8;

let node: PackagedNode | undefined;
const timings: string[] = [];

function box(): Container {
  if (node === undefined) throw new Error('the container did not boot (see the first failure)');
  return node.container;
}

const { until, show, journal, journalCursor, mainPid, statusIs } = new LiveUnit(box, UNIT, PACKAGE, [
  'kubelet-standin-*',
]);

async function standIn(): Promise<StandInState | null> {
  const r = await box().sh(`cat ${STATE} 2>/dev/null`);
  return r.code === 0 && r.stdout !== '' ? (JSON.parse(r.stdout) as StandInState) : null;
}

/** Each kubelet start is a transient unit of its own name: a stopped one may stay loaded a moment. */
let kubeletUnit = 0;

/** A kubelet (re)start: a new stand-in process that wipes the directory and serves kubelet.sock. */
async function startKubelet(): Promise<void> {
  kubeletUnit++;
  await box().run(
    `rm -f ${STATE} && systemd-run --unit kubelet-standin-${kubeletUnit} ` +
      `--collect --quiet ${OPT}/node ${OPT}/kubelet.cjs ${DIR} ${STATE}`,
  );
}

async function stopKubelet(): Promise<void> {
  await box().run(`systemctl stop kubelet-standin-${kubeletUnit}`);
}

/** The stand-in's state once the plugin has registered with it and listed every GPU healthy. */
async function registered(count = GPUS): Promise<StandInState> {
  return until(`the stand-in kubelet sees ${count} healthy devices`, async () => {
    const s = await standIn();
    return s !== null &&
      s.registrations.length > 0 &&
      !s.streamBroken &&
      s.devices?.length === count &&
      s.devices.every((d) => d.health === 'Healthy')
      ? s
      : undefined;
  });
}

const timed = timer(timings);

const OK_STATUS = new RegExp(`^registered; ${GPUS} of ${GPUS} GPUs healthy$`);

describe('the .deb under a real systemd (Debian 12, systemd-nspawn)', { concurrency: false }, () => {
  journalOnFailure(() => node?.container, ['kubelet-standin-*']);

  before(async () => {
    node = await bootWithPackage({
      name: 'systemd',
      bundles: { kubelet: 'kubelet-main.ts' },
      otherVersions: [UPGRADE_VERSION],
      files: { [CONFIG]: 'version: v1\n' },
      install: false,
      timings,
    });
  });

  after(async () => {
    await node?.teardown();
    if (timings.length > 0) process.stderr.write(`real-systemd test timings:\n  ${timings.join('\n  ')}\n`);
  });

  test(
    'apt-get installs the .deb offline with no kubelet yet: the ' +
      'start returns (READY within ~10 s) and says what it waits for',
    async (t) => {
      const t0 = performance.now();
      const out = await node!.install();
      timed(t, 'apt-get install (the start waits for READY)', performance.now() - t0);
      assert.match(out, new RegExp(`Setting up ${PACKAGE}`));
      const u = await show('ActiveState', 'SubState', 'StatusText', 'UnitFileState');
      assert.equal(u.ActiveState, 'active', JSON.stringify(u));
      assert.equal(u.UnitFileState, 'enabled');
      assert.equal(u.StatusText, 'waiting for the kubelet; retrying');
    },
  );

  test(
    'the kubelet appears: registered, 8 healthy devices, ' + 'StatusText "registered; 8 of 8 GPUs healthy"',
    async (t) => {
      const t0 = performance.now();
      await startKubelet();
      const s = await registered();
      timed(t, 'registration after the kubelet appeared', performance.now() - t0);
      assert.deepEqual(s.registrations.at(-1), {
        resource: 'nvidia.com/gpu',
        endpoint: 'gpu-device-plugin-gpu.sock',
        version: 'v1beta1',
      });
      assert.match(await statusIs(OK_STATUS), OK_STATUS);
    },
  );

  test(
    'the live sandbox: NoNewPrivs, no capabilities, seccomp, read-only /usr and MPS root, devices refused, ' +
      "exposure ≤ 1.5, check's sandbox lines",
    async (t) => {
      const t0 = performance.now();
      const pid = await mainPid();
      const status = await box().run(`cat /proc/${pid}/status`);
      assert.match(status, /^NoNewPrivs:\s+1$/m);
      assert.match(status, /^CapEff:\s+0000000000000000$/m);
      assert.match(status, /^CapBnd:\s+0000000000000000$/m);
      assert.match(status, /^Seccomp:\s+2$/m);
      // io_uring is denied (SystemCallFilter=~io_uring_setup …): libuv's event loops fall back to
      // plain epoll, so no io_uring ring descriptor is held.
      const fds = await box().run(`ls -l /proc/${pid}/fd`);
      assert.doesNotMatch(fds, /io_uring/, fds);
      assert.match(fds, /eventpoll/, fds);
      // In the service's mount namespace: /usr is read-only, the socket directory writable.
      const ro = await box().sh(`nsenter -t ${pid} -m -- touch /usr/gdp-probe`);
      assert.notEqual(ro.code, 0);
      assert.match(ro.stderr, /Read-only file system/);
      await box().run(`nsenter -t ${pid} -m -- sh -c 'touch ${DIR}/gdp-probe && rm ${DIR}/gdp-probe'`);
      // The MPS root is read-only for it: the MPS unit's program (root, CAP_SYS_ADMIN, the host's mounts) makes
      // directories, writes files and mounts its tmpfs there, so a link the plugin planted would aim them.
      const mpsRoot = await box().sh(`nsenter -t ${pid} -m -- mkdir -p /run/nvidia/mps/gdp-probe`);
      await box().sh(`rmdir /run/nvidia/mps/gdp-probe`);
      assert.notEqual(mpsRoot.code, 0, 'the MPS root is writable by the service');
      assert.match(mpsRoot.stderr, /Read-only file system/);
      // A device outside char-nvidia*: opens from outside the unit, refused inside the unit's cgroup
      // (where /dev/null, a standard pseudo-device, still opens).
      const cg = `/sys/fs/cgroup${(await show('ControlGroup')).ControlGroup}`;
      await box().run('exec 3<>/dev/net/tun');
      const inUnit = await box().sh(
        `echo $$ > ${cg}/cgroup.procs && exec 3<>/dev/null && echo ` +
          `null-opened && exec 4<>/dev/net/tun && echo tun-opened`,
      );
      assert.match(inUnit.stdout, /null-opened/);
      assert.doesNotMatch(inUnit.stdout, /tun-opened/);
      assert.match(inUnit.stderr, /Operation not permitted/);
      const sec = await box().run(`systemd-analyze security ${UNIT} 2>&1`);
      const exposure = Number(/Overall exposure level for .*: ([\d.]+)/.exec(sec)?.[1]);
      timed(t, `sandbox checks (live exposure ${exposure})`, performance.now() - t0);
      assert.ok(exposure <= 1.5, `exposure ${exposure}:\n${sec}`);
      // check's sandbox lines: the package's units as installed pass; a drop-in that loosens one is named.
      const sandboxLines = async (): Promise<{ name: string; status: string; detail: string }[]> => {
        const out = (await box().sh('gpu-device-plugin check --json')).stdout;
        const checks = (JSON.parse(out) as { checks: { name: string; status: string; detail: string }[] }).checks;
        return checks.filter((c) => c.name.startsWith('sandbox of '));
      };
      assert.deepEqual(
        (await sandboxLines()).map((c) => [c.name, c.status]),
        [
          [`sandbox of ${UNIT}`, 'PASS'],
          ['sandbox of gpu-device-plugin-mps.service', 'PASS'],
        ],
      );
      const dropIn = `/etc/systemd/system/${UNIT}.d/zz-loose.conf`;
      await box().run(
        `mkdir -p $(dirname ${dropIn}) && printf '[Service]\\nCapabilityBoundingSet=CAP_SYS_ADMIN\\n' > ${dropIn}`,
      );
      try {
        const loose = (await sandboxLines())[0];
        assert.equal(loose?.status, 'WARN', JSON.stringify(loose));
        assert.match(loose?.detail ?? '', /CapabilityBoundingSet= adds CAP_SYS_ADMIN/);
      } finally {
        await box().run(`rm -f ${dropIn} && rmdir --ignore-fail-on-non-empty $(dirname ${dropIn})`);
      }
    },
  );

  test(
    'a plugin run by hand while the service is up (the natural way to troubleshoot) is refused ' +
      "in one line naming the service's PID, across its sandbox; the service keeps its registration",
    async (t) => {
      const t0 = performance.now();
      const pid = await mainPid();
      const before = (await registered()).registrations.length;
      const r = await box().sh(
        `FAKE_NVML_CONFIG=/etc/fake-nvml/demo-8.json /usr/bin/gpu-device-plugin --log-level=debug 2>&1`,
      );
      timed(t, 'a second plugin refused', performance.now() - t0);
      assert.equal(r.code, 3, r.stdout);
      const lines = r.stdout.trim().split('\n');
      assert.equal(lines.length, 1, r.stdout);
      assert.match(
        lines[0]!,
        new RegExp(
          `ERROR another gpu-device-plugin \\(PID ${pid}\\) already serves the socket directory ${DIR}; stop it first`,
        ),
      );
      assert.equal(await mainPid(), pid);
      assert.equal((await registered()).registrations.length, before, 'no registration taken over');
      assert.match(await statusIs(OK_STATUS), OK_STATUS);
    },
  );

  test(
    'systemctl reload re-reads the config file in the same ' +
      'process: time-slicing on (16 devices) and off again (8)',
    async (t) => {
      const t0 = performance.now();
      // The config file comes from the package's environment file (an edit kept across the upgrade below).
      await box().run(`echo 'CONFIG_FILE=${CONFIG}' >> ${ENV_FILE.deb} && systemctl restart ${UNIT}`);
      await registered();
      const pid = await mainPid();
      const mark = await journalCursor();
      try {
        await box().run(
          `printf 'version: v1\\nsharing:\\n  timeSlicing:\\n    resources:\\n      - name: ` +
            `nvidia.com/gpu\\n        replicas: 2\\n' > ${CONFIG} && systemctl reload ${UNIT}`,
        );
        const shared = await registered(2 * GPUS);
        assert.ok(
          shared.devices!.every((d) => /::[01]$/.test(d.id)),
          JSON.stringify(shared.devices),
        );
      } finally {
        // Back to whole GPUs even when the reload failed, so that the checks after this one hold.
        await box().run(`echo 'version: v1' > ${CONFIG} && (systemctl reload ${UNIT} || systemctl restart ${UNIT})`);
      }
      await registered();
      assert.equal(await mainPid(), pid, 'reloaded, not restarted');
      const lines = await journal(mark);
      assert.equal(lines.filter((l) => /^INFO config reloaded/.test(l)).length, 2, lines.join('\n'));
      timed(t, 'two reloads', performance.now() - t0);
    },
  );

  test(
    'kubelet restarts (a new kubelet process each time): ' + 'registered again every time, by the same process',
    async (t) => {
      const pid = await mainPid();
      const restarts = Number((await show('NRestarts')).NRestarts);
      for (let i = 0; i < 5; i++) {
        const t0 = performance.now();
        await stopKubelet();
        await startKubelet();
        await registered();
        timed(t, `kubelet restart ${i + 1} → registered`, performance.now() - t0);
      }
      assert.equal(await mainPid(), pid);
      assert.equal(Number((await show('NRestarts')).NRestarts), restarts);
      assert.match(await statusIs(OK_STATUS), OK_STATUS);
    },
  );

  test(
    'the socket directory deleted and re-created (kubeadm reset), ' +
      'three times: one clear line, a restart, registered again',
    async (t) => {
      const mark = await journalCursor();
      const restarts = Number((await show('NRestarts')).NRestarts);
      const pids: number[] = [];
      for (let i = 0; i < 3; i++) {
        const pid = await mainPid();
        pids.push(pid);
        const t0 = performance.now();
        await stopKubelet();
        // The plugin may re-create its socket while rm runs: retry until the directory is gone.
        await box().run(`until rm -rf ${DIR} 2>/dev/null && [ ! -e ${DIR} ]; do :; done`);
        await startKubelet();
        await until('a new service process', async () =>
          (await mainPid()) !== pid && (await mainPid()) !== 0 ? true : undefined,
        );
        await registered();
        await statusIs(OK_STATUS);
        timed(t, `directory deleted and re-created ${i + 1} → registered again`, performance.now() - t0);
      }
      const lines = await journal(mark);
      const lost = lines.filter((l) => /lost the socket directory/.test(l));
      assert.equal(lost.length, 3, lines.join('\n'));
      for (const l of lost)
        assert.match(
          l,
          new RegExp(
            '^ERROR lost the socket directory: the directory was deleted( and ' +
              "re-created)?, and its mount in this process's mount namespace went with " +
              'it; exiting so that systemd restarts the service with a fresh view of it',
          ),
        );
      // One each: every process that exited said why, as its own last line.
      for (const pid of pids) {
        const own = (await box().run(`journalctl -q -o cat --no-pager --after-cursor='${mark}' _PID=${pid}`))
          .trimEnd()
          .split('\n');
        assert.match(
          own.at(-1) ?? '',
          /^ERROR lost the socket directory: /,
          `process ${pid}'s last lines:\n${own.slice(-5).join('\n')}`,
        );
      }
      // Each process logs a failed listen once per distinct problem, and grpc prints nothing of its own.
      const runs: string[][] = [[]];
      for (const l of lines) {
        if (/^INFO starting/.test(l)) runs.push([]);
        if (/cannot register with the kubelet yet/.test(l)) runs.at(-1)!.push(/error=(".*?[^\\]")/.exec(l)?.[1] ?? l);
      }
      for (const r of runs)
        assert.equal(new Set(r).size, r.length, `a problem logged twice by one process:\n${lines.join('\n')}`);
      assert.equal(lines.filter((l) => /^E /.test(l)).length, 0, lines.join('\n'));
      assert.equal(Number((await show('NRestarts')).NRestarts), restarts + 3);
    },
  );

  test('the watchdog restarts a stopped (SIGSTOP) process', async (t) => {
    const pid = await mainPid();
    const restarts = Number((await show('NRestarts')).NRestarts);
    const t0 = performance.now();
    await box().run(`kill -STOP ${pid}`);
    await until(
      'a new service process after the watchdog',
      async () => {
        const now = await mainPid();
        return now !== pid && now !== 0 ? now : undefined;
      },
      120000,
    );
    await registered();
    await statusIs(OK_STATUS);
    timed(t, 'SIGSTOP → watchdog restart → registered (WatchdogSec=30s)', performance.now() - t0);
    assert.equal(Number((await show('NRestarts')).NRestarts), restarts + 1);
    assert.ok((await box().run(`journalctl -u ${UNIT} -o cat --no-pager`)).includes('Watchdog timeout'));
  });

  test(
    'an upgrade with the kubelet connected: the new package ' + 'takes over, devices kept, the conffile edit kept',
    async (t) => {
      const t0 = performance.now();
      const pid = await mainPid();
      const registrations = (await standIn())!.registrations.length;
      const out = await node!.install(UPGRADE_VERSION);
      assert.match(
        out,
        new RegExp(`Unpacking ${PACKAGE} \\(${packageVersion(UPGRADE_VERSION).replace(/[+.]/g, '\\$&')}\\) over`),
      );
      assert.equal(await box().run(`dpkg-query -W -f '\${Version}' ${PACKAGE}`), packageVersion(UPGRADE_VERSION));
      const s = await until('registered again after the upgrade', async () => {
        const st = await registered();
        return st.registrations.length > registrations ? st : undefined;
      });
      assert.equal(s.devices?.length, GPUS);
      const now = await mainPid();
      assert.notEqual(now, pid, 'restarted with the new package');
      assert.match(await box().run(`cat ${ENV_FILE.deb}`), new RegExp(`^CONFIG_FILE=${CONFIG}$`, 'm'));
      assert.ok(
        (await box().run(`tr '\\0' '\\n' < /proc/${now}/environ`)).split('\n').includes(`CONFIG_FILE=${CONFIG}`),
      );
      assert.match(await statusIs(OK_STATUS), OK_STATUS);
      timed(t, 'upgrade → registered again', performance.now() - t0);
    },
  );

  test(
    'systemctl stop: inactive (not failed), socket removed; a start before ' +
      'the kubelet exists is READY within ~10 s and registers once it appears',
    async (t) => {
      let t0 = performance.now();
      await box().run(`systemctl stop ${UNIT}`);
      timed(t, 'systemctl stop', performance.now() - t0);
      let u = await show('ActiveState', 'Result');
      assert.equal(u.ActiveState, 'inactive', JSON.stringify(u));
      assert.equal(u.Result, 'success');
      assert.equal(
        (await box().sh(`test -e ${DIR}/gpu-device-plugin-gpu.sock`)).code,
        1,
        'the plugin socket is removed',
      );
      await stopKubelet();
      await box().run(`rm -rf ${DIR}`);
      t0 = performance.now();
      await box().run(`systemctl start ${UNIT}`, { timeoutMs: 120000 });
      timed(t, 'systemctl start with no kubelet (returns at READY)', performance.now() - t0);
      u = await show('ActiveState', 'StatusText');
      assert.equal(u.ActiveState, 'active');
      assert.equal(u.StatusText, 'waiting for the kubelet; retrying');
      t0 = performance.now();
      await startKubelet();
      await registered();
      assert.match(await statusIs(OK_STATUS), OK_STATUS);
      timed(t, 'kubelet appears → registered', performance.now() - t0);
    },
  );

  test(
    'no driver: the service waits for it in one process (the packaged environment file sets ' +
      'FAIL_ON_INIT_ERROR=false), STATUS says so; once the driver is there the same process registers',
    async (t) => {
      assert.match(await box().run(`cat ${ENV_FILE.deb}`), /^FAIL_ON_INIT_ERROR=false$/m);
      const lib = `/usr/lib/x86_64-linux-gnu/${LIBRARY_NAME}`;
      const restarts = Number((await show('NRestarts')).NRestarts);
      const registrations = (await registered()).registrations.length;
      let t0 = performance.now();
      await box().run(`mv ${lib} /root/ && ldconfig`);
      let pid: number;
      try {
        // Returns at READY: at the latest 10 s after the start, saying what it waits for.
        await box().run(`systemctl restart ${UNIT}`, { timeoutMs: 120000 });
        timed(t, 'systemctl restart with no driver (returns at READY)', performance.now() - t0);
        pid = await mainPid();
        await statusIs(/^waiting for the NVIDIA driver \(NVML cannot be loaded yet\); retrying$/);
        assert.equal((await show('ActiveState')).ActiveState, 'active');
        assert.ok(
          (await journal()).some((l) =>
            /^WARN NVML is not available; retrying \(fail-on-init-error is false\)/.test(l),
          ),
        );
      } finally {
        await box().run(`mv /root/${LIBRARY_NAME} ${lib} && ldconfig`);
      }
      t0 = performance.now();
      await until(
        'registered again once the driver is there',
        async () => {
          const s = await registered();
          return s.registrations.length > registrations ? s : undefined;
        },
        120000,
      );
      timed(t, 'driver installed → registered (NVML retried with backoff)', performance.now() - t0);
      assert.equal(await mainPid(), pid, 'the same process waited for the driver');
      assert.equal(Number((await show('NRestarts')).NRestarts), restarts, 'no restart');
      assert.match(await statusIs(OK_STATUS), OK_STATUS);
    },
  );

  test(
    'a configuration error (a typo in the environment file) stops the ' +
      'unit at once: exit 2, failed, not restarted, STATUS naming the problem',
    async (t) => {
      const restarts = Number((await show('NRestarts')).NRestarts);
      await box().run(`echo 'HEALTH_PROBE_INTERVAL=0x10' >> ${ENV_FILE.deb}`);
      try {
        const t0 = performance.now();
        const r = await box().sh(`systemctl restart ${UNIT}`, { timeoutMs: 120000 });
        assert.notEqual(r.code, 0, 'the start fails');
        const u = await until('the unit failed', async () => {
          const s = await show('ActiveState', 'SubState', 'Result', 'ExecMainStatus', 'StatusText', 'NRestarts');
          return s.ActiveState === 'failed' ? s : undefined;
        });
        timed(t, 'configuration error → failed', performance.now() - t0);
        assert.equal(u.Result, 'exit-code', JSON.stringify(u));
        assert.equal(u.ExecMainStatus, '2', JSON.stringify(u));
        assert.equal(Number(u.NRestarts), restarts, 'RestartPreventExitStatus=2: no restart');
        assert.match(
          u.StatusText ?? '',
          new RegExp(
            '^configuration error: environment variable HEALTH_PROBE_INTERVAL: ' +
              '"0x10" is not a duration; expected a decimal number of seconds',
          ),
          JSON.stringify(u),
        );
        const lines = (await journal()).filter((l) => /HEALTH_PROBE_INTERVAL/.test(l));
        assert.equal(lines.length, 1, lines.join('\n'));
        assert.match(
          lines[0]!,
          /^gpu-device-plugin: environment variable HEALTH_PROBE_INTERVAL: "0x10" is not a duration/,
        );
      } finally {
        await box().run(`sed -i '/^HEALTH_PROBE_INTERVAL=0x10$/d' ${ENV_FILE.deb} && systemctl restart ${UNIT}`, {
          timeoutMs: 120000,
        });
      }
      await registered();
      assert.match(await statusIs(OK_STATUS), OK_STATUS);
    },
  );

  test('purge leaves nothing behind', async (t) => {
    const t0 = performance.now();
    await stopKubelet();
    // The drop-in and the config file are the operator's (this test's), not the package's: removed first.
    await box().run(
      `rm -rf /etc/systemd/system/${UNIT}.d ${CONFIG} && rmdir ` +
        `$(dirname ${CONFIG}) && ${node!.apt} purge ${PACKAGE} 2>&1`,
      { timeoutMs: 120000 },
    );
    timed(t, 'apt-get purge', performance.now() - t0);
    const left = await box().run(
      `find / -xdev \\( -path /proc -o -path /sys -o -path ${OPT} \\) -prune -o -name ` +
        `'*gpu-device-plugin*' -print; find /run /dev/shm -name '*gpu-device-plugin*'`,
    );
    assert.equal(left.trim(), '', `left behind:\n${left}`);
    assert.equal((await show('LoadState')).LoadState, 'not-found');
    assert.equal(
      (await box().sh(`dpkg-query -W -f '\${db:Status-Status}' ${PACKAGE} 2>/dev/null`)).stdout.replace(
        'not-installed',
        '',
      ),
      '',
    );
    // (minbase has no pgrep)
    const procs = await box().sh('ls -l /proc/[0-9]*/exe 2>/dev/null | grep /usr/bin/gpu-device-plugin');
    assert.equal(procs.code, 1, `a process left: ${procs.stdout}`);
  });
});
