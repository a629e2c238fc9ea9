// Pair scores of a machine's GPUs, from NVML's facts: PCIe levels, NVLinks and NVSwitch fabrics.
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

/** One active NVLink of a GPU, as seen from that GPU. */
export interface NvLinkEnd {
  readonly remoteBusId: string;
  readonly remote: 'gpu' | 'switch' | 'unknown';
  /** The link's number on this GPU, when known (a link the health signals see go down leaves). */
  readonly link?: number;
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

/**
 * Points for an NVML topology level. An unknown level (including -1, "NVML could not say") scores
 * 0: below SYSTEM, since nothing is known to connect the two GPUs better than across CPUs.
 */
export function pciePoints(level: number): number {
  switch (level) {
    case PcieLevel.INTERNAL:
      return 60;
    case PcieLevel.SINGLE:
      return 50;
    case PcieLevel.MULTIPLE:
      return 40;
    case PcieLevel.HOSTBRIDGE:
      return 30;
    case PcieLevel.NODE:
      return 20;
    case PcieLevel.SYSTEM:
      return 10;
    default:
      return 0;
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

  score(i: number, j: number): number {
    return this.scores[this.at(i, j)] ?? 0;
  }
  nvlinks(i: number, j: number): number {
    return this.links[this.at(i, j)] ?? 0;
  }
  pcieLevel(i: number, j: number): number {
    return this.levels[this.at(i, j)] ?? -1;
  }

  groupScore(indices: readonly number[]): number {
    let total = 0;
    for (let a = 0; a < indices.length; a++) {
      for (let b = a + 1; b < indices.length; b++) total += this.score(indices[a] ?? -1, indices[b] ?? -1);
    }
    return total;
  }
}

/** What the GPUs' links say: direct links as seen from each end, and each GPU's switch fabric. */
interface LinkFacts {
  /** seen[i * n + j]: links of GPU i whose far end is GPU j. */
  readonly seen: Int32Array;
  /** The fabric (a root switch bus id) of each GPU, undefined without switch links. */
  readonly fabric: readonly (string | undefined)[];
  /** Links of each GPU to switches. */
  readonly switchLinks: Int32Array;
}

/**
 * Reads the links of each GPU. Switch fabrics: union-find over switch bus ids, each GPU's
 * switches joined together. Throws if two GPUs share a bus id.
 */
function readLinks(gpus: readonly GpuLinkInfo[]): LinkFacts {
  const n = gpus.length;
  const indexOf = new Map<string, number>();
  gpus.forEach((g, i) => {
    const id = normalizeBusId(g.busId);
    if (indexOf.has(id))
      throw new Error(`two GPUs have the same PCI bus id ${id} (indices ${indexOf.get(id)} and ${i})`);
    indexOf.set(id, i);
  });
  const seen = new Int32Array(n * n);
  const parent = new Map<string, string>();
  const find = (x: string): string => {
    let root = x;
    for (let p = parent.get(root); p !== undefined && p !== root; p = parent.get(root)) root = p;
    for (let cur = x; cur !== root; ) {
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
  return { seen, fabric: firstSwitch.map((s) => (s === undefined ? undefined : find(s))), switchLinks };
}

/**
 * Builds the pair scores from link facts. `pcieLevel(i, j)` is called once per pair with i < j and
 * must give the NVML topology level of GPUs i and j (anything unknown scores 0 points).
 * Throws if two GPUs share a bus id.
 */
export function buildScoreMatrix(
  gpus: readonly GpuLinkInfo[],
  pcieLevel: (i: number, j: number) => number,
): ScoreMatrix {
  const n = gpus.length;
  const { seen, fabric, switchLinks } = readLinks(gpus);
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
