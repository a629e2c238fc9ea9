// One gRPC server on one unix socket, for every socket this plugin serves to the kubelet: a device
// plugin's resource socket, the DRA plugin's registration socket and its dra.sock. A new one is made
// whenever the socket has to be served again (the kubelet or someone wiped it); the old one is shut
// down first, so nothing accumulates. Every server has the same limits (4 MiB requests, no channelz)
// and names why it cannot listen.
import * as grpc from '@grpc/grpc-js';
import { lstat, stat, unlink } from 'node:fs/promises';
import { dirname } from 'node:path';
import { fileIdentity } from './socket-identity.ts';

/**
 * The largest request accepted, in bytes (larger ones are refused with RESOURCE_EXHAUSTED before
 * they are read). A device-plugin request only names devices this plugin advertised, so none is
 * larger than the device list itself, and the kubelet reads that list with gRPC's default 4 MiB
 * limit: 4 MiB is ~70 000 replica IDs (e.g. 64 GPUs × 1024 time-slicing replicas), which no real
 * Allocate or GetPreferredAllocation comes near (16 GPUs × 64 replicas is ~50 KiB). A DRA request
 * names at most a few claims.
 */
export const MAX_REQUEST_BYTES = 4 * 1024 * 1024;

/** Server options: also what the server does NOT do per call. */
export const SERVER_OPTIONS: grpc.ServerOptions = {
  'grpc.max_concurrent_streams': 64,
  'grpc.max_receive_message_length': MAX_REQUEST_BYTES,
  // No channelz: nobody can query it (no channelz service is served), and it costs per call.
  'grpc.enable_channelz': 0,
};

/** One service a socket serves. */
export interface ServiceBinding {
  readonly definition: grpc.ServiceDefinition;
  readonly implementation: grpc.UntypedServiceImplementation;
  /**
   * Makes the request decoder never throw: a body that is not the message its method takes reaches
   * the handler as what this returns (a marker the handler refuses with INVALID_ARGUMENT naming the
   * decoder's complaint), where grpc-js would answer INTERNAL "Error deserializing request".
   */
  readonly undecodable?: (method: string, err: unknown) => unknown;
}

/** What the caller says about a missing directory (whose listen would fail with libuv's EACCES). */
export interface ServeOptions {
  /** Appended to "the socket directory DIR does not exist": where it comes from. */
  readonly missingDirHint: string;
}

/**
 * The service with the binding's decoder guard; a response that is already bytes (a list encoded
 * once per change) is sent as it is.
 */
function boundService(b: ServiceBinding): grpc.ServiceDefinition {
  const guard = b.undecodable;
  const out: Record<string, grpc.MethodDefinition<unknown, unknown>> = {};
  for (const [name, m] of Object.entries(b.definition)) {
    out[name] = {
      ...m,
      requestDeserialize:
        guard === undefined
          ? m.requestDeserialize
          : (buf: Buffer) => {
              try {
                return m.requestDeserialize(buf);
              } catch (err) {
                return guard(name, err);
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

/** Removes a stale socket file from an earlier run (bind would fail with EADDRINUSE); never another kind of file. */
async function removeStaleSocket(socketPath: string): Promise<void> {
  try {
    const st = await lstat(socketPath);
    if (!st.isSocket())
      throw new Error(`${socketPath} exists and is not a socket; remove it or choose another socket directory`);
    await unlink(socketPath);
  } catch (err) {
    if ((err as NodeJS.ErrnoException).code !== 'ENOENT') throw err;
  }
}

/** A missing directory would fail the listen with libuv's EACCES ("permission denied"): say what it is. */
async function checkDirectory(socketPath: string, hint: string): Promise<void> {
  const dir = dirname(socketPath);
  try {
    if (!(await stat(dir)).isDirectory()) throw new Error(`the socket directory ${dir} is not a directory`);
  } catch (err) {
    if ((err as NodeJS.ErrnoException).code === 'ENOENT')
      throw new Error(`the socket directory ${dir} does not exist (${hint})`);
    throw err;
  }
}

function bind(server: grpc.Server, socketPath: string): Promise<void> {
  return new Promise<void>((resolve, reject) => {
    server.bindAsync(`unix://${socketPath}`, grpc.ServerCredentials.createInsecure(), (err) => {
      if (err) reject(new Error(`cannot listen on ${socketPath}: ${listenProblem(err.message)}`));
      else resolve();
    });
  });
}

export class UnixSocketServer {
  readonly socketPath: string;
  /** Identity of the socket file this server made (socket-identity.ts). */
  readonly identity: string;
  private readonly server: grpc.Server;

  private constructor(socketPath: string, server: grpc.Server, identity: string) {
    this.socketPath = socketPath;
    this.server = server;
    this.identity = identity;
  }

  /** Serves `services` on `socketPath`, replacing a stale socket file there. */
  static async start(
    socketPath: string,
    services: readonly ServiceBinding[],
    opts: ServeOptions,
  ): Promise<UnixSocketServer> {
    await removeStaleSocket(socketPath);
    await checkDirectory(socketPath, opts.missingDirHint);
    const server = new grpc.Server(SERVER_OPTIONS);
    for (const s of services) server.addService(boundService(s), s.implementation);
    await bind(server, socketPath);
    const identity = await fileIdentity(socketPath);
    if (identity === null) {
      server.forceShutdown();
      throw new Error(`${socketPath} vanished right after it was created`);
    }
    return new UnixSocketServer(socketPath, server, identity);
  }

  /** Whether the socket file is still the one this server made. */
  async stillOurs(): Promise<boolean> {
    return (await fileIdentity(this.socketPath).catch(() => null)) === this.identity;
  }

  /**
   * Stops at once (open streams are cut). removeSocket (the default): the socket file is removed too
   * when it is still the one this server made (never a successor's).
   */
  async stop(removeSocket = true): Promise<void> {
    const ours = removeSocket && (await this.stillOurs());
    this.server.forceShutdown();
    if (ours) await unlink(this.socketPath).catch(() => undefined);
  }
}
