// The DRA health stream as the kubelet reads it, through the built executable (x64) with the fake NVML and
// the kubelet stand-in: the kubelet shows a device as Unknown in a pod's allocatedResourcesStatus once the
// last report it received of it is older than the timeout the report states, so a plugin that sends only
// on change loses every device's health that long after the last change. The plugin states a short timeout
// here (DRA_HEALTH_TIMEOUT_SECONDS=2, not 30 s of wall clock) and must keep every device Healthy or
// Unhealthy in the stand-in's kubelet view for several timeouts without any change on the node.
import assert from 'node:assert/strict';
import { describe, test } from 'node:test';
import type { TestContext } from 'node:test';
import { HealthStatus } from '../../src/api/dra.ts';
import { DRIVER, NODE, startDraNode, unhealthy } from '../support/dra-node.ts';
import { onEvent, waitFor } from '../support/wait.ts';

const TIMEOUT_SEC = 2;
/** How many stated timeouts the view must stay right through without any change on the node. */
const TIMEOUTS_WATCHED = 3;

describe('the DRA health stream as the kubelet reads it', { concurrency: false }, () => {
  test(
    'every device stays Healthy or Unhealthy in the kubelet view past the stated timeout; ' +
      'each report states it; no report comes after its device went stale',
    async (t: TestContext) => {
      const node = await startDraNode({ env: { DRA_HEALTH_TIMEOUT_SECONDS: String(TIMEOUT_SEC) } });
      try {
        await node.watcher.waitForHealth(
          DRIVER,
          (d) => d.length === 8 && d.every((x) => x.health === HealthStatus.HEALTHY),
        );
        node.sim.nvml('xid 2 48');
        await node.watcher.waitForHealth(DRIVER, (d) => unhealthy(d, 'gpu-2'));
        const t0 = Date.now();
        const messages0 = node.watcher.health.get(DRIVER)?.messages ?? 0;
        // Each message the plugin sends wakes this; nothing on the node changes meanwhile, so only the
        // plugin's resends can get it past several stated timeouts.
        await waitFor(() => (Date.now() - t0 > TIMEOUTS_WATCHED * TIMEOUT_SEC * 1000 ? true : undefined), {
          on: onEvent(node.watcher, 'health'),
          deadlineMs: (TIMEOUTS_WATCHED + 4) * TIMEOUT_SEC * 1000,
          what: () =>
            `a health message ${TIMEOUTS_WATCHED} stated timeouts (${TIMEOUT_SEC} s) after the XID: ` +
            `${(node.watcher.health.get(DRIVER)?.messages ?? 0) - messages0} message(s) since, ` +
            `kubelet view ${JSON.stringify([...node.watcher.kubeletHealthAll(DRIVER)])}`,
        });
        const now = Date.now();
        const view = node.watcher.kubeletHealthAll(DRIVER, now);
        assert.deepEqual(
          [...view].sort(),
          [0, 1, 2, 3, 4, 5, 6, 7].map((i) => [`${NODE}/gpu-${i}`, i === 2 ? 'Unhealthy' : 'Healthy']),
          'the kubelet view: gpu-2 Unhealthy, the rest Healthy, none Unknown',
        );
        assert.match(node.watcher.kubeletHealth(DRIVER, NODE, 'gpu-2', now).message, /XID 48/);
        assert.deepEqual(node.watcher.staleReports, [], 'no device went stale between two reports');
        const last = node.watcher.health.get(DRIVER);
        assert.ok(last !== undefined);
        assert.deepEqual(
          [...new Set(last.devices.map((d) => Number(d.health_check_timeout_seconds)))],
          [TIMEOUT_SEC],
          'every report states the timeout',
        );
        const resends = last.messages - messages0;
        t.diagnostic(`${resends} messages in ${now - t0} ms with nothing changing (stated timeout ${TIMEOUT_SEC} s)`);
        assert.ok(resends >= TIMEOUTS_WATCHED, `the list was sent again (${resends} times)`);
        // The stand-in's judgement itself: the same reports, a moment past their timeout, read Unknown.
        assert.equal(node.watcher.kubeletHealth(DRIVER, NODE, 'gpu-2', now + TIMEOUT_SEC * 1000 + 1).health, 'Unknown');
        assert.equal(node.watcher.kubeletHealth(DRIVER, NODE, 'gpu-0', now + TIMEOUT_SEC * 1000 + 1).health, 'Unknown');
      } finally {
        await node.stop();
      }
    },
  );
});
