// `check`'s device-plugin lines on the kubelet: its registration socket answers gRPC, and no other
// device plugin (NVIDIA's) registers nvidia.com/gpu from the same directory.
import * as grpc from '@grpc/grpc-js';
import { stat } from 'node:fs/promises';
import { join } from 'node:path';
import { errorText } from '../system/log.ts';
import type { CheckLine } from './check-report.ts';
import { otherSockets } from './host-view.ts';

async function kubeletAnswers(socket: string, timeoutMs: number): Promise<string | null> {
  const client = new grpc.Client(`unix://${socket}`, grpc.credentials.createInsecure(), {
    'grpc.use_local_subchannel_pool': 1,
  });
  try {
    await new Promise<void>((resolve, reject) =>
      client.waitForReady(Date.now() + timeoutMs, (err) => (err ? reject(err) : resolve())),
    );
    return null;
  } catch (err) {
    return errorText(err);
  } finally {
    client.close();
  }
}

/** Whether the kubelet's socket exists, is a socket, and answers gRPC within 2 s. */
export async function kubeletCheck(socket: string): Promise<CheckLine> {
  try {
    const st = await stat(socket);
    if (!st.isSocket()) throw new Error('exists but is not a socket');
    const problem = await kubeletAnswers(socket, 2000);
    if (problem !== null) throw new Error(`does not answer: ${problem}`);
    return { status: 'PASS', name: 'kubelet', detail: `${socket} answers` };
  } catch (err) {
    const missing = (err as NodeJS.ErrnoException).code === 'ENOENT';
    return {
      status: 'FAIL',
      name: 'kubelet',
      detail: `${socket} ${missing ? 'does not exist' : errorText(err)}`,
      fix: missing
        ? 'is the kubelet running? (systemctl status kubelet); or set --kubelet-socket'
        : 'restart the kubelet; check its log',
    };
  }
}

/**
 * Another device plugin in the kubelet's directory registering nvidia.com/gpu (NVIDIA's: nvidia-gpu.sock and friends).
 */
export async function socketDirectoryNeighbours(dir: string, kubeletSocket: string): Promise<CheckLine[]> {
  const others = (await otherSockets(dir, kubeletSocket)).filter((s) => /^nvidia-.*\.sock$/.test(s.name));
  return others.map(
    (s): CheckLine =>
      s.live
        ? {
            status: 'FAIL',
            name: 'other plugin',
            detail:
              `${join(dir, s.name)} answers: NVIDIA's device plugin runs here ` +
              `and registers nvidia.com/${s.name.slice('nvidia-'.length, -'.sock'.length)} ` +
              `too; the kubelet keeps whichever registered last`,
            fix:
              "run one of the two: remove NVIDIA's plugin DaemonSet " +
              'from this node (e.g. a nodeSelector), or stop this service',
          }
        : {
            status: 'WARN',
            name: 'other plugin',
            detail: `${join(dir, s.name)} is left over from NVIDIA's device plugin (nothing answers on it)`,
            fix: `remove it: rm ${join(dir, s.name)}`,
          },
  );
}
