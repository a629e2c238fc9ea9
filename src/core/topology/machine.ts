// The exact solver's view of a machine of at most 16 GPUs ("local" indices 0..L-1): the pair
// scores, checked; the score of every subset; each GPU's partners ranked by score.
import { lowestIndex, MASK_GPUS } from './bits.ts';

/** Pair scores as an L × L table, checked to be symmetric integers in 0..1000000. */
function pairScores(L: number, score: (i: number, j: number) => number): Int32Array {
  const s = new Int32Array(L * L);
  for (let i = 0; i < L; i++) {
    for (let j = 0; j < L; j++) {
      if (i === j) continue;
      const v = score(i, j);
      if (!Number.isInteger(v) || v < 0 || v > 1e6)
        throw new Error(`pair score ${v} of GPUs ${i}, ${j} is not an integer in 0..1000000`);
      s[i * L + j] = v;
    }
  }
  for (let i = 0; i < L; i++) {
    for (let j = i + 1; j < L; j++) {
      if (s[i * L + j] !== s[j * L + i])
        throw new Error(`pair scores of GPUs ${i}, ${j} differ by direction (${s[i * L + j]} and ${s[j * L + i]})`);
    }
  }
  return s;
}

/**
 * Subset scores for all 2^L masks by inclusion-exclusion over the two lowest members a, b:
 * w(S) = w(S-a) + w(S-b) - w(S-a-b) + s(a,b).
 */
function subsetScores(L: number, s: Int32Array): Int32Array {
  const w = new Int32Array(1 << L);
  for (let S = 3; S < w.length; S++) {
    const a = S & -S;
    const rest = S ^ a;
    if (rest === 0) continue;
    const b = rest & -rest;
    w[S] = w[rest]! + w[S ^ b]! - w[rest ^ b]! + s[lowestIndex(a) * L + lowestIndex(b)]!;
  }
  return w;
}

/** Row i: the other GPUs by descending score to i, lowest index first on ties. */
function partnerOrder(L: number, s: Int32Array): Int32Array {
  const order = new Int32Array(L * L);
  for (let i = 0; i < L; i++) {
    const others: number[] = [];
    for (let j = 0; j < L; j++) if (j !== i) others.push(j);
    others.sort((x, y) => s[i * L + y]! - s[i * L + x]! || x - y);
    order.set(others, i * L);
  }
  return order;
}

export class LocalMachine {
  /** Number of GPUs (at most MASK_GPUS). */
  readonly L: number;
  /** s[i * L + j]: pair score of GPUs i and j (0 for i === j). */
  readonly s: Int32Array;
  /** w[mask]: pair score of the GPUs in mask. */
  readonly w: Int32Array;
  /** order[i * L + t], t < L - 1: the other GPUs by descending score to i, lowest index first on ties. */
  readonly order: Int32Array;

  /** Throws if L is above MASK_GPUS or a score is not a symmetric integer in 0..1000000. */
  constructor(L: number, score: (i: number, j: number) => number) {
    if (L > MASK_GPUS) throw new Error(`exact solver handles at most ${MASK_GPUS} GPUs, got ${L}`);
    this.L = L;
    this.s = pairScores(L, score);
    this.w = subsetScores(L, this.s);
    this.order = partnerOrder(L, this.s);
  }

  /** Sum of the `need` best pair scores of GPU i to other GPUs in S. */
  topPartners(i: number, S: number, need: number): number {
    const L = this.L;
    const row = i * L;
    let sum = 0;
    for (let t = 0; t < L - 1 && need > 0; t++) {
      const j = this.order[row + t]!;
      if (((S >>> j) & 1) !== 0) {
        sum += this.s[row + j]!;
        need--;
      }
    }
    return sum;
  }
}
