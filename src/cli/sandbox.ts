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

/**
 * The sandbox of a unit given as its file's text followed by its drop-ins' texts, in the order
 * systemd applies them. An empty assignment of a list setting (ReadWritePaths=) resets it, as in systemd.
 */
export function parseUnitSandbox(texts: readonly string[]): UnitSandbox {
  let protectSystem: ProtectSystem = 'no';
  let protectHome: ProtectHome = 'no';
  let privateTmp = false;
  let rw: string[] = [];
  let ro: string[] = [];
  let hidden: string[] = [];
  let dirs: string[] = [];
  let envFiles: { path: string; optional: boolean }[] = [];
  let environment: { key: string; value: string }[] = [];
  let privateNetwork = false;
  let families: Set<string> | null = null;
  let deniedFamilies = new Set<string>();
  let ipAllow: string[] = [];
  let ipDeny: string[] = [];
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
      const key = line.slice(0, eq).trim();
      const value = line.slice(eq + 1).trim();
      switch (key) {
        case 'ProtectSystem':
          protectSystem = value === 'strict' || value === 'full' ? value : TRUE.has(value) ? 'yes' : 'no';
          break;
        case 'ProtectHome':
          protectHome = value === 'read-only' || value === 'tmpfs' ? value : TRUE.has(value) ? 'yes' : 'no';
          break;
        case 'PrivateTmp':
          privateTmp = TRUE.has(value);
          break;
        case 'ReadWritePaths':
          rw = value === '' ? [] : [...rw, ...words(value).map(cleanPath)];
          break;
        case 'ReadOnlyPaths':
          ro = value === '' ? [] : [...ro, ...words(value).map(cleanPath)];
          break;
        case 'InaccessiblePaths':
          hidden = value === '' ? [] : [...hidden, ...words(value).map(cleanPath)];
          break;
        case 'RuntimeDirectory':
        case 'StateDirectory':
        case 'CacheDirectory':
        case 'LogsDirectory': {
          const base = {
            RuntimeDirectory: '/run',
            StateDirectory: '/var/lib',
            CacheDirectory: '/var/cache',
            LogsDirectory: '/var/log',
          }[key];
          dirs =
            value === ''
              ? dirs.filter((d) => !d.startsWith(`${base}/`))
              : [...dirs, ...words(value).map((w) => posix.join(base, w.split(':')[0] ?? w))];
          break;
        }
        case 'EnvironmentFile':
          if (value === '') envFiles = [];
          else envFiles.push({ path: value.replace(/^-/, ''), optional: value.startsWith('-') });
          break;
        case 'Environment':
          if (value === '') environment = [];
          else {
            for (const w of words(value)) {
              const at = w.indexOf('=');
              if (at > 0) environment.push({ key: w.slice(0, at), value: w.slice(at + 1) });
            }
          }
          break;
        case 'PrivateNetwork':
          privateNetwork = TRUE.has(value);
          break;
        case 'RestrictAddressFamilies': {
          // systemd: "" resets; "none" allows nothing; a "~" list removes from an allow list in force, else denies; lists combine.
          if (value === '') {
            families = null;
            deniedFamilies = new Set();
            break;
          }
          if (value === 'none') {
            families = new Set();
            break;
          }
          const inverted = value.startsWith('~');
          const named = words(inverted ? value.slice(1) : value);
          if (inverted) {
            if (families !== null) for (const f of named) families.delete(f);
            else for (const f of named) deniedFamilies.add(f);
          } else {
            families = new Set([...(families ?? []), ...named]);
            deniedFamilies = new Set();
          }
          break;
        }
        case 'IPAddressAllow':
          ipAllow = value === '' ? [] : [...ipAllow, ...words(value)];
          break;
        case 'IPAddressDeny':
          ipDeny = value === '' ? [] : [...ipDeny, ...words(value)];
          break;
        default:
          break;
      }
    }
  }
  return {
    protectSystem,
    protectHome,
    privateTmp,
    readWritePaths: rw,
    readOnlyPaths: ro,
    inaccessiblePaths: hidden,
    serviceDirectories: dirs,
    environmentFiles: envFiles,
    environment,
    privateNetwork,
    addressFamilies: families,
    deniedAddressFamilies: deniedFamilies,
    ipAddressAllow: ipAllow,
    ipAddressDeny: ipDeny,
  };
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
        how: `ProtectHome=${sb.protectHome} ${sb.protectHome === 'read-only' ? 'makes it read-only' : 'hides it from the service'}`,
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

/** An IP address as a number and its family, or null when `text` is not an IPv4 or IPv6 literal. */
export function parseIp(text: string): { family: 4 | 6; value: bigint } | null {
  const t = text.replace(/^\[|\]$/g, '');
  const v4 = /^(\d{1,3})\.(\d{1,3})\.(\d{1,3})\.(\d{1,3})$/.exec(t);
  if (v4 !== null) {
    const parts = v4.slice(1).map(Number);
    if (parts.some((n) => n > 255)) return null;
    return { family: 4, value: parts.reduce((acc, n) => (acc << 8n) | BigInt(n), 0n) };
  }
  if (!t.includes(':') || !/^[0-9a-fA-F:.]+$/.test(t)) return null;
  const halves = t.split('::');
  if (halves.length > 2) return null;
  const groups = (h: string): string[] => (h === '' ? [] : h.split(':'));
  const head = groups(halves[0] ?? '');
  const tail = halves.length === 2 ? groups(halves[1] ?? '') : [];
  // An IPv4 tail (::ffff:10.0.0.1) is two groups.
  const last = tail.length > 0 ? tail : head;
  const lastGroup = last[last.length - 1];
  if (lastGroup?.includes('.')) {
    const four = parseIp(lastGroup);
    if (four === null || four.family !== 4) return null;
    last.splice(last.length - 1, 1, (four.value >> 16n).toString(16), (four.value & 0xffffn).toString(16));
  }
  const missing = 8 - head.length - tail.length;
  if (halves.length === 1 ? missing !== 0 : missing < 1) return null;
  const all = [...head, ...Array<string>(halves.length === 2 ? missing : 0).fill('0'), ...tail];
  if (all.some((g) => !/^[0-9a-fA-F]{1,4}$/.test(g))) return null;
  return { family: 6, value: all.reduce((acc, g) => (acc << 16n) | BigInt(parseInt(g, 16)), 0n) };
}

/** Whether an IPAddressAllow=/IPAddressDeny= entry (a prefix, an address, or systemd's keywords) covers `ip`. */
export function ipEntryCovers(entry: string, ip: { family: 4 | 6; value: bigint }): boolean {
  const keyword: Record<string, readonly string[]> = {
    any: ['0.0.0.0/0', '::/0'],
    localhost: ['127.0.0.0/8', '::1/128'],
    'link-local': ['169.254.0.0/16', 'fe80::/64'],
    multicast: ['224.0.0.0/4', 'ff00::/8'],
  };
  const prefixes = keyword[entry] ?? [entry];
  return prefixes.some((p) => {
    const [addr = '', len] = p.split('/');
    const net = parseIp(addr);
    if (net === null || net.family !== ip.family) return false;
    const bits = ip.family === 4 ? 32 : 128;
    const n = len === undefined ? bits : Number(len);
    if (!Number.isInteger(n) || n < 0 || n > bits) return false;
    const shift = BigInt(bits - n);
    return net.value >> shift === ip.value >> shift;
  });
}

export type NetworkVerdict =
  | { readonly reachable: true; readonly how: string }
  | { readonly reachable: false; readonly why: string }
  /** Allowed only to some addresses, and the host is a name whose addresses were not looked up. */
  | { readonly reachable: 'unknown'; readonly why: string };

/**
 * Whether the service may open a TCP connection to `host` (an IP literal or a name) under this
 * sandbox: PrivateNetwork=, RestrictAddressFamilies= and IPAddressAllow=/IPAddressDeny= (an address
 * an allow entry covers is allowed; else one a deny entry covers is denied; else allowed, as systemd).
 */
export function networkInSandbox(sb: UnitSandbox, host: string): NetworkVerdict {
  if (sb.privateNetwork)
    return { reachable: false, why: 'PrivateNetwork=yes gives the service only its own loopback interface' };
  const ip = parseIp(host);
  const familyOk = (f: string): boolean =>
    sb.addressFamilies === null ? !sb.deniedAddressFamilies.has(f) : sb.addressFamilies.has(f);
  const wanted = ip === null ? ['AF_INET', 'AF_INET6'] : [ip.family === 4 ? 'AF_INET' : 'AF_INET6'];
  const families = wanted.filter(familyOk);
  if (families.length === 0) {
    const rule =
      sb.addressFamilies === null
        ? `RestrictAddressFamilies=~${[...sb.deniedAddressFamilies].join(' ')}`
        : `RestrictAddressFamilies=${[...sb.addressFamilies].join(' ') || 'none'}`;
    return { reachable: false, why: `${rule} does not let the service create ${wanted.join(' or ')} sockets` };
  }
  const how = `PrivateNetwork=no, ${families.join('/')} allowed`;
  if (sb.ipAddressDeny.length === 0) return { reachable: true, how };
  if (ip !== null) {
    const allow = sb.ipAddressAllow.find((e) => ipEntryCovers(e, ip));
    if (allow !== undefined) return { reachable: true, how: `${how}, IPAddressAllow=${allow}` };
    const deny = sb.ipAddressDeny.find((e) => ipEntryCovers(e, ip));
    if (deny !== undefined)
      return {
        reachable: false,
        why: `IPAddressDeny=${deny} covers ${host}${sb.ipAddressAllow.length > 0 ? ` and no IPAddressAllow= entry (${sb.ipAddressAllow.join(' ')}) does` : ''}`,
      };
    return { reachable: true, how };
  }
  if (sb.ipAddressDeny.includes('any') && sb.ipAddressAllow.length === 0)
    return { reachable: false, why: 'IPAddressDeny=any and no IPAddressAllow=' };
  return {
    reachable: 'unknown',
    why: `IPAddressDeny=${sb.ipAddressDeny.join(' ')} with IPAddressAllow=${sb.ipAddressAllow.join(' ') || '(none)'}: whether ${host}'s addresses are allowed depends on what it resolves to, which was not looked up`,
  };
}
