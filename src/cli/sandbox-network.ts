// Whether the unit's sandbox lets the service open a TCP connection to a host (the DRA mode's API
// server): PrivateNetwork=, RestrictAddressFamilies= and IPAddressAllow=/IPAddressDeny=, as read by
// sandbox.ts. Pure.
import type { UnitSandbox } from './sandbox.ts';

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
        why:
          `IPAddressDeny=${deny} covers ${host}` +
          (sb.ipAddressAllow.length > 0 ? ` and no IPAddressAllow= entry (${sb.ipAddressAllow.join(' ')}) does` : ''),
      };
    return { reachable: true, how };
  }
  if (sb.ipAddressDeny.includes('any') && sb.ipAddressAllow.length === 0)
    return { reachable: false, why: 'IPAddressDeny=any and no IPAddressAllow=' };
  return {
    reachable: 'unknown',
    why:
      `IPAddressDeny=${sb.ipAddressDeny.join(' ')} with ` +
      `IPAddressAllow=${sb.ipAddressAllow.join(' ') || '(none)'}: whether ${host}'s ` +
      `addresses are allowed depends on what it resolves to, which was not looked up`,
  };
}
