// A DRA node for end-to-end tests: the built executable in DRA mode with the fake NVML, the kubelet's plugin
// watcher stand-in (real gRPC) and the API server stand-in (real JSON over HTTP, a bearer token with the RBAC's
// permissions), and what the tests read of them: the stored slices, claims put allocated, how the plugin was
// started (to restart it, or to start the MPS unit's program the same way).
import assert from 'node:assert/strict';
import { mkdirSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import type { Claim, DeviceHealth, DraHealthVersion, NodePrepareResourceResponse } from '../../src/api/dra.ts';
import { HealthStatus } from '../../src/api/dra.ts';
import { ApiServerStandIn } from './apiserver.ts';
import type { ApiServerOptions, JsonObject, TokenGrant } from './apiserver.ts';
import { byIndex, cdiSpec, tokenKubeconfig } from './dra-fixtures.ts';
import { writeMigMinors } from './mig.ts';
import { unmountUnder } from './mounts.ts';
import { PluginWatcherStandIn } from './plugin-watcher.ts';
import { onEvent, waitFor } from './wait.ts';
import { PluginProcess, SimNode, executable, monotonicMs } from './sim.ts';

export const NODE = 'gpu-node-1';
export const DRIVER = 'gpu.nvidia.com';
export const TOKEN = 'node-token-0123456789';
export const RBAC: TokenGrant = {
  user: `system:node:${NODE}`,
  allow: [
    'list resourceslices',
    'watch resourceslices',
    'create resourceslices',
    'update resourceslices',
    'delete resourceslices',
    'get resourceclaims',
    'get nodes',
  ],
};
export const READ_ONLY: TokenGrant = { user: 'viewer', allow: ['list resourceslices', 'get nodes'] };

export interface DraNode {
  sim: SimNode;
  api: ApiServerStandIn;
  watcher: PluginWatcherStandIn;
  registry: string;
  plugins: string;
  cdi: string;
  kubeconfigPath: string;
  configPath: string;
  stop(): Promise<void>;
}

export interface DraNodeOptions {
  topology?: string;
  args?: readonly string[];
  /** Take the API server down before the plugin starts. */
  apiDown?: boolean;
  token?: string;
  grant?: TokenGrant;
  /** Wait for the first registration (default true). */
  waitRegistered?: boolean;
  cdiNames?: readonly string[];
  /** More environment for the plugin. */
  env?: Readonly<Record<string, string>>;
  /** A config file with this text, named with --config-file (node.configPath). */
  config?: string;
  /** The health services the kubelet stand-in speaks (default v1alpha1 only, as 1.34–1.36). */
  healthVersions?: DraHealthVersion[];
  /** The API server stand-in's options (default: the node's token with `grant`). */
  api?: ApiServerOptions;
  /** The kubeconfig's text for the stand-in's URL (default: the token's). */
  kubeconfig?: (url: string) => string;
}

export async function startDraNode(o: DraNodeOptions = {}): Promise<DraNode> {
  const api = await ApiServerStandIn.start(o.api ?? { tokens: { [TOKEN]: o.grant ?? RBAC } });
  api.putNode(NODE);
  let watcher: PluginWatcherStandIn | undefined;
  const paths = { registry: '', plugins: '', cdi: '', kubeconfigPath: '', configPath: '' };
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
        paths.configPath = join(n.dir, 'config.yaml');
        if (o.config !== undefined) writeFileSync(paths.configPath, o.config);
        for (const d of [paths.registry, paths.plugins, paths.cdi]) mkdirSync(d, { recursive: true });
        const kubeconfig = o.kubeconfig?.(api.url) ?? tokenKubeconfig(api.url, o.token ?? TOKEN);
        writeFileSync(paths.kubeconfigPath, kubeconfig, { mode: 0o600 });
        writeFileSync(
          join(paths.cdi, 'nvidia.yaml'),
          cdiSpec(byIndex(o.cdiNames ?? ['0', '1', '2', '3', '4', '5', '6', '7'])),
        );
        watcher = await PluginWatcherStandIn.start(paths.registry, {
          slices: { janitor: api, nodeName: NODE, wipeDelayMs: 60_000 },
          ...(o.healthVersions === undefined ? {} : { healthVersions: o.healthVersions }),
        });
        if (o.apiDown === true) await api.down();
        args.push(
          '--kubelet-api=dra',
          `--kubeconfig=${paths.kubeconfigPath}`,
          `--node-name=${NODE}`,
          `--kubelet-plugins-registry=${paths.registry}`,
          `--kubelet-plugins-dir=${paths.plugins}`,
          ...(o.config === undefined ? [] : [`--config-file=${paths.configPath}`]),
          ...(o.args ?? []),
        );
        env.CDI_SPEC_DIRS = paths.cdi;
        Object.assign(env, o.env ?? {});
      },
    });
  } catch (err) {
    await watcher?.stop();
    await api.stop();
    throw err;
  }
  const node: DraNode = {
    sim,
    api,
    watcher: watcher as PluginWatcherStandIn,
    ...paths,
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
export function environOf(pid: number): NodeJS.ProcessEnv {
  const out: NodeJS.ProcessEnv = {};
  for (const kv of readFileSync(`/proc/${pid}/environ`, 'utf8').split('\0')) {
    const i = kv.indexOf('=');
    if (i > 0) out[kv.slice(0, i)] = kv.slice(i + 1);
  }
  return out;
}

/** How the plugin was started (to start it again the same way). */
export function launchOf(p: PluginProcess): { args: string[]; env: NodeJS.ProcessEnv } {
  return { args: p.child.spawnargs.slice(1), env: environOf(p.pid) };
}

/**
 * Stops the plugin (SIGTERM: a clean stop, exit 0), runs `between`,
 * and starts it again with the same arguments and environment.
 */
export async function restartPlugin(node: DraNode, between?: () => void): Promise<void> {
  const old = node.sim.plugin;
  const { args, env } = launchOf(old);
  old.signal('SIGTERM');
  const exit = await old.exited;
  assert.equal(exit.code, 0, `the plugin stopped cleanly: ${JSON.stringify(exit)}\n${old.lines.join('\n')}`);
  between?.();
  node.sim.plugin = new PluginProcess(executable(), args, env);
}

export interface SliceDevice {
  name: string;
  attributes?: Record<string, { int?: number; string?: string; bool?: boolean; version?: string }>;
  allowMultipleAllocations?: boolean;
  capacity?: Record<string, { value: string; requestPolicy?: JsonObject }>;
  taints?: { key: string; value?: string; effect: string }[];
  consumesCounters?: unknown[];
}

/** The node's slices as stored, sorted by name. */
export function slicesOf(api: ApiServerStandIn): JsonObject[] {
  return [...api.slices.values()]
    .filter((s) => (s.spec as JsonObject).nodeName === NODE)
    .sort((a, b) => String((a.metadata as JsonObject).name).localeCompare(String((b.metadata as JsonObject).name)));
}

export function devicesOf(api: ApiServerStandIn): SliceDevice[] {
  return slicesOf(api).flatMap((s) => ((s.spec as JsonObject).devices as unknown as SliceDevice[]) ?? []);
}

export function generationOf(api: ApiServerStandIn): number {
  const g = slicesOf(api).map((s) => Number(((s.spec as JsonObject).pool as JsonObject).generation));
  return Math.max(...g);
}

/** Resolves once the node's stored slices satisfy pred (checked on every API request answered). */
export function waitForSlices(
  api: ApiServerStandIn,
  pred: (devices: SliceDevice[]) => boolean,
  what: string,
  timeoutMs = 15_000,
): Promise<SliceDevice[]> {
  return waitFor(() => (slicesOf(api).length > 0 && pred(devicesOf(api)) ? devicesOf(api) : undefined), {
    on: onEvent(api, 'request'),
    deadlineMs: timeoutMs,
    what: () => `slices ${what}; stored: ${JSON.stringify(slicesOf(api))}`,
  });
}

/** The plugin watcher's `at` (performance.now() here) on the monotonic clock monotonicMs() reads. */
export const PERF_TO_MONOTONIC = monotonicMs() - performance.now();
export const monotonicOf = (perfNow: number): number => perfNow + PERF_TO_MONOTONIC;

export const median = (xs: number[]): number => {
  const s = [...xs].sort((a, b) => a - b);
  return s[Math.floor(s.length / 2)] ?? NaN;
};

export function claimOn(
  api: ApiServerStandIn,
  name: string,
  results: { request: string; device: string }[],
  config?: JsonObject[],
): Claim {
  const stored = api.putClaim({
    namespace: 'team-a',
    name,
    status: {
      allocation: {
        devices: {
          results: results.map((r) => ({ request: r.request, driver: DRIVER, pool: NODE, device: r.device })),
          ...(config === undefined ? {} : { config }),
        },
      },
    },
  });
  return { namespace: 'team-a', name, uid: String((stored.metadata as JsonObject).uid) };
}

export function unhealthy(devices: readonly DeviceHealth[], name: string): boolean {
  return devices.some((d) => d.device?.device_name === name && d.health === HealthStatus.UNHEALTHY);
}

/** NodePrepareResources of one claim through the plugin watcher's DRA client: that claim's answer. */
export async function prepareClaim(node: DraNode, claim: Claim): Promise<NodePrepareResourceResponse> {
  const r = await node.watcher.client(DRIVER).prepare([claim]);
  const one = r.claims?.[claim.uid];
  assert.ok(one, `an answer for ${claim.name}`);
  return one;
}

/** NodeUnprepareResources of one claim; fails the test unless it was unprepared without error. */
export async function unprepareClaim(node: DraNode, claim: Claim): Promise<void> {
  const r = await node.watcher.client(DRIVER).unprepare([claim]);
  assert.equal(r.claims?.[claim.uid]?.error, '', `unprepared ${claim.name}`);
}

/**
 * The MPS unit's program beside the node's plugin, as its DRA sharing agent: started with the plugin's arguments
 * and environment, the fake NVML's control FIFO left to the plugin (a second reader would take its commands), its
 * own state directory (as the unit's StateDirectory= gives it) and `env` over them; with `unshare`, in a private
 * mount namespace of its own (what it mounts stays there).
 */
export function startSharingAgent(
  node: DraNode,
  stateDir: string,
  o: { readonly env?: Readonly<Record<string, string>>; readonly unshare?: boolean } = {},
): PluginProcess {
  const { args, env } = launchOf(node.sim.plugin);
  delete env.NOTIFY_SOCKET;
  delete env.FAKE_NVML_CONTROL;
  const all = { ...env, STATE_DIRECTORY: stateDir, ...o.env };
  const command = ['mps-control-daemon', ...args];
  return o.unshare === true
    ? new PluginProcess('unshare', ['-m', '--propagation', 'private', executable(), ...command], all)
    : new PluginProcess(executable(), command, all);
}

/**
 * The end of a node with its sharing agent: the agent stopped (SIGTERM: it leaves the host as it stops), then the
 * node, then `base` removed with whatever the agent mounted under it. Either may be missing (a start that failed).
 */
export async function stopWithAgent(
  node: DraNode | undefined,
  agent: PluginProcess | undefined,
  base: string,
): Promise<void> {
  agent?.signal('SIGTERM');
  await agent?.exited;
  await node?.stop();
  if (base === '') return;
  unmountUnder(base);
  rmSync(base, { recursive: true, force: true });
}

/**
 * A DRA node with dynamic MIG on (`dra.dynamicMig`, --mig-strategy=mixed) on a fake MIG topology of `gpus` GPUs,
 * its MPS root and proc root (the driver's mig-minors and an nvidia-caps major) under `base`; `path` goes first on
 * the plugin's PATH (the fake nvidia-cuda-mps-control). The fake NVML keeps the node's MIG state in
 * `<base>/mig-state`, shared by the plugin and the agents.
 */
export async function startDynamicMigNode(
  base: string,
  topology: string,
  gpus: number,
  path: string,
): Promise<DraNode> {
  const procRoot = join(base, 'proc');
  writeMigMinors(procRoot, gpus);
  writeFileSync(join(procRoot, 'devices'), 'Character devices:\n195 nvidia\n236 nvidia-caps\n');
  return startDraNode({
    topology,
    cdiNames: [...Array(gpus).keys()].map(String),
    config: 'version: v1\ndra:\n  dynamicMig: true\n',
    args: [`--mps-root=${join(base, 'mps')}`, '--mig-strategy=mixed'],
    // One GPU state for the plugin and every agent started from its launch: instances made by one are seen by the
    // others, and outlive a killed agent, as on a GPU.
    env: {
      PATH: `${path}:${process.env.PATH ?? ''}`,
      PROC_ROOT: procRoot,
      FAKE_NVML_MIG_STATE: join(base, 'mig-state'),
    },
  });
}
