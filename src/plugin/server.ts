// One gRPC server on one unix socket. A new one is made whenever the socket has to be recreated
// (the kubelet wiped the directory); the old one is shut down, so nothing accumulates.
import * as grpc from '@grpc/grpc-js';
import { lstat, unlink } from 'node:fs/promises';
import { devicePluginService } from '../api/proto.ts';
import type { DevicePluginHandlers } from './service.ts';

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
      if (!st.isSocket()) throw new Error(`${socketPath} exists and is not a socket; remove it or choose another socket directory`);
      await unlink(socketPath);
    } catch (err) {
      if ((err as NodeJS.ErrnoException).code !== 'ENOENT') throw err;
    }
    const server = new grpc.Server({ 'grpc.max_concurrent_streams': 64 });
    server.addService(devicePluginService(), handlers.implementation());
    await new Promise<void>((resolve, reject) => {
      server.bindAsync(`unix://${socketPath}`, grpc.ServerCredentials.createInsecure(), (err) => {
        if (err) reject(new Error(`cannot listen on ${socketPath}: ${err.message}`, { cause: err }));
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
