// `check`'s line on the kubelet's version, where the package cannot say it: the kubelet is often not
// installed from a package at all, so no package relation can hold it to a version truthfully on both
// apt and dnf. The kubelet found on the PATH (or in /usr/bin) is asked `kubelet --version`; DRA mode
// needs 1.34 or later (resource.k8s.io/v1 and the DRA plugin API v1), the device-plugin API 1.10 or later.
import { execFile } from 'node:child_process';
import { access, constants } from 'node:fs/promises';
import { delimiter, join } from 'node:path';
import { promisify } from 'node:util';
import type { KubeletApi } from '../config/options.ts';
import { errorText } from '../system/log.ts';
import type { CheckLine } from './check-report.ts';

const execFileAsync = promisify(execFile);

/** The oldest kubelet each mode works with, as [major, minor]. */
export const KUBELET_MINIMUM: Readonly<Record<KubeletApi, readonly [number, number]>> = {
  dra: [1, 34],
  'device-plugin': [1, 10],
};

/** The kubelet program: the first on the PATH, else /usr/bin/kubelet; null when there is none. */
export async function findKubelet(path: string | undefined): Promise<string | null> {
  const dirs = [...(path ?? '').split(delimiter).filter((d) => d !== ''), '/usr/bin', '/usr/local/bin'];
  for (const dir of dirs) {
    const candidate = join(dir, 'kubelet');
    try {
      await access(candidate, constants.X_OK);
      return candidate;
    } catch {}
  }
  return null;
}

/** [major, minor] of `kubelet --version`'s "Kubernetes v1.34.2", or null when it names no version. */
export function parseKubeletVersion(text: string): [number, number] | null {
  const m = /\bv(\d+)\.(\d+)(?:\.\d+)?/.exec(text);
  return m === null ? null : [Number(m[1]), Number(m[2])];
}

/** Whether this node's kubelet is recent enough for the kubelet API this plugin is set to serve. */
export async function kubeletVersionCheck(mode: KubeletApi, path: string | undefined): Promise<CheckLine> {
  const [major, minor] = KUBELET_MINIMUM[mode];
  const needs = `${mode === 'dra' ? 'DRA mode' : 'the device-plugin API'} needs a kubelet ${major}.${minor} or later`;
  const kubelet = await findKubelet(path);
  if (kubelet === null)
    return {
      status: 'INFO',
      name: "kubelet's version",
      detail: `no kubelet program on the PATH or in /usr/bin; ${needs}`,
    };
  let text: string;
  try {
    text = (await execFileAsync(kubelet, ['--version'], { timeout: 5000 })).stdout.trim();
  } catch (err) {
    return {
      status: 'WARN',
      name: "kubelet's version",
      detail: `${kubelet} --version failed: ${errorText(err)}; ${needs}`,
    };
  }
  const version = parseKubeletVersion(text);
  if (version === null)
    return {
      status: 'WARN',
      name: "kubelet's version",
      detail: `${kubelet} --version said ${JSON.stringify(text)}; ${needs}`,
    };
  const [haveMajor, haveMinor] = version;
  const shown = `${kubelet} is ${haveMajor}.${haveMinor}`;
  if (haveMajor > major || (haveMajor === major && haveMinor >= minor))
    return { status: 'PASS', name: "kubelet's version", detail: `${shown}; ${needs}` };
  return {
    status: 'FAIL',
    name: "kubelet's version",
    detail: `${shown}; ${needs}`,
    fix:
      mode === 'dra'
        ? 'upgrade the kubelet with this package in one maintenance window, or keep KUBELET_API=device-plugin'
        : 'upgrade the kubelet',
  };
}
