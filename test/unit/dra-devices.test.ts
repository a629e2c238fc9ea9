// core/dra-devices.ts: which devices a node publishes through DRA and their names (NVIDIA's DRA
// driver's), on snapshots read from the fixtures by the real scan over the fake NVML.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { DNS_LABEL, draDevices, gpuDeviceName, migDeviceName } from '../../src/core/dra-devices.ts';
import { partitionDeviceName } from '../../src/core/dynamic-mig.ts';
import type { MigDevice } from '../../src/core/mig.ts';
import { fixtureSnapshot } from '../support/node-scan.ts';
import { migUuid } from '../support/mig.ts';

test(
  'names: gpu-<minor>; MIG gpu-<parent minor>-mig-<profile ' +
    'without dots, lower case>-<GI profile id>-<placement start>',
  () => {
    assert.equal(gpuDeviceName({ minor: 3 }), 'gpu-3');
    // An instance that exists is named as the partition it was made from: one name for one placement.
    for (const [profile, id, start] of [
      ['1g.10gb+me', 20, 6],
      ['1c.2g.20gb', 14, 2],
    ] as const) {
      assert.equal(
        migDeviceName({ minor: 1 }, { profile, giProfileId: id, placementStart: start }),
        partitionDeviceName(1, { name: profile, id }, start),
      );
    }
    assert.equal(
      migDeviceName({ minor: 0 }, { profile: '1g.12gb', giProfileId: 19, placementStart: 0 }),
      'gpu-0-mig-1g12gb-19-0',
    );
    assert.equal(
      migDeviceName({ minor: 2 }, { profile: '3g.40gb', giProfileId: 9, placementStart: 4 }),
      'gpu-2-mig-3g40gb-9-4',
    );
    // NVML could not say: no name rather than one NVIDIA's driver would not give.
    assert.equal(migDeviceName({ minor: 0 }, { profile: '1g.10gb' }), null);
  },
);

test('8-GPU fixture: eight whole GPUs gpu-0..gpu-7 in snapshot order, with their UUIDs and positions', async () => {
  const s = await fixtureSnapshot('nvswitch-8.json');
  const list = draDevices(s, 'none');
  assert.deepEqual(list.notes, []);
  assert.deepEqual(
    list.devices.map((d) => [d.name, d.kind, d.gpu, d.uuid, d.mig]),
    s.gpus.map((g, i) => [`gpu-${g.minor}`, 'gpu', i, g.uuid, undefined]),
  );
  assert.equal(list.devices.length, 8);
});

test(
  "MIG fixture, mixed: MIG devices of MIG-enabled GPUs instead of them (named from NVML's " +
    'GI profile id and placement), the MIG-disabled GPU whole; sub-instance and empty GPU noted',
  async () => {
    const s = await fixtureSnapshot('mig-mixed-4.json', 'mixed');
    const list = draDevices(s, 'mixed');
    const g = s.gpus;
    assert.deepEqual(
      list.devices.map((d) => [d.name, d.kind, d.gpu, d.uuid, d.mig?.uuid]),
      [
        ['gpu-0-mig-1g10gb-19-0', 'mig', 0, g[0]?.uuid, migUuid(g[0]!.uuid, '1g.10gb', 1)],
        ['gpu-0-mig-1g10gb-19-1', 'mig', 0, g[0]?.uuid, migUuid(g[0]!.uuid, '1g.10gb', 2)],
        ['gpu-0-mig-1g10gb-me-20-6', 'mig', 0, g[0]?.uuid, migUuid(g[0]!.uuid, '1g.10gb+me', 3)],
        ['gpu-0-mig-2g20gb-14-2', 'mig', 0, g[0]?.uuid, migUuid(g[0]!.uuid, '2g.20gb', 4)],
        ['gpu-1-mig-3g40gb-9-0', 'mig', 1, g[1]?.uuid, migUuid(g[1]!.uuid, '3g.40gb', 1)],
        ['gpu-1-mig-1g20gb-15-6', 'mig', 1, g[1]?.uuid, migUuid(g[1]!.uuid, '1g.20gb', 2)],
        ['gpu-1-mig-1g10gb-19-4', 'mig', 1, g[1]?.uuid, migUuid(g[1]!.uuid, '1g.10gb', 3)],
        ['gpu-1-mig-1g10gb-19-5', 'mig', 1, g[1]?.uuid, migUuid(g[1]!.uuid, '1g.10gb', 4)],
        ['gpu-2', 'gpu', 2, g[2]?.uuid, undefined],
      ],
    );
    for (const d of list.devices) assert.match(d.name, DNS_LABEL);
    assert.equal(list.notes.length, 2);
    assert.match(list.notes[0] ?? '', /1c\.2g\.20gb on GPU 0\) is not published: only full compute instances/);
    assert.match(
      list.notes[1] ?? '',
      /GPU 3 \(GPU-9f8e7d6c-5b4a-4392-8170-6f5e4d3c2b40\) has MIG enabled but no MIG devices/,
    );
    // single means the same in DRA (no resource name to keep uniform).
    assert.deepEqual(
      draDevices(s, 'single').devices.map((d) => d.name),
      list.devices.map((d) => d.name),
    );
  },
);

test('MIG fixture, strategy none: every GPU whole, MIG not looked at', async () => {
  const s = await fixtureSnapshot('mig-mixed-4.json', 'none');
  assert.deepEqual(
    draDevices(s, 'none').devices.map((d) => d.name),
    ['gpu-0', 'gpu-1', 'gpu-2', 'gpu-3'],
  );
});

test(
  'a MIG device without GI profile id or placement, and ' + 'a repeated name, are left out with a note naming them',
  async () => {
    const s = await fixtureSnapshot('mig-mixed-4.json', 'mixed');
    const [first, second] = s.mig.devices as [MigDevice, MigDevice];
    const { giProfileId: _id, placementStart: _start, ...blind } = first;
    const twin: MigDevice = {
      ...second,
      giProfileId: first.giProfileId as number,
      placementStart: first.placementStart as number,
    };
    const list = draDevices(
      { gpus: s.gpus, mig: { modes: s.mig.modes, devices: [first, twin, { ...blind, uuid: 'MIG-blind' }] } },
      'mixed',
    );
    assert.deepEqual(
      list.devices.filter((d) => d.kind === 'mig').map((d) => d.mig?.uuid),
      [first.uuid],
    );
    assert.match(
      list.notes.join('\n'),
      new RegExp(
        `MIG device ${twin.uuid} .* is not published: its DRA device ` +
          `name gpu-0-mig-1g10gb-19-0 is already MIG device ${first.uuid}`,
      ),
    );
    assert.match(list.notes.join('\n'), /MIG device MIG-blind .* NVML gave no GPU-instance profile id or placement/);
  },
);
