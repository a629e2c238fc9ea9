// The kubelet's plugin registration, DRA's side: the Registration service served on
// <registryDir>/<driver>-reg.sock. The kubelet's plugin watcher finds the socket, calls GetInfo (type
// DRAPlugin, our dra.sock, the services we speak) and then NotifyRegistrationStatus with its verdict.
// Listeners hear every registration the kubelet confirms (the slice publisher republishes then: the
// kubelet deletes slices at its start) and every loss (a refusal, or our socket gone: sockets.ts).
import type * as grpc from '@grpc/grpc-js';
import { DRA_HEALTH_SERVICE_NAMES, DRA_PLUGIN_TYPE, DRA_SERVICE_NAMES, pluginRegistrationService } from '../api/dra.ts';
import type { PluginInfo, RegistrationStatus } from '../api/dra.ts';
import type { ServiceBinding } from '../kubelet/socket-server.ts';
import type { Logger } from '../system/log.ts';

/**
 * The services announced in GetInfo: the DRAPlugin versions in the order the kubelet picks from (the first
 * it speaks), then both health services (a 1.37 kubelet takes v1 when listed, v1alpha1 otherwise; an older
 * one opens v1alpha1 and passes over the names it does not know).
 */
export const SUPPORTED_VERSIONS: readonly string[] = [
  DRA_SERVICE_NAMES.v1,
  DRA_SERVICE_NAMES.v1beta1,
  DRA_HEALTH_SERVICE_NAMES.v1,
  DRA_HEALTH_SERVICE_NAMES.v1alpha1,
];

export type RegistrationListener = (reason: string) => void;

export interface DraRegistrationOptions {
  readonly driver: string;
  /** dra.sock: the endpoint GetInfo names. */
  readonly endpoint: string;
  readonly log: Logger;
}

export class DraRegistration {
  private readonly opts: DraRegistrationOptions;
  private readonly registeredListeners: RegistrationListener[] = [];
  private readonly lostListeners: RegistrationListener[] = [];
  private registeredFlag = false;
  private count = 0;

  constructor(opts: DraRegistrationOptions) {
    this.opts = opts;
  }

  /** After every registration the kubelet confirms (NotifyRegistrationStatus true). */
  onRegistered(fn: RegistrationListener): void {
    this.registeredListeners.push(fn);
  }

  /** A registration stopped counting: our registration socket went, or the kubelet refused us. */
  onRegistrationLost(fn: RegistrationListener): void {
    this.lostListeners.push(fn);
  }

  /** Registered now (the kubelet's last word was yes, and our registration socket is the one it saw). */
  get registered(): boolean {
    return this.registeredFlag;
  }

  get registrations(): number {
    return this.count;
  }

  /** The registration no longer stands (said once, and only while it stood). */
  lost(reason: string): void {
    if (!this.registeredFlag) return;
    this.registeredFlag = false;
    this.opts.log.info('DRA registration lost', { reason });
    for (const fn of this.lostListeners) fn(reason);
  }

  /** The Registration service, for the registration socket. */
  binding(): ServiceBinding {
    return {
      definition: pluginRegistrationService(),
      implementation: {
        GetInfo: (_call: grpc.ServerUnaryCall<unknown, PluginInfo>, cb: grpc.sendUnaryData<PluginInfo>) => {
          cb(null, {
            type: DRA_PLUGIN_TYPE,
            name: this.opts.driver,
            endpoint: this.opts.endpoint,
            supported_versions: [...SUPPORTED_VERSIONS],
          });
        },
        NotifyRegistrationStatus: (
          call: grpc.ServerUnaryCall<RegistrationStatus, object>,
          cb: grpc.sendUnaryData<object>,
        ) => {
          cb(null, {});
          this.status(call.request);
        },
      },
    };
  }

  private status(s: RegistrationStatus): void {
    if (!s.plugin_registered) {
      this.opts.log.error("the kubelet refused the DRA plugin's registration", {
        error: s.error,
        offered: SUPPORTED_VERSIONS,
      });
      this.lost(`the kubelet refused the registration: ${s.error}`);
      return;
    }
    this.registeredFlag = true;
    this.count++;
    this.opts.log.info('registered with the kubelet', { endpoint: this.opts.endpoint, registrations: this.count });
    for (const fn of this.registeredListeners) fn('the kubelet registered the DRA plugin');
  }
}
