// Bit utilities over GPU masks: a set of at most 16 GPUs as the set bits of a 32-bit integer
// (bit i = GPU i). Counting, lowest members, the lexicographic order of ascending index lists.

const POPCOUNT = new Uint8Array(1 << 16);
for (let x = 1; x < POPCOUNT.length; x++) POPCOUNT[x] = (POPCOUNT[x >>> 1] ?? 0) + (x & 1);

/** Number of GPUs in mask. */
export function popcount(mask: number): number {
  return POPCOUNT[mask & 0xffff]! + POPCOUNT[mask >>> 16]!;
}

/** Index of the lowest GPU in mask (mask not 0). */
export function lowestIndex(mask: number): number {
  return 31 - Math.clz32(mask & -mask);
}

/** The `count` lowest set bits of mask. */
export function lowestBits(mask: number, count: number): number {
  let out = 0;
  for (let x = mask; count > 0 && x !== 0; x &= x - 1, count--) out |= x & -x;
  return out;
}

/** True when mask a, as an ascending index list, sorts before mask b (same popcount). */
export function lexLess(a: number, b: number): boolean {
  const d = a ^ b;
  return d !== 0 && (a & d & -d) !== 0;
}

/** The GPUs of mask as an ascending index list. */
export function maskToIndices(mask: number): number[] {
  const out: number[] = [];
  for (let x = mask; x !== 0; x &= x - 1) out.push(lowestIndex(x));
  return out;
}

/** Most GPUs a mask of the exact solver holds; also the stride of its per-GPU tables. */
export const MASK_GPUS = 16;
