// The kubelet plugin watcher stand-in (test/support/plugin-watcher.ts) against a tiny in-test DRA
// driver over real gRPC: registration and its status report, version choice, refusals, removal as
// deregistration, the DRA calls, the health stream and the kubelet's ResourceSlice clean-up.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import * as grpc from '@grpc/grpc-js';
import { mkdirSync, mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { draHealthService, draPluginService, pluginRegistrationService } from '../../src/api/dra.ts';
import type {
  DraHealthVersion,
  DraVersion,
  NodePrepareResourcesRequest,
  NodePrepareResourcesResponse,
  NodeUnprepareResourcesRequest,
  NodeUnprepareResourcesResponse,
  NodeWatchResourcesResponse,
  PluginInfo,
  RegistrationStatus,
} from '../../src/api/dra.ts';
import { PluginWatcherStandIn, pickHealthVersion, validatePluginInfo } from '../support/plugin-watcher.ts';
import type { SliceJanitor } from '../support/plugin-watcher.ts';
import { ApiServerStandIn } from '../support/apiserver.ts';

interface TinyDriver {
  statuses: RegistrationStatus[];
  prepared: NodePrepareResourcesRequest[];
  unprepared: NodeUnprepareResourcesRequest[];
  /** The health service of each stream the kubelet opened, in order. */
  healthOpened: DraHealthVersion[];
  /** Sends one health list to every open stream. */
  sendHealth(msg: NodeWatchResourcesResponse): void;
  stop(): void;
}

function bind(server: grpc.Server, path: string): Promise<void> {
  return new Promise((resolve, reject) =>
    server.bindAsync(`unix://${path}`, grpc.ServerCredentials.createInsecure(), (err) =>
      err ? reject(err) : resolve(),
    ),
  );
}

/**
 * A DRA driver: Registration on regSocket, DRAPlugin (the given versions) on its endpoint and, with
 * serve.health, the health stream, which sends that list when it opens.
 */
async function tinyDriver(
  regSocket: string,
  info: PluginInfo,
  serve: { versions: DraVersion[]; health?: NodeWatchResourcesResponse; healthVersions?: DraHealthVersion[] },
): Promise<TinyDriver> {
  const d: TinyDriver = {
    statuses: [],
    prepared: [],
    unprepared: [],
    healthOpened: [],
    sendHealth: () => {},
    stop: () => {},
  };
  const streams = new Set<grpc.ServerWritableStream<unknown, NodeWatchResourcesResponse>>();
  const plugin = new grpc.Server();
  for (const v of serve.versions) {
    plugin.addService(draPluginService(v), {
      NodePrepareResources: (
        call: grpc.ServerUnaryCall<NodePrepareResourcesRequest, NodePrepareResourcesResponse>,
        cb: grpc.sendUnaryData<NodePrepareResourcesResponse>,
      ) => {
        d.prepared.push(call.request);
        const claims: NodePrepareResourcesResponse['claims'] = {};
        for (const c of call.request.claims) {
          claims[c.uid] = {
            devices: [
              {
                request_names: ['gpu'],
                pool_name: 'node-a',
                device_name: 'gpu-0',
                cdi_device_ids: [`k8s.gpu.example.com/claim=${c.uid}-gpu-0`],
              },
            ],
            error: '',
          };
        }
        cb(null, { claims });
      },
      NodeUnprepareResources: (
        call: grpc.ServerUnaryCall<NodeUnprepareResourcesRequest, NodeUnprepareResourcesResponse>,
        cb: grpc.sendUnaryData<NodeUnprepareResourcesResponse>,
      ) => {
        d.unprepared.push(call.request);
        cb(null, { claims: Object.fromEntries(call.request.claims.map((c) => [c.uid, { error: '' }])) });
      },
    });
  }
  const initial = serve.health;
  if (initial !== undefined) {
    for (const hv of serve.healthVersions ?? ['v1alpha1']) {
      plugin.addService(draHealthService(hv), {
        NodeWatchResources: (call: grpc.ServerWritableStream<unknown, NodeWatchResourcesResponse>) => {
          d.healthOpened.push(hv);
          streams.add(call);
          call.write(initial);
          call.on('cancelled', () => streams.delete(call));
        },
      });
    }
  }
  await bind(plugin, info.endpoint);
  const reg = new grpc.Server();
  reg.addService(pluginRegistrationService(), {
    GetInfo: (_call: grpc.ServerUnaryCall<unknown, PluginInfo>, cb: grpc.sendUnaryData<PluginInfo>) => cb(null, info),
    NotifyRegistrationStatus: (
      call: grpc.ServerUnaryCall<RegistrationStatus, object>,
      cb: grpc.sendUnaryData<object>,
    ) => {
      d.statuses.push(call.request);
      cb(null, {});
    },
  });
  await bind(reg, regSocket);
  d.sendHealth = (msg) => {
    for (const s of streams) s.write(msg);
  };
  d.stop = () => {
    reg.forceShutdown();
    plugin.forceShutdown();
  };
  return d;
}

function dirs(): { root: string; registry: string; plugins: string; done: () => void } {
  const root = mkdtempSync(join(tmpdir(), 'gdp-pw-'));
  const registry = join(root, 'plugins_registry');
  const plugins = join(root, 'plugins');
  mkdirSync(registry);
  mkdirSync(plugins);
  return { root, registry, plugins, done: () => rmSync(root, { recursive: true, force: true }) };
}

const info = (endpoint: string, over: Partial<PluginInfo> = {}): PluginInfo => ({
  type: 'DRAPlugin',
  name: 'gpu.example.com',
  endpoint,
  supported_versions: ['v1.DRAPlugin', 'v1beta1.DRAPlugin'],
  ...over,
});

test(
  'a DRA driver is registered, told so, and served ' + 'NodePrepareResources / NodeUnprepareResources over v1',
  async (t) => {
    const d = dirs();
    t.after(d.done);
    const w = await PluginWatcherStandIn.start(d.registry);
    t.after(() => w.stop());
    const drv = await tinyDriver(join(d.registry, 'gpu.example.com-reg.sock'), info(join(d.plugins, 'dra.sock')), {
      versions: ['v1'],
    });
    t.after(drv.stop);

    const reg = await w.waitForRegistrations(1);
    assert.equal(reg.name, 'gpu.example.com');
    assert.equal(reg.version, 'v1');
    assert.equal(reg.endpoint, join(d.plugins, 'dra.sock'));
    assert.deepEqual(drv.statuses, [{ plugin_registered: true, error: '' }]);

    const claim = { namespace: 'default', uid: 'uid-1', name: 'claim-1' };
    const res = await w.client('gpu.example.com').prepare([claim]);
    assert.deepEqual(res.claims['uid-1']?.devices[0]?.cdi_device_ids, ['k8s.gpu.example.com/claim=uid-1-gpu-0']);
    assert.deepEqual(drv.prepared, [{ claims: [claim] }]);
    const un = await w.client('gpu.example.com').unprepare([claim]);
    assert.deepEqual(un.claims, { 'uid-1': { error: '' } });
    assert.deepEqual(drv.unprepared, [{ claims: [claim] }]);
  },
);

test("the first service in the driver's list that the kubelet speaks is used (v1beta1 here)", async (t) => {
  const d = dirs();
  t.after(d.done);
  const w = await PluginWatcherStandIn.start(d.registry);
  t.after(() => w.stop());
  const drv = await tinyDriver(
    join(d.registry, 'x-reg.sock'),
    info(join(d.plugins, 'dra.sock'), { supported_versions: ['v9.DRAPlugin', 'v1beta1.DRAPlugin', 'v1.DRAPlugin'] }),
    { versions: ['v1beta1'] },
  );
  t.after(drv.stop);
  const reg = await w.waitForRegistrations(1);
  assert.equal(reg.version, 'v1beta1');
  // The plugin serves only v1beta1: the call succeeds only if it went to the v1beta1 method path.
  const res = await w.client('gpu.example.com').prepare([{ namespace: 'ns', uid: 'u2', name: 'c2' }]);
  assert.equal(res.claims.u2?.devices[0]?.device_name, 'gpu-0');
});

test('a kubelet that speaks only v1 refuses a v1beta1-only driver and tells it why', async (t) => {
  const d = dirs();
  t.after(d.done);
  const w = await PluginWatcherStandIn.start(d.registry, { versions: ['v1'] });
  t.after(() => w.stop());
  const drv = await tinyDriver(
    join(d.registry, 'x-reg.sock'),
    info(join(d.plugins, 'dra.sock'), { supported_versions: ['v1beta1.DRAPlugin'] }),
    { versions: ['v1beta1'] },
  );
  t.after(drv.stop);
  const r = await w.waitForRejections(1);
  assert.equal(r.notified, true);
  assert.equal(
    r.reason,
    `RegisterPlugin error -- plugin validation failed with err: invalid supported gRPC versions of ` +
      `DRA driver plugin gpu.example.com at endpoint ${join(d.plugins, 'dra.sock')}: none of services ` +
      `supported by the plugin (["v1beta1.DRAPlugin"]) are supported by the kubelet (["v1.DRAPlugin"])`,
  );
  assert.equal(drv.statuses.length, 1);
  assert.equal(drv.statuses[0]?.plugin_registered, false);
  assert.equal(drv.statuses[0]?.error, r.reason);
  assert.equal(w.registrations.length, 0);
  assert.throws(() => w.client('gpu.example.com'), /no driver gpu.example.com registered/);
});

test(
  'GetInfo answers the kubelet refuses: another plugin type, ' +
    'an empty version list, an endpoint already registered',
  async (t) => {
    const d = dirs();
    t.after(d.done);
    const w = await PluginWatcherStandIn.start(d.registry, { health: false });
    t.after(() => w.stop());
    const wrongType = await tinyDriver(
      join(d.registry, 'dp-reg.sock'),
      info(join(d.plugins, 'dp.sock'), { type: 'DevicePlugin' }),
      { versions: ['v1'] },
    );
    t.after(wrongType.stop);
    const r1 = await w.waitForRejections(1);
    assert.equal(
      r1.reason,
      `RegisterPlugin error -- no handler registered for plugin ` +
        `type: DevicePlugin at socket ${join(d.registry, 'dp-reg.sock')}`,
    );
    assert.deepEqual(wrongType.statuses, [{ plugin_registered: false, error: r1.reason }]);

    const noVersions = await tinyDriver(
      join(d.registry, 'nv-reg.sock'),
      info(join(d.plugins, 'nv.sock'), { supported_versions: [] }),
      { versions: ['v1'] },
    );
    t.after(noVersions.stop);
    const r2 = await w.waitForRejections(2);
    assert.match(
      r2.reason,
      new RegExp(
        '^RegisterPlugin error -- plugin validation failed with err: .*: ' +
          String.raw`empty list of supported gRPC services \(aka supported versions\)$`,
      ),
    );
    assert.deepEqual(noVersions.statuses, [{ plugin_registered: false, error: r2.reason }]);

    // A second registration socket naming an endpoint the driver already registered cannot take it over.
    const endpoint = join(d.plugins, 'dra.sock');
    const first = await tinyDriver(join(d.registry, 'a-reg.sock'), info(endpoint), { versions: ['v1'] });
    t.after(first.stop);
    await w.waitForRegistrations(1);
    const hijack = new grpc.Server();
    hijack.addService(pluginRegistrationService(), {
      GetInfo: (_c: grpc.ServerUnaryCall<unknown, PluginInfo>, cb: grpc.sendUnaryData<PluginInfo>) =>
        cb(null, info(endpoint)),
      NotifyRegistrationStatus: (
        c: grpc.ServerUnaryCall<RegistrationStatus, object>,
        cb: grpc.sendUnaryData<object>,
      ) => {
        hijackStatuses.push(c.request);
        cb(null, {});
      },
    });
    const hijackStatuses: RegistrationStatus[] = [];
    await bind(hijack, join(d.registry, 'b-reg.sock'));
    t.after(() => hijack.forceShutdown());
    const r3 = await w.waitForRejections(3);
    assert.equal(
      r3.reason,
      `RegisterPlugin error -- plugin registration failed with err: ` +
        `endpoint ${endpoint} already registered for DRA driver plugin gpu.example.com`,
    );
    assert.deepEqual(hijackStatuses, [{ plugin_registered: false, error: r3.reason }]);
    assert.equal(w.registrations.length, 1);

    // The same checks as a pure function; an empty endpoint means the registration socket itself.
    assert.deepEqual(validatePluginInfo(info(''), '/r.sock', ['v1', 'v1beta1']), {
      version: 'v1',
      endpoint: '/r.sock',
    });
  },
);

test('an empty PluginInfo.endpoint means the DRA service is on the registration socket itself', async (t) => {
  const d = dirs();
  t.after(d.done);
  const w = await PluginWatcherStandIn.start(d.registry, { health: false });
  t.after(() => w.stop());
  const regSocket = join(d.registry, 'one.sock');
  const server = new grpc.Server();
  const statuses: RegistrationStatus[] = [];
  server.addService(pluginRegistrationService(), {
    GetInfo: (_c: grpc.ServerUnaryCall<unknown, PluginInfo>, cb: grpc.sendUnaryData<PluginInfo>) => cb(null, info('')),
    NotifyRegistrationStatus: (c: grpc.ServerUnaryCall<RegistrationStatus, object>, cb: grpc.sendUnaryData<object>) => {
      statuses.push(c.request);
      cb(null, {});
    },
  });
  server.addService(draPluginService('v1'), {
    NodePrepareResources: (
      c: grpc.ServerUnaryCall<NodePrepareResourcesRequest, NodePrepareResourcesResponse>,
      cb: grpc.sendUnaryData<NodePrepareResourcesResponse>,
    ) =>
      cb(null, {
        claims: Object.fromEntries(c.request.claims.map((x) => [x.uid, { devices: [], error: 'not today' }])),
      }),
    NodeUnprepareResources: (
      _c: grpc.ServerUnaryCall<NodeUnprepareResourcesRequest, NodeUnprepareResourcesResponse>,
      cb: grpc.sendUnaryData<NodeUnprepareResourcesResponse>,
    ) => cb(null, { claims: {} }),
  });
  await bind(server, regSocket);
  t.after(() => server.forceShutdown());
  const reg = await w.waitForRegistrations(1);
  assert.equal(reg.endpoint, regSocket);
  assert.deepEqual(statuses, [{ plugin_registered: true, error: '' }]);
  const res = await w.client('gpu.example.com').prepare([{ namespace: 'n', uid: 'u9', name: 'c9' }]);
  assert.deepEqual(res.claims, { u9: { devices: [], error: 'not today' } });
});

test(
  'a socket already there at start is registered; its ' + 'removal deregisters; a new socket registers again',
  async (t) => {
    const d = dirs();
    t.after(d.done);
    const regSocket = join(d.registry, 'gpu.example.com-reg.sock');
    const first = await tinyDriver(regSocket, info(join(d.plugins, 'dra.sock')), { versions: ['v1'] });
    t.after(first.stop);
    const w = await PluginWatcherStandIn.start(d.registry);
    t.after(() => w.stop());
    await w.waitForRegistrations(1);
    assert.deepEqual(first.statuses, [{ plugin_registered: true, error: '' }]);

    first.stop();
    await rm(regSocket, { force: true });
    await rm(join(d.plugins, 'dra.sock'), { force: true });
    const gone = await w.waitForDeregistrations(1);
    assert.deepEqual(gone, { name: 'gpu.example.com', socket: regSocket });
    assert.equal(w.registered('gpu.example.com'), undefined);

    const second = await tinyDriver(regSocket, info(join(d.plugins, 'dra.sock')), { versions: ['v1'] });
    t.after(second.stop);
    const again = await w.waitForRegistrations(2);
    assert.equal(again.socket, regSocket);
    assert.deepEqual(second.statuses, [{ plugin_registered: true, error: '' }]);
    const res = await w.client('gpu.example.com').prepare([{ namespace: 'n', uid: 'u3', name: 'c3' }]);
    assert.ok(res.claims.u3 !== undefined);
    assert.equal(second.prepared.length, 1);
  },
);

test('any socket counts (not only *.sock); dot-files and plain files are ignored', async (t) => {
  const d = dirs();
  t.after(d.done);
  const w = await PluginWatcherStandIn.start(d.registry, { health: false });
  t.after(() => w.stop());
  writeFileSync(join(d.registry, 'notes.sock'), 'not a socket');
  const hidden = await tinyDriver(
    join(d.registry, '.hidden-reg.sock'),
    info(join(d.plugins, 'hidden.sock'), { name: 'hidden.example.com' }),
    { versions: ['v1'] },
  );
  t.after(hidden.stop);
  const odd = await tinyDriver(join(d.registry, 'odd-name.socket'), info(join(d.plugins, 'dra.sock')), {
    versions: ['v1'],
  });
  t.after(odd.stop);
  await w.waitForRegistrations(1);
  // A last socket after the others: once it is registered, the watcher has seen every event before it.
  const last = await tinyDriver(
    join(d.registry, 'last.sock'),
    info(join(d.plugins, 'last.sock'), { name: 'last.example.com' }),
    { versions: ['v1'] },
  );
  t.after(last.stop);
  await w.waitForRegistrations(2);
  assert.deepEqual(
    w.registrations.map((r) => r.name),
    ['gpu.example.com', 'last.example.com'],
  );
  assert.deepEqual(hidden.statuses, []);
  assert.deepEqual(w.rejected, []);
});

test(
  'two plugins of one driver (a rolling update): calls ' + 'go to the newest, and back to the older when it leaves',
  async (t) => {
    const d = dirs();
    t.after(d.done);
    const w = await PluginWatcherStandIn.start(d.registry, { health: false });
    t.after(() => w.stop());
    const old = await tinyDriver(join(d.registry, 'old-reg.sock'), info(join(d.plugins, 'old.sock')), {
      versions: ['v1'],
    });
    t.after(old.stop);
    await w.waitForRegistrations(1);
    const next = await tinyDriver(join(d.registry, 'new-reg.sock'), info(join(d.plugins, 'new.sock')), {
      versions: ['v1'],
    });
    t.after(next.stop);
    await w.waitForRegistrations(2);
    await w.client('gpu.example.com').prepare([{ namespace: 'n', uid: 'u1', name: 'c1' }]);
    assert.deepEqual([old.prepared.length, next.prepared.length], [0, 1]);
    next.stop();
    await rm(join(d.registry, 'new-reg.sock'), { force: true });
    await w.waitForDeregistrations(1);
    await w.client('gpu.example.com').prepare([{ namespace: 'n', uid: 'u2', name: 'c2' }]);
    assert.deepEqual([old.prepared.length, next.prepared.length], [1, 1]);
  },
);

test(
  'the health stream is opened for every registered ' + 'plugin; one without the service answers UNIMPLEMENTED',
  async (t) => {
    const d = dirs();
    t.after(d.done);
    const w = await PluginWatcherStandIn.start(d.registry, { healthRetryMs: 60_000 });
    t.after(() => w.stop());
    const drv = await tinyDriver(join(d.registry, 'g-reg.sock'), info(join(d.plugins, 'dra.sock')), {
      versions: ['v1'],
    });
    t.after(drv.stop);
    await w.waitForRegistrations(1);
    const e = await w.waitForHealthErrors(1);
    assert.equal(e.driver, 'gpu.example.com');
    assert.equal(e.code, grpc.status.UNIMPLEMENTED);
  },
);

test('a driver serving v1alpha1.DRAResourceHealth has its health stream read, each message a full list', async (t) => {
  const d = dirs();
  t.after(d.done);
  const w = await PluginWatcherStandIn.start(d.registry);
  t.after(() => w.stop());
  const healthy: NodeWatchResourcesResponse = {
    devices: [
      {
        device: { pool_name: 'node-a', device_name: 'gpu-0' },
        health: 1,
        last_updated_time: 1_780_000_000,
        health_check_timeout_seconds: 30,
        message: '',
      },
      {
        device: { pool_name: 'node-a', device_name: 'gpu-1' },
        health: 1,
        last_updated_time: 1_780_000_000,
        health_check_timeout_seconds: 30,
        message: '',
      },
    ],
  };
  const drv = await tinyDriver(
    join(d.registry, 'g-reg.sock'),
    info(join(d.plugins, 'dra.sock'), { supported_versions: ['v1.DRAPlugin', 'v1alpha1.DRAResourceHealth'] }),
    { versions: ['v1'], health: healthy },
  );
  t.after(drv.stop);
  await w.waitForRegistrations(1);
  assert.deepEqual(await w.waitForHealth('gpu.example.com', (devs) => devs.length === 2), healthy.devices);
  // Each message is the complete list: the next one replaces it.
  const sick: NodeWatchResourcesResponse = {
    devices: [
      {
        device: { pool_name: 'node-a', device_name: 'gpu-1' },
        health: 2,
        last_updated_time: 1_780_000_060,
        health_check_timeout_seconds: 30,
        message: 'XID 79',
      },
    ],
  };
  drv.sendHealth(sick);
  assert.deepEqual(await w.waitForHealth('gpu.example.com', (devs) => devs.length === 1), sick.devices);
  assert.equal(w.health.get('gpu.example.com')?.messages, 2);
  // The kubelet's view: the last report received of each device, Unknown once older than its timeout
  // (the time it came counts, not its last_updated_time); a device left out of a message keeps its last
  // report until that goes stale.
  const now = Date.now();
  const view = (device: string, at: number): { health: string; message: string } =>
    w.kubeletHealth('gpu.example.com', 'node-a', device, at);
  assert.deepEqual(view('gpu-1', now), { health: 'Unhealthy', message: 'XID 79' });
  assert.deepEqual(view('gpu-0', now), { health: 'Healthy', message: '' });
  assert.deepEqual(view('gpu-1', now + 30_001), { health: 'Unknown', message: '' });
  assert.deepEqual(view('gpu-0', now + 30_001), { health: 'Unknown', message: '' });
  assert.deepEqual(view('gpu-9', now), { health: 'Unknown', message: '' }, 'never reported: Unknown');
  // A report stating no timeout (0) is the kubelet's 30 s; one stating 2 s is stale after 2 s.
  drv.sendHealth({
    devices: [
      { ...sick.devices[0]!, health_check_timeout_seconds: 0 },
      { ...sick.devices[0]!, device: { pool_name: 'node-a', device_name: 'gpu-2' }, health_check_timeout_seconds: 2 },
    ],
  });
  await w.waitForHealth('gpu.example.com', (devs) => devs.length === 2);
  const then = Date.now();
  assert.equal(view('gpu-1', then + 29_000).health, 'Unhealthy');
  assert.equal(view('gpu-1', then + 30_001).health, 'Unknown');
  assert.equal(view('gpu-2', then + 1_000).health, 'Unhealthy');
  assert.equal(view('gpu-2', then + 2_001).health, 'Unknown');
  assert.deepEqual(w.staleReports, [], 'every report came within its timeout');
});

test(
  "ResourceSlices: the kubelet wipes its node's slices at " +
    "start, and a driver's once it stays away, unless it comes back",
  async (t) => {
    const calls: [string, string | undefined][] = [];
    const janitor: SliceJanitor = {
      deleteNodeSlices(node, driver) {
        calls.push([node, driver]);
        return 1;
      },
    };
    const d = dirs();
    t.after(d.done);
    const regSocket = join(d.registry, 'g-reg.sock');
    // A long delay: a driver that comes back in time keeps its slices.
    const w = await PluginWatcherStandIn.start(d.registry, {
      slices: { janitor, nodeName: 'node-a', wipeDelayMs: 60_000 },
    });
    t.after(() => w.stop());
    assert.deepEqual(calls, [['node-a', undefined]]);
    const a = await tinyDriver(regSocket, info(join(d.plugins, 'dra.sock')), { versions: ['v1'] });
    await w.waitForRegistrations(1);
    a.stop();
    await rm(regSocket, { force: true });
    await w.waitForDeregistrations(1);
    assert.deepEqual(w.pendingWipes(), ['gpu.example.com']);
    const b = await tinyDriver(regSocket, info(join(d.plugins, 'dra2.sock')), { versions: ['v1'] });
    t.after(b.stop);
    await w.waitForRegistrations(2);
    assert.deepEqual(w.pendingWipes(), []);
    assert.deepEqual(calls, [['node-a', undefined]]);

    // A zero delay: the driver's slices go as soon as it deregisters.
    const d2 = dirs();
    t.after(d2.done);
    const w2 = await PluginWatcherStandIn.start(d2.registry, {
      slices: { janitor, nodeName: 'node-b', wipeDelayMs: 0 },
    });
    t.after(() => w2.stop());
    const c = await tinyDriver(join(d2.registry, 'g-reg.sock'), info(join(d2.plugins, 'dra.sock')), {
      versions: ['v1'],
    });
    await w2.waitForRegistrations(1);
    c.stop();
    const wiped = new Promise((resolve) => w2.once('wiped', resolve));
    await rm(join(d2.registry, 'g-reg.sock'), { force: true });
    assert.equal(await wiped, 'gpu.example.com');
    assert.deepEqual(calls.slice(1), [
      ['node-b', undefined],
      ['node-b', 'gpu.example.com'],
    ]);
    assert.deepEqual(w2.wipes, [
      { driver: undefined, deleted: 1 },
      { driver: 'gpu.example.com', deleted: 1 },
    ]);
  },
);

test(
  "with the API server stand-in as the kubelet's client: " + "its node's slices go at start, a driver's once it leaves",
  async (t) => {
    const api = await ApiServerStandIn.start();
    t.after(() => api.stop());
    const put = (name: string, node: string, driver: string): void => {
      api.slices.set(name, {
        apiVersion: 'resource.k8s.io/v1',
        kind: 'ResourceSlice',
        metadata: { name },
        spec: { driver, nodeName: node, pool: { name: node, generation: 1, resourceSliceCount: 1 } },
      });
    };
    put('a-gpu', 'node-a', 'gpu.example.com');
    put('b-gpu', 'node-b', 'gpu.example.com');
    const d = dirs();
    t.after(d.done);
    const w = await PluginWatcherStandIn.start(d.registry, {
      health: false,
      slices: { janitor: api, nodeName: 'node-a', wipeDelayMs: 0 },
    });
    t.after(() => w.stop());
    assert.deepEqual([...api.slices.keys()], ['b-gpu']);

    const drv = await tinyDriver(join(d.registry, 'g-reg.sock'), info(join(d.plugins, 'dra.sock')), {
      versions: ['v1'],
    });
    await w.waitForRegistrations(1);
    put('a-gpu-2', 'node-a', 'gpu.example.com');
    put('a-nic', 'node-a', 'nic.example.com');
    drv.stop();
    const wiped = new Promise((resolve) => w.once('wiped', resolve));
    await rm(join(d.registry, 'g-reg.sock'), { force: true });
    await wiped;
    assert.deepEqual([...api.slices.keys()].sort(), ['a-nic', 'b-gpu']);
  },
);

test(
  'a driver restarting at once (its socket unlinked ' + 'and bound again) is deregistered and registered again',
  async (t) => {
    const d = dirs();
    t.after(d.done);
    const w = await PluginWatcherStandIn.start(d.registry, { health: false });
    t.after(() => w.stop());
    const regSocket = join(d.registry, 'gpu.example.com-reg.sock');
    const first = await tinyDriver(regSocket, info(join(d.plugins, 'dra.sock')), { versions: ['v1'] });
    await w.waitForRegistrations(1);
    first.stop();
    await rm(regSocket, { force: true });
    await rm(join(d.plugins, 'dra.sock'), { force: true });
    const second = await tinyDriver(regSocket, info(join(d.plugins, 'dra.sock')), { versions: ['v1'] });
    t.after(second.stop);
    await w.waitForRegistrations(2);
    assert.deepEqual(second.statuses, [{ plugin_registered: true, error: '' }]);
    assert.equal(w.deregistrations.length, 1);
    await w.client('gpu.example.com').prepare([{ namespace: 'n', uid: 'u', name: 'c' }]);
    assert.equal(second.prepared.length, 1);
  },
);

test('which health service a kubelet opens: 1.37 takes v1 when listed, else v1alpha1, else none; 1.36 v1alpha1', () => {
  const listing = (...l: string[]): PluginInfo => info('/dra.sock', { supported_versions: ['v1.DRAPlugin', ...l] });
  const k137: DraHealthVersion[] = ['v1', 'v1alpha1'];
  assert.equal(pickHealthVersion(listing(), k137), null);
  assert.equal(pickHealthVersion(listing('v1alpha1.DRAResourceHealth'), k137), 'v1alpha1');
  assert.equal(pickHealthVersion(listing('v1.DRAResourceHealth'), k137), 'v1');
  assert.equal(pickHealthVersion(listing('v1alpha1.DRAResourceHealth', 'v1.DRAResourceHealth'), k137), 'v1');
  // 1.34–1.36 speak v1alpha1 only, and open it for every plugin.
  assert.equal(pickHealthVersion(listing(), ['v1alpha1']), 'v1alpha1');
  assert.equal(pickHealthVersion(listing('v1.DRAResourceHealth'), ['v1alpha1']), 'v1alpha1');
});

for (const [kubelet, versions, listed, want] of [
  ['1.37', ['v1', 'v1alpha1'], ['v1.DRAResourceHealth', 'v1alpha1.DRAResourceHealth'], 'v1'],
  ['1.37', ['v1', 'v1alpha1'], ['v1alpha1.DRAResourceHealth'], 'v1alpha1'],
  ['1.36', ['v1alpha1'], ['v1.DRAResourceHealth', 'v1alpha1.DRAResourceHealth'], 'v1alpha1'],
] as [string, DraHealthVersion[], string[], DraHealthVersion][]) {
  test(`a ${kubelet} kubelet reads the ${want} health stream of a driver listing ${listed.join(', ')}`, async (t) => {
    const d = dirs();
    t.after(d.done);
    const w = await PluginWatcherStandIn.start(d.registry, { healthVersions: versions });
    t.after(() => w.stop());
    const list: NodeWatchResourcesResponse = {
      devices: [
        {
          device: { pool_name: 'node-a', device_name: 'gpu-0' },
          health: 2,
          last_updated_time: 1_780_000_000,
          health_check_timeout_seconds: 0,
          message: 'XID 79',
        },
      ],
    };
    const drv = await tinyDriver(
      join(d.registry, 'g-reg.sock'),
      info(join(d.plugins, 'dra.sock'), { supported_versions: ['v1.DRAPlugin', ...listed] }),
      { versions: ['v1'], health: list, healthVersions: ['v1', 'v1alpha1'] },
    );
    t.after(drv.stop);
    assert.equal((await w.waitForRegistrations(1)).healthVersion, want);
    assert.deepEqual(await w.waitForHealth('gpu.example.com', (devs) => devs.length === 1), list.devices);
    assert.deepEqual(drv.healthOpened, [want]);
  });
}

test('a registration socket whose GetInfo fails is tried again while it stays, as the kubelet does', async (t) => {
  const d = dirs();
  t.after(d.done);
  const w = await PluginWatcherStandIn.start(d.registry);
  t.after(() => w.stop());
  let asked = 0;
  const server = new grpc.Server();
  server.addService(pluginRegistrationService(), {
    GetInfo: (_c: grpc.ServerUnaryCall<unknown, PluginInfo>, cb: grpc.sendUnaryData<PluginInfo>) => {
      // A plugin still busy starting: the first two calls fail.
      if (++asked <= 2) cb({ code: grpc.status.UNAVAILABLE, details: 'starting' });
      else cb(null, info(join(d.plugins, 'dra.sock')));
    },
    NotifyRegistrationStatus: (_c: grpc.ServerUnaryCall<RegistrationStatus, object>, cb: grpc.sendUnaryData<object>) =>
      cb(null, {}),
  });
  await bind(server, join(d.registry, 'slow-reg.sock'));
  t.after(() => server.forceShutdown());
  const reg = await w.waitForRegistrations(1, 10_000);
  assert.equal(reg.name, 'gpu.example.com');
  assert.equal(asked, 3);
  assert.equal(w.rejected.length, 2, 'each failed try is a rejection');
  assert.match(w.rejected[0]?.reason ?? '', /GetInfo on .*slow-reg\.sock failed: 14 UNAVAILABLE: starting/);
});
