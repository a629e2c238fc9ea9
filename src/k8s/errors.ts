// The two ways a request to the API server fails: the server answered no (KubeApiError, from its Status), or it
// could not be reached in time (KubeUnreachableError: worth retrying).

/** One cause of an Invalid (422) answer: which field, and what is wrong with it. */
export interface StatusCause {
  readonly reason?: string;
  readonly message?: string;
  readonly field?: string;
}

/** The API server answered with an error (a Kubernetes Status, or at least an HTTP code). */
export class KubeApiError extends Error {
  override name = 'KubeApiError';
  readonly code: number;
  /** NotFound, AlreadyExists, Conflict, Invalid, Forbidden, Unauthorized, … ('' when the answer was no Status). */
  readonly reason: string;
  readonly causes: readonly StatusCause[];
  readonly method: string;
  readonly path: string;
  /** The server's message, unadorned. */
  readonly serverMessage: string;

  constructor(
    method: string,
    path: string,
    code: number,
    reason: string,
    serverMessage: string,
    causes: readonly StatusCause[],
  ) {
    const causeText =
      causes.length === 0
        ? ''
        : `: ${causes.map((c) => `${c.field ?? '?'}: ${c.message ?? c.reason ?? ''}`).join('; ')}`;
    super(`${method} ${path}: ${code}${reason === '' ? '' : ` ${reason}`}: ${serverMessage}${causeText}`);
    this.code = code;
    this.reason = reason;
    this.causes = causes;
    this.method = method;
    this.path = path;
    this.serverMessage = serverMessage;
  }
}

/** The API server could not be reached, or did not answer in time: worth retrying later. */
export class KubeUnreachableError extends Error {
  override name = 'KubeUnreachableError';
  readonly method: string;
  readonly path: string;
  /** ECONNREFUSED, ETIMEDOUT (our timeout), ECONNRESET, ENOTFOUND, … or '' */
  readonly errno: string;

  constructor(method: string, path: string, server: string, errno: string, detail: string) {
    super(`${method} ${path}: cannot reach the API server ${server}: ${detail}`);
    this.method = method;
    this.path = path;
    this.errno = errno;
  }
}

function isObj(v: unknown): v is Record<string, unknown> {
  return typeof v === 'object' && v !== null && !Array.isArray(v);
}

/** The error of a non-2xx answer, from its body (a Status when the server wrote one). */
export function apiErrorOf(method: string, path: string, code: number, body: string): KubeApiError {
  let parsed: unknown;
  try {
    parsed = JSON.parse(body);
  } catch {
    parsed = undefined;
  }
  if (isObj(parsed) && parsed.kind === 'Status') {
    const details = isObj(parsed.details) ? parsed.details : {};
    const causes = Array.isArray(details.causes)
      ? details.causes.filter(isObj).map(
          (c): StatusCause => ({
            ...(typeof c.reason === 'string' ? { reason: c.reason } : {}),
            ...(typeof c.message === 'string' ? { message: c.message } : {}),
            ...(typeof c.field === 'string' ? { field: c.field } : {}),
          }),
        )
      : [];
    return new KubeApiError(
      method,
      path,
      typeof parsed.code === 'number' ? parsed.code : code,
      typeof parsed.reason === 'string' ? parsed.reason : '',
      typeof parsed.message === 'string' ? parsed.message : '(no message)',
      causes,
    );
  }
  const snippet = body.trim().slice(0, 200);
  return new KubeApiError(method, path, code, '', snippet === '' ? '(empty answer)' : snippet, []);
}
