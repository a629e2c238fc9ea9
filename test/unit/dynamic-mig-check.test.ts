// `check`'s dynamic MIG line (cli/dynamic-mig-view.ts) on plain reports: silent when off, what it covers when on,
// and each setting that keeps it from running named with what would be right.
import assert from 'node:assert/strict';
import { test } from 'node:test';
import { dynamicMigCheck } from '../../src/cli/dynamic-mig-view.ts';
import type { NodeReport } from '../../src/cli/inspect.ts';
import type { Options } from '../../src/config/options.ts';

const gpu = {
  index: 0,
  uuid: 'GPU-0',
  name: 'NVIDIA A100-SXM4-40GB',
  minor: 0,
  busId: '0:7:0.0',
  memoryBytes: 1,
  numaNode: 0,
};
const oneG = { id: 19, name: '1g.5gb', multiprocessors: 14, copyEngines: 1, decoders: 0, encoders: 0 };
const profile = {
  ...oneG,
  jpegEngines: 0,
  ofaEngines: 0,
  memoryMiB: 4864,
  placements: [0, 1, 2].map((s) => ({ start: s, size: 1 })),
};
const report = (partitionable: boolean): NodeReport =>
  ({
    gpus: [gpu],
    mig: {
      modes: [{ current: true, pending: true }],
      devices: [],
      ...(partitionable ? { partitionable: new Map([['GPU-0', { profiles: [profile], instances: [] }]]) } : {}),
    },
  }) as unknown as NodeReport;
const options = (o: Partial<Options>): Options => ({ kubeletApi: 'dra', migStrategy: 'mixed', ...o }) as Options;

test('dynamic MIG in check: nothing when off; the GPUs it covers when on; what is missing named', () => {
  assert.deepEqual(dynamicMigCheck(report(true), options({}), false), []);
  assert.deepEqual(dynamicMigCheck(report(true), options({}), true), [
    { status: 'PASS', name: 'dynamic mig', detail: 'covers 1 GPU: GPU 0 (3 free placements, 0 instances)' },
  ]);
  assert.equal(dynamicMigCheck(report(true), options({ migStrategy: 'none' }), true)[0]?.status, 'FAIL');
  assert.match(dynamicMigCheck(report(true), options({ migStrategy: 'none' }), true)[0]?.fix ?? '', /mixed/);
  assert.equal(dynamicMigCheck(report(true), options({ kubeletApi: 'device-plugin' }), true)[0]?.status, 'WARN');
  assert.match(dynamicMigCheck(report(false), options({}), true)[0]?.detail ?? '', /no GPU is in MIG mode/);
});
