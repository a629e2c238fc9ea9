// Probes of a live systemd unit inside the test container (test/system/container.ts), shared by the
// real-systemd tests (systemd.test.ts, systemd-dra.test.ts, systemd-mps.test.ts): waiting on something the unit did,
// its properties, its journal, its STATUS= line, and the timings a test prints.
import type { TestContext } from 'node:test';
import { waitFor } from '../support/wait.ts';
import type { Container } from './container.ts';

export class LiveUnit {
  /**
   * @param box the booted container (a getter: it boots in the test's before())
   * @param unit the unit's name, e.g. gpu-device-plugin.service
   * @param identifier the SYSLOG_IDENTIFIER of its stdout stream (the program's name)
   * @param alsoJournal unit patterns whose journal is shown beside the unit's when a wait times out (the stand-ins')
   */
  readonly unit: string;
  private readonly box: () => Container;
  private readonly identifier: string;
  private readonly alsoJournal: readonly string[];

  constructor(box: () => Container, unit: string, identifier: string, alsoJournal: readonly string[] = []) {
    this.box = box;
    this.unit = unit;
    this.identifier = identifier;
    this.alsoJournal = alsoJournal;
  }

  /**
   * Resolves with the probe's first value other than undefined, read again whenever something happened
   * in the container (a journal entry, a change in /run). At the deadline the error shows the journals.
   */
  readonly until = <T>(what: string, probe: () => Promise<T | undefined>, timeoutMs = 60000): Promise<NonNullable<T>> =>
    waitFor(probe, {
      on: this.box().onActivity(),
      deadlineMs: timeoutMs,
      what: async () => {
        const units = [this.unit, ...this.alsoJournal].map((u) => `-u '${u}'`).join(' ');
        const journal = await this.box().sh(`journalctl ${units} -o short-precise --no-pager | tail -50`);
        return `${what}\njournal:\n${journal.stdout}`;
      },
    });

  /** `systemctl show` of the unit: the properties asked for. */
  readonly show = async (...props: string[]): Promise<Record<string, string>> => {
    const out = await this.box().run(`systemctl show ${this.unit} ${props.map((p) => `-p ${p}`).join(' ')}`);
    const r: Record<string, string> = {};
    for (const line of out.split('\n')) {
      const i = line.indexOf('=');
      if (i > 0) r[line.slice(0, i)] = line.slice(i + 1);
    }
    return r;
  };

  readonly mainPid = async (): Promise<number> => Number((await this.show('MainPID')).MainPID);

  /** Where the journal ends now: journal(since) reads only what is written after it. */
  readonly journalCursor = async (): Promise<string> => {
    const out = await this.box().run('journalctl -q -n 1 -o cat --show-cursor --no-pager');
    const cursor = out
      .split('\n')
      .reverse()
      .find((l) => l.startsWith('-- cursor: '))
      ?.slice('-- cursor: '.length)
      .trim();
    if (cursor === undefined || cursor === '') throw new Error(`journalctl gave no cursor:\n${out}`);
    return cursor;
  };

  /**
   * The unit's journal, one entry a line (after `since`, a journalCursor(), when given): systemd's
   * lines about the unit (UNIT=), the service's own (_SYSTEMD_UNIT=), and, since journald may not
   * attribute a line written just before the process exited to the unit, its stdout stream's by
   * identifier — but not another unit's that shares the identifier.
   *
   * "After" is judged by the entries' sequence numbers (the cursor's s= and i=), never by counting
   * lines, and not by journalctl's --after-cursor: combined with these OR-ed matches, systemd 252 can
   * leave out the first matching entry after the cursor.
   */
  readonly journal = async (since?: string): Promise<string[]> => {
    const out = await this.box().run(
      `journalctl -q -o json --output-fields=MESSAGE,UNIT,_SYSTEMD_UNIT --no-pager ` +
        `UNIT=${this.unit} + _SYSTEMD_UNIT=${this.unit} + SYSLOG_IDENTIFIER=${this.identifier}`,
    );
    const after = since === undefined ? null : seqnum(since);
    // systemd's own lines name the unit in UNIT= (they come from init.scope); the service's carry it
    // in _SYSTEMD_UNIT=. Another unit's entries with the same identifier (the MPS unit runs the same
    // program and reads the same environment file) are not this unit's; an entry with no unit at all
    // is kept (above).
    return out
      .split('\n')
      .filter((l) => l !== '')
      .map((l) => JSON.parse(l) as { MESSAGE?: unknown; UNIT?: string; _SYSTEMD_UNIT?: string; __CURSOR?: string })
      .filter((e) => after === null || e.__CURSOR === undefined || isAfter(seqnum(e.__CURSOR), after))
      .filter((e) =>
        e.UNIT !== undefined ? e.UNIT === this.unit : e._SYSTEMD_UNIT === undefined || e._SYSTEMD_UNIT === this.unit,
      )
      .map((e) =>
        typeof e.MESSAGE === 'string'
          ? e.MESSAGE
          : Array.isArray(e.MESSAGE)
            ? Buffer.from(e.MESSAGE as number[]).toString('utf8')
            : '',
      );
  };

  /** The unit's StatusText once it matches re. */
  readonly statusIs = (re: RegExp): Promise<string> =>
    this.until(`StatusText matching ${re}`, async () => {
      const s = (await this.show('StatusText')).StatusText ?? '';
      return re.test(s) ? s : undefined;
    });
}

/** A test's timing: shown as its diagnostic and kept in `timings` for the summary the suite prints. */
export function timer(timings: string[], digits = 1): (t: TestContext, what: string, ms: number) => void {
  return (t, what, ms) => {
    const line = `${what}: ${(ms / 1000).toFixed(digits)} s`;
    timings.push(line);
    t.diagnostic(line);
  };
}

/** The sequence-number id and number of a journal cursor (its s= and i= parts). */
function seqnum(cursor: string): { id: string; n: bigint } | null {
  const id = /(?:^|;)s=([0-9a-f]+)/.exec(cursor)?.[1];
  const n = /(?:^|;)i=([0-9a-f]+)/.exec(cursor)?.[1];
  return id === undefined || n === undefined ? null : { id, n: BigInt(`0x${n}`) };
}

/** Whether an entry comes after the mark; one of another sequence (the journal was rotated) is kept. */
function isAfter(entry: { id: string; n: bigint } | null, mark: { id: string; n: bigint } | null): boolean {
  if (entry === null || mark === null || entry.id !== mark.id) return true;
  return entry.n > mark.n;
}
