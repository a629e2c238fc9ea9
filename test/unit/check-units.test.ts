// `check`'s sandbox lines: the units the package ships, as installed under a root of our own, against drop-ins
// an operator might write. The unit files are the checkout's own, so a change to them is judged as shipped.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { mkdirSync, mkdtempSync, readFileSync, rmSync, symlinkSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { dirname, join } from 'node:path';
import { unitSandboxChecks } from '../../src/cli/check-units.ts';
import type { CheckLine } from '../../src/cli/check-report.ts';
import { sandboxDrift } from '../../src/cli/unit-drift.ts';

const REPO = join(import.meta.dirname, '..', '..');
const shippedText = (name: string): string => readFileSync(join(REPO, 'systemd', name), 'utf8');
const PLUGIN = 'gpu-device-plugin.service';
const MPS = 'gpu-device-plugin-mps.service';

/** A root with the package's files installed where the packages put them. */
function installedRoot(t: { after: (fn: () => void) => void }): string {
  const root = mkdtempSync(join(tmpdir(), 'gdp-units-'));
  t.after(() => rmSync(root, { recursive: true, force: true }));
  for (const name of [PLUGIN, MPS]) put(root, `/usr/lib/systemd/system/${name}`, shippedText(name));
  put(root, '/usr/share/gpu-device-plugin/dra.conf', shippedText('dra.conf'));
  return root;
}

function put(root: string, path: string, text: string): void {
  mkdirSync(dirname(join(root, path)), { recursive: true });
  writeFileSync(join(root, path), text);
}

/** Links the package's DRA drop-in as the README says (the link's target inside the test's root). */
function linkDraDropIn(root: string): void {
  mkdirSync(join(root, `/etc/systemd/system/${PLUGIN}.d`), { recursive: true });
  symlinkSync(
    join(root, '/usr/share/gpu-device-plugin/dra.conf'),
    join(root, `/etc/systemd/system/${PLUGIN}.d/dra.conf`),
  );
}

const line = (lines: readonly CheckLine[], name: string): CheckLine => {
  const l = lines.find((x) => x.name === name);
  assert.ok(l !== undefined, `a line named ${name} in ${JSON.stringify(lines)}`);
  return l;
};

test('the units as the package installs them pass, with and without the DRA drop-in linked', async (t) => {
  const root = installedRoot(t);
  let lines = await unitSandboxChecks(root);
  assert.deepEqual(
    lines.map((l) => [l.name, l.status]),
    [
      [`sandbox of ${PLUGIN}`, 'PASS'],
      [`sandbox of ${MPS}`, 'PASS'],
    ],
  );
  linkDraDropIn(root);
  lines = await unitSandboxChecks(root);
  assert.equal(line(lines, `sandbox of ${PLUGIN}`).status, 'PASS', JSON.stringify(lines));
  assert.equal(line(lines, 'DRA drop-in').status, 'PASS');
  assert.match(line(lines, `sandbox of ${PLUGIN}`).detail, /gpu-device-plugin\.service\.d\/dra\.conf/);
});

test("an operator's drop-in that loosens the plugin's sandbox is named setting by setting", async (t) => {
  const root = installedRoot(t);
  put(
    root,
    `/etc/systemd/system/${PLUGIN}.d/override.conf`,
    '[Service]\nUser=nobody\nCapabilityBoundingSet=CAP_SYS_ADMIN\nProtectSystem=full\nReadWritePaths=/etc/cdi\n' +
      'PrivateNetwork=no\nNoNewPrivileges=no\nDeviceAllow=block-* rw\nExecStartPre=+/usr/local/bin/prep\n',
  );
  const l = line(await unitSandboxChecks(root), `sandbox of ${PLUGIN}`);
  assert.equal(l.status, 'WARN');
  for (const want of [
    "User=nobody (the package's: (not set))",
    'CapabilityBoundingSet= adds CAP_SYS_ADMIN',
    "ProtectSystem=full (the package's: strict)",
    'ReadWritePaths= adds /etc/cdi',
    'PrivateNetwork=no',
    'NoNewPrivileges=no',
    'DeviceAllow= adds block-* rw',
    'privileged Exec*= commands adds ExecStartPre=+/usr/local/bin/prep',
  ])
    assert.ok(l.detail.includes(want), `"${want}" in: ${l.detail}`);
  assert.match(l.detail, /override\.conf/, 'names the file read');
  assert.match(l.fix ?? '', /systemctl cat gpu-device-plugin\.service/);
});

test('a drop-in that only narrows the sandbox is no drift', async (t) => {
  const root = installedRoot(t);
  linkDraDropIn(root);
  // The README's zz-api.conf (allow only the API server), a path made read-only, a capability set emptied.
  put(
    root,
    `/etc/systemd/system/${PLUGIN}.d/zz-api.conf`,
    '[Service]\nIPAddressDeny=any\nIPAddressAllow=10.0.0.10/32\nReadOnlyPaths=/srv\nCapabilityBoundingSet=\n',
  );
  put(
    root,
    `/etc/systemd/system/${MPS}.d/narrow.conf`,
    '[Service]\nCapabilityBoundingSet=\nCapabilityBoundingSet=CAP_SYS_ADMIN\n',
  );
  const lines = await unitSandboxChecks(root);
  assert.deepEqual(
    lines.map((l) => l.status),
    ['PASS', 'PASS', 'PASS'],
    JSON.stringify(lines),
  );
});

test('a copied DRA drop-in that was widened warns on its own line and in the unit', async (t) => {
  const root = installedRoot(t);
  put(
    root,
    `/etc/systemd/system/${PLUGIN}.d/dra.conf`,
    shippedText('dra.conf').replace('ReadWritePaths=-/run/nvidia/mps/dra/requests', 'ReadWritePaths=-/run/nvidia/mps'),
  );
  const lines = await unitSandboxChecks(root);
  assert.equal(line(lines, 'DRA drop-in').status, 'WARN');
  assert.match(line(lines, 'DRA drop-in').fix ?? '', /ln -sf \/usr\/share\/gpu-device-plugin\/dra\.conf/);
  const unit = line(lines, `sandbox of ${PLUGIN}`);
  assert.equal(unit.status, 'WARN');
  assert.match(unit.detail, /ReadWritePaths= adds -\/run\/nvidia\/mps\b/);
});

test("a whole unit in /etc that masks the package's, and an MPS unit given more, are drift", async (t) => {
  const root = installedRoot(t);
  put(root, `/etc/systemd/system/${PLUGIN}`, '[Service]\nExecStart=/usr/bin/gpu-device-plugin\n');
  put(
    root,
    `/etc/systemd/system/${MPS}.d/more.conf`,
    '[Service]\nCapabilityBoundingSet=CAP_SYS_PTRACE\nRestrictNamespaces=\nSystemCallFilter=\n',
  );
  const lines = await unitSandboxChecks(root);
  const plugin = line(lines, `sandbox of ${PLUGIN}`);
  assert.equal(plugin.status, 'WARN');
  assert.match(plugin.detail, /CapabilityBoundingSet is not set: every capability/);
  assert.match(plugin.detail, /ProtectSystem=\(not set\) \(the package's: strict\)/);
  assert.match(plugin.detail, /read: \/etc\/systemd\/system\/gpu-device-plugin\.service/);
  const mps = line(lines, `sandbox of ${MPS}`);
  assert.equal(mps.status, 'WARN');
  assert.match(mps.detail, /CapabilityBoundingSet= adds CAP_SYS_PTRACE/);
  assert.match(mps.detail, /RestrictNamespaces=\(empty\) \(the package's: mnt\)/);
  assert.match(mps.detail, /SystemCallFilter=\(empty\)/);
});

test('a node without the package installed gets SKIP, not PASS', async (t) => {
  const root = mkdtempSync(join(tmpdir(), 'gdp-units-'));
  t.after(() => rmSync(root, { recursive: true, force: true }));
  const lines = await unitSandboxChecks(root);
  assert.deepEqual(
    lines.map((l) => l.status),
    ['SKIP', 'SKIP'],
  );
});

test('drift reads settings as systemd applies them: resets, "-" prefixes, later lines', () => {
  const base = ['[Service]\nReadWritePaths=-/a\nProtectSystem=strict\nPrivateTmp=yes\n'];
  assert.deepEqual(sandboxDrift(base, [...base, '[Service]\nReadWritePaths=\nReadWritePaths=/a\n']), []);
  assert.deepEqual(sandboxDrift(base, [...base, '[Service]\nPrivateTmp=no\nPrivateTmp=yes\n']), []);
  assert.deepEqual(sandboxDrift(base, [...base, '[Install]\nReadWritePaths=/b\n']), [], 'only [Service] counts');
  assert.deepEqual(sandboxDrift(base, [...base, '[Service]\nProtectSystem=yes\n']), [
    "ProtectSystem=yes (the package's: strict)",
  ]);
  assert.deepEqual(sandboxDrift(base, [...base, '[Service]\nExecStartPre=+/x\nExecStartPre=\n']), []);
  const families = ['[Service]\nRestrictAddressFamilies=AF_UNIX\n'];
  assert.deepEqual(sandboxDrift(families, [...families, '[Service]\nRestrictAddressFamilies=AF_PACKET\n']), [
    "RestrictAddressFamilies=AF_UNIX AF_PACKET (the package's: AF_UNIX)",
  ]);
});
