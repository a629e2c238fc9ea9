// Certificates for tests, made by openssl in a folder: a CA, and certificates it signs — a serving one for
// 127.0.0.1, client ones with a subject of the test's choosing. Elliptic-curve keys, so each costs milliseconds.
import { execFileSync } from 'node:child_process';
import { readFileSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';

export interface Pem {
  readonly cert: string;
  readonly key: string;
}

const EC = ['-newkey', 'ec', '-pkeyopt', 'ec_paramgen_curve:prime256v1', '-nodes'];

function openssl(dir: string, args: readonly string[]): void {
  execFileSync('openssl', args, { cwd: dir, stdio: 'pipe' });
}

/** A self-signed CA named `name` (files <name>.crt, <name>.key in `dir`). */
export function makeCa(dir: string, name: string, days = 2): Pem {
  openssl(
    dir,
    ['req', '-x509', ...EC, '-keyout', `${name}.key`, '-out', `${name}.crt`, '-days', String(days)].concat([
      '-subj',
      `/CN=${name}`,
    ]),
  );
  return { cert: readFileSync(join(dir, `${name}.crt`), 'utf8'), key: readFileSync(join(dir, `${name}.key`), 'utf8') };
}

/** A certificate `name` signed by CA `ca` (made by makeCa in the same `dir`): for 127.0.0.1, or with `subject`. */
export function issue(dir: string, ca: string, name: string, o: { subject?: string; days?: number } = {}): Pem {
  const server = o.subject === undefined;
  openssl(dir, [
    'req',
    ...EC,
    '-keyout',
    `${name}.key`,
    '-out',
    `${name}.csr`,
    '-subj',
    o.subject ?? '/CN=kube-apiserver',
  ]);
  if (server) writeFileSync(join(dir, `${name}.ext`), 'subjectAltName=IP:127.0.0.1\n');
  openssl(dir, [
    'x509',
    '-req',
    '-in',
    `${name}.csr`,
    '-CA',
    `${ca}.crt`,
    '-CAkey',
    `${ca}.key`,
    '-CAcreateserial',
    '-out',
    `${name}.crt`,
    '-days',
    String(o.days ?? 2),
    ...(server ? ['-extfile', `${name}.ext`] : []),
  ]);
  return { cert: readFileSync(join(dir, `${name}.crt`), 'utf8'), key: readFileSync(join(dir, `${name}.key`), 'utf8') };
}
