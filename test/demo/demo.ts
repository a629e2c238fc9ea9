// The newcomer's demo: the built executable on a simulated 8-GPU NVLink node (fake NVML + kubelet
// stand-in), narrated step by step through the same code paths a real node uses.
import { SimNode } from '../support/sim.ts';

const say = (s: string): void => {
  process.stdout.write(`${s}\n`);
};

const t0 = performance.now();
say(
  '▶ Starting dist/gpu-device-plugin on a simulated node: 8 GPUs (DGX-1-like NVLink mesh), fake NVML, kubelet stand-in',
);
const node = await SimNode.start({ topology: 'demo-8' });
try {
  const k = node.kubelet!;
  const reg = k.registrations[0]!;
  say(
    `✔ Registered with the kubelet after ${(reg.at - t0).toFixed(0)} ms: ` +
      `resource ${reg.request.resource_name}, endpoint ${reg.request.endpoint}, API ${reg.request.version}`,
  );
  const devices = await k.waitForDevices((d) => d.length > 0);
  say(`✔ ListAndWatch sent ${devices.length} devices:`);
  for (const d of devices) {
    const g = node.topology.gpus.find((x) => x.uuid === d.ID);
    say(
      `    ${d.ID}  ${d.health.padEnd(9)}  ` +
        `NUMA ${d.topology?.nodes.map((n) => n.ID).join(',') ?? '-'}  ${g?.name ?? ''}`,
    );
  }
  const ids = devices.map((d) => d.ID);
  const pref = await k.preferred({
    container_requests: [{ available_deviceIDs: ids, must_include_deviceIDs: [], allocation_size: 2 }],
  });
  const chosen = pref.container_responses[0]!.deviceIDs;
  say(`✔ GetPreferredAllocation for 2 GPUs chose: ${chosen.map((id) => `GPU ${ids.indexOf(id)}`).join(' + ')}`);
  const alloc = await k.allocate({ container_requests: [{ devices_ids: chosen }] });
  say(`✔ Allocate answered: NVIDIA_VISIBLE_DEVICES=${alloc.container_responses[0]!.envs.NVIDIA_VISIBLE_DEVICES}`);
  try {
    await k.allocate({ container_requests: [{ devices_ids: ['GPU-not-on-this-node'] }] });
  } catch (err) {
    say(`✔ A bad Allocate is refused, and the plugin carries on: ${(err as Error).message}`);
  }
  say('▶ Restarting the kubelet (it deletes every socket in its directory, then comes back)');
  const n = k.registrations.length;
  await k.restart();
  const again = await k.waitForRegistrations(n + 1);
  say(`✔ Re-registered ${(again.at - again.socketCreatedAt).toFixed(1)} ms after the kubelet's socket reappeared`);
  await k.waitForDevices((d) => d.length === devices.length);
  say(`✔ Device list streamed again: ${k.devices()?.length} devices`);
  say('▶ Stopping the plugin with SIGTERM');
  node.plugin.signal('SIGTERM');
  const exit = await node.plugin.exited;
  say(`✔ Exited with code ${exit.code}`);
  say("\nThe plugin's own log (stderr):");
  for (const l of node.plugin.lines) say(`    ${l}`);
} finally {
  await node.stop();
}
