// Machine topologies for tests and benchmarks, as the link facts NVML would give (GpuLinkInfo with
// active links only) plus an NVML PCIe topology level for every pair. A machine the fake NVML also
// simulates is read from its file in test/fixtures/topologies, so the unit and e2e tests share it.
import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import type { GpuLinkInfo, NvLinkEnd, ScoreMatrix } from '../../src/core/topology/index.ts';
import { buildScoreMatrix, PcieLevel } from '../../src/core/topology/index.ts';

const TOPOLOGY_FILES = join(import.meta.dirname, '..', 'fixtures', 'topologies');

export interface TopologyFixture {
  readonly name: string;
  readonly gpus: readonly GpuLinkInfo[];
  /** NVML topology level of GPUs i and j. */
  readonly pcieLevel: (i: number, j: number) => number;
  /** NUMA node (CPU socket) of each GPU. */
  readonly numa: readonly number[];
}

/** PCI bus id of GPU i in the fixtures (8-digit domain form). */
export function gpuBusId(i: number): string {
  return `00000000:${(0x10 + i).toString(16).padStart(2, '0')}:00.0`;
}

/** PCI bus id of NVSwitch s in the fixtures (4-digit legacy form, to exercise normalisation). */
export function switchBusId(s: number): string {
  return `0000:${(0xc0 + s).toString(16).padStart(2, '0')}:00.0`;
}

/** Links of every GPU from a list of [gpu, gpu, NVLink count]; both ends list each link. */
export function directLinks(n: number, pairs: ReadonlyArray<readonly [number, number, number]>): NvLinkEnd[][] {
  const links: NvLinkEnd[][] = Array.from({ length: n }, () => []);
  for (const [a, b, count] of pairs) {
    for (let c = 0; c < count; c++) {
      links[a]?.push({ remoteBusId: gpuBusId(b), remote: 'gpu' });
      links[b]?.push({ remoteBusId: gpuBusId(a), remote: 'gpu' });
    }
  }
  return links;
}

/** Links of a GPU to NVSwitches: linksPerSwitch[s] links to switch firstSwitch + s. */
export function switchLinks(linksPerSwitch: readonly number[], firstSwitch = 0): NvLinkEnd[] {
  const out: NvLinkEnd[] = [];
  linksPerSwitch.forEach((count, s) => {
    for (let c = 0; c < count; c++) out.push({ remoteBusId: switchBusId(firstSwitch + s), remote: 'switch' });
  });
  return out;
}

function gpusWith(links: readonly (readonly NvLinkEnd[])[]): GpuLinkInfo[] {
  return links.map((l, i) => ({ busId: gpuBusId(i), links: [...l] }));
}

/**
 * PCIe levels from a hierarchy: same `pair` group → SINGLE, same `quad` group → MULTIPLE, same
 * socket → `sameSocket`, otherwise SYSTEM.
 */
function hierarchy(
  numa: readonly number[],
  pair: (i: number) => number,
  quad: ((i: number) => number) | null,
  sameSocket: number,
): (i: number, j: number) => number {
  return (i, j) => {
    if (numa[i] !== numa[j]) return PcieLevel.SYSTEM;
    if (pair(i) === pair(j)) return PcieLevel.SINGLE;
    if (quad !== null && quad(i) === quad(j)) return PcieLevel.MULTIPLE;
    return sameSocket;
  };
}

const half = (n: number): number[] => Array.from({ length: n }, (_, i) => (i < n / 2 ? 0 : 1));

/**
 * A machine of test/fixtures/topologies (the fake NVML's files, which the e2e tests run on) as link facts:
 * its NVLinks between GPUs and to NVSwitches, its NUMA nodes, and its PCIe levels (a pair not listed
 * is NODE on one NUMA node, SYSTEM across, as the fake NVML answers). GPU i has gpuBusId(i), switch s
 * switchBusId(s).
 */
function fromFakeNvml(name: string, file: string): TopologyFixture {
  const t = JSON.parse(readFileSync(join(TOPOLOGY_FILES, file), 'utf8')) as {
    gpus: { numaNode?: number | null }[];
    nvlinks?: [number, number, number][];
    nvswitches?: { links: [number, number][] }[];
    pcie?: [number, number, number][];
  };
  const links = directLinks(t.gpus.length, t.nvlinks ?? []);
  (t.nvswitches ?? []).forEach((sw, s) => {
    for (const [g, count] of sw.links)
      for (let c = 0; c < count; c++) links[g]?.push({ remoteBusId: switchBusId(s), remote: 'switch' });
  });
  const numa = t.gpus.map((g) => g.numaNode ?? -1);
  const pcie = new Map<string, number>();
  for (const [a, b, level] of t.pcie ?? []) {
    pcie.set(`${a},${b}`, level);
    pcie.set(`${b},${a}`, level);
  }
  return {
    name,
    gpus: gpusWith(links),
    pcieLevel: (i, j) =>
      pcie.get(`${i},${j}`) ??
      (numa[i] === numa[j] || numa[i] === -1 || numa[j] === -1 ? PcieLevel.NODE : PcieLevel.SYSTEM),
    numa,
  };
}

/** DGX-1 V100: hybrid cube-mesh NVLink, PCIe pairs (0,1) (2,3) (4,5) (6,7), GPUs 0-3 on NUMA 0. */
export const dgx1 = fromFakeNvml('dgx1-v100', 'dgx1-v100.json');

/** HGX A100-like: 8 GPUs, each with 2 links to each of 6 NVSwitches (12 links); PCIe pairs, NUMA halves. */
export const nvswitch8 = fromFakeNvml('nvswitch-8', 'nvswitch-8.json');

/** 8 GPUs, no NVLink: pairs (0,1) (2,3) (4,5) (6,7) SINGLE, MULTIPLE within a socket, SYSTEM across. */
export const pcie8 = fromFakeNvml('pcie-8-two-sockets', 'pcie-2socket-8.json');

/** 4 GPUs: 1 and 2 bridged with 4 NVLinks, every pair HOSTBRIDGE. */
export const bridgedPair = fromFakeNvml('bridged-pair', 'bridged-pair-4.json');

/**
 * 16 GPUs, each with 18 links to 4 NVSwitches (5, 4, 4, 5); PCIe: pairs under one switch (SINGLE),
 * fours under a switch tree (MULTIPLE), eight per socket (NODE), SYSTEM across.
 */
export const nvswitch16: TopologyFixture = {
  name: 'nvswitch-16',
  gpus: gpusWith(Array.from({ length: 16 }, () => switchLinks([5, 4, 4, 5]))),
  pcieLevel: hierarchy(
    half(16),
    (i) => i >> 1,
    (i) => i >> 2,
    PcieLevel.NODE,
  ),
  numa: half(16),
};

/** 16 GPUs, no NVLink: pairs SINGLE, MULTIPLE within a socket of 8, SYSTEM across. */
export const pcie16: TopologyFixture = {
  name: 'pcie-16-two-sockets',
  gpus: gpusWith(Array.from({ length: 16 }, () => [])),
  pcieLevel: hierarchy(half(16), (i) => i >> 1, null, PcieLevel.MULTIPLE),
  numa: half(16),
};

export const allFixtures: readonly TopologyFixture[] = [dgx1, nvswitch8, nvswitch16, pcie8, pcie16, bridgedPair];

/** The score matrix of a fixture. */
export function fixtureMatrix(f: TopologyFixture): ScoreMatrix {
  return buildScoreMatrix(f.gpus, f.pcieLevel);
}
