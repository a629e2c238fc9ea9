// A dynamic MIG partition's CDI spec: the two capability nodes with the driver's nvidia-caps major and the minors
// the agent read back, the MIG UUID for CUDA, one device per partition named by claim and device.
import assert from 'node:assert/strict';
import { test } from 'node:test';
import { capsMajor, partitionCdiSpec } from '../../src/core/dra-partition-cdi.ts';

const PROC_DEVICES =
  'Character devices:\n  1 mem\n195 nvidia-frontend\n236 nvidia-caps\n237 nvidia-uvm\n\nBlock devices:\n';

test('capsMajor reads the nvidia-caps line of /proc/devices; null without one', () => {
  assert.equal(capsMajor(PROC_DEVICES), 236);
  assert.equal(capsMajor('Character devices:\n195 nvidia\n'), null);
});

test('partitionCdiSpec: one device per partition with its gi and ci capability nodes and its MIG UUID', () => {
  const made = {
    device: 'gpu-0-mig-1g10gb-19-3',
    parentUuid: 'GPU-1',
    giProfileId: 19,
    start: 3,
    size: 1,
    gi: 5,
    ci: 0,
    uuid: 'MIG-5f0c',
    giCapMinor: 48,
    ciCapMinor: 49,
  };
  const r = partitionCdiSpec('uid-1', [made], 236);
  assert.deepEqual(r.ids, ['k8s.gpu-device-plugin/claim=uid-1-gpu-0-mig-1g10gb-19-3']);
  assert.deepEqual(r.spec, {
    cdiVersion: '0.6.0',
    kind: 'k8s.gpu-device-plugin/claim',
    devices: [
      {
        name: 'uid-1-gpu-0-mig-1g10gb-19-3',
        containerEdits: {
          env: ['CUDA_VISIBLE_DEVICES=MIG-5f0c'],
          deviceNodes: [
            { path: '/dev/nvidia-caps/nvidia-cap48', type: 'c', major: 236, minor: 48, permissions: 'rw' },
            { path: '/dev/nvidia-caps/nvidia-cap49', type: 'c', major: 236, minor: 49, permissions: 'rw' },
          ],
        },
      },
    ],
  });
});
