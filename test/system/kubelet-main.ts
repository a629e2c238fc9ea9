// The kubelet stand-in (test/support/kubelet.ts) as a program of its own, for the real-systemd test:
// bundled by esbuild into one script that the pinned node runs inside the Debian container as a
// transient unit. Like a kubelet start, it creates the socket directory, deletes every file in it
// and serves kubelet.sock; SIGTERM stops it. What it sees (registrations, the device list) is
// written as JSON to a state file after every change, for the test to read. SIGUSR2 makes it send
// the Allocate request in `<state file>.allocate` (JSON: resource and device IDs, as a kubelet does
// for a pod's container) and record the answer, or the error, in the state.
//
//   node kubelet.cjs <socket directory> <state file>
import { mkdirSync, readFileSync, renameSync, writeFileSync } from 'node:fs';
import { KubeletStandIn } from '../support/kubelet.ts';
import type * as M from '../../src/api/messages.ts';

/** One Allocate the test asked for (SIGUSR2), with what the plugin answered. */
export interface StandInAllocation {
  resource: string;
  ids: string[];
  response?: M.AllocateResponse;
  error?: string;
}

export interface StandInState {
  pid: number;
  registrations: { resource: string; endpoint: string; version: string }[];
  /** The last ListAndWatch list of nvidia.com/gpu, or null before one arrived. */
  devices: { id: string; health: string }[] | null;
  /** The ListAndWatch stream of nvidia.com/gpu broke after the last registration. */
  streamBroken: boolean;
  /** Every Allocate sent on SIGUSR2, in order. */
  allocations: StandInAllocation[];
}

async function main(dir: string, stateFile: string): Promise<void> {
  mkdirSync(dir, { recursive: true, mode: 0o750 });
  const kubelet = await KubeletStandIn.start(dir);
  let streamBroken = false;
  const allocations: StandInAllocation[] = [];
  const write = (): void => {
    const state: StandInState = {
      pid: process.pid,
      registrations: kubelet.registrations.map((r) => ({
        resource: r.request.resource_name,
        endpoint: r.request.endpoint,
        version: r.request.version,
      })),
      devices: kubelet.devices()?.map((d) => ({ id: d.ID, health: d.health })) ?? null,
      streamBroken,
      allocations,
    };
    writeFileSync(`${stateFile}.tmp`, JSON.stringify(state));
    renameSync(`${stateFile}.tmp`, stateFile);
  };
  kubelet.on('registered', (req: { resource_name: string; endpoint: string }) => {
    streamBroken = false;
    process.stdout.write(`registered ${req.resource_name} at ${req.endpoint}\n`);
    write();
  });
  kubelet.on('devices', write);
  kubelet.on('stream-broken', () => {
    streamBroken = true;
    write();
  });
  write();
  process.stdout.write(`serving ${kubelet.socketPath}\n`);
  process.on('SIGUSR2', () => {
    const req = JSON.parse(readFileSync(`${stateFile}.allocate`, 'utf8')) as { resource: string; ids: string[] };
    kubelet
      .allocate({ container_requests: [{ devices_ids: req.ids }] }, req.resource)
      .then(
        (response) => {
          allocations.push({ ...req, response });
        },
        (err: unknown) => {
          allocations.push({ ...req, error: err instanceof Error ? err.message : String(err) });
        },
      )
      .finally(write);
  });
  process.on('SIGTERM', () => {
    void kubelet.stop().then(() => process.exit(0));
  });
}

const [dir, stateFile] = process.argv.slice(2);
if (dir === undefined || stateFile === undefined) {
  process.stderr.write('usage: kubelet.cjs <socket directory> <state file>\n');
  process.exit(2);
}
main(dir, stateFile).catch((err: unknown) => {
  process.stderr.write(`kubelet stand-in: ${err instanceof Error ? (err.stack ?? err.message) : String(err)}\n`);
  process.exit(1);
});
