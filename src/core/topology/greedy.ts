// The greedy fallback beyond MAX_EXACT_GPUS available GPUs (not exact): start from the
// must-include GPUs (or, if none, the best-scoring pair, lowest indices on ties) and add the GPU
// with the greatest summed score to the group so far (lowest index on ties). Sizes 1 and n stay
// exact there too.
import type { ScoreMatrix } from './scores.ts';

/** The greedy choice of `size` GPUs among `avail` (ascending) holding `must` (ascending); ascending. */
export function greedyChoose(
  m: ScoreMatrix,
  avail: readonly number[],
  must: readonly number[],
  size: number,
): number[] {
  if (size === avail.length) return [...avail];
  const chosen = new Set<number>(must);
  if (size === 1 && chosen.size === 0) return [leastConnected(m, avail)];
  if (chosen.size === 0) {
    let bestPair: [number, number] = [avail[0]!, avail[1]!];
    let bestScore = -1;
    for (let a = 0; a < avail.length; a++) {
      for (let b = a + 1; b < avail.length; b++) {
        const sc = m.score(avail[a]!, avail[b]!);
        if (sc > bestScore) {
          bestScore = sc;
          bestPair = [avail[a]!, avail[b]!];
        }
      }
    }
    chosen.add(bestPair[0]);
    chosen.add(bestPair[1]);
  }
  while (chosen.size < size) {
    let best = -1;
    let bestGain = -1;
    for (const x of avail) {
      if (chosen.has(x)) continue;
      let gain = 0;
      for (const g of chosen) gain += m.score(x, g);
      if (gain > bestGain) {
        bestGain = gain;
        best = x;
      }
    }
    chosen.add(best);
  }
  return [...chosen].sort((a, b) => a - b);
}

/** Tie rule key 3 for size 1: the GPU least connected to the others; lowest index on ties. */
function leastConnected(m: ScoreMatrix, avail: readonly number[]): number {
  let best = -1;
  let bestSum = Infinity;
  for (const i of avail) {
    let sum = 0;
    for (const j of avail) if (j !== i) sum += m.score(i, j);
    if (sum < bestSum) {
      bestSum = sum;
      best = i;
    }
  }
  return best;
}
