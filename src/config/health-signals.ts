// The config file's `health` section, this project's own (NVIDIA's keys are unchanged):
//   health:
//     signals: {<signal name>: critical | warn | off, ...}   unnamed signals keep their default class
//     pcieReplaysPerMinute: <number>                       pcie-replay is bad above it (default 8)
// Checked whole: an unknown key, signal name or value is refused with its path, the value and what
// is allowed there. Pure; the config file's reader hands it the parsed `health` value.
import type { SignalName, SignalPolicy, SignalSetting } from '../core/health-signals.ts';
import { DEFAULT_SIGNAL_POLICY, isSignalName, SIGNAL_NAMES } from '../core/health-signals.ts';

const SETTINGS: readonly SignalSetting[] = ['critical', 'warn', 'off'];
const KEYS = ['signals', 'pcieReplaysPerMinute'] as const;
/** A limit beyond which the signal could never be bad in practice. */
const MAX_REPLAYS_PER_MINUTE = 1_000_000;

/** Reports a bad entry at `path` (e.g. "health.signals.nvlink"); never returns. */
export type HealthConfigFail = (path: string, message: string) => never;

const throwAt: HealthConfigFail = (path, message) => {
  throw new Error(`${path}: ${message}`);
};

function isObject(v: unknown): v is Record<string, unknown> {
  return typeof v === 'object' && v !== null && !Array.isArray(v);
}

function shown(v: unknown): string {
  return typeof v === 'string' ? JSON.stringify(v) : Array.isArray(v) ? 'a list' : String(JSON.stringify(v));
}

function readSignals(value: unknown, path: string, fail: HealthConfigFail): Record<SignalName, SignalSetting> {
  const signals: Record<SignalName, SignalSetting> = { ...DEFAULT_SIGNAL_POLICY.signals };
  if (value === undefined || value === null) return signals;
  if (!isObject(value)) fail(path, `${shown(value)} is not a map; expected {<signal>: critical | warn | off}`);
  for (const [name, written] of Object.entries(value)) {
    if (!isSignalName(name)) fail(`${path}.${name}`, `unknown signal; expected one of ${SIGNAL_NAMES.join(', ')}`);
    // The config file is read as YAML 1.1 (as NVIDIA's plugin reads it), where an unquoted off is false.
    const setting = written === false ? 'off' : written;
    if (typeof setting !== 'string' || !(SETTINGS as readonly string[]).includes(setting))
      fail(`${path}.${name}`, `${shown(setting)} is not allowed; expected ${SETTINGS.join(', ')}`);
    signals[name] = setting as SignalSetting;
  }
  return signals;
}

function readRate(value: unknown, path: string, fail: HealthConfigFail): number {
  if (value === undefined || value === null) return DEFAULT_SIGNAL_POLICY.pcieReplaysPerMinute;
  if (typeof value !== 'number' || !Number.isFinite(value) || value < 0 || value > MAX_REPLAYS_PER_MINUTE)
    fail(path, `${shown(value)} is not allowed; expected a number from 0 to ${MAX_REPLAYS_PER_MINUTE}`);
  return value;
}

/**
 * The signal policy of a config file's `health` value (undefined or null: the defaults). `fail`
 * reports a bad entry by its path under `prefix`; by default it throws an Error "<path>: <message>".
 */
export function parseHealthSection(value: unknown, fail: HealthConfigFail = throwAt, prefix = 'health'): SignalPolicy {
  if (value === undefined || value === null) return DEFAULT_SIGNAL_POLICY;
  if (!isObject(value)) fail(prefix, `${shown(value)} is not a map; expected keys ${KEYS.join(', ')}`);
  for (const k of Object.keys(value))
    if (!(KEYS as readonly string[]).includes(k))
      fail(`${prefix}.${k}`, `unknown key; expected one of ${KEYS.join(', ')}`);
  return {
    signals: readSignals(value.signals, `${prefix}.signals`, fail),
    pcieReplaysPerMinute: readRate(value.pcieReplaysPerMinute, `${prefix}.pcieReplaysPerMinute`, fail),
  };
}
