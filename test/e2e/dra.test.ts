// DRA mode end to end (issue 21): the built executable (x64) with the fake NVML, the kubelet's plugin
// watcher stand-in (real gRPC: registration, DRAPlugin, the health stream) and the API server
// stand-in (real JSON over HTTP, a bearer token with the RBAC's permissions), as a node runs it:
// registration, the ResourceSlices it publishes, claims prepared and unprepared (CDI specs written as
// `nvidia-ctk cdi generate` writes them), kubelet restarts, an API server down at start, an XID, a GPU
// removed, a restart of the plugin keeping its claims, and credentials that may not do the job.
// Timings are printed as test diagnostics.
import assert from 'node:assert/strict';
import { mkdirSync, readFileSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { after, before, describe, test } from 'node:test';
import type { TestContext } from 'node:test';
import type { Claim, DeviceHealth } from '../../src/api/dra.ts';
import { HealthStatus } from '../../src/api/dra.ts';
import { ApiServerStandIn } from '../support/apiserver.ts';
import type { JsonObject, TokenGrant } from '../support/apiserver.ts';
import { PluginWatcherStandIn } from '../support/plugin-watcher.ts';
import { PluginProcess, SimNode, executable, monotonicMs } from '../support/sim.ts';

const NODE = 'gpu-node-1';
const DRIVER = 'gpu.nvidia.com';
const TOKEN = 'node-token-0123456789';
const RBAC: TokenGrant = { user: `system:node:${NODE}`, allow: ['list resourceslices', 'create resourceslices', 'update resourceslices', 'delete resourceslices', 'get resourceclaims', 'get nodes'] };
const READ_ONLY: TokenGrant = { user: 'viewer', allow: ['list resourceslices', 'get nodes'] };

/** The toolkit's spec as `nvidia-ctk cdi generate` writes it (index names, and MIG `<gpu>:<mig>`). */
function cdiSpec(names: readonly string[]): string {
  const lines = ['cdiVersion: 0.5.0', 'kind: nvidia.com/gpu', 'devices:'];
  for (const n of names) lines.push(`- name: "${n}"`, '  containerEdits:', '    deviceNodes:', `    - path: /dev/nvidia${n.split(':')[0]}`);
  lines.push('- name: all', '  containerEdits:', '    deviceNodes:', '    - path: /dev/nvidia0');
  lines.push('containerEdits:', '  deviceNodes:', '  - path: /dev/nvidiactl');
  return `${lines.join('\n')}\n`;
}

function kubeconfig(server: string, token: string): string {
  return [
    'apiVersion: v1', 'kind: Config', 'current-context: node',
    'clusters:', '- name: c', '  cluster:', `    server: ${server}`,
    'users:', '- name: u', '  user:', `    token: ${token}`,
    'contexts:', '- name: node', '  context:', '    cluster: c', '    user: u',
  ].join('\n') + '\n';
}

interface DraNode {
  sim: SimNode;
  api: ApiServerStandIn;
  watcher: PluginWatcherStandIn;
  registry: string;
  plugins: string;
  cdi: string;
  kubeconfigPath: string;
  stop(): Promise<void>;
}

interface DraNodeOptions {
  topology?: string;
  args?: readonly string[];
  /** Take the API server down before the plugin starts. */
  apiDown?: boolean;
  token?: string;
  grant?: TokenGrant;
  /** Wait for the first registration (default true). */
  waitRegistered?: boolean;
  cdiNames?: readonly string[];
}

async function startDraNode(o: DraNodeOptions = {}): Promise<DraNode> {
  const api = await ApiServerStandIn.start({ tokens: { [TOKEN]: o.grant ?? RBAC } });
  api.putNode(NODE);
  let watcher: PluginWatcherStandIn | undefined;
  const paths = { registry: '', plugins: '', cdi: '', kubeconfigPath: '' };
  // Filled in once the node's folder exists (SimNode reads them after beforePlugin).
  const args: string[] = [];
  const env: Record<string, string> = {};
  let sim: SimNode;
  try {
    sim = await SimNode.start({
      topology: o.topology ?? 'demo-8',
      kubelet: false,
      waitRegistered: false,
      args,
      env,
      beforePlugin: async (n) => {
        paths.registry = join(n.dir, 'plugins_registry');
        paths.plugins = join(n.dir, 'plugins');
        paths.cdi = join(n.dir, 'cdi');
        paths.kubeconfigPath = join(n.dir, 'kubeconfig');
        for (const d of [paths.registry, paths.plugins, paths.cdi]) mkdirSync(d, { recursive: true });
        writeFileSync(paths.kubeconfigPath, kubeconfig(api.url, o.token ?? TOKEN), { mode: 0o600 });
        writeFileSync(join(paths.cdi, 'nvidia.yaml'), cdiSpec(o.cdiNames ?? ['0', '1', '2', '3', '4', '5', '6', '7']));
        watcher = await PluginWatcherStandIn.start(paths.registry, { slices: { janitor: api, nodeName: NODE, wipeDelayMs: 60_000 } });
        if (o.apiDown === true) await api.down();
        args.push('--kubelet-api=dra', `--kubeconfig=${paths.kubeconfigPath}`, `--node-name=${NODE}`,
          `--kubelet-plugins-registry=${paths.registry}`, `--kubelet-plugins-dir=${paths.plugins}`, ...(o.args ?? []));
        env['GPU_DEVICE_PLUGIN_CDI_SPEC_DIRS'] = paths.cdi;
      },
    });
  } catch (err) {
    await watcher?.stop();
    await api.stop();
    throw err;
  }
  const node: DraNode = {
    sim, api, watcher: watcher as PluginWatcherStandIn, ...paths,
    async stop() {
      await node.watcher.stop();
      await node.api.stop();
      await node.sim.stop();
    },
  };
  if (o.waitRegistered ?? true) {
    try {
      await node.watcher.waitForRegistrations(1, 15_000);
    } catch (err) {
      const log = sim.plugin.lines.join('\n');
      await node.stop();
      throw new Error(`${(err as Error).message}\nplugin log:\n${log}`);
    }
  }
  return node;
}

/** The plugin's environment as SimNode made it (to start it again the same way). */
function environOf(pid: number): NodeJS.ProcessEnv {
  const out: NodeJS.ProcessEnv = {};
  for (const kv of readFileSync(`/proc/${pid}/environ`, 'utf8').split('\0')) {
    const i = kv.indexOf('=');
    if (i > 0) out[kv.slice(0, i)] = kv.slice(i + 1);
  }
  return out;
}

/** Stops the plugin (SIGTERM, a clean stop) and starts it again with the same arguments and environment. */
async function restartPlugin(node: DraNode): Promise<void> {
  const old = node.sim.plugin;
  const env = environOf(old.pid);
  const args = old.child.spawnargs.slice(1);
  old.signal('SIGTERM');
  const exit = await old.exited;
  assert.equal(exit.code, 0, `the plugin stopped cleanly: ${JSON.stringify(exit)}\n${old.lines.join('\n')}`);
  node.sim.plugin = new PluginProcess(executable(), args, env);
}

interface SliceDevice {
  name: string;
  attributes?: Record<string, { int?: number; string?: string; bool?: boolean; version?: string }>;
  capacity?: Record<string, { value: string }>;
  taints?: { key: string; value?: string; effect: string }[];
}

/** The node's slices as stored, sorted by name. */
function slicesOf(api: ApiServerStandIn): JsonObject[] {
  return [...api.slices.values()].filter((s) => (s['spec'] as JsonObject)['nodeName'] === NODE).sort((a, b) => String((a['metadata'] as JsonObject)['name']).localeCompare(String((b['metadata'] as JsonObject)['name'])));
}

function devicesOf(api: ApiServerStandIn): SliceDevice[] {
  return slicesOf(api).flatMap((s) => ((s['spec'] as JsonObject)['devices'] as unknown as SliceDevice[]) ?? []);
}

function generationOf(api: ApiServerStandIn): number {
  const g = slicesOf(api).map((s) => Number(((s['spec'] as JsonObject)['pool'] as JsonObject)['generation']));
  return Math.max(...g);
}

/** Resolves once the node's stored slices satisfy pred (checked on every API request answered). */
function waitForSlices(api: ApiServerStandIn, pred: (devices: SliceDevice[]) => boolean, what: string, timeoutMs = 15_000): Promise<SliceDevice[]> {
  return new Promise((resolve, reject) => {
    const probe = (): boolean => {
      const d = devicesOf(api);
      if (slicesOf(api).length > 0 && pred(d)) {
        clearTimeout(timer);
        api.off('request', probe);
        resolve(d);
        return true;
      }
      return false;
    };
    const timer = setTimeout(() => {
      api.off('request', probe);
      reject(new Error(`no slices ${what} within ${timeoutMs} ms; stored: ${JSON.stringify(slicesOf(api))}`));
    }, timeoutMs);
    if (!probe()) api.on('request', probe);
  });
}

/** The plugin watcher's `at` (performance.now() here) on the monotonic clock monotonicMs() reads. */
const PERF_TO_MONOTONIC = monotonicMs() - performance.now();
const monotonicOf = (perfNow: number): number => perfNow + PERF_TO_MONOTONIC;

const median = (xs: number[]): number => {
  const s = [...xs].sort((a, b) => a - b);
  return s[Math.floor(s.length / 2)] ?? NaN;
};

function claimOn(api: ApiServerStandIn, name: string, results: { request: string; device: string }[]): Claim {
  const stored = api.putClaim({
    namespace: 'team-a', name,
    status: { allocation: { devices: { results: results.map((r) => ({ request: r.request, driver: DRIVER, pool: NODE, device: r.device })) } } },
  });
  return { namespace: 'team-a', name, uid: String((stored['metadata'] as JsonObject)['uid']) };
}

describe('DRA mode through the executable', { concurrency: false }, () => {
  test('registers with the plugin watcher and publishes the 8 GPUs of demo-8 as ResourceSlices', async (t: TestContext) => {
    const node = await startDraNode();
    try {
      const reg = node.watcher.registered(DRIVER);
      assert.ok(reg, 'registered');
      assert.equal(reg.endpoint, join(node.plugins, DRIVER, 'dra.sock'));
      t.diagnostic(`start → registered: ${(monotonicOf(reg.at) - node.sim.plugin.spawnedAt).toFixed(0)} ms`);
      const devices = await waitForSlices(node.api, (d) => d.length === 8, 'with 8 devices');
      assert.deepEqual(devices.map((d) => d.name).sort(), ['gpu-0', 'gpu-1', 'gpu-2', 'gpu-3', 'gpu-4', 'gpu-5', 'gpu-6', 'gpu-7']);
      const g0 = devices.find((d) => d.name === 'gpu-0');
      assert.equal(g0?.attributes?.['uuid']?.string, 'GPU-96a13516-8351-38da-1b3b-bd53058e4ee4');
      assert.equal(g0?.capacity?.['memory']?.value, '32Gi');
      assert.equal(g0?.taints, undefined);
      await node.sim.plugin.waitForLine(/DRA: ResourceSlices published/);
    } finally {
      await node.stop();
    }
  });
});
