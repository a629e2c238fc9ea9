// The journals of a failed real-systemd test, kept: when a test fails (or a boot's install does, or a describe
// block's set-up fails before any test ran), the status and journal of the package's units and of the test's
// stand-in units, and the whole boot's journal, are read from the container before it goes, written to a file
// that outlives the test's folder, and the units' last lines printed with the failure, so a CI log shows why.
// Every test file under test/system calls journalOnFailure() in its describe block, before its own hooks.
import { writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { after, afterEach } from 'node:test';
import type { Container } from './container.ts';

/** The package's units: the plugin and the MPS unit (the DRA sharing agent). */
export const PACKAGE_UNITS = ['gpu-device-plugin.service', 'gpu-device-plugin-mps.service'] as const;
/** Lines of the units' journal printed with the failure (the file has all of it). */
const SHOWN_LINES = 200;

/** One part of what is kept: its title, the command run in the container, and what it printed. */
interface Section {
  title: string;
  cmd: string;
  text: string;
}

/**
 * The units' status and journal, then the whole boot's journal. `standIns` are the test's own units (names or
 * journalctl/systemctl globs, e.g. `kubelet-standin*`): their lines come interleaved with the package's.
 */
export async function journalsOf(c: Container, standIns: readonly string[] = []): Promise<Section[]> {
  const units = [...PACKAGE_UNITS, ...standIns].map((u) => `'${u}'`);
  const parts: (readonly [string, string])[] = [
    ['systemctl status', `systemctl --no-pager --full status ${units.join(' ')}`],
    ['failed units', 'systemctl --no-pager --failed --no-legend --plain'],
    ["the units' journal", `journalctl --no-pager -b -o short-precise ${units.map((u) => `-u ${u}`).join(' ')}`],
    ['the whole boot', 'journalctl --no-pager -b -o short-precise'],
  ];
  const out: Section[] = [];
  for (const [title, cmd] of parts) {
    const r = await c.sh(cmd, { timeoutMs: 30000 }).catch((err: unknown) => ({ stdout: '', stderr: String(err) }));
    out.push({ title, cmd, text: `${r.stdout}${r.stderr}` });
  }
  return out;
}

/** Writes the journals to a kept file and prints the units' last lines; what `what` failed is named. */
export async function keepJournals(c: Container, what: string, standIns: readonly string[] = []): Promise<string> {
  const sections = await journalsOf(c, standIns).catch((err: unknown): Section[] => [
    { title: "cannot read the container's journal", cmd: '', text: String(err) },
  ]);
  const safe = what.replace(/[^A-Za-z0-9-]+/g, '-').slice(0, 80);
  const file = join(tmpdir(), `gdp-journal-${safe}-${process.pid}-${Date.now()}.log`);
  writeFileSync(file, sections.map((s) => `==== ${s.title}: ${s.cmd}\n${s.text}`).join('\n'));
  const shown = sections.find((s) => s.title === "the units' journal") ?? sections[0];
  const lines = (shown?.text ?? '').trimEnd().split('\n');
  process.stderr.write(
    `\n---- ${what} failed: the last ${Math.min(SHOWN_LINES, lines.length)} lines of the journal of ` +
      `${[...PACKAGE_UNITS, ...standIns].join(', ')} (everything, the units' status and the whole boot's journal ` +
      `too, in ${file}) ----\n${lines.slice(-SHOWN_LINES).join('\n')}\n---- end of the journal ----\n`,
  );
  return file;
}

/**
 * In a describe block, before its own hooks: after each test that failed, the container's journals kept and
 * shown. A failed `before` cancels every test without an afterEach, so when the block ends with no test having
 * run and a container booted, its set-up failed and the journals are kept then, before the teardown hook runs.
 */
export function journalOnFailure(container: () => Container | undefined, standIns: readonly string[] = []): void {
  let ran = 0;
  afterEach(async (t) => {
    ran++;
    const c = container();
    if (t.passed || c === undefined) return;
    await keepJournals(c, `the test "${t.name}"`, standIns);
  });
  after(async () => {
    const c = container();
    if (ran > 0 || c === undefined) return;
    await keepJournals(c, "the describe block's set-up (no test ran)", standIns);
  });
}
