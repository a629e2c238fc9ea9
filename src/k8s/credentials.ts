// The TLS credentials a kubeconfig names as files (CA, client certificate and key), kept current as client-go
// keeps them: a file that changed (another inode, size or modification time) is read again, so a rotated
// certificate is used without a restart; and the client certificate's expiry, for the log and `check`.
import { X509Certificate } from 'node:crypto';
import { readFile, stat } from 'node:fs/promises';
import type { CredentialFiles } from './kubeconfig.ts';

/** What the files hold now. */
export interface CredentialPems {
  readonly ca?: Buffer;
  readonly cert?: Buffer;
  readonly key?: Buffer;
}

/** One line that changes whenever any of the files does (inode, size, modification time); '' for none. */
export async function credentialStamp(files: CredentialFiles | undefined): Promise<string> {
  if (files === undefined) return '';
  const parts: string[] = [];
  for (const path of [files.ca, files.cert, files.key]) {
    if (path === undefined) continue;
    const s = await stat(path).catch(() => null);
    parts.push(s === null ? `${path}:gone` : `${path}:${s.ino}:${s.size}:${s.mtimeMs}`);
  }
  return parts.join(' ');
}

/** Reads the files again; throws naming the file that cannot be read. */
export async function readCredentialFiles(files: CredentialFiles): Promise<CredentialPems> {
  const read = async (what: string, path: string | undefined): Promise<Buffer | undefined> => {
    if (path === undefined) return undefined;
    try {
      return await readFile(path);
    } catch (err) {
      throw new Error(`cannot read the ${what} ${path} (${(err as Error).message})`);
    }
  };
  const [ca, cert, key] = await Promise.all([
    read('certificate authority', files.ca),
    read('client certificate', files.cert),
    read('client key', files.key),
  ]);
  return { ...(ca ? { ca } : {}), ...(cert ? { cert } : {}), ...(key ? { key } : {}) };
}

/** The client certificate's last valid moment (its first certificate: the leaf), or null when it is no PEM. */
export function certificateNotAfter(pem: Buffer): Date | null {
  try {
    return new Date(new X509Certificate(pem).validTo);
  } catch {
    return null;
  }
}

/** A client certificate's expiry judged: expired, expiring within the warning window, or fine. */
export interface CertificateExpiry {
  readonly state: 'expired' | 'soon' | 'valid';
  readonly notAfter: Date;
  /** Whole days left (negative once expired). */
  readonly daysLeft: number;
}

/** How long before its end a client certificate is called out: 30 days, as kubeadm's `certs check-expiration`. */
export const EXPIRY_WARNING_DAYS = 30;
const DAY_MS = 86_400_000;

export function judgeExpiry(notAfter: Date, now: Date): CertificateExpiry {
  const left = notAfter.getTime() - now.getTime();
  const daysLeft = Math.floor(left / DAY_MS);
  const state = left <= 0 ? 'expired' : left < EXPIRY_WARNING_DAYS * DAY_MS ? 'soon' : 'valid';
  return { state, notAfter, daysLeft };
}

/** The sentence for an expired or soon-expiring certificate (null for a valid one). */
export function expiryText(e: CertificateExpiry, file: string): string | null {
  const date = e.notAfter.toISOString();
  const renew = 'renew it (the file is re-read)';
  if (e.state === 'expired')
    return `the client certificate ${file} expired on ${date}: the API server refuses it; ${renew}`;
  if (e.state === 'soon') return `the client certificate ${file} expires on ${date}, in ${e.daysLeft} day(s); ${renew}`;
  return null;
}
