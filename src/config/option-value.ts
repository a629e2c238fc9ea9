// One option's value from its text (a flag's, a variable's, a config file entry's or the default),
// checked against the option's kind; a refusal names where the text came from.
import { bytesQuantity, parseQuantity } from '../core/quantity.ts';
import { DURATION_GRAMMAR, describeRange, parseSeconds } from './duration.ts';
import { OptionError } from './errors.ts';
import type { Kind, OptionSpec } from './options.ts';

const TRUE_WORDS = new Set(['true', '1', 'yes', 'on', 't']);
export const FALSE_WORDS = new Set(['false', '0', 'no', 'off', 'f']);

export type Value = string | boolean | number | readonly string[] | readonly number[];

type KindOf<T extends Kind['type']> = Extract<Kind, { type: T }>;

function convertString(k: KindOf<'string'>, raw: string, where: string): string {
  if (raw.length === 0 && k.empty === true) return raw;
  if (raw.length === 0)
    throw new OptionError(`${where}: an empty value is not allowed; expected ${k.path ? 'a path' : 'a value'}`);
  if (k.path && !raw.startsWith('/'))
    throw new OptionError(`${where}: ${JSON.stringify(raw)} is not an absolute path; expected a path starting with /`);
  if (k.name !== undefined) {
    const why = dnsSubdomainProblem(raw, k.name.max);
    if (why !== null) throw new OptionError(`${where}: ${JSON.stringify(raw)} is not ${k.name.what}: ${why}`);
  }
  return raw;
}

function convertBool(raw: string, where: string): boolean {
  const v = raw.toLowerCase();
  if (TRUE_WORDS.has(v)) return true;
  if (FALSE_WORDS.has(v)) return false;
  throw new OptionError(`${where}: ${JSON.stringify(raw)} is not a boolean; expected true or false`);
}

function convertEnum(k: KindOf<'enum'>, raw: string, where: string): string | readonly string[] {
  const one = (v: string): string => {
    const why = k.unsupported?.[v];
    if (why !== undefined) throw new OptionError(`${where}: ${JSON.stringify(v)} is not supported: ${why}`);
    if (!k.values.includes(v)) {
      const shown =
        k.multiple === true && v !== raw ? `${JSON.stringify(v)} (in ${JSON.stringify(raw)})` : JSON.stringify(v);
      throw new OptionError(
        `${where}: ${shown} is not allowed; ` +
          `expected ${k.multiple === true ? 'one or more of' : 'one of'} ${k.values.join(', ')}`,
      );
    }
    return v;
  };
  if (k.multiple !== true) return one(raw);
  const parts = raw.split(',').map((p) => p.trim());
  if (parts.some((p) => p === ''))
    throw new OptionError(
      `${where}: ${JSON.stringify(raw)} has an empty entry; expected ` +
        `one or more of ${k.values.join(', ')}, comma separated`,
    );
  return [...new Set(parts.map(one))];
}

function convertSeconds(k: KindOf<'seconds'>, raw: string, where: string): number {
  const n = parseSeconds(raw);
  if (n === null) {
    throw new OptionError(
      `${where}: ${JSON.stringify(raw)} is not a duration; expected ${DURATION_GRAMMAR}, ${describeRange(k)}`,
    );
  }
  if (n < k.min || n > k.max)
    throw new OptionError(
      `${where}: ${JSON.stringify(raw)}${String(n) === raw ? '' : ` (${n} seconds)`} ` +
        `is out of range; expected ${describeRange(k)}`,
    );
  return n;
}

function convertIds(k: KindOf<'ids'>, raw: string, where: string): readonly number[] {
  if (raw.trim() === '') return [];
  const ids = raw.split(',').map((p) => p.trim());
  const allowed =
    `only ${k.allowed.map((a) => `[${a}]`).join(', ')} or none ` +
    `(empty) ${k.allowed.length === 1 ? 'is' : 'are'} supported, as in NVIDIA's plugin`;
  for (const id of ids) {
    if (!/^\d+$/.test(id) || !k.allowed.includes(Number(id)))
      throw new OptionError(`${where}: ${JSON.stringify(raw)} is not allowed; ${allowed}`);
  }
  return [...new Set(ids.map(Number))];
}

function convertCount(k: KindOf<'count'>, raw: string, where: string): number {
  const n = /^\d+$/.test(raw.trim()) ? Number(raw.trim()) : Number.NaN;
  if (!Number.isSafeInteger(n) || n < k.min || n > k.max)
    throw new OptionError(
      `${where}: ${JSON.stringify(raw)} is not allowed; expected a whole number from ${k.min} to ${k.max}`,
    );
  return n;
}

/** How a bytes option's range reads: `from 1Mi to 1Ti (a quantity: 8Gi, 512Mi, 1e9)`. */
export function describeBytes(k: KindOf<'bytes'>): string {
  return `from ${bytesQuantity(k.min)} to ${bytesQuantity(k.max)} bytes (a quantity: 8Gi, 512Mi, 1e9)`;
}

function convertBytes(k: KindOf<'bytes'>, raw: string, where: string): number {
  const n = parseQuantity(raw.trim());
  if (n === null || n < k.min || n > k.max)
    throw new OptionError(`${where}: ${JSON.stringify(raw)} is not allowed; expected a size ${describeBytes(k)}`);
  return n;
}

/** The value of `spec` written as `raw`; throws OptionError naming `where` (a flag, a variable, a key). */
export function convert(spec: OptionSpec, raw: string, where: string): Value {
  const k = spec.kind;
  switch (k.type) {
    case 'string':
      return convertString(k, raw, where);
    case 'bool':
      return convertBool(raw, where);
    case 'enum':
      return convertEnum(k, raw, where);
    case 'seconds':
      return convertSeconds(k, raw, where);
    case 'ids':
      return convertIds(k, raw, where);
    case 'count':
      return convertCount(k, raw, where);
    case 'bytes':
      return convertBytes(k, raw, where);
  }
}

/** Why `name` is not a DNS subdomain (RFC 1123) of at most `max` characters, or null when it is one. */
export function dnsSubdomainProblem(name: string, max: number): string | null {
  if (name.length > max) return `${name.length} characters, at most ${max} allowed`;
  for (const label of name.split('.')) {
    if (label === '') return 'an empty part between dots (or a leading or trailing dot)';
    if (label.length > 63) return `the part ${JSON.stringify(label)} is longer than 63 characters`;
    if (!/^[a-z0-9]([a-z0-9-]*[a-z0-9])?$/.test(label))
      return (
        `the part ${JSON.stringify(label)} has characters other than lower-case ` +
        `letters, digits and "-" inside, or does not start and end with a letter or digit`
      );
  }
  return null;
}
