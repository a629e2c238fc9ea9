// A fake MpsHost (src/mps/daemon.ts's port) that records what was done to it, and its control daemon children.
import type { MpsDaemonPlan } from '../../src/core/mps.ts';
import type { ControlChild, ControlExit, MpsHost } from '../../src/mps/daemon.ts';

export class FakeChild implements ControlChild {
  readonly pid: number;
  readonly exited: Promise<ControlExit>;
  end!: (e: ControlExit) => void;
  killed = false;
  /** Told to quit through its client. */
  quit = false;
  constructor(pid: number) {
    this.pid = pid;
    this.exited = new Promise((r) => {
      this.end = r;
    });
  }
  kill(): void {
    this.killed = true;
    this.end({ code: null, signal: 'SIGTERM' });
  }
}

export class FakeHost implements MpsHost {
  readonly actions: string[] = [];
  readonly files = new Map<string, string>();
  readonly children: FakeChild[] = [];
  /** Every plan a control daemon was started with (the devices it serves, by UUID). */
  readonly plans: MpsDaemonPlan[] = [];
  failStarts = 0;
  mounted = false;
  private pid = 100;
  async setComputeMode(gpu: { uuid: string }, mode: string): Promise<void> {
    this.actions.push(`mode ${gpu.uuid} ${mode}`);
  }
  async makeDirs(dir: string): Promise<void> {
    this.actions.push(`mkdir ${dir}`);
  }
  async writeFile(path: string, text: string): Promise<void> {
    this.files.set(path, text);
  }
  async remove(path: string): Promise<void> {
    this.files.delete(path);
    this.actions.push(`rm ${path}`);
  }
  async mountShm(dir: string): Promise<{ mounted: boolean; size: string }> {
    this.mounted = true;
    this.actions.push(`mount ${dir}`);
    return { mounted: true, size: '100k' };
  }
  async unmountShm(dir: string): Promise<void> {
    this.mounted = false;
    this.actions.push(`umount ${dir}`);
  }
  /** When set, startControl waits for it before the daemon answers (a start under way). */
  startGate: Promise<void> | undefined;
  async startControl(p: MpsDaemonPlan): Promise<ControlChild> {
    await this.startGate;
    if (this.failStarts > 0) {
      this.failStarts--;
      throw new Error(`nvidia-cuda-mps-control for ${p.resource} did not answer`);
    }
    this.plans.push(p);
    const c = new FakeChild(++this.pid);
    this.children.push(c);
    this.actions.push(`start ${p.resource} ${c.pid}`);
    return c;
  }
  async command(paths: { pipeDir: string }, command: string): Promise<string> {
    this.actions.push(`cmd ${paths.pipeDir} ${command}`);
    if (command === 'quit') {
      const c = this.children.at(-1);
      c?.end({ code: 0, signal: null });
      if (c !== undefined) c.quit = true;
    }
    return '';
  }
}
