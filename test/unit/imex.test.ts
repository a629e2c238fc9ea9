// IMEX channels: the options (NVIDIA's names, only [] or [0]), the choice of channels from the device
// nodes present, and what Allocate adds for each device-list strategy.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { mkdtempSync, mkdirSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { allocate, indexDevices } from '../../src/core/allocate.ts';
import type { AllocateSettings } from '../../src/core/allocate.ts';
import { wholeGpuDevices } from '../../src/core/devices.ts';
import type { Gpu } from '../../src/core/devices.ts';
import { chooseImexChannels, imexChannelPath } from '../../src/core/imex.ts';
import { OptionError } from '../../src/config/errors.ts';
import { parseOptions } from '../../src/config/parse-options.ts';
import { findImexChannels } from '../../src/system/imex.ts';

const gpus: Gpu[] = [0, 1].map((i) => ({
  index: i,
  uuid: `GPU-${i}`,
  name: 'Test GPU',
  minor: i,
  busId: `00000000:0${i}:00.0`,
  memoryBytes: 1 << 30,
  numaNode: 0,
}));
const index = indexDevices(wholeGpuDevices(gpus, 'uuid'), gpus);
const base: AllocateSettings = {
  passDeviceSpecs: false,
  devRoot: '/',
  presentControlDevices: [],
  newUuid: () => 'u-u-i-d',
};

test(
  '--imex-channel-ids / IMEX_CHANNEL_IDS / imex.channelIDs and ' +
    '--imex-required / IMEX_REQUIRED / imex.required are read with precedence',
  () => {
    const none = parseOptions([], {});
    assert.deepEqual(none.options.imexChannelIds, []);
    assert.equal(none.options.imexRequired, false);
    assert.deepEqual(parseOptions(['--imex-channel-ids=0', '--imex-required'], {}).options, {
      ...parseOptions([], {}).options,
      imexChannelIds: [0],
      imexRequired: true,
    });
    const env = parseOptions([], { IMEX_CHANNEL_IDS: '0', IMEX_REQUIRED: 'true' });
    assert.deepEqual(
      [env.options.imexChannelIds, env.options.imexRequired, env.origins.imexChannelIds],
      [[0], true, 'environment'],
    );
    const dir = mkdtempSync(join(tmpdir(), 'gdp-imex-cfg-'));
    try {
      const file = join(dir, 'config.yaml');
      writeFileSync(file, 'version: v1\nimex:\n  channelIDs: [0]\n  required: true\n');
      const f = parseOptions(['--config-file', file], {});
      assert.deepEqual(
        [f.options.imexChannelIds, f.options.imexRequired, f.origins.imexRequired],
        [[0], true, `config file ${file}`],
      );
      // The command line beats the file; an empty list asks for no channel.
      assert.deepEqual(parseOptions(['--config-file', file, '--imex-channel-ids='], {}).options.imexChannelIds, []);
      writeFileSync(file, 'imex:\n  channelIDs: []\n');
      assert.deepEqual(parseOptions(['--config-file', file], {}).options.imexChannelIds, []);
      writeFileSync(file, 'imex:\n  channelIDs: [1]\n');
      assert.throws(
        () => parseOptions(['--config-file', file], {}),
        /imex\.channelIDs: "1" is not allowed; only \[0\] or none \(empty\) is supported/,
      );
      writeFileSync(file, 'imex:\n  channelIDs: 0\n');
      assert.throws(() => parseOptions(['--config-file', file], {}), /imex\.channelIDs: 0 is not allowed; expected/);
    } finally {
      rmSync(dir, { recursive: true, force: true });
    }
  },
);

test('only [] or [0]: other channel lists are refused naming the source and what is allowed', () => {
  const cases: [string[], Record<string, string>, RegExp][] = [
    [
      ['--imex-channel-ids=0,1'],
      {},
      /^--imex-channel-ids: "0,1" is not allowed; only \[0\] or none \(empty\) is supported, as in NVIDIA's plugin$/,
    ],
    [['--imex-channel-ids', '2'], {}, /^--imex-channel-ids: "2" is not allowed/],
    [[], { IMEX_CHANNEL_IDS: 'zero' }, /^environment variable IMEX_CHANNEL_IDS: "zero" is not allowed/],
    [[], { IMEX_CHANNEL_IDS: '-1' }, /^environment variable IMEX_CHANNEL_IDS: "-1" is not allowed/],
    [[], { IMEX_REQUIRED: 'maybe' }, /^environment variable IMEX_REQUIRED: "maybe" is not a boolean/],
  ];
  for (const [argv, env, re] of cases)
    assert.throws(
      () => parseOptions(argv, env),
      (e: unknown) => e instanceof OptionError && re.test(e.message),
      String(re),
    );
  assert.deepEqual(
    parseOptions(['--imex-channel-ids', '0,0'], {}).options.imexChannelIds,
    [0],
    'a repeated channel counts once',
  );
});

test(
  'a configured channel is passed when its device node ' +
    'exists, skipped with a reason when not, fatal when required',
  () => {
    const present = new Set([imexChannelPath(0)]);
    assert.equal(imexChannelPath(0), '/dev/nvidia-caps-imex-channels/channel0');
    assert.deepEqual(chooseImexChannels([0], present, false, '/'), { channels: [0], missing: [], fatal: null });
    assert.deepEqual(chooseImexChannels([0], present, true, '/'), { channels: [0], missing: [], fatal: null });
    assert.deepEqual(chooseImexChannels([], new Set(), true, '/'), { channels: [], missing: [], fatal: null });
    const skipped = chooseImexChannels([0], new Set(), false, '/run/nvidia/driver/');
    assert.deepEqual(skipped.channels, []);
    assert.deepEqual(skipped.missing, [
      'IMEX channel 0: /run/nvidia/driver/dev/nvidia-caps-imex-channels/channel0 does not exist',
    ]);
    assert.equal(skipped.fatal, null);
    const fatal = chooseImexChannels([0], new Set(), true, '/');
    assert.match(
      fatal.fatal ?? '',
      new RegExp(
        String.raw`^IMEX channel 0: \/dev\/nvidia-caps-imex-channels\/channel0 does not exist, ` +
          String.raw`and --imex-required is set; is the IMEX daemon \(nvidia-imex\) running`,
      ),
    );
  },
);

test('the channel device node is looked for under the dev root', async () => {
  const root = mkdtempSync(join(tmpdir(), 'gdp-imex-dev-'));
  try {
    assert.deepEqual((await findImexChannels([0], false, root)).channels, []);
    mkdirSync(join(root, 'dev', 'nvidia-caps-imex-channels'), { recursive: true });
    writeFileSync(join(root, 'dev', 'nvidia-caps-imex-channels', 'channel0'), '');
    assert.deepEqual(await findImexChannels([0], true, root), { channels: [0], missing: [], fatal: null });
  } finally {
    rmSync(root, { recursive: true, force: true });
  }
});

test('Allocate with channels: NVIDIA_IMEX_CHANNELS with envvar, beside the GPUs in every container', () => {
  const res = allocate([{ devices_ids: ['GPU-1'] }, { devices_ids: ['GPU-0'] }], index, { ...base, imexChannels: [0] });
  assert.deepEqual(
    res.map((r) => r.envs),
    [
      { NVIDIA_VISIBLE_DEVICES: 'GPU-1', NVIDIA_IMEX_CHANNELS: '0' },
      { NVIDIA_VISIBLE_DEVICES: 'GPU-0', NVIDIA_IMEX_CHANNELS: '0' },
    ],
  );
  assert.deepEqual(
    allocate([{ devices_ids: ['GPU-1'] }], index, { ...base, imexChannels: [] })[0]!.envs,
    { NVIDIA_VISIBLE_DEVICES: 'GPU-1' },
    'no channel, no variable',
  );
  assert.deepEqual(allocate([{ devices_ids: ['GPU-1'] }], index, base)[0]!.envs, { NVIDIA_VISIBLE_DEVICES: 'GPU-1' });
});

test(
  'Allocate with channels: the CDI device imex-channel=<id> ' + 'with cdi-annotations and cdi-cri, and no variable',
  () => {
    const [ann] = allocate([{ devices_ids: ['GPU-0', 'GPU-1'] }], index, {
      ...base,
      imexChannels: [0],
      deviceListStrategies: ['cdi-annotations'],
    });
    assert.deepEqual(ann!.annotations, {
      'cdi.k8s.io/nvidia-device-plugin_u-u-i-d':
        'k8s.device-plugin.nvidia.com/gpu=GPU-0,k8s.device-plugin.nvidia.com/gpu=GPU-1,' +
        'k8s.device-plugin.nvidia.com/imex-channel=0',
    });
    assert.deepEqual(ann!.envs, {});
    const [cri] = allocate([{ devices_ids: ['GPU-1'] }], index, {
      ...base,
      imexChannels: [0],
      deviceListStrategies: ['cdi-cri'],
      passDeviceSpecs: true,
    });
    assert.deepEqual(cri!.cdi_devices, [
      { name: 'k8s.device-plugin.nvidia.com/gpu=GPU-1' },
      { name: 'k8s.device-plugin.nvidia.com/imex-channel=0' },
    ]);
    assert.deepEqual([cri!.envs, cri!.devices], [{}, []], 'CDI only: no variables, no device specs');
  },
);

test('Allocate with channels and --pass-device-specs: the channel device, rw, host path under the dev root', () => {
  const [r] = allocate([{ devices_ids: ['GPU-1'] }], index, {
    ...base,
    passDeviceSpecs: true,
    devRoot: '/run/nvidia/driver',
    presentControlDevices: ['/dev/nvidiactl'],
    imexChannels: [0],
  });
  assert.deepEqual(r!.devices, [
    { container_path: '/dev/nvidiactl', host_path: '/run/nvidia/driver/dev/nvidiactl', permissions: 'rw' },
    { container_path: '/dev/nvidia1', host_path: '/run/nvidia/driver/dev/nvidia1', permissions: 'rw' },
    {
      container_path: '/dev/nvidia-caps-imex-channels/channel0',
      host_path: '/run/nvidia/driver/dev/nvidia-caps-imex-channels/channel0',
      permissions: 'rw',
    },
  ]);
  assert.deepEqual(r!.envs, { NVIDIA_VISIBLE_DEVICES: 'GPU-1', NVIDIA_IMEX_CHANNELS: '0' });
});
