// Topology-aware GetPreferredAllocation through the whole path: the fake NVML's links and PCIe
// levels, read once by the executable, answered over gRPC to the kubelet stand-in.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { SimNode } from '../support/sim.ts';

async function preferred(
  topology: string,
  cases: { size: number; must?: number[]; available?: number[]; want: number[] }[],
): Promise<void> {
  const node = await SimNode.start({ topology });
  try {
    const u = node.topology.gpus.map((g) => g.uuid);
    for (const c of cases) {
      const available = (c.available ?? u.map((_, i) => i)).map((i) => u[i]!);
      const res = await node.kubelet!.preferred({
        container_requests: [
          {
            available_deviceIDs: available,
            must_include_deviceIDs: (c.must ?? []).map((i) => u[i]!),
            allocation_size: c.size,
          },
        ],
      });
      const got = res.container_responses[0]!.deviceIDs.map((id) => u.indexOf(id)).sort((a, b) => a - b);
      assert.deepEqual(got, c.want, `${topology} size ${c.size} must ${JSON.stringify(c.must ?? [])}`);
    }
  } finally {
    await node.stop();
  }
}

test(
  'DGX-1 (hybrid cube-mesh): two NVLinks under one PCIe ' + 'switch first; fours by socket; must-include honoured',
  async () => {
    await preferred('dgx1-v100', [
      { size: 2, want: [2, 3] },
      { size: 2, must: [0], want: [0, 4] },
      { size: 4, want: [0, 1, 2, 3] },
      { size: 2, available: [0, 1, 4, 5, 6, 7], want: [6, 7] },
      { size: 8, want: [0, 1, 2, 3, 4, 5, 6, 7] },
    ]);
  },
);

test('NVSwitch (16 GPUs): the switch fabric counts as NVLink; PCIe and NUMA decide among equals', async () => {
  await preferred('nvswitch-16', [
    { size: 2, want: [0, 1] },
    { size: 4, want: [0, 1, 2, 3] },
    { size: 8, want: [0, 1, 2, 3, 4, 5, 6, 7] },
    { size: 2, must: [7], want: [6, 7] },
  ]);
});

test('PCIe only, two sockets: a pair under one switch, four within a socket', async () => {
  await preferred('pcie-2socket-8', [
    { size: 2, want: [0, 1] },
    { size: 4, want: [0, 1, 2, 3] },
    { size: 2, must: [5], want: [4, 5] },
  ]);
});

test('a bridged pair among loose GPUs: the bridge wins', async () => {
  await preferred('bridged-pair-4', [
    { size: 2, want: [1, 2] },
    { size: 2, must: [0], want: [0, 3] },
  ]);
});
