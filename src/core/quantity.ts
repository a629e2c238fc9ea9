// Kubernetes quantities as byte counts, pure: `10Gi`, `512M`, `1.5Gi`, `1e9`, plain integers. Binary suffixes
// (Ki … Ei) are powers of 1024, decimal ones (k, M, G, T, P, E) powers of 1000; a result that is not a whole
// number of bytes is rounded up, as Kubernetes rounds a byte quantity up to its integer value.

const BINARY: Readonly<Record<string, number>> = { Ki: 1, Mi: 2, Gi: 3, Ti: 4, Pi: 5, Ei: 6 };
const DECIMAL: Readonly<Record<string, number>> = { '': 0, k: 1, M: 2, G: 3, T: 4, P: 5, E: 6 };
const FORM = /^([+-]?)(\d+(?:\.\d*)?|\.\d+)(?:(Ki|Mi|Gi|Ti|Pi|Ei|k|M|G|T|P|E)|[eE]([+-]?\d+))?$/;

/**
 * The number of bytes `text` stands for, or null when it is not a Kubernetes quantity, is negative,
 * or is too large to count exactly (above 2^53).
 */
export function parseQuantity(text: string): number | null {
  const m = FORM.exec(text);
  if (m === null) return null;
  const [, sign, digits = '', suffix, exponent] = m;
  // Exact arithmetic: the digits as an integer over a power of ten, times the suffix's multiplier.
  const [whole = '', fraction = ''] = digits.split('.');
  let numerator = BigInt(`${whole}${fraction}` || '0');
  let denominator = 10n ** BigInt(fraction.length);
  if (suffix !== undefined && suffix in BINARY) numerator *= 1024n ** BigInt(BINARY[suffix] as number);
  else if (exponent !== undefined) {
    const e = Number(exponent);
    if (Math.abs(e) > 30) return null;
    if (e >= 0) numerator *= 10n ** BigInt(e);
    else denominator *= 10n ** BigInt(-e);
  } else numerator *= 1000n ** BigInt(DECIMAL[suffix ?? ''] as number);
  const bytes = (numerator + denominator - 1n) / denominator;
  if (sign === '-' && bytes !== 0n) return null;
  return bytes <= BigInt(Number.MAX_SAFE_INTEGER) ? Number(bytes) : null;
}

/** A byte count as a binary quantity when it is a whole number of KiB, MiB … (85899345920 → 80Gi, 1536 → 1536). */
export function bytesQuantity(bytes: number): string {
  const suffixes = ['Ei', 'Pi', 'Ti', 'Gi', 'Mi', 'Ki'];
  for (let k = suffixes.length; k >= 1; k--) {
    const unit = 2 ** (10 * k);
    if (bytes >= unit && bytes % unit === 0) return `${bytes / unit}${suffixes[suffixes.length - k]}`;
  }
  return String(bytes);
}
