// Symmetries of a machine's pair scores, for the exact solver: permutations of the GPUs that keep
// every pair score, so that best(S) is the same for every S in one orbit. Twins (GPUs scoring
// alike with every other GPU) are interchangeable, and so are blocks of equal shape that can be
// swapped wholesale (pairs under a PCIe switch, switches under a socket, sockets: see findBlocks).
// The solver memoises states under a representative of their orbit (`canon`) and takes twins
// lowest first, which shrinks the search by an order of magnitude or more on hierarchical PCIe and
// NVSwitch machines.
import { lowestBits, MASK_GPUS, popcount } from './bits.ts';

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
  for (let merged = true; merged; ) {
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

/**
 * Twins: i and j score the same with every other GPU. Swapping twins maps every cut to one of
 * equal score, so best(S) depends only on how many of each twin class S holds. Returns each GPU's
 * class and the members of each class with more than one member.
 */
function twinClasses(L: number, s: Int32Array): { cls: Int32Array; twinMasks: number[] } {
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
      if (twin) {
        cls[j] = classes;
        members |= 1 << j;
      }
    }
    classes++;
    if (popcount(members) > 1) twinMasks.push(members);
  }
  return { cls, twinMasks };
}

/** The block tables of `Symmetry`, from findBlocks' blocks (see the fields there). */
function blockTables(blocks: readonly (readonly (readonly number[])[])[]): {
  blockStart: Int32Array;
  blockChildren: Int32Array;
  blockMask: Int32Array;
  gatherLo: Int32Array;
  gatherHi: Int32Array;
  scatter: Int32Array;
  scatterStart: Int32Array;
} {
  const parts: (readonly number[])[] = [];
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
  const gatherLo = new Int32Array(parts.length * 256);
  const gatherHi = new Int32Array(parts.length * 256);
  const scatterStart: number[] = [];
  let scatterSize = 0;
  for (const part of parts) {
    scatterStart.push(scatterSize);
    scatterSize += 1 << part.length;
  }
  const scatter = new Int32Array(scatterSize);
  parts.forEach((part, p) => {
    for (let byte = 0; byte < 256; byte++) {
      let lo = 0;
      let hi = 0;
      part.forEach((g, t) => {
        if (g < 8 && ((byte >>> g) & 1) !== 0) lo |= 1 << t;
        if (g >= 8 && ((byte >>> (g - 8)) & 1) !== 0) hi |= 1 << t;
      });
      gatherLo[p * 256 + byte] = lo;
      gatherHi[p * 256 + byte] = hi;
    }
    for (let pattern = 0; pattern < 1 << part.length; pattern++) {
      let mask = 0;
      part.forEach((g, t) => {
        if (((pattern >>> t) & 1) !== 0) mask |= 1 << g;
      });
      scatter[(scatterStart[p] ?? 0) + pattern] = mask;
    }
  });
  return {
    blockStart: Int32Array.from(starts),
    blockChildren: Int32Array.from(children),
    blockMask: Int32Array.from(masks),
    gatherLo,
    gatherHi,
    scatter,
    scatterStart: Int32Array.from(scatterStart),
  };
}

export class Symmetry {
  /** Twin class of each GPU. */
  readonly twinClass: Int32Array;
  /** True when states must be canonicalised (there is some symmetry). */
  readonly symmetric: boolean;
  /** The members of each twin class with more than one member. */
  private readonly twinMasks: Int32Array;
  /** prefix[c * (MASK_GPUS + 1) + t]: the t lowest members of twin class twinMasks[c]. */
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
  private readonly patterns = new Int32Array(MASK_GPUS);

  constructor(L: number, s: Int32Array) {
    const { cls, twinMasks } = twinClasses(L, s);
    this.twinClass = cls;
    this.twinMasks = Int32Array.from(twinMasks);
    this.prefix = new Int32Array(twinMasks.length * (MASK_GPUS + 1));
    twinMasks.forEach((mm, c) => {
      for (let t = 0; t <= popcount(mm); t++) this.prefix[c * (MASK_GPUS + 1) + t] = lowestBits(mm, t);
    });
    const blocks = findBlocks(L, s);
    const tables = blockTables(blocks);
    this.blockStart = tables.blockStart;
    this.blockChildren = tables.blockChildren;
    this.blockMask = tables.blockMask;
    this.gatherLo = tables.gatherLo;
    this.gatherHi = tables.gatherHi;
    this.scatter = tables.scatter;
    this.scatterStart = tables.scatterStart;
    this.symmetric = twinMasks.length > 0 || blocks.length > 0;
  }

  /**
   * A representative of S's orbit under the symmetries found: from each twin class its lowest
   * members; then, block by block (children first), the children's patterns sorted in descending
   * order. Each step applies a score-preserving permutation of the GPUs, so best(canon(S)) equals
   * best(S); S's that differ by these symmetries mostly get the same representative.
   */
  canon(S: number): number {
    const tm = this.twinMasks;
    for (let c = 0; c < tm.length; c++) {
      const mm = tm[c]!;
      S = (S & ~mm) | this.prefix[c * (MASK_GPUS + 1) + popcount(S & mm)]!;
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
        while (t > 0 && pat[t - 1]! < v) {
          pat[t] = pat[t - 1]!;
          t--;
        }
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
}
