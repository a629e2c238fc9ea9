// One DRA claim's MPS control daemon: a supervisor of its own (daemon.ts) under the claim's root, its plan made
// from the claim's admitted request, on a host that changes compute modes only when the claim has its GPUs alone
// (a GPU shared with other claims, or a MIG device, keeps its compute mode).
import { CLAIM_MPS_RESOURCE } from '../core/dra-sharing.ts';
import type { HostMps } from '../core/dra-sharing.ts';
import type { MpsDaemonPlan } from '../core/mps.ts';
import type { Logger } from '../system/log.ts';
import { MpsSupervisor } from './daemon.ts';
import type { MpsHost } from './daemon.ts';

/** The supervisor's plan of a claim's daemon. */
function claimPlan(mps: HostMps): MpsDaemonPlan {
  return {
    resource: CLAIM_MPS_RESOURCE,
    replicas: 1,
    activeThreadPercentage: mps.activeThreadPercentage,
    gpus: mps.units.map((u, k) => ({
      uuid: u.uuid,
      index: u.gpuIndex ?? -1,
      mpsDevice: k,
      pinnedMemLimitMiB: u.pinnedMemLimitMiB,
    })),
  };
}

/** A host whose compute-mode changes are left out: for daemons on GPUs shared with other claims, and MIG devices. */
function sharedGpuHost(host: MpsHost): MpsHost {
  return {
    setComputeMode: async () => undefined,
    makeDirs: (d) => host.makeDirs(d),
    writeFile: (p, t) => host.writeFile(p, t),
    remove: (p) => host.remove(p),
    mountShm: (d) => host.mountShm(d),
    unmountShm: (d) => host.unmountShm(d),
    startControl: (p, paths) => host.startControl(p, paths),
    command: (paths, c, t) => host.command(paths, c, t),
  };
}

/** The claim's daemon started under `root` (the supervisor keeps it up until it is stopped). */
export async function startClaimDaemon(mps: HostMps, root: string, host: MpsHost, log: Logger): Promise<MpsSupervisor> {
  const supervisor = new MpsSupervisor({
    root,
    host: mps.exclusive ? host : sharedGpuHost(host),
    log,
    status: () => undefined,
  });
  await supervisor.start([claimPlan(mps)]);
  return supervisor;
}
