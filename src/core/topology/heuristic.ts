// A quick lower bound for the exact solver: the score of a good cut, found greedily and improved
// by swaps, so that the fail-soft search starts with a value it must reach.
import { popcount } from './bits.ts';

/**
 * The score of a good cut of A (one full group holding M, if M is not empty) into groups of k and
 * a leftover group: groups grown greedily from M and then from the lowest GPU left, improved by
 * swapping GPUs between groups while that raises the total. A lower bound of the optimum.
 * `w[mask]`: the pair score of the GPUs in mask.
 */
export function heuristicCut(w: Int32Array, A: number, M: number, k: number): number {
  const groups: number[] = [];
  let S = A;
  const grow = (start: number): number => {
    let g = start;
    while (popcount(g) < k) {
      let pick = 0;
      let gain = -1;
      for (let x = S & ~g; x !== 0; x &= x - 1) {
        const bit = x & -x;
        if (w[g | bit]! > gain) {
          gain = w[g | bit]!;
          pick = bit;
        }
      }
      g |= pick;
    }
    S ^= g;
    return g;
  };
  if (M !== 0) groups.push(grow(M));
  while (popcount(S) >= k) groups.push(grow(S & -S));
  if (S !== 0) groups.push(S);
  for (let round = 0, improved = true; improved && round < 32; round++) {
    improved = false;
    for (let a = 0; a < groups.length; a++) {
      for (let b = a + 1; b < groups.length; b++) {
        const swapped = improvePair(w, groups[a]!, groups[b]!, M);
        if (swapped === null) continue;
        groups[a] = swapped[0];
        groups[b] = swapped[1];
        improved = true;
      }
    }
  }
  let total = 0;
  for (const g of groups) total += w[g]!;
  return total;
}

/**
 * One pass of swaps between groups ga and gb (GPUs of M stay put): for each GPU x of ga, the first
 * GPU y of gb whose exchange with x raises w(ga) + w(gb) is exchanged. Null when nothing improved.
 */
function improvePair(w: Int32Array, ga: number, gb: number, M: number): [number, number] | null {
  let improved = false;
  for (let x = ga & ~M; x !== 0; x &= x - 1) {
    const xb = x & -x;
    if ((ga & xb) === 0) continue;
    for (let y = gb; y !== 0; y &= y - 1) {
      const yb = y & -y;
      if ((gb & yb) === 0) continue;
      const na = (ga ^ xb) | yb;
      const nb = (gb ^ yb) | xb;
      if (w[na]! + w[nb]! > w[ga]! + w[gb]!) {
        ga = na;
        gb = nb;
        improved = true;
        break;
      }
    }
  }
  return improved ? [ga, gb] : null;
}
