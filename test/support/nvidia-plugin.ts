// A stand-in for NVIDIA's device plugin (the k8s-device-plugin DaemonSet), for migration tests: a
// small DevicePlugin over real gRPC on `<dir>/nvidia-gpu.sock`, serving nvidia.com/gpu with the
// given GPU UUIDs (all Healthy), registering with the kubelet like NVIDIA's does (endpoint
// nvidia-gpu.sock, no GetPreferredAllocation, no PreStartContainer), and counting the Allocate calls
// it answered, so a test can tell which plugin the kubelet is talking to. stop() is NVIDIA's pod
// going away: its server stops (connections and streams closed) and its socket is removed.
import * as grpc from '@grpc/grpc-js';
import { rm } from 'node:fs/promises';
import { join } from 'node:path';
import { devicePluginService, registrationService } from '../../src/api/proto.ts';
import type * as M from '../../src/api/messages.ts';

export const NVIDIA_ENDPOINT = 'nvidia-gpu.sock';

export class NvidiaPluginStandIn {
  readonly socketPath: string;
  readonly uuids: readonly string[];
  /** The device IDs of every container request it answered, in order. */
  readonly allocated: string[][] = [];
  private server: grpc.Server | undefined;
  private readonly streams = new Set<grpc.ServerWritableStream<M.Empty, M.ListAndWatchResponse>>();

  private constructor(dir: string, uuids: readonly string[]) {
    this.socketPath = join(dir, NVIDIA_ENDPOINT);
    this.uuids = uuids;
  }

  /** Serves on <dir>/nvidia-gpu.sock (not registered yet). */
  static async start(dir: string, uuids: readonly string[]): Promise<NvidiaPluginStandIn> {
    const p = new NvidiaPluginStandIn(dir, uuids);
    await p.serve();
    return p;
  }

  private async serve(): Promise<void> {
    const server = new grpc.Server();
    server.addService(devicePluginService(), {
      GetDevicePluginOptions: (_c: unknown, cb: grpc.sendUnaryData<M.DevicePluginOptions>) =>
        cb(null, { pre_start_required: false, get_preferred_allocation_available: false }),
      ListAndWatch: (call: grpc.ServerWritableStream<M.Empty, M.ListAndWatchResponse>) => {
        this.streams.add(call);
        call.on('cancelled', () => this.streams.delete(call));
        call.on('close', () => this.streams.delete(call));
        call.write({ devices: this.uuids.map((ID) => ({ ID, health: 'Healthy' })) });
      },
      Allocate: (
        call: grpc.ServerUnaryCall<M.AllocateRequest, M.AllocateResponse>,
        cb: grpc.sendUnaryData<M.AllocateResponse>,
      ) => {
        const responses: M.ContainerAllocateResponse[] = [];
        for (const c of call.request.container_requests) {
          const unknown = c.devices_ids.find((id) => !this.uuids.includes(id));
          if (unknown !== undefined) {
            cb({
              code: grpc.status.UNKNOWN,
              details: `invalid allocation request for 'nvidia.com/gpu': unknown device: ${unknown}`,
            });
            return;
          }
          this.allocated.push([...c.devices_ids]);
          responses.push({
            envs: { NVIDIA_VISIBLE_DEVICES: c.devices_ids.join(',') },
            mounts: [],
            devices: [],
            annotations: {},
            cdi_devices: [],
          });
        }
        cb(null, { container_responses: responses });
      },
      GetPreferredAllocation: (_c: unknown, cb: grpc.sendUnaryData<M.PreferredAllocationResponse>) =>
        cb({ code: grpc.status.UNIMPLEMENTED, details: 'not available' }),
      PreStartContainer: (_c: unknown, cb: grpc.sendUnaryData<M.PreStartContainerResponse>) => cb(null, {}),
    });
    await new Promise<void>((resolve, reject) => {
      server.bindAsync(`unix://${this.socketPath}`, grpc.ServerCredentials.createInsecure(), (err) =>
        err ? reject(err) : resolve(),
      );
    });
    this.server = server;
  }

  /** Register with the kubelet at kubeletSocket, as NVIDIA's plugin does. */
  async register(kubeletSocket: string): Promise<void> {
    const client = new grpc.Client(`unix://${kubeletSocket}`, grpc.credentials.createInsecure(), {
      'grpc.use_local_subchannel_pool': 1,
    });
    const m = registrationService().Register;
    const req: M.RegisterRequest = {
      version: 'v1beta1',
      endpoint: NVIDIA_ENDPOINT,
      resource_name: 'nvidia.com/gpu',
      options: { pre_start_required: false, get_preferred_allocation_available: false },
    };
    try {
      await new Promise<void>((resolve, reject) => {
        client.makeUnaryRequest(
          m.path,
          m.requestSerialize,
          m.responseDeserialize,
          req,
          new grpc.Metadata(),
          { deadline: Date.now() + 15000 },
          (err) => (err ? reject(err) : resolve()),
        );
      });
    } finally {
      client.close();
    }
  }

  get openStreams(): number {
    return this.streams.size;
  }

  /** NVIDIA's pod going away: streams and connections closed, socket removed. */
  async stop(): Promise<void> {
    this.server?.forceShutdown();
    this.server = undefined;
    this.streams.clear();
    await rm(this.socketPath, { force: true });
  }
}
