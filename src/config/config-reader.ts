// Reading a config file's parsed data: each key path checked against what may stand there, and every
// refusal worded the same way (`config file <path>: <key path>: <what is wrong>`), with the value shown.
import { ConfigError } from './errors.ts';

/** Shapes a value in the file may take; values are handed on as text for the option's own check. */
export type ConfigShape =
  | 'bool' // true or false
  | 'string' // a string
  | 'strings' // a string or a list of strings (joined with commas)
  | 'number' // a number, or a string such as "5s"
  | 'ints'; // a list of integers (joined with commas)

export type Json = null | boolean | number | string | Json[] | { [k: string]: Json };

export function isMap(v: unknown): v is Record<string, unknown> {
  return typeof v === 'object' && v !== null && !Array.isArray(v) && !(v instanceof Date);
}

/** A value as shown in a message: `"abc"`, `3`, `true`, `a list`, `a mapping`, `null`. */
export function showValue(v: unknown): string {
  if (v === null || v === undefined) return 'null';
  if (typeof v === 'string') return JSON.stringify(v.length > 80 ? `${v.slice(0, 77)}...` : v);
  if (typeof v === 'number' || typeof v === 'boolean') return String(v);
  if (Array.isArray(v)) return `a list (${v.length} items)`;
  if (v instanceof Date) return `the date ${v.toISOString().slice(0, 10)}`;
  if (isMap(v)) return 'a mapping';
  return typeof v;
}

const SHAPE_WANTED: Record<ConfigShape, string> = {
  bool: 'true or false',
  string: 'a string',
  strings: 'a string or a list of strings',
  number: 'a number',
  ints: 'a list of integers',
};

export class Reader {
  readonly file: string;
  constructor(file: string) {
    this.file = file;
  }

  fail(path: string, message: string): never {
    throw new ConfigError(`config file ${this.file}: ${path}: ${message}`);
  }

  /** Refuses keys not in `allowed`, naming the first unknown one and the keys allowed there. */
  keys(obj: Record<string, unknown>, prefix: string, allowed: readonly string[]): void {
    for (const k of Object.keys(obj)) {
      if (!allowed.includes(k)) {
        const near = allowed.find((a) => a.toLowerCase() === k.toLowerCase());
        const hint = near === undefined ? '' : ` (did you mean ${near}? keys are case-sensitive)`;
        this.fail(join(prefix, k), `unknown key${hint}; expected one of ${allowed.join(', ')}`);
      }
    }
  }

  mapping(v: unknown, path: string): Record<string, unknown> | null {
    if (v === null || v === undefined) return null;
    if (!isMap(v)) this.fail(path, `${showValue(v)} is not allowed; expected a mapping of keys to values`);
    return v;
  }

  /** The value as text in the given shape, or null for null (not set). */
  shaped(v: unknown, path: string, shape: ConfigShape): string | null {
    if (v === null || v === undefined) return null;
    const wrong = (): never => this.fail(path, `${showValue(v)} is not allowed; expected ${SHAPE_WANTED[shape]}`);
    switch (shape) {
      case 'bool':
        return typeof v === 'boolean' ? String(v) : wrong();
      case 'string':
        return typeof v === 'string' ? v : wrong();
      case 'strings':
        if (typeof v === 'string') return v;
        if (!Array.isArray(v)) return wrong();
        v.forEach((item, i) => {
          if (typeof item !== 'string')
            this.fail(`${path}[${i}]`, `${showValue(item)} is not allowed; expected a string`);
        });
        if (v.length === 0) this.fail(path, 'an empty list is not allowed; expected at least one value');
        return v.join(',');
      case 'number':
        if (typeof v === 'number' && Number.isFinite(v)) return String(v);
        return typeof v === 'string' ? v : wrong();
      case 'ints':
        if (!Array.isArray(v)) return wrong();
        v.forEach((item, i) => {
          if (typeof item !== 'number' || !Number.isInteger(item))
            this.fail(`${path}[${i}]`, `${showValue(item)} is not allowed; expected an integer`);
        });
        return v.join(',');
    }
  }

  bool(v: unknown, path: string): boolean | null {
    const s = this.shaped(v, path, 'bool');
    return s === null ? null : s === 'true';
  }
}

export function join(prefix: string, key: string): string {
  return prefix === '' ? key : `${prefix}.${key}`;
}

/** Next key segments under `prefix` of every path in `paths`. */
export function childKeys(paths: readonly string[], prefix: string): string[] {
  const out: string[] = [];
  const lead = prefix === '' ? '' : `${prefix}.`;
  for (const p of paths) {
    if (!p.startsWith(lead)) continue;
    const seg = p.slice(lead.length).split('.')[0];
    if (seg !== undefined && seg !== '' && !out.includes(seg)) out.push(seg);
  }
  return out;
}
