// The health signals beyond XIDs through the built executable's `info` and `check`, against the fake
// NVML with signal states in its config and no daemon running: each GPU's signals read in one probe
// round of the health thread, with value, class and what to do; which signals each GPU's driver
// supports, from the current library (with calls made unsupported or missing) and the old one.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { execFile } from 'node:child_process';
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { buildFakeNvml } from '../fake-nvml/build.ts';
import { TOPOLOGIES, executable, loadTopology, writeSysfs } from '../support/sim.ts';

interface Run {
  status: number | null;
  stdout: string;
  stderr: string;
}

/** demo-8 (V100s: no row remapping) with these GPUs' `health` fixtures. */
function nodeConfig(dir: string, health: Record<number, Record<string, unknown>>): string {
  const topo = JSON.parse(readFileSync(join(TOPOLOGIES, 'demo-8.json'), 'utf8')) as { gpus: object[] };
  topo.gpus = topo.gpus.map((g, i) => (health[i] === undefined ? g : { ...g, health: health[i] }));
  const path = join(dir, 'node.json');
  writeFileSync(path, JSON.stringify(topo));
  return path;
}

/** Runs the executable with no daemon (no state file) against the fake NVML of `variant`. */
async function run(args: string[], dir: string, config: string, variant: 'current' | 'old' = 'current'): Promise<Run> {
  const libs = await buildFakeNvml();
  const sys = join(dir, 'sys');
  writeSysfs(sys, loadTopology('demo-8'));
  const env: Record<string, string> = {
    PATH: '/nonexistent',
    TMPDIR: dir,
    SYSFS_ROOT: sys,
    LD_LIBRARY_PATH: libs[variant],
    FAKE_NVML_CONFIG: config,
    SYSTEMD_UNIT_ROOT: join(dir, 'root'),
    CDI_SPEC_DIRS: join(dir, 'cdi'),
    GPU_DEVICE_PLUGIN_STATE_FILE: join(dir, 'state.json'),
    KUBELET_SOCKET: join(dir, 'kubelet.sock'),
    POD_RESOURCES_SOCKET: join(dir, 'pod-resources.sock'),
  };
  return new Promise((resolve) => {
    execFile(executable(), args, { env, encoding: 'utf8', timeout: 30000 }, (err, stdout, stderr) => {
      const status =
        err === null ? 0 : typeof (err as { code?: unknown }).code === 'number' ? (err as { code: number }).code : null;
      resolve({ status, stdout, stderr });
    });
  });
}

/** The row of `info`'s signals table for a GPU and signal. */
function row(out: string, gpu: number, signal: string): string {
  return (
    out.split('\n').find((l) => new RegExp(`^${gpu} +${signal} `).test(l)) ?? `(no row ${gpu} ${signal} in:\n${out})`
  );
}

function checkLine(out: string): string {
  return out.split('\n').find((l) => /^(PASS|WARN|FAIL|SKIP) {2}health signals /.test(l)) ?? `(none in:\n${out})`;
}

async function withDir(prefix: string, body: (dir: string) => Promise<void>): Promise<void> {
  const dir = mkdtempSync(join(tmpdir(), prefix));
  try {
    await body(dir);
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
}

test(
  'info with no daemon: every signal of each GPU from one probe ' +
    'round, bad ones with value, class and what to do; --json the same',
  () =>
    withDir('gdp-signals-info-', async (dir) => {
      const config = nodeConfig(dir, {
        1: { recoveryAction: 2 },
        3: { pcieWidth: 8 },
        5: { retiredPages: { singleBit: 40, doubleBit: 30, pending: false } },
        6: { unsupported: ['ecc'] },
      });
      const r = await run(['info'], dir, config);
      assert.equal(r.status, 0, r.stderr);
      assert.match(r.stdout, /Daemon: not running/);
      assert.match(r.stdout, /Health signals beyond XIDs \(one probe round just now, no daemon runs/);
      assert.match(row(r.stdout, 0, 'recovery-action'), /^0 +recovery-action +ok +critical +NONE +- +-$/);
      assert.match(row(r.stdout, 0, 'row-remap'), /^0 +row-remap +unavailable +critical /, 'V100: no row remapping');
      assert.match(
        row(r.stdout, 1, 'recovery-action'),
        /^1 +recovery-action +bad +critical +NODE_REBOOT +- +the driver asks for a node reboot: drain the node/,
      );
      assert.match(
        row(r.stdout, 3, 'pcie-width'),
        /^3 +pcie-width +bad +warn +x8 of x16 +- +the PCIe link runs at x8 of x16/,
      );
      assert.match(
        row(r.stdout, 5, 'retired-pages'),
        /^5 +retired-pages +bad +critical +limit \(40 single-bit, 30 double-bit\) .*repair.*does not clear by itself/,
      );
      assert.match(row(r.stdout, 6, 'ecc-uncorrectable'), /^6 +ecc-uncorrectable +unavailable /);
      assert.match(row(r.stdout, 7, 'nvlink'), /^7 +nvlink +ok +critical +\d+ of \d+ up /);
      for (let g = 0; g < 8; g++)
        assert.equal(
          r.stdout.split('\n').filter((l) => new RegExp(`^${g} +[a-z-]+ +(ok|bad|unavailable|unknown|off) `).test(l))
            .length,
          8,
          `GPU ${g}: 8 signals`,
        );

      const j = await run(['info', '--json'], dir, config);
      assert.equal(j.status, 0, j.stderr);
      const doc = JSON.parse(j.stdout) as {
        gpus: {
          index: number;
          signalsFrom: string;
          signals: { signal: string; status: string; value: string; action?: string }[];
        }[];
      };
      assert.equal(doc.gpus.length, 8);
      const g1 = doc.gpus[1]!;
      assert.equal(g1.signalsFrom, 'probe round');
      assert.deepEqual(
        g1.signals.map((s) => s.signal),
        [
          'recovery-action',
          'row-remap',
          'retired-pages',
          'ecc-uncorrectable',
          'nvlink',
          'pcie-width',
          'pcie-replay',
          'clocks',
        ],
      );
      const ra = g1.signals.find((s) => s.signal === 'recovery-action')!;
      assert.equal(ra.status, 'bad');
      assert.equal(ra.value, 'NODE_REBOOT');
      assert.match(ra.action ?? '', /reboot/);
      assert.equal(doc.gpus[0]!.signals.find((s) => s.signal === 'recovery-action')!.status, 'ok');
    }),
);

test(
  "check lists the signals each GPU's driver supports and which are " +
    'not available where (unsupported, missing), and warns of a bad one',
  () =>
    withDir('gdp-signals-check-', async (dir) => {
      const quiet = nodeConfig(dir, { 2: { unsupported: ['ecc', 'pcie-replay'] }, 4: { missing: ['clocks'] } });
      const r = await run(['check'], dir, quiet);
      // GPU 2's list replaces the V100's default (no row remapping), so row remapping answers there.
      const detail = [
        'supported by the driver on every GPU: recovery-action, retired-pages, nvlink, pcie-width',
        'not available: row-remap on GPU 0,1,3,4,5,6,7',
        'ecc-uncorrectable on GPU 2',
        'pcie-replay on GPU 2',
        'clocks on GPU 4',
      ].join('; ');
      assert.match(checkLine(r.stdout), /^PASS {2}health signals +/);
      assert.ok(checkLine(r.stdout).endsWith(`  ${detail}`), checkLine(r.stdout));
      const j = JSON.parse((await run(['check', '--json'], dir, quiet)).stdout) as {
        checks: { name: string; status: string; detail: string }[];
      };
      const line = j.checks.find((c) => c.name === 'health signals')!;
      assert.equal(line.status, 'PASS');
      assert.equal(line.detail, detail);

      const bad = nodeConfig(dir, {
        3: { remappedRows: { corrected: 0, uncorrected: 0, pending: false, failure: false }, recoveryAction: 1 },
      });
      const b = await run(['check'], dir, bad);
      assert.match(
        checkLine(b.stdout),
        /^WARN {2}health signals +bad now: GPU 3 recovery-action=GPU_RESET \(critical\); supported /,
      );
    }),
);

test(
  'check and info with the old library: the recovery-action field, ' +
    'remapped rows and retired pages are not available, never an alarm',
  () =>
    withDir('gdp-signals-old-', async (dir) => {
      const config = nodeConfig(dir, {});
      const r = await run(['check'], dir, config, 'old');
      const detail = [
        'supported by the driver on every GPU: ecc-uncorrectable, nvlink, pcie-width, pcie-replay, clocks',
        'not available: recovery-action on every GPU',
        'row-remap on every GPU',
        'retired-pages on every GPU',
      ].join('; ');
      assert.match(checkLine(r.stdout), /^PASS {2}health signals +/);
      assert.ok(checkLine(r.stdout).endsWith(`  ${detail}`), checkLine(r.stdout));
      const i = await run(['info'], dir, config, 'old');
      assert.equal(i.status, 0, i.stderr);
      assert.match(row(i.stdout, 0, 'recovery-action'), /^0 +recovery-action +unavailable /);
      assert.doesNotMatch(i.stdout, /^\d+ +[a-z-]+ +bad /m);
    }),
);
