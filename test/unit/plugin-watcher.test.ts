// The kubelet plugin watcher stand-in (test/support/plugin-watcher.ts) against a tiny in-test DRA
// driver over real gRPC: registration and its status report, version choice, refusals, removal as
// deregistration, the DRA calls, the health stream and the kubelet's ResourceSlice clean-up.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import * as grpc from '@grpc/grpc-js';
import { mkdirSync, mkdtempSync, rmSync } from 'node:fs';
import { rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { draHealthService, draPluginService, pluginRegistrationService } from '../../src/api/dra.ts';
import type {
  DraVersion,
  NodePrepareResourcesRequest,
  NodePrepareResourcesResponse,
  NodeUnprepareResourcesRequest,
  NodeUnprepareResourcesResponse,
  NodeWatchResourcesResponse,
  PluginInfo,
  RegistrationStatus,
} from '../../src/api/dra.ts';
import { PluginWatcherStandIn, validatePluginInfo } from '../support/plugin-watcher.ts';
import type { SliceJanitor } from '../support/plugin-watcher.ts';

interface TinyDriver {
  statuses: RegistrationStatus[];
  prepared: NodePrepareResourcesRequest[];
  unprepared: NodeUnprepareResourcesRequest[];
  /** Sends one health list to every open stream. */
  sendHealth(msg: NodeWatchResourcesResponse): void;
  stop(): void;
}

function bind(server: grpc.Server, path: string): Promise<void> {
  return new Promise((resolve, reject) => server.bindAsync(`unix://${path}`, grpc.ServerCredentials.createInsecure(), (err) => (err ? reject(err) : resolve())));
}

/**
 * A DRA driver: Registration on regSocket, DRAPlugin (the given versions) on its endpoint and, with
 * serve.health, the health stream, which sends that list when it opens.
 */
async function tinyDriver(regSocket: string, info: PluginInfo, serve: { versions: DraVersion[]; health?: NodeWatchResourcesResponse }): Promise<TinyDriver> {
  const d: TinyDriver = { statuses: [], prepared: [], unprepared: [], sendHealth: () => {}, stop: () => {} };
  const streams = new Set<grpc.ServerWritableStream<unknown, NodeWatchResourcesResponse>>();
  const plugin = new grpc.Server();
  for (const v of serve.versions) {
    plugin.addService(draPluginService(v), {
      NodePrepareResources: (call: grpc.ServerUnaryCall<NodePrepareResourcesRequest, NodePrepareResourcesResponse>, cb: grpc.sendUnaryData<NodePrepareResourcesResponse>) => {
        d.prepared.push(call.request);
        const claims: NodePrepareResourcesResponse['claims'] = {};
        for (const c of call.request.claims) {
          claims[c.uid] = { devices: [{ request_names: ['gpu'], pool_name: 'node-a', device_name: 'gpu-0', cdi_device_ids: [`k8s.gpu.example.com/claim=${c.uid}-gpu-0`] }], error: '' };
        }
        cb(null, { claims });
      },
      NodeUnprepareResources: (call: grpc.ServerUnaryCall<NodeUnprepareResourcesRequest, NodeUnprepareResourcesResponse>, cb: grpc.sendUnaryData<NodeUnprepareResourcesResponse>) => {
        d.unprepared.push(call.request);
        cb(null, { claims: Object.fromEntries(call.request.claims.map((c) => [c.uid, { error: '' }])) });
      },
    });
  }
  const initial = serve.health;
  if (initial !== undefined) {
    plugin.addService(draHealthService(), {
      NodeWatchResources: (call: grpc.ServerWritableStream<unknown, NodeWatchResourcesResponse>) => {
        streams.add(call);
        call.write(initial);
        call.on('cancelled', () => streams.delete(call));
      },
    });
  }
  await bind(plugin, info.endpoint);
  const reg = new grpc.Server();
  reg.addService(pluginRegistrationService(), {
    GetInfo: (_call: grpc.ServerUnaryCall<unknown, PluginInfo>, cb: grpc.sendUnaryData<PluginInfo>) => cb(null, info),
    NotifyRegistrationStatus: (call: grpc.ServerUnaryCall<RegistrationStatus, object>, cb: grpc.sendUnaryData<object>) => {
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

test('a DRA driver is registered, told so, and served NodePrepareResources / NodeUnprepareResources over v1', async (t) => {
  const d = dirs();
  t.after(d.done);
  const w = await PluginWatcherStandIn.start(d.registry);
  t.after(() => w.stop());
  const drv = await tinyDriver(join(d.registry, 'gpu.example.com-reg.sock'), info(join(d.plugins, 'dra.sock')), { versions: ['v1'] });
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
});

test('the first service in the driver\'s list that the kubelet speaks is used (v1beta1 here)', async (t) => {
  const d = dirs();
  t.after(d.done);
  const w = await PluginWatcherStandIn.start(d.registry);
  t.after(() => w.stop());
  const drv = await tinyDriver(join(d.registry, 'x-reg.sock'), info(join(d.plugins, 'dra.sock'), { supported_versions: ['v9.DRAPlugin', 'v1beta1.DRAPlugin', 'v1.DRAPlugin'] }), { versions: ['v1beta1'] });
  t.after(drv.stop);
  const reg = await w.waitForRegistrations(1);
  assert.equal(reg.version, 'v1beta1');
  // The plugin serves only v1beta1: the call succeeds only if it went to the v1beta1 method path.
  const res = await w.client('gpu.example.com').prepare([{ namespace: 'ns', uid: 'u2', name: 'c2' }]);
  assert.equal(res.claims['u2']?.devices[0]?.device_name, 'gpu-0');
});

test('a kubelet that speaks only v1 refuses a v1beta1-only driver and tells it why', async (t) => {
  const d = dirs();
  t.after(d.done);
  const w = await PluginWatcherStandIn.start(d.registry, { versions: ['v1'] });
  t.after(() => w.stop());
  const drv = await tinyDriver(join(d.registry, 'x-reg.sock'), info(join(d.plugins, 'dra.sock'), { supported_versions: ['v1beta1.DRAPlugin'] }), { versions: ['v1beta1'] });
  t.after(drv.stop);
  const r = await w.waitForRejections(1);
  assert.equal(r.notified, true);
  assert.match(r.reason, /none of the offered gRPC services \["v1beta1.DRAPlugin"\] is supported; this kubelet speaks v1.DRAPlugin/);
  assert.equal(drv.statuses.length, 1);
  assert.equal(drv.statuses[0]?.plugin_registered, false);
  assert.equal(drv.statuses[0]?.error, r.reason);
  assert.equal(w.registrations.length, 0);
  assert.throws(() => w.client('gpu.example.com'), /no driver gpu.example.com registered/);
});

test('GetInfo answers the kubelet refuses: wrong type, empty versions, no name, relative endpoint', async (t) => {
  const cases: [Partial<PluginInfo>, RegExp][] = [
    [{ type: 'DevicePlugin' }, /no handler registered for plugin type: "DevicePlugin"/],
    [{ supported_versions: [] }, /empty list of supported gRPC services/],
    [{ name: '' }, /empty driver name/],
    [{ endpoint: 'dra.sock' }, /endpoint "dra.sock" is not an absolute socket path/],
  ];
  const d = dirs();
  t.after(d.done);
  const w = await PluginWatcherStandIn.start(d.registry);
  t.after(() => w.stop());
  let n = 0;
  for (const [over, want] of cases) {
    n++;
    const endpoint = join(d.plugins, `dra-${n}.sock`);
    const drv = await tinyDriver(join(d.registry, `bad-${n}-reg.sock`), { ...info(endpoint), ...over }, { versions: ['v1'] });
    t.after(drv.stop);
    const r = await w.waitForRejections(n);
    assert.match(r.reason, want);
    assert.deepEqual(drv.statuses, [{ plugin_registered: false, error: r.reason }]);
  }
  assert.equal(w.registrations.length, 0);
  // The same checks as a pure function.
  assert.deepEqual(validatePluginInfo(info('/x'), '/r.sock', ['v1', 'v1beta1']), { version: 'v1' });
});

test('a socket already there at start is registered; its removal deregisters; a new socket registers again', async (t) => {
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
  assert.ok(res.claims['u3'] !== undefined);
  assert.equal(second.prepared.length, 1);
});

test('files that are not *.sock sockets are ignored', async (t) => {
  const d = dirs();
  t.after(d.done);
  const w = await PluginWatcherStandIn.start(d.registry);
  t.after(() => w.stop());
  // A socket with another suffix and then a real one: only the second is looked at.
  const other = await tinyDriver(join(d.registry, 'other.socket'), info(join(d.plugins, 'other-dra.sock'), { name: 'other.example.com' }), { versions: ['v1'] });
  t.after(other.stop);
  const drv = await tinyDriver(join(d.registry, 'gpu-reg.sock'), info(join(d.plugins, 'dra.sock')), { versions: ['v1'] });
  t.after(drv.stop);
  await w.waitForRegistrations(1);
  assert.deepEqual(w.registrations.map((r) => r.name), ['gpu.example.com']);
  assert.deepEqual(other.statuses, []);
});

test('a driver that announces v1alpha1.DRAResourceHealth gets its health stream read', async (t) => {
  const d = dirs();
  t.after(d.done);
  const w = await PluginWatcherStandIn.start(d.registry);
  t.after(() => w.stop());
  const healthy: NodeWatchResourcesResponse = { devices: [
    { device: { pool_name: 'node-a', device_name: 'gpu-0' }, health: 1, last_updated_time: 1_780_000_000, health_check_timeout_seconds: 30, message: '' },
    { device: { pool_name: 'node-a', device_name: 'gpu-1' }, health: 1, last_updated_time: 1_780_000_000, health_check_timeout_seconds: 30, message: '' },
  ] };
  const drv = await tinyDriver(join(d.registry, 'g-reg.sock'), info(join(d.plugins, 'dra.sock'), { supported_versions: ['v1.DRAPlugin', 'v1alpha1.DRAResourceHealth'] }), { versions: ['v1'], health: healthy });
  t.after(drv.stop);
  await w.waitForRegistrations(1);
  assert.deepEqual(await w.waitForHealth('gpu.example.com', (devs) => devs.length === 2), healthy.devices);
  // Each message is the complete list: the next one replaces it.
  const sick: NodeWatchResourcesResponse = { devices: [{ device: { pool_name: 'node-a', device_name: 'gpu-1' }, health: 2, last_updated_time: 1_780_000_060, health_check_timeout_seconds: 30, message: 'XID 79' }] };
  drv.sendHealth(sick);
  assert.deepEqual(await w.waitForHealth('gpu.example.com', (devs) => devs.length === 1), sick.devices);
  assert.equal(w.health.get('gpu.example.com')?.messages, 2);
});

test('ResourceSlices: the kubelet wipes its node\'s slices at start, and a driver\'s once it stays away, unless it comes back', async (t) => {
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
  const w = await PluginWatcherStandIn.start(d.registry, { slices: { janitor, nodeName: 'node-a', wipeDelayMs: 60_000 } });
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
  const w2 = await PluginWatcherStandIn.start(d2.registry, { slices: { janitor, nodeName: 'node-b', wipeDelayMs: 0 } });
  t.after(() => w2.stop());
  const c = await tinyDriver(join(d2.registry, 'g-reg.sock'), info(join(d2.plugins, 'dra.sock')), { versions: ['v1'] });
  await w2.waitForRegistrations(1);
  c.stop();
  const wiped = new Promise((resolve) => w2.once('wiped', resolve));
  await rm(join(d2.registry, 'g-reg.sock'), { force: true });
  assert.equal(await wiped, 'gpu.example.com');
  assert.deepEqual(calls.slice(1), [['node-b', undefined], ['node-b', 'gpu.example.com']]);
  assert.deepEqual(w2.wipes, [{ driver: undefined, deleted: 1 }, { driver: 'gpu.example.com', deleted: 1 }]);
});
