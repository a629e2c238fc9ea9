// An obviously-correct, slow solver of the preferred-allocation objective, for checking the fast
// one. It lists every way of cutting the available GPUs into blocks (restricted growth: each GPU,
// in ascending order, joins an open block or opens a new one), keeps the cuts with the right block
// sizes, and applies the objective and the tie rule literally, as written in src/core/topology.ts:
//   - a cut is floor(n/k) blocks of k plus, if k does not divide n, one block of n mod k;
//   - with must-include GPUs, only cuts in which one full-size block holds all of them count;
//   - keep the cuts with the greatest total score; from each, its best-scoring full-size blocks
//     holding the must-include GPUs are the candidates;
//   - among candidates: greatest block score, then greatest score of the GPUs left out of the
//     block, then the lexicographically smallest ascending index list.
// Fine up to about 10 GPUs.
import type { ScoreMatrix } from '../../src/core/topology.ts';

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

function setScore(m: ScoreMatrix, gpus: readonly number[]): number {
  let total = 0;
  gpus.forEach((a, x) => {
    gpus.forEach((b, y) => {
      if (x < y) total += m.score(a, b);
    });
  });
  return total;
}

function lexCompare(a: readonly number[], b: readonly number[]): number {
  for (let i = 0; i < Math.min(a.length, b.length); i++) {
    const d = (a[i] ?? 0) - (b[i] ?? 0);
    if (d !== 0) return d;
  }
  return a.length - b.length;
}

export function bruteForceChoose(m: ScoreMatrix, available: readonly number[], mustInclude: readonly number[], size: number): BruteForceAnswer {
  const gpus = [...available].sort((a, b) => a - b);
  const n = gpus.length;
  if (size < 1 || size > n) throw new Error(`bad size ${size} for ${n} GPUs`);
  if (mustInclude.length > size || !mustInclude.every((g) => gpus.includes(g))) throw new Error('bad must-include');
  const fullBlocks = Math.floor(n / size);
  const blockCount = fullBlocks + (n % size === 0 ? 0 : 1);

  let best = -Infinity;
  let candidates: number[][] = [];
  let cuts = 0;
  const blocks: number[][] = [];

  const consider = (): void => {
    if (blocks.filter((b) => b.length === size).length !== fullBlocks) return;
    cuts++;
    const full = blocks.filter((b) => b.length === size && mustInclude.every((g) => b.includes(g)));
    if (full.length === 0) return;
    const total = blocks.reduce((t, b) => t + setScore(m, b), 0);
    if (total < best) return;
    if (total > best) {
      best = total;
      candidates = [];
    }
    const top = Math.max(...full.map((b) => setScore(m, b)));
    for (const b of full) if (setScore(m, b) === top) candidates.push([...b]);
  };

  const place = (next: number): void => {
    if (next === n) {
      if (blocks.length === blockCount) consider();
      return;
    }
    const g = gpus[next] as number;
    for (const b of blocks) {
      if (b.length < size) {
        b.push(g);
        place(next + 1);
        b.pop();
      }
    }
    if (blocks.length < blockCount) {
      blocks.push([g]);
      place(next + 1);
      blocks.pop();
    }
  };
  place(0);

  const rated = candidates.map((group) => ({
    group,
    groupScore: setScore(m, group),
    remainderScore: setScore(m, gpus.filter((g) => !group.includes(g))),
  }));
  rated.sort((a, b) => b.groupScore - a.groupScore || b.remainderScore - a.remainderScore || lexCompare(a.group, b.group));
  const winner = rated[0];
  if (winner === undefined) throw new Error('no valid cut (cannot happen for valid input)');
  return { ...winner, splitScore: best, cuts };
}
