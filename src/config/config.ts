// The config file (--config-file, CONFIG_FILE): NVIDIA's v1 format, YAML or JSON, so that one file
// serves NVIDIA's plugin and this one. `version: v1`; `flags:` holds options in camelCase with
// NVIDIA's nesting (plugin-only ones under `flags.plugin`); `sharing.timeSlicing` configures
// time-slicing and `sharing.mps` MPS (same shape; one or the other); this project's own sections are
// `health` (health-signals.ts) and `dra` (dra-section.ts). Everything is checked: an unknown
// key, a wrong type or a bad value is refused with the key path, the value given and what is allowed.
// YAML is read as YAML 1.1, as NVIDIA's Go parser reads it (`yes`/`no`/`on`/`off` are booleans); JSON
// is YAML too.
//
// This module reads the file (bounded) and knows its structure; the sharing section is
// config-sharing.ts's. Which `flags` keys exist and what they mean comes from the option table,
// passed in as a ConfigSchema (so this module never imports the options; K is the option key type the
// schema names).
import { closeSync, constants as fsConstants, fstatSync, openSync, readSync } from 'node:fs';
import type { Stats } from 'node:fs';
import { createRequire } from 'node:module';
import type * as Yaml from 'yaml';
import type { ConsumableCapacity } from '../core/dra-capacity.ts';
import type { SignalPolicy } from '../core/health-signals.ts';
import { NO_SHARING } from '../core/sharing.ts';
import type { Sharing } from '../core/sharing.ts';
import { Reader, childKeys, isMap, join, showValue } from './config-reader.ts';
import type { ConfigShape, Json } from './config-reader.ts';
import { patternResources, sharingSection } from './config-sharing.ts';
import { draSection } from './dra-section.ts';
import { parseHealthSection } from './health-signals.ts';
import { ConfigError } from './errors.ts';

/**
 * The YAML parser, loaded on first use: most starts have no config file, and evaluating the package
 * costs a few milliseconds. In the bundle `require('yaml')` is esbuild's lazily run module wrapper;
 * from the sources (ES modules, no `require`) it is a require from this file's place.
 */
let yaml: typeof Yaml | undefined;
export function loadYaml(): typeof Yaml {
  yaml ??=
    typeof require === 'function'
      ? (require('yaml') as typeof Yaml)
      : (createRequire(import.meta.url)('yaml') as typeof Yaml);
  return yaml;
}

export interface ConfigOptionKey<K extends string = string> {
  /** Key path in the file, e.g. flags.plugin.passDeviceSpecs. */
  readonly path: string;
  readonly key: K;
  readonly shape: ConfigShape;
}

export interface ConfigUnsupportedKey {
  readonly path: string;
  readonly shape: ConfigShape;
  /** The flag of NVIDIA's plugin it is the file form of. */
  readonly flag: string;
  /** Whether a value asks for nothing this plugin lacks (e.g. gdsEnabled: false). */
  inert(raw: string): boolean;
  readonly reason: string;
}

export interface ConfigSchema<K extends string = string> {
  readonly options: readonly ConfigOptionKey<K>[];
  readonly unsupported: readonly ConfigUnsupportedKey[];
  /** Keys meant for another program (GPU feature discovery): accepted, not used. */
  readonly foreign: readonly { readonly path: string; readonly reader: string }[];
}

export interface ConfigValue {
  /** The value as text, for the option's own check. */
  readonly raw: string;
  /** Where it was written: the key path. */
  readonly path: string;
}

export interface ConfigFileValues<K extends string = string> {
  readonly file: string;
  readonly values: ReadonlyMap<K, ConfigValue>;
  readonly sharing: Sharing;
  /** Key paths present but read by another program (see ConfigSchema.foreign). */
  readonly foreign: readonly string[];
  /** The `health` section (this project's own, not NVIDIA's), when the file has one. */
  readonly health?: SignalPolicy;
  /** The `dra` section's consumable capacity (this project's own), when the file sets one. */
  readonly consumableCapacity?: ConsumableCapacity;
  /** The `dra` section's dynamicMig, when the file sets it. */
  readonly dynamicMig?: boolean;
}

/** The one YAML (or JSON) document of a config file as plain data; null for an empty file. */
function parseDocument(text: string, file: string): Json {
  const docs = loadYaml().parseAllDocuments(text, { version: '1.1', uniqueKeys: true, prettyErrors: true });
  if (!Array.isArray(docs)) throw new ConfigError(`config file ${file}: not a YAML or JSON document`);
  if (docs.length > 1) throw new ConfigError(`config file ${file}: holds ${docs.length} YAML documents; expected one`);
  const doc = docs[0];
  if (doc !== undefined) {
    const problem = doc.errors[0];
    if (problem !== undefined) {
      const pos = problem.linePos?.[0];
      const where = pos === undefined ? '' : ` (line ${pos.line}, column ${pos.col})`;
      const first = (problem.message.split('\n')[0] ?? '').replace(/ at line \d+, column \d+:?$/, '');
      throw new ConfigError(`config file ${file}: not valid YAML or JSON${where}: ${first}`);
    }
  }
  try {
    return (doc === undefined ? null : doc.toJS({ maxAliasCount: 100 })) as Json;
  } catch (err) {
    throw new ConfigError(`config file ${file}: cannot be read as data: ${(err as Error).message}`);
  }
}

/**
 * The option keys under `flags` and `imex`: each leaf the schema names is an option's value, a refused
 * option of NVIDIA's (unless inert) or a key meant for another program; anything else is refused.
 */
function optionKeys<K extends string>(
  r: Reader,
  top: Record<string, unknown>,
  schema: ConfigSchema<K>,
): { values: Map<K, ConfigValue>; foreign: string[] } {
  const values = new Map<K, ConfigValue>();
  const foreign: string[] = [];
  const leafPaths = [
    ...schema.options.map((o) => o.path),
    ...schema.unsupported.map((u) => u.path),
    ...schema.foreign.map((f) => f.path),
  ];
  const walk = (obj: Record<string, unknown>, prefix: string): void => {
    r.keys(obj, prefix, childKeys(leafPaths, prefix));
    for (const [k, v] of Object.entries(obj)) {
      const path = join(prefix, k);
      const option = schema.options.find((o) => o.path === path);
      const unsupported = schema.unsupported.find((u) => u.path === path);
      const other = schema.foreign.find((f) => f.path === path);
      if (option !== undefined) {
        const raw = r.shaped(v, path, option.shape);
        if (raw !== null) values.set(option.key, { raw, path });
      } else if (unsupported !== undefined) {
        const raw = r.shaped(v, path, unsupported.shape);
        if (raw !== null && !unsupported.inert(raw)) {
          r.fail(path, `${showValue(v)}: not supported (NVIDIA's --${unsupported.flag}): ${unsupported.reason}`);
        }
      } else if (other !== undefined) {
        if (v !== null && v !== undefined) foreign.push(path);
      } else {
        const m = r.mapping(v, path);
        if (m !== null) walk(m, path);
      }
    }
  };
  const flags = r.mapping(top.flags, 'flags');
  if (flags !== null) walk(flags, 'flags');
  const imex = r.mapping(top.imex, 'imex');
  if (imex !== null) walk(imex, 'imex');
  return { values, foreign };
}

/** Parses and checks the text of a config file. `file` names it in messages. */
function parseConfigText<K extends string>(text: string, file: string, schema: ConfigSchema<K>): ConfigFileValues<K> {
  const r: Reader = new Reader(file);
  const top = parseDocument(text, file);
  if (top === null) return { file, values: new Map<K, ConfigValue>(), sharing: NO_SHARING, foreign: [] };
  if (!isMap(top))
    r.fail('(top level)', `${showValue(top)} is not allowed; expected a mapping with version, flags and sharing`);
  r.keys(top, '', ['version', 'flags', 'sharing', 'resources', 'imex', 'health', 'dra']);
  const version = top.version;
  if (version !== undefined && version !== null && version !== 'v1') {
    r.fail('version', `${showValue(version)} is not allowed; expected v1`);
  }
  const { values, foreign } = optionKeys(r, top, schema);
  patternResources(r, top.resources);
  const sharing = sharingSection(r, top.sharing);
  const health =
    top.health === undefined || top.health === null
      ? {}
      : { health: parseHealthSection(top.health, (path, message) => r.fail(path, message)) };
  const dra = draSection(r, top.dra);
  return {
    file,
    values,
    sharing,
    foreign,
    ...health,
    ...(dra.consumableCapacity === undefined ? {} : { consumableCapacity: dra.consumableCapacity }),
    ...(dra.dynamicMig === undefined ? {} : { dynamicMig: dra.dynamicMig }),
  };
}

/** The largest config file read: NVIDIA's files are a few hundred bytes; 1 MiB is far beyond any real one. */
const MAX_CONFIG_BYTES = 1024 * 1024;

const FILE_TYPES: readonly [(s: Stats) => boolean, string][] = [
  [(s) => s.isDirectory(), 'a directory'],
  [(s) => s.isCharacterDevice(), 'a character device'],
  [(s) => s.isBlockDevice(), 'a block device'],
  [(s) => s.isFIFO(), 'a FIFO'],
  [(s) => s.isSocket(), 'a socket'],
];

/** Refused before reading: anything but a regular file, or one over MAX_CONFIG_BYTES. */
class NotAConfigFile extends Error {}

/**
 * Reads a config file only if it is a regular file of at most MAX_CONFIG_BYTES: opened without
 * blocking (a FIFO would wait for a writer), checked with fstat on the open file (no race with a
 * rename), and read to one byte past the limit at most (a file growing meanwhile is refused too).
 */
function readBounded(file: string): string {
  const fd = openSync(file, fsConstants.O_RDONLY | fsConstants.O_NONBLOCK | fsConstants.O_NOCTTY);
  try {
    const st = fstatSync(fd);
    if (!st.isFile()) throw new NotAConfigFile(`is ${FILE_TYPES.find(([is]) => is(st))?.[1] ?? 'not a regular file'}`);
    if (st.size > MAX_CONFIG_BYTES) throw new NotAConfigFile(`is ${st.size} bytes`);
    const buf = Buffer.allocUnsafe(MAX_CONFIG_BYTES + 1);
    let n = 0;
    for (let r = 1; r > 0 && n < buf.length; n += r) r = readSync(fd, buf, n, buf.length - n, null);
    if (n > MAX_CONFIG_BYTES) throw new NotAConfigFile(`grew past ${MAX_CONFIG_BYTES} bytes while being read`);
    return buf.toString('utf8', 0, n);
  } finally {
    closeSync(fd);
  }
}

/** Reads and checks a config file (by default from the file system, a regular file of at most 1 MiB). */
export function readConfigFile<K extends string>(
  file: string,
  schema: ConfigSchema<K>,
  read: (path: string) => string = readBounded,
): ConfigFileValues<K> {
  let text: string;
  try {
    text = read(file);
  } catch (err) {
    if (err instanceof NotAConfigFile) {
      throw new ConfigError(
        `config file ${file} ${err.message}; expected a regular file of at most ` +
          `1 MiB (${MAX_CONFIG_BYTES} bytes); check --config-file (CONFIG_FILE)`,
      );
    }
    const e = err as NodeJS.ErrnoException;
    const why =
      e.code === 'ENOENT'
        ? 'does not exist'
        : e.code === 'EACCES'
          ? 'cannot be read (permission denied)'
          : e.code === 'EISDIR'
            ? 'is a directory'
            : `cannot be read: ${e.message}`;
    throw new ConfigError(`config file ${file} ${why}; check --config-file (CONFIG_FILE)`);
  }
  return parseConfigText(text, file, schema);
}
