// What `check` answers: one line per check (PASS, WARN, FAIL, SKIP or INFO, with the fix), then the
// effective options and where each came from, as text or as JSON, and the exit code the lines make.
import { showOption } from '../config/describe-options.ts';
import type { EnvFileRead } from '../config/env-file.ts';
import { OPTION_SPECS } from '../config/option-table.ts';
import type { OptionKey, ParsedOptions } from '../config/options.ts';

/** INFO: not a check, a note (what the other kubelet API mode would need). */
export type CheckStatus = 'PASS' | 'WARN' | 'FAIL' | 'SKIP' | 'INFO';

export interface CheckLine {
  status: CheckStatus;
  name: string;
  detail: string;
  fix?: string;
  /** A failure of the configuration (exit 2), not of the node. */
  config?: boolean;
}

export interface CheckReport {
  lines: CheckLine[];
  parsed: ParsedOptions;
  /** Where each option's value came from, environment files named. */
  origins: Record<OptionKey, string>;
  envFiles: readonly EnvFileRead[];
  unit: { source: string; files: readonly string[] };
}

/** The exit code of a report: 0 nothing failed, 2 the configuration is at fault, 1 otherwise. */
export function checkExitCode(lines: readonly CheckLine[]): number {
  if (lines.some((l) => l.status === 'FAIL' && l.config === true)) return 2;
  return lines.some((l) => l.status === 'FAIL') ? 1 : 0;
}

export function formatChecks(report: CheckReport): string {
  const { lines } = report;
  const width = Math.max(...lines.map((l) => l.name.length));
  const out = lines.map((l) => `${l.status}  ${l.name.padEnd(width)}  ${l.detail}${l.fix ? ` — fix: ${l.fix}` : ''}`);
  out.push('', `Effective options (as the service would run; unit: ${report.unit.source}):`);
  for (const s of OPTION_SPECS) {
    const v = report.parsed.options[s.key];
    out.push(`  --${s.flag}=${showOption(v)}  (${report.origins[s.key]})`);
  }
  const failed = lines.filter((l) => l.status === 'FAIL').length;
  const skipped = lines.filter((l) => l.status === 'SKIP').length;
  const warned = lines.filter((l) => l.status === 'WARN').length;
  const tail = [
    warned > 0 ? `${warned} warning${warned === 1 ? '' : 's'}` : '',
    skipped > 0 ? `${skipped} not checked (SKIP)` : '',
  ]
    .filter((x) => x !== '')
    .join(', ');
  out.push(
    '',
    failed === 0
      ? `All checks passed${tail === '' ? '' : ` (${tail})`}.`
      : `${failed} of ${lines.filter((l) => l.status !== 'INFO').length} ` +
          `checks failed${tail === '' ? '' : `; ${tail}`}.`,
  );
  return `${out.join('\n')}\n`;
}

/**
 * `check --json`: every check (name, status, detail, fix), the effective options with their origins, and the exit code.
 */
export function checksJson(report: CheckReport): string {
  return `${JSON.stringify(
    {
      checks: report.lines.map((l) => ({
        name: l.name,
        status: l.status,
        detail: l.detail,
        ...(l.fix === undefined ? {} : { fix: l.fix }),
        ...(l.config === true ? { configError: true } : {}),
      })),
      options: OPTION_SPECS.map((s) => ({
        flag: s.flag,
        value: report.parsed.options[s.key],
        origin: report.origins[s.key],
      })),
      environmentFiles: report.envFiles.map((f) => ({
        path: f.path,
        read: f.parsed !== null,
        ...(f.error === null ? {} : { error: f.error }),
      })),
      unit: report.unit,
      exitCode: checkExitCode(report.lines),
    },
    null,
    2,
  )}\n`;
}
