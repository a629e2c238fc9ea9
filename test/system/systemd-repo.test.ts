// The node-maintenance upgrade from the signed apt repository, under a real systemd (Debian 12 in
// systemd-nspawn, booted by test/system/packaged-node.ts), as README.md "Install from the repository" tells an
// operator: the repository (build/repo.ts, signed with a throw-away key) served over HTTP on the
// container's loopback, the keyring in /etc/apt/keyrings named by signed-by, apt-get update verifying
// it, version N installed and held; then the maintenance: the plugin (N+1) and the kubelet upgraded in
// one apt-get transaction, both held again. The kubelet is a stand-in package built here with dpkg-deb
// (its unit runs test/system/kubelet-main.ts; its postinst restarts it, as a kubelet package upgrade
// is followed by a kubelet restart), published in a repository of its own as the kubelet's is.
//
// What the operator sees is checked: the plugin re-registers with the new kubelet within seconds,
// systemd's STATUS goes through "waiting for the kubelet" back to "registered", and the plugin's
// journal holds no warning (that an upgrade leaves the MPS unit alone is systemd-mps.test.ts's).
// Needs root, like the other real-systemd tests.
import { after, before, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { execFileSync } from 'node:child_process';
import { chmodSync, mkdirSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { PACKAGE, packageVersion } from '../../build/package.ts';
import { DEB_KEY, SUITE, buildRepository, channelOf, stopAgent, throwawayKey } from '../../build/repo.ts';
import type { Container } from './container.ts';
import type { StandInState } from './kubelet-main.ts';
import { journalOnFailure } from './journal-on-failure.ts';
import { OPT, type PackagedNode, UNIT, VERSION, bootWithPackage } from './packaged-node.ts';
import { LiveUnit, timer } from './unit.ts';

const DIR = '/var/lib/kubelet/device-plugins';
const STATE = '/run/kubelet-standin.json';
const SRV = '/srv/repo';
const PORT = 8080;
const LIB = '/usr/local/lib/gdp-test';
const STATUS_LOG = '/run/gdp-status-seq';
const GPUS = 8;
/** N+1: the next patch release, in the same channel. */
const NEXT = VERSION.replace(/\.(\d+)$/, (_, p: string) => `.${Number(p) + 1}`);
const KUBELET = ['1.37.0-1.1', '1.37.1-1.1'] as const;
const OK_STATUS = new RegExp(`^registered; ${GPUS} of ${GPUS} GPUs healthy$`);

/** The apt source of a repository served on the container's loopback, its key named by signed-by. */
const aptSource = (key: string, channel: string): string =>
  `deb [signed-by=/etc/apt/keyrings/${key}.asc] http://127.0.0.1:${PORT}/${channel}/deb ${SUITE} main\n`;

/** A static file server for the repository tree (what any web server or object store does). */
const SERVER = `
const http = require('node:http');
const fs = require('node:fs');
const path = require('node:path');
const [root, port] = process.argv.slice(2);
http
  .createServer((req, res) => {
    const rel = path.posix.normalize(decodeURIComponent(new URL(req.url, 'http://x').pathname));
    const file = path.join(root, rel);
    fs.stat(file, (err, st) => {
      if (err !== null || !st.isFile() || !file.startsWith(root + '/')) {
        res.writeHead(404).end();
        return;
      }
      res.writeHead(200, { 'Content-Length': st.size, 'Last-Modified': st.mtime.toUTCString() });
      if (req.method === 'HEAD') res.end();
      else fs.createReadStream(file).pipe(res);
    });
  })
  .listen(Number(port), '127.0.0.1', () => console.log('serving ' + root));
`;

/** Records each new StatusText of the plugin's unit, one a line, for the sequence the upgrade goes through. */
const RECORDER = `#!/bin/sh
last=
while :; do
  s=$(systemctl show -p StatusText --value ${UNIT})
  if [ "$s" != "$last" ]; then echo "$s" >> ${STATUS_LOG}; last=$s; fi
done
`;

let node: PackagedNode | undefined;
/** The throw-away signing key's folder: its own, as its gpg-agent is stopped before the folder goes. */
let keyDir: string | undefined;
let key: ReturnType<typeof throwawayKey> | undefined;
const timings: string[] = [];
const timed = timer(timings);

function box(): Container {
  if (node === undefined) throw new Error('the container did not boot (see the first failure)');
  return node.container;
}

const plugin = new LiveUnit(box, UNIT, PACKAGE, ['kubelet.service']);
const { until, journal, journalCursor, mainPid, statusIs } = plugin;
const kubelet = new LiveUnit(box, 'kubelet.service', 'node');

async function standIn(): Promise<StandInState | null> {
  const r = await box().sh(`cat ${STATE} 2>/dev/null`);
  return r.code === 0 && r.stdout !== '' ? (JSON.parse(r.stdout) as StandInState) : null;
}

/** The kubelet of MainPID pid has the plugin registered and lists every GPU healthy. */
function registeredWith(pid: number): Promise<StandInState> {
  return until(`the kubelet (PID ${pid}) sees ${GPUS} healthy devices`, async () => {
    const s = await standIn();
    return s !== null &&
      s.pid === pid &&
      s.registrations.length > 0 &&
      !s.streamBroken &&
      s.devices?.length === GPUS &&
      s.devices.every((d) => d.health === 'Healthy')
      ? s
      : undefined;
  });
}

/** The kubelet stand-in as a package: its unit, and a postinst that restarts it on every configure. */
function kubeletDeb(version: string, out: string): string {
  const root = join(out, `kubelet-${version}`);
  mkdirSync(join(root, 'DEBIAN'), { recursive: true });
  mkdirSync(join(root, 'lib/systemd/system'), { recursive: true });
  writeFileSync(
    join(root, 'DEBIAN/control'),
    `Package: kubelet\nVersion: ${version}\nArchitecture: all\nMaintainer: test ` +
      `<test@example.invalid>\nDescription: kubelet stand-in for the repository upgrade test\n`,
  );
  writeFileSync(
    join(root, 'DEBIAN/postinst'),
    '#!/bin/sh\nset -e\nif [ "$1" = configure ]; then\n  systemctl daemon-reload\n  ' +
      'systemctl enable kubelet.service 2>/dev/null\n  systemctl restart kubelet.service\nfi\n',
  );
  chmodSync(join(root, 'DEBIAN/postinst'), 0o755);
  writeFileSync(
    join(root, 'lib/systemd/system/kubelet.service'),
    `[Unit]\nDescription=kubelet stand-in ${version}\n\n[Service]\n` +
      `ExecStart=${OPT}/node ${OPT}/kubelet.cjs ${DIR} ${STATE}\n\n[Install]\nWantedBy=multi-user.target\n`,
  );
  const deb = join(out, `kubelet_${version}_all.deb`);
  execFileSync('dpkg-deb', ['--root-owner-group', '-Znone', '--build', root, deb], { stdio: 'ignore' });
  return deb;
}

describe('the node-maintenance upgrade from the signed apt repository, under a real systemd', {
  concurrency: false,
}, () => {
  journalOnFailure(() => node?.container, ['kubelet.service', 'repo-http.service', 'gdp-status-recorder.service']);

  before(async () => {
    keyDir = mkdtempSync(join(tmpdir(), 'gdp-systemd-repo-key-'));
    // Made while the packages build; after() stops its agent, whether or not the boot came to use it.
    key = throwawayKey(keyDir);
    key.catch(() => undefined);
    const signed = key;
    const channel = channelOf(VERSION);
    node = await bootWithPackage({
      name: 'repo',
      bundles: { kubelet: 'kubelet-main.ts' },
      otherVersions: [NEXT],
      tools: ['apt-ftparchive', 'gpg'],
      install: false,
      timings,
      beforeBoot: async ({ debs, dir }) => {
        const t0 = performance.now();
        const srv = join(dir, 'srv');
        const signing = { armoredKeyFile: (await signed).secretKeyFile };
        await buildRepository({ packages: [VERSION, NEXT].map((v) => debs.get(v)!), outDir: srv, signing });
        // The kubelet comes from a repository of its own (the project's does not carry it).
        await buildRepository({
          packages: KUBELET.map((v) => kubeletDeb(v, dir)),
          outDir: srv,
          signing,
          channel: 'kubernetes',
          origin: 'kubelet-standin',
        });
        timings.push(`repositories in ${((performance.now() - t0) / 1000).toFixed(1)} s`);
        return {
          bindRo: [[srv, SRV]],
          files: {
            // The container has no network: Debian's own sources would fail apt-get update.
            '/etc/apt/sources.list': '',
            // As README.md tells: the repository's key under /etc/apt/keyrings, named by signed-by.
            '/etc/apt/keyrings/gpu-device-plugin.asc': readFileSync(join(srv, channel, 'deb', DEB_KEY)),
            '/etc/apt/sources.list.d/gpu-device-plugin.list': aptSource('gpu-device-plugin', channel),
            '/etc/apt/keyrings/kubelet-standin.asc': readFileSync(join(srv, 'kubernetes', 'deb', DEB_KEY)),
            '/etc/apt/sources.list.d/kubelet-standin.list': aptSource('kubelet-standin', 'kubernetes'),
            [`${LIB}/serve.cjs`]: SERVER,
            [`${LIB}/record-status.sh`]: RECORDER,
          },
        };
      },
    });
    const t0 = performance.now();
    const http = new LiveUnit(box, 'repo-http.service', 'node');
    await box().run(`systemd-run --unit repo-http --quiet ${OPT}/node ${LIB}/serve.cjs ${SRV} ${PORT}`);
    await http.until('the repository served on loopback', async () =>
      (await http.journal()).some((l) => l === `serving ${SRV}`) ? true : undefined,
    );
    timings.push(`repository served in ${((performance.now() - t0) / 1000).toFixed(1)} s`);
  });

  after(async () => {
    try {
      await node?.teardown();
    } finally {
      const k = await key?.catch(() => undefined);
      if (k !== undefined) await stopAgent(k.home);
      if (keyDir !== undefined) rmSync(keyDir, { recursive: true, force: true });
      if (timings.length > 0) process.stderr.write(`repository upgrade test timings:\n  ${timings.join('\n  ')}\n`);
    }
  });

  test('apt-get update verifies both repositories over HTTP with signed-by', async (t) => {
    const t0 = performance.now();
    const out = await box().run(`${node!.apt} update 2>&1`, { timeoutMs: 120000 });
    timed(t, 'apt-get update', performance.now() - t0);
    assert.match(out, new RegExp(`Get:\\d+ http://127.0.0.1:${PORT}/${channelOf(VERSION)}/deb ${SUITE} InRelease`));
    assert.match(out, new RegExp(`Get:\\d+ http://127.0.0.1:${PORT}/kubernetes/deb ${SUITE} InRelease`));
    assert.doesNotMatch(out, /^(W|E|Err):?/m, out);
    const policy = await box().run(`apt-cache policy ${PACKAGE}`);
    assert.match(policy, new RegExp(`Candidate: ${packageVersion(NEXT).replace(/\./g, '\\.')}$`, 'm'), policy);
  });

  test(
    'version N and the kubelet installed from the repository ' +
      'and held: registered, "registered; 8 of 8 GPUs healthy"',
    async (t) => {
      const t0 = performance.now();
      const out = await box().run(
        `${node!.apt} install ${PACKAGE}=${packageVersion(VERSION)} ` +
          `kubelet=${KUBELET[0]} 2>&1 && apt-mark hold ${PACKAGE} kubelet`,
        { timeoutMs: 240000 },
      );
      assert.doesNotMatch(out, /^(W|E):/m, out);
      await registeredWith(await kubelet.mainPid());
      assert.match(await statusIs(OK_STATUS), OK_STATUS);
      timed(t, 'install N and the kubelet → registered', performance.now() - t0);
      const held = await box().run(`apt-get -s upgrade 2>&1`);
      assert.match(held, /kept back|held back/, held);
      assert.match(held, /^0 upgraded/m, held);
    },
  );

  test(
    'the maintenance upgrade: plugin N+1 and the kubelet in one apt-get transaction; re-registered ' +
      'within seconds, STATUS through "waiting for the kubelet" back to "registered", no warning',
    async (t) => {
      const pluginPid = await mainPid();
      const kubeletPid = await kubelet.mainPid();
      const mark = await journalCursor();
      await box().run(`systemd-run --unit gdp-status-recorder --quiet sh ${LIB}/record-status.sh`);
      await until('the STATUS recorder', async () =>
        (await box().sh(`cat ${STATUS_LOG}`)).stdout.split('\n').some((l) => OK_STATUS.test(l)) ? true : undefined,
      );
      const t0 = performance.now();
      const out = await box().run(
        `apt-mark unhold ${PACKAGE} kubelet && ${node!.apt} install ${PACKAGE}=${packageVersion(NEXT)} ` +
          `kubelet=${KUBELET[1]} 2>&1 && apt-mark hold ${PACKAGE} kubelet`,
        { timeoutMs: 240000 },
      );
      const aptMs = performance.now() - t0;
      assert.match(
        out,
        new RegExp(`Unpacking ${PACKAGE} \\(${packageVersion(NEXT).replace(/\./g, '\\.')}\\) over`),
        out,
      );
      assert.match(out, new RegExp(`Unpacking kubelet \\(${KUBELET[1].replace(/\./g, '\\.')}\\) over`), out);
      assert.doesNotMatch(out, /^(W|E):/m, out);
      const newKubelet = await kubelet.mainPid();
      assert.notEqual(newKubelet, kubeletPid, 'the kubelet restarted');
      await registeredWith(newKubelet);
      await statusIs(OK_STATUS);
      const ms = performance.now() - t0;
      timed(t, 'apt-get install (both packages)', aptMs);
      timed(t, 'upgrade started → registered with the new kubelet', ms);
      assert.ok(ms - aptMs < 10000, `registered ${((ms - aptMs) / 1000).toFixed(1)} s after apt-get returned`);
      assert.notEqual(await mainPid(), pluginPid, 'the plugin restarted with the new package');
      assert.equal(await box().run(`dpkg-query -W -f '\${Version}' ${PACKAGE}`), packageVersion(NEXT));
      assert.equal((await box().run('apt-mark showhold')).trim().split('\n').sort().join(' '), `${PACKAGE} kubelet`);

      await box().run('systemctl stop gdp-status-recorder');
      const seq = (await box().run(`cat ${STATUS_LOG}`)).trim().split('\n');
      const upgrade = seq.slice(seq.findIndex((l) => OK_STATUS.test(l)) + 1);
      const waiting = upgrade.findIndex((l) => /^waiting for the kubelet/.test(l));
      assert.ok(waiting >= 0, `STATUS never said "waiting for the kubelet":\n${seq.join('\n')}`);
      assert.match(upgrade.at(-1) ?? '', OK_STATUS, seq.join('\n'));
      t.diagnostic(`STATUS sequence: ${upgrade.join(' → ')}`);

      const lines = await journal(mark);
      assert.ok(
        lines.some((l) => /^INFO registered with the kubelet/.test(l)),
        lines.join('\n'),
      );
      const warnings = lines.filter((l) => /^(WARN|ERROR|E |W )/.test(l));
      assert.deepEqual(warnings, [], lines.join('\n'));
      // The plugin's own entries at warning priority or above (systemd's lines about the unit come from
      // PID 1 and are shown, not judged: in these containers every stop logs that cgroup.kill failed).
      const prio = await box().run(
        `journalctl -q -o cat --no-pager -p warning --after-cursor='${mark}' _SYSTEMD_UNIT=${UNIT}`,
      );
      assert.equal(prio.trim(), '', prio);
      const systemd = await box().run(
        `journalctl -q -o cat --no-pager -p warning --after-cursor='${mark}' UNIT=${UNIT}`,
      );
      if (systemd.trim() !== '') t.diagnostic(`systemd about the unit: ${systemd.trim().split('\n').join(' | ')}`);
    },
  );
});
