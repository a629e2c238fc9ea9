/** A request from the kubelet that cannot be honoured. Adapters turn it into INVALID_ARGUMENT. */
export class RequestError extends Error {
  override name = 'RequestError';
}
