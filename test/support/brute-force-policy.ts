// An obviously-correct, slow solver of the preferred-allocation objective, for checking the fast
// one. It lists every way of cutting the available GPUs into blocks (restricted growth: each GPU,
// in ascending order, joins an open block or opens a new one), keeps the cuts with the right block
// sizes, and applies the objective and the tie rule literally, as written in src/core/topology/policy.ts:
//   - a cut is floor(n/k) blocks of k plus, if k does not divide n, one block of n mod k;
//   - with must-include GPUs, only cuts in which one full-size block holds all of them count;
//   - keep the cuts with the greatest total score; from each, its best-scoring full-size blocks
//     holding the must-include GPUs are the candidates;
//   - among candidates: greatest block score, then greatest score of the GPUs left out of the
//     block, then the lexicographically smallest ascending index list.
// Fine up to about 10 GPUs.
import type { ScoreMatrix } from '../../src/core/topology/index.ts';

export interface BruteForceAnswer {
  /** The chosen GPUs, ascending. */
  readonly group: number[];
  /** Total score of the best cuts (the objective's optimum). */
  readonly splitScore: number;
  /** Score of the chosen group. */
  readonly groupScore: number;
  /** Score of the available GPUs not chosen. */
  readonly remainderScore: number;
  /** Number of valid cuts looked at. */
  readonly cuts: number;
}

function lexCompare(a: readonly number[], b: readonly number[]): number {
  for (let i = 0; i < Math.min(a.length, b.length); i++) {
    const d = (a[i] ?? 0) - (b[i] ?? 0);
    if (d !== 0) return d;
  }
  return a.length - b.length;
}

export function bruteForceChoose(
  m: ScoreMatrix,
  available: readonly number[],
  mustInclude: readonly number[],
  size: number,
): BruteForceAnswer {
  const gpus = [...available].sort((a, b) => a - b);
  const n = gpus.length;
  if (size < 1 || size > n) throw new Error(`bad size ${size} for ${n} GPUs`);
  if (mustInclude.length > size || !mustInclude.every((g) => gpus.includes(g))) throw new Error('bad must-include');
  // Pair scores by position in `gpus`.
  const pair = gpus.map((a) => gpus.map((b) => (a === b ? 0 : m.score(a, b))));
  const setScore = (positions: readonly number[]): number => {
    let total = 0;
    for (const a of positions) for (const b of positions) if (a < b) total += pair[a]?.[b] ?? 0;
    return total;
  };
  const mustPos = mustInclude.map((g) => gpus.indexOf(g));
  const fullBlocks = Math.floor(n / size);
  const leftover = n % size;
  const blockCount = fullBlocks + (leftover === 0 ? 0 : 1);

  let best = -Infinity;
  let candidates: number[][] = [];
  let cuts = 0;
  const blocks: number[][] = [];
  const blockScore: number[] = [];

  const consider = (): void => {
    if (blocks.filter((b) => b.length === size).length !== fullBlocks) return;
    cuts++;
    const holders: number[] = [];
    blocks.forEach((b, i) => {
      if (b.length === size && mustPos.every((g) => b.includes(g))) holders.push(i);
    });
    if (holders.length === 0) return;
    const total = blockScore.reduce((t, v) => t + v, 0);
    if (total < best) return;
    if (total > best) {
      best = total;
      candidates = [];
    }
    const top = Math.max(...holders.map((i) => blockScore[i] ?? 0));
    for (const i of holders) if (blockScore[i] === top) candidates.push([...(blocks[i] ?? [])]);
  };

  const place = (next: number): void => {
    if (next === n) {
      if (blocks.length === blockCount) consider();
      return;
    }
    // Slots still to fill if every block but (possibly) the leftover one ends full.
    let open = 0;
    for (const b of blocks) open += size - b.length;
    if (open - (leftover === 0 ? 0 : size - leftover) > n - next) return;
    blocks.forEach((b, i) => {
      if (b.length >= size) return;
      let gain = 0;
      for (const x of b) gain += pair[x]?.[next] ?? 0;
      b.push(next);
      blockScore[i] = (blockScore[i] ?? 0) + gain;
      place(next + 1);
      blockScore[i] = (blockScore[i] ?? 0) - gain;
      b.pop();
    });
    if (blocks.length < blockCount) {
      blocks.push([next]);
      blockScore.push(0);
      place(next + 1);
      blockScore.pop();
      blocks.pop();
    }
  };
  place(0);

  const rated = candidates.map((positions) => ({
    group: positions.map((p) => gpus[p] as number),
    groupScore: setScore(positions),
    remainderScore: setScore(gpus.map((_, p) => p).filter((p) => !positions.includes(p))),
  }));
  rated.sort(
    (a, b) => b.groupScore - a.groupScore || b.remainderScore - a.remainderScore || lexCompare(a.group, b.group),
  );
  const winner = rated[0];
  if (winner === undefined) throw new Error('no valid cut (cannot happen for valid input)');
  return { ...winner, splitScore: best, cuts };
}
