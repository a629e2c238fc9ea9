// The cluster side of the real-systemd DRA tests: the API-server and plugin-watcher stand-ins
// (dra-standins-main.ts) run as transient units in the container, read through their state files and asked through
// their control sockets, and the operator's steps that switch the node to DRA as README's "Dynamic Resource
// Allocation" gives them (a kubeconfig, the environment file, the packaged drop-in linked).
import { DRA_DROPIN, ENV_FILE } from '../../build/package.ts';
import { tokenKubeconfig } from '../support/dra-fixtures.ts';
import type { Container } from './container.ts';
import type { ApiServerState } from './dra-standins-main.ts';
import { OPT, UNIT } from './packaged-node.ts';
import type { LiveUnit } from './unit.ts';

export const NODE = 'gpu-node-1';
export const DRIVER = 'gpu.nvidia.com';
export const REGISTRY = '/var/lib/kubelet/plugins_registry';
export const KUBECONFIG = '/etc/gpu-device-plugin/kubeconfig';
export const NODE_TOKEN = 'node-token-7f3c1d9e2b';
export const ADMIN_TOKEN = 'kubelet-standin-admin-token';
export const API_STATE = '/run/dra-apiserver.json';
export const WATCHER_STATE = '/run/dra-watcher.json';
export const API_CTL = '/run/dra-standins/apiserver.sock';
export const WATCHER_CTL = '/run/dra-standins/watcher.sock';
const STANDINS = `${OPT}/node ${OPT}/dra-standins.cjs`;

/** NodePrepareResources' answer, as the watcher stand-in's control socket gives it. */
export interface Prepared {
  claims: Record<
    string,
    {
      devices: { request_names: string[]; pool_name: string; device_name: string; cdi_device_ids: string[] }[];
      error: string;
    }
  >;
}

export interface Unprepared {
  claims: Record<string, { error: string }>;
}

export class DraCluster {
  private readonly box: () => Container;
  private readonly until: LiveUnit['until'];

  /** `until` waits on the container (a LiveUnit's, whose journal its errors show). */
  constructor(box: () => Container, until: LiveUnit['until']) {
    this.box = box;
    this.until = until;
  }

  /** A stand-in's state file as JSON, or null while there is none. */
  async readState<T>(file: string): Promise<T | null> {
    const r = await this.box().sh(`cat ${file} 2>/dev/null`);
    return r.code === 0 && r.stdout !== '' ? (JSON.parse(r.stdout) as T) : null;
  }

  /** Asks a stand-in through its control socket; its answer as JSON (a failure throws with it). */
  async ctl<T>(socket: string, path: string, body: unknown): Promise<T> {
    const json = JSON.stringify(body).replace(/'/g, `'\\''`);
    return JSON.parse(await this.box().run(`${STANDINS} ctl ${socket} ${path} '${json}'`)) as T;
  }

  /** The API server stand-in started as the unit dra-apiserver; its URL once it serves. */
  async startApiServer(): Promise<string> {
    await this.box().run(
      `systemd-run --unit dra-apiserver --collect --quiet ${STANDINS} ` +
        `apiserver ${API_CTL} ${API_STATE} ${NODE} ${NODE_TOKEN} ${ADMIN_TOKEN}`,
    );
    const s = await this.until('the API server stand-in serves', () =>
      this.readState<ApiServerState>(API_STATE).then((x) => x ?? undefined),
    );
    return s.url;
  }

  /** The kubelet's plugin watcher stand-in started as the unit `unit`, its kubelet talking to `apiUrl`. */
  async startWatcher(unit: string, apiUrl: string): Promise<void> {
    await this.box().run(
      `rm -f ${WATCHER_STATE} && systemd-run --unit ${unit} --collect --quiet ${STANDINS} ` +
        `watcher ${REGISTRY} ${WATCHER_CTL} ${WATCHER_STATE} ${apiUrl} ${ADMIN_TOKEN} ${NODE}`,
    );
    await this.until('the plugin watcher stand-in serves', () =>
      this.readState<unknown>(WATCHER_STATE).then((s) => s ?? undefined),
    );
  }

  /**
   * The operator's steps (README, "Dynamic Resource Allocation"): the node's kubeconfig for `apiUrl`, the
   * environment file's DRA lines (and `moreEnv`, `NAME=value` each), the packaged drop-in linked; not restarted.
   */
  async switchToDra(apiUrl: string, moreEnv: readonly string[] = []): Promise<void> {
    const env = [`KUBELET_API=dra`, `KUBECONFIG=${KUBECONFIG}`, `NODE_NAME=${NODE}`, ...moreEnv];
    await this.box().run(
      [
        'install -d -m 0755 /etc/gpu-device-plugin',
        `printf '%s' '${tokenKubeconfig(apiUrl, NODE_TOKEN)}' > ${KUBECONFIG}`,
        `chmod 0600 ${KUBECONFIG}`,
        `printf '${env.join('\\n')}\\n' >> ${ENV_FILE.deb}`,
        `mkdir -p /etc/systemd/system/${UNIT}.d`,
        `ln -s ${DRA_DROPIN.installed} /etc/systemd/system/${UNIT}.d/dra.conf`,
        'systemctl daemon-reload',
      ].join(' && '),
    );
  }
}
