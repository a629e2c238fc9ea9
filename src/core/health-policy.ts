// The health policy: which XIDs and events mark a GPU unhealthy under DP_DISABLE_HEALTHCHECKS and
// DP_ENABLE_HEALTHCHECKS, how those variables are read, and the start-up line describing them. The
// tracker that applies the policy per GPU is in health-tracker.ts; the watcher's events in health-events.ts.
//
// Decisions where NVIDIA's behaviour leaves room:
//
// * DP_DISABLE_HEALTHCHECKS=all (or any item "xids") turns every health check off, as in NVIDIA's
//   plugin: no XID, no double-bit ECC event and no GPU_IS_LOST probe marks a GPU unhealthy.
//   DP_ENABLE_HEALTHCHECKS wins over it: with disable=all,enable=74 only XID 74 is watched.
//   Double-bit ECC events are the event form of XID 48 and a lost GPU is what XID 79 reports, so
//   with every check off they are watched again exactly when XID 48 (resp. 79) is enabled.
// * When checks are on, double-bit ECC events and lost probes always count; the XID lists
//   (default-ignored XIDs, the disable list) concern XID events only.
// * DP_ENABLE_HEALTHCHECKS=all (or "xids") makes every XID critical, the default-ignored ones and
//   any in the disable list included, and so also turns double-bit ECC and lost checks back on.
// * The health signals' names (health-signals.ts) are items too: disable turns that signal off,
//   enable turns it on at its class whatever else says. "all" names every signal as well as every
//   XID; "xids" only XIDs.
// * Item words are case-insensitive ("ALL" = "all"); XIDs are decimal digits only; empty items are
//   skipped; anything else is refused with an error naming the variable and the item.

import { isSignalName, SIGNAL_NAMES } from './health-signal-types.ts';
import type { SignalName } from './health-signal-types.ts';

/** XIDs caused by applications, not by the GPU, which NVIDIA's plugin ignores by default. */
export const DEFAULT_IGNORED_XIDS: readonly number[] = [13, 31, 43, 45, 68, 109];

/**
 * XIDs after which a GPU never recovers, even with recovery on: 48 double-bit ECC error, 64 row
 * remap / page retirement failure, 79 GPU fallen off the bus, 95 uncontained ECC error, 140
 * unrecovered ECC error.
 */
export const NON_RECOVERABLE_XIDS: ReadonlySet<number> = new Set([48, 64, 79, 95, 140]);

/** The XID NVML also reports a double-bit ECC error as, and the one for a GPU off the bus. */
const DOUBLE_BIT_ECC_XID = 48;
const FALLEN_OFF_THE_BUS_XID = 79;

export interface HealthSettings {
  /** DP_DISABLE_HEALTHCHECKS was "all" or listed "xids": only explicitly enabled XIDs are watched. */
  readonly allDisabled: boolean;
  /** XIDs ignored when checks are on: DEFAULT_IGNORED_XIDS plus the DP_DISABLE_HEALTHCHECKS list. */
  readonly ignoredXids: ReadonlySet<number>;
  /** XIDs listed in DP_ENABLE_HEALTHCHECKS: critical whatever else says. */
  readonly enabledXids: ReadonlySet<number>;
  /** DP_ENABLE_HEALTHCHECKS was "all" or "xids": every XID is critical. */
  readonly allEnabled: boolean;
  /** Health signals (health-signals.ts) DP_DISABLE_HEALTHCHECKS names; "all" names every one. */
  readonly disabledSignals: ReadonlySet<SignalName>;
  /** Health signals DP_ENABLE_HEALTHCHECKS names (watched whatever disables them); "all" names every one. */
  readonly enabledSignals: ReadonlySet<SignalName>;
}

interface ParsedList {
  all: boolean;
  xids: number[];
  /** The item "all": every check, the health signals too. */
  everything: boolean;
  signals: SignalName[];
}

function parseXidList(variable: string, value: string | undefined, expected: string): ParsedList {
  const parsed: ParsedList = { all: false, xids: [], everything: false, signals: [] };
  if (value === undefined) return parsed;
  for (const raw of value.split(',')) {
    const item = raw.trim();
    if (item === '') continue;
    const word = item.toLowerCase();
    if (word === 'all' || word === 'xids') {
      parsed.all = true;
      parsed.everything ||= word === 'all';
      continue;
    }
    if (isSignalName(word)) {
      parsed.signals.push(word);
      continue;
    }
    const xid = Number(item);
    if (!/^[0-9]+$/.test(item) || !Number.isSafeInteger(xid)) {
      throw new Error(`${variable}: ${JSON.stringify(item)} is not an XID; expected ${expected}`);
    }
    parsed.xids.push(xid);
  }
  return parsed;
}

/**
 * Reads DP_DISABLE_HEALTHCHECKS and DP_ENABLE_HEALTHCHECKS (pass the raw values, undefined when
 * unset). Throws an Error naming the variable and the bad item.
 */
export function parseHealthSettings(disable: string | undefined, enable: string | undefined): HealthSettings {
  const off = parseXidList(
    'DP_DISABLE_HEALTHCHECKS',
    disable,
    '"all", "xids", or a comma list of XID numbers like 13,31',
  );
  const on = parseXidList('DP_ENABLE_HEALTHCHECKS', enable, '"all", "xids", or a comma list of XID numbers like 48,79');
  return {
    allDisabled: off.all,
    ignoredXids: new Set([...DEFAULT_IGNORED_XIDS, ...off.xids]),
    enabledXids: new Set(on.xids),
    allEnabled: on.all,
    disabledSignals: new Set(off.everything ? SIGNAL_NAMES : off.signals),
    enabledSignals: new Set(on.everything ? SIGNAL_NAMES : on.signals),
  };
}

/** Whether an XID marks a GPU unhealthy under these settings. */
export function isCritical(settings: HealthSettings, xid: number): boolean {
  if (settings.allEnabled || settings.enabledXids.has(xid)) return true;
  if (settings.allDisabled) return false;
  return !settings.ignoredXids.has(xid);
}

/** Whether a double-bit ECC event marks a GPU unhealthy. */
export function watchesDoubleBitEcc(settings: HealthSettings): boolean {
  return !settings.allDisabled || isCritical(settings, DOUBLE_BIT_ECC_XID);
}

/** Whether a probe answering GPU_IS_LOST marks a GPU unhealthy. */
export function watchesLostGpus(settings: HealthSettings): boolean {
  return !settings.allDisabled || isCritical(settings, FALLEN_OFF_THE_BUS_XID);
}

/** Whether anything at all is watched: false only when every check is off and nothing is enabled. */
export function watchesAnything(settings: HealthSettings): boolean {
  return !settings.allDisabled || settings.allEnabled || settings.enabledXids.size > 0;
}

function xidListText(xids: ReadonlySet<number>): string {
  return [...xids].sort((a, b) => a - b).join(',');
}

/** One line for the start-up log saying what the settings watch. */
export function describeHealthSettings(settings: HealthSettings): string {
  let xids: string;
  if (settings.allEnabled) xids = 'every XID is critical';
  else if (settings.allDisabled) {
    xids =
      settings.enabledXids.size === 0
        ? 'no XID is critical (health checks disabled)'
        : `only XIDs ${xidListText(settings.enabledXids)} are critical`;
  } else {
    const ignored = new Set([...settings.ignoredXids].filter((x) => !settings.enabledXids.has(x)));
    xids = ignored.size === 0 ? 'every XID is critical' : `every XID is critical except ${xidListText(ignored)}`;
  }
  const ecc = watchesDoubleBitEcc(settings) ? 'watched' : 'ignored';
  const lost = watchesLostGpus(settings) ? 'watched' : 'ignored';
  return `${xids}; double-bit ECC ${ecc}; lost GPUs ${lost}`;
}
