// NVLink domains: groups of GPUs in which every pair can talk over NVLink, the value of the DRA
// attribute gpu.nvidia.com/nvlinkDomain (dra-slices.ts).
//
// Two GPUs are linked when they have an active NVLink between them or share an NVSwitch fabric, as
// the topology policy counts them (topology/scores.ts). A domain is a clique of that relation, never
// a chain: on a DGX-1 (hybrid cube mesh) GPU 0 and GPU 5 are joined only through other GPUs, so they
// must not share a value that `matchAttribute` would take as "these can talk to each other".
//
// RULE. Each GPU belongs to at most one domain. Domains are taken one at a time among the GPUs not
// yet in a domain: the largest group in which every pair is linked; among groups of equal size the
// one with the most NVLinks between its pairs; then the one whose minor numbers, sorted, come first.
// This repeats until no two GPUs left are linked. A GPU left over (e.g. one linked only to members of
// two full quads) gets no domain, like a GPU without NVLinks: a domain of one would promise nothing.
// A domain is numbered by the smallest minor number in it, stable while those GPUs stay.
//
// Examples: NVSwitch node — all GPUs one domain; DGX-1 — the two fully linked quads (0-3, 4-7);
// an NVLink bridge between GPUs 1 and 2 — that pair; no NVLinks — none.
import { buildScoreMatrix } from './topology/index.ts';
import type { NodeSnapshot } from './snapshot.ts';

/** A group of GPUs every pair of which is linked. */
interface Candidate {
  readonly members: readonly number[];
  readonly links: number;
  readonly minors: readonly number[];
}

/** Whether a comes before b: larger first, then more links, then the smaller sorted minors first. */
function better(a: Candidate, b: Candidate): boolean {
  if (a.members.length !== b.members.length) return a.members.length > b.members.length;
  if (a.links !== b.links) return a.links > b.links;
  for (let k = 0; k < a.minors.length; k++) {
    const x = a.minors[k] ?? 0;
    const y = b.minors[k] ?? 0;
    if (x !== y) return x < y;
  }
  return false;
}

/**
 * The best maximal clique among `left` (Bron–Kerbosch with a pivot), or null when no two GPUs of
 * `left` are linked.
 */
function bestClique(
  left: ReadonlySet<number>,
  linked: (i: number, j: number) => number,
  minor: (i: number) => number,
): Candidate | null {
  let best: Candidate | null = null;
  const neighbours = (v: number, of: ReadonlySet<number>): Set<number> =>
    new Set([...of].filter((u) => u !== v && linked(u, v) > 0));
  const visit = (r: number[], p: Set<number>, x: Set<number>): void => {
    if (p.size === 0 && x.size === 0) {
      if (r.length < 2) return;
      let links = 0;
      for (let a = 0; a < r.length; a++) for (let b = a + 1; b < r.length; b++) links += linked(r[a] ?? 0, r[b] ?? 0);
      const c: Candidate = { members: [...r], links, minors: r.map(minor).sort((a, b) => a - b) };
      if (best === null || better(c, best)) best = c;
      return;
    }
    const pivot = [...p, ...x][0] ?? 0;
    const skip = neighbours(pivot, p);
    for (const v of [...p].filter((u) => !skip.has(u))) {
      visit([...r, v], neighbours(v, p), neighbours(v, x));
      p.delete(v);
      x.add(v);
    }
  };
  visit([], new Set(left), new Set());
  return best;
}

/** Each GPU's NVLink domain by position (null: in no domain), by the rule above. */
export function nvlinkDomains(node: Pick<NodeSnapshot, 'gpus' | 'nvlinks'>): (number | null)[] {
  const n = node.gpus.length;
  const domains = new Array<number | null>(n).fill(null);
  if (node.nvlinks.length !== n) return domains;
  let matrix: ReturnType<typeof buildScoreMatrix>;
  try {
    matrix = buildScoreMatrix(node.nvlinks, () => -1);
  } catch {
    return domains;
  }
  const linked = (i: number, j: number): number => matrix.nvlinks(i, j);
  const minor = (i: number): number => node.gpus[i]?.minor ?? i;
  const left = new Set(Array.from({ length: n }, (_, i) => i));
  for (;;) {
    const clique = bestClique(left, linked, minor);
    if (clique === null) return domains;
    const id = clique.minors[0] ?? 0;
    for (const i of clique.members) {
      domains[i] = id;
      left.delete(i);
    }
  }
}
