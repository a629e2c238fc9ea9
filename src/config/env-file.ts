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
  const cur: Cursor = { src: text.replace(/\r\n/g, '\n'), i: 0, lineNo: 1 };
  while (cur.i < cur.src.length) {
    const start = cur.lineNo;
    if (!atAssignment(cur)) continue;
    const key = readKey(cur);
    if (key.assigned === false) {
      ignored.push({ line: start, text: key.text.trim(), why: 'no "=": expected KEY=VALUE' });
      continue;
    }
    const name = key.text.trim();
    const value = readValue(cur);
    const why = whyIgnored(name);
    if (why !== null) ignored.push({ line: start, text: name, why });
    else assignments.push({ key: name, value, line: start });
  }
  return { assignments, ignored };
}

/** Where the parser is in the file's text (CRLF already made LF), and the 1-based line it is on. */
interface Cursor {
  readonly src: string;
  i: number;
  lineNo: number;
}

/**
 * Skips a line's leading whitespace; true when a KEY=VALUE line starts there. An empty line is
 * consumed, a comment up to (not including) its newline, and the end of the text left as it is.
 */
function atAssignment(cur: Cursor): boolean {
  const { src } = cur;
  while (cur.i < src.length && (src[cur.i] === ' ' || src[cur.i] === '\t')) cur.i++;
  if (cur.i >= src.length) return false;
  if (src[cur.i] === '\n') {
    cur.i++;
    cur.lineNo++;
    return false;
  }
  if (src[cur.i] === '#' || src[cur.i] === ';') {
    while (cur.i < src.length && src[cur.i] !== '\n') cur.i++;
    return false;
  }
  return true;
}

/** The key as written (untrimmed), up to '=' (consumed) or, with no '=', the end of the line (left). */
function readKey(cur: Cursor): { text: string; assigned: boolean } {
  const { src } = cur;
  let text = '';
  while (cur.i < src.length && src[cur.i] !== '=' && src[cur.i] !== '\n') text += src[cur.i++];
  if (cur.i >= src.length || src[cur.i] === '\n') return { text, assigned: false };
  cur.i++; // '='
  return { text, assigned: true };
}

/**
 * The value after '=', through the end of its (possibly continued) line, newline consumed: a small
 * state machine over quotes and backslashes, as systemd's.
 */
function readValue(cur: Cursor): string {
  const { src } = cur;
  let value = '';
  let pendingSpace = '';
  while (cur.i < src.length) {
    const c = src[cur.i] as string;
    if (c === '\n') {
      cur.i++;
      cur.lineNo++;
      break;
    }
    if (c === '\\') {
      const n = src[cur.i + 1];
      if (n === '\n') {
        cur.i += 2;
        cur.lineNo++;
        continue;
      }
      if (n === undefined) {
        cur.i++;
        continue;
      }
      value += pendingSpace + n;
      pendingSpace = '';
      cur.i += 2;
      continue;
    }
    if (c === ' ' || c === '\t') {
      if (value !== '') pendingSpace += c;
      cur.i++;
      continue;
    }
    if (c === "'" || c === '"') {
      value += pendingSpace + (c === "'" ? readSingleQuoted(cur) : readDoubleQuoted(cur));
      pendingSpace = '';
      continue;
    }
    value += pendingSpace + c;
    pendingSpace = '';
    cur.i++;
  }
  return value;
}

/** '…' from its opening quote: taken as is, newlines included, through the closing quote (or the end). */
function readSingleQuoted(cur: Cursor): string {
  const { src } = cur;
  let out = '';
  cur.i++;
  while (cur.i < src.length && src[cur.i] !== "'") {
    if (src[cur.i] === '\n') cur.lineNo++;
    out += src[cur.i++];
  }
  cur.i++;
  return out;
}

/** "…" from its opening quote: backslash escapes \" \\ \$ \` and a newline; any other backslash is kept. */
function readDoubleQuoted(cur: Cursor): string {
  const { src } = cur;
  let out = '';
  cur.i++;
  while (cur.i < src.length && src[cur.i] !== '"') {
    const d = src[cur.i] as string;
    if (d === '\\') {
      const n = src[cur.i + 1];
      if (n === '\n') {
        cur.i += 2;
        cur.lineNo++;
        continue;
      }
      if (n === '"' || n === '\\' || n === '$' || n === '`') {
        out += n;
        cur.i += 2;
        continue;
      }
      out += d;
      cur.i++;
      continue;
    }
    if (d === '\n') cur.lineNo++;
    out += d;
    cur.i++;
  }
  cur.i++;
  return out;
}

/** Why systemd ignores an assignment to this (trimmed) key, or null when it is a variable name. */
function whyIgnored(key: string): string | null {
  if (/^export\s/.test(key))
    return 'systemd does not take "export" in an environment file and ignores the line; write KEY=VALUE';
  if (!NAME.test(key)) return `${JSON.stringify(key)} is not a variable name; systemd ignores the line`;
  return null;
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

export async function readEnvironmentFiles(
  paths: readonly { path: string; explicit: boolean }[],
): Promise<UnitEnvironment> {
  const files: EnvFileRead[] = [];
  const env: Record<string, string> = {};
  const source: Record<string, string> = {};
  for (const { path, explicit } of paths) {
    let text: string;
    try {
      text = await readFile(path, 'utf8');
    } catch (err) {
      const code = (err as NodeJS.ErrnoException).code;
      files.push({
        path,
        explicit,
        parsed: null,
        error: code === 'ENOENT' ? null : `cannot read ${path}: ${(err as Error).message}`,
      });
      if (code === 'ENOENT' && explicit)
        files[files.length - 1] = { path, explicit, parsed: null, error: `${path} does not exist` };
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
