// The line that says why the process ends reaches its reader even when stderr is a socket nobody
// reads for a while (journald's stream is a unix socket, and journald can be behind): process.exit
// drops what the stream still queues, and exitProcess (src/system/log.ts) writes that last line
// straight to the descriptor first.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import { mkdtemp, rm } from 'node:fs/promises';
import { connect, createServer } from 'node:net';
import type { Socket } from 'node:net';
import { tmpdir } from 'node:os';
import path from 'node:path';

const CHILD = path.join(import.meta.dirname, '..', 'support', 'exit-after-lines.ts');

/**
 * Runs the child with stderr on a unix socket whose reader reads nothing until the child is ending
 * (it says so on stdout): its earlier lines fill the socket and queue in the child, as when journald is behind.
 */
async function run(lines: number): Promise<{ code: number | null; text: string }> {
  const dir = await mkdtemp(path.join(tmpdir(), 'exit-line-'));
  const sock = path.join(dir, 's');
  const accepted = new Promise<Socket>((resolve) => {
    const server = createServer((c) => {
      c.pause();
      server.close();
      resolve(c);
    });
    server.listen(sock);
  });
  await new Promise((r) => setTimeout(r, 0));
  const writer = connect(sock);
  await new Promise((resolve) => writer.on('connect', resolve));
  const reader = await accepted;
  try {
    const child = spawn(process.execPath, [CHILD, String(lines), '1'], { stdio: ['ignore', 'pipe', writer] });
    writer.destroy();
    const exited = new Promise<number | null>((resolve) => child.on('exit', (c) => resolve(c)));
    let text = '';
    reader.setEncoding('utf8');
    reader.on('data', (d: string) => {
      text += d;
    });
    const ended = new Promise((resolve) => reader.on('end', resolve));
    child.stdout.setEncoding('utf8').on('data', (d: string) => {
      if (d.includes('ending')) reader.resume();
    });
    const code = await exited;
    reader.resume();
    await ended;
    return { code, text };
  } finally {
    await rm(dir, { recursive: true, force: true });
  }
}

test('the last line reaches a reader that read nothing until the process had exited', async () => {
  for (const lines of [0, 3000]) {
    const { code, text } = await run(lines);
    assert.equal(code, 1);
    const all = text.trimEnd().split('\n');
    assert.match(
      all.at(-1) ?? '',
      /ERROR lost the socket directory: the last line/,
      `with ${lines} lines before it (the reader got ${all.length})`,
    );
  }
});
