// The resource manager in-process (src/plugin/manager.ts): resources added, updated and removed as
// snapshots come, a vanished ID refused by name — on a fake server factory (no gRPC, no kubelet) —
// each resource serving its own socket, and re-registration on a config reload against the kubelet
// stand-in (real gRPC, in this process).
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { EventEmitter } from 'node:events';
import { existsSync, mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import * as grpc from '@grpc/grpc-js';
import type { Gpu } from '../../src/core/devices.ts';
import { freshHealthState } from '../../src/core/health-tracker.ts';
import { NO_SHARING } from '../../src/core/sharing.ts';
import { buildSnapshot, withHealth } from '../../src/core/snapshot.ts';
import { diff } from '../../src/core/snapshot-diff.ts';
import { diffResources } from '../../src/core/resource-diff.ts';
import { planSnapshot } from '../../src/core/resource-plan.ts';
import type { PlannedNode } from '../../src/core/resource-plan.ts';
import type { NodeScan, NodeSnapshot } from '../../src/core/snapshot.ts';
import { ResourceManager } from '../../src/plugin/manager.ts';
import type { ServedSettings } from '../../src/plugin/manager.ts';
import type { DevicePluginHandlers } from '../../src/plugin/service.ts';
import { createLogger } from '../../src/system/log.ts';
import { KubeletStandIn } from '../support/kubelet.ts';
import { onEvent, waitUntil } from '../support/wait.ts';

const uuid = (i: number): string => `GPU-0000000${i}-cccc-4000-8000-000000000000`;
const gpu = (i: number, index = i): Gpu => ({
  index,
  uuid: uuid(i),
  name: 'Fake GPU',
  minor: i,
  busId: `00000000:0${i}:00.0`,
  memoryBytes: 1 << 30,
  numaNode: 0,
});
function scan(ids: readonly number[]): NodeScan {
  const gpus = ids.map((id, k) => gpu(id, k));
  return {
    driverVersion: '550.54.15',
    gpus,
    nvlinks: gpus.map((g) => ({ busId: g.busId, links: [] })),
    pcie: gpus.map(() => gpus.map(() => -1)),
  };
}
const settings = (replicas = 1): ServedSettings => ({
  plan: {
    deviceIdStrategy: 'uuid',
    sharing:
      replicas === 1
        ? NO_SHARING
        : {
            timeSlicing: {
              renameByDefault: true,
              failRequestsGreaterThanOne: false,
              resources: [{ name: 'nvidia.com/gpu', rename: null, replicas, devices: { kind: 'all' } }],
            },
          },
  },
  serve: { allocate: { passDeviceSpecs: false, devRoot: '/', presentControlDevices: [] }, sharedPolicy: 'distributed' },
});

/** A server factory that serves nothing: it makes the socket file and remembers the handlers. */
class FakeServers extends EventEmitter {
  readonly served = new Map<string, { handlers: DevicePluginHandlers; stops: boolean[] }>();
  readonly order: string[] = [];

  factory = async (socketPath: string, handlers: DevicePluginHandlers) => {
    writeFileSync(socketPath, '');
    const entry = { handlers, stops: [] as boolean[] };
    this.served.set(socketPath, entry);
    this.order.push(`serve ${socketPath.slice(socketPath.lastIndexOf('/') + 1)}`);
    this.emit('serve');
    return {
      stop: async (removeSocket: boolean) => {
        entry.stops.push(removeSocket);
        if (removeSocket) rmSync(socketPath, { force: true });
      },
    };
  };
}

/** Calls a handler's Allocate as the gRPC server would; resolves with the answer or the error. */
function allocate(
  h: DevicePluginHandlers,
  ids: string[],
): Promise<{ err: grpc.ServiceError | null; envs?: Record<string, string> }> {
  return new Promise((resolve) => {
    const call = { request: { container_requests: [{ devices_ids: ids }] } };
    const impl = h.implementation() as Record<
      string,
      (
        call: unknown,
        cb: (err: grpc.ServiceError | null, res?: { container_responses: { envs: Record<string, string> }[] }) => void,
      ) => void
    >;
    impl.Allocate!(call, (err, res) =>
      resolve({ err, ...(res === undefined ? {} : { envs: res.container_responses[0]!.envs }) }),
    );
  });
}

/** Each snapshot applied with the plan made for it (the device-plugin planner's step). */
const planned = new WeakMap<NodeSnapshot, PlannedNode>();

function apply(
  m: ResourceManager,
  prev: NodeSnapshot | null,
  next: NodeSnapshot,
  s: ServedSettings,
  reregister: string | null = null,
): Promise<void> {
  const before = prev === null ? null : (planned.get(prev) ?? null);
  const node: PlannedNode = { snapshot: next, plan: planSnapshot(next, s.plan, before) };
  planned.set(next, node);
  return m.apply({
    snapshot: next,
    plan: node.plan,
    change: diff(prev, next),
    resourceChange: diffResources(before, node),
    reason: 'test',
    reregister,
    settings: s,
  });
}

test(
  'resources follow the snapshots: served before registering, lists updated ' +
    'in place, a vanished ID refused naming why, a removed resource stopped',
  async () => {
    const dir = mkdtempSync(join(tmpdir(), 'gdp-manager-'));
    const lines: string[] = [];
    const logged = new EventEmitter();
    const servers = new FakeServers();
    const m = new ResourceManager({
      kubeletSocket: join(dir, 'kubelet.sock'),
      socketCheckIntervalMs: 60000,
      log: createLogger({ level: 'debug', journal: false, write: (l) => lines.push(l) && logged.emit('line') }),
      serverFactory: servers.factory,
      onDirectoryGone: () => assert.fail('the directory is there'),
    });
    try {
      const a = buildSnapshot(scan([0, 1, 2]), null, false);
      await apply(m, null, a, settings());
      assert.deepEqual(m.resources, ['nvidia.com/gpu']);
      const sock = join(dir, 'gpu-device-plugin-gpu.sock');
      await waitUntil(() => lines.some((l) => / DEBUG serving resource=nvidia\.com\/gpu /.test(l)), {
        on: onEvent(logged, 'line'),
        what: 'the manager logged that it serves nvidia.com/gpu',
      });
      assert.deepEqual(servers.order, ['serve gpu-device-plugin-gpu.sock'], 'the resource serves its own socket');
      const h = servers.served.get(sock)!.handlers;
      assert.deepEqual(
        h.current.devices.map((d) => d.id),
        [uuid(0), uuid(1), uuid(2)],
      );

      // A health change: the same server, the new health.
      const b = withHealth(
        a,
        new Map([
          [uuid(1), { state: { ...freshHealthState(), health: 'Unhealthy' }, reason: 'critical XID 79', since: 1 }],
        ]),
      );
      await apply(m, a, b, settings());
      assert.equal(h.current.health.get(uuid(1)), 'Unhealthy');
      assert.equal(servers.served.size, 1, 'no new server for a health change');

      // GPU 1 leaves: its ID is refused by name, the others are served under their new positions.
      const c = buildSnapshot(scan([0, 2]), b, false);
      await apply(m, b, c, settings());
      const refused = await allocate(h, [uuid(1)]);
      assert.equal(refused.err?.code, grpc.status.INVALID_ARGUMENT);
      assert.match(
        refused.err?.details ?? '',
        new RegExp(`device ID "${uuid(1)}" is no longer on this node: its GPU left the node \\(${uuid(1)}\\)`),
      );
      const ok = await allocate(h, [uuid(2)]);
      assert.equal(ok.err, null);
      assert.equal(ok.envs?.NVIDIA_VISIBLE_DEVICES, uuid(2));

      // Time-slicing with renaming: nvidia.com/gpu is withdrawn (stopped, socket removed), nvidia.com/gpu.shared added.
      const d = buildSnapshot(scan([0, 2]), c, false);
      await apply(m, c, d, settings(2), 'config reloaded');
      assert.deepEqual(m.resources, ['nvidia.com/gpu.shared']);
      assert.deepEqual(servers.served.get(sock)!.stops, [true], 'stopped, its socket removed');
      assert.equal(existsSync(sock), false);
      await waitUntil(() => servers.served.has(join(dir, 'gpu-device-plugin-gpu.shared.sock')), {
        on: onEvent(servers, 'serve'),
        what: 'the shared resource served',
      });
      assert.deepEqual(
        servers.order.filter((o) => o.startsWith('serve ')),
        ['serve gpu-device-plugin-gpu.sock', 'serve gpu-device-plugin-gpu.shared.sock'],
      );
      assert.ok(lines.some((l) => /INFO resource no longer advertised resource=nvidia\.com\/gpu\n/.test(l)));
    } finally {
      await m.stop();
      rmSync(dir, { recursive: true, force: true });
    }
  },
);

test(
  'registration: listeners hear each one; a config reload ' + 'that changes a device set registers that resource again',
  async () => {
    const dir = mkdtempSync(join(tmpdir(), 'gdp-manager-'));
    const kubelet = await KubeletStandIn.start(dir);
    const heard: boolean[] = [];
    const hearing = new EventEmitter();
    const m = new ResourceManager({
      kubeletSocket: kubelet.socketPath,
      socketCheckIntervalMs: 60000,
      log: createLogger({ level: 'warn', journal: false, write: () => undefined }),
      onDirectoryGone: () => assert.fail('the directory is there'),
    });
    m.onRegistered((all) => heard.push(all) && hearing.emit('registered'));
    try {
      const a = buildSnapshot(scan([0, 1]), null, false);
      await apply(m, null, a, settings());
      await kubelet.waitForRegistrations(1);
      await waitUntil(() => heard.length === 1, {
        on: onEvent(hearing, 'registered'),
        what: 'a listener heard the registration',
      });
      assert.deepEqual(heard, [true]);
      assert.ok(m.allRegisteredNow());
      // A re-discovery that removes a GPU travels on the open stream: no new registration.
      const b = buildSnapshot(scan([0]), a, false);
      await apply(m, a, b, settings());
      await kubelet.waitForDevices((d) => d.length === 1);
      assert.equal(kubelet.registrations.length, 1);
      // A config reload whose device set changed asks for a new registration.
      const c = buildSnapshot(scan([0, 1]), b, false);
      await apply(m, b, c, settings(), 'config reloaded');
      await kubelet.waitForRegistrations(2);
      assert.equal(kubelet.registrations[1]!.request.resource_name, 'nvidia.com/gpu');
    } finally {
      await m.stop();
      await kubelet.stop();
      rmSync(dir, { recursive: true, force: true });
    }
  },
);
