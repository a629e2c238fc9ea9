// The MIG instance calls of one GPU, in-process, with NVML's rules: an overlapping placement is
// INSUFFICIENT_RESOURCES, a GPU instance that still has a compute instance is IN_USE. `crashAfter` makes the named
// call succeed and then throws as a kill would, keeping the agent's record as it was at that moment in
// `recordAtCrash` (the test writes it back: what a killed process leaves on disk). For unit tests of the agent's
// side; the fake NVML in C has the real calls.
import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import type { GpuInstanceNow } from '../../src/core/mig-instances.ts';
import type { MigPort } from '../../src/mps/mig-partitions.ts';

/** What the fake throws where the process would have been killed. */
export class Crash extends Error {}

/** One GPU's instances with NVML's rules; `crashAfter` makes the named call succeed and then "kill" the caller. */
export class FakeGpu implements MigPort {
  /** The agent's record at the moment of the last crash: what a killed process leaves on disk. */
  recordAtCrash: string | null = null;
  stateDir = '';
  gis: { gi: number; profileId: number; start: number; size: number; cis: number[] }[] = [];
  crashAfter: 'create-gi' | 'create-ci' | 'destroy-ci' | null = null;
  calls: string[] = [];
  private nextGi = 1;

  private crash(point: NonNullable<FakeGpu['crashAfter']>): void {
    if (this.crashAfter !== point) return;
    this.crashAfter = null;
    this.recordAtCrash = readFileSync(join(this.stateDir, 'mig-instances.json'), 'utf8');
    throw new Crash(`killed after ${point}`);
  }

  async gpuInstances(): Promise<GpuInstanceNow[]> {
    return this.gis.map((g) => ({ ...g, cis: [...g.cis] }));
  }

  async createGpuInstance(_p: string, profileId: number, start: number, size: number): Promise<number> {
    this.calls.push(`create-gi ${profileId}@${start}`);
    const busy = this.gis.find((g) => start < g.start + g.size && g.start < start + size);
    if (busy !== undefined) throw new Error(`nvmlDeviceCreateGpuInstanceWithPlacement: code 23 Insufficient Resources`);
    const gi = this.nextGi++;
    this.gis.push({ gi, profileId, start, size, cis: [] });
    this.crash('create-gi');
    return gi;
  }

  async createComputeInstance(_p: string, gi: number): Promise<number> {
    this.calls.push(`create-ci ${gi}`);
    const g = this.gis.find((x) => x.gi === gi);
    if (g === undefined) throw new Error('code 6 Not Found');
    g.cis.push(0);
    this.crash('create-ci');
    return 0;
  }

  async migDevice(_p: string, gi: number, ci: number) {
    return { uuid: `MIG-${gi}-${ci}`, giCapMinor: 100 + gi, ciCapMinor: 200 + gi };
  }

  async destroyComputeInstance(_p: string, gi: number, ci: number): Promise<void> {
    this.calls.push(`destroy-ci ${gi}/${ci}`);
    const g = this.gis.find((x) => x.gi === gi);
    if (g !== undefined) g.cis = g.cis.filter((c) => c !== ci);
    this.crash('destroy-ci');
  }

  async destroyGpuInstance(_p: string, gi: number): Promise<void> {
    this.calls.push(`destroy-gi ${gi}`);
    const g = this.gis.find((x) => x.gi === gi);
    if (g !== undefined && g.cis.length > 0)
      throw new Error('nvmlGpuInstanceDestroy: code 19 In use by another client');
    this.gis = this.gis.filter((x) => x.gi !== gi);
  }
}
