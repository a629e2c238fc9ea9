// The scanner (src/nvml) wired to the live node: every scan, NVML event and probe round goes to the
// node, and the node asks the scanner to look again when a report names something it does not hold.
// A start whose first snapshot is refused fails naming the config file (config/exit-codes.ts).
import { startError } from '../config/exit-codes.ts';
import { parseOptions } from '../config/parse-options.ts';
import type { Options } from '../config/options.ts';
import { watchesAnything } from '../core/health-policy.ts';
import { DEFAULT_SIGNAL_POLICY, SIGNAL_NAMES, watchesAnySignal } from '../core/health-signals.ts';
import type { EventBatchEntry } from '../core/health-events.ts';
import type { HealthSettings } from '../core/health-policy.ts';
import { NvmlSessions } from '../nvml/node-reader.ts';
import { Scanner } from '../nvml/scanner.ts';
import type { Logger } from '../system/log.ts';
import type { Koffi } from '../system/native.ts';
import { processResources } from '../system/resources.ts';
import { reloadConfig } from './config.ts';
import type { RunningConfig } from './config.ts';
import type { NodeSettings } from './consumer.ts';
import type { LiveNode } from './live-node.ts';

export interface NodeScannerDeps {
  readonly koffi: Koffi;
  readonly options: Options;
  readonly health: HealthSettings;
  readonly sysfsRoot: string;
  readonly log: Logger;
  /** Whether scans read the node facts (config.ts readsNodeFacts). */
  readonly facts: boolean;
  /** NVML events, before the node takes them (the observer counts XIDs). */
  onEvents(events: readonly EventBatchEntry[]): void;
  /** The start failed for good (the exit). */
  onStartFailed(err: unknown): void;
}

/** The scanner of this node, feeding the live node. */
export function nodeScanner<C extends NodeSettings>(node: LiveNode<C>, d: NodeScannerDeps): Scanner {
  const o = d.options;
  const policy = () => node.config.signalPolicy ?? DEFAULT_SIGNAL_POLICY;
  // The thread runs when any XID check or any signal is watched; it reads the signals the policy in force watches.
  const watched = watchesAnything(d.health) || watchesAnySignal(policy());
  const signals = () => SIGNAL_NAMES.filter((s) => policy().signals[s] !== 'off');
  const scanner = new Scanner({
    sessions: new NvmlSessions({
      koffi: d.koffi,
      driverRoot: o.driverRoot,
      sysfsRoot: d.sysfsRoot,
      log: d.log,
      mig: o.migStrategy !== 'none',
      facts: d.facts,
    }),
    log: d.log,
    rediscoverIntervalMs: o.rediscoverInterval * 1000,
    health: watched ? { probeIntervalMs: o.healthProbeInterval * 1000, signals } : null,
    onScan: (scan, reason) =>
      node.scanned(scan, reason).catch((err: unknown) => {
        throw startError(err, o.configFile);
      }),
    onStartFailed: (err) => d.onStartFailed(err),
    onEvents: (events) => {
      d.onEvents(events);
      node.onEvents(events);
    },
    onProbe: (results) => node.onProbe(results),
    onSignals: (readings) => node.onSignals(readings),
  });
  node.onRescanWanted((reason) => scanner.rescan(reason));
  return scanner;
}

/**
 * SIGHUP: the config file again (argv and the environment read anew; a bad file is refused, the
 * running configuration kept), then a fresh scan.
 */
export async function reloadNode(
  node: LiveNode<RunningConfig>,
  scanner: Scanner,
  argv: readonly string[],
  log: Logger,
): Promise<void> {
  if (await reloadConfig(node, () => parseOptions(argv, process.env), log))
    scanner.setInterval(node.config.options.rediscoverInterval * 1000);
  void scanner
    .rescan('reload', true)
    .then(() => log.enabled('debug') && log.debug('process resources', processResources()));
}
