// src/k8s's client against servers that behave as a real API server or its load balancer does: a kept-alive
// connection closed under the next request, 429 and 503 with Retry-After, a 401 for a certificate that was
// rotated on disk; and the client certificate's expiry judged for the log and `check`.
import { after, before, test } from 'node:test';
import assert from 'node:assert/strict';
import { execFileSync } from 'node:child_process';
import { EventEmitter } from 'node:events';
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { createServer as createHttpServer } from 'node:http';
import type { IncomingMessage, Server, ServerResponse } from 'node:http';
import { createServer as createHttpsServer } from 'node:https';
import type { AddressInfo, Socket } from 'node:net';
import type { TLSSocket } from 'node:tls';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { KubeApiError, KubeClient, KubeUnreachableError } from '../../src/k8s/client.ts';
import { certificateNotAfter, expiryText, judgeExpiry } from '../../src/k8s/credentials.ts';
import { loadKubeconfig, resolveKubeconfig } from '../../src/k8s/kubeconfig.ts';
import type { KubeconfigRef } from '../../src/k8s/kubeconfig.ts';
import { clientCertificateLine } from '../../src/cli/check-kubeconfig.ts';
import { retryAfterMs } from '../../src/k8s/retry.ts';
import { onEvent, waitFor } from '../support/wait.ts';

let dir: string;
before(() => {
  dir = mkdtempSync(join(tmpdir(), 'gdp-k8s-retry-'));
});
after(() => rmSync(dir, { recursive: true, force: true }));

type Handler = (req: IncomingMessage, res: ServerResponse, nth: number) => void;

/** An http server whose handler sees each request's number on its connection (1 for a new connection). */
async function serve(handler: Handler): Promise<{ server: Server; url: string; seen: string[] }> {
  const seen: string[] = [];
  const perSocket = new WeakMap<Socket, number>();
  const server = createHttpServer((req, res) => {
    const nth = (perSocket.get(req.socket) ?? 0) + 1;
    perSocket.set(req.socket, nth);
    seen.push(`${req.method} ${nth}`);
    handler(req, res, nth);
  });
  await new Promise<void>((r) => server.listen(0, '127.0.0.1', r));
  return { server, url: `http://127.0.0.1:${(server.address() as AddressInfo).port}`, seen };
}

const ok = (res: ServerResponse): void => {
  res.writeHead(200, { 'content-type': 'application/json' }).end('{"kind":"Node"}');
};

const status = (res: ServerResponse, code: number, headers: Record<string, string> = {}): void => {
  const body = { kind: 'Status', apiVersion: 'v1', status: 'Failure', code, reason: 'TooManyRequests', message: 'x' };
  res.writeHead(code, { 'content-type': 'application/json', ...headers }).end(JSON.stringify(body));
};

test('a kept-alive connection the server closed under a GET is retried once on a new one; a POST is not', async (t) => {
  // The second request on any connection finds it closed, as a load balancer's idle timeout leaves it.
  const { server, url, seen } = await serve((req, res, nth) => (nth === 2 ? req.socket.destroy() : ok(res)));
  t.after(() => server.close());
  const client = new KubeClient({ server: url, source: 'test' });
  t.after(() => client.close());
  await client.request('GET', '/api/v1/nodes/a');
  assert.deepEqual(await client.request('GET', '/api/v1/nodes/a'), { kind: 'Node' });
  assert.deepEqual(seen, ['GET 1', 'GET 2', 'GET 1'], 'the GET sent again on a new connection');
  await client.request('GET', '/api/v1/nodes/a');
  await assert.rejects(client.request('POST', '/api/v1/nodes', { body: {} }), KubeUnreachableError);
  assert.deepEqual(seen.slice(3), ['GET 2', 'GET 1', 'POST 2'], 'a POST is never sent twice');
});

test('429 and 503 with Retry-After are sent again after the wait, a bounded number of times', async (t) => {
  let refusals = 2;
  const { server, url, seen } = await serve((_req, res) =>
    refusals-- > 0 ? status(res, refusals === 1 ? 429 : 503, { 'retry-after': '0' }) : ok(res),
  );
  t.after(() => server.close());
  const client = new KubeClient({ server: url, source: 'test' });
  t.after(() => client.close());
  assert.deepEqual(await client.request('GET', '/api/v1/nodes/a'), { kind: 'Node' });
  assert.equal(seen.length, 3);
  refusals = 100;
  await assert.rejects(client.request('PUT', '/x', { body: {} }), (e: unknown) => e instanceof KubeApiError);
  assert.equal(seen.length, 3 + 4, 'the first try and three more');
});

test('a Retry-After past the cap, or none, is the caller’s to back off; close() ends a wait', async (t) => {
  let header = '3600';
  const { server, url, seen } = await serve((_req, res) =>
    status(res, 429, header === '' ? {} : { 'retry-after': header }),
  );
  t.after(() => server.close());
  const waits = new EventEmitter();
  const client = new KubeClient({ server: url, source: 'test' }, { onRetryAfter: (w) => waits.emit('wait', w) });
  await assert.rejects(client.request('GET', '/a'), (e: unknown) => e instanceof KubeApiError && e.code === 429);
  header = '';
  await assert.rejects(client.request('GET', '/a'), (e: unknown) => e instanceof KubeApiError && e.code === 429);
  assert.equal(seen.length, 2);
  header = '25';
  const waited = waitFor(() => (seen.length === 3 ? true : undefined), {
    on: [onEvent(waits, 'wait')],
    what: 'the request waiting out its Retry-After',
  });
  const waiting = client.request('GET', '/a');
  await waited;
  client.close();
  await assert.rejects(waiting, (e: unknown) => e instanceof KubeUnreachableError && e.errno === 'ECANCELED');
  assert.equal(retryAfterMs(500, '1'), 1000);
  assert.equal(retryAfterMs(404, '1'), null);
  assert.equal(retryAfterMs(429, 'Wed, 21 Oct 2015 07:28:00 GMT'), null, 'only whole seconds, as client-go');
});

/** A CA, a server certificate for 127.0.0.1 and two client certificates (CN a and b), made by openssl. */
function makeCerts(): void {
  const ossl = (args: string): void => void execFileSync('openssl', args.split(' '), { cwd: dir, stdio: 'pipe' });
  const ec = '-newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes';
  ossl(`req -x509 ${ec} -keyout ca.key -out ca.crt -days 2 -subj /CN=test-ca`);
  writeFileSync(join(dir, 'server.ext'), 'subjectAltName=IP:127.0.0.1\n');
  for (const [name, subj, days] of [
    ['server', '/CN=kube-apiserver', 2],
    ['a', '/O=system:nodes/CN=a', 2],
    ['b', '/O=system:nodes/CN=b', 20],
    ['c', '/O=system:nodes/CN=c', 400],
  ] as const) {
    ossl(`req ${ec} -keyout ${name}.key -out ${name}.csr -subj ${subj}`);
    const ext = name === 'server' ? ' -extfile server.ext' : '';
    ossl(`x509 -req -in ${name}.csr -CA ca.crt -CAkey ca.key -CAcreateserial -out ${name}.crt -days ${days}${ext}`);
  }
}

test('client certificate files rotated on disk are read again; a 401 re-reads them once', async (t) => {
  makeCerts();
  const r = (f: string): string => readFileSync(join(dir, f), 'utf8');
  // The server takes only the certificate of "b": "a" is the one being rotated away.
  const names: string[] = [];
  const server = createHttpsServer(
    { cert: r('server.crt'), key: r('server.key'), ca: r('ca.crt'), requestCert: true, rejectUnauthorized: true },
    (req, res) => {
      const cn = String((req.socket as TLSSocket).getPeerCertificate().subject?.CN ?? '');
      names.push(cn);
      if (cn === 'b') ok(res);
      else status(res, 401);
    },
  );
  await new Promise<void>((res) => server.listen(0, '127.0.0.1', res));
  t.after(() => server.close());
  writeFileSync(join(dir, 'client.crt'), r('a.crt'));
  writeFileSync(join(dir, 'client.key'), r('a.key'));
  const port = (server.address() as AddressInfo).port;
  writeFileSync(
    join(dir, 'kubeconfig'),
    JSON.stringify({
      'current-context': 'n',
      clusters: [{ name: 'c', cluster: { server: `https://127.0.0.1:${port}`, 'certificate-authority': 'ca.crt' } }],
      users: [{ name: 'u', user: { 'client-certificate': 'client.crt', 'client-key': 'client.key' } }],
      contexts: [{ name: 'n', context: { cluster: 'c', user: 'u' } }],
    }),
  );
  const reported: string[] = [];
  const client = new KubeClient(await loadKubeconfig(join(dir, 'kubeconfig')), {
    onClientCertificate: (c) => reported.push(`${c.file} ${c.notAfter === null ? 'none' : 'dated'}`),
  });
  t.after(() => client.close());
  await assert.rejects(client.request('GET', '/a'), (e: unknown) => e instanceof KubeApiError && e.code === 401);
  assert.deepEqual(names, ['a', 'a'], 'the 401 re-read the files and tried once more');
  writeFileSync(join(dir, 'client.key'), r('b.key'));
  writeFileSync(join(dir, 'client.crt'), r('b.crt'));
  assert.deepEqual(await client.request('GET', '/a'), { kind: 'Node' });
  assert.equal(names.at(-1), 'b', 'the rotated certificate used without a restart');
  assert.ok(reported.length >= 2 && reported.every((l) => l === `${join(dir, 'client.crt')} dated`), String(reported));
});

test("a client certificate's expiry: expired and within 30 days called out with the file and the date", () => {
  const notAfter = new Date('2026-12-10T00:00:00Z');
  assert.equal(judgeExpiry(notAfter, new Date('2026-01-01T00:00:00Z')).state, 'valid');
  const soon = judgeExpiry(notAfter, new Date('2026-11-28T00:00:00Z'));
  assert.deepEqual([soon.state, soon.daysLeft], ['soon', 12]);
  assert.equal(
    expiryText(soon, '/etc/k/client.crt'),
    'the client certificate /etc/k/client.crt expires on 2026-12-10T00:00:00.000Z, in 12 day(s); ' +
      'renew it (the file is re-read)',
  );
  const gone = judgeExpiry(notAfter, new Date('2026-12-11T00:00:00Z'));
  assert.match(expiryText(gone, 'f') ?? '', /^the client certificate f expired on 2026-12-10T00:00:00.000Z/);
  assert.equal(expiryText(judgeExpiry(notAfter, new Date(0)), 'f'), null);
  assert.equal(certificateNotAfter(Buffer.from('not a certificate')), null);
});

test("check's client certificate line: PASS with its date, WARN within 30 days, FAIL once expired", async () => {
  const ref = (file: string): KubeconfigRef =>
    resolveKubeconfig(
      JSON.stringify({
        'current-context': 'n',
        clusters: [{ name: 'c', cluster: { server: 'https://127.0.0.1:6443' } }],
        users: [{ name: 'u', user: { 'client-certificate': file, 'client-key': 'c.key' } }],
        contexts: [{ name: 'n', context: { cluster: 'c', user: 'u' } }],
      }),
      join(dir, 'kubeconfig'),
    );
  const pass = await clientCertificateLine(ref('c.crt'), 'k');
  assert.equal(pass?.status, 'PASS');
  assert.match(
    pass?.detail ?? '',
    new RegExp(`^${join(dir, 'c.crt')} valid until \\d{4}-\\d\\d-\\d\\dT.* \\(3\\d\\d days\\)$`),
  );
  const warn = await clientCertificateLine(ref('b.crt'), 'k');
  assert.deepEqual([warn?.status, /expires on .*, in 1\d day\(s\)/.test(warn?.detail ?? '')], ['WARN', true]);
  const fail = await clientCertificateLine(ref('c.crt'), 'k', new Date(Date.now() + 500 * 86_400_000));
  assert.equal(fail?.status, 'FAIL');
  assert.match(fail?.detail ?? '', /expired on/);
  assert.equal((await clientCertificateLine(ref('ca.key'), 'k'))?.status, 'FAIL', 'a key is no certificate');
});
