// One gRPC server on one unix socket. A new one is made whenever the socket has to be recreated
// (the kubelet wiped the directory); the old one is shut down, so nothing accumulates.
import * as grpc from '@grpc/grpc-js';
import { lstat, stat, unlink } from 'node:fs/promises';
import { dirname } from 'node:path';
import { devicePluginService } from '../api/proto.ts';
import { undecodable } from './service.ts';
import type { DevicePluginHandlers } from './service.ts';

/**
 * The largest request accepted, in bytes (larger ones are refused with RESOURCE_EXHAUSTED before
 * they are read). A request only names devices this plugin advertised, so none is larger than the
 * device list itself, and the kubelet reads that list with gRPC's default 4 MiB limit: 4 MiB is
 * ~70 000 replica IDs (e.g. 64 GPUs × 1024 time-slicing replicas), which no real Allocate or
 * GetPreferredAllocation comes near (16 GPUs × 64 replicas is ~50 KiB).
 */
export const MAX_REQUEST_BYTES = 4 * 1024 * 1024;

/** Server options: also what the server does NOT do per call. */
export const SERVER_OPTIONS: grpc.ServerOptions = {
  'grpc.max_concurrent_streams': 64,
  'grpc.max_receive_message_length': MAX_REQUEST_BYTES,
  // No channelz: nobody can query it (no channelz service is served), and it costs per call.
  'grpc.enable_channelz': 0,
};

/**
 * The service definition with a request decoder that never throws: a body that is not the
 * message it claims to be reaches the handler as an undecodable marker, which answers
 * INVALID_ARGUMENT naming the message and the decoder's complaint (grpc-js would answer
 * INTERNAL "Error deserializing request"). A response that is already bytes (the ListAndWatch
 * list, encoded once per change) is sent as it is.
 */
function tolerantService(): grpc.ServiceDefinition {
  const out: Record<string, grpc.MethodDefinition<unknown, unknown>> = {};
  for (const [name, m] of Object.entries(devicePluginService() as grpc.ServiceDefinition)) {
    out[name] = {
      ...m,
      requestDeserialize: (b: Buffer) => {
        try {
          return m.requestDeserialize(b);
        } catch (err) {
          return undecodable(name, err);
        }
      },
      responseSerialize: (v: unknown) => (Buffer.isBuffer(v) ? v : m.responseSerialize(v)),
    };
  }
  return out;
}

/**
 * The reason in grpc-js's bind error, said once: "No address added out of total 1 resolved errors:
 * [listen EROFS: read-only file system /path]" becomes "read-only file system (EROFS)".
 */
export function listenProblem(message: string): string {
  const m = /listen (E[A-Z]+): ([^[\]]*?)(?: \/[^[\]]*)?\]/.exec(message);
  return m === null ? message : `${m[2]} (${m[1]})`;
}

export class PluginServer {
  readonly socketPath: string;
  private readonly server: grpc.Server;

  private constructor(socketPath: string, server: grpc.Server) {
    this.socketPath = socketPath;
    this.server = server;
  }

  static async start(socketPath: string, handlers: DevicePluginHandlers): Promise<PluginServer> {
    // A stale socket file from an earlier run would make bind fail with EADDRINUSE.
    try {
      const st = await lstat(socketPath);
      if (!st.isSocket())
        throw new Error(`${socketPath} exists and is not a socket; remove it or choose another socket directory`);
      await unlink(socketPath);
    } catch (err) {
      if ((err as NodeJS.ErrnoException).code !== 'ENOENT') throw err;
    }
    // A missing directory would fail the listen with libuv's EACCES ("permission denied"): say what it is.
    const dir = dirname(socketPath);
    try {
      if (!(await stat(dir)).isDirectory()) throw new Error(`the socket directory ${dir} is not a directory`);
    } catch (err) {
      if ((err as NodeJS.ErrnoException).code === 'ENOENT')
        throw new Error(
          `the socket directory ${dir} does not exist (is the kubelet installed? --kubelet-socket names it)`,
        );
      throw err;
    }
    const server = new grpc.Server(SERVER_OPTIONS);
    server.addService(tolerantService(), handlers.implementation());
    await new Promise<void>((resolve, reject) => {
      server.bindAsync(`unix://${socketPath}`, grpc.ServerCredentials.createInsecure(), (err) => {
        if (err) reject(new Error(`cannot listen on ${socketPath}: ${listenProblem(err.message)}`));
        else resolve();
      });
    });
    return new PluginServer(socketPath, server);
  }

  /**
   * Stops at once (open streams are cut). removeSocket: the caller found the socket file is still
   * the one this server made (not a successor's), so it is removed too.
   */
  async stop(removeSocket: boolean): Promise<void> {
    this.server.forceShutdown();
    if (removeSocket) await unlink(this.socketPath).catch(() => undefined);
  }
}
