// The kubelet stand-in (test/support/kubelet.ts) as a program of its own, for the real-systemd test:
// bundled by esbuild into one script that the pinned node runs inside the Debian container as a
// transient unit. Like a kubelet start, it creates the socket directory, deletes every file in it
// and serves kubelet.sock; SIGTERM stops it. What it sees (registrations, the device list) is
// written as JSON to a state file after every change, for the test to read.
//
//   node kubelet.cjs <socket directory> <state file>
import { mkdirSync, renameSync, writeFileSync } from 'node:fs';
import { KubeletStandIn } from '../support/kubelet.ts';

export interface StandInState {
  pid: number;
  registrations: { resource: string; endpoint: string; version: string }[];
  /** The last ListAndWatch list of nvidia.com/gpu, or null before one arrived. */
  devices: { id: string; health: string }[] | null;
  /** The ListAndWatch stream of nvidia.com/gpu broke after the last registration. */
  streamBroken: boolean;
}

async function main(dir: string, stateFile: string): Promise<void> {
  mkdirSync(dir, { recursive: true, mode: 0o750 });
  const kubelet = await KubeletStandIn.start(dir);
  let streamBroken = false;
  const write = (): void => {
    const state: StandInState = {
      pid: process.pid,
      registrations: kubelet.registrations.map((r) => ({ resource: r.request.resource_name, endpoint: r.request.endpoint, version: r.request.version })),
      devices: kubelet.devices()?.map((d) => ({ id: d.ID, health: d.health })) ?? null,
      streamBroken,
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
  process.stderr.write(`kubelet stand-in: ${err instanceof Error ? err.stack ?? err.message : String(err)}\n`);
  process.exit(1);
});
