// DRA mode's ResourceSlices when the API server misbehaves, through the built executable (x64) with
// the fake NVML, the plugin watcher stand-in and the API server stand-in with injected faults
// (apiserver-faults.ts) and its watch (apiserver-watch.ts): a kubelet restart's wipe followed by 0, 1
// and 3 failed requests (reset, 503), a slice deleted or edited by another client, the watch cut and
// 410 Gone, and a reset while the plugin reads a ResourceClaim during prepare.
import assert from 'node:assert/strict';
import { writeFileSync } from 'node:fs';
import { describe, test } from 'node:test';
import type { JsonObject } from '../support/apiserver.ts';
import type { FaultAction } from '../support/apiserver-faults.ts';
import { PluginWatcherStandIn } from '../support/plugin-watcher.ts';
import {
  DRIVER,
  NODE,
  claimOn,
  devicesOf,
  generationOf,
  slicesOf,
  startDraNode,
  waitForSlices,
} from '../support/dra-node.ts';
import type { DraNode } from '../support/dra-node.ts';
import { onEvent, waitUntil } from '../support/wait.ts';

const SLICES = '/apis/resource.k8s.io/v1/resourceslices';

async function started(): Promise<DraNode> {
  const node = await startDraNode();
  await waitForSlices(node.api, (d) => d.length === 8, 'with 8 devices');
  return node;
}

/** The plugin's watch of its slices is open. */
function watching(node: DraNode, when = 'at start'): Promise<void> {
  return waitUntil(() => node.api.watches.openCount > 0, {
    on: onEvent(node.api, 'watch', 'request'),
    what: () =>
      `the plugin watching its slices ${when}; requests: ` +
      node.api.requests
        .slice(-8)
        .map((r) => `${r.method} ${r.path} ${r.code}`)
        .join('; '),
  });
}

const sliceName = (node: DraNode): string => String((slicesOf(node.api)[0]?.metadata as JsonObject | undefined)?.name);

describe('DRA ResourceSlices through faults', { concurrency: false }, () => {
  for (const [n, action] of [
    [0, undefined],
    [1, { kind: 'reset' }],
    [3, { kind: 'status', code: 503 }],
  ] as const) {
    const what = action === undefined ? 'none' : action.kind === 'reset' ? 'reset' : `${action.code}`;
    test(`a kubelet restart, then ${n} failed slice request(s) (${what}): the slices are back`, async () => {
      const node = await started();
      try {
        await node.watcher.stop();
        if (action !== undefined)
          node.api.fault({ method: 'GET', path: SLICES, times: n, action: action as FaultAction });
        const before = generationOf(node.api);
        node.watcher = await PluginWatcherStandIn.start(node.registry, {
          slices: { janitor: node.api, nodeName: NODE, wipeDelayMs: 60_000 },
        });
        assert.equal(node.watcher.wipes[0]?.deleted, 1, 'the kubelet wiped the slice');
        await node.watcher.waitForRegistrations(1);
        await waitForSlices(node.api, (d) => d.length === 8, 'back after the wipe');
        assert.ok(generationOf(node.api) > before);
        if (action?.kind === 'status') await node.sim.plugin.waitForLine(/the API server answers again/);
      } finally {
        await node.stop();
      }
    });
  }

  test('a slice deleted by another client (kubectl delete resourceslice) is restored', async () => {
    const node = await started();
    try {
      await watching(node);
      const fromLine = node.sim.plugin.lines.length;
      node.api.removeSlice(sliceName(node));
      await waitForSlices(node.api, (d) => d.length === 8, 'restored', 5_000);
      await node.sim.plugin.waitForLine(/DRA: ResourceSlices restored/, 10_000, fromLine);
    } finally {
      await node.stop();
    }
  });

  test('a slice edited by another client is put back; a 503 on the first try is retried', async () => {
    const node = await started();
    try {
      await watching(node);
      node.api.fault({ method: 'PUT', path: /\/resourceslices\//, action: { kind: 'status', code: 503 } });
      node.api.editSlice(sliceName(node), (s) => {
        (s.spec as JsonObject).devices = ((s.spec as JsonObject).devices as JsonObject[]).slice(0, 2);
      });
      assert.equal(devicesOf(node.api).length, 2);
      await waitForSlices(node.api, (d) => d.length === 8, 'the edit undone', 5_000);
      assert.ok(node.api.requests.some((r) => r.method === 'PUT' && r.code === 503));
    } finally {
      await node.stop();
    }
  });

  test('the watch cut, then 410 Gone: watched again, and a deletion after each is restored', async () => {
    const node = await started();
    try {
      await watching(node);
      assert.ok(node.api.cutWatches() > 0);
      await watching(node, 'after the cut');
      node.api.removeSlice(sliceName(node));
      await waitForSlices(node.api, (d) => d.length === 8, 'restored after the cut', 5_000);
      node.api.compact();
      assert.ok(node.api.cutWatches(true) > 0);
      await watching(node, 'after 410');
      node.api.removeSlice(sliceName(node));
      await waitForSlices(node.api, (d) => d.length === 8, 'restored after 410', 5_000);
    } finally {
      await node.stop();
    }
  });

  test('two resets, then a 503, as prepare reads the claim: it fails cleanly; one reset is sent again', async () => {
    const node = await started();
    try {
      const client = node.watcher.client(DRIVER);
      const one = claimOn(node.api, 'flaky', [{ request: 'gpu', device: 'gpu-5' }]);
      const path = '/apis/resource.k8s.io/v1/namespaces/team-a/resourceclaims/flaky';
      // A GET on a reset connection is sent once more (client-go's rule): two resets fail it.
      for (const [action, times] of [
        [{ kind: 'reset' }, 2],
        [{ kind: 'status', code: 503 }, 1],
      ] as const) {
        node.api.fault({ method: 'GET', path, times, action });
        const r = await client.prepare([one]);
        assert.match(
          r.claims[one.uid]?.error ?? '',
          /cannot read ResourceClaim team-a\/flaky .*from the API server/,
          `${action.kind}: an error naming the claim for the kubelet to retry`,
        );
        assert.deepEqual(r.claims[one.uid]?.devices ?? [], []);
      }
      node.api.fault({ method: 'GET', path, action: { kind: 'reset' } });
      const ok = await client.prepare([one]);
      assert.equal(ok.claims[one.uid]?.error, '', 'one reset is sent again on a new connection');
      assert.deepEqual(
        ok.claims[one.uid]?.devices.map((d) => d.cdi_device_ids),
        [['nvidia.com/gpu=5']],
      );
      assert.equal(node.sim.plugin.exit, undefined, 'the plugin still runs');
    } finally {
      await node.stop();
    }
  });

  test('an XID whose taint update is reset, then answered 503: the taint lands', async () => {
    const node = await started();
    try {
      node.api.fault({ method: 'PUT', path: /\/resourceslices\//, times: 2, action: { kind: 'reset' } });
      node.api.fault({ method: 'PUT', path: /\/resourceslices\//, action: { kind: 'status', code: 503 } });
      node.sim.nvml('xid 3 48');
      const d = await waitForSlices(
        node.api,
        (x) => (x.find((y) => y.name === 'gpu-3')?.taints?.length ?? 0) > 0,
        'tainted',
      );
      assert.deepEqual(
        d.find((x) => x.name === 'gpu-3')?.taints?.map((t) => t.value),
        ['48'],
      );
      assert.ok(
        node.api.requests.some((r) => r.method === 'PUT' && r.code === 503),
        'the 503 was met',
      );
    } finally {
      await node.stop();
    }
  });

  test('a config reload that republishes, its first write answered 429: the change lands', async () => {
    const policy = (d: string): string =>
      `dra:\n  consumableCapacity:\n    memory:\n      default: ${d}\n      validRange: {min: 1Gi, step: 1Gi}\n`;
    const node = await startDraNode({ config: policy('8Gi') });
    try {
      const defaultIs = (d: readonly { capacity?: unknown }[], v: string): boolean =>
        d.length === 8 && d.every((x) => JSON.stringify(x.capacity).includes(`"default":"${v}"`));
      await waitForSlices(node.api, (d) => defaultIs(d, '8Gi'), 'default 8Gi');
      node.api.fault({
        method: 'PUT',
        path: /\/resourceslices\//,
        action: { kind: 'status', code: 429, retryAfterS: 1 },
      });
      writeFileSync(node.configPath, policy('4Gi'));
      node.sim.plugin.signal('SIGHUP');
      await waitForSlices(node.api, (d) => defaultIs(d, '4Gi'), 'default 4Gi after the reload');
      assert.ok(
        node.api.requests.some((r) => r.method === 'PUT' && r.code === 429),
        'the 429 was met',
      );
    } finally {
      await node.stop();
    }
  });
});
