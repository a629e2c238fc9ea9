// The environment files the service reads (EnvironmentFile= in the unit: /etc/default/gpu-device-plugin,
// /etc/sysconfig/gpu-device-plugin), read the way systemd reads them, so that `check` and `info` see
// the options the service runs with. parseEnvironmentFile is pure; readEnvironmentFiles reads.
//
// systemd's syntax: one KEY=VALUE per line; lines starting with # or ; are comments; whitespace
// around the key and an unquoted value's trailing whitespace are dropped; a value may be quoted
// with '…' (taken as is) or "…" (backslash escapes \" \\ \$ \` and a newline); outside quotes a
// backslash takes the next character as is, and one at the end of a line joins the next line. A
// `#` after a value is part of the value. `export KEY=VALUE` is not shell: systemd ignores the
// line (it logs "Ignoring invalid environment assignment"), and so do we, with a warning.
import { readFile } from 'node:fs/promises';

export interface EnvAssignment {
  readonly key: string;
  readonly value: string;
  readonly line: number;
}

export interface ParsedEnvFile {
  readonly assignments: readonly EnvAssignment[];
  /** Lines systemd ignores, with why (1-based line numbers). */
  readonly ignored: readonly { readonly line: number; readonly text: string; readonly why: string }[];
}

const NAME = /^[A-Za-z_][A-Za-z0-9_]*$/;

export function parseEnvironmentFile(text: string): ParsedEnvFile {
  const assignments: EnvAssignment[] = [];
  const ignored: { line: number; text: string; why: string }[] = [];
  const src = text.replace(/\r\n/g, '\n');
  let i = 0;
  let lineNo = 1;
  while (i < src.length) {
    const start = lineNo;
    // Leading whitespace, then a comment or an empty line.
    while (i < src.length && (src[i] === ' ' || src[i] === '\t')) i++;
    if (i >= src.length) break;
    if (src[i] === '\n') { i++; lineNo++; continue; }
    if (src[i] === '#' || src[i] === ';') {
      while (i < src.length && src[i] !== '\n') i++;
      continue;
    }
    // The key, up to '=' or the end of the line.
    let key = '';
    while (i < src.length && src[i] !== '=' && src[i] !== '\n') key += src[i++];
    if (i >= src.length || src[i] === '\n') {
      ignored.push({ line: start, text: key.trim(), why: 'no "=": expected KEY=VALUE' });
      continue;
    }
    i++; // '='
    key = key.trim();
    // The value: a small state machine over quotes and backslashes, as systemd's.
    let value = '';
    let pendingSpace = '';
    let done = false;
    while (i < src.length && !done) {
      const c = src[i] as string;
      if (c === '\n') { i++; lineNo++; done = true; break; }
      if (c === '\\') {
        const n = src[i + 1];
        if (n === '\n') { i += 2; lineNo++; continue; }
        if (n === undefined) { i++; continue; }
        value += pendingSpace + n; pendingSpace = ''; i += 2; continue;
      }
      if (c === ' ' || c === '\t') {
        if (value !== '') pendingSpace += c;
        i++;
        continue;
      }
      if (c === "'") {
        value += pendingSpace; pendingSpace = '';
        i++;
        while (i < src.length && src[i] !== "'") {
          if (src[i] === '\n') lineNo++;
          value += src[i++];
        }
        i++;
        continue;
      }
      if (c === '"') {
        value += pendingSpace; pendingSpace = '';
        i++;
        while (i < src.length && src[i] !== '"') {
          const d = src[i] as string;
          if (d === '\\') {
            const n = src[i + 1];
            if (n === '\n') { i += 2; lineNo++; continue; }
            if (n === '"' || n === '\\' || n === '$' || n === '`') { value += n; i += 2; continue; }
            value += d; i++;
            continue;
          }
          if (d === '\n') lineNo++;
          value += d; i++;
        }
        i++;
        continue;
      }
      value += pendingSpace + c; pendingSpace = ''; i++;
    }
    if (/^export\s/.test(key)) {
      ignored.push({ line: start, text: key, why: 'systemd does not take "export" in an environment file and ignores the line; write KEY=VALUE' });
      continue;
    }
    if (!NAME.test(key)) {
      ignored.push({ line: start, text: key, why: `${JSON.stringify(key)} is not a variable name; systemd ignores the line` });
      continue;
    }
    assignments.push({ key, value, line: start });
  }
  return { assignments, ignored };
}

export interface EnvFileRead {
  readonly path: string;
  /** Given with --env-file (must exist) rather than found as one of the unit's files (may be absent). */
  readonly explicit: boolean;
  /** The file's assignments, or why it could not be read (absent: null). */
  readonly parsed: ParsedEnvFile | null;
  readonly error: string | null;
}

/** The merged environment of the files in order (a later file wins), and which file each variable came from. */
export interface UnitEnvironment {
  readonly files: readonly EnvFileRead[];
  readonly env: Readonly<Record<string, string>>;
  readonly source: Readonly<Record<string, string>>;
}

export async function readEnvironmentFiles(paths: readonly { path: string; explicit: boolean }[]): Promise<UnitEnvironment> {
  const files: EnvFileRead[] = [];
  const env: Record<string, string> = {};
  const source: Record<string, string> = {};
  for (const { path, explicit } of paths) {
    let text: string;
    try {
      text = await readFile(path, 'utf8');
    } catch (err) {
      const code = (err as NodeJS.ErrnoException).code;
      files.push({ path, explicit, parsed: null, error: code === 'ENOENT' ? null : `cannot read ${path}: ${(err as Error).message}` });
      if (code === 'ENOENT' && explicit) files[files.length - 1] = { path, explicit, parsed: null, error: `${path} does not exist` };
      continue;
    }
    const parsed = parseEnvironmentFile(text);
    files.push({ path, explicit, parsed, error: null });
    for (const a of parsed.assignments) {
      env[a.key] = a.value;
      source[a.key] = path;
    }
  }
  return { files, env, source };
}
