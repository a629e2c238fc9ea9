// Every real-systemd test file keeps the container's journals when it fails: it calls journalOnFailure() in its
// describe block before any hook of its own (so the journals are read before its teardown), and names there every
// transient unit it starts with systemd-run, so a stand-in's lines come beside the package's in the failure output.
import assert from 'node:assert/strict';
import { readdirSync, readFileSync } from 'node:fs';
import { join } from 'node:path';
import { test } from 'node:test';

const SYSTEM = join(import.meta.dirname, '..', 'system');
const files = readdirSync(SYSTEM).filter((f) => f.endsWith('.test.ts'));

/** A unit name or glob as journalctl takes it, as a pattern over full unit names. */
function glob(pattern: string): RegExp {
  const full = pattern.includes('.') || pattern.endsWith('*') ? pattern : `${pattern}.service`;
  return new RegExp(`^${full.replace(/[.+?^${}()|[\]\\]/g, '\\$&').replace(/\*/g, '.*')}$`);
}

/** The units a file starts with `systemd-run --unit NAME`, a `${counter}` in a name read as a number. */
function transientUnits(source: string): string[] {
  return [...source.matchAll(/systemd-run --unit[ =]([A-Za-z0-9@_.${}-]+)/g)].map(
    (m) => `${(m[1] ?? '').replace(/\$\{[^}]*\}/g, '1')}.service`,
  );
}

test('the scan finds the real-systemd test files', () => {
  assert.ok(files.length >= 4, `test files under ${SYSTEM}: ${files.join(', ')}`);
});

for (const file of files) {
  test(`${file} keeps the journals of its failures, its stand-ins' included`, () => {
    const source = readFileSync(join(SYSTEM, file), 'utf8');
    const call = /journalOnFailure\(\(\) => [^,)]+(?:, \[([^\]]*)\])?\)/.exec(source);
    assert.ok(call, `${file} calls journalOnFailure(() => container, [its stand-in units]) in its describe block`);
    const firstHook = source.search(/^\s*(before|after|beforeEach|afterEach)\(/m);
    assert.ok(firstHook === -1 || call.index < firstHook, `${file}: journalOnFailure() comes before its own hooks`);
    const named = [...(call[1] ?? '').matchAll(/'([^']+)'/g)].map((m) => glob(m[1] ?? ''));
    const missing = transientUnits(source).filter((u) => !named.some((g) => g.test(u)));
    assert.deepEqual(missing, [], `${file}: units it starts that journalOnFailure() is not told of`);
  });
}
