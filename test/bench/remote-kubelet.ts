// The bench driver's handle on the kubelet stand-in running in a process of its own
// (test/bench/kubelet-driver.ts, forked with the same Node, commands over the IPC channel).
import { fork } from 'node:child_process';
import type { ChildProcess } from 'node:child_process';
import { join } from 'node:path';
import type { Commands, Op, Reply, Request } from './kubelet-driver.ts';

const DRIVER = join(import.meta.dirname, 'kubelet-driver.ts');

export class RemoteKubelet {
  private readonly child: ChildProcess;
  private nextId = 1;
  private readonly pending = new Map<
    number,
    { resolve: (v: unknown) => void; reject: (e: Error) => void; op: string }
  >();
  private exited = false;

  private constructor(child: ChildProcess) {
    this.child = child;
    child.on('message', (m: Reply) => {
      const p = this.pending.get(m.id);
      if (p === undefined) return;
      this.pending.delete(m.id);
      if (m.ok) p.resolve(m.result);
      else p.reject(new Error(`kubelet stand-in process, ${p.op}: ${m.error}`));
    });
    child.on('exit', (code, signal) => {
      this.exited = true;
      for (const p of this.pending.values())
        p.reject(new Error(`kubelet stand-in process exited (${code ?? signal}) during ${p.op}`));
      this.pending.clear();
    });
  }

  /** Forks the stand-in process; resolves once it is ready for commands. */
  static async spawn(): Promise<RemoteKubelet> {
    const child = fork(DRIVER, [], { execPath: process.execPath, stdio: ['ignore', 'inherit', 'inherit', 'ipc'] });
    const remote = new RemoteKubelet(child);
    await new Promise<void>((resolve, reject) => {
      remote.pending.set(0, { resolve: () => resolve(), reject, op: 'start-up' });
    });
    return remote;
  }

  get pid(): number {
    return this.child.pid ?? -1;
  }

  call<K extends Op>(op: K, args: Commands[K]['args']): Promise<Commands[K]['result']> {
    if (this.exited) return Promise.reject(new Error(`kubelet stand-in process has exited; cannot ${op}`));
    const id = this.nextId++;
    return new Promise((resolve, reject) => {
      this.pending.set(id, { resolve: resolve as (v: unknown) => void, reject, op });
      this.child.send({ id, op, args } satisfies Request<K>);
    });
  }

  /** Stops the stand-in and ends the process. */
  async close(): Promise<void> {
    if (this.exited) return;
    const gone = new Promise<void>((resolve) => this.child.once('exit', () => resolve()));
    try {
      await this.call('stop', {});
    } finally {
      this.child.disconnect();
      const timer = setTimeout(() => this.child.kill('SIGKILL'), 5000);
      await gone;
      clearTimeout(timer);
    }
  }
}
