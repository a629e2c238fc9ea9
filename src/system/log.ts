// One line per event on stderr: level, message, then key=value context.
// Under journald (JOURNAL_STREAM set) each line starts with a syslog priority prefix so
// `journalctl -p` filters work, and the timestamp is left to the journal.
import { writeSync } from 'node:fs';

export type LogLevel = 'debug' | 'info' | 'warn' | 'error';
export const LOG_LEVELS: readonly LogLevel[] = ['debug', 'info', 'warn', 'error'];

const RANK: Record<LogLevel, number> = { debug: 0, info: 1, warn: 2, error: 3 };
const SYSLOG_PRIORITY: Record<LogLevel, number> = { debug: 7, info: 6, warn: 4, error: 3 };

export type LogValue = string | number | boolean | bigint | null | undefined | readonly string[];
export type LogContext = Readonly<Record<string, LogValue>>;

export interface Logger {
  debug(msg: string, ctx?: LogContext): void;
  info(msg: string, ctx?: LogContext): void;
  warn(msg: string, ctx?: LogContext): void;
  error(msg: string, ctx?: LogContext): void;
  enabled(level: LogLevel): boolean;
  child(ctx: LogContext): Logger;
}

export interface LoggerOptions {
  level: LogLevel;
  journal: boolean;
  write: (line: string) => void;
}

function quote(v: string): string {
  return /^[A-Za-z0-9_.:/@+,=-]+$/.test(v) && v.length > 0 ? v : JSON.stringify(v);
}

export function formatValue(v: LogValue): string {
  if (v === null || v === undefined) return '-';
  if (typeof v === 'string') return quote(v);
  if (Array.isArray(v)) return quote(v.join(','));
  return String(v);
}

export function formatLine(level: LogLevel, msg: string, ctx: LogContext, journal: boolean, now: Date): string {
  let line = journal
    ? `<${SYSLOG_PRIORITY[level]}>${level.toUpperCase()} ${msg}`
    : `${now.toISOString()} ${level.toUpperCase()} ${msg}`;
  for (const [k, v] of Object.entries(ctx)) {
    if (v === undefined) continue;
    line += ` ${k}=${formatValue(v)}`;
  }
  return line.replace(/\n/g, '\\n');
}

export function createLogger(opts: LoggerOptions, base: LogContext = {}): Logger {
  const log = (level: LogLevel, msg: string, ctx?: LogContext): void => {
    if (RANK[level] < RANK[opts.level]) return;
    opts.write(`${formatLine(level, msg, ctx ? { ...base, ...ctx } : base, opts.journal, new Date())}\n`);
  };
  return {
    debug: (m, c) => log('debug', m, c),
    info: (m, c) => log('info', m, c),
    warn: (m, c) => log('warn', m, c),
    error: (m, c) => log('error', m, c),
    enabled: (level) => RANK[level] >= RANK[opts.level],
    child: (ctx) => createLogger(opts, { ...base, ...ctx }),
  };
}

export function stderrLogger(level: LogLevel): Logger {
  // With nowhere left to write (journald or the terminal gone: EPIPE), lines are dropped. Unheard,
  // the write error would be an uncaught exception, whose logging fails again, without end.
  for (const out of [process.stdout, process.stderr]) if (out.listenerCount('error') === 0) out.on('error', () => {});
  return createLogger({
    level,
    journal: process.env.JOURNAL_STREAM !== undefined,
    write: (line) => {
      lastLine = line;
      process.stderr.write(line);
    },
  });
}

/** The last line stderrLogger wrote: what exitProcess makes sure reaches the descriptor. */
let lastLine = '';

/**
 * Ends the process with `code`. On Linux, stderr to journald is a socket written without blocking:
 * while journald does not read, lines queue inside the process, and process.exit drops the queue —
 * with it the last line, which says why the process ends (measured: 3000 unread lines, the last one
 * lost). So when stderr has a queue, that last line is written again straight to the descriptor,
 * retrying a full socket for at most 1 s (the process is ending: blocking is harmless now). Lines
 * queued before it may still be lost; the one that matters is not.
 */
export function exitProcess(code: number): never {
  if (process.stderr.writableLength > 0 && lastLine !== '') writeRetrying(2, lastLine, 1000);
  return process.exit(code);
}

function writeRetrying(fd: number, text: string, limitMs: number): void {
  let rest = Buffer.from(text);
  const end = performance.now() + limitMs;
  const pause = new Int32Array(new SharedArrayBuffer(4));
  while (rest.length > 0) {
    try {
      rest = rest.subarray(writeSync(fd, rest));
    } catch (err) {
      if ((err as NodeJS.ErrnoException).code !== 'EAGAIN' || performance.now() > end) return;
      Atomics.wait(pause, 0, 0, 5);
    }
  }
}

/** Text of an unknown thrown value, with its cause chain. */
export function errorText(err: unknown): string {
  if (err instanceof Error) {
    const cause = err.cause === undefined ? '' : `: ${errorText(err.cause)}`;
    return err.message + cause;
  }
  return String(err);
}

/**
 * An error or rejection nobody caught is logged and the daemon carries on (it must not lose its registration over one).
 */
export function carryOnAfterUnexpected(log: Logger): void {
  process.on('uncaughtException', (err) =>
    log.error('unexpected error; carrying on', { error: errorText(err), stack: err.stack?.split('\n')[1]?.trim() }),
  );
  process.on('unhandledRejection', (err) => log.error('unexpected rejection; carrying on', { error: errorText(err) }));
}
