// The environment the service runs with, as `check` and `info` see it: the installed unit's
// Environment= and EnvironmentFile= lines (or the files given with --env-file), read the way systemd
// reads them, then this process's own environment; and where each option's value came from.
import { join } from 'node:path';
import { readEnvironmentFiles } from '../config/env-file.ts';
import type { UnitEnvironment } from '../config/env-file.ts';
import { OPTION_SPECS } from '../config/option-table.ts';
import type { OptionKey, ParsedOptions } from '../config/options.ts';
import type { CheckLine } from './check-report.ts';
import { readInstalledUnit } from './host-view.ts';
import type { UnitRead } from './host-view.ts';

/** `check`'s own arguments (--json, --env-file F …) taken out of argv; the rest are the daemon's options. */
export function splitCheckArgs(argv: readonly string[]): { json: boolean; envFiles: string[]; rest: string[] } {
  const rest: string[] = [];
  const envFiles: string[] = [];
  let json = false;
  for (let i = 0; i < argv.length; i++) {
    const a = argv[i] as string;
    if (a === '--json') json = true;
    // --environment-file is the same option: Node's own --env-file handling, which a single executable
    // still runs, stops the program (exit 9) before it starts when the file is missing.
    else if (a === '--env-file' || a === '--environment-file') {
      const v = argv[i + 1];
      if (v === undefined || v.startsWith('--'))
        throw new Error(`${a} needs a file name, e.g. ${a} /etc/default/gpu-device-plugin`);
      envFiles.push(v);
      i++;
    } else if (a.startsWith('--env-file=') || a.startsWith('--environment-file='))
      envFiles.push(a.slice(a.indexOf('=') + 1));
    else rest.push(a);
  }
  return { json, envFiles, rest };
}

/** The environment the service runs with, as `check` and `info` use it. */
export interface ServiceEnvironment {
  readonly unit: UnitRead;
  readonly envPaths: readonly { path: string; explicit: boolean }[];
  readonly fromFiles: UnitEnvironment;
  /** The unit's Environment=, then its environment files in order, then this process's environment. */
  readonly env: Readonly<Record<string, string | undefined>>;
  /** Option variables set in this process's environment (which the service does not have). */
  readonly shellSet: readonly string[];
}

/**
 * The unit (installed under $SYSTEMD_UNIT_ROOT, default /, else the one we ship) and the environment
 * files it reads — or the files given with --env-file — merged as the service sees them; this process's
 * own environment is applied last, so that a setting tried in the shell is seen (and reported).
 */
export async function serviceEnvironment(
  givenEnvFiles: readonly string[],
  processEnv: Readonly<Record<string, string | undefined>>,
): Promise<ServiceEnvironment> {
  const unitRoot = processEnv.SYSTEMD_UNIT_ROOT || '/';
  const unit = await readInstalledUnit(unitRoot);
  const envPaths =
    givenEnvFiles.length > 0
      ? givenEnvFiles.map((path) => ({ path, explicit: true }))
      : unit.sandbox.environmentFiles.map((f) => ({ path: join(unitRoot, f.path), explicit: !f.optional }));
  const fromFiles = await readEnvironmentFiles(envPaths);
  const env: Record<string, string | undefined> = {};
  for (const e of unit.sandbox.environment) env[e.key] = e.value;
  Object.assign(env, fromFiles.env);
  // The service's $RUNTIME_DIRECTORY (where it publishes its state for `info`) is the unit's RuntimeDirectory=.
  const runtime = unit.sandbox.serviceDirectories.find((d) => d.startsWith('/run/'));
  if (runtime !== undefined) env.RUNTIME_DIRECTORY = runtime;
  const shellSet: string[] = [];
  for (const [k, v] of Object.entries(processEnv)) {
    if (v === undefined) continue;
    env[k] = v;
    if (OPTION_SPECS.some((s) => s.env === k) && v !== '') shellSet.push(k);
  }
  return { unit, envPaths, fromFiles, env, shellSet };
}

/** Whether the environment files could be read and every line in them taken, and what only this shell sets. */
export function environmentChecks(
  fromFiles: UnitEnvironment,
  envPaths: ServiceEnvironment['envPaths'],
  shellSet: readonly string[],
): CheckLine[] {
  const lines: CheckLine[] = [];
  const read = fromFiles.files.filter((f) => f.parsed !== null);
  const envProblems = fromFiles.files.filter((f) => f.error !== null).map((f) => f.error as string);
  const ignoredLines = read.flatMap((f) => (f.parsed?.ignored ?? []).map((x) => `${f.path}:${x.line}: ${x.why}`));
  if (envProblems.length > 0) {
    lines.push({
      status: 'FAIL',
      name: 'environment files',
      detail: envProblems.join('; '),
      fix: 'name an existing file with --env-file, or create it',
      config: true,
    });
  } else if (ignoredLines.length > 0) {
    lines.push({
      status: 'WARN',
      name: 'environment files',
      detail: ignoredLines.join('; '),
      fix: 'write each setting as KEY=VALUE (see /etc/default/gpu-device-plugin)',
    });
  } else {
    const names = read.map((f) => f.path);
    lines.push({
      status: 'PASS',
      name: 'environment files',
      detail:
        names.length === 0
          ? `none of the unit's files exist (${envPaths.map((p) => p.path).join(', ') || 'none named'}); ` +
            `the service runs with the defaults`
          : `read ${names.join(', ')}`,
    });
  }
  if (shellSet.length > 0) {
    lines.push({
      status: 'WARN',
      name: 'shell environment',
      detail: `${shellSet.join(', ')} set in this shell: used by this check, but the service does not see them`,
      fix: 'put them in the environment file the unit reads (see "Effective options")',
    });
  }
  return lines;
}

/** Where each option came from, an environment variable told apart by this shell, an environment file or the unit. */
export function optionOrigins(
  parsed: ParsedOptions,
  fromFiles: UnitEnvironment,
  processEnv: Readonly<Record<string, string | undefined>>,
): Record<OptionKey, string> {
  const origins = {} as Record<OptionKey, string>;
  for (const s of OPTION_SPECS) {
    const origin: string = parsed.origins[s.key];
    const file = fromFiles.source[s.env];
    origins[s.key] =
      origin === 'environment'
        ? processEnv[s.env] !== undefined && processEnv[s.env] !== ''
          ? 'environment of this shell; the service does not see it'
          : file !== undefined
            ? `environment file ${file}`
            : 'unit Environment='
        : origin;
  }
  return origins;
}
