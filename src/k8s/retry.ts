// When a request to the API server is sent again, as client-go does: a GET whose connection was closed before
// any answer (the server dropped a kept-alive connection), and a 429 or 5xx that names its wait in Retry-After.

/** How many times one request waits out a Retry-After (429, or 5xx with the header), and the longest wait. */
export const RETRY_AFTER_MAX = 3;
export const RETRY_AFTER_CAP_MS = 30_000;

/** A connection closed under a request before any answer: the errno a reused keep-alive socket gives. */
export const isConnectionReset = (errno: string): boolean => errno === 'ECONNRESET' || errno === 'EPIPE';

/**
 * The wait a 429 or 5xx answer asks for in `Retry-After` (whole seconds, as client-go reads it), or null when
 * it asks for none, or for longer than the cap (the caller's own backoff then takes over).
 */
export function retryAfterMs(code: number, header: string | undefined): number | null {
  if (code !== 429 && (code < 500 || code > 599)) return null;
  if (header === undefined || !/^\d+$/.test(header.trim())) return null;
  const ms = Number(header.trim()) * 1000;
  return ms <= RETRY_AFTER_CAP_MS ? ms : null;
}
