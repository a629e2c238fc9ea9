import { test } from 'node:test';
import assert from 'node:assert/strict';
import { OPTION_SPECS } from '../../src/config/option-table.ts';
import { OptionError, ConfigError } from '../../src/config/errors.ts';
import { helpText } from '../../src/config/describe-options.ts';
import { parseOptions } from '../../src/config/parse-options.ts';

test('defaults match NVIDIA plugin defaults', () => {
  const { options, origins } = parseOptions([], {});
  assert.equal(options.kubeletSocket, '/var/lib/kubelet/device-plugins/kubelet.sock');
  assert.equal(options.driverRoot, '/');
  assert.equal(options.devRoot, '/');
  assert.equal(options.deviceIdStrategy, 'uuid');
  assert.equal(options.passDeviceSpecs, false);
  assert.equal(options.failOnInitError, true);
  assert.equal(origins.kubeletSocket, 'default');
});

test('command line beats environment beats default, and origins say which', () => {
  const { options, origins } = parseOptions(['--device-id-strategy=index', '--pass-device-specs'], {
    DEVICE_ID_STRATEGY: 'uuid',
    KUBELET_SOCKET: '/k/kubelet.sock',
    FAIL_ON_INIT_ERROR: 'false',
    NVIDIA_DRIVER_ROOT: '/run/nvidia/driver',
  });
  assert.equal(options.deviceIdStrategy, 'index');
  assert.equal(origins.deviceIdStrategy, 'command line');
  assert.equal(options.kubeletSocket, '/k/kubelet.sock');
  assert.equal(origins.kubeletSocket, 'environment');
  assert.equal(options.failOnInitError, false);
  assert.equal(options.passDeviceSpecs, true);
  assert.equal(options.devRoot, '/run/nvidia/driver', 'dev-root follows driver-root unless set');
});

test('values can follow as separate arguments, and booleans take explicit values', () => {
  const { options } = parseOptions(
    ['--kubelet-socket', '/x/kubelet.sock', '--fail-on-init-error', 'false', '--pass-device-specs=true'],
    {},
  );
  assert.equal(options.kubeletSocket, '/x/kubelet.sock');
  assert.equal(options.failOnInitError, false);
  assert.equal(options.passDeviceSpecs, true);
});

test('bad input is refused naming the option, the value and what is allowed', () => {
  const cases: [string[], Record<string, string>, RegExp][] = [
    [['--device-id-strategy=foo'], {}, /--device-id-strategy: "foo" is not allowed; expected one of uuid, index/],
    [[], { DEVICE_ID_STRATEGY: 'mig' }, /environment variable DEVICE_ID_STRATEGY: "mig" is not allowed/],
    [['--pass-device-specs=maybe'], {}, /"maybe" is not a boolean; expected true or false/],
    [['--kubelet-socket=relative.sock'], {}, /not an absolute path/],
    [['--no-such-flag'], {}, /unknown option --no-such-flag/],
    [['positional'], {}, /unexpected argument "positional"/],
    [['--kubelet-socket'], {}, /--kubelet-socket needs a value/],
    [['--log-level=debug', '--log-level=info'], {}, /given more than once/],
    [['--socket-check-interval=0'], {}, /from 0.1 to 3600/],
  ];
  for (const [argv, env, re] of cases) {
    assert.throws(
      () => parseOptions(argv, env),
      (e: unknown) => e instanceof OptionError && re.test(e.message),
      String(re),
    );
  }
});

test('help lists every option with its env var and default', () => {
  const text = helpText('1.2.3');
  for (const s of OPTION_SPECS) {
    assert.match(text, new RegExp(`--${s.flag}\\b`));
    assert.match(text, new RegExp(`env ${s.env};`));
  }
});

test(
  'durations: plain decimal seconds or Go-style units, the same from flags, ' +
    'environment and config file; anything else refused saying what is right',
  () => {
    const accepted: [string, number][] = [
      ['5', 5],
      ['0.5', 0.5],
      ['5s', 5],
      ['500ms', 0.5],
      ['5m', 300],
      ['1h', 3600],
      ['1m30s', 90],
      ['0.1s', 0.1],
    ];
    for (const [raw, want] of accepted) {
      assert.equal(parseOptions([`--health-probe-interval=${raw}`], {}).options.healthProbeInterval, want, raw);
      assert.equal(parseOptions([], { HEALTH_PROBE_INTERVAL: raw }).options.healthProbeInterval, want, raw);
      const file = parseOptions(
        ['--config-file=/c.yaml'],
        {},
        { readFile: () => `flags:\n  healthProbeInterval: "${raw}"\n` },
      );
      assert.equal(file.options.healthProbeInterval, want, raw);
    }
    for (const raw of ['0x10', '1e3', '5 ', ' 5', '-1', '.5', '5.', '5sec', '5d', '+5', 'Infinity', 'NaN', '１']) {
      const grammar = new RegExp(
        String.raw`is not a duration; expected a decimal number of seconds \(5, 0\.5\) ` +
          String.raw`or a duration with units ms, s, m, h .*from 0\.05 to 3600 seconds`,
      );
      assert.throws(
        () => parseOptions([`--health-probe-interval=${raw}`], {}),
        (e: unknown) =>
          e instanceof OptionError &&
          e.message.startsWith(`--health-probe-interval: ${JSON.stringify(raw)} is not`) &&
          grammar.test(e.message),
        raw,
      );
      assert.throws(
        () => parseOptions([], { HEALTH_PROBE_INTERVAL: raw }),
        (e: unknown) =>
          e instanceof OptionError &&
          e.message.startsWith('environment variable HEALTH_PROBE_INTERVAL:') &&
          grammar.test(e.message),
        raw,
      );
      assert.throws(
        () =>
          parseOptions(
            ['--config-file=/c.yaml'],
            {},
            { readFile: () => `flags:\n  healthProbeInterval: ${JSON.stringify(raw)}\n` },
          ),
        (e: unknown) =>
          e instanceof ConfigError &&
          e.message.startsWith('config file /c.yaml: flags.healthProbeInterval:') &&
          grammar.test(e.message),
        raw,
      );
    }
  },
);

test('every duration option has a range, enforced from every source and shown in --help', () => {
  const help = helpText('1.2.3');
  const durations = OPTION_SPECS.filter((s) => s.kind.type === 'seconds');
  assert.ok(durations.length >= 5);
  for (const s of durations) {
    if (s.kind.type !== 'seconds') continue;
    const { min, max } = s.kind;
    assert.ok(Number.isFinite(min) && Number.isFinite(max) && min < max, s.flag);
    assert.match(
      help,
      new RegExp(`--${s.flag} \\(duration from ${min.toString().replace('.', '\\.')} to ${max} seconds`),
    );
    const over = String(max + 1);
    const range = new RegExp(
      `"${over}" is out of range; expected from ${min.toString().replace('.', '\\.')} to ${max} seconds`,
    );
    assert.throws(
      () => parseOptions([`--${s.flag}=${over}`], {}),
      (e: unknown) => e instanceof OptionError && range.test(e.message),
      s.flag,
    );
    assert.throws(
      () => parseOptions([], { [s.env]: over }),
      (e: unknown) => e instanceof OptionError && range.test(e.message),
      s.env,
    );
    assert.throws(
      () =>
        parseOptions(
          ['--config-file=/c.yaml'],
          {},
          { readFile: () => `flags:\n  ${s.config!.replace('flags.', '')}: ${over}\n` },
        ),
      (e: unknown) => e instanceof ConfigError && range.test(e.message),
      s.config,
    );
    assert.equal(parseOptions([`--${s.flag}=${max}`], {}).options[s.key], max);
    assert.equal(parseOptions([`--${s.flag}=${min}`], {}).options[s.key], min);
  }
  assert.throws(
    () => parseOptions(['--health-probe-interval=2h'], {}),
    /"2h" \(7200 seconds\) is out of range; expected from 0\.05 to 3600 seconds/,
  );
});
