// Options and the config file: NVIDIA's file in YAML and JSON, every refusal with its key path,
// precedence across the four sources, and NVIDIA's flags that this plugin refuses.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { join } from 'node:path';
import { ConfigError, OptionError } from '../../src/config/errors.ts';
import { OPTION_SPECS } from '../../src/config/option-table.ts';
import { UNSUPPORTED_OPTIONS } from '../../src/config/unsupported-options.ts';
import { helpText } from '../../src/config/describe-options.ts';
import { parseOptions } from '../../src/config/parse-options.ts';
import type { ParsedOptions } from '../../src/config/options.ts';
import { draOf } from '../../src/config/dra-section.ts';
import { planSettings } from '../../src/config/plan-settings.ts';
import { planReload } from '../../src/config/reload.ts';

const FIXTURES = join(import.meta.dirname, '..', 'fixtures', 'config');

/** parseOptions with the config file given as text. */
function withFile(text: string, argv: readonly string[] = [], env: Record<string, string> = {}): ParsedOptions {
  return parseOptions(argv, { CONFIG_FILE: '/etc/gdp/config.yaml', ...env }, { readFile: () => text });
}

function refusedFile(text: string, message: string): void {
  assert.throws(
    () => withFile(text),
    (e: unknown) => {
      if (!(e instanceof ConfigError)) return false;
      assert.equal(e.message, `config file /etc/gdp/config.yaml: ${message}`);
      return true;
    },
    message,
  );
}

test("NVIDIA's config file, YAML and JSON, gives the same options, origins and time-slicing", () => {
  const yaml = parseOptions([], { CONFIG_FILE: join(FIXTURES, 'nvidia-v1.yaml') });
  const json = parseOptions([], { CONFIG_FILE: join(FIXTURES, 'nvidia-v1.json') });
  for (const [p, file] of [
    [yaml, 'nvidia-v1.yaml'],
    [json, 'nvidia-v1.json'],
  ] as const) {
    const o = p.options;
    assert.equal(o.migStrategy, 'none');
    assert.equal(o.failOnInitError, true);
    assert.equal(o.driverRoot, '/');
    assert.equal(o.passDeviceSpecs, true);
    assert.deepEqual(o.deviceListStrategy, ['envvar', 'cdi-annotations']);
    assert.equal(o.deviceIdStrategy, 'uuid');
    assert.equal(o.cdiAnnotationPrefix, 'cdi.k8s.io/');
    assert.equal(o.configFile, join(FIXTURES, file));
    assert.equal(p.origins.passDeviceSpecs, `config file ${join(FIXTURES, file)}`);
    assert.equal(p.origins.configFile, 'environment');
    assert.equal(p.origins.kubeletSocket, 'default');
    assert.deepEqual(p.sharing, {
      timeSlicing: {
        renameByDefault: true,
        failRequestsGreaterThanOne: true,
        resources: [{ name: 'nvidia.com/gpu', rename: null, replicas: 4, devices: { kind: 'all' } }],
      },
    });
    assert.deepEqual([...p.foreignConfigKeys].sort(), ['flags.gfd', 'flags.useNodeFeatureAPI']);
  }
  assert.deepEqual(yaml.options, { ...json.options, configFile: yaml.options.configFile });
});

test('precedence: command line, then environment, then config file, then default; origins say which', () => {
  const file =
    'version: v1\nflags:\n  plugin:\n    deviceIDStrategy: index\n    deviceListStrategy: ' +
    'volume-mounts\n    cdiAnnotationPrefix: file.example/\n  logLevel: warn\n';
  const argv = ['--device-id-strategy=uuid'];
  const env = { DEVICE_ID_STRATEGY: 'index', DEVICE_LIST_STRATEGY: 'cdi-cri', LOG_LEVEL: 'debug' };
  const p = withFile(file, argv, env);
  assert.equal(p.options.deviceIdStrategy, 'uuid');
  assert.equal(p.origins.deviceIdStrategy, 'command line');
  assert.deepEqual(p.options.deviceListStrategy, ['cdi-cri']);
  assert.equal(p.origins.deviceListStrategy, 'environment');
  assert.equal(p.options.cdiAnnotationPrefix, 'file.example/');
  assert.equal(p.origins.cdiAnnotationPrefix, 'config file /etc/gdp/config.yaml');
  assert.equal(p.options.logLevel, 'debug');
  assert.equal(p.options.passDeviceSpecs, false);
  assert.equal(p.origins.passDeviceSpecs, 'default');
  assert.equal(p.origins.configFile, 'environment');
  // --config-file on the command line beats CONFIG_FILE.
  const read: string[] = [];
  parseOptions(
    ['--config-file', '/a.yaml'],
    { CONFIG_FILE: '/b.yaml' },
    {
      readFile: (path) => {
        read.push(path);
        return '';
      },
    },
  );
  assert.deepEqual(read, ['/a.yaml']);
  // No config file: nothing is read.
  parseOptions([], {}, { readFile: () => assert.fail('no file is named') });
});

test('every key of the file reaches its option', () => {
  const p = withFile(
    [
      'flags:',
      '  migStrategy: none',
      '  failOnInitError: false',
      '  nvidiaDriverRoot: /run/nvidia/driver',
      '  nvidiaDevRoot: /',
      '  logLevel: error',
      '  socketCheckInterval: 2',
      '  healthProbeInterval: 1.5s',
      '  healthRecovery: true',
      '  healthRecoveryQuietPeriod: 60',
      '  nfdFeaturesFile: /etc/nfd/gpu',
      '  nfdRemoveOnStop: true',
      '  metricsFile: /var/lib/ne/gpu.prom',
      '  metricsInterval: 30',
      '  podResourcesSocket: /k/pod-resources.sock',
      '  rediscoverInterval: 0',
      '  mpsRoot: /run/mps',
      '  kubeletApi: device-plugin',
      '  kubeconfig: /etc/gdp/kubeconfig',
      '  nodeName: node-7.example',
      '  draDriverName: gpu.example.com',
      '  kubeletPluginsRegistry: /k/registry',
      '  kubeletPluginsDir: /k/plugins',
      '  draMaxClaimsPerGpu: 8',
      '  draMpsShmSize: 2Gi',
      '  draMpsShmTotal: 68719476736',
      '  plugin:',
      '    passDeviceSpecs: true',
      '    deviceListStrategy: cdi-cri',
      '    deviceIDStrategy: index',
      '    cdiAnnotationPrefix: x/',
      '    kubeletSocket: /k/kubelet.sock',
      '    sharedDevicesAllocationPolicy: packed',
      'imex:',
      '  channelIDs: [0]',
      '  required: true',
    ].join('\n'),
  );
  const o = p.options;
  assert.deepEqual(
    { ...o, configFile: null },
    {
      kubeletSocket: '/k/kubelet.sock',
      driverRoot: '/run/nvidia/driver',
      devRoot: '/',
      deviceIdStrategy: 'index',
      deviceListStrategy: ['cdi-cri'],
      passDeviceSpecs: true,
      cdiAnnotationPrefix: 'x/',
      migStrategy: 'none',
      sharedDevicesAllocationPolicy: 'packed',
      failOnInitError: false,
      configFile: null,
      logLevel: 'error',
      socketCheckInterval: 2,
      healthProbeInterval: 1.5,
      healthRecovery: true,
      healthRecoveryQuietPeriod: 60,
      rediscoverInterval: 0,
      imexChannelIds: [0],
      imexRequired: true,
      kubeletApi: 'device-plugin',
      kubeconfig: '/etc/gdp/kubeconfig',
      nodeName: 'node-7.example',
      draDriverName: 'gpu.example.com',
      kubeletPluginsRegistry: '/k/registry',
      kubeletPluginsDir: '/k/plugins',
      draMaxClaimsPerGpu: 8,
      draMpsShmSize: 2 * 1024 ** 3,
      draMpsShmTotal: 64 * 1024 ** 3,
      nfdFeaturesFile: '/etc/nfd/gpu',
      nfdRemoveOnStop: true,
      metricsFile: '/var/lib/ne/gpu.prom',
      metricsInterval: 30,
      podResourcesSocket: '/k/pod-resources.sock',
      mpsRoot: '/run/mps',
    },
  );
  for (const s of OPTION_SPECS) {
    if (s.key === 'configFile') continue;
    assert.equal(p.origins[s.key], 'config file /etc/gdp/config.yaml', s.key);
  }
});

test(
  "YAML 1.1 booleans (yes/no/on/off) as NVIDIA's parser " + 'reads them; JSON is YAML; an empty file sets nothing',
  () => {
    assert.equal(
      withFile('flags:\n  failOnInitError: no\n  plugin:\n    passDeviceSpecs: on\n').options.passDeviceSpecs,
      true,
    );
    assert.equal(withFile('flags:\n  failOnInitError: no\n').options.failOnInitError, false);
    assert.equal(
      withFile(
        '{"flags": {"plugin": {"deviceListStrategy": ["envvar", "volume-mounts"]}}}',
      ).options.deviceListStrategy.join(),
      'envvar,volume-mounts',
    );
    const empty = withFile('# nothing yet\n');
    assert.equal(empty.sharing.timeSlicing, null);
    assert.equal(empty.origins.passDeviceSpecs, 'default');
    assert.equal(withFile('version: v1\nflags:\nsharing:\n').sharing.timeSlicing, null);
  },
);

test('time-slicing entries: names with or without the domain, rename, devices as all, a count or a list', () => {
  const p = withFile(
    [
      'sharing:',
      '  timeSlicing:',
      '    resources:',
      '    - name: gpu',
      '      rename: gpu.ts',
      '      replicas: 2',
      '      devices: [0, "2", GPU-96a13516-8351-38da-1b3b-bd53058e4ee4]',
      '    - name: nvidia.com/gpu',
      '      replicas: 3',
      '      devices: 1',
    ].join('\n'),
  );
  assert.deepEqual(p.sharing.timeSlicing, {
    renameByDefault: false,
    failRequestsGreaterThanOne: false,
    resources: [
      {
        name: 'nvidia.com/gpu',
        rename: 'nvidia.com/gpu.ts',
        replicas: 2,
        devices: {
          kind: 'list',
          refs: [{ index: 0 }, { index: 2 }, { uuid: 'GPU-96a13516-8351-38da-1b3b-bd53058e4ee4' }],
        },
      },
      { name: 'nvidia.com/gpu', rename: null, replicas: 3, devices: { kind: 'count', count: 1 } },
    ],
  });
  assert.deepEqual(
    withFile('sharing:\n  timeSlicing:\n    resources: [{name: gpu, replicas: 2, devices: all}]\n').sharing.timeSlicing
      ?.resources[0]?.devices,
    { kind: 'all' },
  );
});

test('every bad value in the file is refused with its key path, the value and what is allowed', () => {
  const ts = (resource: string, extra = ''): string =>
    `sharing:\n  timeSlicing:\n${extra}    resources:\n    - ${resource}\n`;
  const cases: [string, string][] = [
    ['version: v2\n', 'version: "v2" is not allowed; expected v1'],
    [
      'flag:\n  migStrategy: none\n',
      'flag: unknown key; expected one of version, flags, sharing, resources, imex, health, dra',
    ],
    [
      'flags:\n  plugin:\n    passDeviceSpec: true\n',
      'flags.plugin.passDeviceSpec: unknown key; expected one of kubeletSocket, ' +
        'deviceIDStrategy, deviceListStrategy, passDeviceSpecs, cdiAnnotationPrefix, ' +
        'sharedDevicesAllocationPolicy, nvidiaCTKPath, containerDriverRoot, cdiFeatureFlags',
    ],
    [
      'flags:\n  plugin:\n    deviceIdStrategy: uuid\n',
      'flags.plugin.deviceIdStrategy: unknown key (did you mean deviceIDStrategy? keys are case-sensitive); ' +
        'expected one of kubeletSocket, deviceIDStrategy, deviceListStrategy, passDeviceSpecs, ' +
        'cdiAnnotationPrefix, sharedDevicesAllocationPolicy, nvidiaCTKPath, containerDriverRoot, cdiFeatureFlags',
    ],
    ['flags:\n  failOnInitError: "false"\n', 'flags.failOnInitError: "false" is not allowed; expected true or false'],
    [
      'flags:\n  draMaxClaimsPerGpu: 0\n',
      'flags.draMaxClaimsPerGpu: "0" is not allowed; expected a whole number from 1 to 1024',
    ],
    [
      'flags:\n  draMpsShmSize: 8GB\n',
      'flags.draMpsShmSize: "8GB" is not allowed; expected a size from 1Mi to 1Pi bytes (a quantity: 8Gi, 512Mi, 1e9)',
    ],
    ['flags:\n  plugin: true\n', 'flags.plugin: true is not allowed; expected a mapping of keys to values'],
    [
      'flags:\n  plugin:\n    deviceIDStrategy: serial\n',
      'flags.plugin.deviceIDStrategy: "serial" is not allowed; expected one of uuid, index',
    ],
    [
      'flags:\n  plugin:\n    deviceIDStrategy: 3\n',
      'flags.plugin.deviceIDStrategy: 3 is not allowed; expected a string',
    ],
    [
      'flags:\n  plugin:\n    deviceListStrategy: [envvar, mounts]\n',
      'flags.plugin.deviceListStrategy: "mounts" (in "envvar,mounts") is not allowed; ' +
        'expected one or more of envvar, volume-mounts, cdi-annotations, cdi-cri',
    ],
    [
      'flags:\n  plugin:\n    deviceListStrategy: [envvar, 3]\n',
      'flags.plugin.deviceListStrategy[1]: 3 is not allowed; expected a string',
    ],
    [
      'flags:\n  plugin:\n    deviceListStrategy: []\n',
      'flags.plugin.deviceListStrategy: an empty list is not allowed; expected at least one value',
    ],
    [
      'flags:\n  plugin:\n    sharedDevicesAllocationPolicy: spread\n',
      'flags.plugin.sharedDevicesAllocationPolicy: "spread" is not allowed; expected one of distributed, packed',
    ],
    [
      'flags:\n  plugin:\n    kubeletSocket: kubelet.sock\n',
      'flags.plugin.kubeletSocket: "kubelet.sock" is not an absolute path; expected a path starting with /',
    ],
    ['flags:\n  migStrategy: mixd\n', 'flags.migStrategy: "mixd" is not allowed; expected one of none, single, mixed'],
    [
      'flags:\n  socketCheckInterval: 0\n',
      'flags.socketCheckInterval: "0" is out of range; expected from 0.1 to 3600 seconds',
    ],
    [
      ts('{name: gpu, replicas: 0}'),
      'sharing.timeSlicing.resources[0].replicas: 0 is not allowed; expected an integer from 1 to 1024',
    ],
    [
      ts('{name: gpu, replicas: 2.5}'),
      'sharing.timeSlicing.resources[0].replicas: 2.5 is not allowed; expected an integer from 1 to 1024',
    ],
    [
      ts('{name: gpu, replicas: "4"}'),
      'sharing.timeSlicing.resources[0].replicas: "4" is not allowed; expected an integer from 1 to 1024',
    ],
    [ts('{name: gpu}'), 'sharing.timeSlicing.resources[0].replicas: missing; expected an integer from 1 to 1024'],
    [
      ts('{replicas: 2}'),
      'sharing.timeSlicing.resources[0].name: missing; expected the resource to share, nvidia.com/gpu',
    ],
    [
      ts('{name: nvidia.com/mig-1g, replicas: 2}'),
      'sharing.timeSlicing.resources[0].name: "nvidia.com/mig-1g" is not allowed; expected ' +
        'nvidia.com/gpu (or gpu), or a MIG resource of the mixed strategy such as nvidia.com/mig-1g.10gb',
    ],
    [
      ts('{name: gpu.small, replicas: 2}'),
      'sharing.timeSlicing.resources[0].name: "gpu.small" is not allowed; expected nvidia.com/gpu ' +
        '(or gpu), or a MIG resource of the mixed strategy such as nvidia.com/mig-1g.10gb',
    ],
    [
      ts('{name: gpu, replicas: 2, rename: Shared_GPU}'),
      'sharing.timeSlicing.resources[0].rename: "Shared_GPU" is not a resource name; ' +
        "expected lower-case letters, digits, '-' and '.' after nvidia.com/ (e.g. gpu.shared)",
    ],
    [
      ts('{name: gpu, replicas: 2, devices: some}'),
      'sharing.timeSlicing.resources[0].devices: "some" is not allowed; ' +
        'expected "all", a number of GPUs, or a list of GPU indices or UUIDs',
    ],
    [
      ts('{name: gpu, replicas: 2, devices: 0}'),
      'sharing.timeSlicing.resources[0].devices: 0 is not allowed; ' +
        'a number of GPUs must be a whole number of at least 1',
    ],
    [
      ts('{name: gpu, replicas: 2, devices: []}'),
      'sharing.timeSlicing.resources[0].devices: an empty list selects no GPU; ' +
        'expected at least one GPU index or UUID (leave devices out for all GPUs)',
    ],
    [
      ts('{name: gpu, replicas: 2, devices: [0, "1:0"]}'),
      'sharing.timeSlicing.resources[0].devices[1]: "1:0" is a MIG device; MIG devices are not selected one ' +
        'by one (a MIG resource is time-sliced whole: leave devices out), and GPUs are named by index or GPU UUID',
    ],
    [
      ts('{name: gpu, replicas: 2, devices: [GPU-1]}'),
      'sharing.timeSlicing.resources[0].devices[0]: "GPU-1" is not allowed; expected ' +
        'a GPU index (0, 1, ...) or a GPU UUID (GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx)',
    ],
    [
      ts('{name: gpu, replica: 2}'),
      'sharing.timeSlicing.resources[0].replica: unknown key; expected one of name, rename, replicas, devices',
    ],
    [
      ts('{name: gpu, replicas: 2}', '    renameByDefault: "yes"\n'),
      'sharing.timeSlicing.renameByDefault: "yes" is not allowed; expected true or false',
    ],
    [
      'sharing:\n  timeSlicing:\n    resources: []\n',
      'sharing.timeSlicing.resources: an empty list is not allowed; expected ' +
        'at least one resource, e.g. {name: nvidia.com/gpu, replicas: 4}',
    ],
    [
      'sharing:\n  timeSlicing:\n    renameByDefault: true\n',
      'sharing.timeSlicing.resources: missing; time-slicing needs at ' +
        'least one resource, e.g. [{name: nvidia.com/gpu, replicas: 4}]',
    ],
    [
      'sharing:\n  timeSlicing:\n    strategy: round-robin\n    resources: [{name: gpu, replicas: 2}]\n',
      'sharing.timeSlicing.strategy: unknown key; expected one ' +
        'of renameByDefault, failRequestsGreaterThanOne, resources',
    ],
    [
      'resources:\n  gpus:\n  - pattern: "*"\n    name: gpu\n',
      "resources.gpus: renaming resources by pattern is not supported (NVIDIA's plugin ignores this " +
        'section too); remove it, or rename shared GPUs with sharing.timeSlicing.resources[].rename',
    ],
    ['- flags\n', '(top level): a list (1 items) is not allowed; expected a mapping with version, flags and sharing'],
  ];
  for (const [text, message] of cases) refusedFile(text, message);
});

test('a file that is not YAML, holds several documents or cannot be read is refused with the reason', () => {
  refusedFile(
    'flags: [\n',
    'not valid YAML or JSON (line 2, column 1): Flow sequence in ' +
      'block collection must be sufficiently indented and end with a ]',
  );
  refusedFile(
    'flags:\n  logLevel: info\n  logLevel: warn\n',
    'not valid YAML or JSON (line 3, column 3): Map keys must be unique',
  );
  refusedFile('version: v1\n---\nversion: v1\n', 'holds 2 YAML documents; expected one');
  assert.throws(
    () => parseOptions([], { CONFIG_FILE: '/nonexistent/gdp.yaml' }),
    (e: unknown) =>
      e instanceof ConfigError &&
      e.message === 'config file /nonexistent/gdp.yaml does not exist; check --config-file (CONFIG_FILE)',
  );
  assert.throws(
    () => parseOptions(['--config-file=relative.yaml'], {}),
    /--config-file: "relative.yaml" is not an absolute path/,
  );
  assert.ok(new ConfigError('x') instanceof OptionError, 'config errors stop the start like option errors (exit 2)');
});

test("NVIDIA's flags that this plugin lacks are refused by name with the reason, from every source", () => {
  const cases: [string[], Record<string, string>, string][] = [
    [
      ['--gds-enabled'],
      {},
      "--gds-enabled: not supported by this plugin (NVIDIA's --gds-enabled): GPUDirect Storage " +
        'is not requested for containers by this plugin (set NVIDIA_GDS=enabled in the pod instead)',
    ],
    [['--mofed-enabled=true'], {}, "--mofed-enabled: not supported by this plugin (NVIDIA's --mofed-enabled): MOFED"],
    [
      [],
      { GDRCOPY_ENABLED: 'true' },
      "environment variable GDRCOPY_ENABLED: not supported by this plugin (NVIDIA's --gdrcopy-enabled)",
    ],
    [
      ['--nvidia-ctk-path', '/opt/bin/nvidia-ctk'],
      {},
      "--nvidia-ctk-path: not supported by this plugin (NVIDIA's " +
        '--nvidia-cdi-hook-path): this plugin does not write CDI specs',
    ],
    [[], { NVIDIA_CDI_HOOK_PATH: '/x' }, 'environment variable NVIDIA_CDI_HOOK_PATH: not supported'],
    [
      ['--container-driver-root=/run/nvidia/driver'],
      {},
      "--container-driver-root: not supported by this plugin (NVIDIA's --driver-root-ctr-path)",
    ],
    [
      ['--cdi-feature-flags=foo'],
      {},
      "--cdi-feature-flags: not supported by this plugin (NVIDIA's " +
        '--cdi-feature-flags): this plugin does not write CDI specs',
    ],
    [
      ['--device-discovery-strategy=tegra'],
      {},
      "--device-discovery-strategy: not supported by this plugin (NVIDIA's " +
        '--device-discovery-strategy): GPUs are always found through NVML here',
    ],
    [['--mig-strategy=singel'], {}, '--mig-strategy: "singel" is not allowed; expected one of none, single, mixed'],
    [[], { MIG_STRATEGY: 'all' }, 'environment variable MIG_STRATEGY: "all" is not allowed'],
  ];
  for (const [argv, env, message] of cases) {
    assert.throws(
      () => parseOptions(argv, env),
      (e: unknown) => e instanceof OptionError && e.message.startsWith(message),
      message,
    );
  }
  const fileCases: [string, string][] = [
    [
      'flags:\n  gdsEnabled: true\n',
      "flags.gdsEnabled: true: not supported (NVIDIA's --gds-enabled): GPUDirect Storage is " +
        'not requested for containers by this plugin (set NVIDIA_GDS=enabled in the pod instead)',
    ],
    [
      'flags:\n  plugin:\n    containerDriverRoot: /run/nvidia/driver\n',
      `flags.plugin.containerDriverRoot: "/run/nvidia/driver": not supported (NVIDIA's ` +
        `--driver-root-ctr-path): this plugin does not write CDI specs; generate them ` +
        `with \`nvidia-ctk cdi generate\` (vendor k8s.device-plugin.nvidia.com, class gpu)`,
    ],
  ];
  for (const [text, message] of fileCases) refusedFile(text, message);
});

test("NVIDIA's flags at their default or off ask for nothing and are accepted; its old flag names work", () => {
  const p = parseOptions(
    [
      '--gds-enabled=false',
      '--nvidia-ctk-path=/usr/bin/nvidia-ctk',
      '--device-discovery-strategy',
      'nvml',
      '--nvidia-driver-root=/run/nvidia/driver',
      '--nvidia-dev-root',
      '/',
    ],
    {
      MOFED_ENABLED: 'false',
      CONTAINER_DRIVER_ROOT: '/driver-root',
      IMEX_REQUIRED: 'false',
    },
  );
  assert.equal(p.options.driverRoot, '/run/nvidia/driver');
  assert.equal(p.origins.driverRoot, 'command line');
  assert.equal(p.options.devRoot, '/');
  const f = withFile(
    'flags:\n  gdsEnabled: false\n  mofedEnabled: false\n  gdrcopyEnabled: false\n  ' +
      'deviceDiscoveryStrategy: auto\n  plugin:\n    nvidiaCTKPath: /usr/bin/nvidia-ctk\n ' +
      '   containerDriverRoot: /driver-root\nimex:\n  channelIDs: []\n  required: false\n',
  );
  assert.equal(f.options.migStrategy, 'none');
});

test('device-list strategies: comma separated, repeated flags add up, duplicates collapse', () => {
  assert.deepEqual(parseOptions(['--device-list-strategy=envvar,cdi-cri'], {}).options.deviceListStrategy, [
    'envvar',
    'cdi-cri',
  ]);
  assert.deepEqual(
    parseOptions(['--device-list-strategy', 'cdi-annotations', '--device-list-strategy=cdi-cri,cdi-annotations'], {})
      .options.deviceListStrategy,
    ['cdi-annotations', 'cdi-cri'],
  );
  assert.deepEqual(parseOptions([], { DEVICE_LIST_STRATEGY: 'volume-mounts' }).options.deviceListStrategy, [
    'volume-mounts',
  ]);
  assert.deepEqual(parseOptions([], {}).options.deviceListStrategy, ['envvar']);
  assert.throws(
    () => parseOptions(['--device-list-strategy=envvar,'], {}),
    new RegExp(
      '"envvar," has an empty entry; expected one or more of envvar, ' +
        'volume-mounts, cdi-annotations, cdi-cri, comma separated',
    ),
  );
  assert.throws(
    () => parseOptions([], { DEVICE_LIST_STRATEGY: 'cdi' }),
    /environment variable DEVICE_LIST_STRATEGY: "cdi" is not allowed; expected one or more of/,
  );
});

test("the new flags have NVIDIA's names, variables and defaults", () => {
  const want: Record<string, [string, string | null, string | undefined]> = {
    'mig-strategy': ['MIG_STRATEGY', 'none', 'flags.migStrategy'],
    'device-list-strategy': ['DEVICE_LIST_STRATEGY', 'envvar', 'flags.plugin.deviceListStrategy'],
    'cdi-annotation-prefix': ['CDI_ANNOTATION_PREFIX', 'cdi.k8s.io/', 'flags.plugin.cdiAnnotationPrefix'],
    'config-file': ['CONFIG_FILE', null, undefined],
    'shared-devices-allocation-policy': [
      'SHARED_DEVICES_ALLOCATION_POLICY',
      'distributed',
      'flags.plugin.sharedDevicesAllocationPolicy',
    ],
    'kubelet-socket': ['KUBELET_SOCKET', '/var/lib/kubelet/device-plugins/kubelet.sock', 'flags.plugin.kubeletSocket'],
    'driver-root': ['NVIDIA_DRIVER_ROOT', '/', 'flags.nvidiaDriverRoot'],
    'dev-root': ['NVIDIA_DEV_ROOT', null, 'flags.nvidiaDevRoot'],
  };
  for (const [flag, [env, def, config]] of Object.entries(want)) {
    const s = OPTION_SPECS.find((x) => x.flag === flag);
    assert.ok(s, flag);
    assert.deepEqual([s.env, s.default, s.config], [env, def, config], flag);
  }
  const p = parseOptions([], {});
  assert.equal(p.options.configFile, null);
  assert.equal(p.options.sharedDevicesAllocationPolicy, 'distributed');
  assert.equal(p.options.cdiAnnotationPrefix, 'cdi.k8s.io/');
  assert.equal(p.sharing.timeSlicing, null);
});

test('help names every option with its config key, and every refused flag of NVIDIA with the reason', () => {
  const text = helpText('1.2.3');
  for (const s of OPTION_SPECS) if (s.config !== undefined) assert.ok(text.includes(`config file ${s.config}`), s.flag);
  for (const u of UNSUPPORTED_OPTIONS) assert.ok(text.includes(`--${u.flag}`) && text.includes(u.reason), u.flag);
  assert.match(text, /--driver-root, --nvidia-driver-root/);
  assert.match(text, /--mig-strategy \(none\|single\|mixed\)/);
});

const GI = 2 ** 30;
const DRA = ['--kubelet-api=dra', '--kubeconfig=/etc/gdp/kubeconfig', '--node-name=node-a'];

test('dra.consumableCapacity: the memory request policy is read in bytes, quantities as strings or numbers', () => {
  const range = withFile(
    'dra:\n  consumableCapacity:\n    memory:\n' +
      '      default: 8Gi\n      validRange: {min: 1Gi, max: 40Gi, step: 1Gi}\n',
    DRA,
  );
  assert.deepEqual(range.consumableCapacity, {
    memory: { default: 8 * GI, validRange: { min: GI, max: 40 * GI, step: GI } },
  });
  const values = withFile(
    'dra:\n  consumableCapacity:\n    memory: {default: 10G, validValues: [5G, 10G, 21474836480]}\n',
    DRA,
  );
  assert.deepEqual(values.consumableCapacity, { memory: { default: 1e10, validValues: [5e9, 1e10, 20 * GI] } });
  // Absent (or an empty section): off.
  assert.equal(withFile('version: v1\n', DRA).consumableCapacity, undefined);
  assert.equal(withFile('dra:\n  consumableCapacity:\n', DRA).consumableCapacity, undefined);
});

test('dra.consumableCapacity: every rule of a requestPolicy is refused by its key path, saying what is right', () => {
  const memory = (body: string): string => `dra:\n  consumableCapacity:\n    memory:\n${body}`;
  const at = 'dra.consumableCapacity.memory';
  const QUANTITY = 'a quantity such as 8Gi, 512Mi or 40G (or a whole number of bytes)';
  const cases: [string, string][] = [
    ['dra:\n  consumable: {}\n', 'dra.consumable: unknown key; expected one of consumableCapacity, dynamicMig'],
    [
      'dra:\n  consumableCapacity:\n    cores: {}\n',
      'dra.consumableCapacity.cores: unknown key; expected one of memory',
    ],
    [
      'dra:\n  consumableCapacity: {memory: null}\n',
      `${at}: missing; expected {default, validRange} or {default, validValues}`,
    ],
    [memory('      validRange: {min: 1Gi}\n'), `${at}.default: missing; expected ${QUANTITY}`],
    [
      memory('      default: 8 GB\n      validRange: {min: 1Gi}\n'),
      `${at}.default: "8 GB" is not allowed; expected ${QUANTITY}`,
    ],
    [
      memory('      default: 8Gi\n'),
      `${at}: expected validValues (a list of quantities) or validRange ({min, max?, step?})`,
    ],
    [
      memory('      default: 8Gi\n      validValues: [8Gi]\n      validRange: {min: 1Gi}\n'),
      `${at}: validValues and validRange exclude each other; keep one`,
    ],
    [
      memory('      default: 8Gi\n      validRange: {max: 9Gi}\n'),
      `${at}.validRange.min: missing; expected ${QUANTITY}`,
    ],
    [
      memory('      default: 8Gi\n      validRange: {min: 1Gi, step: 0}\n'),
      `${at}.validRange.step: 0 is not allowed; a step must be above zero`,
    ],
    [
      memory('      default: 8Gi\n      validRange: {min: 10Gi, max: 2Gi}\n'),
      `${at}.validRange.max: 2Gi is less than min (10Gi); expected at least 10Gi`,
    ],
    [
      memory('      default: 512Mi\n      validRange: {min: 1Gi}\n'),
      `${at}.default: 512Mi is less than validRange.min (1Gi)`,
    ],
    [
      memory('      default: 16Gi\n      validRange: {min: 1Gi, max: 8Gi}\n'),
      `${at}.default: 16Gi is more than validRange.max (8Gi)`,
    ],
    [
      memory('      default: 3Gi\n      validRange: {min: 1Gi, step: 4Gi}\n'),
      `${at}.default: 3Gi is not min (1Gi) plus a whole number of steps (4Gi); expected 1Gi or 5Gi`,
    ],
    [
      memory('      default: 5Gi\n      validRange: {min: 1Gi, max: 10Gi, step: 4Gi}\n'),
      `${at}.validRange.max: 10Gi is not min (1Gi) plus a whole number of steps (4Gi); expected 9Gi or 13Gi`,
    ],
    [
      memory('      default: 4Gi\n      validValues: [8Gi, 4Gi]\n'),
      `${at}.validValues[1]: 4Gi is less than the value before it; list them ascending`,
    ],
    [
      memory('      default: 4Gi\n      validValues: [4Gi, 4Gi]\n'),
      `${at}.validValues[1]: 4Gi is listed twice; each value once`,
    ],
    [
      memory('      default: 2Gi\n      validValues: [4Gi, 8Gi]\n'),
      `${at}.default: 2Gi is not one of validValues (4Gi, 8Gi); expected one of them`,
    ],
    [
      memory('      default: 1Gi\n      validValues: [1Gi, 2Gi, 3Gi, 4Gi, 5Gi, 6Gi, 7Gi, 8Gi, 9Gi, 10Gi, 11Gi]\n'),
      `${at}.validValues: 11 values; at most 10 are allowed`,
    ],
    [
      memory('      default: 1Gi\n      validValues: 1Gi\n'),
      `${at}.validValues: "1Gi" is not allowed; expected a list of quantities`,
    ],
  ];
  for (const [text, message] of cases) refusedFile(text, message);
});

test('dra.consumableCapacity is a plan setting in DRA mode only; a changed one is a reload in DRA mode', () => {
  const file = (d: string): string =>
    `dra:\n  consumableCapacity:\n    memory: {default: ${d}, validRange: {min: 1Gi, step: 1Gi}}\n`;
  const dra = withFile(file('8Gi'), DRA);
  const plugin = withFile(file('8Gi'));
  assert.deepEqual(planSettings(dra.options, dra.sharing, draOf(dra)).consumableCapacity, {
    memory: { default: 8 * GI, validRange: { min: GI, step: GI } },
  });
  assert.equal(planSettings(plugin.options, plugin.sharing, draOf(plugin)).consumableCapacity, undefined);
  const next = withFile(file('4Gi'), DRA);
  assert.equal(planReload(dra.options, dra.sharing, next, undefined, draOf(dra)).draChanged, true);
  assert.equal(planReload(dra.options, dra.sharing, dra, undefined, draOf(dra)).draChanged, false);
  const off = withFile('version: v1\n', DRA);
  assert.equal(planReload(dra.options, dra.sharing, off, undefined, draOf(dra)).draChanged, true);
  // Device-plugin mode does not use it: no change to reload for.
  const plugin4 = withFile(file('4Gi'));
  assert.equal(planReload(plugin.options, plugin.sharing, plugin4, undefined, {}).draChanged, false);
});

test('dra.dynamicMig: off by default, a plan setting in DRA mode only, a boolean or refused by name', () => {
  const on = withFile('dra:\n  dynamicMig: true\n', DRA);
  assert.equal(planSettings(on.options, on.sharing, draOf(on)).dynamicMig, true);
  const plugin = withFile('dra:\n  dynamicMig: true\n');
  assert.equal(planSettings(plugin.options, plugin.sharing, draOf(plugin)).dynamicMig, undefined);
  const none = withFile('version: v1\n', DRA);
  assert.equal(planSettings(none.options, none.sharing, draOf(none)).dynamicMig, undefined);
  assert.equal(planReload(none.options, none.sharing, on, undefined, draOf(none)).draChanged, true);
  refusedFile('dra:\n  dynamicMig: "yes"\n', 'dra.dynamicMig: "yes" is not allowed; expected true or false');
});
