// The config file (--config-file, CONFIG_FILE): NVIDIA's v1 format, YAML or JSON, so that one file
// serves NVIDIA's plugin and this one. `version: v1`; `flags:` holds options in camelCase with
// NVIDIA's nesting (plugin-only ones under `flags.plugin`); `sharing.timeSlicing` configures
// time-slicing and `sharing.mps` MPS (same shape; one or the other). Everything is checked: an unknown key, a wrong type or a bad value is refused with
// the key path, the value given and what is allowed. YAML is read as YAML 1.1, as NVIDIA's Go parser
// reads it (`yes`/`no`/`on`/`off` are booleans); JSON is YAML too.
//
// This module knows the file's structure and the sharing section; which `flags` keys exist and what
// they mean comes from the option table in options.ts, passed in as a ConfigSchema (so this module
// never imports options.ts; K is the option key type the schema names).
import { closeSync, constants as fsConstants, fstatSync, openSync, readSync } from 'node:fs';
import type { Stats } from 'node:fs';
import { createRequire } from 'node:module';
import type * as Yaml from 'yaml';
import { MPS_CLIENTS_FROM_VOLTA } from '../core/mps.ts';
import { GPU_RESOURCE, MAX_REPLICAS, NO_SHARING, qualifyResourceName } from '../core/sharing.ts';
import type { DeviceSelection, GpuRef, Sharing, TimeSlicedResource, TimeSlicing } from '../core/sharing.ts';

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

/** A bad option, environment variable or config file entry; the message names it. */
export class OptionError extends Error {
  override name = 'OptionError';
}

/** A problem with the config file; the message starts with `config file <path>:` and the key path. */
export class ConfigError extends OptionError {
  override name = 'ConfigError';
}

/** Shapes a value in the file may take; values are handed on as text for the option's own check. */
export type ConfigShape =
  | 'bool' // true or false
  | 'string' // a string
  | 'strings' // a string or a list of strings (joined with commas)
  | 'number' // a number, or a string such as "5s"
  | 'ints'; // a list of integers (joined with commas)

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
}

type Json = null | boolean | number | string | Json[] | { [k: string]: Json };

function isMap(v: unknown): v is Record<string, unknown> {
  return typeof v === 'object' && v !== null && !Array.isArray(v) && !(v instanceof Date);
}

/** A value as shown in a message: `"abc"`, `3`, `true`, `a list`, `a mapping`, `null`. */
export function showValue(v: unknown): string {
  if (v === null || v === undefined) return 'null';
  if (typeof v === 'string') return JSON.stringify(v.length > 80 ? `${v.slice(0, 77)}...` : v);
  if (typeof v === 'number' || typeof v === 'boolean') return String(v);
  if (Array.isArray(v)) return `a list (${v.length} items)`;
  if (v instanceof Date) return `the date ${v.toISOString().slice(0, 10)}`;
  if (isMap(v)) return 'a mapping';
  return typeof v;
}

const SHAPE_WANTED: Record<ConfigShape, string> = {
  bool: 'true or false',
  string: 'a string',
  strings: 'a string or a list of strings',
  number: 'a number',
  ints: 'a list of integers',
};

class Reader {
  readonly file: string;
  constructor(file: string) {
    this.file = file;
  }

  fail(path: string, message: string): never {
    throw new ConfigError(`config file ${this.file}: ${path}: ${message}`);
  }

  /** Refuses keys not in `allowed`, naming the first unknown one and the keys allowed there. */
  keys(obj: Record<string, unknown>, prefix: string, allowed: readonly string[]): void {
    for (const k of Object.keys(obj)) {
      if (!allowed.includes(k)) {
        const near = allowed.find((a) => a.toLowerCase() === k.toLowerCase());
        const hint = near === undefined ? '' : ` (did you mean ${near}? keys are case-sensitive)`;
        this.fail(join(prefix, k), `unknown key${hint}; expected one of ${allowed.join(', ')}`);
      }
    }
  }

  mapping(v: unknown, path: string): Record<string, unknown> | null {
    if (v === null || v === undefined) return null;
    if (!isMap(v)) this.fail(path, `${showValue(v)} is not allowed; expected a mapping of keys to values`);
    return v;
  }

  /** The value as text in the given shape, or null for null (not set). */
  shaped(v: unknown, path: string, shape: ConfigShape): string | null {
    if (v === null || v === undefined) return null;
    const wrong = (): never => this.fail(path, `${showValue(v)} is not allowed; expected ${SHAPE_WANTED[shape]}`);
    switch (shape) {
      case 'bool':
        return typeof v === 'boolean' ? String(v) : wrong();
      case 'string':
        return typeof v === 'string' ? v : wrong();
      case 'strings':
        if (typeof v === 'string') return v;
        if (!Array.isArray(v)) return wrong();
        v.forEach((item, i) => {
          if (typeof item !== 'string')
            this.fail(`${path}[${i}]`, `${showValue(item)} is not allowed; expected a string`);
        });
        if (v.length === 0) this.fail(path, 'an empty list is not allowed; expected at least one value');
        return v.join(',');
      case 'number':
        if (typeof v === 'number' && Number.isFinite(v)) return String(v);
        return typeof v === 'string' ? v : wrong();
      case 'ints':
        if (!Array.isArray(v)) return wrong();
        v.forEach((item, i) => {
          if (typeof item !== 'number' || !Number.isInteger(item))
            this.fail(`${path}[${i}]`, `${showValue(item)} is not allowed; expected an integer`);
        });
        return v.join(',');
    }
  }

  bool(v: unknown, path: string): boolean | null {
    const s = this.shaped(v, path, 'bool');
    return s === null ? null : s === 'true';
  }
}

function join(prefix: string, key: string): string {
  return prefix === '' ? key : `${prefix}.${key}`;
}

/** Next key segments under `prefix` of every path in `paths`. */
function childKeys(paths: readonly string[], prefix: string): string[] {
  const out: string[] = [];
  const lead = prefix === '' ? '' : `${prefix}.`;
  for (const p of paths) {
    if (!p.startsWith(lead)) continue;
    const seg = p.slice(lead.length).split('.')[0];
    if (seg !== undefined && seg !== '' && !out.includes(seg)) out.push(seg);
  }
  return out;
}

const MIG_REF = /^(\d+:\d+|MIG-.*)$/;
/** A MIG resource of the mixed strategy: nvidia.com/mig-<profile> with + written as '.'. */
const MIG_RESOURCE = /^nvidia\.com\/mig-(\d+c\.)?\d+g\.\d+gb(\.[a-z][a-z.]*|-me)?$/;
const GPU_UUID = /^GPU-[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$/;

function deviceSelection(r: Reader, v: unknown, path: string, mps: boolean): DeviceSelection {
  if (v === null || v === undefined) return { kind: 'all' };
  if (typeof v === 'string') {
    if (v === 'all') return { kind: 'all' };
    r.fail(path, `${showValue(v)} is not allowed; expected "all", a number of GPUs, or a list of GPU indices or UUIDs`);
  }
  if (typeof v === 'number') {
    if (!Number.isInteger(v) || v < 1)
      r.fail(path, `${showValue(v)} is not allowed; a number of GPUs must be a whole number of at least 1`);
    return { kind: 'count', count: v };
  }
  if (!Array.isArray(v))
    r.fail(path, `${showValue(v)} is not allowed; expected "all", a number of GPUs, or a list of GPU indices or UUIDs`);
  if (v.length === 0)
    r.fail(
      path,
      'an empty list selects no GPU; expected at least one GPU index or UUID (leave devices out for all GPUs)',
    );
  const refs: GpuRef[] = v.map((item: unknown, i): GpuRef => {
    const at = `${path}[${i}]`;
    if (typeof item === 'number' && Number.isInteger(item) && item >= 0) return { index: item };
    if (typeof item === 'string') {
      if (/^(0|[1-9]\d*)$/.test(item)) return { index: Number(item) };
      if (GPU_UUID.test(item)) return { uuid: item };
      if (MIG_REF.test(item) && mps)
        r.fail(
          at,
          `${showValue(item)} is a MIG device; sharing using MPS is not supported for MIG devices: name GPUs by index or GPU UUID`,
        );
      if (MIG_REF.test(item))
        r.fail(
          at,
          `${showValue(item)} is a MIG device; MIG devices are not selected one by one (a MIG resource is time-sliced whole: leave devices out), and GPUs are named by index or GPU UUID`,
        );
    }
    return r.fail(
      at,
      `${showValue(item)} is not allowed; expected a GPU index (0, 1, ...) or a GPU UUID (GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx)`,
    );
  });
  return { kind: 'list', refs };
}

function resourceName(r: Reader, v: unknown, path: string): string {
  if (typeof v !== 'string')
    r.fail(path, `${showValue(v)} is not allowed; expected a resource name such as gpu or ${GPU_RESOURCE}`);
  const q = qualifyResourceName(v);
  if ('problem' in q) r.fail(path, q.problem);
  return q.name;
}

/**
 * MPS replicas per GPU: at least 2, as NVIDIA's config v1 asks of every replicated resource ("number
 * of replicas must be >= 2"; one client would be the whole GPU behind a daemon), and at most the 48
 * clients an MPS server takes on any GPU (core/mps.ts; a pre-Volta GPU's 16 is checked against the
 * node). Time-slicing keeps accepting 1 to MAX_REPLICAS, as this plugin always has.
 */
const MPS_MIN_REPLICAS = 2;

/** `sharing.timeSlicing` or `sharing.mps`: the same shape (NVIDIA's ReplicatedResources); null when absent. */
function replicated(r: Reader, v: unknown, path: string, mps: boolean): TimeSlicing | null {
  const ts = r.mapping(v, path);
  if (ts === null) return null;
  const what = mps ? 'MPS' : 'time-slicing';
  r.keys(ts, path, ['renameByDefault', 'failRequestsGreaterThanOne', 'resources']);
  const list = ts.resources;
  const lpath = `${path}.resources`;
  if (list === undefined || list === null)
    r.fail(lpath, `missing; ${what} needs at least one resource, e.g. [{name: nvidia.com/gpu, replicas: 4}]`);
  if (!Array.isArray(list)) r.fail(lpath, `${showValue(list)} is not allowed; expected a list of resources`);
  if (list.length === 0)
    r.fail(
      lpath,
      'an empty list is not allowed; expected at least one resource, e.g. {name: nvidia.com/gpu, replicas: 4}',
    );
  const [min, max] = mps ? [MPS_MIN_REPLICAS, MPS_CLIENTS_FROM_VOLTA] : [1, MAX_REPLICAS];
  const range = mps
    ? `an integer from ${min} to ${max} (an MPS server takes at most ${max} clients per GPU; 16 before Volta)`
    : `an integer from ${min} to ${max}`;
  const resources = list.map((item: unknown, i): TimeSlicedResource => {
    const at = `${lpath}[${i}]`;
    const m = r.mapping(item, at);
    if (m === null) return r.fail(at, 'null is not allowed; expected a mapping with name and replicas');
    r.keys(m, at, ['name', 'rename', 'replicas', 'devices']);
    if (m.name === undefined || m.name === null)
      r.fail(`${at}.name`, `missing; expected the resource to share, ${GPU_RESOURCE}`);
    const name = resourceName(r, m.name, `${at}.name`);
    if (mps && name !== GPU_RESOURCE) {
      // NVIDIA: MPS shares full GPUs under nvidia.com/gpu only ("not supported for MIG devices").
      const mig = MIG_RESOURCE.test(name) ? ' (sharing using MPS is not supported for MIG devices)' : '';
      r.fail(
        `${at}.name`,
        `${showValue(m.name)} is not allowed${mig}; MPS shares whole GPUs: expected ${GPU_RESOURCE} (or gpu)`,
      );
    }
    if (name !== GPU_RESOURCE && !MIG_RESOURCE.test(name)) {
      r.fail(
        `${at}.name`,
        `${showValue(m.name)} is not allowed; expected ${GPU_RESOURCE} (or gpu), or a MIG resource of the mixed strategy such as nvidia.com/mig-1g.10gb`,
      );
    }
    const rename =
      m.rename === undefined || m.rename === null || m.rename === '' ? null : resourceName(r, m.rename, `${at}.rename`);
    const rep = m.replicas;
    if (rep === undefined || rep === null) r.fail(`${at}.replicas`, `missing; expected ${range}`);
    if (typeof rep !== 'number' || !Number.isInteger(rep) || rep < min || rep > max) {
      r.fail(`${at}.replicas`, `${showValue(rep)} is not allowed; expected ${range}`);
    }
    return { name, rename, replicas: rep, devices: deviceSelection(r, m.devices, `${at}.devices`, mps) };
  });
  return {
    renameByDefault: r.bool(ts.renameByDefault, `${path}.renameByDefault`) ?? false,
    // NVIDIA's default: false for time-slicing, true for MPS (api/config/v1/config.go).
    failRequestsGreaterThanOne: r.bool(ts.failRequestsGreaterThanOne, `${path}.failRequestsGreaterThanOne`) ?? mps,
    resources,
  };
}

function sharing(r: Reader, v: unknown): Sharing {
  const m = r.mapping(v, 'sharing');
  if (m === null) return NO_SHARING;
  r.keys(m, 'sharing', ['timeSlicing', 'mps']);
  const timeSlicing = replicated(r, m.timeSlicing, 'sharing.timeSlicing', false);
  const mps = replicated(r, m.mps, 'sharing.mps', true);
  if (mps === null) return { timeSlicing };
  // NVIDIA's plugin quietly lets MPS win over time-slicing; a file asking for both is refused here.
  if (timeSlicing !== null)
    r.fail('sharing.mps', 'MPS and time-slicing exclude each other; keep sharing.mps or sharing.timeSlicing, not both');
  return { timeSlicing: null, mps };
}

function patternResources(r: Reader, v: unknown): void {
  const m = r.mapping(v, 'resources');
  if (m === null) return;
  r.keys(m, 'resources', ['gpus', 'mig']);
  for (const k of ['gpus', 'mig']) {
    const list = m[k];
    if (list === undefined || list === null || (Array.isArray(list) && list.length === 0)) continue;
    r.fail(
      `resources.${k}`,
      "renaming resources by pattern is not supported (NVIDIA's plugin ignores this section too); remove it, or rename shared GPUs with sharing.timeSlicing.resources[].rename",
    );
  }
}

/** Parses and checks the text of a config file. `file` names it in messages. */
export function parseConfigText<K extends string>(
  text: string,
  file: string,
  schema: ConfigSchema<K>,
): ConfigFileValues<K> {
  const r: Reader = new Reader(file);
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
  let top: Json;
  try {
    top = (doc === undefined ? null : doc.toJS({ maxAliasCount: 100 })) as Json;
  } catch (err) {
    throw new ConfigError(`config file ${file}: cannot be read as data: ${(err as Error).message}`);
  }
  const values = new Map<K, ConfigValue>();
  const foreign: string[] = [];
  if (top === null) return { file, values, sharing: NO_SHARING, foreign };
  if (!isMap(top))
    r.fail('(top level)', `${showValue(top)} is not allowed; expected a mapping with version, flags and sharing`);
  r.keys(top, '', ['version', 'flags', 'sharing', 'resources', 'imex']);
  const version = top.version;
  if (version !== undefined && version !== null && version !== 'v1') {
    r.fail('version', `${showValue(version)} is not allowed; expected v1`);
  }

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
  patternResources(r, top.resources);
  return { file, values, sharing: sharing(r, top.sharing), foreign };
}

/** The largest config file read: NVIDIA's files are a few hundred bytes; 1 MiB is far beyond any real one. */
export const MAX_CONFIG_BYTES = 1024 * 1024;

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
        `config file ${file} ${err.message}; expected a regular file of at most 1 MiB (${MAX_CONFIG_BYTES} bytes); check --config-file (CONFIG_FILE)`,
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
