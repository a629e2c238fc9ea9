// The preferred-allocation policy of one machine (GetPreferredAllocation's GPU chooser): which
// GPUs to prefer, its objective and tie rule, and the cache of answers. The exact solver
// (solver.ts) answers for up to 16 available GPUs, the greedy fallback (greedy.ts) beyond.
//
// OBJECTIVE (NVIDIA's best-effort policy, solved exactly). Given the available GPUs A (n of them),
// the must-include GPUs M and the size k: cut ALL of A into floor(n/k) groups of k plus, when k does
// not divide n, one leftover group of n mod k (whose pairs also count). Among the cuts in which one
// full-size group holds all of M, take those with the greatest total score; the answer is a
// full-size group holding M with the greatest group score within its cut. Equivalently: the answer
// G (|G| = k, M within G) maximises score(G) + best(A \ G), where best(X) is the best cut of X into
// groups of k plus one leftover group; among the groups reaching that maximum (all of them are the
// best-scoring group holding M in some optimal cut, see TIE RULE) one is picked by the tie rule.
// Scores are those of scores.ts.
//
// TIE RULE (deterministic), in order:
//   1. greatest score(G) + best(A \ G)               (the objective: an optimal cut)
//   2. greatest score(G)                             (the best-scoring group of such a cut)
//   3. greatest score(A \ G), the pair score among the GPUs left behind, i.e. the group that cuts
//      the least connection to the rest, so well-connected GPUs stay together for later requests
//   4. lexicographically smallest ascending list of GPU indices.
// Keys 2-4 only pick among exact optima of the objective, never override it. With M empty, a
// group maximising key 2 among all groups of all optimal cuts is in particular a best-scoring
// group of its own cut, as the objective asks. Size 1: every cut scores 0 and every group scores
// 0, so key 3 decides: the GPU least connected to the other available GPUs (smallest sum of pair
// scores to them), ties the lowest index; with a must-include GPU it is that GPU. Size n: all of A.
//
// Masks over the machine's GPU indices when the machine has at most 16 GPUs (one solver for the
// machine); otherwise a solver over the available GPUs' positions when at most 16 are available.
// Answers are cached per (available set, must-include set, size).
import { maskToIndices } from './bits.ts';
import { greedyChoose } from './greedy.ts';
import type { ScoreMatrix } from './scores.ts';
import { ExactSolver } from './solver.ts';

/** Largest number of available GPUs solved exactly. */
export const MAX_EXACT_GPUS = 16;

const CACHE_LIMIT = 4096;
const LOCAL_SOLVER_LIMIT = 4;

/**
 * The preferred-allocation policy of one machine, built once from its score matrix. `choose`
 * takes GPU indices and returns the chosen GPU indices in ascending order (see the file comment
 * for the objective and the tie rule). Not safe for concurrent use from several threads (it is
 * single-threaded JavaScript; calls are synchronous).
 */
export class PreferredPolicy {
  /** Number of GPUs on the machine. */
  readonly size: number;
  private readonly matrix: ScoreMatrix;
  private readonly solver: ExactSolver | undefined;
  private readonly localSolvers = new Map<string, ExactSolver>();
  private readonly cache = new Map<number | string, readonly number[]>();

  /**
   * Builds the policy: subset scores and symmetries of the machine (at most 16 GPUs), then, unless
   * `options.warmUp` is false, warms it up (see warmUp()).
   */
  constructor(m: ScoreMatrix, options: { readonly warmUp?: boolean } = {}) {
    this.size = m.size;
    this.matrix = m;
    this.solver = m.size <= MAX_EXACT_GPUS ? new ExactSolver(m.size, (i, j) => m.score(i, j)) : undefined;
    if (options.warmUp !== false) this.warmUp();
  }

  /**
   * A few throw-away questions on up to 10 of the GPUs, so that the first real request runs code the
   * JIT has already optimised (the first call in a fresh process otherwise takes milliseconds).
   * Leaves no cached answers behind; answers never depend on it.
   */
  warmUp(): void {
    const n = Math.min(this.size, 10);
    if (n < 3) return;
    const some = Array.from({ length: n }, (_, i) => i);
    for (let rep = 0; rep < 3; rep++) {
      for (let k = 1; k <= n; k++) {
        this.choose(some, [], k);
        this.choose(some, [n - 1], k);
        this.choose(some.slice(1), [], Math.min(k, n - 1));
        this.clearCaches();
      }
    }
  }

  /**
   * Forgets cached answers and memo tables, so the next call is computed from scratch (for
   * measurements; answers do not change).
   */
  clearCaches(): void {
    this.cache.clear();
    this.localSolvers.clear();
    this.solver?.forget();
  }

  /**
   * Chooses `size` GPUs among `available` holding all of `mustInclude`. Throws an Error on
   * invalid input: size not an integer in 1..available.length, indices not integers in
   * 0..this.size-1, duplicates, must-include GPUs not available, more must-include GPUs than size.
   */
  choose(available: readonly number[], mustInclude: readonly number[], size: number): number[] {
    if (!Number.isInteger(size) || size < 1) throw new Error(`allocation size must be a positive integer, got ${size}`);
    if (size > available.length)
      throw new Error(`allocation size ${size} is larger than the ${available.length} available GPUs`);
    if (mustInclude.length > size)
      throw new Error(`${mustInclude.length} must-include GPUs do not fit in allocation size ${size}`);
    const solver = this.solver;
    return solver !== undefined
      ? this.chooseByMask(solver, available, mustInclude, size)
      : this.chooseByPosition(available, mustInclude, size);
  }

  /** Throws unless x is a GPU index of this machine. */
  private check(x: number, what: string): void {
    const N = this.size;
    if (!Number.isInteger(x) || x < 0 || x >= N) throw new Error(`${what} GPU index ${x} is not in 0..${N - 1}`);
  }

  /** A machine of at most 16 GPUs: masks over its GPU indices, one solver. */
  private chooseByMask(
    solver: ExactSolver,
    available: readonly number[],
    mustInclude: readonly number[],
    size: number,
  ): number[] {
    let A = 0;
    for (const x of available) {
      this.check(x, 'available');
      if ((A >>> x) & 1) throw new Error(`available GPU index ${x} is listed twice`);
      A |= 1 << x;
    }
    let M = 0;
    for (const x of mustInclude) {
      this.check(x, 'must-include');
      if (((A >>> x) & 1) === 0) throw new Error(`must-include GPU index ${x} is not available`);
      if ((M >>> x) & 1) throw new Error(`must-include GPU index ${x} is listed twice`);
      M |= 1 << x;
    }
    const key = (size * 65536 + M) * 65536 + A;
    const hit = this.cache.get(key);
    if (hit !== undefined) return hit.slice();
    const answer = maskToIndices(solver.choose(A, M, size));
    this.remember(key, answer);
    return answer.slice();
  }

  /**
   * A machine of more than 16 GPUs: a solver over the positions of the available GPUs when at
   * most 16 are (the last few such solvers kept), the greedy fallback otherwise.
   */
  private chooseByPosition(available: readonly number[], mustInclude: readonly number[], size: number): number[] {
    const avail = [...available].sort((a, b) => a - b);
    avail.forEach((x, p) => {
      this.check(x, 'available');
      if (p > 0 && avail[p - 1] === x) throw new Error(`available GPU index ${x} is listed twice`);
    });
    const must = [...mustInclude].sort((a, b) => a - b);
    const availSet = new Set(avail);
    must.forEach((x, p) => {
      this.check(x, 'must-include');
      if (!availSet.has(x)) throw new Error(`must-include GPU index ${x} is not available`);
      if (p > 0 && must[p - 1] === x) throw new Error(`must-include GPU index ${x} is listed twice`);
    });
    const availKey = avail.join(',');
    const key = `${size}|${must.join(',')}|${availKey}`;
    const hit = this.cache.get(key);
    if (hit !== undefined) return hit.slice();
    let answer: number[];
    if (avail.length <= MAX_EXACT_GPUS) {
      let local = this.localSolvers.get(availKey);
      if (local === undefined) {
        const m = this.matrix;
        local = new ExactSolver(avail.length, (i, j) => m.score(avail[i]!, avail[j]!));
        if (this.localSolvers.size >= LOCAL_SOLVER_LIMIT) this.localSolvers.clear();
        this.localSolvers.set(availKey, local);
      }
      const rank = new Map<number, number>(avail.map((x, p) => [x, p]));
      let M = 0;
      for (const x of must) M |= 1 << rank.get(x)!;
      answer = maskToIndices(local.choose((1 << avail.length) - 1, M, size)).map((p) => avail[p]!);
    } else {
      answer = greedyChoose(this.matrix, avail, must, size);
    }
    this.remember(key, answer);
    return answer.slice();
  }

  private remember(key: number | string, answer: readonly number[]): void {
    if (this.cache.size >= CACHE_LIMIT) this.cache.clear();
    this.cache.set(key, answer);
  }
}
