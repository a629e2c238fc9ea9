// A node snapshot read from a topology fixture the way the daemon reads it: the fake NVML (built from
// test/fake-nvml, its real C ABI) loaded in-process through koffi, scanned by the real NvmlSessions
// (GPUs, NVLinks, PCIe levels, node facts, MIG), then made a snapshot by the real buildSnapshot. For
// unit tests of what is derived from snapshots (DRA devices and slices) on facts NVML really gives.
import { mkdirSync, mkdtempSync, rmSync, symlinkSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { buildFakeNvml, LIBRARY_NAME } from '../fake-nvml/build.ts';
import { NvmlSessions } from '../../src/nvml/node-reader.ts';
import { buildSnapshot } from '../../src/core/snapshot.ts';
import type { NodeScan, NodeSnapshot } from '../../src/core/snapshot.ts';
import type { MigStrategy } from '../../src/core/mig.ts';
import { createLogger } from '../../src/system/log.ts';
import { loadKoffi } from '../../src/system/native.ts';
import { TOPOLOGIES } from './sim.ts';

/**
 * One scan of a fixture (a file of test/fixtures/topologies). The fake NVML reads FAKE_NVML_CONFIG at
 * its first nvmlInit, so fixtures are scanned one after the other (each session is closed).
 */
export async function scanFixture(fixture: string, mig: boolean): Promise<NodeScan> {
  const built = join((await buildFakeNvml()).current, LIBRARY_NAME);
  const sysfs = mkdtempSync(join(tmpdir(), 'gdp-scan-'));
  const procRoot = join(sysfs, 'proc');
  // A driver root holding the fake library where a containerised driver keeps libnvidia-ml.
  const driverRoot = join(sysfs, 'driver');
  mkdirSync(join(driverRoot, 'usr', 'lib64'), { recursive: true });
  symlinkSync(built, join(driverRoot, 'usr', 'lib64', LIBRARY_NAME));
  const saved = { config: process.env.FAKE_NVML_CONFIG };
  process.env.FAKE_NVML_CONFIG = join(TOPOLOGIES, fixture);
  try {
    const log = createLogger({ level: 'error', journal: false, write: () => {} });
    const sessions = new NvmlSessions({
      koffi: loadKoffi(),
      driverRoot,
      sysfsRoot: sysfs,
      log,
      mig,
      facts: true,
      env: { PROC_ROOT: procRoot },
    });
    const reader = sessions.open();
    try {
      return reader.read(null);
    } finally {
      reader.close();
    }
  } finally {
    if (saved.config === undefined) delete process.env.FAKE_NVML_CONFIG;
    else process.env.FAKE_NVML_CONFIG = saved.config;
    rmSync(sysfs, { recursive: true, force: true });
  }
}

/** The first snapshot of a fixture, its MIG devices read when a MIG strategy is used. */
export async function fixtureSnapshot(fixture: string, migStrategy: MigStrategy = 'none'): Promise<NodeSnapshot> {
  const scan = await scanFixture(fixture, migStrategy !== 'none');
  return buildSnapshot(scan, null, false);
}
