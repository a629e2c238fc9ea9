// The MPS unit's program on a DRA node (--kubelet-api=dra): the DRA sharing agent (dra-agent.ts) composed
// with the real host — NVML for compute modes, the control program, nvidia-smi for time-slices — and the
// unit's STATUS lines. On a DRA node without an MPS root there is nothing to do: it says so and ends.
import { readFile } from 'node:fs/promises';
import type { AdmissionLimits } from '../core/dra-admission.ts';
import { NvmlMigInstances } from '../nvml/mig-instances.ts';
import type { Nvml } from '../nvml/nvml.ts';
import type { Logger } from '../system/log.ts';
import type { ServiceStatus } from '../system/service-status.ts';
import type { Daemon } from '../system/signals.ts';
import { readInventory } from './agent-inventory.ts';
import { confinedHost } from './confined-host.ts';
import { MPS_CONTROL_PROGRAM, findMpsControl } from './control-client.ts';
import type { MpsSettings } from './daemon-config.ts';
import { RealMpsHost } from './daemon-host.ts';
import { DraSharingAgent } from './dra-agent.ts';
import { applyTimeSlice, findNvidiaSmi } from './timeslice.ts';

/** The unit's StateDirectory=gpu-device-plugin-mps. */
export const DEFAULT_STATE_DIR = '/var/lib/gpu-device-plugin-mps';

/** Where the agent keeps its record: the unit's StateDirectory (systemd says where), else the package's path. */
export function agentStateDir(env: Readonly<Record<string, string | undefined>>): string {
  const fromSystemd = env.STATE_DIRECTORY?.split(':')[0];
  return fromSystemd?.startsWith('/') ? fromSystemd : DEFAULT_STATE_DIR;
}

/** The operator's limits; the total shm defaults to the host's memory (MemTotal). */
async function admissionLimits(settings: MpsSettings, log: Logger): Promise<AdmissionLimits> {
  const o = settings.options;
  let total = o.draMpsShmTotal;
  if (total === null) {
    const m = /^MemTotal:\s+(\d+)\s+kB$/m.exec(await readFile('/proc/meminfo', 'utf8').catch(() => ''));
    total = m === null ? 16 * o.draMpsShmSize : Number(m[1]) * 1024;
    if (m === null)
      log.warn("cannot read MemTotal; the MPS claims' shm may add up to 16 claims' worth", { bytes: total });
  }
  return { maxClaimsPerGpu: o.draMaxClaimsPerGpu, shmBytesPerClaim: o.draMpsShmSize, shmBytesTotal: total };
}

export async function startDraAgent(
  settings: MpsSettings,
  openNvml: () => Nvml,
  log: Logger,
  service: ServiceStatus,
): Promise<Daemon | null> {
  if (settings.mpsRoot === '') {
    log.info('DRA mode without an MPS root (--mps-root, MPS_ROOT): no claim can share a GPU, nothing to run');
    service.status('STATUS=DRA mode without an MPS root: nothing to run', true);
    service.close();
    process.exitCode = 0;
    return null;
  }
  const driverRoot = settings.options.driverRoot;
  const nvml = openNvml();
  const control = await findMpsControl(driverRoot);
  // Without the control program MPS claims fail (their answer says why); time-slicing claims still work.
  const program = 'path' in control ? control.path : MPS_CONTROL_PROGRAM;
  const nvidiaSmi = await findNvidiaSmi(driverRoot);
  const limits = await admissionLimits(settings, log);
  const agent = new DraSharingAgent({
    mpsRoot: settings.mpsRoot,
    stateDir: agentStateDir(process.env),
    limits,
    inventory: async () => readInventory(nvml, log),
    // Dynamic MIG's instance calls, where this driver has them (a request for partitions is refused otherwise).
    ...(nvml.has('nvmlDeviceCreateGpuInstanceWithPlacement', true)
      ? { migPort: new NvmlMigInstances(nvml, process.env.PROC_ROOT || '/proc') }
      : {}),
    hostFor: (root, claimsDir) =>
      confinedHost(new RealMpsHost({ root, nvml, program, log }), claimsDir, limits.shmBytesPerClaim),
    setTimeSlice: (uuid, interval) => applyTimeSlice({ uuid }, interval, { nvidiaSmi, log }),
    log,
    status: (line) => service.status(line),
  });
  await agent.start();
  service.status(`STATUS=DRA sharing agent: requests under ${settings.mpsRoot}/dra/requests`, true);
  return {
    stop: async () => {
      service.stopping('stopping the DRA sharing agent');
      try {
        await agent.stop();
      } finally {
        nvml.close();
        service.close();
      }
    },
    reload: async () => {
      log.info('SIGHUP: the DRA sharing agent has no configuration of its own; the requests are read again');
    },
  };
}
