// Topology-aware choice of GPUs for GetPreferredAllocation. Pure: no I/O, no Node built-ins.
//
// SCORES. A pair of GPUs scores the points of its PCIe relation (NVML topology level: INTERNAL 60,
// SINGLE 50, MULTIPLE 40, HOSTBRIDGE 30, NODE 20, SYSTEM 10, anything else 0) plus 100 per NVLink
// between the two. A set of GPUs scores the sum over its pairs.
//
// NVLINKS. A link whose far end is the other GPU counts for that pair. Both ends normally report
// the same link; where the two ends disagree (one side's remote PCI info could not be read) the
// larger count is used. Links whose far end is an NVSwitch join the GPU to a switch fabric: a
// fabric is a connected component of the graph "GPU -- switch it has an active link to" (switch to
// switch trunks are invisible from the GPUs, so GPUs with disjoint switch sets count as separate
// fabrics). Two GPUs on the same fabric count min(links of the one to the fabric, links of the
// other to the fabric) NVLinks between them, added to any direct links. Links with an unknown far
// end, and links to GPUs not in the list, count for nothing.
//
// OBJECTIVE (NVIDIA's best-effort policy, solved exactly). Given the available GPUs A (n of them),
// the must-include GPUs M and the size k: cut ALL of A into floor(n/k) groups of k plus, when k does
// not divide n, one leftover group of n mod k (whose pairs also count). Among the cuts in which one
// full-size group holds all of M, take those with the greatest total score; the answer is a
// full-size group holding M with the greatest group score within its cut. Equivalently: the answer
// G (|G| = k, M within G) maximises score(G) + best(A \ G), where best(X) is the best cut of X into
// groups of k plus one leftover group; among the groups reaching that maximum (all of them are the
// best-scoring group holding M in some optimal cut, see TIE RULE) one is picked by the tie rule.
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
// ALGORITHM (n <= 16 available GPUs; masks over the machine's GPU indices when N <= 16).
// - Subset scores w(S) for all 2^N masks, once, in the constructor, by inclusion-exclusion:
//   w(S) = w(S-a) + w(S-b) - w(S-a-b) + s(a,b) for the two lowest members a, b.
// - best(S): memoised DP over bitmasks that always puts the lowest GPU of S into the next group (a
//   full group of k, or the leftover group while it is still due), so each cut is generated once.
// - Bound: a GPU gains at most the sum c_x of its k-1 best pair scores within S, so
//   2 best(S) <= sum of c_x, minus, while a leftover group is due, the n mod k smallest
//   differences between c_x and x's best (n mod k - 1) scores. A transition (group G) is
//   skipped when w(G) plus the bound of S \ G cannot reach what is needed, and whole runs of
//   transitions stop early: the lowest GPU's own shortfall against c_low, at best, only grows
//   along its partner list (sorted by score).
// - Fail-soft search: best(S, need) is exact when best(S) >= need, else an upper bound below
//   need. A quick heuristic cut (greedy groups improved by swaps) gives the first need, so states
//   that cannot matter are dismissed after one bound. Memo entries (exact values or upper
//   bounds) depend on S and k only and serve later calls of the same size.
// - Symmetry: twins (GPUs scoring alike with every other GPU) are interchangeable, and so are
//   blocks of equal shape that can be swapped wholesale (pairs under a PCIe switch, switches under
//   a socket, sockets: see findBlocks). States are memoised under a representative of their orbit
//   and groups take twins lowest first, which shrinks the search by an order of magnitude or more
//   on hierarchical PCIe and NVSwitch machines.
// - Answer: scan the groups G holding M (twins lowest first) in A, evaluating w(G) + best(A \ G)
//   against the tie keys; with M empty, best(A) is computed first, so only groups that could win
//   on keys 2-4 are evaluated at all.
// Worst case O(sum over reachable states S of C(|S|-1, k-1)) group evaluations over at most 2^n
// states, as a plain DP; real topologies take tens to hundreds of microseconds on 16 GPUs. Machines
// without any symmetry and with widely varying scores (a random matrix, say) can take milliseconds
// for middle sizes. Answers are cached per (available set, must-include set, size).
//
// Beyond 16 available GPUs a documented greedy fallback is used (not exact): start from the
// must-include GPUs (or, if none, the best-scoring pair, lowest indices on ties) and add the GPU
// with the greatest summed score to the group so far (lowest index on ties). Sizes 1 and n stay
// exact there too.

/** One active NVLink of a GPU, as seen from that GPU. */
export interface NvLinkEnd {
  readonly remoteBusId: string;
  readonly remote: 'gpu' | 'switch' | 'unknown';
}

/** A GPU's PCI bus id and its active NVLinks only. */
export interface GpuLinkInfo {
  readonly busId: string;
  readonly links: ReadonlyArray<NvLinkEnd>;
}

/** NVML topology levels (nvmlGpuTopologyLevel_t). */
export const PcieLevel = {
  INTERNAL: 0,
  SINGLE: 10,
  MULTIPLE: 20,
  HOSTBRIDGE: 30,
  NODE: 40,
  SYSTEM: 50,
} as const;

/** Points per NVLink between two GPUs. */
export const NVLINK_POINTS = 100;

/** Largest number of available GPUs solved exactly. */
export const MAX_EXACT_GPUS = 16;

/**
 * Points for an NVML topology level. An unknown level (including -1, "NVML could not say") scores
 * 0: below SYSTEM, since nothing is known to connect the two GPUs better than across CPUs.
 */
export function pciePoints(level: number): number {
  switch (level) {
    case PcieLevel.INTERNAL: return 60;
    case PcieLevel.SINGLE: return 50;
    case PcieLevel.MULTIPLE: return 40;
    case PcieLevel.HOSTBRIDGE: return 30;
    case PcieLevel.NODE: return 20;
    case PcieLevel.SYSTEM: return 10;
    default: return 0;
  }
}

/**
 * Canonical form of a PCI bus id: lower case, 8-digit domain (`00000000:07:00.0`), so that the
 * 4-digit legacy form and the 8-digit form of NVML compare equal. Unparseable ids are only trimmed
 * and lower-cased.
 */
export function normalizeBusId(id: string): string {
  const t = id.trim().toLowerCase();
  const m = /^(?:([0-9a-f]{1,8}):)?([0-9a-f]{1,2}):([0-9a-f]{1,2})\.([0-7])$/.exec(t);
  if (m === null) return t;
  const domain = (m[1] ?? '0').padStart(8, '0');
  return `${domain}:${(m[2] ?? '').padStart(2, '0')}:${(m[3] ?? '').padStart(2, '0')}.${m[4] ?? '0'}`;
}

/** Pair scores of a machine's GPUs, by GPU index. */
export interface ScoreMatrix {
  /** Number of GPUs. */
  readonly size: number;
  /** PCIe points plus NVLINK_POINTS per NVLink; 0 for i === j. */
  score(i: number, j: number): number;
  /** NVLinks counted between the two GPUs (direct plus shared switch fabric). */
  nvlinks(i: number, j: number): number;
  /** The NVML topology level given for the pair (-1 for i === j). */
  pcieLevel(i: number, j: number): number;
  /** Sum of pair scores over a set of distinct GPU indices. */
  groupScore(indices: readonly number[]): number;
}

class DenseScoreMatrix implements ScoreMatrix {
  readonly size: number;
  private readonly scores: Int32Array;
  private readonly links: Int32Array;
  private readonly levels: Int32Array;

  constructor(size: number, scores: Int32Array, links: Int32Array, levels: Int32Array) {
    this.size = size;
    this.scores = scores;
    this.links = links;
    this.levels = levels;
  }

  private at(i: number, j: number): number {
    const n = this.size;
    if (!Number.isInteger(i) || !Number.isInteger(j) || i < 0 || j < 0 || i >= n || j >= n) {
      throw new RangeError(`GPU index pair (${i}, ${j}) is outside 0..${n - 1}`);
    }
    return i * n + j;
  }

  score(i: number, j: number): number { return this.scores[this.at(i, j)] ?? 0; }
  nvlinks(i: number, j: number): number { return this.links[this.at(i, j)] ?? 0; }
  pcieLevel(i: number, j: number): number { return this.levels[this.at(i, j)] ?? -1; }

  groupScore(indices: readonly number[]): number {
    let total = 0;
    for (let a = 0; a < indices.length; a++) {
      for (let b = a + 1; b < indices.length; b++) total += this.score(indices[a] ?? -1, indices[b] ?? -1);
    }
    return total;
  }
}

/**
 * Builds the pair scores from link facts. `pcieLevel(i, j)` is called once per pair with i < j and
 * must give the NVML topology level of GPUs i and j (anything unknown scores 0 points).
 * Throws if two GPUs share a bus id.
 */
export function buildScoreMatrix(gpus: readonly GpuLinkInfo[], pcieLevel: (i: number, j: number) => number): ScoreMatrix {
  const n = gpus.length;
  const indexOf = new Map<string, number>();
  gpus.forEach((g, i) => {
    const id = normalizeBusId(g.busId);
    if (indexOf.has(id)) throw new Error(`two GPUs have the same PCI bus id ${id} (indices ${indexOf.get(id)} and ${i})`);
    indexOf.set(id, i);
  });

  // Direct GPU-to-GPU links as seen from each end.
  const seen = new Int32Array(n * n);
  // Switch fabrics: union-find over switch bus ids; each GPU's switches are joined together.
  const parent = new Map<string, string>();
  const find = (x: string): string => {
    let root = x;
    for (let p = parent.get(root); p !== undefined && p !== root; p = parent.get(root)) root = p;
    for (let cur = x; cur !== root;) {
      const next = parent.get(cur) ?? root;
      parent.set(cur, root);
      cur = next;
    }
    return root;
  };
  const switchLinks = new Int32Array(n);
  const firstSwitch: (string | undefined)[] = new Array<string | undefined>(n).fill(undefined);

  gpus.forEach((g, i) => {
    for (const link of g.links) {
      const remote = normalizeBusId(link.remoteBusId);
      if (link.remote === 'gpu') {
        const j = indexOf.get(remote);
        if (j !== undefined && j !== i) seen[i * n + j] = (seen[i * n + j] ?? 0) + 1;
      } else if (link.remote === 'switch') {
        if (!parent.has(remote)) parent.set(remote, remote);
        const first = firstSwitch[i];
        if (first === undefined) firstSwitch[i] = remote;
        else {
          const a = find(first);
          const b = find(remote);
          if (a !== b) parent.set(b, a);
        }
        switchLinks[i] = (switchLinks[i] ?? 0) + 1;
      }
    }
  });

  const fabric = firstSwitch.map((s) => (s === undefined ? undefined : find(s)));
  const scores = new Int32Array(n * n);
  const links = new Int32Array(n * n);
  const levels = new Int32Array(n * n).fill(-1);
  for (let i = 0; i < n; i++) {
    for (let j = i + 1; j < n; j++) {
      const direct = Math.max(seen[i * n + j] ?? 0, seen[j * n + i] ?? 0);
      const fi = fabric[i];
      const viaSwitch = fi !== undefined && fi === fabric[j] ? Math.min(switchLinks[i] ?? 0, switchLinks[j] ?? 0) : 0;
      const nv = direct + viaSwitch;
      const level = pcieLevel(i, j);
      const points = pciePoints(level) + NVLINK_POINTS * nv;
      scores[i * n + j] = points;
      scores[j * n + i] = points;
      links[i * n + j] = nv;
      links[j * n + i] = nv;
      const lv = Number.isInteger(level) ? level : -1;
      levels[i * n + j] = lv;
      levels[j * n + i] = lv;
    }
  }
  return new DenseScoreMatrix(n, scores, links, levels);
}

// ---------------------------------------------------------------------------------------------
// Exact solver over bitmasks of at most 16 GPUs ("local" indices 0..L-1).

const POPCOUNT = new Uint8Array(1 << 16);
for (let x = 1; x < POPCOUNT.length; x++) POPCOUNT[x] = (POPCOUNT[x >>> 1] ?? 0) + (x & 1);

function popcount(mask: number): number {
  return POPCOUNT[mask & 0xffff]! + POPCOUNT[mask >>> 16]!;
}

function lowestIndex(mask: number): number {
  return 31 - Math.clz32(mask & -mask);
}

/** The `count` lowest set bits of mask. */
function lowestBits(mask: number, count: number): number {
  let out = 0;
  for (let x = mask; count > 0 && x !== 0; x &= x - 1, count--) out |= x & -x;
  return out;
}

/** True when mask a, as an ascending index list, sorts before mask b (same popcount). */
function lexLess(a: number, b: number): boolean {
  const d = a ^ b;
  return d !== 0 && (a & d & -d) !== 0;
}

const STRIDE = 16;

/**
 * Swapping blocks B1 and B2 (member t of one with member t of the other) keeps every pair score:
 * each member scores with GPUs outside both as its counterpart does, and the pairs inside and
 * across the blocks map onto pairs of equal score.
 */
function swappable(L: number, s: Int32Array, b1: readonly number[], b2: readonly number[]): boolean {
  const z = b1.length;
  if (b2.length !== z) return false;
  let both = 0;
  for (const g of b1) both |= 1 << g;
  for (const g of b2) both |= 1 << g;
  for (let t = 0; t < z; t++) {
    const a = b1[t]!;
    const b = b2[t]!;
    for (let x = 0; x < L; x++) if (((both >>> x) & 1) === 0 && s[a * L + x] !== s[b * L + x]) return false;
    for (let u = 0; u < z; u++) {
      if (s[a * L + b1[u]!] !== s[b * L + b2[u]!]) return false;
      if (s[a * L + b2[u]!] !== s[b * L + b1[u]!]) return false;
    }
  }
  return true;
}

/**
 * Symmetries above twins, found bottom-up: starting from the twin classes (GPUs that score alike
 * with every other GPU), blocks of equal size that can be swapped wholesale (see `swappable`) are
 * merged into a bigger block, and so on until nothing merges (a PCIe tree gives pairs under a
 * switch, then switches under a socket, then sockets). Swappability is an equivalence (the swap of
 * B1 and B3 is the swap of B2 and B3 conjugated by the swap of B1 and B2), so comparing with one
 * representative suffices. Returns the merged blocks, children before parents; each block is its
 * list of children, each child its ordered list of GPUs.
 */
function findBlocks(L: number, s: Int32Array): number[][][] {
  let units: number[][] = [];
  const seen = new Array<boolean>(L).fill(false);
  for (let i = 0; i < L; i++) {
    if (seen[i]) continue;
    const unit = [i];
    for (let j = i + 1; j < L; j++) {
      if (!seen[j] && swappable(L, s, [i], [j])) {
        seen[j] = true;
        unit.push(j);
      }
    }
    units.push(unit);
  }
  const out: number[][][] = [];
  for (let merged = true; merged;) {
    merged = false;
    const used = new Array<boolean>(units.length).fill(false);
    const next: number[][] = [];
    units.forEach((unit, a) => {
      if (used[a]) return;
      const group = [unit];
      if (unit.length >= 2) {
        for (let b = a + 1; b < units.length; b++) {
          const other = units[b]!;
          if (!used[b] && swappable(L, s, unit, other)) {
            used[b] = true;
            group.push(other);
          }
        }
      }
      if (group.length >= 2) {
        out.push(group);
        next.push(group.flat());
        merged = true;
      } else {
        next.push(unit);
      }
    });
    units = next;
  }
  return out;
}

class ExactSolver {
  readonly L: number;
  private readonly s: Int32Array;
  /** w[mask] = pair score of the GPUs in mask. */
  private readonly w: Int32Array;
  /** Row i: the other GPUs by descending score to i, lowest index first on ties. */
  private readonly order: Int32Array;
  /** Twin class of each GPU, and the members of each class with more than one member. */
  private readonly cls: Int32Array;
  private readonly twinMasks: Int32Array;
  /** prefix[c * (STRIDE + 1) + t]: the t lowest members of twin class twinMasks[c]. */
  private readonly prefix: Int32Array;
  /**
   * Swappable blocks above the twins (see `findBlocks`), children before parents. Block b has
   * children blockChildren[blockStart[b] .. blockStart[b + 1]) (indices into the part tables),
   * all of the same size; `blockMask[b]` is the union of its children.
   */
  private readonly blockStart: Int32Array;
  private readonly blockChildren: Int32Array;
  private readonly blockMask: Int32Array;
  /** Per part p (a child of some block): gather tables (pattern of the part's members in S). */
  private readonly gatherLo: Int32Array;
  private readonly gatherHi: Int32Array;
  /** Per part p: scatter table, pattern -> mask, at scatterStart[p]. */
  private readonly scatter: Int32Array;
  private readonly scatterStart: Int32Array;
  private readonly patterns = new Int32Array(STRIDE);
  /** True when S must be canonicalised (there is some symmetry). */
  private readonly symmetric: boolean;
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

  // Search state. Per-depth slots: d * STRIDE + ... in the buffers, d in the small arrays.
  private k = 0;
  private depth = 0;
  private readonly cbuf: Int32Array;
  private readonly ebuf: Int32Array;
  private readonly dbuf = new Int32Array(STRIDE + 1);
  private readonly stS: Int32Array;
  private readonly stE: Int32Array;
  private readonly stRest: Int32Array;
  private readonly stState: Int32Array;
  private readonly stBest: Int32Array;
  private readonly stLowC: Int32Array;
  private readonly psbuf: Int32Array;
  private readonly stNeed: Int32Array;
  private readonly stHigh: Int32Array;

  // Top-level scan state.
  private scanA = 0;
  private scanUb = 0;
  private readonly scanC = new Int32Array(STRIDE);
  private readonly scanEls = new Int32Array(STRIDE);
  private bestVal = -1;
  private bestW = -1;
  private bestRem = -1;
  private bestG = 0;
  /** True when bestVal is the optimum itself (no must-include), so only the tie keys can win. */
  private valueKnown = false;

  constructor(L: number, score: (i: number, j: number) => number) {
    if (L > STRIDE) throw new Error(`exact solver handles at most ${STRIDE} GPUs, got ${L}`);
    this.L = L;
    const s = new Int32Array(L * L);
    for (let i = 0; i < L; i++) {
      for (let j = 0; j < L; j++) {
        if (i === j) continue;
        const v = score(i, j);
        if (!Number.isInteger(v) || v < 0 || v > 1e6) throw new Error(`pair score ${v} of GPUs ${i}, ${j} is not an integer in 0..1000000`);
        s[i * L + j] = v;
      }
    }
    for (let i = 0; i < L; i++) {
      for (let j = i + 1; j < L; j++) {
        if (s[i * L + j] !== s[j * L + i]) throw new Error(`pair scores of GPUs ${i}, ${j} differ by direction (${s[i * L + j]} and ${s[j * L + i]})`);
      }
    }
    this.s = s;
    // Subset scores by inclusion-exclusion over the two lowest members a, b.
    const w = new Int32Array(1 << L);
    for (let S = 3; S < w.length; S++) {
      const a = S & -S;
      const rest = S ^ a;
      if (rest === 0) continue;
      const b = rest & -rest;
      w[S] = w[rest]! + w[S ^ b]! - w[rest ^ b]! + s[lowestIndex(a) * L + lowestIndex(b)]!;
    }
    this.w = w;
    const order = new Int32Array(L * L);
    for (let i = 0; i < L; i++) {
      const others: number[] = [];
      for (let j = 0; j < L; j++) if (j !== i) others.push(j);
      others.sort((x, y) => s[i * L + y]! - s[i * L + x]! || x - y);
      order.set(others, i * L);
    }
    this.order = order;
    // Twins: i and j score the same with every other GPU. Swapping twins maps every cut to one of
    // equal score, so best(S) depends only on how many of each twin class S holds.
    const cls = new Int32Array(L).fill(-1);
    const twinMasks: number[] = [];
    let classes = 0;
    for (let i = 0; i < L; i++) {
      if (cls[i] !== -1) continue;
      let members = 1 << i;
      cls[i] = classes;
      for (let j = i + 1; j < L; j++) {
        if (cls[j] !== -1) continue;
        let twin = true;
        for (let x = 0; x < L && twin; x++) if (x !== i && x !== j && s[i * L + x] !== s[j * L + x]) twin = false;
        if (twin) { cls[j] = classes; members |= 1 << j; }
      }
      classes++;
      if (popcount(members) > 1) twinMasks.push(members);
    }
    this.cls = cls;
    this.twinMasks = Int32Array.from(twinMasks);
    this.prefix = new Int32Array(twinMasks.length * (STRIDE + 1));
    twinMasks.forEach((mm, c) => {
      for (let t = 0; t <= popcount(mm); t++) this.prefix[c * (STRIDE + 1) + t] = lowestBits(mm, t);
    });
    const blocks = findBlocks(L, s);
    const parts: number[][] = [];
    const starts: number[] = [0];
    const children: number[] = [];
    const masks: number[] = [];
    for (const b of blocks) {
      let mask = 0;
      for (const child of b) {
        children.push(parts.length);
        parts.push(child);
        for (const g of child) mask |= 1 << g;
      }
      starts.push(children.length);
      masks.push(mask);
    }
    this.blockStart = Int32Array.from(starts);
    this.blockChildren = Int32Array.from(children);
    this.blockMask = Int32Array.from(masks);
    this.gatherLo = new Int32Array(parts.length * 256);
    this.gatherHi = new Int32Array(parts.length * 256);
    const scatterStart: number[] = [];
    let scatterSize = 0;
    for (const part of parts) {
      scatterStart.push(scatterSize);
      scatterSize += 1 << part.length;
    }
    this.scatterStart = Int32Array.from(scatterStart);
    this.scatter = new Int32Array(scatterSize);
    parts.forEach((part, p) => {
      for (let byte = 0; byte < 256; byte++) {
        let lo = 0;
        let hi = 0;
        part.forEach((g, t) => {
          if (g < 8 && ((byte >>> g) & 1) !== 0) lo |= 1 << t;
          if (g >= 8 && ((byte >>> (g - 8)) & 1) !== 0) hi |= 1 << t;
        });
        this.gatherLo[p * 256 + byte] = lo;
        this.gatherHi[p * 256 + byte] = hi;
      }
      for (let pattern = 0; pattern < 1 << part.length; pattern++) {
        let mask = 0;
        part.forEach((g, t) => {
          if (((pattern >>> t) & 1) !== 0) mask |= 1 << g;
        });
        this.scatter[(scatterStart[p] ?? 0) + pattern] = mask;
      }
    });
    this.symmetric = twinMasks.length > 0 || blocks.length > 0;
    this.memo = new Int32Array(1 << L);
    this.choice = new Int32Array(1 << L);
    this.stamp = new Uint16Array(1 << L);
    const slots = (L + 2) * STRIDE;
    this.cbuf = new Int32Array(slots);
    this.ebuf = new Int32Array(slots);
    this.stS = new Int32Array(L + 2);
    this.stE = new Int32Array(L + 2);
    this.stRest = new Int32Array(L + 2);
    this.stState = new Int32Array(L + 2);
    this.stBest = new Int32Array(L + 2);
    this.stLowC = new Int32Array(L + 2);
    this.psbuf = new Int32Array((L + 2) * (STRIDE + 1));
    this.stNeed = new Int32Array(L + 2);
    this.stHigh = new Int32Array(L + 2);
  }

  /**
   * A representative of S's orbit under the symmetries found: from each twin class its lowest
   * members; then, block by block (children first), the children's patterns sorted in descending
   * order. Each step applies a score-preserving permutation of the GPUs, so best(canon(S)) equals
   * best(S); S's that differ by these symmetries mostly get the same representative.
   */
  private canon(S: number): number {
    const tm = this.twinMasks;
    for (let c = 0; c < tm.length; c++) {
      const mm = tm[c]!;
      S = (S & ~mm) | this.prefix[c * (STRIDE + 1) + popcount(S & mm)]!;
    }
    const nb = this.blockMask.length;
    if (nb === 0) return S;
    const pat = this.patterns;
    const ch = this.blockChildren;
    for (let b = 0; b < nb; b++) {
      const bm = S & this.blockMask[b]!;
      if (bm === 0 || bm === this.blockMask[b]) continue; // every child alike
      const from = this.blockStart[b]!;
      const to = this.blockStart[b + 1]!;
      const lo = S & 0xff;
      const hi = (S >>> 8) & 0xff;
      let n = 0;
      for (let q = from; q < to; q++) {
        const part = ch[q]!;
        const v = this.gatherLo[part * 256 + lo]! | this.gatherHi[part * 256 + hi]!;
        // Insertion into descending order.
        let t = n++;
        while (t > 0 && pat[t - 1]! < v) { pat[t] = pat[t - 1]!; t--; }
        pat[t] = v;
      }
      let out = S & ~this.blockMask[b]!;
      for (let q = from, t = 0; q < to; q++, t++) {
        const part = ch[q]!;
        out |= this.scatter[this.scatterStart[part]! + pat[t]!]!;
      }
      S = out;
    }
    return S;
  }

  /**
   * The answer as a mask. A: available, M: must-include (M within A), 1 <= k <= |A|, |M| <= k.
   */
  choose(A: number, M: number, k: number): number {
    const n = popcount(A);
    if (k === n) return A;
    if (popcount(M) === k) return M;
    if (k === 1) {
      let best = -1;
      let bestRem = -1;
      for (let x = A; x !== 0; x &= x - 1) {
        const bit = x & -x;
        const rem = this.w[A ^ bit]!;
        if (rem > bestRem) { bestRem = rem; best = bit; }
      }
      return best;
    }
    this.begin(k);
    // Bound contributions within A for the top-level scan: what is left after a group, A \ G,
    // still owes the leftover group of n mod k (see f).
    const leftover = n % k;
    let ub = 0;
    const c = this.scanC;
    const ds: number[] = [];
    for (let x = A; x !== 0; x &= x - 1) {
      const i = lowestIndex(x);
      const ci = this.topPartners(i, A, k - 1);
      c[i] = ci;
      ub += ci;
      if (leftover > 0) ds.push(ci - this.topPartners(i, A, leftover - 1));
    }
    ds.sort((a, b) => a - b);
    for (let p = 0; p < leftover; p++) ub -= ds[p] ?? 0;
    this.scanA = A;
    this.scanUb = ub;
    this.bestVal = -1;
    this.bestW = -1;
    this.bestRem = -1;
    this.bestG = 0;
    // A good cut found quickly gives the search a value it must reach (fail-soft pruning).
    const lower = this.heuristic(A, M, k);
    if (M === 0 && 2 * k <= n) {
      // The optimal value is known. The best group of the cut the DP found sets the group score
      // to reach (the cut is recorded for S's representative; scores do not depend on which).
      const opt = this.f(A, lower);
      this.bestVal = opt;
      this.valueKnown = true;
      for (let S = this.canon(A); popcount(S) >= k;) {
        if (popcount(S) === k) {
          // The last full group (best(S) takes it whole).
          if (this.w[S]! > this.bestW) this.bestW = this.w[S]!;
          break;
        }
        // Memo entries of another size may have replaced a state on the path: make it exact.
        this.f(S, 0);
        const g = this.choice[S]!;
        if (g === 0 || (g & ~S) !== 0) throw new Error('internal error: optimal cut not recorded');
        if (popcount(g) === k && this.w[g]! > this.bestW) this.bestW = this.w[g]!;
        S = this.canon(S ^ g);
      }
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
    for (let x = M; x !== 0; x &= x - 1) cM += c[lowestIndex(x)]!;
    this.scan(0, count, k - popcount(M), M, cM, 0);
    return this.bestG;
  }

  /**
   * The score of a good cut of A (one full group holding M, if M is not empty): groups grown
   * greedily from M and then from the lowest GPU left, improved by swapping GPUs between groups
   * while that raises the total. A lower bound of the optimum.
   */
  private heuristic(A: number, M: number, k: number): number {
    const w = this.w;
    const groups: number[] = [];
    let S = A;
    const grow = (start: number): number => {
      let g = start;
      while (popcount(g) < k) {
        let pick = 0;
        let gain = -1;
        for (let x = S & ~g; x !== 0; x &= x - 1) {
          const bit = x & -x;
          if (w[g | bit]! > gain) { gain = w[g | bit]!; pick = bit; }
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
          let ga = groups[a]!;
          let gb = groups[b]!;
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
          groups[a] = ga;
          groups[b] = gb;
        }
      }
    }
    let total = 0;
    for (const g of groups) total += w[g]!;
    return total;
  }

  private begin(k: number): void {
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

  /** Sum of the `need` best pair scores of GPU i to other GPUs in S. */
  private topPartners(i: number, S: number, need: number): number {
    const L = this.L;
    const row = i * L;
    let sum = 0;
    for (let t = 0; t < L - 1 && need > 0; t++) {
      const j = this.order[row + t]!;
      if (((S >>> j) & 1) !== 0) { sum += this.s[row + j]!; need--; }
    }
    return sum;
  }

  /** Offers candidate group g with objective value val against the best so far (tie rule). */
  private offer(g: number, val: number): void {
    const wg = this.w[g]!;
    const rem = this.w[this.scanA ^ g]!;
    if (val > this.bestVal
      || (val === this.bestVal && (wg > this.bestW
        || (wg === this.bestW && (rem > this.bestRem || (rem === this.bestRem && lexLess(g, this.bestG))))))) {
      this.bestVal = val;
      this.bestW = wg;
      this.bestRem = rem;
      this.bestG = g;
    }
  }

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
      const rest = this.f(this.scanA ^ g, need);
      if (rest >= need) this.offer(g, wg + rest);
      return;
    }
    for (let p = from; p <= count - left; p++) {
      const i = this.scanEls[p]!;
      const cbit = 1 << this.cls[i]!;
      if ((blocked & cbit) !== 0) continue;
      this.scan(p + 1, count, left - 1, g | (1 << i), cg + this.scanC[i]!, blocked);
      blocked |= cbit;
    }
  }

  /**
   * best(S), the best cut of S into groups of k plus one leftover group of |S| mod k, when it is
   * at least `need`; otherwise some upper bound of it below `need` (fail-soft: a state only has
   * to be solved exactly when it can matter to its caller). Memo entries are exact values (v + 1)
   * or upper bounds (-(u + 1)).
   */
  private f(S0: number, need: number): number {
    const memo = this.memo;
    const k = this.k;
    if (this.symmetric && this.stamp[S0] === this.epoch) {
      // S0 itself was a representative before: no need to look for it.
      const hit = memo[S0]!;
      if (hit > 0) return hit - 1;
      if (-hit - 1 < need) return -hit - 1;
    }
    const S = this.symmetric ? this.canon(S0) : S0;
    if (this.stamp[S] === this.epoch) {
      const hit = memo[S]!;
      if (hit > 0) return hit - 1;
      if (-hit - 1 < need) return -hit - 1;
    } else {
      this.stamp[S] = this.epoch;
    }
    const m = popcount(S);
    if (m <= k) {
      // Fewer than k GPUs: the leftover group; exactly k: one group.
      const v = this.w[S]!;
      memo[S] = v + 1;
      return v;
    }
    const d = this.depth;
    const base = d * STRIDE;
    const L = this.L;
    const s = this.s;
    const order = this.order;
    const cb = this.cbuf;
    const leftover = m % k;
    // c_i: the k-1 best pair scores of i within S; 2 best(S) <= sum of c_i. If a leftover group
    // is still due, `leftover` GPUs get only their leftover-1 best partners: subtract the
    // `leftover` smallest differences.
    const dmin = this.dbuf;
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
      cb[base + i] = sum;
      ub += sum;
      if (leftover > 0) {
        // Keep the `leftover` smallest differences, ascending, in dbuf[0..nd).
        const dv = sum - part;
        if (nd < leftover) nd++;
        else if (dv >= dmin[nd - 1]!) continue;
        let p = nd - 1;
        while (p > 0 && dmin[p - 1]! > dv) { dmin[p] = dmin[p - 1]!; p--; }
        dmin[p] = dv;
      }
    }
    let dsum = 0;
    for (let p = 0; p < nd; p++) dsum += dmin[p]!;
    const stateBound = ub - dsum; // >= 2 best(S)
    if (stateBound < 2 * need) {
      const u = stateBound >> 1;
      memo[S] = -(u + 1);
      return u;
    }
    const low = 31 - Math.clz32(S & -S);
    const eb = this.ebuf;
    const ps = this.psbuf;
    const pbase = d * (STRIDE + 1);
    let e = 0;
    const row = low * L;
    ps[pbase] = 0;
    for (let t = 0; t < L - 1; t++) {
      const j = order[row + t]!;
      if (((S >>> j) & 1) !== 0) {
        eb[base + e] = j;
        ps[pbase + e + 1] = ps[pbase + e]! + s[row + j]!;
        e++;
      }
    }
    this.depth = d + 1;
    this.stS[d] = S;
    this.stE[d] = e;
    this.stState[d] = stateBound;
    this.stBest[d] = -1;
    this.stNeed[d] = need;
    this.stHigh[d] = -1;
    // Groups of k holding the lowest GPU; then, if still due, leftover groups holding it.
    this.stRest[d] = stateBound;
    const lowBit = 1 << low;
    const lowC = cb[base + low]!;
    this.stLowC[d] = lowC;
    let done = this.rec(d, 0, k - 1, lowBit, lowC, 0, 0);
    if (!done && leftover > 0) {
      this.stRest[d] = ub;
      done = this.rec(d, 0, leftover - 1, lowBit, lowC, 0, 0);
    }
    this.depth = d;
    const best = this.stBest[d]!;
    if (best >= need) {
      memo[S] = best + 1;
      return best;
    }
    const u = Math.max(best, this.stHigh[d]!);
    memo[S] = -(u + 1);
    return u;
  }

  /**
   * Adds `left` more of the partners ebuf[d*STRIDE + p..] to group g (taking twins lowest first)
   * and tries each completed group as the next group of state stS[d]. Returns true once the
   * state's best reaches its bound (nothing can beat it). `pl`: pair scores of the lowest GPU
   * with the others in g.
   *
   * A group G passes the bound test iff the sum over its members x of deficit(x) = c_x - (x's
   * pair scores within G) is at most stRest - 2 * target. Deficits are never negative, and the
   * lowest GPU's deficit is at least c_low - pl - (its scores with the next `left` partners, which
   * are sorted by score): once that exceeds the slack, no later choice can pass either.
   */
  private rec(d: number, p: number, left: number, g: number, cg: number, blocked: number, pl: number): boolean {
    if (left === 0) {
      const wg = this.w[g]!;
      const best = this.stBest[d]!;
      const need = this.stNeed[d]!;
      const target = best >= need ? best + 1 : need;
      const bound2 = 2 * wg + this.stRest[d]! - cg; // >= 2 * (wg + best(S \ g))
      if (bound2 < 2 * target) {
        const u = bound2 >> 1;
        if (u > this.stHigh[d]!) this.stHigh[d] = u;
        return false;
      }
      const S = this.stS[d]!;
      const rest = S ^ g;
      // At most k GPUs left: one group (or the leftover) whose score is known.
      const v = wg + (popcount(rest) <= this.k ? this.w[rest]! : this.f(rest, target - wg));
      if (v >= target) {
        this.stBest[d] = v;
        this.choice[S] = g;
        if (2 * v >= this.stState[d]!) return true;
      } else if (v > this.stHigh[d]!) {
        this.stHigh[d] = v;
      }
      return false;
    }
    const base = d * STRIDE;
    const pbase = d * (STRIDE + 1);
    const e = this.stE[d]!;
    const eb = this.ebuf;
    const cb = this.cbuf;
    const ps = this.psbuf;
    const cls = this.cls;
    const lowC = this.stLowC[d]!;
    for (let q = p; q <= e - left; q++) {
      const best = this.stBest[d]!;
      const need = this.stNeed[d]!;
      const target = best >= need ? best + 1 : need;
      const rest = this.stRest[d]!;
      const deficit = lowC - pl - (ps[pbase + q + left]! - ps[pbase + q]!);
      if (deficit > rest - 2 * target) {
        const u = (rest - deficit) >> 1;
        if (u > this.stHigh[d]!) this.stHigh[d] = u;
        return false;
      }
      const x = eb[base + q]!;
      const cbit = 1 << cls[x]!;
      if ((blocked & cbit) !== 0) continue;
      if (this.rec(d, q + 1, left - 1, g | (1 << x), cg + cb[base + x]!, blocked, pl + ps[pbase + q + 1]! - ps[pbase + q]!)) return true;
      blocked |= cbit;
    }
    return false;
  }
}
// ---------------------------------------------------------------------------------------------

const CACHE_LIMIT = 4096;
const LOCAL_SOLVER_LIMIT = 4;

function maskToIndices(mask: number): number[] {
  const out: number[] = [];
  for (let x = mask; x !== 0; x &= x - 1) out.push(lowestIndex(x));
  return out;
}

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
    const N = this.size;
    if (!Number.isInteger(size) || size < 1) throw new Error(`allocation size must be a positive integer, got ${size}`);
    if (size > available.length) throw new Error(`allocation size ${size} is larger than the ${available.length} available GPUs`);
    if (mustInclude.length > size) throw new Error(`${mustInclude.length} must-include GPUs do not fit in allocation size ${size}`);
    const check = (x: number, what: string): void => {
      if (!Number.isInteger(x) || x < 0 || x >= N) throw new Error(`${what} GPU index ${x} is not in 0..${N - 1}`);
    };
    const solver = this.solver;
    if (solver !== undefined) {
      let A = 0;
      for (const x of available) {
        check(x, 'available');
        if ((A >>> x) & 1) throw new Error(`available GPU index ${x} is listed twice`);
        A |= 1 << x;
      }
      let M = 0;
      for (const x of mustInclude) {
        check(x, 'must-include');
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

    const avail = [...available].sort((a, b) => a - b);
    avail.forEach((x, p) => {
      check(x, 'available');
      if (p > 0 && avail[p - 1] === x) throw new Error(`available GPU index ${x} is listed twice`);
    });
    const must = [...mustInclude].sort((a, b) => a - b);
    const availSet = new Set(avail);
    must.forEach((x, p) => {
      check(x, 'must-include');
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

/** Greedy fallback beyond MAX_EXACT_GPUS available GPUs (exact only for sizes 1 and n). */
function greedyChoose(m: ScoreMatrix, avail: readonly number[], must: readonly number[], size: number): number[] {
  if (size === avail.length) return [...avail];
  const chosen = new Set<number>(must);
  if (size === 1 && chosen.size === 0) {
    // Tie rule key 3: the GPU least connected to the others; lowest index on ties.
    let best = -1;
    let bestSum = Infinity;
    for (const i of avail) {
      let sum = 0;
      for (const j of avail) if (j !== i) sum += m.score(i, j);
      if (sum < bestSum) { bestSum = sum; best = i; }
    }
    return [best];
  }
  if (chosen.size === 0) {
    let bestPair: [number, number] = [avail[0]!, avail[1]!];
    let bestScore = -1;
    for (let a = 0; a < avail.length; a++) {
      for (let b = a + 1; b < avail.length; b++) {
        const sc = m.score(avail[a]!, avail[b]!);
        if (sc > bestScore) { bestScore = sc; bestPair = [avail[a]!, avail[b]!]; }
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
      if (gain > bestGain) { bestGain = gain; best = x; }
    }
    chosen.add(best);
  }
  return [...chosen].sort((a, b) => a - b);
}
