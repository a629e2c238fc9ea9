// Whether an installed unit's sandbox is still the one the package ships: the unit file systemd uses and its
// drop-ins, read as systemd applies them, against the package's own files. Only the settings that confine the
// service are compared, each in the direction that loosens it (a drop-in that narrows IPAddressAllow= or adds
// ReadOnlyPaths= is no drift). Pure: unit texts in, the loosened settings out; reading them is check-units.ts's.
import { serviceAssignments } from './sandbox.ts';

/**
 * How a setting loosens: `on` a yes/no setting turned off; `level` a lower rank; `adds` a list with entries the
 * package's has not (paths made writable, capabilities, devices); `drops` a list missing entries of the
 * package's (paths made read-only or hidden, addresses denied); `same` any other value.
 */
type Kind = 'on' | 'level' | 'adds' | 'drops' | 'same';

const RANKS: Readonly<Record<string, Readonly<Record<string, number>>>> = {
  ProtectSystem: { no: 0, false: 0, yes: 1, true: 1, full: 2, strict: 3 },
  ProtectHome: { no: 0, false: 0, 'read-only': 1, tmpfs: 2, yes: 2, true: 2 },
};

const SETTINGS: Readonly<Record<string, Kind>> = {
  User: 'same',
  Group: 'same',
  DynamicUser: 'same',
  SupplementaryGroups: 'adds',
  CapabilityBoundingSet: 'adds',
  AmbientCapabilities: 'adds',
  NoNewPrivileges: 'on',
  ProtectSystem: 'level',
  ProtectHome: 'level',
  ReadWritePaths: 'adds',
  ReadOnlyPaths: 'drops',
  InaccessiblePaths: 'drops',
  PrivateTmp: 'on',
  PrivateNetwork: 'on',
  PrivateIPC: 'on',
  RemoveIPC: 'on',
  DevicePolicy: 'same',
  DeviceAllow: 'adds',
  RestrictAddressFamilies: 'same',
  IPAddressDeny: 'drops',
  IPAddressAllow: 'adds',
  RestrictNamespaces: 'same',
  ProtectKernelTunables: 'on',
  ProtectKernelModules: 'on',
  ProtectKernelLogs: 'on',
  ProtectControlGroups: 'on',
  ProtectClock: 'on',
  ProtectHostname: 'on',
  ProtectProc: 'same',
  RestrictRealtime: 'on',
  RestrictSUIDSGID: 'on',
  LockPersonality: 'on',
  SystemCallFilter: 'same',
  SystemCallArchitectures: 'same',
  UMask: 'same',
};

/** Commands that run outside the sandbox ("+", "!" or "!!" among the prefixes), under this pseudo-key. */
const PRIVILEGED_EXEC = 'privileged Exec*= commands';
const EXEC_KEYS = new Set([
  'ExecCondition',
  'ExecStartPre',
  'ExecStart',
  'ExecStartPost',
  'ExecReload',
  'ExecStop',
  'ExecStopPost',
]);

const TRUE = new Set(['1', 'yes', 'true', 'on']);
/** Settings compared as a whole whose lines add up until an empty one resets them. */
const ACCUMULATING = new Set(['SystemCallFilter', 'RestrictAddressFamilies', 'RestrictNamespaces']);

/** Each compared setting's value after all the texts, as systemd would hold it; a list's entries in order. */
export function effectiveSettings(texts: readonly string[]): Map<string, string[]> {
  const out = new Map<string, string[]>();
  for (const { key, value } of serviceAssignments(texts)) {
    if (EXEC_KEYS.has(key)) {
      const prefixes = /^[-+!@:|]*/.exec(value)?.[0] ?? '';
      const kept = (out.get(PRIVILEGED_EXEC) ?? []).filter((c) => value !== '' || !c.startsWith(`${key}=`));
      out.set(PRIVILEGED_EXEC, kept);
      if (value !== '' && /[+!]/.test(prefixes))
        out.set(PRIVILEGED_EXEC, [...(out.get(PRIVILEGED_EXEC) ?? []), `${key}=${value}`]);
      continue;
    }
    const kind = SETTINGS[key];
    if (kind === undefined) continue;
    if (kind === 'adds' || kind === 'drops') {
      // An empty assignment resets a list; otherwise entries accumulate.
      // DeviceAllow= is one device and its access per line; the other lists are whitespace-separated.
      const entries = key === 'DeviceAllow' ? [value] : value.split(/\s+/);
      out.set(key, value === '' ? [] : [...(out.get(key) ?? []), ...entries]);
    } else if (ACCUMULATING.has(key)) {
      out.set(key, value === '' ? [] : [...(out.get(key) ?? []), value]);
    } else {
      out.set(key, [value]);
    }
  }
  return out;
}

/** A list's entries without systemd's "-" (ignore if missing) prefix, so `-/a` and `/a` compare equal. */
const entry = (s: string): string => s.replace(/^-/, '');

/** Why `setting` as effective is looser than as shipped, or null when it is not. */
function loosened(
  key: string,
  shipped: readonly string[] | undefined,
  now: readonly string[] | undefined,
): string | null {
  const kind = key === PRIVILEGED_EXEC ? 'adds' : SETTINGS[key];
  const show = (v: readonly string[] | undefined): string => (v === undefined ? '(not set)' : v.join(' ') || '(empty)');
  switch (kind) {
    case 'on': {
      const was = TRUE.has(shipped?.[0] ?? '');
      return was && !TRUE.has(now?.[0] ?? '') ? `${key}=${show(now)} (the package's: ${show(shipped)})` : null;
    }
    case 'level': {
      const rank = RANKS[key] ?? {};
      const was = rank[shipped?.[0] ?? 'no'] ?? 0;
      const is = rank[now?.[0] ?? 'no'] ?? 0;
      return is < was ? `${key}=${show(now)} (the package's: ${show(shipped)})` : null;
    }
    case 'adds': {
      // Not set at all is no restriction for a capability set, unlike an empty one.
      if (key.endsWith('Capabilities') || key === 'CapabilityBoundingSet') {
        if (shipped !== undefined && now === undefined) return `${key} is not set: every capability`;
      }
      const had = new Set((shipped ?? []).map(entry));
      const extra = (now ?? []).filter((e) => !had.has(entry(e)));
      return extra.length > 0 ? `${key === PRIVILEGED_EXEC ? key : `${key}=`} adds ${extra.join(', ')}` : null;
    }
    case 'drops': {
      const has = new Set((now ?? []).map(entry));
      const gone = (shipped ?? []).filter((e) => !has.has(entry(e)));
      return gone.length > 0 ? `${key}= no longer has ${gone.join(', ')}` : null;
    }
    case 'same':
      return show(shipped) === show(now) ? null : `${key}=${show(now)} (the package's: ${show(shipped)})`;
    default:
      return null;
  }
}

/**
 * The settings in which the effective unit (its file and drop-ins, `effective`) confines the service less
 * than the package's files (`shipped`), each naming the value now and the package's; empty when none.
 */
export function sandboxDrift(shipped: readonly string[], effective: readonly string[]): string[] {
  const was = effectiveSettings(shipped);
  const now = effectiveSettings(effective);
  // IPAddressAllow= only makes exceptions to IPAddressDeny=: with nothing denied, allowing narrows nothing.
  const denied = (was.get('IPAddressDeny') ?? []).length > 0;
  const keys = [...Object.keys(SETTINGS), PRIVILEGED_EXEC].filter((k) => denied || k !== 'IPAddressAllow');
  return keys.flatMap((k) => {
    const why = loosened(k, was.get(k), now.get(k));
    return why === null ? [] : [why];
  });
}
