// Where the service may write, judged as systemd's sandbox would let it: the unit's ProtectSystem=,
// ProtectHome=, PrivateTmp=, ReadWritePaths=, ReadOnlyPaths=, InaccessiblePaths= and the
// directories systemd creates for it (RuntimeDirectory=, StateDirectory=, CacheDirectory=,
// LogsDirectory=), from the installed unit and its drop-ins. `check` runs outside that sandbox (a root
// shell may write where the service gets EROFS), so it asks this module instead of trusting access(2).
// Also the unit's EnvironmentFile= and Environment= lines, and its network (PrivateNetwork=,
// RestrictAddressFamilies=, IPAddressAllow=/IPAddressDeny=: whether the DRA mode reaches the API
// server). Pure: unit text in, decisions out.
import { posix } from 'node:path';

export const UNIT_NAME = 'gpu-device-plugin.service';

/**
 * The lines of the unit we ship (systemd/gpu-device-plugin.service) that this module reads, for a
 * node where no unit is installed. A unit test holds them to the file.
 */
export const SHIPPED_UNIT = `[Service]
EnvironmentFile=-/etc/default/gpu-device-plugin
EnvironmentFile=-/etc/sysconfig/gpu-device-plugin
RuntimeDirectory=gpu-device-plugin
StateDirectory=gpu-device-plugin
ProtectSystem=strict
ReadWritePaths=-/var/lib/kubelet/device-plugins
ReadOnlyPaths=/run
ProtectHome=yes
PrivateTmp=yes
PrivateNetwork=yes
RestrictAddressFamilies=AF_UNIX
IPAddressDeny=any
`;

export type ProtectSystem = 'no' | 'yes' | 'full' | 'strict';
export type ProtectHome = 'no' | 'yes' | 'read-only' | 'tmpfs';

export interface UnitSandbox {
  readonly protectSystem: ProtectSystem;
  readonly protectHome: ProtectHome;
  readonly privateTmp: boolean;
  readonly readWritePaths: readonly string[];
  readonly readOnlyPaths: readonly string[];
  readonly inaccessiblePaths: readonly string[];
  /** Directories systemd makes writable for the service (/run/<RuntimeDirectory>, /var/lib/<StateDirectory> …). */
  readonly serviceDirectories: readonly string[];
  /** EnvironmentFile= entries in order; optional ones (leading "-") may be absent. */
  readonly environmentFiles: readonly { readonly path: string; readonly optional: boolean }[];
  /** Environment= assignments in order. */
  readonly environment: readonly { readonly key: string; readonly value: string }[];
  /** PrivateNetwork=: the service has only its own loopback interface. */
  readonly privateNetwork: boolean;
  /** RestrictAddressFamilies=: null when every family is allowed, else the families socket() may create. */
  readonly addressFamilies: ReadonlySet<string> | null;
  /** Families denied by a "~" list when no allow list is in force. */
  readonly deniedAddressFamilies: ReadonlySet<string>;
  /** IPAddressAllow= and IPAddressDeny= entries (prefixes and systemd's keywords), as written. */
  readonly ipAddressAllow: readonly string[];
  readonly ipAddressDeny: readonly string[];
}

const TRUE = new Set(['1', 'yes', 'true', 'on']);

/** Splits a list value on whitespace, honouring double and single quotes. */
function words(value: string): string[] {
  const out: string[] = [];
  const re = /"((?:[^"\\]|\\.)*)"|'([^']*)'|(\S+)/g;
  for (let m = re.exec(value); m !== null; m = re.exec(value)) out.push(m[1] ?? m[2] ?? m[3] ?? '');
  return out;
}

/** Strips systemd's path prefixes ("-" ignore if missing, "+" relative to the root directory). */
function cleanPath(p: string): string {
  return posix.normalize(p.replace(/^[-+]+/, ''));
}

/** The settings being read, each as systemd holds it after the lines so far. */
interface SandboxState {
  protectSystem: ProtectSystem;
  protectHome: ProtectHome;
  privateTmp: boolean;
  readWritePaths: string[];
  readOnlyPaths: string[];
  inaccessiblePaths: string[];
  serviceDirectories: string[];
  environmentFiles: { path: string; optional: boolean }[];
  environment: { key: string; value: string }[];
  privateNetwork: boolean;
  addressFamilies: Set<string> | null;
  deniedAddressFamilies: Set<string>;
  ipAddressAllow: string[];
  ipAddressDeny: string[];
}

/** The [Service] section's assignments of the texts in order, continuation lines joined, comments skipped. */
export function* serviceAssignments(texts: readonly string[]): Generator<{ key: string; value: string }> {
  for (const text of texts) {
    let section = '';
    // Continuation lines (a trailing backslash) are joined first.
    for (const raw of text.replace(/\\\n/g, ' ').split('\n')) {
      const line = raw.trim();
      if (line === '' || line.startsWith('#') || line.startsWith(';')) continue;
      const sec = /^\[(.+)\]$/.exec(line);
      if (sec !== null) {
        section = sec[1] as string;
        continue;
      }
      if (section !== 'Service') continue;
      const eq = line.indexOf('=');
      if (eq < 0) continue;
      yield { key: line.slice(0, eq).trim(), value: line.slice(eq + 1).trim() };
    }
  }
}

const SERVICE_DIRECTORY_BASES: Readonly<Record<string, string>> = {
  RuntimeDirectory: '/run',
  StateDirectory: '/var/lib',
  CacheDirectory: '/var/cache',
  LogsDirectory: '/var/log',
};

/** ProtectSystem=, ProtectHome=, PrivateTmp=, the path lists and the service directories; false for other keys. */
function applyPathSetting(st: SandboxState, key: string, value: string): boolean {
  const list = (was: string[]): string[] => (value === '' ? [] : [...was, ...words(value).map(cleanPath)]);
  switch (key) {
    case 'ProtectSystem':
      st.protectSystem = value === 'strict' || value === 'full' ? value : TRUE.has(value) ? 'yes' : 'no';
      return true;
    case 'ProtectHome':
      st.protectHome = value === 'read-only' || value === 'tmpfs' ? value : TRUE.has(value) ? 'yes' : 'no';
      return true;
    case 'PrivateTmp':
      st.privateTmp = TRUE.has(value);
      return true;
    case 'ReadWritePaths':
      st.readWritePaths = list(st.readWritePaths);
      return true;
    case 'ReadOnlyPaths':
      st.readOnlyPaths = list(st.readOnlyPaths);
      return true;
    case 'InaccessiblePaths':
      st.inaccessiblePaths = list(st.inaccessiblePaths);
      return true;
  }
  const base = SERVICE_DIRECTORY_BASES[key];
  if (base === undefined) return false;
  st.serviceDirectories =
    value === ''
      ? st.serviceDirectories.filter((d) => !d.startsWith(`${base}/`))
      : [...st.serviceDirectories, ...words(value).map((w) => posix.join(base, w.split(':')[0] ?? w))];
  return true;
}

/** EnvironmentFile= and Environment=; false for other keys. */
function applyEnvironmentSetting(st: SandboxState, key: string, value: string): boolean {
  if (key === 'EnvironmentFile') {
    if (value === '') st.environmentFiles = [];
    else st.environmentFiles.push({ path: value.replace(/^-/, ''), optional: value.startsWith('-') });
    return true;
  }
  if (key !== 'Environment') return false;
  if (value === '') st.environment = [];
  else {
    for (const w of words(value)) {
      const at = w.indexOf('=');
      if (at > 0) st.environment.push({ key: w.slice(0, at), value: w.slice(at + 1) });
    }
  }
  return true;
}

/** RestrictAddressFamilies=, as systemd combines its lines. */
function applyAddressFamilies(st: SandboxState, value: string): void {
  // systemd: "" resets; "none" allows nothing; a "~" list removes from an allow list in force, else
  // denies; lists combine.
  if (value === '') {
    st.addressFamilies = null;
    st.deniedAddressFamilies = new Set();
    return;
  }
  if (value === 'none') {
    st.addressFamilies = new Set();
    return;
  }
  const inverted = value.startsWith('~');
  const named = words(inverted ? value.slice(1) : value);
  if (inverted) {
    if (st.addressFamilies !== null) for (const f of named) st.addressFamilies.delete(f);
    else for (const f of named) st.deniedAddressFamilies.add(f);
  } else {
    st.addressFamilies = new Set([...(st.addressFamilies ?? []), ...named]);
    st.deniedAddressFamilies = new Set();
  }
}

/** PrivateNetwork=, RestrictAddressFamilies=, IPAddressAllow= and IPAddressDeny=; false for other keys. */
function applyNetworkSetting(st: SandboxState, key: string, value: string): boolean {
  switch (key) {
    case 'PrivateNetwork':
      st.privateNetwork = TRUE.has(value);
      return true;
    case 'RestrictAddressFamilies':
      applyAddressFamilies(st, value);
      return true;
    case 'IPAddressAllow':
      st.ipAddressAllow = value === '' ? [] : [...st.ipAddressAllow, ...words(value)];
      return true;
    case 'IPAddressDeny':
      st.ipAddressDeny = value === '' ? [] : [...st.ipAddressDeny, ...words(value)];
      return true;
  }
  return false;
}

/**
 * The sandbox of a unit given as its file's text followed by its drop-ins' texts, in the order
 * systemd applies them. An empty assignment of a list setting (ReadWritePaths=) resets it, as in systemd.
 */
export function parseUnitSandbox(texts: readonly string[]): UnitSandbox {
  const st: SandboxState = {
    protectSystem: 'no',
    protectHome: 'no',
    privateTmp: false,
    readWritePaths: [],
    readOnlyPaths: [],
    inaccessiblePaths: [],
    serviceDirectories: [],
    environmentFiles: [],
    environment: [],
    privateNetwork: false,
    addressFamilies: null,
    deniedAddressFamilies: new Set(),
    ipAddressAllow: [],
    ipAddressDeny: [],
  };
  for (const { key, value } of serviceAssignments(texts)) {
    if (!applyPathSetting(st, key, value) && !applyEnvironmentSetting(st, key, value))
      applyNetworkSetting(st, key, value);
  }
  return st;
}

export type WriteVerdict =
  | { readonly writable: true; readonly how: string; readonly private?: true }
  | { readonly writable: false; readonly why: string };

function under(path: string, dir: string): boolean {
  return dir === '/' || path === dir || path.startsWith(`${dir}/`);
}

/**
 * Whether the service may write into directory `dir` (an absolute path) under this sandbox: the
 * most specific rule whose path contains it decides, as systemd's bind mounts do.
 */
export function writableInSandbox(sb: UnitSandbox, dir: string): WriteVerdict {
  const p = posix.normalize(dir);
  type Rule = { path: string; kind: 'rw' | 'ro' | 'hidden' | 'private'; how: string };
  const rules: Rule[] = [];
  if (sb.protectSystem === 'strict') {
    rules.push({
      path: '/',
      kind: 'ro',
      how: 'ProtectSystem=strict makes the whole file system read-only for the service',
    });
    // API file systems stay as they are; /dev/shm and the like are not our business.
    rules.push({ path: '/dev', kind: 'rw', how: '/dev is not made read-only by ProtectSystem=' });
  } else {
    rules.push({ path: '/', kind: 'rw', how: `ProtectSystem=${sb.protectSystem} leaves it writable` });
    if (sb.protectSystem !== 'no')
      for (const d of ['/usr', '/boot', '/efi'])
        rules.push({ path: d, kind: 'ro', how: `ProtectSystem=${sb.protectSystem} makes ${d} read-only` });
    if (sb.protectSystem === 'full')
      rules.push({ path: '/etc', kind: 'ro', how: 'ProtectSystem=full makes /etc read-only' });
  }
  if (sb.protectHome !== 'no') {
    for (const d of ['/home', '/root', '/run/user']) {
      rules.push({
        path: d,
        kind: sb.protectHome === 'read-only' ? 'ro' : 'hidden',
        how:
          `ProtectHome=${sb.protectHome} ` +
          `${sb.protectHome === 'read-only' ? 'makes it read-only' : 'hides it from the service'}`,
      });
    }
  }
  if (sb.privateTmp)
    for (const d of ['/tmp', '/var/tmp'])
      rules.push({
        path: d,
        kind: 'private',
        how: `PrivateTmp=yes gives the service its own empty ${d}: what it writes there nobody else sees`,
      });
  for (const d of sb.serviceDirectories)
    rules.push({
      path: d,
      kind: 'rw',
      how: `systemd creates ${d} for the service (RuntimeDirectory=/StateDirectory=)`,
    });
  for (const d of sb.readWritePaths) rules.push({ path: d, kind: 'rw', how: `ReadWritePaths=${d}` });
  for (const d of sb.readOnlyPaths) rules.push({ path: d, kind: 'ro', how: `ReadOnlyPaths=${d}` });
  for (const d of sb.inaccessiblePaths) rules.push({ path: d, kind: 'hidden', how: `InaccessiblePaths=${d}` });
  // A private /tmp is mounted over whatever else names a path in it: the host's directory is not there.
  const priv = rules.find((r) => r.kind === 'private' && under(p, r.path));
  if (priv !== undefined) return { writable: true, how: priv.how, private: true };
  let best: Rule | undefined;
  for (const r of rules) {
    // Later rules of the same length win (ReadOnlyPaths over ReadWritePaths of the same path, as systemd orders them).
    if (under(p, r.path) && (best === undefined || r.path.length >= best.path.length)) best = r;
  }
  const rule = best as Rule;
  switch (rule.kind) {
    case 'rw':
      return { writable: true, how: rule.how };
    case 'private':
      return { writable: true, how: rule.how, private: true };
    case 'ro':
      return { writable: false, why: `read-only for the service: ${rule.how}` };
    case 'hidden':
      return { writable: false, why: `not visible to the service: ${rule.how}` };
  }
}

/** Whether the service may read a file at `path`: not hidden from it, and not its private /tmp's. */
export function readableInSandbox(sb: UnitSandbox, path: string): WriteVerdict {
  const v = writableInSandbox(sb, path);
  if (v.writable) return v;
  // Read-only is fine for reading.
  return v.why.startsWith('read-only')
    ? { writable: true, how: v.why.replace(/^read-only for the service: /, 'readable (read-only): ') }
    : v;
}
