// What systemd hears from the daemon: STATUS lines, READY=1 once, WATCHDOG=1 from a timer on the
// event loop (so a stuck loop stops feeding it), STOPPING=1, and ERRNO on a failed start.
// READY=1 normally follows the first registration of every resource. A node may bring its kubelet
// (or its driver) up much later — during maintenance apt upgrades this package while the kubelet is
// stopped — and a start that waited would block apt/dnf and hit systemd's start timeout. So READY=1
// also goes out READY_WITHOUT_KUBELET_MS after start, with a STATUS saying what the plugin waits for.
import { badSignals, signalTransitions } from '../core/health-signals.ts';
import { healthCounts, silentMpsDaemons } from '../core/snapshot.ts';
import type { HealthCounts, NodeSignals, NodeSnapshot } from '../core/snapshot.ts';
import { errorText, exitProcess } from './log.ts';
import type { Logger } from './log.ts';
import { loadKoffi } from './native.ts';
import type { Koffi } from './native.ts';
import { createNotifier } from './notify.ts';
import type { Notifier } from './notify.ts';
import { TimerOwner } from './timers.ts';

const READY_WITHOUT_KUBELET_MS = 10000;

/** How a daemon talks to systemd beyond the defaults (the plugin's). */
export interface ServiceStatusOptions {
  /** The first STATUS line (default: starting, opening NVML). */
  readonly starting?: string;
  /** READY=1 goes out this long after start even if nothing said ready (default 10 s); null: only when told. */
  readonly readyWithinMs?: number | null;
}

export class ServiceStatus {
  private readonly notifier: Notifier;
  /** 'watchdog' (WATCHDOG=1 every half period) and 'ready' (READY=1 that could not wait longer). */
  private readonly timers = new TimerOwner();
  private readySent = false;
  private waitingFor = 'NVML';

  constructor(koffi: Koffi, log: Logger, opts: ServiceStatusOptions = {}) {
    let notifier: Notifier;
    try {
      notifier = createNotifier(koffi);
    } catch (err) {
      log.warn('cannot talk to systemd (NOTIFY_SOCKET); readiness and watchdog are not reported', {
        error: errorText(err),
      });
      notifier = createNotifier(koffi, {});
    }
    this.notifier = notifier;
    if (notifier.watchdogMs !== null)
      this.timers.every('watchdog', Math.max(notifier.watchdogMs / 2, 50), () => notifier.notify('WATCHDOG=1'));
    notifier.notify(`STATUS=${opts.starting ?? 'starting: opening NVML'}`);
    const readyWithin = opts.readyWithinMs === undefined ? READY_WITHOUT_KUBELET_MS : opts.readyWithinMs;
    if (readyWithin !== null)
      this.timers.after('ready', readyWithin, () => {
        if (!this.readySent) this.ready(`STATUS=waiting for ${this.waitingFor}; retrying`);
      });
  }

  /** What the plugin waits for, said in the STATUS of a READY=1 that could not wait longer. */
  waitFor(what: string): void {
    this.waitingFor = what;
  }

  /** A STATUS line; with ready, READY=1 too if it has not gone out yet. */
  status(line: string, ready = false): void {
    if (ready) this.ready(line);
    else this.notifier.notify(line);
  }

  private ready(statusLine: string): void {
    this.timers.clear('ready');
    this.notifier.notify(this.readySent ? statusLine : `READY=1\n${statusLine}`);
    this.readySent = true;
  }

  /** STOPPING=1 with what is stopping; the watchdog stops. */
  stopping(status = 'stopping'): void {
    this.notifier.notify(`STOPPING=1\nSTATUS=${status}`);
    this.timers.clear('watchdog');
  }

  /**
   * This process no longer sees the directory it serves its sockets in: one line, a STATUS, and exit 1
   * so that systemd restarts the service with a fresh view of it.
   */
  lostDirectory(log: Logger, dir: string, why: string): never {
    log.error(
      `lost the socket directory: ${why}; exiting so that systemd restarts the service with a fresh view of it`,
      { dir },
    );
    this.status(`STATUS=lost the socket directory ${dir}; exiting to be restarted`);
    return exitProcess(1);
  }

  /** The start failed: STATUS says why (`cannot start: …`, `configuration error: …`). */
  failed(err: unknown, what = 'cannot start'): void {
    this.notifier.notify(`STATUS=${what}: ${errorText(err)}\nERRNO=5`);
  }

  close(): void {
    this.timers.dispose();
    this.notifier.close();
  }
}

/** What the plugin waits for while NVML cannot be opened (the packaged service starts without a driver and retries). */
export const NO_DRIVER = 'the NVIDIA driver (NVML cannot be loaded yet)';

/** The STATUS text: registered or waiting, and healthy of total GPUs (and MIG devices, when there are any). */
export function statusLine(counts: HealthCounts | null, registeredNow: boolean, words?: string): string {
  const mig =
    counts !== null && counts.mig.total > 0 ? `, ${counts.mig.healthy} of ${counts.mig.total} MIG devices` : '';
  return (
    `STATUS=${words ?? (registeredNow ? 'registered' : 'waiting for the kubelet')}` +
    `; ${counts?.gpus.healthy ?? 0} of ${counts?.gpus.total ?? 0} GPUs healthy${mig}`
  );
}

/** What the STATUS line asks of the registrations (node/consumer.ts's Registrations has it). */
export interface StatusRegistrations {
  allRegisteredNow(): boolean;
  /** The line's first words instead of "registered" / "waiting for the kubelet". */
  statusWords?(registeredNow: boolean): string;
  /** The MPS daemons of what is advertised (node/consumer.ts's Registrations); absent: none. */
  advertised?(): Pick<NodeSnapshot, 'mpsDaemons'>;
}

/** What STATUS adds for MPS daemons that do not answer (their replicas are Unhealthy): '' when all answer. */
/**
 * The health signals' part of the STATUS line: the signals bad now and the transitions seen since
 * start (a signal gone bad, changed or cleared); empty while there have been none.
 */
export function signalStatus(signals: NodeSignals, transitions: number): string {
  if (transitions === 0) return '';
  let bad = 0;
  for (const g of signals.values()) bad += badSignals(g).length;
  return `; health signals: ${bad} bad, ${transitions} transition${transitions === 1 ? '' : 's'}`;
}

export function mpsStatus(snapshot: Pick<NodeSnapshot, 'mpsDaemons'>): string {
  return silentMpsDaemons(snapshot)
    .map(({ resource, state }) => `; MPS daemon for ${resource} not answering: ${state.reason ?? 'no answer'}`)
    .join('');
}

/**
 * The daemon's STATUS as the node changes: a consumer of the live node (each applied snapshot) that
 * also hears the registrations. "registered" only while every resource is: as soon as the resource
 * manager says a registration is lost, the line says "waiting for the kubelet" again.
 */
export class NodeStatus {
  readonly name = 'systemd status';
  private readonly service: Pick<ServiceStatus, 'status' | 'waitFor'>;
  private readonly registrations: StatusRegistrations;
  private counts: HealthCounts | null = null;
  private mps = '';
  private signals = '';
  private signalTransitions = 0;
  private lastSignals: NodeSignals = new Map();
  private registeredOnce = false;
  /** No driver has answered yet, and no GPU has been seen. */
  private noDriver = false;
  /** The line last sent to systemd. */
  private sent = '';

  constructor(service: Pick<ServiceStatus, 'status' | 'waitFor'>, registrations: StatusRegistrations) {
    this.service = service;
    this.registrations = registrations;
  }

  line(): string {
    if (this.noDriver) return `STATUS=waiting for ${NO_DRIVER}; retrying`;
    const now = this.registeredOnce && this.registrations.allRegisteredNow();
    return statusLine(this.counts, now, this.registrations.statusWords?.(now)) + this.mps + this.signals;
  }

  /** Says the line again (what statusWords() says changed: a publication, say). */
  refresh(): void {
    this.say();
  }

  private say(ready = false): void {
    this.sent = this.line();
    this.service.status(this.sent, ready);
  }

  /**
   * Every applied snapshot: what is awaited now is the kubelet,
   * or the driver while none has answered and no GPU was seen.
   */
  apply(applied: { readonly snapshot: NodeSnapshot }): void {
    this.counts = healthCounts(applied.snapshot);
    this.mps = mpsStatus(this.registrations.advertised?.() ?? { mpsDaemons: new Map() });
    const signals = applied.snapshot.signals ?? this.lastSignals;
    if (signals !== this.lastSignals) {
      for (const [uuid, g] of signals)
        this.signalTransitions += signalTransitions(this.lastSignals.get(uuid), g).filter(
          (t) => t.kind !== 'unavailable',
        ).length;
      this.lastSignals = signals;
      this.signals = signalStatus(signals, this.signalTransitions);
    }
    this.noDriver = applied.snapshot.driverVersion === null && applied.snapshot.gpus.length === 0;
    this.service.waitFor(this.noDriver ? NO_DRIVER : 'the kubelet');
    // A snapshot that changes nothing the line says sends nothing: the line systemd has is still true.
    if (this.line() !== this.sent) this.say();
  }

  /** After a registration; `all`: every resource has registered at least once (READY=1 then). */
  registered(all: boolean): void {
    this.registeredOnce ||= all;
    this.say(this.registeredOnce);
  }

  /** A registration stopped counting. */
  registrationLost(): void {
    this.say();
  }
}

/**
 * One message to systemd from a process about to exit before it made a ServiceStatus (a configuration
 * error, another plugin already running), so that `systemctl status` says why. Nothing without
 * $NOTIFY_SOCKET, or when the native module cannot be loaded (the exit says it anyway).
 */
export function notifyBeforeExit(message: string, env: NodeJS.ProcessEnv = process.env): void {
  if (env.NOTIFY_SOCKET === undefined || env.NOTIFY_SOCKET === '') return;
  try {
    const n = createNotifier(loadKoffi(), env);
    n.notify(message);
    n.close();
  } catch {
    // Nothing to tell systemd with: the log line and the exit code remain.
  }
}
