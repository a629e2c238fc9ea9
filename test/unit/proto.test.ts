// The executable builds its codecs from descriptors made at build time (build/build.ts), a source run
// from the .proto text: both must give the same types and the same bytes.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { readFileSync } from 'node:fs';
import protobuf from 'protobufjs';
import { PROTO_FILES, codec, parseProto } from '../../src/api/proto.ts';
import type { ProtoFile } from '../../src/api/proto.ts';
import type * as M from '../../src/api/messages.ts';
import { assetSourcePath } from '../../src/system/assets.ts';

/** What the build embeds: the descriptor, through JSON text (esbuild's define). */
function viaDescriptor(file: ProtoFile): protobuf.Root {
  const parsed = parseProto(readFileSync(assetSourcePath(file), 'utf8'));
  const root = protobuf.Root.fromJSON(JSON.parse(JSON.stringify(parsed.toJSON())) as protobuf.INamespace);
  root.resolveAll();
  return root;
}

function parsed(file: ProtoFile): protobuf.Root {
  const root = parseProto(readFileSync(assetSourcePath(file), 'utf8'));
  root.resolveAll();
  return root;
}

test('a root made from the built descriptor is the parsed .proto, for every file', () => {
  // Compared as JSON data: protobufjs keeps an enum's values in a null-prototype object when it
  // parses and in a plain one when it reads a descriptor, which strict deepEqual tells apart.
  const plain = (r: protobuf.Root): unknown => JSON.parse(JSON.stringify(r.toJSON()));
  for (const file of PROTO_FILES) {
    assert.deepEqual(plain(viaDescriptor(file)), plain(parsed(file)), file);
  }
});

test('codecs from the descriptor and from the .proto text write and read the same bytes', () => {
  const a = viaDescriptor('deviceplugin.proto');
  const b = parsed('deviceplugin.proto');
  const reg: M.RegisterRequest = {
    version: 'v1beta1',
    endpoint: 'gpu-device-plugin-gpu.sock',
    resource_name: 'nvidia.com/gpu',
    options: { pre_start_required: false, get_preferred_allocation_available: true },
  };
  const alloc: M.AllocateResponse = {
    container_responses: [
      {
        envs: { NVIDIA_VISIBLE_DEVICES: 'GPU-1,GPU-2' },
        mounts: [
          { container_path: '/var/run/nvidia-container-devices/GPU-1', host_path: '/dev/null', read_only: true },
        ],
        devices: [{ container_path: '/dev/nvidia0', host_path: '/dev/nvidia0', permissions: 'rw' }],
        annotations: { 'cdi.k8s.io/x': 'k8s.device-plugin.nvidia.com/gpu=GPU-1' },
        cdi_devices: [{ name: 'k8s.device-plugin.nvidia.com/gpu=GPU-1' }],
      },
    ],
  };
  const law: M.ListAndWatchResponse = {
    devices: [{ ID: 'GPU-1', health: 'Healthy', topology: { nodes: [{ ID: 1 }] } }],
  };
  for (const [name, msg] of [
    ['RegisterRequest', reg],
    ['AllocateResponse', alloc],
    ['ListAndWatchResponse', law],
  ] as const) {
    const bytes = codec(a, name).encode(msg);
    assert.ok(bytes.length > 0, name);
    assert.deepEqual(bytes, codec(b, name).encode(msg), name);
    assert.deepEqual(codec(a, name).decode(bytes), codec(b, name).decode(bytes), name);
  }
});
