// src/k8s: the kubeconfig loader, the JSON client and its errors, and the access check — against the
// API server stand-in (http and a unix socket), and over https with a CA, server and client
// certificates made by openssl in the test.
import { after, before, test } from 'node:test';
import assert from 'node:assert/strict';
import { execFileSync } from 'node:child_process';
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { createServer as createHttpServer } from 'node:http';
import type { Server } from 'node:http';
import { createServer as createHttpsServer } from 'node:https';
import type { TLSSocket } from 'node:tls';
import type { AddressInfo } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { KubeApiError, KubeClient, KubeUnreachableError } from '../../src/k8s/client.ts';
import { KubeconfigError, loadKubeconfig, parseKubeconfig } from '../../src/k8s/kubeconfig.ts';
import { checkAccess, createSlice, getNode, getResourceClaim, listNodeSlices } from '../../src/k8s/resources.ts';
import { ApiServerStandIn } from '../support/apiserver.ts';

let dir: string;
before(() => {
  dir = mkdtempSync(join(tmpdir(), 'gdp-k8s-'));
});
after(() => rmSync(dir, { recursive: true, force: true }));

const b64 = (s: string | Buffer): string => Buffer.from(s).toString('base64');

function kubeconfig(cluster: Record<string, unknown>, user: Record<string, unknown>): string {
  return JSON.stringify({
    apiVersion: 'v1',
    kind: 'Config',
    'current-context': 'node',
    clusters: [{ name: 'c', cluster }],
    users: [{ name: 'u', user }],
    contexts: [{ name: 'node', context: { cluster: 'c', user: 'u' } }],
  });
}

test(
  'kubeconfig: current context; CA, certificate and key as data ' +
    'or as files relative to the kubeconfig; token and tokenFile',
  async () => {
    writeFileSync(join(dir, 'ca.pem'), 'CA-PEM');
    writeFileSync(join(dir, 'token'), 'file-token\n');
    const file = join(dir, 'kubeconfig');
    writeFileSync(
      file,
      kubeconfig(
        { server: 'https://10.0.0.1:6443/', 'certificate-authority': 'ca.pem', 'tls-server-name': 'kubernetes' },
        { 'client-certificate-data': b64('CERT'), 'client-key-data': b64('KEY'), tokenFile: 'token' },
      ),
    );
    const t = await loadKubeconfig(file);
    assert.equal(t.server, 'https://10.0.0.1:6443');
    assert.equal(t.ca?.toString(), 'CA-PEM');
    assert.equal(t.cert?.toString(), 'CERT');
    assert.equal(t.key?.toString(), 'KEY');
    assert.equal(t.tokenFile, join(dir, 'token'));
    assert.equal(t.tlsServerName, 'kubernetes');
    assert.equal(t.source, `${file} (context node)`);
    // YAML, as kubectl writes it.
    const y = await parseKubeconfig(
      'current-context: a\ncontexts:\n- name: a\n  context: {cluster: x, user: ' +
        'y}\nclusters:\n- name: x\n  cluster: {server: "http://127.0.0.1:8080", ' +
        'insecure-skip-tls-verify: true}\nusers:\n- name: y\n  user: {token: abc}\n',
      '/etc/k.yaml',
    );
    assert.deepEqual(
      { server: y.server, token: y.token, insecure: y.insecureSkipTlsVerify },
      { server: 'http://127.0.0.1:8080', token: 'abc', insecure: true },
    );
  },
);

test('kubeconfig: what cannot be used is refused naming the file and what to do', async () => {
  const file = join(dir, 'bad');
  const cases: [string, RegExp][] = [
    [
      kubeconfig({ server: 'https://x' }, { exec: { command: 'aws' } }),
      /uses an exec credential plugin, which this service does not run; give it a node-scoped client certificate/,
    ],
    [
      kubeconfig({ server: 'https://x' }, { 'client-certificate-data': b64('C') }),
      /has a client certificate without its key/,
    ],
    [kubeconfig({ server: 'x y' }, {}), /is not a URL \(expected https:\/\/host:port\)/],
    [
      kubeconfig({ server: 'https://x', 'certificate-authority': 'missing.pem' }, {}),
      /cannot read the certificate authority .*missing\.pem/,
    ],
    [JSON.stringify({ contexts: [] }), /has no current-context/],
    ['[1, 2]', /is not a kubeconfig: expected a map/],
  ];
  for (const [text, why] of cases) {
    writeFileSync(file, text);
    await assert.rejects(
      loadKubeconfig(file),
      (err: unknown) => err instanceof KubeconfigError && why.test(err.message) && err.message.includes(file),
      `${text} → ${why}`,
    );
  }
  await assert.rejects(
    parseKubeconfig(kubeconfig({ server: 'https://x' }, {}), file, 'other'),
    /no context named "other" \(contexts: node\)/,
  );
  await assert.rejects(
    loadKubeconfig(join(dir, 'absent')),
    /cannot read the kubeconfig .*absent .*--kubeconfig names the file/,
  );
});

test(
  'http: Status errors carry code, reason, message and the causes ' +
    'with their fields; the unreachable server is a KubeUnreachableError',
  async () => {
    const api = await ApiServerStandIn.start();
    const c = new KubeClient({ server: api.url, source: 'test' });
    try {
      api.putNode('node-a');
      assert.equal((await getNode(c, 'node-a')).metadata.name, 'node-a');
      await assert.rejects(
        getNode(c, 'node-b'),
        (err: unknown) =>
          err instanceof KubeApiError &&
          err.code === 404 &&
          err.reason === 'NotFound' &&
          /GET \/api\/v1\/nodes\/node-b: 404 NotFound: nodes "node-b" not found/.test(err.message),
      );
      await assert.rejects(
        getResourceClaim(c, 'ns', 'claim'),
        (err: unknown) => err instanceof KubeApiError && err.code === 404,
      );
      await assert.rejects(
        createSlice(c, {
          metadata: { name: 's' },
          spec: {
            driver: 'gpu.nvidia.com',
            nodeName: 'node-a',
            pool: { name: 'node-a', generation: 1, resourceSliceCount: 0 },
            devices: [{ name: 'GPU_0' }],
          },
        }),
        (err: unknown) => {
          assert.ok(err instanceof KubeApiError);
          assert.equal(err.code, 422);
          assert.equal(err.reason, 'Invalid');
          assert.deepEqual(err.causes.map((x) => x.field).sort(), [
            'spec.devices[0].name',
            'spec.pool.resourceSliceCount',
          ]);
          assert.match(err.message, /spec\.devices\[0\]\.name: Invalid value: "GPU_0": a lowercase RFC 1123 label/);
          return true;
        },
      );
      await api.down();
      // A kept-alive connection is reset under the first request; the next finds no listener.
      await assert.rejects(
        listNodeSlices(c, 'node-a', 'gpu.nvidia.com'),
        (err: unknown) =>
          err instanceof KubeUnreachableError &&
          ['ECONNRESET', 'ECONNREFUSED'].includes(err.errno) &&
          err.message.includes(`cannot reach the API server ${api.url}`),
      );
      await assert.rejects(
        listNodeSlices(c, 'node-a', 'gpu.nvidia.com'),
        (err: unknown) => err instanceof KubeUnreachableError && err.errno === 'ECONNREFUSED',
      );
      await api.up();
      assert.deepEqual(await listNodeSlices(c, 'node-a', 'gpu.nvidia.com'), []);
    } finally {
      c.close();
      await api.stop();
    }
  },
);

test('a server that does not answer: the request ends at its timeout as ETIMEDOUT', async () => {
  const hang: Server = createHttpServer(() => {
    /* never answers */
  });
  await new Promise<void>((r) => hang.listen(0, '127.0.0.1', r));
  const c = new KubeClient({ server: `http://127.0.0.1:${(hang.address() as AddressInfo).port}`, source: 'test' });
  try {
    await assert.rejects(
      c.request('GET', '/api/v1/nodes/x', { timeoutMs: 50 }),
      (err: unknown) =>
        err instanceof KubeUnreachableError && err.errno === 'ETIMEDOUT' && /no answer within 50 ms/.test(err.message),
    );
    // The start's access check takes its own (short) timeout: a silent server must not hold the start up.
    await assert.rejects(
      checkAccess(c, undefined, 60),
      (err: unknown) => err instanceof KubeUnreachableError && /no answer within 60 ms/.test(err.message),
    );
  } finally {
    c.close();
    hang.closeAllConnections();
    await new Promise<void>((r) => hang.close(() => r()));
  }
});

test(
  'unix socket, bearer tokens (a token file re-read per request), ' +
    '403 Forbidden, and the access check naming what is denied',
  async () => {
    const api = await ApiServerStandIn.start({
      socketPath: join(dir, 'api.sock'),
      tokens: {
        full: { user: 'system:node:node-a', allow: ['* resourceslices', 'get resourceclaims', 'get nodes'] },
        readonly: { user: 'viewer', allow: ['list resourceslices', 'get nodes'] },
      },
    });
    const tokenFile = join(dir, 'token-rotating');
    writeFileSync(tokenFile, 'readonly\n');
    const c = new KubeClient({
      server: api.url,
      socketPath: join(dir, 'api.sock'),
      tokenFile,
      source: 'kc (context node)',
    });
    try {
      api.putNode('node-a');
      await getNode(c, 'node-a');
      await assert.rejects(
        createSlice(c, {
          metadata: { name: 's' },
          spec: {
            driver: 'gpu.nvidia.com',
            nodeName: 'node-a',
            pool: { name: 'node-a', generation: 1, resourceSliceCount: 1 },
            devices: [],
          },
        }),
        (err: unknown) =>
          err instanceof KubeApiError &&
          err.code === 403 &&
          err.reason === 'Forbidden' &&
          /User "viewer" cannot create resource "resourceslices"/.test(err.message),
      );
      assert.deepEqual(await checkAccess(c), {
        ok: false,
        denied: [
          'create resourceslices.resource.k8s.io',
          'update resourceslices.resource.k8s.io',
          'delete resourceslices.resource.k8s.io',
          'get resourceclaims.resource.k8s.io',
        ],
      });
      // The token rotates: the next request uses the new one.
      writeFileSync(tokenFile, 'full\n');
      assert.deepEqual(await checkAccess(c), { ok: true });
      assert.equal(api.requests.at(-1)?.user, 'system:node:node-a');
      writeFileSync(tokenFile, 'nobody\n');
      await assert.rejects(
        getNode(c, 'node-a'),
        (err: unknown) => err instanceof KubeApiError && err.code === 401 && err.reason === 'Unauthorized',
      );
    } finally {
      c.close();
      await api.stop();
    }
  },
);

/** A CA, a server certificate for 127.0.0.1 and a client certificate, made by openssl. */
function makeCerts(): Record<'ca' | 'serverCert' | 'serverKey' | 'clientCert' | 'clientKey' | 'otherCa', string> {
  const ossl = (...args: string[]): void => void execFileSync('openssl', args, { cwd: dir, stdio: 'pipe' });
  ossl(
    'req',
    '-x509',
    '-newkey',
    'ec',
    '-pkeyopt',
    'ec_paramgen_curve:prime256v1',
    '-nodes',
    '-keyout',
    'ca.key',
    '-out',
    'ca.crt',
    '-days',
    '1',
    '-subj',
    '/CN=test-ca',
  );
  ossl(
    'req',
    '-x509',
    '-newkey',
    'ec',
    '-pkeyopt',
    'ec_paramgen_curve:prime256v1',
    '-nodes',
    '-keyout',
    'other.key',
    '-out',
    'other.crt',
    '-days',
    '1',
    '-subj',
    '/CN=other-ca',
  );
  ossl(
    'req',
    '-newkey',
    'ec',
    '-pkeyopt',
    'ec_paramgen_curve:prime256v1',
    '-nodes',
    '-keyout',
    'server.key',
    '-out',
    'server.csr',
    '-subj',
    '/CN=kube-apiserver',
  );
  writeFileSync(join(dir, 'server.ext'), 'subjectAltName=IP:127.0.0.1,DNS:kubernetes\n');
  ossl(
    'x509',
    '-req',
    '-in',
    'server.csr',
    '-CA',
    'ca.crt',
    '-CAkey',
    'ca.key',
    '-CAcreateserial',
    '-out',
    'server.crt',
    '-days',
    '1',
    '-extfile',
    'server.ext',
  );
  ossl(
    'req',
    '-newkey',
    'ec',
    '-pkeyopt',
    'ec_paramgen_curve:prime256v1',
    '-nodes',
    '-keyout',
    'client.key',
    '-out',
    'client.csr',
    '-subj',
    '/O=system:nodes/CN=system:node:node-a',
  );
  ossl(
    'x509',
    '-req',
    '-in',
    'client.csr',
    '-CA',
    'ca.crt',
    '-CAkey',
    'ca.key',
    '-CAcreateserial',
    '-out',
    'client.crt',
    '-days',
    '1',
  );
  const r = (f: string): string => readFileSync(join(dir, f), 'utf8');
  return {
    ca: r('ca.crt'),
    serverCert: r('server.crt'),
    serverKey: r('server.key'),
    clientCert: r('client.crt'),
    clientKey: r('client.key'),
    otherCa: r('other.crt'),
  };
}

test(
  "https: the kubeconfig's CA checks the server, its client " + 'certificate authenticates us; a wrong CA is refused',
  async () => {
    const certs = makeCerts();
    const server = createHttpsServer(
      { cert: certs.serverCert, key: certs.serverKey, ca: certs.ca, requestCert: true, rejectUnauthorized: true },
      (req, res) => {
        const peer = (req.socket as TLSSocket).getPeerCertificate();
        res.writeHead(200, { 'content-type': 'application/json' });
        res.end(JSON.stringify({ metadata: { name: 'node-a', uid: String(peer.subject?.CN) } }));
      },
    );
    await new Promise<void>((r) => server.listen(0, '127.0.0.1', r));
    const port = (server.address() as AddressInfo).port;
    const file = join(dir, 'kubeconfig-tls');
    writeFileSync(
      file,
      kubeconfig(
        { server: `https://127.0.0.1:${port}`, 'certificate-authority-data': b64(certs.ca) },
        { 'client-certificate-data': b64(certs.clientCert), 'client-key-data': b64(certs.clientKey) },
      ),
    );
    const good = new KubeClient(await loadKubeconfig(file));
    writeFileSync(
      file,
      kubeconfig(
        { server: `https://127.0.0.1:${port}`, 'certificate-authority-data': b64(certs.otherCa) },
        { 'client-certificate-data': b64(certs.clientCert), 'client-key-data': b64(certs.clientKey) },
      ),
    );
    const wrongCa = new KubeClient(await loadKubeconfig(file));
    try {
      assert.equal((await getNode(good, 'node-a')).metadata.uid, 'system:node:node-a');
      await assert.rejects(
        getNode(wrongCa, 'node-a'),
        (err: unknown) => err instanceof KubeUnreachableError && /certificate/i.test(err.message),
      );
    } finally {
      good.close();
      wrongCa.close();
      server.closeAllConnections();
      await new Promise<void>((r) => server.close(() => r()));
    }
  },
);
