// MPS sharing's configuration and plan: `sharing.mps` in NVIDIA's config v1,
// --mps-root, the resources planned with `mps: true`, and each of NVIDIA's refusals with the key and
// what to change — the ones that need no GPU when the options are read, the others against the node.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { ConfigError, OptionError } from '../../src/config/errors.ts';
import { RESTART_ONLY_OPTIONS } from '../../src/config/reload.ts';
import { parseOptions } from '../../src/config/parse-options.ts';
import type { ParsedOptions } from '../../src/config/options.ts';
import { planSettings } from '../../src/config/plan-settings.ts';
import { fitAtStart, planForNode } from '../../src/core/config-fit.ts';
import type { Gpu } from '../../src/core/devices.ts';
import { NO_MIG } from '../../src/core/mig.ts';
import type { MigDevice, MigLayout } from '../../src/core/mig.ts';
import { planMpsDaemons } from '../../src/core/mps.ts';
import type { ComputeByUuid } from '../../src/core/mps.ts';
import { SharingError, describePlan, planResources } from '../../src/core/sharing.ts';
import type { Sharing } from '../../src/core/sharing.ts';

const FILE = '/etc/gdp/config.yaml';
const ROOT = { MPS_ROOT: '/run/nvidia/mps' };

function withFile(text: string, argv: readonly string[] = [], env: Record<string, string> = ROOT): ParsedOptions {
  return parseOptions(argv, { CONFIG_FILE: FILE, ...env }, { readFile: () => text });
}

function refusedFile(text: string, message: string, env: Record<string, string> = ROOT): void {
  assert.throws(
    () => withFile(text, [], env),
    (e: unknown) => {
      assert.ok(e instanceof ConfigError, `a ConfigError, not ${String(e)}`);
      assert.equal(e.message, `config file ${FILE}: ${message}`);
      return true;
    },
    message,
  );
}

const mps = (resources: string, extra = ''): string => `sharing:\n  mps:\n${extra}    resources: [${resources}]\n`;

/** The example of NVIDIA's README ("With CUDA MPS"), byte for byte in its shape. */
const NVIDIA_README_MPS = `version: v1
sharing:
  mps:
    resources:
    - name: nvidia.com/gpu
      replicas: 10
`;

test("NVIDIA's README MPS example is accepted: failRequestsGreaterThanOne true by default, no rename", () => {
  const p = withFile(NVIDIA_README_MPS);
  assert.equal(p.options.mpsRoot, '/run/nvidia/mps');
  assert.equal(p.origins.mpsRoot, 'environment');
  assert.deepEqual(p.sharing, {
    timeSlicing: null,
    mps: {
      renameByDefault: false,
      failRequestsGreaterThanOne: true,
      resources: [{ name: 'nvidia.com/gpu', rename: null, replicas: 10, devices: { kind: 'all' } }],
    },
  });
});

test(
  'sharing.mps takes the keys of timeSlicing: renameByDefault, ' +
    'failRequestsGreaterThanOne (may be relaxed), rename, devices',
  () => {
    const p = withFile(
      mps(
        '{name: gpu, replicas: 4, devices: [0, 2], rename: gpu.mps}',
        '    renameByDefault: true\n    failRequestsGreaterThanOne: false\n',
      ),
    );
    assert.deepEqual(p.sharing.mps, {
      renameByDefault: true,
      failRequestsGreaterThanOne: false,
      resources: [
        {
          name: 'nvidia.com/gpu',
          rename: 'nvidia.com/gpu.mps',
          replicas: 4,
          devices: { kind: 'list', refs: [{ index: 0 }, { index: 2 }] },
        },
      ],
    });
    // Time-slicing's default stays false.
    assert.equal(
      withFile('sharing:\n  timeSlicing:\n    resources: [{name: gpu, replicas: 2}]\n').sharing.timeSlicing
        ?.failRequestsGreaterThanOne,
      false,
    );
    // `mps:` with nothing under it is no MPS, as a null pointer is in NVIDIA's Go config.
    assert.deepEqual(withFile('sharing:\n  mps:\n', [], {}).sharing, { timeSlicing: null });
  },
);

test('each sharing.mps refusal names the key and what would be right', () => {
  const cases: [string, string][] = [
    [
      mps('{name: gpu, replicas: 1}'),
      'sharing.mps.resources[0].replicas: 1 is not allowed; expected an integer ' +
        'from 2 to 48 (an MPS server takes at most 48 clients per GPU; 16 before Volta)',
    ],
    [
      mps('{name: gpu, replicas: 49}'),
      'sharing.mps.resources[0].replicas: 49 is not allowed; expected an integer ' +
        'from 2 to 48 (an MPS server takes at most 48 clients per GPU; 16 before Volta)',
    ],
    [
      mps('{name: gpu}'),
      'sharing.mps.resources[0].replicas: missing; expected an integer from 2 ' +
        'to 48 (an MPS server takes at most 48 clients per GPU; 16 before Volta)',
    ],
    [
      mps('{name: nvidia.com/mig-1g.10gb, replicas: 2}'),
      'sharing.mps.resources[0].name: "nvidia.com/mig-1g.10gb" is not allowed (sharing using MPS ' +
        'is not supported for MIG devices); MPS shares whole GPUs: expected nvidia.com/gpu (or gpu)',
    ],
    [
      mps('{name: gpu.small, replicas: 2}'),
      'sharing.mps.resources[0].name: "gpu.small" is not allowed; ' +
        'MPS shares whole GPUs: expected nvidia.com/gpu (or gpu)',
    ],
    [
      mps('{name: gpu, replicas: 2, devices: [0, "1:0"]}'),
      'sharing.mps.resources[0].devices[1]: "1:0" is a MIG device; sharing ' +
        'using MPS is not supported for MIG devices: name GPUs by index or GPU UUID',
    ],
    [
      mps('{name: gpu, replicas: 2, pinnedMemory: 1G}'),
      'sharing.mps.resources[0].pinnedMemory: unknown key; expected one of name, rename, replicas, devices',
    ],
    [
      'sharing:\n  mps:\n    renameByDefault: true\n',
      'sharing.mps.resources: missing; MPS needs at least one resource, e.g. [{name: nvidia.com/gpu, replicas: 4}]',
    ],
    [
      'sharing:\n  mps:\n    resources: []\n',
      'sharing.mps.resources: an empty list is not allowed; expected ' +
        'at least one resource, e.g. {name: nvidia.com/gpu, replicas: 4}',
    ],
    [
      mps('{name: gpu, replicas: 2}', '    failRequestsGreaterThanOne: "no"\n'),
      'sharing.mps.failRequestsGreaterThanOne: "no" is not allowed; expected true or false',
    ],
    [
      'sharing:\n  timeSlicing:\n    resources: [{name: gpu, replicas: ' +
        '2}]\n  mps:\n    resources: [{name: gpu, replicas: 2}]\n',
      'sharing.mps: MPS and time-slicing exclude each other; keep sharing.mps or sharing.timeSlicing, not both',
    ],
  ];
  for (const [text, message] of cases) refusedFile(text, message);
});

test(
  "--mps-root: empty by default (NVIDIA's), from flag, " + 'env or flags.mpsRoot; absolute; a restart-only option',
  () => {
    const none = parseOptions([], {});
    assert.equal(none.options.mpsRoot, '');
    assert.equal(none.origins.mpsRoot, 'default');
    assert.equal(parseOptions(['--mps-root=/run/mps'], {}).options.mpsRoot, '/run/mps');
    assert.equal(
      parseOptions(['--mps-root='], {}).options.mpsRoot,
      '',
      'an empty value is "not set", as in NVIDIA\'s plugin',
    );
    assert.equal(withFile('flags:\n  mpsRoot: /var/run/mps\n', [], {}).options.mpsRoot, '/var/run/mps');
    assert.equal(withFile('flags:\n  mpsRoot: ""\n', [], {}).options.mpsRoot, '');
    assert.throws(
      () => parseOptions(['--mps-root=run/mps'], {}),
      (e: unknown) =>
        e instanceof OptionError &&
        e.message === '--mps-root: "run/mps" is not an absolute path; expected a path starting with /',
    );
    assert.ok(
      RESTART_ONLY_OPTIONS.includes('mpsRoot'),
      'the control daemons were started under the root: a reload cannot move it',
    );
  },
);

test("NVIDIA's refusals that need no GPU stop the options (exit 2): no root, --mig-strategy=mixed", () => {
  assert.throws(
    () => withFile(NVIDIA_README_MPS, [], {}),
    (e: unknown) =>
      e instanceof OptionError &&
      !(e instanceof ConfigError) &&
      e.message ===
        '--mps-root: using MPS requires --mps-root (MPS_ROOT, flags.mpsRoot): the host directory of the MPS ' +
          "control daemons' pipes and shm; set it, e.g. --mps-root=/run/nvidia/mps (the package's env file does)",
  );
  assert.throws(
    () => withFile(NVIDIA_README_MPS, ['--mig-strategy=mixed']),
    (e: unknown) =>
      e instanceof OptionError &&
      e.message ===
        '--mig-strategy: using --mig-strategy=mixed is not supported with MPS (sharing using MPS is ' +
          'not supported for MIG devices); use --mig-strategy=none, or share with sharing.timeSlicing',
  );
  // single is NVIDIA's too: refused only when the node has MIG devices (below).
  assert.equal(withFile(NVIDIA_README_MPS, ['--mig-strategy=single']).options.migStrategy, 'single');
  // A root without MPS configured asks for nothing.
  assert.equal(parseOptions(['--mps-root=/run/nvidia/mps'], {}).sharing.mps, undefined);
});

// ---- the plan ---------------------------------------------------------------------------------

const MiB = 1024 * 1024;
function gpus(n: number): Gpu[] {
  return Array.from({ length: n }, (_, i) => ({
    index: i,
    uuid: `GPU-${i}`,
    name: 'Test GPU',
    minor: i,
    busId: `00000000:0${i}:00.0`,
    memoryBytes: 16384 * MiB,
    numaNode: null,
  }));
}
const compute = (gs: readonly Gpu[], major: number, minor = 0): ComputeByUuid =>
  new Map(gs.map((g) => [g.uuid, { compute: { major, minor } }]));
function mpsSharing(
  replicas: number,
  more: { rename?: string; devices?: number[]; renameByDefault?: boolean; failRequestsGreaterThanOne?: boolean } = {},
): Sharing {
  return {
    timeSlicing: null,
    mps: {
      renameByDefault: more.renameByDefault ?? false,
      failRequestsGreaterThanOne: more.failRequestsGreaterThanOne ?? true,
      resources: [
        {
          name: 'nvidia.com/gpu',
          rename: more.rename ?? null,
          replicas,
          devices:
            more.devices === undefined
              ? { kind: 'all' }
              : { kind: 'list', refs: more.devices.map((index) => ({ index })) },
        },
      ],
    },
  };
}

test(
  'MPS resources are planned as time-slicing replicas, ' + 'marked mps, failRequestsGreaterThanOne from the mps block',
  () => {
    const g = gpus(2);
    const plan = planResources(g, 'uuid', mpsSharing(3));
    assert.deepEqual(
      plan.map((r) => ({
        name: r.name,
        ids: r.devices.map((d) => d.id),
        shared: r.shared,
        fail: r.failRequestsGreaterThanOne,
        mps: r.mps,
      })),
      [
        {
          name: 'nvidia.com/gpu',
          ids: ['GPU-0::0', 'GPU-0::1', 'GPU-0::2', 'GPU-1::0', 'GPU-1::1', 'GPU-1::2'],
          shared: true,
          fail: true,
          mps: true,
        },
      ],
    );
    assert.equal(describePlan(plan), 'nvidia.com/gpu=6 (MPS replicas of 2 GPUs)');
    const relaxed = planResources(g, 'index', mpsSharing(2, { failRequestsGreaterThanOne: false }));
    assert.equal(relaxed[0]?.failRequestsGreaterThanOne, false);
    assert.equal(relaxed[0]?.devices[0]?.runtimeName, '0');
  },
);

test(
  'renamed MPS replicas beside whole GPUs: only the ' + "replicas are mps, and only they are the daemon's clients",
  () => {
    const g = gpus(3);
    const renamed = planResources(g, 'uuid', mpsSharing(2, { devices: [1], renameByDefault: true }));
    assert.deepEqual(
      renamed.map((r) => [r.name, r.devices.map((d) => d.id), r.mps ?? false, r.failRequestsGreaterThanOne]),
      [
        ['nvidia.com/gpu', ['GPU-0', 'GPU-2'], false, false],
        ['nvidia.com/gpu.shared', ['GPU-1::0', 'GPU-1::1'], true, true],
      ],
    );
    // Not renamed: whole GPUs and replicas under one name; the daemon serves GPU 1 only.
    const mixed = planResources(g, 'uuid', mpsSharing(2, { devices: [1] }));
    assert.deepEqual(
      mixed.map((r) => [r.name, r.devices.map((d) => d.id), r.mps]),
      [['nvidia.com/gpu', ['GPU-0', 'GPU-1::0', 'GPU-1::1', 'GPU-2'], true]],
    );
    assert.deepEqual(
      planMpsDaemons(mixed, g).map((d) => [d.resource, d.replicas, d.gpus.map((x) => x.uuid)]),
      [['nvidia.com/gpu', 2, ['GPU-1']]],
    );
  },
);

test('MPS and time-slicing together are refused by the plan too (a Sharing built by hand)', () => {
  const both: Sharing = {
    ...mpsSharing(2),
    timeSlicing: {
      renameByDefault: false,
      failRequestsGreaterThanOne: false,
      resources: [{ name: 'nvidia.com/gpu', rename: null, replicas: 2, devices: { kind: 'all' } }],
    },
  };
  assert.throws(
    () => planResources(gpus(1), 'uuid', both),
    (e: unknown) => e instanceof SharingError && e.path === 'sharing.mps',
  );
});

test(
  'the client limit: 48 from compute capability 7.0 (V100 ' +
    'included), 16 before it or when unknown; not checked without facts',
  () => {
    const g = gpus(2);
    const settings = { deviceIdStrategy: 'uuid' as const, sharing: mpsSharing(20) };
    assert.equal(
      planForNode(g, NO_MIG, settings, compute(g, 7, 0)).resources[0]?.devices.length,
      40,
      "V100: NVIDIA's 7.5 comparison would refuse this",
    );
    assert.throws(
      () => planForNode(g, NO_MIG, settings, compute(g, 6, 1)),
      (e: unknown) =>
        e instanceof SharingError &&
        e.path === 'sharing.mps.resources[0].replicas' &&
        e.message ===
          'sharing.mps.resources[0].replicas: 20 replicas of GPU 0 (GPU-0) are ' +
            'more MPS clients than it takes: compute capability 6.1 serves at most 16 ' +
            '(48 from Volta, compute capability 7.0, 16 before); ask for at most 16',
    );
    const unknown = new Map([
      ['GPU-0', { compute: { major: 8, minor: 0 } }],
      ['GPU-1', { compute: null }],
    ]);
    assert.throws(
      () => planForNode(g, NO_MIG, settings, unknown),
      (e: unknown) =>
        e instanceof SharingError &&
        e.message.startsWith(
          'sharing.mps.resources[0].replicas: 20 replicas of GPU 1 (GPU-1) are more MPS ' +
            'clients than it takes: its compute capability is unknown, so it is held to 16',
        ),
    );
    assert.equal(
      planForNode(g, NO_MIG, { ...settings, sharing: mpsSharing(16) }, compute(g, 5, 2)).resources[0]?.devices.length,
      32,
    );
    // Without facts (a re-plan that did not read them) the limit is left to the plan that has them.
    assert.equal(planForNode(g, NO_MIG, settings).resources[0]?.devices.length, 40);
  },
);

const MIG_ON: MigLayout = {
  modes: [
    { current: true, pending: true },
    { current: false, pending: false },
  ],
  devices: [
    {
      parent: 0,
      index: 0,
      uuid: 'MIG-aaaa',
      gi: 1,
      ci: 0,
      profile: '3g.40gb',
      giSlices: 3,
      ciSlices: 3,
      memoryBytes: 40960 * MiB,
      multiprocessors: 42,
      engines: { copy: 3, decoder: 0, encoder: 0, jpeg: 0, ofa: 0 },
    } satisfies MigDevice,
  ],
};

test("MIG: MPS with MIG devices (single strategy) or on a GPU in MIG mode is refused with NVIDIA's words", () => {
  const g = gpus(2);
  const uniform: MigLayout = {
    modes: [
      { current: true, pending: true },
      { current: true, pending: true },
    ],
    devices: [MIG_ON.devices[0]!, { ...MIG_ON.devices[0]!, parent: 1, uuid: 'MIG-bbbb' }],
  };
  const single = fitAtStart(
    g,
    uniform,
    { deviceIdStrategy: 'uuid', sharing: mpsSharing(2), migStrategy: 'single' },
    new Map(),
    compute(g, 8),
  );
  assert.deepEqual(single, {
    ok: false,
    key: 'sharing.mps',
    problem:
      'sharing.mps: sharing using MPS is not supported for MIG devices (nvidia.com/gpu would hold MIG ' +
      'device MIG-aaaa); use --mig-strategy=none with MIG disabled, or share with sharing.timeSlicing',
  });
  // single on a node without MIG enabled: whole GPUs, MPS allowed (as NVIDIA).
  assert.equal(
    fitAtStart(
      g,
      { modes: [null, null], devices: [] },
      { deviceIdStrategy: 'uuid', sharing: mpsSharing(2), migStrategy: 'single' },
      new Map(),
      compute(g, 8),
    ).ok,
    true,
  );
  // A GPU in MIG mode among the replicated ones (the layout read, strategy none): refused naming it.
  assert.throws(
    () => planForNode(g, MIG_ON, { deviceIdStrategy: 'uuid', sharing: mpsSharing(2) }),
    (e: unknown) =>
      e instanceof SharingError &&
      e.message ===
        'sharing.mps.resources[0].devices: GPU 0 (GPU-0) has MIG enabled; sharing using MPS is not ' +
          'supported for MIG devices; disable MIG on it (nvidia-smi -i 0 -mig 0) or leave it out of devices',
  );
  assert.equal(
    planForNode(g, MIG_ON, { deviceIdStrategy: 'uuid', sharing: mpsSharing(2, { devices: [1] }) }).resources.length,
    1,
  );
});

test('check and the daemon plan MPS through the same settings: planSettings carries sharing.mps', () => {
  const p = withFile(NVIDIA_README_MPS);
  const g = gpus(1);
  const fit = fitAtStart(g, NO_MIG, planSettings(p.options, p.sharing), new Map(), compute(g, 9));
  assert.ok(fit.ok);
  assert.equal(describePlan(fit.plan.resources), 'nvidia.com/gpu=10 (MPS replicas of 1 GPUs)');
});
