// `check`'s line on the health signals beyond XIDs: which signals each GPU's driver supports and which
// are "not available" on which GPU (never an alarm: the daemon leaves them out), the signals the
// policy turns off, and a WARN for a signal bad right now, read in one probe round by the health
// thread as the daemon reads them (signals-view.ts).
import { SIGNAL_NAMES } from '../core/health-signals.ts';
import type { SignalName } from '../core/health-signals.ts';
import type { CheckLine } from './check-report.ts';
import type { ProbedGpuSignals, SignalRound } from './signals-view.ts';

const NAME = 'health signals';

/** "GPU 0,1,3" for a list of GPUs. */
function gpuList(gpus: readonly ProbedGpuSignals[]): string {
  return `GPU ${gpus.map((g) => g.index).join(',')}`;
}

/** Each signal some GPU lacks, with the GPUs that lack it ("retired-pages on GPU 0,1"). */
function unavailableText(gpus: readonly ProbedGpuSignals[]): string[] {
  return SIGNAL_NAMES.flatMap((s) => {
    const lacking = gpus.filter((g) => g.unavailable.includes(s));
    if (lacking.length === 0) return [];
    return [lacking.length === gpus.length ? `${s} on every GPU` : `${s} on ${gpuList(lacking)}`];
  });
}

/** The signals bad now, as "GPU 2 row-remap=pending (...) [critical]". */
function badText(gpus: readonly ProbedGpuSignals[]): string[] {
  return gpus.flatMap((g) =>
    g.signals.filter((s) => s.status === 'bad').map((s) => `GPU ${g.index} ${s.signal}=${s.value} (${s.class})`),
  );
}

/** The line on the signals of one probe round; `skipped` says why there was none (NVML not available). */
export function signalsCheck(round: SignalRound | { skipped: string }): CheckLine {
  if ('skipped' in round) return { status: 'SKIP', name: NAME, detail: `not checked: ${round.skipped}` };
  if (!round.ok)
    return {
      status: 'WARN',
      name: NAME,
      detail: `the health thread could not read them: ${round.error}`,
      fix: 'the daemon cannot watch the health signals either; see the error and the daemon log',
    };
  const gpus = round.gpus;
  if (gpus.length === 0) return { status: 'SKIP', name: NAME, detail: 'not checked: no GPU' };
  const supportedEverywhere = SIGNAL_NAMES.filter((s: SignalName) => gpus.every((g) => !g.unavailable.includes(s)));
  const lacking = unavailableText(gpus);
  const off = SIGNAL_NAMES.filter((s) => gpus.every((g) => g.signals.find((x) => x.signal === s)?.status === 'off'));
  const parts = [
    `supported by the driver on every GPU: ${supportedEverywhere.join(', ') || 'none'}`,
    ...(lacking.length > 0 ? [`not available: ${lacking.join('; ')}`] : []),
    ...(off.length > 0 ? [`turned off: ${off.join(', ')}`] : []),
  ];
  const bad = badText(gpus);
  if (bad.length > 0)
    return {
      status: 'WARN',
      name: NAME,
      detail: `bad now: ${bad.join('; ')}; ${parts.join('; ')}`,
      fix: 'see `gpu-device-plugin info` for what to do; the daemon marks a GPU with a critical signal Unhealthy',
    };
  return { status: 'PASS', name: NAME, detail: parts.join('; ') };
}
