// The pure parts behind `check` and `info`: the config's fit to the node (one function for
// the daemon and check), systemd's environment-file syntax, the unit's sandbox, and the daemon's state.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import { fitAtStart } from '../../src/core/config-fit.ts';
import { parseStateDocument, stateDocument } from '../../src/core/daemon-state.ts';
import type { DaemonState } from '../../src/core/daemon-state.ts';
import type { Gpu } from '../../src/core/devices.ts';
import { freshHealthState } from '../../src/core/health-tracker.ts';
import { NO_MIG } from '../../src/core/mig.ts';
import type { MigLayout } from '../../src/core/mig.ts';
import { NO_SHARING } from '../../src/core/sharing.ts';
import type { Sharing } from '../../src/core/sharing.ts';
import { advertisedView, planSnapshot } from '../../src/core/resource-plan.ts';
import { buildSnapshot } from '../../src/core/snapshot.ts';
import type { PlanSettings } from '../../src/core/snapshot.ts';
import { parseEnvironmentFile } from '../../src/config/env-file.ts';
import { SHIPPED_UNIT, parseUnitSandbox, writableInSandbox } from '../../src/cli/sandbox.ts';
import { daemonStateFromSnapshot } from '../../src/observe/snapshot-state.ts';
import { formatClaims, formatDaemon } from '../../src/cli/daemon-view.ts';
import { SinceTracker } from '../../src/observe/state-file.ts';

const ROOT = join(import.meta.dirname, '..', '..');

function gpu(i: number): Gpu {
  return {
    index: i,
    uuid: `GPU-0000000${i}-0000-0000-0000-000000000000`,
    name: 'Fake',
    minor: i,
    busId: `00000000:0${i}:00.0`,
    memoryBytes: 80 * 2 ** 30,
    numaNode: 0,
  };
}
const GPUS = [0, 1, 2, 3].map(gpu);
const slicing = (
  resources: {
    devices: Sharing extends { timeSlicing: infer T }
      ? T extends { resources: readonly (infer R)[] }
        ? R extends { devices: infer D }
          ? D
          : never
        : never
      : never;
    replicas: number;
    rename?: string;
  }[],
): Sharing => ({
  timeSlicing: {
    renameByDefault: false,
    failRequestsGreaterThanOne: false,
    resources: resources.map((r) => ({
      name: 'nvidia.com/gpu',
      rename: r.rename ?? null,
      replicas: r.replicas,
      devices: r.devices,
    })),
  },
});
const settings = (sharing: Sharing, extra: Partial<PlanSettings> = {}): PlanSettings => ({
  deviceIdStrategy: 'uuid',
  sharing,
  migStrategy: 'none',
  ...extra,
});

/** What the daemon's start does with the same input: the first plan of the first snapshot throws, or not. */
function daemonStart(gpus: readonly Gpu[], mig: MigLayout, s: PlanSettings): string | null {
  try {
    planSnapshot(buildSnapshot({ driverVersion: '550', gpus, nvlinks: [], pcie: [], mig }, null, false), s, null);
    return null;
  } catch (err) {
    return (err as Error).message;
  }
}

test("the fit check and the daemon's first snapshot agree: same refusals, same words, the key named", () => {
  const cases: [string, PlanSettings, string | null][] = [
    [
      'GPU the node lacks',
      settings(slicing([{ devices: { kind: 'list', refs: [{ index: 0 }, { index: 9 }] }, replicas: 2 }])),
      'sharing.timeSlicing.resources[0].devices[1]',
    ],
    [
      'two entries, one GPU',
      settings(
        slicing([
          { devices: { kind: 'list', refs: [{ index: 1 }] }, replicas: 2 },
          { devices: { kind: 'list', refs: [{ index: 1 }] }, replicas: 3, rename: 'nvidia.com/gpu.big' },
        ]),
      ),
      'sharing.timeSlicing.resources[1].devices',
    ],
    [
      'more GPUs than the node has',
      settings(slicing([{ devices: { kind: 'count', count: 5 }, replicas: 2 }])),
      'sharing.timeSlicing.resources[0].devices',
    ],
    ['a fitting list', settings(slicing([{ devices: { kind: 'list', refs: [{ index: 3 }] }, replicas: 2 }])), null],
    ['no sharing', settings(NO_SHARING), null],
  ];
  for (const [what, s, key] of cases) {
    const fit = fitAtStart(GPUS, NO_MIG, s, new Map());
    const daemon = daemonStart(GPUS, NO_MIG, s);
    if (key === null) {
      assert.equal(fit.ok, true, what);
      assert.equal(daemon, null, what);
    } else {
      assert.equal(fit.ok, false, what);
      if (fit.ok) continue;
      assert.equal(fit.key, key, what);
      assert.equal(fit.problem, daemon, `${what}: the daemon refuses with the same message`);
    }
  }
  // MIG: single on a node that is not uniform, and capability nodes missing with --pass-device-specs.
  const mig: MigLayout = {
    modes: [{ current: true, pending: true }, { current: false, pending: false }, null, null],
    devices: [
      {
        parent: 0,
        index: 0,
        uuid: 'MIG-a',
        gi: 1,
        ci: 0,
        profile: '1g.10gb',
        giSlices: 1,
        ciSlices: 1,
        memoryBytes: 10 * 2 ** 30,
        multiprocessors: 14,
        engines: { copy: 1, decoder: 0, encoder: 0, jpeg: 0, ofa: 0 },
      },
    ],
  };
  const single = fitAtStart(GPUS, mig, settings(NO_SHARING, { migStrategy: 'single' }), new Map());
  assert.equal(single.ok, false);
  if (!single.ok) {
    assert.equal(single.key, '--mig-strategy');
    assert.equal(single.problem, daemonStart(GPUS, mig, settings(NO_SHARING, { migStrategy: 'single' })));
  }
  const caps = fitAtStart(GPUS, mig, settings(NO_SHARING, { migStrategy: 'mixed', needMigCapabilities: true }), {
    problem: 'cannot read mig-minors',
  });
  assert.equal(caps.ok, false);
  if (!caps.ok) assert.equal(caps.key, '--pass-device-specs');
});

test(
  'environment files are read as systemd reads them: quotes, escapes, ' +
    'comments, continuations; export and bad names are ignored and reported',
  () => {
    const f = parseEnvironmentFile(
      [
        '# comment',
        '; also a comment',
        '',
        'A=plain',
        '  B = spaced value  ',
        'C="double \\"quoted\\" $x"',
        "D='single \\n kept'",
        'E=trailing # not a comment',
        'F=one\\',
        'two',
        'export G=1',
        'H-I=2',
        'no equals sign',
        'J=',
        'K=a"b c"d',
      ].join('\n'),
    );
    assert.deepEqual(Object.fromEntries(f.assignments.map((a) => [a.key, a.value])), {
      A: 'plain',
      B: 'spaced value',
      C: 'double "quoted" $x',
      D: 'single \\n kept',
      E: 'trailing # not a comment',
      F: 'onetwo',
      J: '',
      K: 'ab cd',
    });
    assert.deepEqual(
      f.ignored.map((x) => x.line),
      [11, 12, 13],
    );
    assert.match(f.ignored[0]!.why, /does not take "export"/);
    assert.equal(f.assignments.find((a) => a.key === 'E')?.line, 8);
  },
);

test("the shipped unit's sandbox lines are the unit file's", () => {
  const file = parseUnitSandbox([readFileSync(join(ROOT, 'systemd', 'gpu-device-plugin.service'), 'utf8')]);
  assert.deepEqual(parseUnitSandbox([SHIPPED_UNIT]), file);
});

test(
  "writability as the unit's sandbox decides it: strict, ReadWritePaths, " +
    'service directories, read-only and private paths, drop-in resets',
  () => {
    const sb = parseUnitSandbox([
      SHIPPED_UNIT,
      '[Service]\nReadWritePaths=/var/lib/node_exporter "/srv/with space"\nReadOnlyPaths=/var/lib/node_exporter/ro\n',
    ]);
    const w = (p: string): boolean => writableInSandbox(sb, p).writable;
    assert.equal(w('/var/lib/kubelet/device-plugins'), true);
    assert.equal(w('/var/lib/kubelet'), false);
    assert.equal(w('/etc/kubernetes/node-feature-discovery/features.d'), false);
    assert.match((writableInSandbox(sb, '/etc/x') as { why: string }).why, /ProtectSystem=strict/);
    assert.equal(w('/run/gpu-device-plugin'), true, 'RuntimeDirectory=');
    assert.equal(w('/var/lib/gpu-device-plugin'), true, 'StateDirectory=');
    assert.equal(w('/var/lib/node_exporter/textfile'), true);
    assert.equal(w('/srv/with space'), true);
    assert.equal(w('/var/lib/node_exporter/ro/x'), false, 'the more specific ReadOnlyPaths= wins');
    assert.equal(w('/root/x'), false, 'ProtectHome=yes');
    assert.deepEqual(writableInSandbox(sb, '/tmp/metrics'), {
      writable: true,
      how: 'PrivateTmp=yes gives the service its own empty /tmp: what it writes there nobody else sees',
      private: true,
    });
    const reset = parseUnitSandbox([SHIPPED_UNIT, '[Service]\nReadWritePaths=\nProtectSystem=full\nPrivateTmp=no\n']);
    assert.equal(
      writableInSandbox(reset, '/var/lib/kubelet/device-plugins').writable,
      true,
      'full leaves /var writable',
    );
    assert.equal(writableInSandbox(reset, '/etc/x').writable, false);
    assert.equal(writableInSandbox(reset, '/usr/x').writable, false);
    assert.equal(writableInSandbox(reset, '/tmp/x').writable, true);
    assert.deepEqual(reset.readWritePaths, []);
    assert.deepEqual(parseUnitSandbox([SHIPPED_UNIT]).environmentFiles, [
      { path: '/etc/default/gpu-device-plugin', optional: true },
      { path: '/etc/sysconfig/gpu-device-plugin', optional: true },
    ]);
  },
);

test(
  "the daemon's state: what the kubelet was told per device with the " +
    'reason and since when, registrations, and a document info reads back',
  () => {
    const s0 = buildSnapshot(
      { driverVersion: '550.54.15', gpus: GPUS.slice(0, 2), nvlinks: [], pcie: [] },
      null,
      false,
    );
    const started = '2026-11-25T09:00:00.000Z';
    const xidAt = '2026-11-25T10:00:00.000Z';
    const second = GPUS[1]!.uuid;
    const lost = {
      state: { ...freshHealthState(), health: 'Unhealthy' as const, lastXid: 79 },
      reason: 'critical XID 79 (GPU has fallen off the bus)',
      since: Date.parse(xidAt),
    };
    const s1 = {
      ...s0,
      gpuHealth: new Map([...s0.gpuHealth, [second, lost]]),
      health: new Map([...s0.health, [second, 'Unhealthy' as const]]),
    };
    const since = new SinceTracker();
    const ctx = (now: string, registered: boolean) => ({
      pid: 42,
      version: '0.1.0',
      startedAt: started,
      now,
      options: { 'mig-strategy': 'none' },
      registrations: [{ name: 'nvidia.com/gpu', registered }],
      since,
    });
    const a = daemonStateFromSnapshot(s0, ctx('t1', false));
    assert.deepEqual(
      a.devices.map((d) => [d.index, d.health, d.since]),
      [
        ['0', 'Healthy', started],
        ['1', 'Healthy', started],
      ],
      'nothing happened to them: as they are since the daemon started',
    );
    const plan = planSnapshot(s0, settings(NO_SHARING), null);
    const b = daemonStateFromSnapshot(s1, { ...ctx('t2', true), advertised: advertisedView({ snapshot: s1, plan }) });
    assert.deepEqual(
      b.devices.map((d) => [d.index, d.health, d.since, d.reason]),
      [
        ['0', 'Healthy', started, undefined],
        ['1', 'Unhealthy', xidAt, 'critical XID 79 (GPU has fallen off the bus)'],
      ],
    );
    assert.deepEqual(b.resources, [{ name: 'nvidia.com/gpu', registered: true, since: 't2', devices: 2, healthy: 1 }]);
    const down = daemonStateFromSnapshot(buildSnapshot(null, s1, false), ctx('t3', true));
    assert.equal(down.driverVersion, null);
    assert.ok(down.devices.every((d) => d.health === 'Unhealthy' && d.reason === 'the NVIDIA driver does not answer'));

    const back = parseStateDocument(stateDocument(b));
    assert.ok('state' in back);
    if ('state' in back) assert.deepEqual(back.state, b as DaemonState);
    assert.match((parseStateDocument('{') as { problem: string }).problem, /not JSON/);
    assert.match((parseStateDocument('{"format": 99}') as { problem: string }).problem, /format 99/);
    assert.match(
      (
        parseStateDocument(
          JSON.stringify({
            format: 1,
            pid: 1,
            version: 'v',
            startedAt: 'a',
            publishedAt: 'b',
            devices: [{ uuid: 'x' }],
            resources: [],
          }),
        ) as { problem: string }
      ).problem,
      /without uuid or health/,
    );
  },
);

test(
  "DRA mode's prepared claims: carried in the daemon's " +
    'state, read back, refused when malformed, and shown by info',
  () => {
    const s0 = buildSnapshot(
      { driverVersion: '550.54.15', gpus: GPUS.slice(0, 2), nvlinks: [], pcie: [] },
      null,
      false,
    );
    const claims = [
      {
        namespace: 'team-a',
        name: 'pair',
        uid: 'u-1',
        state: 'PrepareCompleted',
        devices: ['gpu-0', 'gpu-1'],
        since: '2026-11-25T10:00:00.000Z',
      },
      { namespace: 'team-b', name: 'half', uid: 'u-2', state: 'PrepareStarted', devices: ['gpu-1'] },
    ];
    const ctx = {
      pid: 42,
      version: '0.1.0',
      startedAt: 't0',
      now: 't1',
      options: {},
      registrations: [{ name: 'gpu.nvidia.com (DRA)', registered: true }],
      since: new SinceTracker(),
    };
    assert.equal(daemonStateFromSnapshot(s0, ctx).claims, undefined, 'the device-plugin mode has no claims');
    const s = daemonStateFromSnapshot(s0, { ...ctx, claims });
    const back = parseStateDocument(stateDocument(s));
    assert.ok('state' in back && back.state.claims !== undefined);
    if ('state' in back) assert.deepEqual(back.state.claims, claims);
    const bad = JSON.parse(stateDocument(s)) as Record<string, unknown>;
    assert.match(
      (parseStateDocument(JSON.stringify({ ...bad, claims: [{ name: 'x' }] })) as { problem: string }).problem,
      /claims is not a list of claims with uid, name and devices/,
    );
    const text = formatClaims(claims, 'prepared by the daemon');
    assert.match(text, /^DRA claims prepared by the daemon:\nCLAIM +UID +DEVICES +SINCE +STATE\n/);
    assert.match(text, /\nteam-a\/pair +u-1 +gpu-0,gpu-1 +2026-11-25T10:00:00\.000Z +prepared\n/);
    assert.match(text, /\nteam-b\/half +u-2 +gpu-1 +- +prepare not finished\n/);
    assert.equal(formatClaims([], 'in the checkpoint /x'), 'DRA claims in the checkpoint /x: none.\n');
    const shown = formatDaemon({ read: { kind: 'running', path: '/run/s.json', state: s } });
    assert.match(shown, /gpu\.nvidia\.com \(DRA\) +yes/);
    assert.match(shown, /DRA claims prepared by the daemon:\n/);
    const offline = formatDaemon({
      read: { kind: 'absent', path: '/run/s.json' },
      checkpoint: { path: '/k/cp.json', claims },
    });
    assert.match(
      offline,
      /^Daemon: not running .*\n\nDRA claims in the checkpoint \/k\/cp\.json \(prepared before the daemon stopped\):\n/,
    );
    assert.match(
      formatDaemon({
        read: { kind: 'absent', path: '/run/s.json' },
        checkpoint: { path: '/k/cp.json', error: 'not JSON' },
      }),
      /DRA claims: the checkpoint \/k\/cp\.json cannot be read: not JSON/,
    );
  },
);
