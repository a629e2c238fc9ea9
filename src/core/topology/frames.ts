// The search frames of the exact DP (best-cut.ts): typed arrays allocated once per solver, so the
// recursion allocates nothing. Documented here, once.
import { MASK_GPUS } from './bits.ts';

/**
 * One frame per state being solved on the recursion stack: the state at depth d (d = 0 for the
 * outermost call of bestCut, d + 1 for a state it asks about) uses
 *   - the scalar slots [d] of the first group of arrays below;
 *   - the per-GPU slots [d * MASK_GPUS + i] (i a GPU index) or [d * MASK_GPUS + t] (t a position
 *     in a list) of `partnerSum` and `partners`;
 *   - the prefix slots [d * (MASK_GPUS + 1) + t], t = 0..partnerCount, of `partnerPrefix`.
 * A frame is written when its state is opened and read only while it is on the stack; depth never
 * exceeds L + 1 (each level removes at least one GPU), so L + 2 frames suffice.
 *
 * Terms: c_x, "partner sum" of GPU x in S: the sum of x's k-1 best pair scores with other GPUs in
 * S. Half the sum of c_x over S bounds best(S) from above; the bounds below are kept doubled so
 * they stay integers.
 */
export class SearchFrames {
  /** The state S (a mask) being solved at depth d. */
  readonly state: Int32Array;
  /** How many partners the lowest GPU of S has in S (entries of `partners` at this depth). */
  readonly partnerCount: Int32Array;
  /**
   * Doubled bound the groups are tested against: sum of c_x over S, less (while full groups of k
   * are tried and a leftover group is still due) the smallest differences described in bestCut.
   */
  readonly cutBound: Int32Array;
  /** Doubled upper bound of best(S) itself: once 2 * best reaches it, nothing can beat it. */
  readonly stateBound: Int32Array;
  /** Best cut value found so far for S; -1 before any. */
  readonly best: Int32Array;
  /** c_low: the partner sum of the lowest GPU of S (which every group tried here holds). */
  readonly lowPartnerSum: Int32Array;
  /** What the caller needs best(S) to reach (fail-soft: below it, an upper bound suffices). */
  readonly need: Int32Array;
  /** Greatest upper bound of the cuts found or dismissed below the target; -1 before any. */
  readonly upper: Int32Array;
  /** Per GPU x of S: c_x. */
  readonly partnerSum: Int32Array;
  /** The partners of the lowest GPU of S within S, by descending pair score (lowest index on ties). */
  readonly partners: Int32Array;
  /** partnerPrefix[t]: the lowest GPU's pair scores with its first t partners, summed. */
  readonly partnerPrefix: Int32Array;
  /** Scratch of bestCut: the smallest differences of partner sums, ascending (not per depth). */
  readonly shortfalls = new Int32Array(MASK_GPUS + 1);

  constructor(L: number) {
    const frames = L + 2;
    this.state = new Int32Array(frames);
    this.partnerCount = new Int32Array(frames);
    this.cutBound = new Int32Array(frames);
    this.stateBound = new Int32Array(frames);
    this.best = new Int32Array(frames);
    this.lowPartnerSum = new Int32Array(frames);
    this.need = new Int32Array(frames);
    this.upper = new Int32Array(frames);
    this.partnerSum = new Int32Array(frames * MASK_GPUS);
    this.partners = new Int32Array(frames * MASK_GPUS);
    this.partnerPrefix = new Int32Array(frames * (MASK_GPUS + 1));
  }
}
