// The exact solver of the preferred-allocation objective (policy.ts) on at most 16 GPUs: the answer
// scan over the groups holding the must-include GPUs, each evaluated as w(G) + best(A \ G)
// (best-cut.ts) against the tie keys.
//
// - A quick heuristic cut (heuristic.ts) gives the first value the search must reach.
// - With M empty, best(A) is computed first, so only groups that could win on tie keys 2-4 are
//   evaluated at all.
// - Groups take twins outside M lowest first (symmetry.ts).
// Worst case O(sum over reachable states S of C(|S|-1, k-1)) group evaluations over at most 2^n
// states, as a plain DP; real topologies take tens to hundreds of microseconds on 16 GPUs. Machines
// without any symmetry and with widely varying scores (a random matrix, say) can take milliseconds
// for middle sizes.
import { lexLess, lowestIndex, MASK_GPUS, popcount } from './bits.ts';
import { BestCut } from './best-cut.ts';
import { heuristicCut } from './heuristic.ts';
import { LocalMachine } from './machine.ts';
import { Symmetry } from './symmetry.ts';

export class ExactSolver {
  private readonly machine: LocalMachine;
  private readonly w: Int32Array;
  private readonly sym: Symmetry;
  private readonly twinClass: Int32Array;
  private readonly dp: BestCut;

  // The answer scan: the available GPUs, the doubled bound of the cut, each GPU's partner sum
  // within A (see frames.ts), the GPUs outside M in ascending order, and the best group so far
  // with its objective value, group score and score of the GPUs it leaves behind.
  private scanA = 0;
  private scanUb = 0;
  private readonly scanC = new Int32Array(MASK_GPUS);
  private readonly scanEls = new Int32Array(MASK_GPUS);
  private bestVal = -1;
  private bestW = -1;
  private bestRem = -1;
  private bestG = 0;
  /** True when bestVal is the optimum itself (no must-include), so only the tie keys can win. */
  private valueKnown = false;

  /** Subset scores and symmetries of L GPUs (at most 16) with the given pair scores. */
  constructor(L: number, score: (i: number, j: number) => number) {
    this.machine = new LocalMachine(L, score);
    this.w = this.machine.w;
    this.sym = new Symmetry(L, this.machine.s);
    this.twinClass = this.sym.twinClass;
    this.dp = new BestCut(this.machine, this.sym);
  }

  /** Voids every memo entry. */
  forget(): void {
    this.dp.forget();
  }

  /**
   * The answer as a mask. A: available, M: must-include (M within A), 1 <= k <= |A|, |M| <= k.
   */
  choose(A: number, M: number, k: number): number {
    const n = popcount(A);
    if (k === n) return A;
    if (popcount(M) === k) return M;
    if (k === 1) return this.chooseOne(A);
    this.dp.begin(k);
    this.scanA = A;
    this.scanUb = this.scanBound(A, k, n);
    this.bestVal = -1;
    this.bestW = -1;
    this.bestRem = -1;
    this.bestG = 0;
    // A good cut found quickly gives the search a value it must reach (fail-soft pruning).
    const lower = heuristicCut(this.w, A, M, k);
    if (M === 0 && 2 * k <= n) {
      this.bestVal = this.dp.bestCut(A, lower);
      this.valueKnown = true;
      this.bestW = this.bestGroupOfOptimalCut(A, k);
    } else {
      // Some group holding M reaches `lower`; look for the best. (Also without M when only one
      // group of k fits: then the scan below sees every cut anyway.)
      this.bestVal = lower;
      this.valueKnown = false;
    }
    // Scan the groups holding M, in ascending lexicographic order; of twins outside M only the
    // lowest ones are taken (swapping twins changes no score and only makes the list larger).
    let count = 0;
    for (let x = A & ~M; x !== 0; x &= x - 1) this.scanEls[count++] = lowestIndex(x);
    let cM = 0;
    for (let x = M; x !== 0; x &= x - 1) cM += this.scanC[lowestIndex(x)]!;
    this.scan(0, count, k - popcount(M), M, cM, 0);
    return this.bestG;
  }

  /** Size 1: the GPU that leaves the best-scoring rest behind (tie rule key 3), lowest on ties. */
  private chooseOne(A: number): number {
    let best = -1;
    let bestRem = -1;
    for (let x = A; x !== 0; x &= x - 1) {
      const bit = x & -x;
      const rem = this.w[A ^ bit]!;
      if (rem > bestRem) {
        bestRem = rem;
        best = bit;
      }
    }
    return best;
  }

  /**
   * Partner sums within A for the answer scan (into scanC) and the doubled bound of a cut of A: what
   * is left after a group, A \ G, still owes the leftover group of n mod k (see BestCut).
   */
  private scanBound(A: number, k: number, n: number): number {
    const leftover = n % k;
    let ub = 0;
    const c = this.scanC;
    const ds: number[] = [];
    for (let x = A; x !== 0; x &= x - 1) {
      const i = lowestIndex(x);
      const ci = this.machine.topPartners(i, A, k - 1);
      c[i] = ci;
      ub += ci;
      if (leftover > 0) ds.push(ci - this.machine.topPartners(i, A, leftover - 1));
    }
    ds.sort((a, b) => a - b);
    for (let p = 0; p < leftover; p++) ub -= ds[p] ?? 0;
    return ub;
  }

  /**
   * With the optimal value of A known: the best group score within the optimal cut the DP found,
   * the group score the scan must reach (the cut is recorded for each state's representative;
   * scores do not depend on which).
   */
  private bestGroupOfOptimalCut(A: number, k: number): number {
    let bestW = -1;
    for (let S = this.sym.canon(A); popcount(S) >= k; ) {
      if (popcount(S) === k) {
        // The last full group (best(S) takes it whole).
        if (this.w[S]! > bestW) bestW = this.w[S]!;
        break;
      }
      // Memo entries of another size may have replaced a state on the path: make it exact.
      this.dp.bestCut(S, 0);
      const g = this.dp.firstGroup(S);
      if (g === 0 || (g & ~S) !== 0) throw new Error('internal error: optimal cut not recorded');
      if (popcount(g) === k && this.w[g]! > bestW) bestW = this.w[g]!;
      S = this.sym.canon(S ^ g);
    }
    return bestW;
  }

  /** Offers candidate group g with objective value val against the best so far (tie rule). */
  private offer(g: number, val: number): void {
    const wg = this.w[g]!;
    const rem = this.w[this.scanA ^ g]!;
    if (
      val > this.bestVal ||
      (val === this.bestVal &&
        (wg > this.bestW ||
          (wg === this.bestW && (rem > this.bestRem || (rem === this.bestRem && lexLess(g, this.bestG))))))
    ) {
      this.bestVal = val;
      this.bestW = wg;
      this.bestRem = rem;
      this.bestG = g;
    }
  }

  /**
   * Adds `left` more of scanEls[from..count) to group g (twins lowest first: `blocked` holds the
   * twin classes skipped at this position) and offers each completed group; `cg`: the partner
   * sums of g's members.
   */
  private scan(from: number, count: number, left: number, g: number, cg: number, blocked: number): void {
    if (left === 0) {
      const wg = this.w[g]!;
      const bound2 = 2 * wg + this.scanUb - cg; // >= 2 * objective value of g
      const bestVal = this.bestVal;
      if (bound2 < 2 * bestVal) return;
      if (this.valueKnown || bound2 < 2 * bestVal + 2) {
        // Can at best tie on the objective: must win on the tie keys.
        if (wg < this.bestW) return;
        if (wg === this.bestW) {
          const rem = this.w[this.scanA ^ g]!;
          if (rem < this.bestRem || (rem === this.bestRem && !lexLess(g, this.bestG))) return;
        }
      }
      const need = bestVal - wg;
      const rest = this.dp.bestCut(this.scanA ^ g, need);
      if (rest >= need) this.offer(g, wg + rest);
      return;
    }
    for (let p = from; p <= count - left; p++) {
      const i = this.scanEls[p]!;
      const cbit = 1 << this.twinClass[i]!;
      if ((blocked & cbit) !== 0) continue;
      this.scan(p + 1, count, left - 1, g | (1 << i), cg + this.scanC[i]!, blocked);
      blocked |= cbit;
    }
  }
}
