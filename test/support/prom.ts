// Reading Prometheus text exposition files back in tests, and linting them with promtool (Debian
// package prometheus, installed by build/install-tools.sh). A missing promtool fails loudly.
import { spawnSync } from 'node:child_process';

/** Sample (as written, labels included) → value. */
export function parseSamples(text: string): Map<string, number> {
  const out = new Map<string, number>();
  for (const line of text.split('\n')) {
    if (line === '' || line.startsWith('#')) continue;
    const at = line.lastIndexOf(' ');
    out.set(line.slice(0, at), Number(line.slice(at + 1)));
  }
  return out;
}

/** `promtool check metrics` on the text: its complaints, or '' when clean. Throws when promtool is missing. */
export function promtoolProblems(text: string): string {
  const r = spawnSync('promtool', ['check', 'metrics'], { input: text, encoding: 'utf8' });
  if (r.error !== undefined)
    throw new Error(
      `promtool cannot run (${r.error.message}); build/install-tools.sh installs it (Debian package prometheus)`,
    );
  return r.status === 0 ? '' : `${r.stdout}${r.stderr}`.trim() || `promtool exited ${r.status}`;
}
