// The per-node kubelet API mode: the options and their refusals, the kubeconfig summary,
// the sandbox's network rules, and `check`'s lines in DRA mode and about the other mode, run
// in-process against a unit, drop-ins, an environment file, a kubeconfig and CDI specs in a
// temporary directory (NVML absent: the checks that need it say so).
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { mkdirSync, mkdtempSync, readFileSync, rmSync, writeFileSync, chmodSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { OptionError } from '../../src/config/errors.ts';
import { checkKubeletApi } from '../../src/config/kubelet-api.ts';
import { parseOptions } from '../../src/config/parse-options.ts';
import { kubeconfigSummary } from '../../src/cli/check-kubeconfig.ts';
import { toolkitCdiCheck } from '../../src/cli/check-toolkit-cdi.ts';
import { LINK_DROPIN } from '../../src/cli/dra-install.ts';
import { resolveKubeconfig } from '../../src/k8s/kubeconfig.ts';
import { cdiDeviceId } from '../../src/core/dra-cdi.ts';
import { cdiSpecDirs, readCdiSpecs } from '../../src/dra/cdi.ts';
import { stringify } from 'yaml';
import { SHIPPED_UNIT, parseUnitSandbox, readableInSandbox, writableInSandbox } from '../../src/cli/sandbox.ts';
import { ipEntryCovers, networkInSandbox, parseIp } from '../../src/cli/sandbox-network.ts';
import { runChecks } from '../../src/cli/check.ts';
import { checkExitCode, formatChecks } from '../../src/cli/check-report.ts';
import type { CheckLine } from '../../src/cli/check-report.ts';
import type { NodeReport } from '../../src/cli/inspect.ts';
import { stderrLogger } from '../../src/system/log.ts';

const ROOT = join(import.meta.dirname, '..', '..');
const UNIT_TEXT = readFileSync(join(ROOT, 'systemd', 'gpu-device-plugin.service'), 'utf8');
const DROPIN_TEXT = readFileSync(join(ROOT, 'systemd', 'dra.conf'), 'utf8');
const host = (name: string) => ({ hostname: () => name });

function refused(argv: string[], env: Record<string, string>, re: RegExp, deps = host('gpu-node-1')): void {
  assert.throws(
    () => parseOptions(argv, env, deps),
    (e: unknown) => e instanceof OptionError && re.test(e.message),
    `${argv.join(' ')} ${JSON.stringify(env)}: ${re}`,
  );
}

test('the mode options: defaults, names from every source, and the device-plugin mode untouched by them', () => {
  const d = parseOptions([], {}, host('GPU-Node-1'));
  assert.equal(d.options.kubeletApi, 'device-plugin');
  assert.equal(d.options.kubeconfig, null);
  assert.equal(d.options.nodeName, 'gpu-node-1', 'the host name, lower case, as the kubelet takes it');
  assert.equal(d.options.draDriverName, 'gpu.nvidia.com');
  assert.equal(d.options.kubeletPluginsRegistry, '/var/lib/kubelet/plugins_registry');
  assert.equal(d.options.kubeletPluginsDir, '/var/lib/kubelet/plugins');
  const dra = parseOptions(
    [],
    {
      KUBELET_API: 'dra',
      KUBECONFIG: '/etc/gpu-device-plugin/kubeconfig',
      NODE_NAME: 'n7.example',
      DRA_DRIVER_NAME: 'gpu.example.com',
    },
    host('x'),
  );
  assert.deepEqual(
    [dra.options.kubeletApi, dra.options.kubeconfig, dra.options.nodeName, dra.options.draDriverName],
    ['dra', '/etc/gpu-device-plugin/kubeconfig', 'n7.example', 'gpu.example.com'],
  );
  assert.equal(dra.origins.kubeletApi, 'environment');
  const file = parseOptions(
    ['--config-file=/c.yaml'],
    {},
    { ...host('x'), readFile: () => 'version: v1\nflags:\n  kubeletApi: dra\n  kubeconfig: /etc/k\n' },
  );
  assert.equal(file.options.kubeletApi, 'dra');
  // DRA options set while the node stays on the device plugin: accepted (a switch can be prepared).
  assert.equal(
    parseOptions(['--kubeconfig=/etc/k', '--dra-driver-name=gpu.example.com'], {}, host('x')).options.kubeletApi,
    'device-plugin',
  );
  // An unusable host name matters only in DRA mode.
  assert.equal(parseOptions([], {}, host('under_score')).options.nodeName, 'under_score');
});

test("the mode's refusals, each naming what was wrong and what would be right", () => {
  refused(['--kubelet-api=both'], {}, /--kubelet-api: "both" is not allowed; expected one of device-plugin, dra/);
  refused(
    ['--kubelet-api=dra'],
    {},
    /^--kubelet-api=dra needs --kubeconfig \(KUBECONFIG\).*dra\/README\.md says how to make one/,
  );
  refused([], { KUBELET_API: 'dra' }, /^KUBELET_API=dra needs --kubeconfig/);
  refused(['--config-file=/c.yaml'], {}, /^flags\.kubeletApi: dra \(config file \/c\.yaml\) needs --kubeconfig/, {
    ...host('n'),
    readFile: () => 'version: v1\nflags:\n  kubeletApi: dra\n',
  } as never);
  refused(['--kubeconfig=etc/k'], {}, /--kubeconfig: "etc\/k" is not an absolute path/);
  refused(
    ['--dra-driver-name=GPU.nvidia.com'],
    {},
    new RegExp(
      '--dra-driver-name: "GPU.nvidia.com" is not a driver name ' +
        String.raw`\(a DNS subdomain of at most 63 characters\): the part "GPU"`,
    ),
  );
  refused([`--dra-driver-name=${'a'.repeat(30)}.${'b'.repeat(30)}.com`], {}, /65 characters, at most 63 allowed/);
  refused(
    [],
    { DRA_DRIVER_NAME: 'gpu..nvidia.com' },
    /environment variable DRA_DRIVER_NAME: .*an empty part between dots/,
  );
  refused(['--node-name=node_1'], {}, /--node-name: "node_1" is not a node name/);
  refused(
    ['--kubelet-api=dra', '--kubeconfig=/etc/k'],
    {},
    /the host name "under_score" is not a valid node name .*set --node-name \(NODE_NAME\)/,
    host('under_score'),
  );
  refused(
    ['--kubelet-api=dra', '--kubeconfig=/etc/k', '--config-file=/c.yaml'],
    {},
    /does not serve shared GPUs: sharing\.timeSlicing in \/c\.yaml .*keep this node on --kubelet-api=device-plugin/,
    {
      ...host('n'),
      readFile: () =>
        'version: v1\nsharing:\n  timeSlicing:\n    resources:\n      - name: nvidia.com/gpu\n        replicas: 2\n',
    } as never,
  );
  refused(
    ['--kubelet-api=dra', '--kubeconfig=/etc/k', '--device-list-strategy=cdi-cri'],
    {},
    /--device-list-strategy is set, but only the device-plugin API uses it.*CDI devices/,
  );
  refused(
    ['--kubelet-api=dra', '--kubeconfig=/etc/k'],
    { DEVICE_LIST_STRATEGY: 'envvar', PASS_DEVICE_SPECS: 'true' },
    /DEVICE_LIST_STRATEGY \(environment\), PASS_DEVICE_SPECS \(environment\) are set/,
  );
  // MPS (sharing.mps) is refused like time-slicing.
  const dra = parseOptions(['--kubelet-api=dra', '--kubeconfig=/etc/k'], {}, host('n'));
  const mps = {
    ...dra,
    sharing: { timeSlicing: null, mps: { renameByDefault: false, failRequestsGreaterThanOne: false, resources: [] } },
  } as unknown as typeof dra;
  assert.throws(
    () => checkKubeletApi(mps),
    /^OptionError: --kubelet-api=dra does not serve shared GPUs: sharing\.mps in the config file/,
  );
  assert.doesNotThrow(() => checkKubeletApi(dra));
  // What only names things, or matters only with what is refused anyway, may stay for a switch back.
  const ok = parseOptions(
    [
      '--kubelet-api=dra',
      '--kubeconfig=/etc/k',
      '--kubelet-socket=/k/kubelet.sock',
      '--cdi-annotation-prefix=x/',
      '--shared-devices-allocation-policy=packed',
    ],
    {},
    host('n'),
  );
  assert.equal(ok.options.kubeletApi, 'dra');
});

test(
  "the kubeconfig summary (through the daemon's own loader, src/k8s): " +
    'context, server, CA and credentials, relative files resolved; each gap named',
  () => {
    const kc = (
      user: object,
      cluster: object = { server: 'https://10.0.0.10:6443', 'certificate-authority': 'pki/ca.crt' },
      extra: object = {},
    ) => ({
      apiVersion: 'v1',
      kind: 'Config',
      'current-context': 'node',
      contexts: [{ name: 'node', context: { cluster: 'c', user: 'u' } }],
      clusters: [{ name: 'c', cluster }],
      users: [{ name: 'u', user }],
      ...extra,
    });
    const summary = (doc: unknown, file: string): ReturnType<typeof kubeconfigSummary> =>
      kubeconfigSummary(resolveKubeconfig(typeof doc === 'string' ? doc : stringify(doc), file));
    const s = summary(
      kc({ 'client-certificate': '/etc/gdp/client.crt', 'client-key': 'client.key' }),
      '/etc/gdp/kubeconfig',
    );
    assert.ok(!('problem' in s));
    assert.deepEqual(
      [s.host, s.port, s.ca, s.credentials],
      ['10.0.0.10', 6443, 'CA /etc/gdp/pki/ca.crt', 'client certificate (files)'],
    );
    assert.deepEqual(
      s.files.map((f) => f.path),
      ['/etc/gdp/pki/ca.crt', '/etc/gdp/client.crt', '/etc/gdp/client.key'],
    );
    const v6 = summary(kc({ token: 't' }, { server: 'https://[fd00::1]' }), '/k');
    assert.ok(
      !('problem' in v6) &&
        v6.host === 'fd00::1' &&
        v6.port === 443 &&
        v6.credentials === 'bearer token' &&
        v6.ca === "the system's CA roots",
    );
    const plain = summary(kc({ token: 't' }, { server: 'http://127.0.0.1:8080' }), '/k');
    assert.ok(
      !('problem' in plain) && plain.port === 8080 && /^plain HTTP, no TLS/.test(plain.ca),
      JSON.stringify(plain),
    );
    assert.deepEqual(summary(kc({}), '/k'), {
      problem:
        'user "u" has no credentials the plugin can use ' +
        '(client-certificate[-data] with client-key[-data], token or tokenFile)',
    });
    // What the daemon refuses, check refuses with the daemon's words.
    const refused: [unknown, RegExp][] = [
      ['x', /\/k is not a kubeconfig: expected a map/],
      [
        { ...kc({ token: 't' }), 'current-context': undefined, contexts: [{ name: 'a', context: {} }] },
        /\/k has no current-context; set one/,
      ],
      [{ ...kc({ token: 't' }), 'current-context': 'other' }, /no context named "other" \(contexts: node\)/],
      [kc({ token: 't' }, {}), /cluster "c" has no server/],
      [kc({ token: 't' }, { server: 'ftp://x' }), /server ftp:\/\/x is neither https:\/\/ nor http:\/\//],
      [kc({ 'client-certificate-data': 'Zm9v' }), /user "u" has a client certificate without its key/],
      [kc({ exec: { command: 'aws' } }), /user "u" uses an exec credential plugin, which this service does not run/],
      [{ ...kc({ token: 't' }), users: [] }, /no user named "u"/],
    ];
    for (const [doc, re] of refused) assert.throws(() => summary(doc, '/k'), re);
  },
);

test(
  "the sandbox's network: the unit alone reaches nothing; with the DRA drop-in " +
    'any address; IPAddressAllow/Deny and families as systemd applies them',
  () => {
    const plain = parseUnitSandbox([UNIT_TEXT]);
    assert.deepEqual(parseUnitSandbox([SHIPPED_UNIT]), plain, "the shipped lines are the unit's");
    assert.deepEqual(networkInSandbox(plain, '10.0.0.10'), {
      reachable: false,
      why: 'PrivateNetwork=yes gives the service only its own loopback interface',
    });
    const dra = parseUnitSandbox([UNIT_TEXT, DROPIN_TEXT]);
    assert.equal(dra.privateNetwork, false);
    assert.deepEqual([...(dra.addressFamilies ?? [])], ['AF_UNIX', 'AF_INET', 'AF_INET6', 'AF_NETLINK']);
    assert.deepEqual(dra.ipAddressDeny, []);
    assert.equal(networkInSandbox(dra, 'api.example.com').reachable, true);
    assert.equal(networkInSandbox(dra, 'fd00::1').reachable, true);
    // The operator's own tightening after the drop-in.
    const tight = parseUnitSandbox([
      UNIT_TEXT,
      DROPIN_TEXT,
      '[Service]\nIPAddressDeny=any\nIPAddressAllow=10.0.0.0/24 localhost\n',
    ]);
    assert.equal(networkInSandbox(tight, '10.0.0.10').reachable, true);
    assert.match(
      JSON.stringify(networkInSandbox(tight, '10.0.1.10')),
      /IPAddressDeny=any covers 10\.0\.1\.10 and no IPAddressAllow= entry/,
    );
    assert.equal(networkInSandbox(tight, 'api.example.com').reachable, 'unknown');
    assert.equal(networkInSandbox(tight, '::1').reachable, true);
    const noInet = parseUnitSandbox([UNIT_TEXT, DROPIN_TEXT, '[Service]\nRestrictAddressFamilies=~AF_INET AF_INET6\n']);
    assert.match(
      JSON.stringify(networkInSandbox(noInet, '10.0.0.1')),
      /does not let the service create AF_INET sockets/,
    );
    const denyList = parseUnitSandbox(['[Service]\nRestrictAddressFamilies=~AF_INET6\n']);
    assert.equal(networkInSandbox(denyList, '10.0.0.1').reachable, true);
    assert.equal(networkInSandbox(denyList, 'fd00::1').reachable, false);
    assert.equal(
      networkInSandbox(parseUnitSandbox(['[Service]\nIPAddressDeny=any\n']), 'api.example.com').reachable,
      false,
    );
    // Addresses and prefixes.
    assert.deepEqual(parseIp('10.1.2.3'), { family: 4, value: 0x0a010203n });
    assert.equal(parseIp('::ffff:10.1.2.3')?.value, 0xffff0a010203n);
    assert.equal(parseIp('fe80::1')?.value, (0xfe80n << 112n) | 1n);
    for (const bad of ['10.1.2', '256.0.0.1', '1::2::3', 'api.example.com', '1:2:3:4:5:6:7:8:9'])
      assert.equal(parseIp(bad), null, bad);
    assert.ok(ipEntryCovers('fe80::/64', parseIp('fe80::abcd')!));
    assert.ok(!ipEntryCovers('10.0.0.0/8', parseIp('11.0.0.1')!));
    assert.ok(ipEntryCovers('any', parseIp('2001:db8::1')!));
    assert.ok(!ipEntryCovers('10.0.0.0/8', parseIp('::1')!), 'families do not mix');
    // The DRA directories: writable with the drop-in only, and only the default driver's.
    assert.equal(writableInSandbox(plain, '/var/lib/kubelet/plugins_registry').writable, false);
    assert.equal(writableInSandbox(dra, '/var/lib/kubelet/plugins_registry').writable, true);
    assert.equal(writableInSandbox(dra, '/var/lib/kubelet/plugins/gpu.nvidia.com').writable, true);
    assert.equal(writableInSandbox(dra, '/var/lib/kubelet/plugins/other.example.com').writable, false);
    // Reading: read-only is fine, hidden and private are not.
    assert.equal(readableInSandbox(plain, '/etc/gpu-device-plugin/kubeconfig').writable, true);
    assert.equal(readableInSandbox(plain, '/root/.kube/config').writable, false);
    assert.equal((readableInSandbox(plain, '/tmp/kubeconfig') as { private?: true }).private, true);
  },
);

function gpuReport(uuids: string[]): NodeReport {
  return {
    library: 'x',
    driverVersion: '550',
    pairs: [],
    mig: null,
    gpus: uuids.map((uuid, index) => ({
      index,
      uuid,
      name: 'Fake',
      minor: index,
      busId: '',
      memoryBytes: 1,
      numaNode: 0,
      health: 'Healthy',
    })),
  } as unknown as NodeReport;
}

test("the toolkit's CDI spec: missing, stale, complete (by UUID or index), unknown without NVML", async () => {
  const dir = mkdtempSync(join(tmpdir(), 'gdp-cdi-'));
  try {
    const env = { CDI_SPEC_DIRS: dir };
    const none = await toolkitCdiCheck(env, gpuReport(['GPU-a']));
    assert.equal(none.status, 'FAIL');
    assert.match(none.detail, /no CDI spec in .* has kind nvidia\.com\/gpu/);
    assert.match(none.fix ?? '', /nvidia-ctk cdi generate/);
    writeFileSync(
      join(dir, 'nvidia.yaml'),
      'cdiVersion: 0.5.0\nkind: nvidia.com/gpu\ndevices:\n  - name: "0"\n  - name: GPU-b\n  - name: all\n',
    );
    assert.equal((await toolkitCdiCheck(env, gpuReport(['GPU-a', 'GPU-b']))).status, 'PASS');
    const stale = await toolkitCdiCheck(env, gpuReport(['GPU-a', 'GPU-x', 'GPU-y']));
    assert.equal(stale.status, 'FAIL');
    assert.match(stale.detail, /GPU 2 \(GPU-y\).*stale/);
    assert.equal((await toolkitCdiCheck(env, null)).status, 'SKIP');
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
});

/** What the daemon's prepare would do with each whole GPU of `report`: read the specs, look the GPU up. */
async function daemonVerdicts(dirs: readonly string[], report: NodeReport): Promise<('id' | 'error')[]> {
  const specs = await readCdiSpecs(dirs);
  return report.gpus.map((g) => {
    const device = { name: `gpu-${g.minor}`, gpuUuid: g.uuid, gpuIndex: g.index, minor: g.minor };
    return 'id' in cdiDeviceId(device, specs, dirs) ? 'id' : 'error';
  });
}

test("check's CDI line says what the daemon's prepare would do with the toolkit's spec", async () => {
  const dir = mkdtempSync(join(tmpdir(), 'gdp-cdi-'));
  try {
    const env = { CDI_SPEC_DIRS: dir };
    const report = gpuReport(['GPU-a', 'GPU-b']);
    const spec = join(dir, 'nvidia.yaml');
    // nvidia-ctk cdi generate --device-name-strategy=type-index: the daemon prepares gpu0 and gpu1.
    writeFileSync(spec, 'cdiVersion: 0.5.0\nkind: nvidia.com/gpu\ndevices:\n  - name: gpu0\n  - name: gpu1\n');
    assert.deepEqual(await daemonVerdicts([dir], report), ['id', 'id']);
    const typeIndex = await toolkitCdiCheck(env, report);
    assert.equal(typeIndex.status, 'PASS', typeIndex.detail);
    // Named by index, but GPU 1's entry holds GPU 0's device node: the daemon refuses it as stale.
    writeFileSync(
      spec,
      [
        'cdiVersion: 0.5.0',
        'kind: nvidia.com/gpu',
        'devices:',
        '  - name: "0"',
        '    containerEdits: { deviceNodes: [{ path: /dev/nvidia0 }] }',
        '  - name: "1"',
        '    containerEdits: { deviceNodes: [{ path: /dev/nvidia0 }] }',
        '',
      ].join('\n'),
    );
    assert.deepEqual(await daemonVerdicts([dir], report), ['id', 'error']);
    const stale = await toolkitCdiCheck(env, report);
    assert.equal(stale.status, 'FAIL', stale.detail);
    assert.match(stale.detail, /device 1 has \/dev\/nvidia0, but GPU 1 \(GPU-b\) is \/dev\/nvidia1/);
    assert.match(stale.fix ?? '', /nvidia-ctk cdi generate/);
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
});

test(
  'check reads the CDI spec directories the daemon ' + 'reads: an empty $CDI_SPEC_DIRS list means the defaults',
  async () => {
    const dirs = cdiSpecDirs({ CDI_SPEC_DIRS: ':' });
    assert.deepEqual(dirs, ['/etc/cdi', '/var/run/cdi']);
    // Whatever this host has there, the line names where it looked (or the spec it found there).
    const line = await toolkitCdiCheck({ CDI_SPEC_DIRS: ':' }, gpuReport(['GPU-a']));
    assert.ok(
      dirs.some((d) => line.detail.includes(`${d}/`) || line.detail.includes(` ${d} `)),
      line.detail,
    );
  },
);

/** A node in a directory: a unit (with drop-ins), an environment file, a kubeconfig, the kubelet's directories. */
function node(
  dropins: Record<string, string>,
  env: string,
  opts: { kubeconfig?: string } = {},
): { dir: string; run: (extra?: string[], probe?: string | null) => Promise<CheckLine[]> } {
  const dir = mkdtempSync(join(tmpdir(), 'gdp-dra-'));
  const unitDir = join(dir, 'root', 'etc', 'systemd', 'system');
  mkdirSync(join(unitDir, 'gpu-device-plugin.service.d'), { recursive: true });
  writeFileSync(join(unitDir, 'gpu-device-plugin.service'), UNIT_TEXT);
  // Files of the test live in /tmp: the test's own drop-in lets the sandbox see them.
  const all = {
    ...dropins,
    'zz-test.conf':
      `[Service]\nPrivateTmp=no\n` +
      `ReadWritePaths=${dir}/registry ${dir}/plugins/gpu.nvidia.com ${dir}/dp ${dir}/run\n`,
  };
  for (const [name, text] of Object.entries(all))
    writeFileSync(join(unitDir, 'gpu-device-plugin.service.d', name), text);
  for (const d of ['registry', 'plugins', 'dp', 'run', 'cdi']) mkdirSync(join(dir, d));
  writeFileSync(join(dir, 'env'), env.replaceAll('@', dir));
  const kc = join(dir, 'kubeconfig');
  writeFileSync(
    kc,
    opts.kubeconfig ??
      'apiVersion: v1\nkind: Config\ncurrent-context: n\ncontexts: [{name: n, context: ' +
        '{cluster: c, user: u}}]\nclusters: [{name: c, cluster: {server: "https://10.0.0.10:6443", ' +
        'certificate-authority-data: Zm9v}}]\nusers: [{name: u, user: {token: abc}}]\n',
  );
  chmodSync(kc, 0o600);
  return {
    dir,
    run: async (extra = [], probe = null) =>
      (
        await runChecks(
          [
            '--env-file',
            join(dir, 'env'),
            `--kubelet-socket=${dir}/dp/kubelet.sock`,
            `--kubelet-plugins-registry=${dir}/registry`,
            `--kubelet-plugins-dir=${dir}/plugins`,
            '--driver-root=/nonexistent',
            ...extra,
          ],
          {
            SYSTEMD_UNIT_ROOT: join(dir, 'root'),
            CDI_SPEC_DIRS: join(dir, 'cdi'),
            RUNTIME_DIRECTORY: join(dir, 'run'),
            NODE_NAME: 'node-1',
            PATH: process.env.PATH ?? '',
          },
          stderrLogger('error'),
          { isRoot: true, tcpProbe: async () => probe },
        )
      ).lines,
  };
}

const line = (lines: readonly CheckLine[], name: string): CheckLine => {
  const l = lines.find((x) => x.name === name);
  assert.ok(l, `a line named ${name} in ${lines.map((x) => x.name).join(', ')}`);
  return l;
};

test('check in DRA mode: each line, from the drop-in missing to everything in place', async () => {
  const bare = node({}, 'KUBELET_API=dra\nKUBECONFIG=@/kubeconfig\n');
  try {
    const lines = await bare.run();
    assert.equal(line(lines, 'config').status, 'PASS');
    assert.equal(line(lines, 'kubeconfig').status, 'PASS');
    assert.match(
      line(lines, 'kubeconfig').detail,
      /context n, server https:\/\/10\.0\.0\.10:6443 \(embedded CA\), user u with a bearer token/,
    );
    const net = line(lines, 'sandbox network');
    assert.equal(net.status, 'FAIL');
    assert.match(net.detail, /PrivateNetwork=yes/);
    assert.equal(net.fix, `link the DRA drop-in: ${LINK_DROPIN}`);
    assert.equal(line(lines, 'api server').status, 'PASS', 'the (faked) TCP probe answered');
    assert.equal(line(lines, 'plugins registry').status, 'PASS', 'the test drop-in makes it writable');
    assert.equal(line(lines, 'plugin directory').status, 'SKIP', 'not there yet: created at start');
    assert.equal(line(lines, 'cdi spec').status, 'FAIL');
    assert.ok(
      !lines.some((l) => l.name === 'socket directory' || l.name === 'kubelet'),
      'no device-plugin socket checks in DRA mode',
    );
    assert.match(
      line(lines, 'device-plugin mode').detail,
      new RegExp(
        String.raw`^device-plugin mode would need: KUBELET_API=device-plugin \(or unset\) ` +
          String.raw`in .*\/env and a restart; .*\/dp writable \(the unit allows it\)`,
      ),
    );
    assert.equal(line(lines, 'device-plugin mode').status, 'INFO');
    assert.equal(checkExitCode(lines), 1);
  } finally {
    rmSync(bare.dir, { recursive: true, force: true });
  }

  const ready = node({ 'dra.conf': DROPIN_TEXT }, 'KUBELET_API=dra\nKUBECONFIG=@/kubeconfig\n');
  try {
    mkdirSync(join(ready.dir, 'plugins', 'gpu.nvidia.com'));
    writeFileSync(
      join(ready.dir, 'cdi', 'nvidia.yaml'),
      'cdiVersion: 0.5.0\nkind: nvidia.com/gpu\ndevices:\n  - name: "0"\n',
    );
    const lines = await ready.run([], null);
    assert.equal(line(lines, 'sandbox network').status, 'PASS');
    assert.equal(line(lines, 'plugin directory').status, 'PASS');
    assert.equal(
      line(lines, 'cdi spec').status,
      'SKIP',
      'NVML is absent here, so whether it names the GPUs is not known',
    );
    const down = await ready.run([], 'connect ECONNREFUSED 10.0.0.10:6443');
    assert.equal(line(down, 'api server').status, 'FAIL');
    assert.match(line(down, 'api server').detail, /10\.0\.0\.10:6443: connect ECONNREFUSED/);
    // INFO lines are shown, and not counted as checks.
    const all = await ready.run();
    const text = formatChecks({
      lines: all,
      parsed: parseOptions([], {}),
      origins: {} as never,
      envFiles: [],
      unit: { source: 'x', files: [] },
    });
    assert.match(text, /^INFO {2}device-plugin mode/m);
    assert.match(text, new RegExp(`\\d+ of ${all.filter((l) => l.status !== 'INFO').length} checks failed`));
  } finally {
    rmSync(ready.dir, { recursive: true, force: true });
  }
});

test(
  'check in DRA mode: a kubeconfig that is missing, unparseable, ' +
    'incomplete, hidden from the service or readable by others',
  async () => {
    // The kubeconfig's line, and the API server's: tried when the kubeconfig names one.
    const cases: [string, string | undefined, RegExp, CheckLine['status'], CheckLine['status']][] = [
      ['KUBECONFIG=@/nope', undefined, /@\/nope: ENOENT|no such file/i, 'FAIL', 'SKIP'],
      ['KUBECONFIG=@/kubeconfig', 'a: [', /@\/kubeconfig is not a kubeconfig: Flow sequence/, 'FAIL', 'SKIP'],
      [
        'KUBECONFIG=@/kubeconfig',
        'apiVersion: v1\nkind: Config\ncurrent-context: n\ncontexts: [{name: n, context: ' +
          '{cluster: c, user: u}}]\nclusters: [{name: c, cluster: {server: "https://h:6443"}}]\n' +
          'users: [{name: u, user: {client-certificate: missing.crt, client-key: missing.key}}]\n',
        /client-certificate .*missing\.crt does not exist; client-key .*missing\.key does not exist/,
        'FAIL',
        'PASS',
      ],
      [
        'KUBECONFIG=/root/.kube/config',
        undefined,
        /\/root\/\.kube\/config: not visible to the service: ProtectHome=yes/,
        'FAIL',
        'SKIP',
      ],
    ];
    for (const [env, text, re, status, api] of cases) {
      const n = node(
        { 'dra.conf': DROPIN_TEXT },
        `KUBELET_API=dra\n${env}\n`,
        text === undefined ? {} : { kubeconfig: text },
      );
      try {
        const l = line(await n.run(), 'kubeconfig');
        assert.equal(l.status, status, env);
        assert.match(
          l.detail,
          new RegExp(re.source.replaceAll('@', n.dir.replace(/[.*+?^${}()|[\]\\]/g, '\\$&')), re.flags),
          env,
        );
        assert.equal(line(await n.run(), 'api server').status, api, env);
      } finally {
        rmSync(n.dir, { recursive: true, force: true });
      }
    }
    const open = node({ 'dra.conf': DROPIN_TEXT }, 'KUBELET_API=dra\nKUBECONFIG=@/kubeconfig\n');
    try {
      chmodSync(join(open.dir, 'kubeconfig'), 0o644);
      const l = line(await open.run(), 'kubeconfig mode');
      assert.equal(l.status, 'WARN');
      assert.match(l.fix ?? '', /chmod 0600/);
    } finally {
      rmSync(open.dir, { recursive: true, force: true });
    }
    // A configuration the daemon refuses is check's config failure (exit 2).
    const noKc = node({}, 'KUBELET_API=dra\n');
    try {
      const lines = await noKc.run();
      assert.equal(line(lines, 'config').status, 'FAIL');
      assert.match(line(lines, 'config').detail, /needs --kubeconfig/);
      assert.equal(checkExitCode(lines), 2);
    } finally {
      rmSync(noKc.dir, { recursive: true, force: true });
    }
  },
);

test('check in device-plugin mode says what DRA would need, and whether the sandbox allows it already', async () => {
  const plain = node({}, '');
  try {
    const l = line(await plain.run(), 'DRA mode');
    assert.equal(l.status, 'INFO');
    assert.match(
      l.detail,
      new RegExp(
        '^to switch this node to DRA: KUBELET_API=dra and KUBECONFIG=<a node-scoped kubeconfig> ' +
          String.raw`in .*\/env; the unit's sandbox does not allow it yet \(no network\): mkdir -p`,
      ),
    );
    assert.match(l.detail, /\/usr\/share\/doc\/gpu-device-plugin\/dra; then systemctl restart gpu-device-plugin/);
    assert.ok(
      (await plain.run()).some((x) => x.name === 'socket directory'),
      'the device-plugin checks run',
    );
  } finally {
    rmSync(plain.dir, { recursive: true, force: true });
  }
  const prepared = node({ 'dra.conf': DROPIN_TEXT }, '');
  try {
    assert.match(line(await prepared.run(), 'DRA mode').detail, /the unit's sandbox already allows it/);
  } finally {
    rmSync(prepared.dir, { recursive: true, force: true });
  }
});
