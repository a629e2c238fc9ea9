// Whether the service may write where it must: judged as the unit's sandbox lets it (sandbox.ts), then
// on disk. The kubelet's socket directory, the labels and metrics files' directories, the state file's.
import { access, constants as fsc, stat } from 'node:fs/promises';
import { dirname } from 'node:path';
import type { Options } from '../config/options.ts';
import { defaultStateFile } from '../observe/state-file.ts';
import { errorText } from '../system/log.ts';
import type { CheckLine } from './check-report.ts';
import type { UnitRead } from './host-view.ts';
import { writableInSandbox } from './sandbox.ts';

/** A directory the service writes into, judged as the unit's sandbox lets it, then on disk. */
export async function writableForService(
  name: string,
  dir: string,
  unit: UnitRead,
  isRoot: boolean,
  fix: string,
): Promise<CheckLine> {
  const v = writableInSandbox(unit.sandbox, dir);
  const dropin = `add ReadWritePaths=${dir} with \`systemctl edit gpu-device-plugin\``;
  if (!v.writable)
    return { status: 'FAIL', name, detail: `${dir}: ${v.why} (unit: ${unit.source})`, fix: `${dropin}; ${fix}` };
  if (v.private === true)
    return {
      status: 'FAIL',
      name,
      detail: `${dir}: ${v.how} (unit: ${unit.source})`,
      fix: `use a directory outside /tmp and /var/tmp, and ${dropin}`,
    };
  try {
    const st = await stat(dir);
    if (!st.isDirectory()) throw new Error('is not a directory');
  } catch (err) {
    return { status: 'FAIL', name, detail: `${dir}: ${errorText(err)}`, fix };
  }
  if (!isRoot)
    return {
      status: 'SKIP',
      name,
      detail:
        `${dir} exists and the unit's sandbox allows writing (${v.how}); ` +
        `whether root may write there was not checked: not running as root`,
    };
  try {
    await access(dir, fsc.W_OK);
  } catch (err) {
    return { status: 'FAIL', name, detail: `${dir}: ${errorText(err)}`, fix };
  }
  return { status: 'PASS', name, detail: `${dir} is writable for the service (${v.how})` };
}

/**
 * The directories the service writes into: the kubelet's socket directory, the labels and metrics files' (when
 * configured), the state file's.
 */
export async function writabilityChecks(
  o: Options,
  unit: UnitRead,
  env: Readonly<Record<string, string | undefined>>,
  isRoot: boolean,
): Promise<CheckLine[]> {
  const lines: CheckLine[] = [];
  // The device-plugin API's socket directory; DRA mode's directories are draChecks'.
  if (o.kubeletApi !== 'dra')
    lines.push(
      await writableForService(
        'socket directory',
        dirname(o.kubeletSocket),
        unit,
        isRoot,
        'is the kubelet installed and its device plugins enabled? or set --kubelet-socket',
      ),
    );
  // The labels and metrics files, when configured: their directory must exist and be writable.
  for (const [name, file, reader] of [
    ['labels file', o.nfdFeaturesFile, 'Node Feature Discovery'],
    ['metrics file', o.metricsFile, 'node_exporter'],
  ] as const) {
    if (file === null) continue;
    lines.push(
      await writableForService(name, dirname(file), unit, isRoot, `is ${reader} installed? create the directory`),
    );
  }
  const stateFile = defaultStateFile(env);
  const stateDir = dirname(stateFile);
  // The runtime directory exists only while the service runs: systemd creates it at start.
  const madeAtStart =
    unit.sandbox.serviceDirectories.includes(stateDir) &&
    !(await stat(stateDir).then(
      () => true,
      () => false,
    ));
  lines.push(
    madeAtStart
      ? {
          status: 'SKIP',
          name: 'state file',
          detail: `${stateDir} is created by systemd when the service starts (RuntimeDirectory=); not there now`,
        }
      : await writableForService(
          'state file',
          stateDir,
          unit,
          isRoot,
          `the service publishes its state to ${stateFile} for \`info\`; ` +
            `under the unit RuntimeDirectory= creates its directory at start`,
        ),
  );
  return lines;
}
