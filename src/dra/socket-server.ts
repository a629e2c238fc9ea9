// One gRPC server on one unix socket, serving the services it is given (the registration service on
// <driver>-reg.sock, the DRAPlugin and health services on dra.sock). A new one is made whenever the
// socket has to be served again (the kubelet or someone wiped it); the old one is shut down first,
// so nothing accumulates. Server options and bind-error wording are the device-plugin server's.
import * as grpc from '@grpc/grpc-js';
import { lstat, stat, unlink } from 'node:fs/promises';
import { dirname } from 'node:path';
import { SERVER_OPTIONS, listenProblem } from '../plugin/server.ts';
import { fileIdentity } from '../kubelet/socket-identity.ts';

export interface ServiceBinding {
  readonly definition: grpc.ServiceDefinition;
  readonly implementation: grpc.UntypedServiceImplementation;
}

export class UnixGrpcServer {
  readonly socketPath: string;
  /** Identity of the socket file this server made (kubelet/socket-identity.ts). */
  readonly identity: string;
  private readonly server: grpc.Server;

  private constructor(socketPath: string, server: grpc.Server, identity: string) {
    this.socketPath = socketPath;
    this.server = server;
    this.identity = identity;
  }

  /** Serves `services` on `socketPath`, replacing a stale socket file there (never another kind of file). */
  static async start(socketPath: string, services: readonly ServiceBinding[]): Promise<UnixGrpcServer> {
    try {
      const st = await lstat(socketPath);
      if (!st.isSocket())
        throw new Error(`${socketPath} exists and is not a socket; remove it or choose another directory`);
      await unlink(socketPath);
    } catch (err) {
      if ((err as NodeJS.ErrnoException).code !== 'ENOENT') throw err;
    }
    const dir = dirname(socketPath);
    try {
      if (!(await stat(dir)).isDirectory()) throw new Error(`${dir} is not a directory`);
    } catch (err) {
      if ((err as NodeJS.ErrnoException).code === 'ENOENT')
        throw new Error(`the directory ${dir} does not exist (is the kubelet installed and started?)`);
      throw err;
    }
    const server = new grpc.Server(SERVER_OPTIONS);
    for (const s of services) server.addService(s.definition, s.implementation);
    await new Promise<void>((resolve, reject) => {
      server.bindAsync(`unix://${socketPath}`, grpc.ServerCredentials.createInsecure(), (err) => {
        if (err) reject(new Error(`cannot listen on ${socketPath}: ${listenProblem(err.message)}`));
        else resolve();
      });
    });
    const identity = await fileIdentity(socketPath);
    if (identity === null) {
      server.forceShutdown();
      throw new Error(`${socketPath} vanished right after it was created`);
    }
    return new UnixGrpcServer(socketPath, server, identity);
  }

  /** Whether the socket file is still the one this server made. */
  async stillOurs(): Promise<boolean> {
    return (await fileIdentity(this.socketPath).catch(() => null)) === this.identity;
  }

  /** Stops at once (open streams are cut); removes the socket file if it is still ours. */
  async stop(): Promise<void> {
    const ours = await this.stillOurs();
    this.server.forceShutdown();
    if (ours) await unlink(this.socketPath).catch(() => undefined);
  }
}
