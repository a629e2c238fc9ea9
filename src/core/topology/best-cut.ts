// best(S) for the exact solver: the greatest total score of a cut of the GPUs S into groups of k
// plus one leftover group of |S| mod k (whose pairs also count), by a memoised, bounded DP over
// bitmasks.
//
// - The DP always puts the lowest GPU of S into the next group (a full group of k, or the leftover
//   group while it is still due), so each cut is generated once.
// - Bound: a GPU gains at most the sum c_x of its k-1 best pair scores within S, so
//   2 best(S) <= sum of c_x, minus, while a leftover group is due, the n mod k smallest
//   differences between c_x and x's best (n mod k - 1) scores. A transition (group G) is skipped
//   when w(G) plus the bound of S \ G cannot reach what is needed, and whole runs of transitions
//   stop early: the lowest GPU's own shortfall against c_low, at best, only grows along its
//   partner list (sorted by score).
// - Fail-soft search: bestCut(S, need) is exact when best(S) >= need, else an upper bound below
//   need, so states that cannot matter are dismissed after one bound.
// - Memo entries (exact values or upper bounds) depend on S and k only and serve later calls of
//   the same size; states are memoised under their orbit's representative (symmetry.ts), and
//   groups take twins lowest first.
import { lowestIndex, MASK_GPUS, popcount } from './bits.ts';
import { SearchFrames } from './frames.ts';
import type { LocalMachine } from './machine.ts';
import type { Symmetry } from './symmetry.ts';

/** recall's answer when the memo has nothing that serves (values and bounds are at least -1). */
const MISS = -2;

export class BestCut {
  private readonly L: number;
  private readonly s: Int32Array;
  private readonly w: Int32Array;
  private readonly order: Int32Array;
  private readonly sym: Symmetry;
  private readonly twinClass: Int32Array;
  /**
   * Memo of best(S), valid when `stamp[S]` is the current epoch: v + 1 when exact, -(u + 1) when
   * only an upper bound u is known; `choice[S]` is the first group of an optimal cut of S (when
   * exact). best(S) depends on S and the size only, so entries serve every later call of the same
   * size; a call with another size (or `forget`) starts a new epoch.
   */
  private readonly memo: Int32Array;
  private readonly choice: Int32Array;
  private readonly stamp: Uint16Array;
  private epoch = 0;
  /** The group size k. */
  private k = 0;
  /** The first free frame (see SearchFrames). */
  private depth = 0;
  private readonly frames: SearchFrames;

  constructor(machine: LocalMachine, sym: Symmetry) {
    const L = machine.L;
    this.L = L;
    this.s = machine.s;
    this.w = machine.w;
    this.order = machine.order;
    this.sym = sym;
    this.twinClass = sym.twinClass;
    this.memo = new Int32Array(1 << L);
    this.choice = new Int32Array(1 << L);
    this.stamp = new Uint16Array(1 << L);
    this.frames = new SearchFrames(L);
  }

  /** Starts a call with group size k: the memo stays valid only for the same size. */
  begin(k: number): void {
    if (k !== this.k) this.forget();
    this.k = k;
    this.depth = 0;
  }

  /** Voids every memo entry. */
  forget(): void {
    if (this.epoch === 0xffff) {
      this.stamp.fill(0);
      this.epoch = 0;
    }
    this.epoch++;
  }

  /** The first group of the optimal cut recorded for S (after an exact bestCut of S). */
  firstGroup(S: number): number {
    return this.choice[S]!;
  }

  /** The memo's answer for S given `need`, or MISS. */
  private recall(S: number, need: number): number {
    if (this.stamp[S] !== this.epoch) return MISS;
    const hit = this.memo[S]!;
    if (hit > 0) return hit - 1;
    return -hit - 1 < need ? -hit - 1 : MISS;
  }

  /**
   * best(S), the best cut of S into groups of k plus one leftover group of |S| mod k, when it is
   * at least `need`; otherwise some upper bound of it below `need` (fail-soft: a state only has
   * to be solved exactly when it can matter to its caller).
   */
  bestCut(S0: number, need: number): number {
    const memo = this.memo;
    const sym = this.sym;
    // S0 itself may have been a representative before: then no need to look for it.
    let hit = sym.symmetric ? this.recall(S0, need) : MISS;
    if (hit !== MISS) return hit;
    const S = sym.symmetric ? sym.canon(S0) : S0;
    hit = this.recall(S, need);
    if (hit !== MISS) return hit;
    this.stamp[S] = this.epoch;
    const k = this.k;
    const m = popcount(S);
    if (m <= k) {
      // Fewer than k GPUs: the leftover group; exactly k: one group.
      const v = this.w[S]!;
      memo[S] = v + 1;
      return v;
    }
    const fr = this.frames;
    const d = this.depth;
    const leftover = m % k;
    const partnerTotal = this.partnerBounds(S, d, leftover);
    const stateBound = fr.stateBound[d]!;
    if (stateBound < 2 * need) {
      const u = stateBound >> 1;
      memo[S] = -(u + 1);
      return u;
    }
    const low = lowestIndex(S);
    fr.partnerCount[d] = this.listPartners(S, low, d);
    fr.state[d] = S;
    fr.best[d] = -1;
    fr.need[d] = need;
    fr.upper[d] = -1;
    const lowBit = 1 << low;
    const lowC = fr.partnerSum[d * MASK_GPUS + low]!;
    fr.lowPartnerSum[d] = lowC;
    this.depth = d + 1;
    // Groups of k holding the lowest GPU; then, if still due, leftover groups holding it.
    fr.cutBound[d] = stateBound;
    if (!this.extendGroup(d, 0, k - 1, lowBit, lowC, 0, 0) && leftover > 0) {
      fr.cutBound[d] = partnerTotal;
      this.extendGroup(d, 0, leftover - 1, lowBit, lowC, 0, 0);
    }
    this.depth = d;
    const best = fr.best[d]!;
    if (best >= need) {
      memo[S] = best + 1;
      return best;
    }
    const u = Math.max(best, fr.upper[d]!);
    memo[S] = -(u + 1);
    return u;
  }

  /**
   * Writes frame d's partner sums c_i (the k-1 best pair scores of i within S) and its state bound
   * (>= 2 best(S)), and returns the sum of the c_i. 2 best(S) <= sum of c_i; if a leftover group
   * is still due, `leftover` GPUs get only their leftover-1 best partners: the state bound is less
   * the `leftover` smallest differences.
   */
  private partnerBounds(S: number, d: number, leftover: number): number {
    const L = this.L;
    const s = this.s;
    const order = this.order;
    const k = this.k;
    const partnerSum = this.frames.partnerSum;
    const base = d * MASK_GPUS;
    const dmin = this.frames.shortfalls;
    let nd = 0;
    let ub = 0;
    for (let x = S; x !== 0; x &= x - 1) {
      const i = 31 - Math.clz32(x & -x);
      const row = i * L;
      let got = 0;
      let sum = 0;
      let part = 0;
      for (let t = 0; got < k - 1 && t < L - 1; t++) {
        const j = order[row + t]!;
        if (((S >>> j) & 1) !== 0) {
          sum += s[row + j]!;
          got++;
          if (got === leftover - 1) part = sum;
        }
      }
      partnerSum[base + i] = sum;
      ub += sum;
      if (leftover > 0) {
        // Keep the `leftover` smallest differences, ascending, in dmin[0..nd).
        const dv = sum - part;
        if (nd < leftover) nd++;
        else if (dv >= dmin[nd - 1]!) continue;
        let p = nd - 1;
        while (p > 0 && dmin[p - 1]! > dv) {
          dmin[p] = dmin[p - 1]!;
          p--;
        }
        dmin[p] = dv;
      }
    }
    let dsum = 0;
    for (let p = 0; p < nd; p++) dsum += dmin[p]!;
    this.frames.stateBound[d] = ub - dsum;
    return ub;
  }

  /** Writes frame d's partner list of the lowest GPU `low` within S and its prefix sums; returns its length. */
  private listPartners(S: number, low: number, d: number): number {
    const L = this.L;
    const s = this.s;
    const order = this.order;
    const partners = this.frames.partners;
    const prefix = this.frames.partnerPrefix;
    const base = d * MASK_GPUS;
    const pbase = d * (MASK_GPUS + 1);
    const row = low * L;
    let e = 0;
    prefix[pbase] = 0;
    for (let t = 0; t < L - 1; t++) {
      const j = order[row + t]!;
      if (((S >>> j) & 1) !== 0) {
        partners[base + e] = j;
        prefix[pbase + e + 1] = prefix[pbase + e]! + s[row + j]!;
        e++;
      }
    }
    return e;
  }

  /**
   * Adds `left` more of frame d's partners from position p on to group g (taking twins lowest
   * first) and tries each completed group as the next group of the frame's state. Returns true
   * once the state's best reaches its bound (nothing can beat it). `cg`: the partner sums of g's
   * members; `blocked`: twin classes skipped at this position; `pl`: pair scores of the lowest GPU
   * with the others in g.
   *
   * A group G passes the bound test iff the sum over its members x of deficit(x) = c_x - (x's
   * pair scores within G) is at most cutBound - 2 * target. Deficits are never negative, and the
   * lowest GPU's deficit is at least c_low - pl - (its scores with the next `left` partners, which
   * are sorted by score): once that exceeds the slack, no later choice can pass either.
   */
  private extendGroup(d: number, p: number, left: number, g: number, cg: number, blocked: number, pl: number): boolean {
    if (left === 0) return this.tryGroup(d, g, cg);
    const fr = this.frames;
    const base = d * MASK_GPUS;
    const pbase = d * (MASK_GPUS + 1);
    const e = fr.partnerCount[d]!;
    const partners = fr.partners;
    const partnerSum = fr.partnerSum;
    const prefix = fr.partnerPrefix;
    const cls = this.twinClass;
    const lowC = fr.lowPartnerSum[d]!;
    for (let q = p; q <= e - left; q++) {
      const best = fr.best[d]!;
      const need = fr.need[d]!;
      const target = best >= need ? best + 1 : need;
      const bound = fr.cutBound[d]!;
      const deficit = lowC - pl - (prefix[pbase + q + left]! - prefix[pbase + q]!);
      if (deficit > bound - 2 * target) {
        const u = (bound - deficit) >> 1;
        if (u > fr.upper[d]!) fr.upper[d] = u;
        return false;
      }
      const x = partners[base + q]!;
      const cbit = 1 << cls[x]!;
      if ((blocked & cbit) !== 0) continue;
      if (
        this.extendGroup(
          d,
          q + 1,
          left - 1,
          g | (1 << x),
          cg + partnerSum[base + x]!,
          blocked,
          pl + prefix[pbase + q + 1]! - prefix[pbase + q]!,
        )
      )
        return true;
      blocked |= cbit;
    }
    return false;
  }

  /** Tries the completed group g (partner sums cg) as the next group of frame d's state; true as in extendGroup. */
  private tryGroup(d: number, g: number, cg: number): boolean {
    const fr = this.frames;
    const wg = this.w[g]!;
    const best = fr.best[d]!;
    const need = fr.need[d]!;
    const target = best >= need ? best + 1 : need;
    const bound2 = 2 * wg + fr.cutBound[d]! - cg; // >= 2 * (wg + best(S \ g))
    if (bound2 < 2 * target) {
      const u = bound2 >> 1;
      if (u > fr.upper[d]!) fr.upper[d] = u;
      return false;
    }
    const S = fr.state[d]!;
    const rest = S ^ g;
    // At most k GPUs left: one group (or the leftover) whose score is known.
    const v = wg + (popcount(rest) <= this.k ? this.w[rest]! : this.bestCut(rest, target - wg));
    if (v >= target) {
      fr.best[d] = v;
      this.choice[S] = g;
      if (2 * v >= fr.stateBound[d]!) return true;
    } else if (v > fr.upper[d]!) {
      fr.upper[d] = v;
    }
    return false;
  }
}
