// Resolves every option from the command line, the environment, the config file and the defaults, in
// that order of precedence, and checks the result (MPS's and --kubelet-api=dra's rules) before any GPU
// is looked at.
import { hostname } from 'node:os';
import { mpsOptionsProblem } from '../core/mps.ts';
import { NO_SHARING } from '../core/sharing.ts';
import { readConfigFile } from './config.ts';
import type { ConfigFileValues, ConfigSchema } from './config.ts';
import type { ConfigShape } from './config-reader.ts';
import { ConfigError, OptionError } from './errors.ts';
import { checkKubeletApi } from './kubelet-api.ts';
import { OPTION_SPECS } from './option-table.ts';
import { convert } from './option-value.ts';
import type { Value } from './option-value.ts';
import type { OptionKey, OptionSpec, Options, Origin, ParsedOptions, UnsupportedOption } from './options.ts';
import { UNSUPPORTED_OPTIONS, isInert, refuseUnsupported, refuseUnsupportedEnv } from './unsupported-options.ts';

export interface ParseDeps {
  /** Reads the config file (default: the file system). */
  readFile?: (path: string) => string;
  /** The host name, the default of --node-name (default: os.hostname()). */
  hostname?: () => string;
}

/** Keys of NVIDIA's config file read by GPU feature discovery, not by a device plugin. */
const GFD_KEYS = ['flags.gfd', 'flags.useNodeFeatureAPI'];

function shapeOf(spec: OptionSpec): ConfigShape {
  switch (spec.kind.type) {
    case 'bool':
      return 'bool';
    case 'seconds':
    case 'count':
    case 'bytes':
      return 'number';
    case 'ids':
      return 'ints';
    case 'enum':
      return spec.kind.multiple === true ? 'strings' : 'string';
    case 'string':
      return 'string';
  }
}

/** The config file's keys, from the option table and the refused options. */
export const CONFIG_SCHEMA: ConfigSchema<OptionKey> = {
  options: OPTION_SPECS.flatMap((s) =>
    s.config === undefined ? [] : [{ path: s.config, key: s.key, shape: shapeOf(s) }],
  ),
  unsupported: UNSUPPORTED_OPTIONS.flatMap((u) =>
    u.config === null
      ? []
      : [
          {
            path: u.config,
            shape: u.bool ? ('bool' as const) : ('string' as const),
            flag: u.flag,
            inert: (raw: string) => isInert(u, raw),
            reason: u.reason,
          },
        ],
  ),
  foreign: GFD_KEYS.map((path) => ({ path, reader: 'GPU feature discovery' })),
};

/** The options and refused options by every flag name and alias they answer to. */
type FlagIndex = { byFlag: Map<string, OptionSpec>; unsupportedByFlag: Map<string, UnsupportedOption> };

function indexFlags(): FlagIndex {
  const byFlag = new Map<string, OptionSpec>();
  for (const s of OPTION_SPECS) {
    byFlag.set(s.flag, s);
    for (const a of s.aliases ?? []) byFlag.set(a, s);
  }
  const unsupportedByFlag = new Map<string, UnsupportedOption>();
  for (const u of UNSUPPORTED_OPTIONS) for (const f of [u.flag, ...u.aliases]) unsupportedByFlag.set(f, u);
  return { byFlag, unsupportedByFlag };
}

/**
 * The command line's option values by key (`--name value`, `--name=value`, bare `--bool-flag`);
 * refused options are checked and skipped. A list flag may be repeated, adding to the list.
 */
function readFlags(argv: readonly string[], index: FlagIndex): Map<OptionKey, Value> {
  const fromFlags = new Map<OptionKey, Value>();
  for (let i = 0; i < argv.length; i++) {
    const arg = argv[i] ?? '';
    if (arg === 'info' || arg === 'check') {
      throw new OptionError(
        (
          `the subcommand ${arg} goes first, before its options: ` +
          `gpu-device-plugin ${arg} ${argv.filter((_, j) => j !== i).join(' ')}`
        ).trimEnd(),
      );
    }
    if (!arg.startsWith('--'))
      throw new OptionError(
        `unexpected argument ${JSON.stringify(arg)}; options are written --name=value (see --help)`,
      );
    const eq = arg.indexOf('=');
    const name = arg.slice(2, eq < 0 ? undefined : eq);
    const spec = index.byFlag.get(name);
    const unsupported = index.unsupportedByFlag.get(name);
    if (spec === undefined && unsupported === undefined)
      throw new OptionError(`unknown option --${name}; see --help for the options this plugin has`);
    const isBool = spec === undefined ? unsupported?.bool === true : spec.kind.type === 'bool';
    let raw: string;
    if (eq >= 0) raw = arg.slice(eq + 1);
    else if (isBool && (argv[i + 1] === undefined || argv[i + 1]?.startsWith('--'))) raw = 'true';
    else {
      const next = argv[i + 1];
      if (next === undefined) throw new OptionError(`--${name} needs a value`);
      raw = next;
      i++;
    }
    if (spec === undefined) {
      if (unsupported !== undefined) refuseUnsupported(unsupported, raw, `--${name}`);
      continue;
    }
    addFlagValue(fromFlags, spec, convert(spec, raw, `--${name}`), name);
  }
  return fromFlags;
}

/** Records a flag's value; a list flag may be repeated (as NVIDIA's), adding to the list; any other only once. */
function addFlagValue(fromFlags: Map<OptionKey, Value>, spec: OptionSpec, value: Value, name: string): void {
  const earlier = fromFlags.get(spec.key);
  if (earlier !== undefined) {
    if (Array.isArray(earlier) && Array.isArray(value))
      fromFlags.set(spec.key, [...new Set([...(earlier as string[]), ...(value as string[])])]);
    else throw new OptionError(`--${name} is given more than once`);
  } else fromFlags.set(spec.key, value);
}

/** Reads the config file, named on the command line or in the environment (never in itself); undefined without one. */
function readNamedConfigFile(
  fromFlags: ReadonlyMap<OptionKey, Value>,
  env: Readonly<Record<string, string | undefined>>,
  deps: ParseDeps,
): ConfigFileValues<OptionKey> | undefined {
  const fileSpec = OPTION_SPECS.find((s) => s.key === 'configFile') as OptionSpec;
  let configFile: string | null = null;
  const flagFile = fromFlags.get('configFile');
  const envFile = env[fileSpec.env];
  if (typeof flagFile === 'string') configFile = flagFile;
  else if (envFile !== undefined && envFile !== '')
    configFile = convert(fileSpec, envFile, `environment variable ${fileSpec.env}`) as string;
  return configFile === null ? undefined : readConfigFile(configFile, CONFIG_SCHEMA, deps.readFile);
}

/**
 * One option's value (undefined: none, no default) and where it came from: command line, environment, config
 * file, default.
 */
function resolveOne(
  spec: OptionSpec,
  fromFlags: ReadonlyMap<OptionKey, Value>,
  env: Readonly<Record<string, string | undefined>>,
  file: ConfigFileValues<OptionKey> | undefined,
): { value: Value | undefined; origin: Origin } {
  const flagValue = fromFlags.get(spec.key);
  const envValue = env[spec.env];
  const fileValue = file?.values.get(spec.key);
  if (flagValue !== undefined) return { value: flagValue, origin: 'command line' };
  if (envValue !== undefined && envValue !== '') {
    return { value: convert(spec, envValue, `environment variable ${spec.env}`), origin: 'environment' };
  }
  if (file !== undefined && fileValue !== undefined) {
    try {
      return {
        value: convert(spec, fileValue.raw, `config file ${file.file}: ${fileValue.path}`),
        origin: `config file ${file.file}`,
      };
    } catch (err) {
      throw err instanceof OptionError ? new ConfigError(err.message) : err;
    }
  }
  if (spec.default !== null)
    return { value: convert(spec, spec.default, `default of --${spec.flag}`), origin: 'default' };
  return { value: undefined, origin: 'default' };
}

/**
 * Resolves every option: flags (`--name value`, `--name=value`, bare `--bool-flag`), then env vars,
 * then the config file named by --config-file or CONFIG_FILE (read here), then defaults.
 * Throws OptionError (ConfigError for the file) naming the flag, variable or key path at fault.
 */
export function parseOptions(
  argv: readonly string[],
  env: Readonly<Record<string, string | undefined>>,
  deps: ParseDeps = {},
): ParsedOptions {
  const fromFlags = readFlags(argv, indexFlags());
  refuseUnsupportedEnv(env);
  const file = readNamedConfigFile(fromFlags, env, deps);

  const values: Partial<Record<OptionKey, Value | null>> = {};
  const origins = {} as Record<OptionKey, Origin>;
  for (const spec of OPTION_SPECS) {
    const { value, origin } = resolveOne(spec, fromFlags, env, file);
    if (value !== undefined) values[spec.key] = value;
    origins[spec.key] = origin;
  }
  if (values.devRoot === undefined) values.devRoot = values.driverRoot ?? '/';
  if (values.configFile === undefined) values.configFile = null;
  if (values.nfdFeaturesFile === undefined) values.nfdFeaturesFile = null;
  if (values.metricsFile === undefined) values.metricsFile = null;
  if (values.kubeconfig === undefined) values.kubeconfig = null;
  if (values.draMpsShmTotal === undefined) values.draMpsShmTotal = null;
  if (values.nodeName === undefined) values.nodeName = (deps.hostname ?? hostname)().toLowerCase();
  const options = values as Options;
  const sharing = file?.sharing ?? NO_SHARING;
  // MPS's refusals that need no GPU (NVIDIA's validateFlags): checked here, before NVML, exit 2.
  const mps = mpsOptionsProblem(sharing, options);
  if (mps !== null) {
    if (mps.key.startsWith('sharing.') && file !== undefined)
      throw new ConfigError(`config file ${file.file}: ${mps.key}: ${mps.message}`);
    throw new OptionError(`${mps.key}: ${mps.message}`);
  }
  const parsed: ParsedOptions = {
    options,
    origins,
    sharing,
    foreignConfigKeys: file?.foreign ?? [],
    ...(file?.health === undefined ? {} : { signalPolicy: file.health }),
    ...(file?.consumableCapacity === undefined ? {} : { consumableCapacity: file.consumableCapacity }),
    ...(file?.dynamicMig === undefined ? {} : { dynamicMig: file.dynamicMig }),
  };
  checkKubeletApi(parsed);
  return parsed;
}
