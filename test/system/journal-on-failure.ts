// The journals of a failed real-systemd test, kept: when a test fails (or a boot's install does), the package's
// units' status and journal and the whole boot's journal are read from the container before it goes, written
// to a file that outlives the test's folder, and the units' last lines printed with the failure, so a CI log
// shows why. Every test file under test/system calls journalOnFailure() in its describe block.
import { writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterEach } from 'node:test';
import type { Container } from './container.ts';

/** The package's units: the plugin and the MPS unit (the DRA sharing agent). */
export const PACKAGE_UNITS = ['gpu-device-plugin.service', 'gpu-device-plugin-mps.service'] as const;
/** Lines of the units' journal printed with the failure (the file has all of it). */
const SHOWN_LINES = 200;

/** The units' status and journal, then the whole boot's journal, as one text. */
export async function journalsOf(c: Container): Promise<string> {
  const units = PACKAGE_UNITS.join(' ');
  const parts: (readonly [string, string])[] = [
    ['systemctl status', `systemctl --no-pager --full status ${units}`],
    ['failed units', 'systemctl --no-pager --failed --no-legend --plain'],
    [
      "the package's units",
      `journalctl --no-pager -b -o short-precise ${PACKAGE_UNITS.map((u) => `-u ${u}`).join(' ')}`,
    ],
    ['the whole boot', 'journalctl --no-pager -b -o short-precise'],
  ];
  const out: string[] = [];
  for (const [title, cmd] of parts) {
    const r = await c.sh(cmd, { timeoutMs: 30000 }).catch((err: unknown) => ({ stdout: '', stderr: String(err) }));
    out.push(`==== ${title}: ${cmd}\n${r.stdout}${r.stderr}`);
  }
  return out.join('\n');
}

/** Writes the journals to a kept file and prints the package units' last lines; what `what` failed is named. */
export async function keepJournals(c: Container, what: string): Promise<string> {
  const text = await journalsOf(c).catch((err: unknown) => `cannot read the container's journal: ${String(err)}`);
  const safe = what.replace(/[^A-Za-z0-9-]+/g, '-').slice(0, 80);
  const file = join(tmpdir(), `gdp-journal-${safe}-${process.pid}-${Date.now()}.log`);
  writeFileSync(file, text);
  const units = text.split('==== ')[3] ?? text;
  const lines = units.trimEnd().split('\n');
  process.stderr.write(
    `\n---- ${what} failed: the last ${Math.min(SHOWN_LINES, lines.length)} lines of the package's units' ` +
      `journal (everything, the whole boot's journal too, in ${file}) ----\n` +
      `${lines.slice(-SHOWN_LINES).join('\n')}\n---- end of the journal ----\n`,
  );
  return file;
}

/** In a describe block: after each test that failed, the container's journals kept and shown. */
export function journalOnFailure(container: () => Container | undefined): void {
  afterEach(async (t) => {
    const c = container();
    if (t.passed || c === undefined) return;
    await keepJournals(c, `the test "${t.name}"`);
  });
}
