// The duration grammar of the options that take seconds (parsing and the range wording), apart from
// options.ts so the option table stays readable; options.ts re-exports all of it.

/**
 * Durations: a plain decimal number is seconds (`5`, `0.5`); a unit may follow, as Kubernetes writes
 * durations (Go's time.ParseDuration): `500ms`, `30s`, `5m`, `1h`, or several, `1m30s`. Nothing else:
 * no sign, exponent, hexadecimal, spaces or other units, so that `0x10` or `1e3` is refused instead of
 * silently read as a number.
 */
const DURATION_PART = /(\d+(?:\.\d+)?)(ms|s|m|h)/g;
const UNIT_SECONDS: Readonly<Record<string, number>> = { ms: 0.001, s: 1, m: 60, h: 3600 };
export const DURATION_GRAMMAR =
  'a decimal number of seconds (5, 0.5) or a duration with units ms, s, m, h (500ms, 30s, 5m, 1h30m)';

/** Seconds from a duration as above, or null when the text is not one. */
export function parseSeconds(raw: string): number | null {
  if (/^\d+(\.\d+)?$/.test(raw)) return Number(raw);
  if (!/^(\d+(\.\d+)?(ms|s|m|h))+$/.test(raw)) return null;
  let total = 0;
  for (const m of raw.matchAll(DURATION_PART)) total += Number(m[1]) * (UNIT_SECONDS[m[2] ?? 's'] ?? 1);
  // Sums of fractions are rounded to the microsecond (0.1 + 0.2 is not 0.30000000000000004 seconds).
  return Math.round(total * 1e6) / 1e6;
}

/** The range of a duration option, for messages and help: `from 0.1 to 3600 seconds`. */
export function describeRange(k: { min: number; max: number; zeroMeansOff?: boolean }): string {
  return `from ${k.min} to ${k.max} seconds${k.zeroMeansOff === true ? ' (0: off)' : ''}`;
}
