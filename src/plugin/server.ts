// One gRPC server on one unix socket. A new one is made whenever the socket has to be recreated
// (the kubelet wiped the directory); the old one is shut down, so nothing accumulates.
import * as grpc from '@grpc/grpc-js';
import { lstat, unlink } from 'node:fs/promises';
import { devicePluginService } from '../api/proto.ts';
import type { DevicePluginHandlers } from './service.ts';

/** Identity of a file: inode plus change time, so a recycled inode number is not mistaken for ours. */
export async function fileIdentity(path: string): Promise<string | null> {
  try {
    const st = await lstat(path, { bigint: true });
    return `${st.ino}:${st.ctimeNs}`;
  } catch (err) {
    if ((err as NodeJS.ErrnoException).code === 'ENOENT') return null;
    throw err;
  }
}

export class PluginServer {
  readonly socketPath: string;
  readonly identity: string;
  private readonly server: grpc.Server;

  private constructor(socketPath: string, identity: string, server: grpc.Server) {
    this.socketPath = socketPath;
    this.identity = identity;
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
    const identity = await fileIdentity(socketPath);
    if (identity === null) {
      server.forceShutdown();
      throw new Error(`${socketPath} vanished right after it was created`);
    }
    return new PluginServer(socketPath, identity, server);
  }

  /** Whether the socket file on disk is still the one this server listens on. */
  async stillOurs(): Promise<boolean> {
    return (await fileIdentity(this.socketPath)) === this.identity;
  }

  /** Stops at once (open streams are cut) and removes our socket file if it is still ours. */
  async stop(): Promise<void> {
    const ours = await this.stillOurs().catch(() => false);
    this.server.forceShutdown();
    if (ours) await unlink(this.socketPath).catch(() => undefined);
  }
}
