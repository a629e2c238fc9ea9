// Asks the kubelet's PodResources API (v1 List, on its own unix socket) which pod and container
// holds which device. One fresh channel per call, closed after; used by `gpu-device-plugin info`.
import * as grpc from '@grpc/grpc-js';
import { stat } from 'node:fs/promises';
import { podResourcesService } from '../api/podresources.ts';
import type { PodResources } from '../api/podresources.ts';

export async function listPodResources(socket: string, timeoutMs: number): Promise<PodResources[]> {
  try {
    const st = await stat(socket);
    if (!st.isSocket()) throw new Error(`${socket} is not a socket`);
  } catch (err) {
    if ((err as NodeJS.ErrnoException).code === 'ENOENT')
      throw new Error(
        `${socket} does not exist (is the kubelet running here? --pod-resources-socket names another socket)`,
      );
    if ((err as NodeJS.ErrnoException).code === 'EACCES')
      throw new Error(`${socket} cannot be opened: permission denied (run info as root)`);
    throw err;
  }
  const m = podResourcesService().List;
  const client = new grpc.Client(`unix://${socket}`, grpc.credentials.createInsecure(), {
    'grpc.use_local_subchannel_pool': 1,
    'grpc.enable_retries': 0,
  });
  try {
    return await new Promise<PodResources[]>((resolve, reject) => {
      client.makeUnaryRequest(
        m.path,
        m.requestSerialize,
        m.responseDeserialize,
        {},
        new grpc.Metadata(),
        { deadline: Date.now() + timeoutMs },
        (err, res) => {
          if (err)
            reject(new Error(`PodResources List at ${socket} failed: ${err.details || err.message}`, { cause: err }));
          else resolve(res?.pod_resources ?? []);
        },
      );
    });
  } finally {
    client.close();
  }
}
