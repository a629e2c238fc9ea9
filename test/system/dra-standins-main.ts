// The DRA stand-ins (test/support/apiserver.ts, test/support/plugin-watcher.ts) as programs of their
// own, for the real-systemd DRA test (test/system/systemd-dra.test.ts): bundled by esbuild into one
// script that the pinned node runs inside the Debian container, each stand-in as a transient unit of
// its own, so that the kubelet's plugin watcher can be restarted (a new process) while the API server
// keeps its objects. What each sees is written as JSON to a state file after every change, for the
// test to read; what the test asks of them (seed a ResourceClaim, with its allocation's device
// configuration when it has one; prepare or unprepare claims through the kubelet's DRA client) goes
// over a small HTTP control socket, through the `ctl` command.
//
//   node dra-standins.cjs apiserver <control socket> <state file> <node> <node token> <admin token>
//   node dra-standins.cjs watcher <registry dir> <control socket> <state file> <API server URL> <admin token> <node>
//   node dra-standins.cjs ctl <control socket> <path> <JSON body>     (prints the answer; exit 1 unless 200)
import { mkdirSync, renameSync, rmSync, writeFileSync } from 'node:fs';
import { createServer, request } from 'node:http';
import type { IncomingMessage, ServerResponse } from 'node:http';
import { dirname } from 'node:path';
import type { Claim } from '../../src/api/dra.ts';
import { ApiServerStandIn } from '../support/apiserver.ts';
import type { Json, JsonObject, TokenGrant } from '../support/apiserver.ts';
import { PluginWatcherStandIn } from '../support/plugin-watcher.ts';

/** What the RBAC of packaging/dra/rbac.yaml grants a node's identity (the verbs the stand-in knows). */
export const NODE_GRANT: Omit<TokenGrant, 'user'> = {
  allow: [
    'get resourceslices',
    'list resourceslices',
    'watch resourceslices',
    'create resourceslices',
    'update resourceslices',
    'delete resourceslices',
    'get resourceclaims',
    'get nodes',
    'list deviceclasses',
  ],
};

export interface ApiServerState {
  pid: number;
  url: string;
  /** The node's ResourceSlices as stored. */
  slices: JsonObject[];
  /** Every request answered: method, path, user and status code. */
  requests: { method: string; path: string; user: string | undefined; code: number }[];
}

export interface WatcherState {
  pid: number;
  /** Slices of the node deleted at this start, as a kubelet start does. */
  wipedAtStart: number;
  registrations: {
    name: string;
    endpoint: string;
    socket: string;
    version: string;
    type: string;
    supportedVersions: string[];
    wallMs: number;
  }[];
  rejected: { socket: string; reason: string }[];
  deregistrations: { name: string; socket: string; wallMs: number }[];
}

function writeState(file: string, state: unknown): void {
  writeFileSync(`${file}.tmp`, JSON.stringify(state));
  renameSync(`${file}.tmp`, file);
}

function readBody(req: IncomingMessage): Promise<string> {
  return new Promise((resolve, reject) => {
    const chunks: Buffer[] = [];
    req.on('data', (c: Buffer) => chunks.push(c));
    req.on('end', () => resolve(Buffer.concat(chunks).toString('utf8')));
    req.on('error', reject);
  });
}

/** Serves POST <path> with a JSON body on a unix socket; a handler's error is a 500 naming it. */
async function serveControl(
  socketPath: string,
  handlers: Record<string, (body: Json) => Promise<Json>>,
): Promise<void> {
  mkdirSync(dirname(socketPath), { recursive: true });
  rmSync(socketPath, { force: true });
  const server = createServer((req: IncomingMessage, res: ServerResponse) => {
    void (async () => {
      const h = handlers[req.url ?? ''];
      let code = 200;
      let out: Json;
      try {
        if (h === undefined)
          throw new Error(`no control path ${String(req.url)} (known: ${Object.keys(handlers).join(', ')})`);
        const text = await readBody(req);
        out = await h(text === '' ? null : (JSON.parse(text) as Json));
      } catch (err) {
        code = 500;
        out = { error: err instanceof Error ? err.message : String(err) };
      }
      res.writeHead(code, { 'content-type': 'application/json' });
      res.end(JSON.stringify(out));
    })();
  });
  await new Promise<void>((resolve, reject) => {
    server.once('error', reject);
    server.listen(socketPath, () => resolve());
  });
}

async function apiserver(
  control: string,
  stateFile: string,
  node: string,
  nodeToken: string,
  adminToken: string,
): Promise<void> {
  const api = await ApiServerStandIn.start({
    tokens: {
      [nodeToken]: { user: `gpu-device-plugin:node:${node}`, ...NODE_GRANT },
      [adminToken]: { user: 'kubelet-standin', allow: ['* *'] },
    },
  });
  api.putNode(node);
  const write = (): void => {
    const state: ApiServerState = {
      pid: process.pid,
      url: api.url,
      slices: [...api.slices.values()].filter((s) => (s.spec as JsonObject | undefined)?.nodeName === node),
      requests: api.requests.map((r) => ({ method: r.method, path: r.path, user: r.user, code: r.code })),
    };
    writeState(stateFile, state);
  };
  api.on('request', write);
  await serveControl(control, {
    // { namespace, name, results: [{ request, driver, pool, device }], config?: [{ source, requests?, opaque }] }
    // → the claim as stored (config: what the scheduler copies into status.allocation.devices.config).
    '/claims': async (body) => {
      const b = body as { namespace: string; name: string; results: Json[]; config?: Json[] };
      return api.putClaim({
        namespace: b.namespace,
        name: b.name,
        status: {
          allocation: { devices: { results: b.results, ...(b.config === undefined ? {} : { config: b.config }) } },
        },
      });
    },
  });
  write();
  process.stdout.write(`API server stand-in at ${api.url}\n`);
  process.on('SIGTERM', () => {
    void api.stop().then(() => process.exit(0));
  });
}

/** The kubelet's start: every ResourceSlice of its node deleted, over the API. */
async function wipeNodeSlices(apiUrl: string, token: string, node: string): Promise<number> {
  const url =
    `${apiUrl}/apis/resource.k8s.io/v1/resourceslices?fieldSelector=` +
    `${encodeURIComponent(`spec.nodeName=${node}`)}`;
  const res = await fetch(url, { method: 'DELETE', headers: { authorization: `Bearer ${token}` } });
  const body = (await res.json()) as { items?: unknown[] };
  if (!res.ok) throw new Error(`DELETE ${url}: ${res.status} ${JSON.stringify(body)}`);
  return body.items?.length ?? 0;
}

async function watcher(
  dir: string,
  control: string,
  stateFile: string,
  apiUrl: string,
  adminToken: string,
  node: string,
): Promise<void> {
  mkdirSync(dir, { recursive: true, mode: 0o750 });
  const wipedAtStart = await wipeNodeSlices(apiUrl, adminToken, node);
  const w = await PluginWatcherStandIn.start(dir, { health: true });
  const deregistrations: WatcherState['deregistrations'] = [];
  const wall = new Map<string, number>();
  const write = (): void => {
    const state: WatcherState = {
      pid: process.pid,
      wipedAtStart,
      registrations: w.registrations.map((r) => ({
        name: r.name,
        endpoint: r.endpoint,
        socket: r.socket,
        version: r.version,
        type: r.info.type,
        supportedVersions: r.info.supported_versions,
        wallMs: wall.get(`${r.socket}@${r.at}`) ?? 0,
      })),
      rejected: w.rejected.map((r) => ({ socket: r.socket, reason: r.reason })),
      deregistrations,
    };
    writeState(stateFile, state);
  };
  w.on('registered', (r: { socket: string; at: number; name: string; endpoint: string }) => {
    wall.set(`${r.socket}@${r.at}`, Date.now());
    process.stdout.write(`registered ${r.name} at ${r.endpoint}\n`);
    write();
  });
  w.on('rejected', (socket: string) => {
    // In the journal beside the plugin's lines: why a registration did not happen (yet).
    process.stdout.write(`rejected ${socket}: ${w.rejected.at(-1)?.reason ?? ''}\n`);
    write();
  });
  w.on('deregistered', (name: string) => {
    const d = w.deregistrations.at(-1);
    deregistrations.push({ name, socket: d?.socket ?? '', wallMs: Date.now() });
    write();
  });
  const claimsOf = (body: Json): { driver: string; claims: Claim[] } =>
    body as unknown as { driver: string; claims: Claim[] };
  await serveControl(control, {
    '/prepare': async (body) => {
      const b = claimsOf(body);
      return (await w.client(b.driver).prepare(b.claims)) as unknown as Json;
    },
    '/unprepare': async (body) => {
      const b = claimsOf(body);
      return (await w.client(b.driver).unprepare(b.claims)) as unknown as Json;
    },
  });
  write();
  process.stdout.write(`plugin watcher stand-in on ${dir} (wiped ${wipedAtStart} slices of ${node})\n`);
  process.on('SIGTERM', () => {
    void w.stop().then(() => process.exit(0));
  });
}

function ctl(socketPath: string, path: string, body: string): Promise<void> {
  return new Promise((resolve, reject) => {
    const req = request(
      { socketPath, path, method: 'POST', headers: { 'content-type': 'application/json' } },
      (res) => {
        void readBody(res).then((text) => {
          process.stdout.write(`${text}\n`);
          if (res.statusCode !== 200) process.exitCode = 1;
          resolve();
        }, reject);
      },
    );
    req.on('error', reject);
    req.end(body);
  });
}

const USAGE = [
  'usage: dra-standins.cjs apiserver <control socket> <state file> <node> <node token> <admin token>',
  '       dra-standins.cjs watcher <registry dir> <control socket> <state file> <API server URL> <admin token> <node>',
  '       dra-standins.cjs ctl <control socket> <path> <JSON body>',
].join('\n');

function run(argv: readonly string[]): Promise<void> {
  const [cmd, ...a] = argv;
  const need = (n: number): string[] => {
    if (a.length !== n || a.some((x) => x === '')) {
      process.stderr.write(`${USAGE}\n`);
      process.exit(2);
    }
    return a;
  };
  switch (cmd) {
    case 'apiserver': {
      const [control, state, node, nodeToken, adminToken] = need(5) as [string, string, string, string, string];
      return apiserver(control, state, node, nodeToken, adminToken);
    }
    case 'watcher': {
      const [dir, control, state, url, adminToken, node] = need(6) as [string, string, string, string, string, string];
      return watcher(dir, control, state, url, adminToken, node);
    }
    case 'ctl': {
      const [socket, path, body] = need(3) as [string, string, string];
      return ctl(socket, path, body);
    }
    default:
      process.stderr.write(`${USAGE}\n`);
      process.exit(2);
  }
}

run(process.argv.slice(2)).catch((err: unknown) => {
  process.stderr.write(`DRA stand-ins: ${err instanceof Error ? (err.stack ?? err.message) : String(err)}\n`);
  process.exit(1);
});
