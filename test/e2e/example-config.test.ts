// The example config file the packages install (packaging/config.example.yaml) runs: the built
// executable, given it unchanged on a simulated MIG node (mig-mixed-4: GPU 2 has MIG disabled, GPUs
// 0 and 1 hold four 1g.10gb MIG devices between them), advertises what the file's comments promise.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { EXAMPLE_CONFIG } from '../../build/package.ts';
import { SimNode } from '../support/sim.ts';

test(
  'the packaged example config on a MIG node: whole GPUs 4 ' +
    'times, each 1g.10gb MIG device twice, other profiles whole',
  async () => {
    const node = await SimNode.start({
      topology: 'mig-mixed-4',
      args: ['--config-file', EXAMPLE_CONFIG.source],
      waitRegistered: false,
    });
    try {
      const k = node.kubelet!;
      await k.waitForRegistrations(6, 15000);
      assert.deepEqual(k.registrations.map((r) => r.request.resource_name).sort(), [
        'nvidia.com/gpu',
        'nvidia.com/mig-1g.10gb',
        'nvidia.com/mig-1g.10gb.me',
        'nvidia.com/mig-1g.20gb',
        'nvidia.com/mig-2g.20gb',
        'nvidia.com/mig-3g.40gb',
      ]);
      const whole = node.topology.gpus[2]!.uuid;
      const gpus = await k.waitForDevices((d) => d.length === 4, 'nvidia.com/gpu');
      assert.deepEqual(
        gpus.map((d) => d.ID),
        [0, 1, 2, 3].map((n) => `${whole}::${n}`),
      );
      const mig = await k.waitForDevices((d) => d.length === 8, 'nvidia.com/mig-1g.10gb');
      assert.ok(
        mig.every((d) => /::[01]$/.test(d.ID)),
        mig.map((d) => d.ID).join(' '),
      );
      const res = await k.allocate({ container_requests: [{ devices_ids: [gpus[0]!.ID] }] });
      assert.equal(res.container_responses[0]!.envs.NVIDIA_VISIBLE_DEVICES, whole);
    } finally {
      await node.stop();
    }
  },
);
