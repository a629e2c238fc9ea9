import { test } from 'node:test';
import assert from 'node:assert/strict';
import type { GpuLinkInfo, NvLinkEnd, ScoreMatrix } from '../../src/core/topology/index.ts';
import {
  buildScoreMatrix,
  normalizeBusId,
  PcieLevel,
  pciePoints,
  PreferredPolicy,
} from '../../src/core/topology/index.ts';
import { bruteForceChoose } from '../support/brute-force-policy.ts';
import {
  bridgedPair,
  dgx1,
  fixtureMatrix,
  gpuBusId,
  nvswitch16,
  nvswitch8,
  pcie16,
  pcie8,
  switchBusId,
  switchLinks,
} from '../support/topology-fixtures.ts';

// ---------------------------------------------------------------------------------------------
// Seeded pseudo-random numbers (mulberry32), so that a failure can be reproduced from its seed.

function prng(seed: number): () => number {
  let a = seed >>> 0;
  return () => {
    a = (a + 0x6d2b79f5) >>> 0;
    let t = a;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}

function pick<T>(rand: () => number, items: readonly T[]): T {
  return items[Math.floor(rand() * items.length)] as T;
}

function shuffled<T>(rand: () => number, items: readonly T[]): T[] {
  const out = [...items];
  for (let i = out.length - 1; i > 0; i--) {
    const j = Math.floor(rand() * (i + 1));
    [out[i], out[j]] = [out[j] as T, out[i] as T];
  }
  return out;
}

interface RandomTopology {
  readonly gpus: GpuLinkInfo[];
  readonly level: (i: number, j: number) => number;
}

/**
 * A random machine of n GPUs: a few NUMA nodes, coarse PCIe levels (so that ties are common),
 * direct NVLinks (sometimes listed by one end only), and sometimes NVSwitch fabrics with uneven
 * link counts; now and then an unknown PCIe level or a link to an unknown far end.
 */
function randomTopology(rand: () => number, n: number): RandomTopology {
  const sockets = 1 + Math.floor(rand() * 2);
  const numa = Array.from({ length: n }, () => Math.floor(rand() * sockets));
  const levels = new Map<string, number>();
  const palette =
    rand() < 0.3
      ? [PcieLevel.NODE]
      : [PcieLevel.INTERNAL, PcieLevel.SINGLE, PcieLevel.MULTIPLE, PcieLevel.HOSTBRIDGE, PcieLevel.NODE, -1];
  for (let i = 0; i < n; i++) {
    for (let j = i + 1; j < n; j++) {
      levels.set(`${i},${j}`, numa[i] === numa[j] ? pick(rand, palette) : rand() < 0.95 ? PcieLevel.SYSTEM : 77);
    }
  }
  const links: NvLinkEnd[][] = Array.from({ length: n }, () => []);
  const style = pick(rand, ['none', 'direct', 'switch', 'both']);
  if (style === 'direct' || style === 'both') {
    const pairs = Math.floor(rand() * n * 1.5);
    for (let p = 0; p < pairs; p++) {
      const a = Math.floor(rand() * n);
      const b = Math.floor(rand() * n);
      if (a === b) continue;
      const count = 1 + Math.floor(rand() * 2);
      for (let c = 0; c < count; c++) {
        links[a]?.push({ remoteBusId: gpuBusId(b), remote: 'gpu' });
        if (rand() < 0.9) links[b]?.push({ remoteBusId: gpuBusId(a), remote: 'gpu' });
      }
    }
  }
  if (style === 'switch' || style === 'both') {
    const fabrics = 1 + Math.floor(rand() * 2);
    for (let i = 0; i < n; i++) {
      if (rand() < 0.15) continue;
      const fabric = Math.floor(rand() * fabrics);
      const perSwitch = rand() < 0.7 ? [2, 2, 2] : [1 + Math.floor(rand() * 2), 1, 2];
      links[i]?.push(...switchLinks(perSwitch, fabric * 3));
    }
  }
  if (rand() < 0.1 && n > 0) links[0]?.push({ remoteBusId: '0000:ee:00.0', remote: 'unknown' });
  return {
    gpus: links.map((l, i) => ({ busId: gpuBusId(i), links: l })),
    level: (i, j) => levels.get(`${Math.min(i, j)},${Math.max(i, j)}`) ?? -1,
  };
}

/**
 * A random machine of n GPUs (up to 16) with a hierarchy, as real ones have: pairs under a PCIe
 * switch, switches under a socket, sockets; sometimes an NVSwitch fabric for all (now and then one
 * GPU with fewer links), sometimes NVLink bridges on the pairs, sometimes one stray link that
 * breaks the symmetry. GPU indices are shuffled so that symmetric blocks are not index ranges.
 */
function hierarchicalTopology(rand: () => number, n: number): RandomTopology {
  const pairSize = pick(rand, [1, 2, 2, 3]);
  const switchSize = pairSize * pick(rand, [1, 2, 2, 3]);
  const socketSize = switchSize * pick(rand, [1, 2, 2, 4]);
  const sameSocket = pick(rand, [PcieLevel.NODE, PcieLevel.HOSTBRIDGE]);
  const position = shuffled(
    rand,
    Array.from({ length: n }, (_, i) => i),
  );
  const pos = (i: number): number => position[i] as number;
  const level = (i: number, j: number): number => {
    const a = pos(i);
    const b = pos(j);
    if (Math.floor(a / socketSize) !== Math.floor(b / socketSize)) return PcieLevel.SYSTEM;
    if (Math.floor(a / pairSize) === Math.floor(b / pairSize)) return PcieLevel.SINGLE;
    if (Math.floor(a / switchSize) === Math.floor(b / switchSize)) return PcieLevel.MULTIPLE;
    return sameSocket;
  };
  const links: NvLinkEnd[][] = Array.from({ length: n }, () => []);
  if (rand() < 0.5) {
    const degraded = rand() < 0.3 ? Math.floor(rand() * n) : -1;
    for (let i = 0; i < n; i++) links[i]?.push(...switchLinks(i === degraded ? [1, 1] : [2, 2]));
  }
  if (rand() < 0.3 && pairSize === 2) {
    for (let i = 0; i < n; i++) {
      for (let j = 0; j < n; j++) {
        if (i !== j && Math.floor(pos(i) / 2) === Math.floor(pos(j) / 2))
          links[i]?.push({ remoteBusId: gpuBusId(j), remote: 'gpu' });
      }
    }
  }
  if (rand() < 0.2 && n >= 2) {
    const a = Math.floor(rand() * n);
    const b = (a + 1 + Math.floor(rand() * (n - 1))) % n;
    links[a]?.push({ remoteBusId: gpuBusId(b), remote: 'gpu' });
  }
  return { gpus: links.map((l, i) => ({ busId: gpuBusId(i), links: l })), level };
}

function groupScore(m: ScoreMatrix, g: readonly number[]): number {
  return m.groupScore(g);
}

/** Checks the fast answer against the brute force; returns a failure message or null. */
function compare(
  m: ScoreMatrix,
  policy: PreferredPolicy,
  available: number[],
  must: number[],
  size: number,
): string | null {
  const fast = policy.choose(available, must, size);
  const what = `available [${available}] must [${must}] size ${size}`;
  if (fast.length !== size) return `${what}: answer [${fast}] has ${fast.length} GPUs`;
  if (fast.some((g, i) => i > 0 && (fast[i - 1] ?? -1) >= g)) return `${what}: answer [${fast}] not strictly ascending`;
  if (!fast.every((g) => available.includes(g))) return `${what}: answer [${fast}] uses unavailable GPUs`;
  if (!must.every((g) => fast.includes(g))) return `${what}: answer [${fast}] misses must-include GPUs`;
  const slow = bruteForceChoose(m, available, must, size);
  if (fast.join() !== slow.group.join()) {
    return (
      `${what}: fast [${fast}] (group ${groupScore(m, fast)}) but brute force ` +
      `[${slow.group}] (group ${slow.groupScore}, cut ${slow.splitScore})`
    );
  }
  return null;
}

test('property: the fast policy gives exactly the brute-force answer on random machines', () => {
  const base = Number(process.env.TOPOLOGY_SEED ?? 20240611);
  let cases = 0;
  for (let t = 0; t < 220; t++) {
    const seed = base + t;
    const rand = prng(seed);
    const n = 1 + Math.floor(rand() * 10);
    const topo = randomTopology(rand, n);
    const m = buildScoreMatrix(topo.gpus, topo.level);
    const policy = new PreferredPolicy(m);
    // Several available subsets per machine on one policy: memo tables and caches are shared.
    for (let round = 0; round < 3; round++) {
      const all = Array.from({ length: n }, (_, i) => i);
      const count = round === 0 ? n : 1 + Math.floor(rand() * n);
      const available = shuffled(rand, all).slice(0, count);
      for (let size = 1; size <= count; size++) {
        const mustCounts = [0, Math.floor(rand() * (Math.min(size, 3) + 1))];
        for (const mc of mustCounts) {
          const must = shuffled(rand, available).slice(0, mc);
          const failure = compare(m, policy, available, must, size);
          cases++;
          if (failure !== null)
            assert.fail(`seed ${seed} (TOPOLOGY_SEED=${base}, machine ${t}, ${n} GPUs): ${failure}`);
          // Asking again (cache hit) gives the same answer.
          assert.deepEqual(
            policy.choose(available, must, size),
            policy.choose([...available].reverse(), [...must].reverse(), size),
          );
        }
      }
    }
  }
  assert.ok(cases > 2000, `only ${cases} cases`);
});

test(
  'property: machines with symmetric hierarchies (up to ' + '16 GPUs, at most 10 available) match the brute force',
  () => {
    const base = Number(process.env.TOPOLOGY_SEED ?? 20240611) + 100000;
    let cases = 0;
    for (let t = 0; t < 150; t++) {
      const seed = base + t;
      const rand = prng(seed);
      const n = 2 + Math.floor(rand() * 15);
      const topo = hierarchicalTopology(rand, n);
      const m = buildScoreMatrix(topo.gpus, topo.level);
      const policy = new PreferredPolicy(m, { warmUp: t % 2 === 0 });
      for (let round = 0; round < 2; round++) {
        const available = shuffled(
          rand,
          Array.from({ length: n }, (_, i) => i),
        ).slice(0, Math.min(n, 4 + Math.floor(rand() * 7)));
        for (let size = 1; size <= available.length; size++) {
          for (const mc of [0, Math.floor(rand() * (Math.min(size, 2) + 1))]) {
            const must = shuffled(rand, available).slice(0, mc);
            const failure = compare(m, policy, available, must, size);
            cases++;
            if (failure !== null)
              assert.fail(`seed ${seed} (TOPOLOGY_SEED=${base - 100000}, machine ${t}, ${n} GPUs): ${failure}`);
          }
        }
      }
    }
    assert.ok(cases > 1000, `only ${cases} cases`);
  },
);

test('property: machines of more than 16 GPUs with at most 10 available are solved exactly too', () => {
  for (let t = 0; t < 12; t++) {
    const seed = 777 + t;
    const rand = prng(seed);
    const n = 17 + Math.floor(rand() * 6);
    const topo = randomTopology(rand, n);
    const m = buildScoreMatrix(topo.gpus, topo.level);
    const policy = new PreferredPolicy(m);
    const available = shuffled(
      rand,
      Array.from({ length: n }, (_, i) => i),
    ).slice(0, 3 + Math.floor(rand() * 8));
    for (let size = 1; size <= available.length; size++) {
      const must = shuffled(rand, available).slice(0, Math.floor(rand() * Math.min(size, 2) + 0.5));
      const failure = compare(m, policy, available, must, size);
      if (failure !== null) assert.fail(`seed ${seed}: ${failure}`);
    }
  }
});

test('beyond 16 available GPUs the greedy fallback still gives a valid answer', () => {
  const rand = prng(99);
  const topo = randomTopology(rand, 20);
  const m = buildScoreMatrix(topo.gpus, topo.level);
  const policy = new PreferredPolicy(m);
  const available = Array.from({ length: 20 }, (_, i) => i).filter((i) => i !== 3);
  for (let size = 1; size <= available.length; size++) {
    const must = size >= 2 ? [7, 12] : [];
    const got = policy.choose(available, must, size);
    assert.equal(got.length, size);
    assert.ok(got.every((g, i) => available.includes(g) && (i === 0 || (got[i - 1] ?? -1) < g)));
    assert.ok(must.every((g) => got.includes(g)));
  }
  assert.deepEqual(policy.choose(available, [], 19), available);
});

// ---------------------------------------------------------------------------------------------
// Score matrix.

test('PCIe points follow NVIDIA: 60 50 40 30 20 10, unknown 0', () => {
  assert.deepEqual([0, 10, 20, 30, 40, 50].map(pciePoints), [60, 50, 40, 30, 20, 10]);
  assert.equal(pciePoints(-1), 0);
  assert.equal(pciePoints(35), 0);
  assert.equal(pciePoints(Number.NaN), 0);
});

test('bus ids compare equal in legacy and 8-digit forms, any case', () => {
  assert.equal(normalizeBusId('0000:0A:00.0'), '00000000:0a:00.0');
  assert.equal(normalizeBusId('00000000:0a:00.0'), '00000000:0a:00.0');
  assert.equal(normalizeBusId(' 0a:00.0 '), '00000000:0a:00.0');
  assert.equal(normalizeBusId('weird'), 'weird');
});

test('score matrix: DGX-1 pair scores by hand', () => {
  const m = fixtureMatrix(dgx1);
  assert.equal(m.size, 8);
  assert.equal(m.score(0, 3), 20 + 200); // same socket, 2 NVLinks
  assert.equal(m.score(2, 3), 50 + 200); // same PCIe switch, 2 NVLinks
  assert.equal(m.score(0, 4), 10 + 200); // across sockets, 2 NVLinks
  assert.equal(m.score(0, 1), 50 + 100);
  assert.equal(m.score(0, 5), 10);
  assert.equal(m.score(3, 3), 0);
  assert.equal(m.nvlinks(1, 5), 2);
  assert.equal(m.nvlinks(5, 1), 2);
  assert.equal(m.pcieLevel(4, 5), PcieLevel.SINGLE);
  assert.equal(m.groupScore([0, 1, 2, 3]), 1080);
  assert.throws(() => m.score(0, 8), RangeError);
});

test('score matrix: NVSwitch fabrics count the smaller link count; NVIDIA would see none', () => {
  const m = fixtureMatrix(nvswitch8);
  assert.equal(m.nvlinks(0, 7), 12);
  assert.equal(m.score(0, 1), 50 + 1200);
  assert.equal(m.score(0, 2), 20 + 1200);
  assert.equal(m.score(0, 4), 10 + 1200);
  assert.equal(fixtureMatrix(nvswitch16).nvlinks(3, 12), 18);

  // A degraded GPU with 8 links; a GPU on another fabric; a GPU with no switch links.
  const gpus: GpuLinkInfo[] = [
    { busId: gpuBusId(0), links: switchLinks([2, 2, 2, 2, 2, 2]) },
    { busId: gpuBusId(1), links: switchLinks([2, 2, 2, 2, 0, 0]) },
    { busId: gpuBusId(2), links: switchLinks([2, 2], 10) },
    { busId: gpuBusId(3), links: switchLinks([0, 0, 0, 0, 0, 1]) },
    { busId: gpuBusId(4), links: [] },
    { busId: gpuBusId(5), links: switchLinks([1], 11) },
  ];
  const x = buildScoreMatrix(gpus, () => PcieLevel.NODE);
  assert.equal(x.nvlinks(0, 1), 8);
  assert.equal(x.nvlinks(1, 3), 1); // joined through switch 5, which GPU 0 shares with both
  assert.equal(x.nvlinks(0, 2), 0);
  assert.equal(x.nvlinks(2, 5), 1); // switches 10 and 11 are one fabric through GPU 2; min(4, 1)
  assert.equal(x.nvlinks(0, 4), 0);
  assert.equal(x.score(0, 1), 20 + 800);
});

test('score matrix: direct links counted from either end; unknown far ends and strangers ignored', () => {
  const gpus: GpuLinkInfo[] = [
    {
      busId: '0000:10:00.0',
      links: [
        { remoteBusId: gpuBusId(1), remote: 'gpu' },
        { remoteBusId: gpuBusId(1), remote: 'gpu' },
        { remoteBusId: '0000:99:00.0', remote: 'gpu' },
        { remoteBusId: gpuBusId(2), remote: 'unknown' },
        { remoteBusId: gpuBusId(0), remote: 'gpu' },
      ],
    },
    { busId: gpuBusId(1), links: [{ remoteBusId: '0000:10:00.0', remote: 'gpu' }] },
    { busId: gpuBusId(2), links: [] },
  ];
  const m = buildScoreMatrix(gpus, (i, j) => (i === 0 && j === 2 ? 99 : PcieLevel.HOSTBRIDGE));
  assert.equal(m.nvlinks(0, 1), 2);
  assert.equal(m.nvlinks(0, 2), 0);
  assert.equal(m.score(0, 1), 230);
  assert.equal(m.score(0, 2), 0);
  assert.equal(m.pcieLevel(0, 2), 99);
  assert.throws(
    () => buildScoreMatrix([gpus[0] as GpuLinkInfo, { busId: '00000000:10:00.0', links: [] }], () => 0),
    /same PCI bus id/,
  );
});

// ---------------------------------------------------------------------------------------------
// Hand-checked answers.

const all = (n: number): number[] => Array.from({ length: n }, (_, i) => i);

function choose(policy: PreferredPolicy, available: number[], must: number[], size: number): number[] {
  return policy.choose(available, must, size);
}

test('DGX-1 size 2: the objective pairs {0,4} {1,5} {2,3} {6,7} (920), not {0,3} {1,2} {4,7} {5,6} (880)', () => {
  const m = fixtureMatrix(dgx1);
  const p = new PreferredPolicy(m);
  // 2-3 and 6-7 are SINGLE + 2 NVLinks = 250; 0-4 and 1-5 are SYSTEM + 2 NVLinks = 210:
  // 250 + 250 + 210 + 210 = 920 beats four same-socket 2-NVLink pairs at 220 each = 880.
  const slow = bruteForceChoose(m, all(8), [], 2);
  assert.equal(slow.splitScore, 920);
  assert.equal(m.groupScore([0, 3]) + m.groupScore([1, 2]) + m.groupScore([4, 7]) + m.groupScore([5, 6]), 880);
  // Best groups of that cut: {2,3} and {6,7} (250 each, same remainder score): lowest indices.
  assert.deepEqual(choose(p, all(8), [], 2), [2, 3]);
  // With 2 and 3 taken, the next request pairs 6-7; then 0-4 and 1-5 are the optimal cut.
  assert.deepEqual(choose(p, [0, 1, 4, 5, 6, 7], [], 2), [6, 7]);
  assert.deepEqual(choose(p, [0, 1, 4, 5], [], 2), [0, 4]);
  // Must-include 0: its partner in the best cut is 4 (920), not 3 (880).
  assert.deepEqual(choose(p, all(8), [0], 2), [0, 4]);
  assert.deepEqual(choose(p, all(8), [3], 2), [2, 3]);
});

test('DGX-1 size 4: the two sockets; must-include across sockets', () => {
  const m = fixtureMatrix(dgx1);
  const p = new PreferredPolicy(m);
  // {0,1,2,3} and {4,5,6,7} score 1080 each (2160); any other cut is far below.
  assert.deepEqual(choose(p, all(8), [], 4), [0, 1, 2, 3]);
  assert.deepEqual(choose(p, all(8), [5], 4), [4, 5, 6, 7]);
  // Must-include 0 and 4: {0,2,3,4}/{1,5,6,7} and {0,4,6,7}/{1,2,3,5} both give 820 + 820;
  // same group and remainder scores, so the lowest indices.
  assert.deepEqual(choose(p, all(8), [0, 4], 4), [0, 2, 3, 4]);
  assert.equal(bruteForceChoose(m, all(8), [0, 4], 4).splitScore, 1640);
});

test('DGX-1 size 3 of 8 (3 + 3 + 2) and partial availability', () => {
  const p = new PreferredPolicy(fixtureMatrix(dgx1));
  // Cut {0,2,3} {4,6,7} {1,5}: 590 + 590 + 210 = 1390.
  assert.deepEqual(choose(p, all(8), [], 3), [0, 2, 3]);
  assert.equal(bruteForceChoose(fixtureMatrix(dgx1), all(8), [], 3).splitScore, 1390);
  // 6 of 8 available (2 and 3 in use): {0,1,4,5,6,7} in pairs → {6,7} 250, {0,4} 210, {1,5} 210.
  assert.deepEqual(choose(p, [0, 1, 4, 5, 6, 7], [], 2), [6, 7]);
  // ... in fours (4 + leftover 2): {4,5,6,7} 1080 + {0,1} 150 beats every other cut.
  assert.deepEqual(choose(p, [0, 1, 4, 5, 6, 7], [], 4), [4, 5, 6, 7]);
  assert.deepEqual(
    choose(p, [7, 6, 5, 4, 1, 0], [0], 4),
    bruteForceChoose(fixtureMatrix(dgx1), [0, 1, 4, 5, 6, 7], [0], 4).group,
  );
});

test('NVSwitch 8 and 16: every pair has the same NVLink; PCIe then decides', () => {
  const p8 = new PreferredPolicy(fixtureMatrix(nvswitch8));
  assert.deepEqual(choose(p8, all(8), [], 2), [0, 1]);
  assert.deepEqual(choose(p8, all(8), [], 4), [0, 1, 2, 3]);
  assert.deepEqual(choose(p8, all(8), [6], 2), [6, 7]);
  assert.deepEqual(choose(p8, all(8), [6], 4), [4, 5, 6, 7]);
  const p16 = new PreferredPolicy(fixtureMatrix(nvswitch16));
  assert.deepEqual(choose(p16, all(16), [], 2), [0, 1]);
  assert.deepEqual(choose(p16, all(16), [], 4), [0, 1, 2, 3]);
  assert.deepEqual(choose(p16, all(16), [], 8), [0, 1, 2, 3, 4, 5, 6, 7]);
  assert.deepEqual(choose(p16, all(16), [9], 4), [8, 9, 10, 11]);
  assert.deepEqual(choose(p16, all(16), [9], 8), [8, 9, 10, 11, 12, 13, 14, 15]);
  assert.deepEqual(choose(p16, all(16), [2, 13], 2), [2, 13]);
  // NVLink adds the same to every cut of a given size here, so the PCIe points decide.
  // 5 of 16 (5 + 5 + 5 + 1): the best cut is a quad plus a socket-mate (340 PCIe points) and two
  // quads each with a GPU of the other socket (300 each), one GPU alone: 940. Best group: a quad
  // plus a socket-mate; all such leave the same remainder score, so the lowest indices.
  assert.deepEqual(choose(p16, all(16), [], 5), [0, 1, 2, 3, 4]);
  // 3 of 16 (five threes + 1): four threes inside PCIe quads (130 each) and one three from the
  // four GPUs left over (2 of one socket + 1: 40), 560. Best group: a quad minus one GPU.
  assert.deepEqual(choose(p16, all(16), [], 3), [0, 1, 2]);
  // With 7: {4,5,7}, {4,6,7} and {5,6,7} all qualify with equal scores: lowest indices.
  assert.deepEqual(choose(p16, all(16), [7], 3), [4, 5, 7]);
});

test('PCIe only, two sockets: pairs under one switch, fours within a socket', () => {
  const p = new PreferredPolicy(fixtureMatrix(pcie8));
  assert.deepEqual(choose(p, all(8), [], 2), [0, 1]);
  assert.deepEqual(choose(p, all(8), [], 4), [0, 1, 2, 3]);
  assert.deepEqual(choose(p, all(8), [5], 4), [4, 5, 6, 7]);
  assert.deepEqual(choose(p, [0, 2, 3, 4, 5, 6], [], 2), [2, 3]);
  const p16 = new PreferredPolicy(fixtureMatrix(pcie16));
  assert.deepEqual(choose(p16, all(16), [], 2), [0, 1]);
  assert.deepEqual(choose(p16, all(16), [], 8), [0, 1, 2, 3, 4, 5, 6, 7]);
  // Two pairs of one socket (260); {8,9,14,15}, {10,11,14,15}, {12,13,14,15} tie on every score.
  assert.deepEqual(choose(p16, all(16), [14], 4), [8, 9, 14, 15]);
});

test('bridged pair plus loose GPUs', () => {
  const m = fixtureMatrix(bridgedPair);
  const p = new PreferredPolicy(m);
  assert.equal(m.score(1, 2), 30 + 400);
  assert.deepEqual(choose(p, all(4), [], 2), [1, 2]);
  assert.deepEqual(choose(p, all(4), [0], 2), [0, 3]); // keeps the bridge for the next request
  assert.deepEqual(choose(p, all(4), [], 3), [0, 1, 2]);
  assert.deepEqual(choose(p, all(4), [3], 3), [1, 2, 3]);
});

test('size 1 takes the least connected GPU; must-include wins; size n takes everything', () => {
  const p = new PreferredPolicy(fixtureMatrix(bridgedPair));
  assert.deepEqual(choose(p, all(4), [], 1), [0]);
  assert.deepEqual(choose(p, [1, 2, 3], [], 1), [3]);
  assert.deepEqual(choose(p, [1, 2], [], 1), [1]);
  assert.deepEqual(choose(p, all(4), [2], 1), [2]);
  assert.deepEqual(choose(p, [3, 1, 0, 2], [], 4), [0, 1, 2, 3]);
  const d = new PreferredPolicy(fixtureMatrix(dgx1));
  assert.deepEqual(choose(d, all(8), [], 1), [0]); // every DGX-1 GPU has the same links
  assert.deepEqual(choose(d, [0, 1, 2, 3, 5], [], 1), [5]); // alone on its socket
  const n16 = new PreferredPolicy(fixtureMatrix(nvswitch16));
  assert.deepEqual(
    choose(
      n16,
      all(16).filter((g) => g !== 6),
      [],
      1,
    ),
    [7],
  ); // its pair-mate is gone
});

test('invalid questions throw clear errors', () => {
  const p = new PreferredPolicy(fixtureMatrix(dgx1));
  assert.throws(() => p.choose([0, 1], [], 0), /positive integer/);
  assert.throws(() => p.choose([0, 1], [], 1.5), /positive integer/);
  assert.throws(() => p.choose([0, 1], [], 3), /larger than the 2 available/);
  assert.throws(() => p.choose([0, 1, 1], [], 2), /listed twice/);
  assert.throws(() => p.choose([0, 8], [], 1), /not in 0\.\.7/);
  assert.throws(() => p.choose([0, -1], [], 1), /not in 0\.\.7/);
  assert.throws(() => p.choose([0, 1], [2], 1), /not available/);
  assert.throws(() => p.choose([0, 1, 2], [0, 0], 2), /listed twice/);
  assert.throws(() => p.choose([0, 1, 2], [0, 1], 1), /do not fit/);
  const big = new PreferredPolicy(
    buildScoreMatrix(
      Array.from({ length: 18 }, (_, i) => ({ busId: gpuBusId(i), links: [] })),
      () => PcieLevel.NODE,
    ),
  );
  assert.throws(() => big.choose([0, 17, 17], [], 2), /listed twice/);
  assert.throws(() => big.choose([0, 17], [3], 1), /not available/);
  assert.throws(() => big.choose([0, 18], [], 1), /not in 0\.\.17/);
});

test('memo tables survive many resets and changes of size (epoch wrap-around)', () => {
  const m = fixtureMatrix(nvswitch16);
  const p = new PreferredPolicy(m, { warmUp: false });
  const fresh = new PreferredPolicy(m, { warmUp: false });
  const want = [3, 5, 6].map((k) => fresh.choose(all(16), [9], k));
  for (let i = 0; i < 70000; i++) p.clearCaches();
  for (let round = 0; round < 3; round++) {
    for (const [i, k] of [3, 5, 6].entries()) assert.deepEqual(p.choose(all(16), [9], k), want[i]);
    p.clearCaches();
  }
});

test('warming up a policy that has already answered (the manager warms it once registered) changes no answer', () => {
  const m = fixtureMatrix(nvswitch16);
  const cold = new PreferredPolicy(m, { warmUp: false });
  const warm = new PreferredPolicy(m);
  const asks: [number[], number[], number][] = [
    [all(16), [], 4],
    [all(16), [9], 3],
    [all(16).slice(2), [5], 6],
    [[1, 4, 7, 10, 13], [], 2],
  ];
  const before = asks.map(([a, must, k]) => cold.choose(a, must, k));
  cold.warmUp();
  asks.forEach(([a, must, k], i) => {
    assert.deepEqual(cold.choose(a, must, k), before[i]);
    assert.deepEqual(warm.choose(a, must, k), before[i]);
  });
});

test('answers are copies: changing one does not change the next', () => {
  const p = new PreferredPolicy(fixtureMatrix(pcie8));
  const a = p.choose(all(8), [], 2);
  a.push(99);
  assert.deepEqual(p.choose(all(8), [], 2), [0, 1]);
});

test('fixtures: bus ids of switches are in legacy form and still match', () => {
  assert.equal(normalizeBusId(switchBusId(0)), '00000000:c0:00.0');
});
