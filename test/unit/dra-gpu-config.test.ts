// NVIDIA's opaque GpuConfig and MigDeviceConfig under DRA (src/core/dra-gpu-config.ts): decoding as NVIDIA's strict
// decoder does, validation as its validate.go does, and which configuration applies to a device's request.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { checkSharing, driverConfigs, perDeviceLimits, sharingFor } from '../../src/core/dra-gpu-config.ts';
import type { ConfigDeviceKind, DriverConfig, GpuSharing } from '../../src/core/dra-gpu-config.ts';

const DRIVER = 'gpu.nvidia.com';
const API = 'resource.nvidia.com/v1beta1';
const MI = 1024 * 1024;

type Params = Record<string, unknown>;
const gpuConfig = (sharing?: unknown): Params => ({
  apiVersion: API,
  kind: 'GpuConfig',
  ...(sharing === undefined ? {} : { sharing }),
});
const migConfig = (sharing?: unknown): Params => ({
  apiVersion: API,
  kind: 'MigDeviceConfig',
  ...(sharing === undefined ? {} : { sharing }),
});
const entry = (parameters: unknown, source = 'FromClaim', requests?: string[], driver = DRIVER): unknown => ({
  source,
  ...(requests === undefined ? {} : { requests }),
  opaque: { driver, parameters },
});

function configs(list: unknown): DriverConfig[] {
  const r = driverConfigs(list, DRIVER);
  assert.ok('configs' in r, JSON.stringify(r));
  return r.configs;
}
function decodeError(list: unknown): string {
  const r = driverConfigs(list, DRIVER);
  assert.ok('error' in r, `expected an error: ${JSON.stringify(r)}`);
  return r.error;
}
/** The sharing one config entry sets on a device of `kind` (for request r). */
function applied(parameters: unknown, kind: ConfigDeviceKind = 'gpu'): GpuSharing | undefined | { error: string } {
  const r = sharingFor(configs([entry(parameters)]), 'r', kind, kind === 'gpu' ? 'gpu-0' : 'gpu-0-mig-1g10gb-19-0');
  return 'error' in r ? { error: r.error } : r.sharing;
}
function appliedError(parameters: unknown, kind: ConfigDeviceKind = 'gpu'): string {
  const r = applied(parameters, kind);
  assert.ok(r !== undefined && 'error' in r, `expected an error: ${JSON.stringify(r)}`);
  return r.error;
}

const P = 'status.allocation.devices.config[0].opaque.parameters';

test('GpuConfig: no sharing, TimeSlicing (interval Default when absent), MPS with its limits', () => {
  assert.equal(applied(gpuConfig()), undefined);
  assert.equal(applied(gpuConfig(null)), undefined);
  assert.deepEqual(applied(gpuConfig({ strategy: 'TimeSlicing' })), { strategy: 'TimeSlicing', interval: 'Default' });
  assert.deepEqual(applied(gpuConfig({ strategy: 'TimeSlicing', timeSlicingConfig: {} })), {
    strategy: 'TimeSlicing',
    interval: 'Default',
  });
  for (const interval of ['Default', 'Short', 'Medium', 'Long'])
    assert.deepEqual(applied(gpuConfig({ strategy: 'TimeSlicing', timeSlicingConfig: { interval } })), {
      strategy: 'TimeSlicing',
      interval,
    });
  assert.deepEqual(applied(gpuConfig({ strategy: 'MPS' })), { strategy: 'MPS' });
  assert.deepEqual(
    applied(
      gpuConfig({
        strategy: 'MPS',
        mpsConfig: {
          defaultActiveThreadPercentage: 0,
          defaultPinnedDeviceMemoryLimit: '10Gi',
          defaultPerDevicePinnedMemoryLimit: { 'GPU-b': '2Gi', 0: 1048576 },
          multiUser: true,
        },
      }),
    ),
    {
      strategy: 'MPS',
      defaultActiveThreadPercentage: 0,
      defaultPinnedDeviceMemoryLimit: 10 * 1024 * MI,
      defaultPerDevicePinnedMemoryLimit: { 0: MI, 'GPU-b': 2048 * MI },
      multiUser: true,
    },
  );
  assert.deepEqual(applied(gpuConfig({ strategy: 'MPS', mpsConfig: { defaultActiveThreadPercentage: 100 } })), {
    strategy: 'MPS',
    defaultActiveThreadPercentage: 100,
  });
});

test('MigDeviceConfig: MPS applies; TimeSlicing sets nothing on a MIG device', () => {
  assert.deepEqual(applied(migConfig({ strategy: 'MPS', mpsConfig: { defaultActiveThreadPercentage: 25 } }), 'mig'), {
    strategy: 'MPS',
    defaultActiveThreadPercentage: 25,
  });
  assert.equal(applied(migConfig({ strategy: 'TimeSlicing' }), 'mig'), undefined);
  assert.equal(applied(migConfig(), 'mig'), undefined);
});

test('validation: each refusal names the field path and what would be right', () => {
  const mps = (mpsConfig: unknown): Params => gpuConfig({ strategy: 'MPS', mpsConfig });
  assert.equal(
    appliedError(mps({ defaultActiveThreadPercentage: 150 })),
    `${P}.sharing.mpsConfig.defaultActiveThreadPercentage: 150 is not within 0..100 ` +
      "(the percentage of the GPU's threads a client may use)",
  );
  assert.match(appliedError(mps({ defaultActiveThreadPercentage: -1 })), /defaultActiveThreadPercentage: -1 is not/);
  assert.match(
    appliedError(gpuConfig({ strategy: 'Exclusive' })),
    new RegExp(`^${esc(P)}\\.sharing\\.strategy: "Exclusive" is not a sharing strategy; it is TimeSlicing or MPS$`),
  );
  assert.match(appliedError(gpuConfig({})), /sharing\.strategy: "" is not a sharing strategy/);
  assert.match(appliedError(migConfig({ strategy: 'Spatial' }), 'mig'), /sharing\.strategy: "Spatial" is not/);
  assert.equal(
    appliedError(gpuConfig({ strategy: 'TimeSlicing', timeSlicingConfig: { interval: 'Forever' } })),
    `${P}.sharing.timeSlicingConfig.interval: "Forever" is not a time-slice interval; ` +
      'it is Default, Short, Medium or Long',
  );
  assert.equal(
    appliedError(gpuConfig({ strategy: 'TimeSlicing', mpsConfig: {} })),
    `${P}.sharing.mpsConfig: is set with strategy TimeSlicing; it goes with strategy MPS (remove it)`,
  );
  assert.equal(
    appliedError(gpuConfig({ strategy: 'MPS', timeSlicingConfig: { interval: 'Short' } })),
    `${P}.sharing.timeSlicingConfig: is set with strategy MPS; it goes with strategy TimeSlicing (remove it)`,
  );
  assert.equal(
    appliedError(mps({ defaultPinnedDeviceMemoryLimit: '512Ki' })),
    `${P}.sharing.mpsConfig.defaultPinnedDeviceMemoryLimit: "512Ki" is less than 1Mi; ` +
      'MPS limits pinned memory in whole MiB',
  );
  assert.match(
    appliedError(mps({ defaultPerDevicePinnedMemoryLimit: { 1: '0' } })),
    new RegExp(`^${esc(P)}\\.sharing\\.mpsConfig\\.defaultPerDevicePinnedMemoryLimit\\["1"\\]: "0" is less than 1Mi`),
  );
  assert.match(
    appliedError(migConfig({ strategy: 'MPS', mpsConfig: { defaultActiveThreadPercentage: 101 } }), 'mig'),
    /mpsConfig\.defaultActiveThreadPercentage: 101 is not within 0\.\.100/,
  );
});

test('decoding is strict: unknown fields, wrong types, versions and kinds are refused naming the field', () => {
  // The second entry (config[1]), after a valid class config.
  const err = (parameters: unknown): string => decodeError([entry(gpuConfig(), 'FromClass'), entry(parameters)]);
  const Q = 'status.allocation.devices.config[1].opaque.parameters';
  assert.equal(
    err({ ...gpuConfig(), metadata: {} }),
    `${Q}.metadata: unknown field (the fields here: apiVersion, kind, sharing)`,
  );
  assert.equal(
    err(gpuConfig({ strategy: 'MPS', Strategy: 'MPS' })),
    `${Q}.sharing.Strategy: unknown field (the fields here: strategy, timeSlicingConfig, mpsConfig)`,
  );
  // A MigDeviceConfig has no timeSlicingConfig.
  assert.equal(
    err(migConfig({ strategy: 'TimeSlicing', timeSlicingConfig: {} })),
    `${Q}.sharing.timeSlicingConfig: unknown field (the fields here: strategy, mpsConfig)`,
  );
  assert.match(
    err(gpuConfig({ strategy: 'TimeSlicing', timeSlicingConfig: { interval: 'Short', period: 3 } })),
    /sharing\.timeSlicingConfig\.period: unknown field \(the fields here: interval\)/,
  );
  assert.match(
    err(gpuConfig({ strategy: 'MPS', mpsConfig: { activeThreads: 3 } })),
    /sharing\.mpsConfig\.activeThreads: unknown field \(the fields here: defaultActiveThreadPercentage, /,
  );
  assert.match(
    err(gpuConfig({ strategy: 'MPS', mpsConfig: { defaultActiveThreadPercentage: '50' } })),
    /mpsConfig\.defaultActiveThreadPercentage: "50" is not an integer/,
  );
  assert.match(
    err(gpuConfig({ strategy: 'MPS', mpsConfig: { defaultActiveThreadPercentage: 50.5 } })),
    /defaultActiveThreadPercentage: 50\.5 is not an integer/,
  );
  assert.equal(
    err(gpuConfig({ strategy: 'MPS', mpsConfig: { defaultPinnedDeviceMemoryLimit: '10 GB' } })),
    `${Q}.sharing.mpsConfig.defaultPinnedDeviceMemoryLimit: "10 GB" is not a non-negative quantity of bytes ` +
      '(e.g. 4Gi, 512Mi)',
  );
  assert.match(
    err(gpuConfig({ strategy: 'MPS', mpsConfig: { defaultPerDevicePinnedMemoryLimit: { 'GPU-a': '-1Gi' } } })),
    /defaultPerDevicePinnedMemoryLimit\["GPU-a"\]: "-1Gi" is not a non-negative quantity/,
  );
  assert.match(
    err(gpuConfig({ strategy: 'MPS', mpsConfig: { defaultPerDevicePinnedMemoryLimit: ['1Gi'] } })),
    /defaultPerDevicePinnedMemoryLimit: \["1Gi"\] is not a map of device to quantity/,
  );
  assert.match(err(gpuConfig({ strategy: 'MPS', mpsConfig: { multiUser: 'yes' } })), /multiUser: "yes" is not true/);
  assert.match(err(gpuConfig({ strategy: 7 })), /sharing\.strategy: 7 is not a string/);
  assert.match(err(gpuConfig('MPS')), /opaque\.parameters\.sharing: "MPS" is not an object/);
  assert.match(err(gpuConfig({ strategy: 'MPS', mpsConfig: 1 })), /sharing\.mpsConfig: 1 is not an object/);
  assert.match(
    err(gpuConfig({ strategy: 'TimeSlicing', timeSlicingConfig: { interval: 2 } })),
    /timeSlicingConfig\.interval: 2 is not a string/,
  );
  assert.equal(
    err({ apiVersion: 'resource.nvidia.com/v1alpha1', kind: 'GpuConfig' }),
    `${Q}.apiVersion: "resource.nvidia.com/v1alpha1" is not resource.nvidia.com/v1beta1, the version this driver reads`,
  );
  assert.match(err({ kind: 'GpuConfig' }), /parameters\.apiVersion: \(none\) is not resource\.nvidia\.com\/v1beta1/);
  for (const kind of ['VfioDeviceConfig', 'ComputeDomainChannelConfig', 'ComputeDomainDaemonConfig'])
    assert.equal(
      err({ apiVersion: API, kind }),
      `${Q}.kind: "${kind}" is not supported by this driver; this driver applies GpuConfig and MigDeviceConfig`,
    );
  assert.match(err({ apiVersion: API, kind: 'TpuConfig' }), /kind: "TpuConfig" is not a kind of resource\.nvidia/);
  assert.match(err({ apiVersion: API }), /parameters\.kind: \(none\) is not a kind of/);
  assert.match(err('GpuConfig'), /opaque\.parameters: "GpuConfig" is not an object; expected \{apiVersion: /);
  // The entry itself.
  assert.match(decodeError('x'), /^status\.allocation\.devices\.config: "x" is not a list$/);
  assert.match(decodeError([7]), /^status\.allocation\.devices\.config\[0\]: 7 is not an object$/);
  assert.match(
    decodeError([{ source: 'FromPod', opaque: { driver: DRIVER, parameters: gpuConfig() } }]),
    /config\[0\]\.source: "FromPod" is neither FromClass nor FromClaim/,
  );
  assert.match(
    decodeError([entry(gpuConfig(), 'FromClaim', 'r' as never)]),
    /config\[0\]\.requests: "r" is not a list/,
  );
});

test("other drivers' configs and entries without opaque parameters are not read, however they look", () => {
  assert.deepEqual(configs(undefined), []);
  assert.deepEqual(configs(null), []);
  assert.deepEqual(configs([entry({ anything: true }, 'FromClass', undefined, 'nic.example.com')]), []);
  assert.deepEqual(configs([{ source: 'FromClaim' }]), []);
});

test('a decoded config that is invalid fails only where it applies', () => {
  const list = configs([entry(migConfig({ strategy: 'Bogus' }), 'FromClass'), entry(gpuConfig(), 'FromClass')]);
  assert.deepEqual(sharingFor(list, 'r', 'gpu', 'gpu-0'), { config: 1 });
  const mig = sharingFor(list, 'r', 'mig', 'gpu-0-mig-1g10gb-19-0');
  assert.ok('error' in mig);
  assert.match(mig.error, /^status\.allocation\.devices\.config\[0\]\.opaque\.parameters\.sharing\.strategy: "Bogus"/);
});

const ts = (interval: string): Params => gpuConfig({ strategy: 'TimeSlicing', timeSlicingConfig: { interval } });

test('precedence: class configs before claim configs, later entries over earlier ones, requests scope them', () => {
  // The claim's config wins over the class's, wherever the class's entry sits in the list.
  const list = configs([
    entry(ts('Short'), 'FromClaim'),
    entry(ts('Long'), 'FromClass'),
    entry(gpuConfig({ strategy: 'MPS' }), 'FromClass', ['other']),
  ]);
  assert.deepEqual(
    list.map((c) => c.index),
    [1, 2, 0],
  );
  assert.deepEqual(sharingFor(list, 'r', 'gpu', 'gpu-0'), {
    sharing: { strategy: 'TimeSlicing', interval: 'Short' },
    config: 0,
  });
  // The class's config naming the request is still below the claim's naming none.
  assert.deepEqual(sharingFor(list, 'other', 'gpu', 'gpu-0'), {
    sharing: { strategy: 'TimeSlicing', interval: 'Short' },
    config: 0,
  });
  // Within one source, the later entry wins.
  const later = configs([entry(ts('Short')), entry(ts('Medium'))]);
  assert.deepEqual(sharingFor(later, 'r', 'gpu', 'gpu-0'), {
    sharing: { strategy: 'TimeSlicing', interval: 'Medium' },
    config: 1,
  });
  // A config naming requests applies to those only (a main request covers its subrequests).
  const scoped = configs([entry(ts('Long'), 'FromClaim', ['a']), entry(ts('Short'), 'FromClaim', ['b', 'c'])]);
  const intervalOf = (request: string): unknown => {
    const r = sharingFor(scoped, request, 'gpu', 'gpu-0');
    return 'sharing' in r ? (r.sharing as { interval: string }).interval : r;
  };
  assert.equal(intervalOf('a'), 'Long');
  assert.equal(intervalOf('b'), 'Short');
  assert.equal(intervalOf('c/small'), 'Short');
  assert.equal(intervalOf('a/big'), 'Long');
  assert.deepEqual(intervalOf('d'), {});
  assert.deepEqual(intervalOf('ab'), {});
  // No config at all: no sharing.
  assert.deepEqual(sharingFor([], 'r', 'gpu', 'gpu-0'), {});
});

test('kinds: a config naming no request applies to devices of its kind; one naming the request must fit it', () => {
  const unscoped = configs([entry(migConfig({ strategy: 'MPS' }), 'FromClass'), entry(ts('Long'), 'FromClaim')]);
  // The claim's GpuConfig is skipped for a MIG device; the class's MigDeviceConfig applies.
  assert.deepEqual(sharingFor(unscoped, 'r', 'mig', 'gpu-0-mig-1g10gb-19-0'), {
    sharing: { strategy: 'MPS' },
    config: 0,
  });
  assert.deepEqual(sharingFor(unscoped, 'r', 'gpu', 'gpu-0'), {
    sharing: { strategy: 'TimeSlicing', interval: 'Long' },
    config: 1,
  });
  const gpuOnMig = sharingFor(configs([entry(ts('Long'), 'FromClaim', ['r'])]), 'r', 'mig', 'gpu-0-mig-1g10gb-19-0');
  assert.deepEqual(gpuOnMig, {
    error:
      'status.allocation.devices.config[0]: a GpuConfig names request r, whose device gpu-0-mig-1g10gb-19-0 is ' +
      'a MIG device: a GpuConfig applies to whole GPUs, a MigDeviceConfig to MIG devices',
  });
  const migOnGpu = sharingFor(configs([entry(migConfig(), 'FromClaim', ['r'])]), 'r/one', 'gpu', 'gpu-3');
  assert.ok('error' in migOnGpu);
  assert.match(migOnGpu.error, /a MigDeviceConfig names request r\/one, whose device gpu-3 is a whole GPU: /);
});

test('per-device MPS limits: the default for each device, then entries by UUID or by sorted index', () => {
  const sharing = {
    strategy: 'MPS' as const,
    defaultPinnedDeviceMemoryLimit: 4 * MI,
    defaultPerDevicePinnedMemoryLimit: { 'GPU-c': 2 * MI, 0: 3 * MI },
  };
  assert.deepEqual(perDeviceLimits(sharing, ['GPU-c', 'GPU-b', 'GPU-d']), {
    limits: { 'GPU-b': 3 * MI, 'GPU-c': 2 * MI, 'GPU-d': 4 * MI },
  });
  assert.deepEqual(perDeviceLimits({ strategy: 'MPS', defaultPerDevicePinnedMemoryLimit: { 1: MI } }, ['A', 'B']), {
    limits: { B: MI },
  });
  for (const key of ['2', '-1', 'GPU-z', 'first'])
    assert.deepEqual(
      perDeviceLimits({ strategy: 'MPS', defaultPerDevicePinnedMemoryLimit: { [key]: MI } }, ['GPU-a', 'GPU-b']),
      {
        key,
        error:
          'names no device of the configuration (GPU-a, GPU-b); a key is one of their UUIDs or an index 0..1 ' +
          'into them sorted',
      },
    );
});

test('checkSharing: what the checkpoint reads back', () => {
  assert.equal(checkSharing({ strategy: 'TimeSlicing', interval: 'Long' }), null);
  assert.equal(
    checkSharing({
      strategy: 'MPS',
      defaultActiveThreadPercentage: 50,
      defaultPinnedDeviceMemoryLimit: MI,
      defaultPerDevicePinnedMemoryLimit: { 0: MI },
      multiUser: false,
    }),
    null,
  );
  assert.match(String(checkSharing({ strategy: 'TimeSlicing' })), /interval \(none\) is not Default, Short/);
  assert.match(String(checkSharing({ strategy: 'X' })), /strategy "X" is neither TimeSlicing nor MPS/);
  assert.match(String(checkSharing({ strategy: 'MPS', defaultActiveThreadPercentage: 101 })), /not within 0\.\.100/);
  assert.match(String(checkSharing({ strategy: 'MPS', defaultPinnedDeviceMemoryLimit: '1Gi' })), /not a byte count/);
  assert.match(
    String(checkSharing({ strategy: 'MPS', defaultPerDevicePinnedMemoryLimit: { 0: 1 } })),
    /not a map of byte counts/,
  );
  assert.match(String(checkSharing({ strategy: 'MPS', multiUser: 1 })), /multiUser 1 is not a boolean/);
  assert.match(String(checkSharing('MPS')), /is not an object/);
});

function esc(s: string): string {
  return s.replace(/[.*+?^${}()|[\]\\]/g, '\\$&');
}
