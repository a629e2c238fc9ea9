// End-to-end: hostile requests on the plugin's socket through a real gRPC client — bodies that are
// not protobuf, megabyte IDs, 10 000-ID lists, messages over the size limit — each refused with a
// clear status naming what was wrong, while the daemon keeps serving and stays registered.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import * as grpc from '@grpc/grpc-js';
import { randomBytes } from 'node:crypto';
import { SimNode } from '../support/sim.ts';
import { devicePluginService } from '../../src/api/proto.ts';

interface Outcome {
  code: number;
  details: string;
}

test(
  'hostile requests are refused with INVALID_ARGUMENT or ' +
    'RESOURCE_EXHAUSTED naming the problem; the daemon keeps serving',
  async () => {
    const node = await SimNode.start({ topology: 'demo-8' });
    const client = new grpc.Client(`unix://${node.pluginSocket}`, grpc.credentials.createInsecure(), {
      'grpc.use_local_subchannel_pool': 1,
    });
    try {
      const k = node.kubelet!;
      const u = node.topology.gpus.map((g) => g.uuid);
      const svc = devicePluginService();
      const settle = (run: (done: (err: grpc.ServiceError | null) => void) => void): Promise<Outcome> =>
        new Promise((resolve) => {
          run((err) =>
            resolve(
              err === null ? { code: grpc.status.OK, details: 'answered' } : { code: err.code, details: err.details },
            ),
          );
        });
      const raw = (path: string, body: Buffer): Promise<Outcome> =>
        settle((done) => {
          client.makeUnaryRequest(
            path,
            (b: Buffer) => b,
            (b: Buffer) => b,
            body,
            new grpc.Metadata(),
            { deadline: Date.now() + 30000 },
            (err) => done(err),
          );
        });
      const allocate = (ids: string[]): Promise<Outcome> =>
        settle((done) => {
          client.makeUnaryRequest(
            svc.Allocate.path,
            svc.Allocate.requestSerialize,
            svc.Allocate.responseDeserialize,
            { container_requests: [{ devices_ids: ids }] },
            new grpc.Metadata(),
            { deadline: Date.now() + 30000 },
            (err) => done(err),
          );
        });
      const preferred = (available: string[], must: string[], size: number): Promise<Outcome> =>
        settle((done) => {
          client.makeUnaryRequest(
            svc.GetPreferredAllocation.path,
            svc.GetPreferredAllocation.requestSerialize,
            svc.GetPreferredAllocation.responseDeserialize,
            {
              container_requests: [
                { available_deviceIDs: available, must_include_deviceIDs: must, allocation_size: size },
              ],
            },
            new grpc.Metadata(),
            { deadline: Date.now() + 30000 },
            (err) => done(err),
          );
        });
      const expect = (o: Outcome, code: grpc.status, re: RegExp, what: string): void => {
        assert.equal(o.code, code, `${what}: status ${o.code} (${o.details}), expected ${code}`);
        assert.match(o.details, re, what);
        assert.ok(o.details.length < 400, `${what}: the message stays short (${o.details.length} characters)`);
      };

      // Not protobuf: a length running past the end, an invalid wire type.
      const pastEnd = Buffer.from([0x0a, 0xff, 0xff, 0x03, 0x41]);
      const wireType7 = Buffer.from([0x0f, 0x01]);
      expect(
        await raw(svc.Allocate.path, pastEnd),
        grpc.status.INVALID_ARGUMENT,
        /^Allocate request is not a valid v1beta1\.AllocateRequest \(protobuf decoding failed: .+\)/,
        'Allocate, length past the end',
      );
      expect(
        await raw(svc.GetPreferredAllocation.path, wireType7),
        grpc.status.INVALID_ARGUMENT,
        new RegExp(
          '^GetPreferredAllocation request is not a valid ' +
            String.raw`v1beta1\.PreferredAllocationRequest \(protobuf decoding failed: .+\)`,
        ),
        'GetPreferredAllocation, wire type 7',
      );
      expect(
        await raw(svc.GetDevicePluginOptions.path, wireType7),
        grpc.status.INVALID_ARGUMENT,
        /^GetDevicePluginOptions request is not a valid v1beta1\.Empty/,
        'GetDevicePluginOptions, wire type 7',
      );
      expect(
        await raw(svc.PreStartContainer.path, pastEnd),
        grpc.status.INVALID_ARGUMENT,
        /^PreStartContainer request is not a valid v1beta1\.PreStartContainerRequest/,
        'PreStartContainer, length past the end',
      );
      const stream = await settle((done) => {
        const s = client.makeServerStreamRequest(
          svc.ListAndWatch.path,
          (b: Buffer) => b,
          (b: Buffer) => b,
          wireType7,
        );
        s.on('data', () => undefined);
        s.on('error', (err: grpc.ServiceError) => done(err));
        s.on('end', () => done(null));
      });
      expect(
        stream,
        grpc.status.INVALID_ARGUMENT,
        /^ListAndWatch request is not a valid v1beta1\.Empty/,
        'ListAndWatch, wire type 7',
      );

      // Random bytes: whatever they decode to (or fail to), the answer is INVALID_ARGUMENT.
      for (let i = 0; i < 40; i++) {
        const path = i % 2 === 0 ? svc.Allocate.path : svc.GetPreferredAllocation.path;
        const o = await raw(path, randomBytes(16 + i * 97));
        assert.equal(o.code, grpc.status.INVALID_ARGUMENT, `random body #${i} to ${path}: ${o.code} ${o.details}`);
        assert.ok(o.details.length < 400, `random body #${i}: the message stays short`);
      }

      // A 1 MB ID, 10 000-ID lists.
      const huge = `GPU-${'x'.repeat(1 << 20)}`;
      const many = Array.from({ length: 10000 }, (_, i) => `GPU-${i}`);
      expect(
        await allocate([huge]),
        grpc.status.INVALID_ARGUMENT,
        /unknown device ID "GPU-x{73}\.\.\."/,
        'Allocate, 1 MB ID',
      );
      expect(
        await allocate(many),
        grpc.status.INVALID_ARGUMENT,
        /asks for 10000 devices, more than the 8 this plugin advertises/,
        'Allocate, 10 000 IDs',
      );
      expect(
        await preferred(many, [], 2),
        grpc.status.INVALID_ARGUMENT,
        /10000 available device IDs, more than the 8 this plugin advertises/,
        'GetPreferredAllocation, 10 000 IDs',
      );
      expect(
        await preferred(u, [huge], 2),
        grpc.status.INVALID_ARGUMENT,
        /must-include device ID "GPU-x{73}\.\.\." is not one this plugin advertises/,
        'GetPreferredAllocation, 1 MB must-include ID',
      );

      // Over the size limit: refused before it is read.
      expect(
        await raw(svc.Allocate.path, randomBytes(5 << 20)),
        grpc.status.RESOURCE_EXHAUSTED,
        /larger than max \(5242880 vs 4194304\)/,
        'Allocate, 5 MiB',
      );
      expect(
        await allocate([`GPU-${'y'.repeat(5 << 20)}`]),
        grpc.status.RESOURCE_EXHAUSTED,
        /larger than max/,
        'Allocate, one 5 MiB ID',
      );

      // Still serving, still registered, the kubelet's stream still open, nothing crashed or flooded the log.
      const ok = await k.allocate({ container_requests: [{ devices_ids: [u[4]!] }] });
      assert.equal(ok.container_responses[0]!.envs.NVIDIA_VISIBLE_DEVICES, u[4]);
      const pref = await k.preferred({
        container_requests: [{ available_deviceIDs: u, must_include_deviceIDs: [], allocation_size: 2 }],
      });
      assert.equal(pref.container_responses[0]!.deviceIDs.length, 2);
      assert.equal(node.plugin.exit, undefined, 'plugin still running');
      assert.equal(k.registrations.length, 1, 'registration kept');
      assert.equal(k.devices()?.length, 8, 'the kubelet still has the device list');
      node.nvml('xid 2 79');
      await k.waitForDevices((d) => d[2]?.health === 'Unhealthy');
      assert.equal(
        node.plugin.matching(/unexpected error| ERROR /).length,
        0,
        node.plugin.lines.filter((l) => /unexpected error| ERROR /.test(l)).join('\n'),
      );
      const longest = Math.max(...node.plugin.lines.map((l) => l.length));
      assert.ok(longest < 2000, `no log line carries a request's bulk (longest ${longest} characters)`);
    } finally {
      client.close();
      await node.stop();
    }
  },
);
