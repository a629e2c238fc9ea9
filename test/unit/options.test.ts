import { test } from 'node:test';
import assert from 'node:assert/strict';
import { OPTION_SPECS, OptionError, helpText, parseOptions } from '../../src/cli/options.ts';

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
    DEVICE_ID_STRATEGY: 'uuid', KUBELET_SOCKET: '/k/kubelet.sock', FAIL_ON_INIT_ERROR: 'false', NVIDIA_DRIVER_ROOT: '/run/nvidia/driver',
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
  const { options } = parseOptions(['--kubelet-socket', '/x/kubelet.sock', '--fail-on-init-error', 'false', '--pass-device-specs=true'], {});
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
    assert.throws(() => parseOptions(argv, env), (e: unknown) => e instanceof OptionError && re.test(e.message), String(re));
  }
});

test('help lists every option with its env var and default', () => {
  const text = helpText('1.2.3');
  for (const s of OPTION_SPECS) {
    assert.match(text, new RegExp(`--${s.flag}\\b`));
    assert.match(text, new RegExp(`env ${s.env};`));
  }
});
