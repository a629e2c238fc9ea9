// Dynamic MIG through the executable against API servers that cannot hold its counter sets: a 1.35 server with
// the DRAPartitionableDevices feature gate at its default (off), which stores a counter-set slice empty and drops
// each device's consumesCounters, and a 1.34 server, too old for counter sets in slices of their own. Either way
// the plugin says why in one ERROR and publishes the 16-GPU node with its MIG devices only: no partition that
// would count nothing, and a whole pool the scheduler uses. Once the cluster is fixed, a reload publishes them.
import assert from 'node:assert/strict';
import { afterEach, test } from 'node:test';
import { poolProblems } from '../support/apiserver-counters.ts';
import type { JsonObject } from '../support/apiserver.ts';
import { RBAC, TOKEN, slicesOf, startDraNode, waitForSlices } from '../support/dra-node.ts';
import type { DraNode } from '../support/dra-node.ts';

let node: DraNode | undefined;
afterEach(async () => {
  await node?.stop();
  node = undefined;
});

async function publishAt(version: string): Promise<DraNode> {
  node = await startDraNode({
    topology: 'mig-dynamic-16',
    cdiNames: [...Array(16).keys()].map(String),
    config: 'version: v1\ndra:\n  dynamicMig: true\n',
    args: ['--mig-strategy=mixed'],
    api: { tokens: { [TOKEN]: RBAC }, version },
  });
  return node;
}

/** The whole pool written at one generation: as many slices as each says, the existing instance among them. */
async function wholePool(n: DraNode): Promise<JsonObject[]> {
  const pool = (s: JsonObject): JsonObject => (s.spec as JsonObject).pool as JsonObject;
  await waitForSlices(
    n.api,
    (d) =>
      d.some((x) => x.name === 'gpu-0-mig-3g20gb-9-0') &&
      slicesOf(n.api).every((s) => pool(s).resourceSliceCount === slicesOf(n.api).length),
    'the whole pool, with GPU 0 instance',
  );
  return slicesOf(n.api);
}

function assertMigDevicesOnly(slices: JsonObject[]): void {
  const specs = slices.map((s) => s.spec as JsonObject);
  assert.ok(!specs.some((s) => s.sharedCounters !== undefined), 'no counter-set slice');
  const devices = specs.flatMap((s) => (s.devices as JsonObject[] | undefined) ?? []);
  assert.ok(!devices.some((d) => d.consumesCounters !== undefined), 'no device consumes counters');
  assert.ok(!devices.some((d) => d.name === 'gpu-2-mig-3g20gb-9-4'), 'no partition device');
  assert.deepEqual(poolProblems(slices), []);
}

/** The cluster fixed as `to` says, then a reload (SIGHUP): the counter sets and partitions published. */
async function afterReload(n: DraNode, to: { version?: string; partitionableDevices?: boolean }): Promise<void> {
  n.api.upgrade(to);
  n.sim.plugin.signal('SIGHUP');
  const slices = await waitForSlices(
    n.api,
    (d) => d.some((x) => x.name === 'gpu-2-mig-3g20gb-9-4'),
    'the partitions after the reload',
  );
  assert.ok(slices.length > 0);
  const specs = slicesOf(n.api).map((s) => s.spec as JsonObject);
  assert.ok(
    specs.some((s) => Array.isArray(s.sharedCounters) && s.sharedCounters.length > 0),
    'counter sets',
  );
}

test('1.35 with DRAPartitionableDevices off: the dropped counter sets seen, an ERROR naming the gate', async () => {
  const n = await publishAt('v1.35.2');
  await n.sim.plugin.waitForLine(/ERROR DRA: dra\.dynamicMig needs the API server's DRAPartitionableDevices/, 15_000);
  assertMigDevicesOnly(await wholePool(n));
  // The gate turned on: a reload tries the counter sets again, no restart.
  await afterReload(n, { partitionableDevices: true });
});

test('1.34: refused by its version before anything is written, an ERROR naming 1.35', async () => {
  const n = await publishAt('v1.34.3');
  await n.sim.plugin.waitForLine(/ERROR DRA: dra\.dynamicMig needs Kubernetes 1\.35 or later/, 15_000);
  assertMigDevicesOnly(await wholePool(n));
  // The control plane upgraded to 1.36: a reload reads the version again.
  await afterReload(n, { version: 'v1.36.1' });
});
