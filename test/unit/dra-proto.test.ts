// The DRA groundwork protos (proto/pluginregistration.proto, dra-v1.proto, dra-v1beta1.proto,
// dra-health-v1alpha1.proto) against the interface read from kubernetes/kubelet at tag v0.36.3
// (pkg/apis/pluginregistration/v1, dra/v1, dra/v1beta1, dra-health/v1alpha1), and dra-health-v1.proto
// against pkg/apis/dra-health/v1 on its master of 2026-07-23 (Kubernetes 1.37): packages, services,
// methods and every field's name, number, type and label. The tables below are that reading.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { readFileSync } from 'node:fs';
import protobuf from 'protobufjs';
import { parseProto } from '../../src/api/proto.ts';
import type { ProtoFile } from '../../src/api/proto.ts';
import { assetSourcePath } from '../../src/system/assets.ts';
import { DRA_PACKAGES, draHealthService, draPluginService, pluginRegistrationService } from '../../src/api/dra.ts';
import type { NodePrepareResourcesResponse, NodeWatchResourcesResponse, PluginInfo } from '../../src/api/dra.ts';

/** name → [number, type, 'repeated' | 'map<key>' | 'optional' | ''] */
type Fields = Record<string, [number, string, string]>;
interface Expected {
  pkg: string;
  services: Record<string, Record<string, [string, string, boolean]>>; // rpc → [request, response, server streaming]
  messages: Record<string, Fields>;
}

const draMessages = (v1: boolean): Record<string, Fields> => ({
  NodePrepareResourcesRequest: { claims: [1, 'Claim', 'repeated'] },
  NodePrepareResourcesResponse: { claims: [1, 'NodePrepareResourceResponse', 'map<string>'] },
  NodePrepareResourceResponse: { devices: [1, 'Device', 'repeated'], error: [2, 'string', ''] },
  Device: {
    request_names: [1, 'string', 'repeated'],
    pool_name: [2, 'string', ''],
    device_name: [3, 'string', ''],
    cdi_device_ids: [4, 'string', 'repeated'],
    ...(v1 ? { share_id: [5, 'string', 'optional'] as [number, string, string] } : {}),
  },
  NodeUnprepareResourcesRequest: { claims: [1, 'Claim', 'repeated'] },
  NodeUnprepareResourcesResponse: { claims: [1, 'NodeUnprepareResourceResponse', 'map<string>'] },
  NodeUnprepareResourceResponse: { error: [1, 'string', ''] },
  Claim: { namespace: [1, 'string', ''], uid: [2, 'string', ''], name: [3, 'string', ''] },
});
const draService = {
  DRAPlugin: {
    NodePrepareResources: ['NodePrepareResourcesRequest', 'NodePrepareResourcesResponse', false],
    NodeUnprepareResources: ['NodeUnprepareResourcesRequest', 'NodeUnprepareResourcesResponse', false],
  },
} satisfies Expected['services'];

const EXPECTED: Partial<Record<ProtoFile, Expected>> = {
  'pluginregistration.proto': {
    pkg: 'pluginregistration',
    services: {
      Registration: {
        GetInfo: ['InfoRequest', 'PluginInfo', false],
        NotifyRegistrationStatus: ['RegistrationStatus', 'RegistrationStatusResponse', false],
      },
    },
    messages: {
      InfoRequest: {},
      PluginInfo: {
        type: [1, 'string', ''],
        name: [2, 'string', ''],
        endpoint: [3, 'string', ''],
        supported_versions: [4, 'string', 'repeated'],
      },
      RegistrationStatus: { plugin_registered: [1, 'bool', ''], error: [2, 'string', ''] },
      RegistrationStatusResponse: {},
    },
  },
  'dra-v1.proto': { pkg: 'k8s.io.kubelet.pkg.apis.dra.v1', services: draService, messages: draMessages(true) },
  'dra-v1beta1.proto': {
    pkg: 'k8s.io.kubelet.pkg.apis.dra.v1beta1',
    services: draService,
    messages: draMessages(false),
  },
  'dra-health-v1alpha1.proto': healthProto('v1alpha1'),
  'dra-health-v1.proto': healthProto('v1'),
};

/** The health service's file of one version (v1 has v1alpha1's messages, in package v1). */
function healthProto(pkg: string): Expected {
  return {
    pkg,
    services: {
      DRAResourceHealth: { NodeWatchResources: ['NodeWatchResourcesRequest', 'NodeWatchResourcesResponse', true] },
    },
    messages: {
      NodeWatchResourcesRequest: {},
      DeviceIdentifier: { pool_name: [1, 'string', ''], device_name: [2, 'string', ''] },
      DeviceHealth: {
        device: [1, 'DeviceIdentifier', ''],
        health: [2, 'HealthStatus', ''],
        last_updated_time: [3, 'int64', ''],
        health_check_timeout_seconds: [4, 'int64', ''],
        message: [5, 'string', ''],
      },
      NodeWatchResourcesResponse: { devices: [1, 'DeviceHealth', 'repeated'] },
    },
  };
}

function load(file: ProtoFile): protobuf.Root {
  const root = parseProto(readFileSync(assetSourcePath(file), 'utf8'));
  root.resolveAll();
  return root;
}

function label(f: protobuf.Field): string {
  if (f instanceof protobuf.MapField) return `map<${f.keyType}>`;
  if (f.repeated) return 'repeated';
  if (f.options?.proto3_optional === true) return 'optional';
  return '';
}

for (const [file, want] of Object.entries(EXPECTED) as [ProtoFile, Expected][]) {
  test(`${file}: package, services and field numbers are the kubelet's`, () => {
    const root = load(file);
    const ns = root.lookup(want.pkg);
    assert.ok(ns instanceof protobuf.Namespace, `package ${want.pkg}`);
    const types = ns.nestedArray
      .filter((n) => n instanceof protobuf.Type)
      .map((n) => n.name)
      .sort();
    assert.deepEqual(types, Object.keys(want.messages).sort(), `${file}: the set of messages`);
    for (const [msg, fields] of Object.entries(want.messages)) {
      const t = root.lookupType(`${want.pkg}.${msg}`);
      const got = Object.fromEntries(t.fieldsArray.map((f) => [f.name, [f.id, f.type, label(f)]]));
      assert.deepEqual(got, fields, `${want.pkg}.${msg}`);
    }
    const services = ns.nestedArray.filter((n) => n instanceof protobuf.Service);
    assert.deepEqual(
      services.map((s) => s.name).sort(),
      Object.keys(want.services).sort(),
      `${file}: the set of services`,
    );
    for (const [svc, methods] of Object.entries(want.services)) {
      const s = root.lookupService(`${want.pkg}.${svc}`);
      const got = Object.fromEntries(
        s.methodsArray.map((m) => [m.name, [m.requestType, m.responseType, m.responseStream === true]]),
      );
      assert.deepEqual(got, methods, `${want.pkg}.${svc}`);
    }
  });
}

test('dra-health-v1alpha1.proto: HealthStatus is UNKNOWN 0, HEALTHY 1, UNHEALTHY 2', () => {
  assert.deepEqual(
    { ...load('dra-health-v1alpha1.proto').lookupEnum('v1alpha1.HealthStatus').values },
    { UNKNOWN: 0, HEALTHY: 1, UNHEALTHY: 2 },
  );
  assert.deepEqual(
    { ...load('dra-health-v1.proto').lookupEnum('v1.HealthStatus').values },
    { UNKNOWN: 0, HEALTHY: 1, UNHEALTHY: 2 },
  );
});

test('method paths carry the proto packages (the registration strings are the short service names)', () => {
  assert.equal(pluginRegistrationService().GetInfo.path, '/pluginregistration.Registration/GetInfo');
  assert.equal(
    pluginRegistrationService().NotifyRegistrationStatus.path,
    '/pluginregistration.Registration/NotifyRegistrationStatus',
  );
  assert.equal(
    draPluginService('v1').NodePrepareResources.path,
    '/k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin/NodePrepareResources',
  );
  assert.equal(
    draPluginService('v1beta1').NodeUnprepareResources.path,
    `/${DRA_PACKAGES.v1beta1}.DRAPlugin/NodeUnprepareResources`,
  );
  assert.equal(draHealthService('v1alpha1').NodeWatchResources.path, '/v1alpha1.DRAResourceHealth/NodeWatchResources');
  assert.equal(draHealthService('v1alpha1').NodeWatchResources.responseStream, true);
  assert.equal(draHealthService('v1').NodeWatchResources.path, '/v1.DRAResourceHealth/NodeWatchResources');
  assert.equal(draHealthService('v1').NodeWatchResources.responseStream, true);
});

test('the codecs write the kubelet wire: hand-made bytes decode to the expected messages', () => {
  // PluginInfo{type="DRAPlugin"(1), name="x"(2), endpoint="/e"(3), supported_versions=["v1.DRAPlugin"](4)}
  const info = Buffer.concat([
    Buffer.from([0x0a, 9]),
    Buffer.from('DRAPlugin'),
    Buffer.from([0x12, 1]),
    Buffer.from('x'),
    Buffer.from([0x1a, 2]),
    Buffer.from('/e'),
    Buffer.from([0x22, 12]),
    Buffer.from('v1.DRAPlugin'),
  ]);
  const want: PluginInfo = { type: 'DRAPlugin', name: 'x', endpoint: '/e', supported_versions: ['v1.DRAPlugin'] };
  assert.deepEqual(pluginRegistrationService().GetInfo.responseDeserialize(info), want);
  assert.deepEqual(pluginRegistrationService().GetInfo.responseSerialize(want), info);

  // v1 share_id (5) survives a round trip; v1beta1 has no field 5, so it does not.
  const res: NodePrepareResourcesResponse = {
    claims: {
      'uid-1': {
        devices: [
          {
            request_names: ['gpu'],
            pool_name: 'node-a',
            device_name: 'gpu-0',
            cdi_device_ids: ['k8s.gpu.example.com/claim=uid-1-gpu-0'],
            share_id: 's1',
          },
        ],
        error: '',
      },
    },
  };
  const v1 = draPluginService('v1').NodePrepareResources;
  assert.deepEqual(v1.responseDeserialize(v1.responseSerialize(res)), res);
  const beta = draPluginService('v1beta1').NodePrepareResources;
  const back = beta.responseDeserialize(v1.responseSerialize(res));
  assert.equal(back.claims['uid-1']?.devices[0]?.device_name, 'gpu-0');
  assert.equal(back.claims['uid-1']?.devices[0]?.share_id, undefined);

  const h: NodeWatchResourcesResponse = {
    devices: [
      {
        device: { pool_name: 'node-a', device_name: 'gpu-1' },
        health: 2,
        last_updated_time: 1_780_000_000,
        health_check_timeout_seconds: 30,
        message: 'XID 79',
      },
    ],
  };
  const hs = draHealthService('v1alpha1').NodeWatchResources;
  assert.deepEqual(hs.responseDeserialize(hs.responseSerialize(h)), h);
  // The same bytes on both versions' streams.
  const v1h = draHealthService('v1').NodeWatchResources;
  assert.deepEqual(v1h.responseSerialize(h), hs.responseSerialize(h));
  assert.deepEqual(v1h.responseDeserialize(hs.responseSerialize(h)), h);
});
