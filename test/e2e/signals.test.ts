// Signals sent to the built executable: SIGUSR1 opens no debugger, a stray signal neither kills the
// daemon nor leaves its socket behind, and the stop signals still stop it cleanly.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { existsSync, readFileSync, readdirSync, readlinkSync } from 'node:fs';
import { SimNode } from '../support/sim.ts';

/** Inodes of the TCP sockets listening on this machine (IPv4 and IPv6), from /proc/net. */
function listeningTcpInodes(): Set<string> {
  const out = new Set<string>();
  for (const f of ['/proc/net/tcp', '/proc/net/tcp6']) {
    for (const line of readFileSync(f, 'utf8').split('\n').slice(1)) {
      const cols = line.trim().split(/\s+/);
      // st 0A is LISTEN; column 9 is the inode.
      if (cols[3] === '0A' && cols[9] !== undefined) out.add(cols[9]);
    }
  }
  return out;
}

/** TCP sockets the process listens on: its socket descriptors that /proc/net lists as listening. */
function tcpListeners(pid: number): string[] {
  const listening = listeningTcpInodes();
  return readdirSync(`/proc/${pid}/fd`).flatMap((fd) => {
    try {
      const m = /^socket:\[(\d+)\]$/.exec(readlinkSync(`/proc/${pid}/fd/${fd}`));
      return m !== null && listening.has(m[1]!) ? [m[1]!] : [];
    } catch {
      return [];
    }
  });
}

test(
  'SIGUSR1 opens no debugger: no "Debugger listening", no ' + 'TCP listener, a log line, and the daemon keeps serving',
  async () => {
    const node = await SimNode.start({ topology: 'demo-8' });
    try {
      const k = node.kubelet!;
      await node.plugin.waitForLine(/watching GPU health/);
      const from = node.plugin.lines.length;
      node.plugin.signal('SIGUSR1');
      await node.plugin.waitForLine(/WARN SIGUSR1 ignored: .*this build has no debugger/, 10000, from);
      assert.deepEqual(node.plugin.matching(/Debugger listening|inspector/i), []);
      assert.deepEqual(tcpListeners(node.plugin.pid), [], 'the process listens on no TCP port');
      // Still serving: an Allocate answers, and the registration stands.
      const u = node.topology.gpus[0]!.uuid;
      const res = await k.allocate({ container_requests: [{ devices_ids: [u] }] });
      assert.deepEqual(res.container_responses[0]!.envs, { NVIDIA_VISIBLE_DEVICES: u });
      assert.equal(k.registrations.length, 1);
      assert.equal(node.plugin.exit, undefined);
    } finally {
      await node.stop();
    }
  },
);

test(
  'SIGUSR2 and the other stray signals are ignored with a log line each ' +
    '(realtime ones silently); SIGQUIT then stops cleanly and removes the socket',
  async () => {
    const node = await SimNode.start({ topology: 'demo-8' });
    try {
      await node.plugin.waitForLine(/watching GPU health/);
      for (const sig of [
        'SIGUSR2',
        'SIGALRM',
        'SIGVTALRM',
        'SIGPROF',
        'SIGIO',
        'SIGPWR',
        'SIGSTKFLT',
        'SIGXCPU',
        'SIGXFSZ',
        'SIGTSTP',
        'SIGTTIN',
        'SIGTTOU',
      ] as const) {
        const from = node.plugin.lines.length;
        node.plugin.signal(sig);
        await node.plugin.waitForLine(
          new RegExp(`WARN ${sig} ignored: the plugin stops on SIGTERM, SIGINT or SIGQUIT and reloads on SIGHUP`),
          10000,
          from,
        );
      }
      // SIGRTMIN (34) to SIGRTMAX (64): Node cannot listen to them; they are set to SIG_IGN.
      for (const sig of [34, 40, 64]) process.kill(node.plugin.pid, sig);
      const status = readFileSync(`/proc/${node.plugin.pid}/status`, 'utf8');
      const ignored = BigInt(`0x${/^SigIgn:\s+([0-9a-f]+)$/m.exec(status)![1]}`);
      for (let sig = 34n; sig <= 64n; sig++) assert.equal((ignored >> (sig - 1n)) & 1n, 1n, `signal ${sig} ignored`);
      // One more request answered after all of them: the process is alive and serving.
      const u = node.topology.gpus[1]!.uuid;
      await node.kubelet!.allocate({ container_requests: [{ devices_ids: [u] }] });
      assert.equal(node.plugin.exit, undefined);
      assert.ok(existsSync(node.pluginSocket));
      node.plugin.signal('SIGQUIT');
      assert.deepEqual(await node.plugin.exited, { code: 0, signal: null });
      assert.equal(node.plugin.matching(/INFO stopping signal=SIGQUIT/).length, 1);
      assert.equal(existsSync(node.pluginSocket), false, 'the socket is removed');
    } finally {
      await node.stop();
    }
  },
);
