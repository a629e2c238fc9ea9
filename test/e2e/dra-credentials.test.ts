// DRA mode against an API server that rotates its certificates, through the built executable: the plugin talks
// https to the stand-in with a client certificate, as a node does. The serving certificate and its CA are
// replaced (the kubeconfig's CA file rewritten in place), then the client CA with the node's certificate and key:
// each time the stand-in restarts on the same port, a slice of the node is deleted by another client, and the
// plugin — never restarted — must restore it over the new credentials.
import assert from 'node:assert/strict';
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { after, before, describe, test } from 'node:test';
import { makeCa, issue } from '../support/certs.ts';
import type { Pem } from '../support/certs.ts';
import { NODE, RBAC, slicesOf, startDraNode, waitForSlices } from '../support/dra-node.ts';
import type { DraNode } from '../support/dra-node.ts';
import { onEvent, waitFor, waitUntil } from '../support/wait.ts';

const NODE_USER = `system:node:${NODE}`;
let dir = '';
let node: DraNode;
let pid = 0;
/** The CA the stand-in takes client certificates from (the first one also signed its serving certificate). */
let clientCa: Pem;
/** The name (in certs.ts's folder) of the CA in the kubeconfig's CA file, which signs the serving certificate. */
let servingCa = 'ca1';

function kubeconfig(url: string): string {
  return JSON.stringify({
    'current-context': 'node',
    clusters: [{ name: 'c', cluster: { server: url, 'certificate-authority': join(dir, 'ca.pem') } }],
    users: [
      { name: 'u', user: { 'client-certificate': join(dir, 'node.pem'), 'client-key': join(dir, 'node-key.pem') } },
    ],
    contexts: [{ name: 'node', context: { cluster: 'c', user: 'u' } }],
  });
}

/** The node's credentials on disk, where the kubeconfig points: the key first, as a rotation tool writes them. */
function writeClient(p: Pem): void {
  writeFileSync(join(dir, 'node-key.pem'), p.key, { mode: 0o600 });
  writeFileSync(join(dir, 'node.pem'), p.cert);
}

/** Another client deletes the node's slice; resolves once the plugin has put it back. */
async function deletedAndRestored(what: string): Promise<void> {
  const name = String((slicesOf(node.api)[0]?.metadata as { name?: string } | undefined)?.name);
  node.api.removeSlice(name);
  assert.equal(slicesOf(node.api).length, 0);
  await waitForSlices(node.api, (d) => d.length === 8, `restored ${what}`, 20_000);
}

/** The plugin's watch of its slices is open again (after the stand-in's restart cut it). */
function watching(what: string, deadlineMs = 20_000): Promise<void> {
  return waitUntil(() => node.api.watches.openCount > 0, {
    on: onEvent(node.api, 'watch', 'request'),
    deadlineMs,
    what: () => `the plugin watching its slices ${what}; log:\n${node.sim.plugin.lines.slice(-20).join('\n')}`,
  });
}

before(async () => {
  dir = mkdtempSync(join(tmpdir(), 'gdp-dra-creds-'));
  clientCa = makeCa(dir, 'ca1');
  const serving = issue(dir, 'ca1', 'server1');
  writeFileSync(join(dir, 'ca.pem'), clientCa.cert);
  writeClient(issue(dir, 'ca1', 'node1', { subject: `/O=system:nodes/CN=${NODE_USER}` }));
  node = await startDraNode({
    api: { tls: { ...serving, clientCa: clientCa.cert }, clientCertificates: { [NODE_USER]: RBAC } },
    kubeconfig,
  });
  await waitForSlices(node.api, (d) => d.length === 8, 'at start over https');
  pid = node.sim.plugin.pid;
});

after(async () => {
  await node?.stop();
  rmSync(dir, { recursive: true, force: true });
});

describe('DRA mode when the API server rotates its certificates', { concurrency: false }, () => {
  test('a new serving certificate from a new CA: the CA file rewritten, the plugin carries on', async () => {
    await watching('at start');
    const ca2 = makeCa(dir, 'ca2');
    node.api.useTls({ ...issue(dir, 'ca2', 'server2'), clientCa: clientCa.cert });
    writeFileSync(join(dir, 'ca.pem'), ca2.cert);
    servingCa = 'ca2';
    await node.api.restart();
    await watching('after the serving certificate changed');
    await deletedAndRestored('over the new serving certificate');
    assert.equal(node.sim.plugin.pid, pid, 'the same process');
  });

  test("a new client CA: the node's certificate and key rewritten, the old one refused; it carries on", async () => {
    const ca3 = makeCa(dir, 'ca3');
    node.api.useTls({ ...issue(dir, servingCa, 'server3'), clientCa: ca3.cert });
    writeClient(issue(dir, 'ca3', 'node2', { subject: `/O=system:nodes/CN=${NODE_USER}` }));
    await node.api.restart();
    await watching('after the client certificate changed');
    await deletedAndRestored('with the new client certificate');
    assert.equal(node.sim.plugin.pid, pid, 'the same process');
  });

  test("the client CA rotated before the node's certificate: refused (401) until the new one is written", async () => {
    const ca4 = makeCa(dir, 'ca4');
    node.api.useTls({ ...issue(dir, servingCa, 'server4'), clientCa: ca4.cert });
    const seen = node.api.requests.length;
    const mark = node.sim.plugin.lines.length;
    await node.api.restart();
    // The plugin's requests with the certificate it has are refused: it read its files again and still has no
    // certificate the server takes.
    await waitUntil(() => node.api.requests.slice(seen).some((r) => r.code === 401), {
      on: onEvent(node.api, 'request'),
      deadlineMs: 20_000,
      what: () => `a request refused with 401; codes: ${node.api.requests.slice(seen).map((r) => r.code)}`,
    });
    // The operator is told it is the credentials the server does not take (401), not a missing RBAC grant (403).
    const logged = node.sim.plugin.lines.length;
    const refused = await waitFor(() => node.sim.plugin.lines.slice(mark).find((l) => /ERROR DRA: .*401/.test(l)), {
      on: onEvent(node.sim.plugin, 'line'),
      deadlineMs: 20_000,
      what: () => `an ERROR for the 401; log:\n${node.sim.plugin.lines.slice(mark).join('\n')}`,
    });
    assert.match(refused, /does not accept our credentials .*credential files are renewed/);
    assert.doesNotMatch(refused, /RBAC/);
    writeClient(issue(dir, 'ca4', 'node3', { subject: `/O=system:nodes/CN=${NODE_USER}` }));
    // The watch retries a refused list with backoff (doubling, capped at 30 s): the next try uses the new files.
    await watching('once the new client certificate was written', 45_000);
    await deletedAndRestored('once the new client certificate was written');
    assert.equal(node.sim.plugin.pid, pid, 'the same process');
    assert.ok(
      node.sim.plugin.lines
        .slice(logged)
        .some((l) => /INFO DRA: the API server (answers again|accepts our credentials again)/.test(l)),
      `an INFO once the server takes the new certificate; log:\n${node.sim.plugin.lines.slice(logged).join('\n')}`,
    );
  });
});
