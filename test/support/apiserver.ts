// A stand-in for the Kubernetes API server, for the DRA driver's tests: a small HTTP server (on
// 127.0.0.1 or a unix socket) serving the paths a DRA kubelet plugin uses, with real Kubernetes JSON.
//
// Modelled:
// - resource.k8s.io/v1 ResourceSlices: create (POST, metadata.generateName too), get, list
//   (fieldSelector on metadata.name / spec.nodeName / spec.driver, labelSelector on label equality),
//   update (PUT) with resourceVersion optimistic concurrency (a stale one → 409 Conflict; none → an
//   unconditional update; one that changes nothing is not written and keeps its resourceVersion),
//   delete (with DeleteOptions preconditions), deletecollection (DELETE on the collection with the same
//   selectors, as the kubelet wipes a node's slices; answers the list it deleted). One cluster-wide
//   resourceVersion counter; uid, creationTimestamp and generation (bumped when the spec changes)
//   filled by the server.
// - The validation rules of resource/v1 (types.go, pkg/apis/resource/validation, with
//   its messages and field paths) → 422 Invalid with details.causes[].field; driver, pool name and
//   nodeName immutable on update.
// - What the server stores is not what was sent: quantities in canonical form (32768Mi → 32Gi), unknown
//   fields dropped with a `Warning: 299` header (or 400 with ?fieldValidation=Strict), taints' timeAdded
//   filled. List items carry no apiVersion/kind, as the real server's do.
// - Consumable capacity (KEP-5075): a device's allowMultipleAllocations, and a capacity's requestPolicy
//   (only with it; default required with validValues or validRange and inside them, validValues sorted,
//   unique, at most 10, none above the capacity; validRange min ≤ default ≤ max ≤ capacity, step > 0
//   with default and max whole steps from min), its quantities canonical.
// - DeviceClasses: create, get, list, delete (putDeviceClass seeds one); selectors' cel.expression
//   present and ≤ 10 KiB, config[].opaque (driver, parameters a JSON object ≤ 10 KiB), and
//   extendedResourceName a valid extended resource name (not in kubernetes.io; unique across classes
//   it need not be: the newest class serves a name).
// - ResourceClaims get (namespaced; the test seeds them with putClaim, which validates the allocation
//   as a status update is: request references, driver/pool/device, shareID a normalised UID,
//   consumedCapacity quantities (canonical), config[] source FromClass|FromClaim, requests, opaque)
//   and Nodes get (putNode).
// - SelfSubjectAccessReviews (authorization.k8s.io/v1, create): allowed or not by the token's grant,
//   as the real server answers from RBAC; every authenticated user may create one.
// - Errors as Kubernetes Status JSON: NotFound 404, AlreadyExists / Conflict 409, Invalid 422,
//   BadRequest 400, Unauthorized 401, Forbidden 403 (with the real message shapes).
// - Bearer tokens, each with a user name and an allow-list of "verb resource" (e.g. "create
//   resourceslices", "* resourceslices", "get nodes"); no `tokens` option: every request is allowed.
// - down() closes the listener and every connection (clients get connection refused); up() listens
//   again on the same address, with the same objects; restart() does both.
// - Faults (apiserver-faults.ts): fault({ method, path, query, times, action }) makes the next
//   matching requests reset, answer a Status (5xx, 409, 429 with Retry-After) or answer late; a
//   request cut this way is recorded with code 0.
// - Watch of ResourceSlices (apiserver-watch.ts): ADDED/MODIFIED/DELETED/BOOKMARK from a resourceVersion,
//   a bounded history (410 Expired past it), compact(), cutWatches(); removeSlice() and editSlice() are
//   another client's delete and update, seen by the watches.
// Not modelled: watch of anything but ResourceSlices (→ 405 with a Status saying so), PATCH and
// server-side apply (→ 405), admission
// (ValidatingAdmissionPolicy, the node authorizer), quotas, DeviceClass updates, ResourceClaim writes,
// API discovery, managedFields, finalizers and graceful deletion, CEL compilation, feature gates other than
// DRAPartitionableDevices; the contents of nodeSelector and per-device node selection are stored only. TLS with
// client certificates: the `tls` option.
// - Partitionable devices (apiserver-counters.ts): sharedCounters and consumesCounters validated as on write
// (limits, DNS-label names, a slice of counter sets holds no devices); poolProblems() is the scheduler's check
// of a whole pool (every counter set and counter a device consumes exists, no duplicates), which the real
// server leaves to run time. With the DRAPartitionableDevices gate off (the default before 1.36, or the
// partitionableDevices option) those fields are dropped on write, as the real server drops them.
import { EventEmitter } from 'node:events';
import { randomUUID } from 'node:crypto';
import { createServer } from 'node:http';
import { createServer as createHttpsServer } from 'node:https';
import type { TLSSocket } from 'node:tls';
import type { IncomingMessage, Server, ServerResponse } from 'node:http';
import type { AddressInfo, Socket } from 'node:net';
import { rm } from 'node:fs/promises';
import type { SliceJanitor } from './plugin-watcher.ts';
import { FaultTable, applyFault } from './apiserver-faults.ts';
import type { Fault, FaultRule } from './apiserver-faults.ts';
import { WatchHub } from './apiserver-watch.ts';
import {
  dropDisabledPartitionable,
  partitionableByDefault,
  validateConsumesCounters,
  validateSharedCounters,
} from './apiserver-counters.ts';
import type { EventType } from './apiserver-watch.ts';

export type Json = null | boolean | number | string | Json[] | { [k: string]: Json };
export type JsonObject = { [k: string]: Json };

export const GROUP = 'resource.k8s.io';
export const API_VERSION = `${GROUP}/v1`;
const MAX_BODY = 3 * 1024 * 1024;

/** Limits from resource/v1 types.go. */
export const LIMITS = {
  devicesPerSlice: 128,
  devicesPerSliceWithTaintsOrCounters: 64,
  attributesAndCapacitiesPerDevice: 32,
  taintsPerDevice: 16,
  attributeIdLength: 32,
  attributeDomainLength: 63,
  driverNameLength: 63,
  poolNameLength: 253,
  stringValueLength: 64,
  versionValueLength: 64,
} as const;

export interface Cause {
  reason:
    | 'FieldValueInvalid'
    | 'FieldValueTypeInvalid'
    | 'FieldValueRequired'
    | 'FieldValueTooLong'
    | 'FieldValueTooMany'
    | 'FieldValueDuplicate'
    | 'FieldValueNotSupported'
    | 'FieldValueForbidden';
  message: string;
  field: string;
}

export interface TokenGrant {
  /** The user the token authenticates as (shown in 403 messages). */
  user: string;
  /** "verb resource" pairs; either part may be "*". Verbs: get, list, create, update, delete, deletecollection. */
  allow: string[];
}

export interface ApiServerOptions {
  /** Listen on this unix socket instead of 127.0.0.1 (an ephemeral port). */
  socketPath?: string;
  /** Bearer token → grant. Without it, authentication and authorization are off. */
  tokens?: Record<string, TokenGrant>;
  /** How many slice changes the watch history keeps (default 200): older resourceVersions get 410. */
  watchHistory?: number;
  /**
   * Serve https with this certificate and key; with `clientCa`, a client certificate it signed authenticates
   * by its CN (`clientCertificates`). Changed with useTls() and a restart(): a rotation.
   */
  tls?: StandInTls;
  /** A client certificate's common name → grant (with tls.clientCa). */
  clientCertificates?: Record<string, TokenGrant>;
  /** What GET /version says (gitVersion); default v1.36.3. */
  version?: string;
  /**
   * The DRAPartitionableDevices feature gate; default: as the version has it (on from 1.36). Off, the counter
   * fields of a slice are dropped on write, as the real server drops them.
   */
  partitionableDevices?: boolean;
}

const DEFAULT_VERSION = 'v1.36.3';

export interface StandInTls {
  readonly cert: string;
  readonly key: string;
  readonly clientCa?: string;
}

export interface RequestRecord {
  method: string;
  path: string;
  user: string | undefined;
  code: number;
}

// ---- name and value rules ----

const DNS_LABEL = /^[a-z0-9]([-a-z0-9]*[a-z0-9])?$/;
const DNS_SUBDOMAIN = /^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$/;
const C_IDENTIFIER = /^[A-Za-z_][A-Za-z0-9_]*$/;
const LABEL_NAME = /^([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]$/;
const LABEL_VALUE = /^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$/;
// Semantic Versioning 2.0.0, strict (the grammar of semver.org).
const NUM = '(0|[1-9][0-9]*)';
const PRE_ID = '(0|[1-9][0-9]*|[0-9]*[A-Za-z-][0-9A-Za-z-]*)';
const SEMVER = new RegExp(
  `^${NUM}\\.${NUM}\\.${NUM}(-${PRE_ID}(\\.${PRE_ID})*)?(\\+[0-9A-Za-z-]+(\\.[0-9A-Za-z-]+)*)?$`,
);

export function isDnsLabel(s: string): boolean {
  return s.length <= 63 && DNS_LABEL.test(s);
}

export function isDnsSubdomain(s: string): boolean {
  return s.length <= 253 && DNS_SUBDOMAIN.test(s);
}

function isQualifiedLabelName(s: string): boolean {
  const i = s.lastIndexOf('/');
  const name = i < 0 ? s : s.slice(i + 1);
  if (i >= 0 && !isDnsSubdomain(s.slice(0, i))) return false;
  return name.length <= 63 && LABEL_NAME.test(name);
}

/** An attribute or capacity name: a C identifier ≤ 32, optionally `<domain>/` (a DNS subdomain ≤ 63). */
function qualifiedNameProblem(s: string): string | undefined {
  const i = s.indexOf('/');
  const id = i < 0 ? s : s.slice(i + 1);
  if (i >= 0) {
    const domain = s.slice(0, i);
    if (domain.length > LIMITS.attributeDomainLength || !DNS_SUBDOMAIN.test(domain)) {
      return `the domain "${domain}" must be a DNS subdomain of at most ${LIMITS.attributeDomainLength} characters`;
    }
  }
  if (id.length === 0 || id.length > LIMITS.attributeIdLength || !C_IDENTIFIER.test(id)) {
    return id.length > LIMITS.attributeIdLength
      ? `may not be more than ${LIMITS.attributeIdLength} bytes`
      : "a valid C identifier must start with alphabetic character or '_', followed " +
          "by a string of alphanumeric characters or '_' (e.g. 'my_name',  or 'MY_NAME', " +
          " or 'MyName', regex used for validation is '[A-Za-z_][A-Za-z0-9_]*')";
  }
  return undefined;
}

// ---- quantities ----

const QUANTITY = /^([+-]?)([0-9]+(?:\.[0-9]*)?|\.[0-9]+)(Ki|Mi|Gi|Ti|Pi|Ei|n|u|m|k|M|G|T|P|E|[eE][+-]?[0-9]+)?$/;
const BINARY: Record<string, number> = { Ki: 10, Mi: 20, Gi: 30, Ti: 40, Pi: 50, Ei: 60 };
const DECIMAL: Record<string, number> = { n: -9, u: -6, m: -3, '': 0, k: 3, M: 6, G: 9, T: 12, P: 15, E: 18 };
const DECIMAL_SUFFIX = new Map(Object.entries(DECIMAL).map(([k, v]) => [v, k]));
const BINARY_SUFFIX = new Map(Object.entries(BINARY).map(([k, v]) => [v, k]));

/**
 * A quantity in the API server's canonical form, or undefined if it is not one. Binary (Ki…Ei)
 * amounts of at least 1024 that are whole keep the largest binary suffix that leaves a whole number
 * (32768Mi → 32Gi, 1536Mi stays); everything else is written in decimal SI with the largest
 * suffix that leaves a whole number (2000 → 2k, 1.5G → 1500M, 0.5 → 500m), or, written with an
 * exponent, the same with e<3k> (1e3 stays, 1.5e3 → 1500). Values finer than 1n are refused here
 * (the real server rounds them up).
 */
export function canonicalQuantity(q: string): string | undefined {
  const parsed = parseQuantity(q);
  if (parsed === undefined) return undefined;
  const { nanos, binary, exponentForm } = parsed;
  const neg = nanos < 0n;
  const abs = neg ? -nanos : nanos;
  const out = (s: string): string => (neg ? `-${s}` : s);
  if (binary && abs % 1_000_000_000n === 0n) {
    const bytes = abs / 1_000_000_000n;
    if (bytes >= 1024n) {
      let e = 60;
      while (e > 0 && bytes % 2n ** BigInt(e) !== 0n) e -= 10;
      return out(`${bytes / 2n ** BigInt(e)}${BINARY_SUFFIX.get(e) ?? ''}`);
    }
  }
  if (abs === 0n) return '0';
  let e = 18;
  while (e > -9 && abs % 10n ** BigInt(e + 9) !== 0n) e -= 3;
  // An exponent-written quantity keeps that notation (1e3 stays 1e3, 1.5e3 reads 1500).
  const unit = exponentForm ? (e === 0 ? '' : `e${e}`) : (DECIMAL_SUFFIX.get(e) ?? '');
  return out(`${abs / 10n ** BigInt(e + 9)}${unit}`);
}

/** A quantity's exact value in nano-units (signed), how it was written, or undefined if it is no quantity. */
function parseQuantity(q: string): { nanos: bigint; binary: boolean; exponentForm: boolean } | undefined {
  const m = QUANTITY.exec(q);
  if (m === null) return undefined;
  const [, sign = '', digits = '', suffix = ''] = m;
  const [whole = '', frac = ''] = digits.split('.');
  let exp10 = 0;
  let exp2 = 0;
  if (suffix in BINARY) exp2 = BINARY[suffix] ?? 0;
  else if (suffix in DECIMAL) exp10 = DECIMAL[suffix] ?? 0;
  else if (suffix !== '') exp10 = Number(suffix.slice(1));
  let nanos = BigInt((whole || '0') + frac) * 2n ** BigInt(exp2);
  const shift = exp10 + 9 - frac.length;
  if (shift >= 0) nanos *= 10n ** BigInt(shift);
  else {
    const div = 10n ** BigInt(-shift);
    if (nanos % div !== 0n) return undefined;
    nanos /= div;
  }
  return { nanos: sign === '-' ? -nanos : nanos, binary: exp2 > 0, exponentForm: /^[eE]/.test(suffix) };
}

/** A quantity's value in nano-units, for comparing two quantities exactly; undefined if it is no quantity. */
export function quantityNanos(q: Json | undefined): bigint | undefined {
  return typeof q === 'string' || typeof q === 'number' ? parseQuantity(String(q))?.nanos : undefined;
}

// ---- Status objects ----

export interface Status {
  kind: 'Status';
  apiVersion: 'v1';
  metadata: Record<string, never>;
  status: 'Failure' | 'Success';
  message?: string;
  reason?: string;
  details?: { name?: string; group?: string; kind?: string; uid?: string; causes?: Cause[] };
  code: number;
}

function status(code: number, reason: string, message: string, details?: Status['details']): Status {
  return {
    kind: 'Status',
    apiVersion: 'v1',
    metadata: {},
    status: 'Failure',
    message,
    reason,
    ...(details !== undefined ? { details } : {}),
    code,
  };
}

/** An answer other than success: the Status the server sends. */
export class HttpError extends Error {
  readonly status: Status;
  constructor(s: Status) {
    super(s.message);
    this.status = s;
  }
}

/** `resourceslices.resource.k8s.io`, `nodes`: how the server names a resource in messages. */
function qualified(resource: string, group: string): string {
  return group === '' ? resource : `${resource}.${group}`;
}

function notFound(resource: string, group: string, name: string): HttpError {
  return new HttpError(
    status(404, 'NotFound', `${qualified(resource, group)} "${name}" not found`, { name, group, kind: resource }),
  );
}

function conflict(
  resource: string,
  group: string,
  name: string,
  why = 'the object has been modified; please apply your changes to the latest version and try again',
): HttpError {
  return new HttpError(
    status(409, 'Conflict', `Operation cannot be fulfilled on ${qualified(resource, group)} "${name}": ${why}`, {
      name,
      group,
      kind: resource,
    }),
  );
}

function badRequest(message: string): HttpError {
  return new HttpError(status(400, 'BadRequest', message));
}

function invalid(kind: string, name: string, causes: Cause[]): HttpError {
  const list = causes.map((c) => `${c.field}: ${c.message}`);
  const joined = list.length === 1 ? (list[0] ?? '') : `[${list.join(', ')}]`;
  return new HttpError(
    status(422, 'Invalid', `${kind}.${GROUP} "${name}" is invalid: ${joined}`, { name, group: GROUP, kind, causes }),
  );
}

// ---- ResourceSlice validation ----

function isObject(v: Json | undefined): v is JsonObject {
  return typeof v === 'object' && v !== null && !Array.isArray(v);
}

function show(v: Json | undefined): string {
  return JSON.stringify(v ?? null);
}

class Causes {
  readonly list: Cause[] = [];
  invalid(field: string, value: Json | undefined, why: string): void {
    this.list.push({ reason: 'FieldValueInvalid', message: `Invalid value: ${show(value)}: ${why}`, field });
  }
  typeInvalid(field: string, value: Json | undefined, why: string): void {
    this.list.push({ reason: 'FieldValueTypeInvalid', message: `Invalid value: ${show(value)}: ${why}`, field });
  }
  required(field: string, why = ''): void {
    this.list.push({ reason: 'FieldValueRequired', message: `Required value${why ? `: ${why}` : ''}`, field });
  }
  tooLong(field: string, max: number): void {
    this.list.push({ reason: 'FieldValueTooLong', message: `Too long: may not be more than ${max} bytes`, field });
  }
  tooMany(field: string, n: number, max: number): void {
    this.list.push({ reason: 'FieldValueTooMany', message: `Too many: ${n}: must have at most ${max} items`, field });
  }
  duplicate(field: string, value: Json): void {
    this.list.push({ reason: 'FieldValueDuplicate', message: `Duplicate value: ${show(value)}`, field });
  }
  notSupported(field: string, value: Json | undefined, allowed: string[]): void {
    this.list.push({
      reason: 'FieldValueNotSupported',
      message: `Unsupported value: ${show(value)}: supported values: ${allowed.map((a) => `"${a}"`).join(', ')}`,
      field,
    });
  }
  forbidden(field: string, why: string): void {
    this.list.push({ reason: 'FieldValueForbidden', message: `Forbidden: ${why}`, field });
  }
}

const DNS_LABEL_MSG =
  'a lowercase RFC 1123 label must consist of lower case alphanumeric ' +
  "characters or '-', and must start and end with an alphanumeric character";
const DNS_SUBDOMAIN_MSG =
  'a lowercase RFC 1123 subdomain must consist of lower case alphanumeric ' +
  "characters, '-' or '.', and must start and end with an alphanumeric character";

function validateSpec(spec: Json | undefined, c: Causes): void {
  if (!isObject(spec)) {
    c.required('spec');
    return;
  }
  const driver = spec.driver;
  if (typeof driver !== 'string' || driver === '') c.required('spec.driver');
  else if (driver.length > LIMITS.driverNameLength) c.tooLong('spec.driver', LIMITS.driverNameLength);
  else if (!DNS_SUBDOMAIN.test(driver)) c.invalid('spec.driver', driver, DNS_SUBDOMAIN_MSG);

  const pool = spec.pool;
  if (!isObject(pool)) c.required('spec.pool');
  else {
    const name = pool.name;
    if (typeof name !== 'string' || name === '') c.required('spec.pool.name');
    else if (name.length > LIMITS.poolNameLength) c.tooLong('spec.pool.name', LIMITS.poolNameLength);
    else if (name.split('/').some((p) => !isDnsSubdomain(p)))
      c.invalid('spec.pool.name', name, `each /-separated part must be a DNS subdomain: ${DNS_SUBDOMAIN_MSG}`);
    const gen = pool.generation;
    if (gen !== undefined && (typeof gen !== 'number' || !Number.isInteger(gen) || gen < 0))
      c.invalid('spec.pool.generation', gen, 'must be greater than or equal to zero');
    const count = pool.resourceSliceCount;
    if (typeof count !== 'number' || !Number.isInteger(count) || count <= 0)
      c.invalid('spec.pool.resourceSliceCount', count, 'must be greater than zero');
  }

  const selectors = (['nodeName', 'nodeSelector', 'allNodes', 'perDeviceNodeSelection'] as const).filter((k) => {
    const v = spec[k];
    return v !== undefined && v !== null && v !== false && v !== '';
  });
  if (selectors.length === 0)
    c.required('spec', 'exactly one of `nodeName`, `nodeSelector`, `allNodes`, `perDeviceNodeSelection` is required');
  else if (selectors.length > 1)
    c.invalid(
      'spec',
      `{${selectors.map((x) => `\`${x}\``).join(', ')}}`,
      'exactly one of `nodeName`, `nodeSelector`, `allNodes`, ' +
        '`perDeviceNodeSelection` is required, but multiple fields are set',
    );
  const nodeName = spec.nodeName;
  if (typeof nodeName === 'string' && nodeName !== '' && !isDnsSubdomain(nodeName))
    c.invalid('spec.nodeName', nodeName, DNS_SUBDOMAIN_MSG);
  if (nodeName !== undefined && nodeName !== null && typeof nodeName !== 'string')
    c.invalid('spec.nodeName', nodeName, 'must be a string');

  validateSharedCounters(spec, c);
  const devices = spec.devices;
  if (devices === undefined || devices === null) return;
  if (!Array.isArray(devices)) {
    c.invalid('spec.devices', devices, 'must be a list');
    return;
  }
  const constrained = devices.some(
    (d) =>
      isObject(d) &&
      ((Array.isArray(d.taints) && d.taints.length > 0) ||
        (Array.isArray(d.consumesCounters) && d.consumesCounters.length > 0)),
  );
  const max = constrained ? LIMITS.devicesPerSliceWithTaintsOrCounters : LIMITS.devicesPerSlice;
  if (devices.length > max) c.tooMany('spec.devices', devices.length, max);
  const seen = new Set<string>();
  for (const [i, d] of devices.entries()) validateDevice(d, `spec.devices[${i}]`, seen, c);
}

function validateDevice(d: Json, at: string, seen: Set<string>, c: Causes): void {
  if (!isObject(d)) {
    c.invalid(at, d, 'must be an object');
    return;
  }
  const name = d.name;
  if (typeof name !== 'string' || name === '') c.required(`${at}.name`);
  else if (!isDnsLabel(name)) c.invalid(`${at}.name`, name, DNS_LABEL_MSG);
  else if (seen.has(name)) c.duplicate(`${at}.name`, name);
  else seen.add(name);

  const attrs = d.attributes ?? {};
  const caps = d.capacity ?? {};
  if (!isObject(attrs)) c.invalid(`${at}.attributes`, attrs, 'must be a map');
  if (!isObject(caps)) c.invalid(`${at}.capacity`, caps, 'must be a map');
  const nAttrs = isObject(attrs) ? Object.keys(attrs).length : 0;
  const nCaps = isObject(caps) ? Object.keys(caps).length : 0;
  if (nAttrs + nCaps > LIMITS.attributesAndCapacitiesPerDevice) {
    c.invalid(
      at,
      nAttrs + nCaps,
      `the total number of attributes and capacities must not exceed ${LIMITS.attributesAndCapacitiesPerDevice}`,
    );
  }
  if (isObject(attrs)) {
    for (const [k, v] of Object.entries(attrs)) {
      const f = `${at}.attributes[${k}]`;
      const bad = qualifiedNameProblem(k);
      if (bad !== undefined) c.typeInvalid(f, k, bad);
      validateAttributeValue(v, f, c);
    }
  }
  const multi = d.allowMultipleAllocations;
  if (multi !== undefined && multi !== null && typeof multi !== 'boolean')
    c.invalid(`${at}.allowMultipleAllocations`, multi, 'must be a boolean');
  if (isObject(caps)) {
    for (const [k, v] of Object.entries(caps)) {
      const f = `${at}.capacity[${k}]`;
      const bad = qualifiedNameProblem(k);
      if (bad !== undefined) c.typeInvalid(f, k, bad);
      if (!isObject(v) || v.value === undefined || v.value === null) c.required(`${f}.value`);
      else if (v.requestPolicy !== undefined && v.requestPolicy !== null) {
        // Only a device that may be allocated more than once has consumable capacity.
        if (multi !== true) c.forbidden(`${f}.requestPolicy`, 'allowMultipleAllocations must be true');
        else validateRequestPolicy(v.value, v.requestPolicy, `${f}.requestPolicy`, c);
      }
    }
  }
  const taints = d.taints;
  if (taints !== undefined && taints !== null) {
    if (!Array.isArray(taints)) c.invalid(`${at}.taints`, taints, 'must be a list');
    else {
      if (taints.length > LIMITS.taintsPerDevice) c.tooMany(`${at}.taints`, taints.length, LIMITS.taintsPerDevice);
      for (const [j, t] of taints.entries()) validateTaint(t, `${at}.taints[${j}]`, c);
    }
  }
  validateConsumesCounters(d, at, c);
}

// ---- consumable capacity (KEP-5075): a capacity's requestPolicy ----

/** At most this many validValues in a requestPolicy (CapacityRequestPolicyDiscreteMaxOptions). */
export const REQUEST_POLICY_MAX_VALUES = 10;
const MAX_INT64 = 9223372036854775807n;
const NANO = 1_000_000_000n;

/** Quantity.Value(): the quantity as a whole number, rounded up (away from zero). */
function ceilValue(nanos: bigint): bigint {
  const whole = nanos / NANO;
  return nanos % NANO === 0n || nanos < 0n ? whole : whole + 1n;
}

/** A quantity as the server prints it (its canonical form). */
function showQ(q: Json | undefined): string {
  return typeof q === 'string' || typeof q === 'number' ? (canonicalQuantity(String(q)) ?? String(q)) : show(q);
}

/**
 * A capacity's requestPolicy, by the rules of validateRequestPolicy in pkg/apis/resource/validation: at
 * most one of validValues and validRange; with either, a default, inside them; validValues sorted,
 * unique, at most 10 and none above the capacity; validRange's min ≤ default ≤ max ≤ capacity, a
 * step > 0 whose first step fits in the capacity and of which default and max are multiples from min.
 */
function validateRequestPolicy(capacity: Json, policy: Json, f: string, c: Causes): void {
  if (!isObject(policy)) {
    c.invalid(f, policy, 'must be an object');
    return;
  }
  const cap = quantityNanos(capacity);
  const values = policy.validValues;
  const range = policy.validRange;
  const hasValues = Array.isArray(values) && values.length > 0;
  const hasRange = range !== undefined && range !== null;
  if (hasValues && hasRange) {
    c.forbidden(
      f,
      'exactly one policy can be specified, cannot specify "validValues" and "validRange" at the same time',
    );
    return;
  }
  if (cap === undefined) return;
  const dflt = policy.default;
  if (hasValues) {
    if (dflt === undefined || dflt === null) c.required(`${f}.default`, 'required when validValues is defined');
    else validateValidValues(dflt, cap, capacity, values, `${f}.validValues`, c);
  } else if (hasRange) {
    if (dflt === undefined || dflt === null) c.required(`${f}.default`, 'required when validRange is defined');
    else if (!isObject(range)) c.invalid(`${f}.validRange`, range, 'must be an object');
    else validateValidRange(dflt, cap, capacity, range, `${f}.validRange`, c);
  }
}

function validateValidValues(dflt: Json, cap: bigint, capacity: Json, values: Json[], f: string, c: Causes): void {
  const n = values.map((v) => quantityNanos(v) ?? 0n);
  for (let i = 0; i + 1 < n.length; i++) {
    if ((n[i] ?? 0n) > (n[i + 1] ?? 0n))
      c.invalid(`${f}[${i + 1}]`, showQ(values[i + 1]), 'values must be sorted in ascending order');
  }
  const d = quantityNanos(dflt);
  let foundDefault = false;
  if (values.length > REQUEST_POLICY_MAX_VALUES) c.tooMany(f, values.length, REQUEST_POLICY_MAX_VALUES);
  else {
    const seen = new Set<string>();
    n.forEach((v, i) => {
      if (v > cap)
        c.invalid(`${f}[${i}]`, showQ(values[i]), `option is larger than capacity value: ${showQ(capacity)}`);
      if (v === d) foundDefault = true;
    });
    n.forEach((v, i) => {
      // Unique by their whole-number value, as the server keys them.
      const key = String(ceilValue(v));
      if (seen.has(key)) c.duplicate(`${f}[${i}]`, key);
      else seen.add(key);
    });
  }
  if (!foundDefault) c.invalid(f, showQ(dflt), 'default value is not valid according to the requestPolicy');
}

function validateValidRange(dflt: Json, cap: bigint, capacity: Json, range: JsonObject, f: string, c: Causes): void {
  const capText = showQ(capacity);
  const q = (v: Json | undefined): bigint | undefined => (v === undefined || v === null ? undefined : quantityNanos(v));
  const min = q(range.min);
  if (min === undefined) {
    c.required(`${f}.min`, 'required when validRange is defined');
    return;
  }
  const d = q(dflt) ?? 0n;
  const max = q(range.max);
  const step = q(range.step);
  if (min > cap) c.invalid(`${f}.min`, showQ(range.min), `min is larger than capacity value: ${capText}`);
  if (d < min) c.invalid(`${f}.default`, showQ(dflt), `default is less than min: ${showQ(range.min)}`);
  if (max !== undefined) {
    if (min > max) c.invalid(`${f}.max`, showQ(range.min), `min is larger than max: ${showQ(range.max)}`);
    if (max > cap) c.invalid(`${f}.max`, showQ(range.max), `max is larger than capacity value: ${capText}`);
    if (d > max) c.invalid(`${f}.default`, showQ(dflt), `default is more than max: ${showQ(range.max)}`);
  }
  if (step === undefined) return;
  if (step <= 0n) {
    c.invalid(`${f}.step`, showQ(range.step), 'must be greater than zero');
    return;
  }
  const first = min + step;
  if (first > cap) {
    // Shown in min's format, as the server adds step to a copy of min.
    const binary = /i$/.test(String(range.min)) && first % (1024n * NANO) === 0n;
    const sum = canonicalQuantity(binary ? `${first / NANO / 1024n}Ki` : `${first}n`) ?? String(first);
    c.invalid(`${f}.step`, showQ(range.step), `one step ${sum} is larger than capacity value: ${capText}`);
  }
  // The server does this arithmetic on whole numbers that fit an int64, and refuses bounds that do not.
  let unsafe = false;
  for (const [name, v, raw] of [
    ['default', d, dflt],
    ['min', min, range.min],
    ['max', max, range.max],
    ['step', step, range.step],
  ] as const) {
    if (v === undefined) continue;
    if (v < 0n) c.invalid(`${f}.${name}`, showQ(raw), 'must be greater than or equal to 0');
    else if (v > MAX_INT64 * NANO) c.invalid(`${f}.${name}`, showQ(raw), 'must not be larger than 9223372036854775807');
    else continue;
    unsafe = true;
  }
  if (unsafe) return;
  const stepInt = ceilValue(step);
  const minInt = ceilValue(min);
  for (const [v, raw] of [
    [d, dflt],
    [max, range.max],
  ] as const) {
    if (v === undefined || (ceilValue(v) - minInt) % stepInt === 0n) continue;
    c.invalid(
      `${f}.step`,
      showQ(raw),
      `value is not a multiple of a given step (${showQ(range.step)}) from (${showQ(range.min)})`,
    );
  }
}

function validateAttributeValue(v: Json, f: string, c: Causes): void {
  if (!isObject(v)) {
    c.invalid(f, v, 'must be an object with exactly one of int, bool, string, version');
    return;
  }
  const set = (['int', 'bool', 'string', 'version'] as const).filter((k) => v[k] !== undefined && v[k] !== null);
  if (set.length === 0) {
    c.required(f, 'exactly one value must be specified');
    return;
  }
  if (set.length > 1) {
    c.invalid(f, v, 'exactly one value must be specified');
    return;
  }
  const [k] = set;
  const x = k === undefined ? undefined : v[k];
  if (k === 'int' && (typeof x !== 'number' || !Number.isInteger(x))) c.invalid(`${f}.int`, x, 'must be an integer');
  if (k === 'bool' && typeof x !== 'boolean') c.invalid(`${f}.bool`, x, 'must be a boolean');
  if (k === 'string') {
    if (typeof x !== 'string') c.invalid(`${f}.string`, x, 'must be a string');
    else if (x.length > LIMITS.stringValueLength) c.tooLong(`${f}.string`, LIMITS.stringValueLength);
  }
  if (k === 'version') {
    if (typeof x !== 'string') c.invalid(`${f}.version`, x, 'must be a string');
    else if (x.length > LIMITS.versionValueLength) c.tooLong(`${f}.version`, LIMITS.versionValueLength);
    else if (!SEMVER.test(x)) c.invalid(`${f}.version`, x, 'must be a string compatible with semver.org spec 2.0.0');
  }
}

function validateTaint(t: Json, f: string, c: Causes): void {
  if (!isObject(t)) {
    c.invalid(f, t, 'must be an object');
    return;
  }
  const key = t.key;
  if (typeof key !== 'string' || key === '') c.required(`${f}.key`);
  else if (!isQualifiedLabelName(key))
    c.invalid(
      `${f}.key`,
      key,
      "name part must consist of alphanumeric characters, '-', '_' or '.', and " +
        "must start and end with an alphanumeric character (e.g. 'MyName',  or " +
        "'my.name',  or '123-abc'), with an optional DNS subdomain prefix and '/'",
    );
  const value = t.value;
  if (
    value !== undefined &&
    value !== null &&
    (typeof value !== 'string' || value.length > 63 || !LABEL_VALUE.test(value))
  ) {
    c.invalid(
      `${f}.value`,
      value,
      "a valid label must be an empty string or consist of alphanumeric characters, '-', '_' " +
        "or '.', and must start and end with an alphanumeric character, at most 63 characters",
    );
  }
  const effect = t.effect;
  const effects = ['NoSchedule', 'NoExecute', 'None'];
  if (typeof effect !== 'string' || effect === '') c.required(`${f}.effect`);
  else if (!effects.includes(effect)) c.notSupported(`${f}.effect`, effect, effects);
}

// ---- ResourceClaim status: the allocation a driver reads ----

/** Limits from resource/v1 types.go for claims and classes. */
export const CLAIM_LIMITS = {
  /** AllocationResultsMaxSize, also DeviceRequestsMaxSize. */
  results: 32,
  requests: 32,
  /** DeviceConfigMaxSize; an allocation holds class and claim configs, twice as many. */
  config: 32,
  /** OpaqueParametersMaxLength, bytes of raw JSON. */
  opaqueParameters: 10 * 1024,
  /** DeviceSelectorsMaxSize. */
  selectors: 32,
  /** CELSelectorExpressionMaxLength. */
  celExpression: 10 * 1024,
} as const;

const HEX = /^[0-9a-fA-F]+$/;

/** What google/uuid's Validate says of a UID, then the API server's demand for the normalised form. */
function uidProblem(uid: string): string | undefined {
  let s = uid;
  if (s.length === 45) {
    if (s.slice(0, 9).toLowerCase() !== 'urn:uuid:')
      return `error validating uid: invalid urn prefix: "${s.slice(0, 9)}"`;
    s = s.slice(9);
  } else if (s.length === 38) s = s.slice(1, 37);
  else if (s.length === 32) {
    if (!HEX.test(s)) return 'error validating uid: invalid UUID format';
  } else if (s.length !== 36) return `error validating uid: invalid UUID length: ${uid.length}`;
  if (s.length === 36) {
    const dashes = [8, 13, 18, 23].every((i) => s[i] === '-');
    if (!dashes || !HEX.test(s.replace(/-/g, '')) || s.replace(/-/g, '').length !== 32)
      return 'error validating uid: invalid UUID format';
  }
  if (uid.length !== 36 || uid !== uid.toLowerCase())
    return (
      'uid must be in RFC 4122 normalized form, `xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx` ' +
      'with lowercase hexadecimal characters'
    );
  return undefined;
}

/** A driver name as the server checks it where it validates a CSI driver's: ≤ 63, a DNS subdomain in lower case. */
function validateDriverName(v: Json | undefined, f: string, c: Causes): void {
  if (typeof v !== 'string' || v === '') c.required(f);
  else if (v.length > LIMITS.driverNameLength) c.tooLong(f, LIMITS.driverNameLength);
  else if (!DNS_SUBDOMAIN.test(v.toLowerCase())) c.invalid(f, v, DNS_SUBDOMAIN_MSG);
}

/** `{opaque: {driver, parameters}}`: a driver name and a JSON object of at most 10 KiB. */
function validateDeviceConfiguration(config: JsonObject, f: string, c: Causes): void {
  const opaque = config.opaque;
  if (!isObject(opaque)) {
    c.required(`${f}.opaque`);
    return;
  }
  validateDriverName(opaque.driver, `${f}.opaque.driver`, c);
  const p = opaque.parameters;
  const at = `${f}.opaque.parameters`;
  if (p === undefined || p === null) c.required(at);
  else if (Buffer.byteLength(JSON.stringify(p)) > CLAIM_LIMITS.opaqueParameters)
    c.tooLong(at, CLAIM_LIMITS.opaqueParameters);
  else if (!isObject(p)) c.invalid(at, '<value omitted>', 'must be a valid JSON object');
}

/** The names a claim's requests answer to: `<request>` and `<request>/<subrequest>`. */
function requestNamesOf(spec: Json | undefined): Set<string> {
  const names = new Set<string>();
  const devices = isObject(spec) && isObject(spec.devices) ? spec.devices : {};
  for (const r of Array.isArray(devices.requests) ? devices.requests : []) {
    if (!isObject(r) || typeof r.name !== 'string') continue;
    names.add(r.name);
    for (const sub of Array.isArray(r.firstAvailable) ? r.firstAvailable : [])
      if (isObject(sub) && typeof sub.name === 'string') names.add(`${r.name}/${sub.name}`);
  }
  return names;
}

/**
 * The spec a seeded claim without one is taken to have had: a request (of class gpu.nvidia.com) for
 * each request name its allocation refers to, so the references check as they would on a real claim.
 */
function specFor(status: JsonObject | undefined): JsonObject {
  const alloc = isObject(status?.allocation) && isObject(status.allocation.devices) ? status.allocation.devices : {};
  const refs: string[] = [];
  for (const r of Array.isArray(alloc.results) ? alloc.results : []) if (isObject(r)) refs.push(str(r.request) ?? '');
  for (const cfg of Array.isArray(alloc.config) ? alloc.config : [])
    if (isObject(cfg) && Array.isArray(cfg.requests)) for (const n of cfg.requests) refs.push(str(n) ?? '');
  const subs = new Map<string, Set<string>>();
  for (const ref of refs.filter((r) => r !== '')) {
    const [main = '', sub] = ref.split('/');
    const set = subs.get(main) ?? new Set<string>();
    if (sub !== undefined) set.add(sub);
    subs.set(main, set);
  }
  const exactly = { deviceClassName: 'gpu.nvidia.com' };
  const requests: Json[] = [...subs].map(([name, s]) =>
    s.size === 0 ? { name, exactly } : { name, firstAvailable: [...s].map((n) => ({ name: n, ...exactly })) },
  );
  return { devices: { requests } };
}

function validateRequestRef(v: Json | undefined, f: string, names: Set<string>, c: Causes): void {
  const name = str(v) ?? '';
  const parts = name.split('/');
  const why = "must be the name of a request in the claim or the name of a request and a subrequest separated by '/'";
  if (parts.length > 2) {
    c.invalid(f, name, why);
    return;
  }
  for (const part of parts) {
    if (part === '') c.required(f);
    else if (!isDnsLabel(part)) c.invalid(f, part, DNS_LABEL_MSG);
  }
  if (!names.has(name)) c.invalid(f, name, why);
}

/** status.allocation.devices as validateDeviceAllocationResult checks a new allocation. */
function validateClaimStatus(status: Json | undefined, names: Set<string>, c: Causes): void {
  if (!isObject(status) || !isObject(status.allocation)) return;
  const devices = status.allocation.devices;
  if (!isObject(devices)) return;
  const at = 'status.allocation.devices';
  const results = devices.results ?? [];
  if (!Array.isArray(results)) c.invalid(`${at}.results`, results, 'must be a list');
  else if (results.length > CLAIM_LIMITS.results) c.tooMany(`${at}.results`, results.length, CLAIM_LIMITS.results);
  else for (const [i, r] of results.entries()) validateResult(r, `${at}.results[${i}]`, names, c);
  const config = devices.config ?? [];
  const maxConfig = 2 * CLAIM_LIMITS.config;
  if (!Array.isArray(config)) c.invalid(`${at}.config`, config, 'must be a list');
  else if (config.length > maxConfig) c.tooMany(`${at}.config`, config.length, maxConfig);
  else for (const [i, cfg] of config.entries()) validateAllocationConfig(cfg, `${at}.config[${i}]`, names, c);
}

function validateResult(r: Json, f: string, names: Set<string>, c: Causes): void {
  if (!isObject(r)) {
    c.invalid(f, r, 'must be an object');
    return;
  }
  validateRequestRef(r.request, `${f}.request`, names, c);
  validateDriverName(r.driver, `${f}.driver`, c);
  const pool = r.pool;
  if (typeof pool !== 'string' || pool === '') c.required(`${f}.pool`);
  else if (pool.length > LIMITS.poolNameLength) c.tooLong(`${f}.pool`, LIMITS.poolNameLength);
  else if (pool.split('/').some((p) => !isDnsSubdomain(p))) c.invalid(`${f}.pool`, pool, DNS_SUBDOMAIN_MSG);
  const device = r.device;
  if (typeof device !== 'string' || device === '') c.required(`${f}.device`);
  else if (!isDnsLabel(device)) c.invalid(`${f}.device`, device, DNS_LABEL_MSG);
  // A share of a device that allows multiple allocations: a UID. Whether the device allows them is the
  // scheduler's knowledge; the server does not look.
  const share = r.shareID;
  if (share !== undefined && share !== null) {
    const why = typeof share === 'string' ? uidProblem(share) : 'must be a string';
    if (why !== undefined) c.invalid(`${f}.shareID`, share, why);
  }
}

function validateAllocationConfig(cfg: Json, f: string, names: Set<string>, c: Causes): void {
  if (!isObject(cfg)) {
    c.invalid(f, cfg, 'must be an object');
    return;
  }
  const source = cfg.source;
  const sources = ['FromClaim', 'FromClass'];
  if (source === undefined || source === null || source === '') c.required(`${f}.source`);
  else if (typeof source !== 'string' || !sources.includes(source)) c.notSupported(`${f}.source`, source, sources);
  const requests = cfg.requests ?? [];
  if (!Array.isArray(requests)) c.invalid(`${f}.requests`, requests, 'must be a list');
  else if (requests.length > CLAIM_LIMITS.requests) c.tooMany(`${f}.requests`, requests.length, CLAIM_LIMITS.requests);
  else {
    const seen = new Set<string>();
    requests.forEach((n, i) => {
      validateRequestRef(n, `${f}.requests[${i}]`, names, c);
      const key = str(n) ?? show(n);
      if (seen.has(key)) c.duplicate(`${f}.requests[${i}]`, key);
      seen.add(key);
    });
  }
  validateDeviceConfiguration(cfg, f, c);
}

/** The claim's consumed capacities in canonical form (a value that is no quantity fails decoding). */
function normaliseClaimStatus(status: Json | undefined): void {
  if (!isObject(status) || !isObject(status.allocation) || !isObject(status.allocation.devices)) return;
  const results = status.allocation.devices.results;
  for (const r of Array.isArray(results) ? results : []) {
    if (!isObject(r) || !isObject(r.consumedCapacity)) continue;
    for (const [k, v] of Object.entries(r.consumedCapacity)) r.consumedCapacity[k] = canonQuantity(v, 'ResourceClaim');
  }
}

// ---- DeviceClasses ----

const QUALIFIED_NAME_PART = /^([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]$/;

/** IsQualifiedName of k8s.io/apimachinery: `[prefix/]name`, a DNS subdomain prefix, a name ≤ 63. */
function isQualifiedName(s: string): boolean {
  const parts = s.split('/');
  if (parts.length > 2) return false;
  const name = parts.at(-1) ?? '';
  if (parts.length === 2 && (parts[0] === '' || !isDnsSubdomain(parts[0] ?? ''))) return false;
  return name.length > 0 && name.length <= 63 && QUALIFIED_NAME_PART.test(name);
}

/**
 * IsExtendedResourceName (pkg/apis/core/v1/helper): a name with a domain that is not kubernetes.io's,
 * not starting `requests.`, that stays a qualified name with `requests.` in front (as quotas name it).
 */
export function isExtendedResourceName(name: string): boolean {
  if (!name.includes('/') || name.includes('kubernetes.io/') || name.startsWith('requests.')) return false;
  return isQualifiedName(`requests.${name}`);
}

/** A DeviceClass as ValidateDeviceClass checks it (CEL is not compiled here: an expression must only be there). */
function validateClassSpec(spec: Json | undefined, c: Causes): void {
  if (spec === undefined || spec === null) return;
  if (!isObject(spec)) {
    c.invalid('spec', spec, 'must be an object');
    return;
  }
  const selectors = spec.selectors ?? [];
  if (!Array.isArray(selectors)) c.invalid('spec.selectors', selectors, 'must be a list');
  else if (selectors.length > CLAIM_LIMITS.selectors)
    c.tooMany('spec.selectors', selectors.length, CLAIM_LIMITS.selectors);
  else
    selectors.forEach((sel, i) => {
      const f = `spec.selectors[${i}]`;
      if (!isObject(sel) || !isObject(sel.cel)) c.required(`${f}.cel`);
      else {
        const expr = sel.cel.expression;
        if (typeof expr !== 'string' || expr.trim() === '') c.required(`${f}.cel.expression`, 'compilation failed');
        else if (expr.length > CLAIM_LIMITS.celExpression) c.tooLong(`${f}.cel.expression`, CLAIM_LIMITS.celExpression);
      }
    });
  const config = spec.config ?? [];
  if (!Array.isArray(config)) c.invalid('spec.config', config, 'must be a list');
  else if (config.length > CLAIM_LIMITS.config) c.tooMany('spec.config', config.length, CLAIM_LIMITS.config);
  else
    config.forEach((cfg, i) => {
      if (!isObject(cfg)) c.invalid(`spec.config[${i}]`, cfg, 'must be an object');
      else validateDeviceConfiguration(cfg, `spec.config[${i}]`, c);
    });
  // Unique across classes it need not be: the newest class with a name serves it.
  const ern = spec.extendedResourceName;
  if (ern !== undefined && ern !== null && (typeof ern !== 'string' || !isExtendedResourceName(ern)))
    c.invalid('spec.extendedResourceName', ern, 'must be a valid extended resource name');
}

// ---- stored form ----

const KNOWN: Record<string, readonly string[]> = {
  top: ['apiVersion', 'kind', 'metadata', 'spec'],
  metadata: [
    'name',
    'generateName',
    'namespace',
    'uid',
    'resourceVersion',
    'generation',
    'creationTimestamp',
    'labels',
    'annotations',
    'ownerReferences',
    'finalizers',
    'deletionTimestamp',
    'deletionGracePeriodSeconds',
    'managedFields',
    'selfLink',
  ],
  spec: [
    'driver',
    'pool',
    'nodeName',
    'nodeSelector',
    'allNodes',
    'perDeviceNodeSelection',
    'devices',
    'sharedCounters',
  ],
  pool: ['name', 'generation', 'resourceSliceCount'],
  device: [
    'name',
    'attributes',
    'capacity',
    'consumesCounters',
    'nodeName',
    'nodeSelector',
    'allNodes',
    'taints',
    'bindsToNode',
    'bindingConditions',
    'bindingFailureConditions',
    'allowMultipleAllocations',
  ],
  attribute: ['int', 'bool', 'string', 'version'],
  capacity: ['value', 'requestPolicy'],
  requestPolicy: ['default', 'validValues', 'validRange'],
  validRange: ['min', 'max', 'step'],
  taint: ['key', 'value', 'effect', 'timeAdded'],
  classSpec: ['selectors', 'config', 'extendedResourceName'],
  selector: ['cel'],
  cel: ['expression'],
  classConfig: ['opaque'],
  opaque: ['driver', 'parameters'],
};

function keep(o: JsonObject, kind: string, at: string, unknown: string[]): JsonObject {
  const known = KNOWN[kind] ?? [];
  const out: JsonObject = {};
  for (const [k, v] of Object.entries(o)) {
    if (known.includes(k)) out[k] = v;
    else unknown.push(at === '' ? k : `${at}.${k}`);
  }
  return out;
}

function now(): string {
  return new Date().toISOString().replace(/\.\d+Z$/, 'Z');
}

/**
 * A quantity field in canonical form; one that is not a quantity fails decoding, as in the real server
 * (400 BadRequest, before validation). JSON numbers are quantities too.
 */
function canonValue(o: JsonObject, key = 'value', kind = 'ResourceSlice'): void {
  const v = o[key];
  if (v === undefined || v === null) return;
  o[key] = canonQuantity(v, kind);
}

/** One quantity in canonical form; one that is not a quantity fails decoding (400 BadRequest). */
function canonQuantity(v: Json, kind: string): string {
  const canon = typeof v === 'string' || typeof v === 'number' ? canonicalQuantity(String(v)) : undefined;
  if (canon === undefined) {
    throw badRequest(
      `${kind} in version "v1" cannot be handled as a ${kind}: quantities must match the ` +
        `regular expression '^([+-]?[0-9.]+)([eEinumkKMGTP]*[-+]?[0-9]*)$' (got ${JSON.stringify(v)})`,
    );
  }
  return canon;
}

/** A capacity's requestPolicy as stored: known fields only, every quantity canonical. */
function normalisePolicy(cap: JsonObject, at: string, unknown: string[]): void {
  if (!isObject(cap.requestPolicy)) return;
  const policy = keep(cap.requestPolicy, 'requestPolicy', `${at}.requestPolicy`, unknown);
  canonValue(policy, 'default');
  if (Array.isArray(policy.validValues))
    policy.validValues = policy.validValues.map((v) => canonQuantity(v, 'ResourceSlice'));
  if (isObject(policy.validRange)) {
    const range = keep(policy.validRange, 'validRange', `${at}.requestPolicy.validRange`, unknown);
    for (const k of ['min', 'max', 'step']) canonValue(range, k);
    policy.validRange = range;
  }
  cap.requestPolicy = policy;
}

/** The slice as the server stores it: unknown fields out, quantities canonical, timeAdded filled. */
function normalise(body: JsonObject, unknown: string[]): JsonObject {
  const top = keep(body, 'top', '', unknown);
  if (isObject(top.metadata)) top.metadata = keep(top.metadata, 'metadata', 'metadata', unknown);
  if (!isObject(top.spec)) return top;
  const spec = keep(top.spec, 'spec', 'spec', unknown);
  top.spec = spec;
  if (isObject(spec.pool)) spec.pool = keep(spec.pool, 'pool', 'spec.pool', unknown);
  const canonCounters = (list: Json | undefined): void => {
    if (!Array.isArray(list)) return;
    for (const set of list) {
      if (!isObject(set) || !isObject(set.counters)) continue;
      for (const v of Object.values(set.counters)) if (isObject(v)) canonValue(v);
    }
  };
  canonCounters(spec.sharedCounters);
  const devices = spec.devices;
  if (Array.isArray(devices)) {
    spec.devices = devices.map((d, i) => {
      if (!isObject(d)) return d;
      const at = `spec.devices[${i}]`;
      const dev = keep(d, 'device', at, unknown);
      if (isObject(dev.attributes)) {
        for (const [k, v] of Object.entries(dev.attributes))
          if (isObject(v)) dev.attributes[k] = keep(v, 'attribute', `${at}.attributes[${k}]`, unknown);
      }
      if (isObject(dev.capacity)) {
        for (const [k, v] of Object.entries(dev.capacity)) {
          if (!isObject(v)) continue;
          const cap = keep(v, 'capacity', `${at}.capacity[${k}]`, unknown);
          canonValue(cap);
          normalisePolicy(cap, `${at}.capacity[${k}]`, unknown);
          dev.capacity[k] = cap;
        }
      }
      canonCounters(dev.consumesCounters);
      if (Array.isArray(dev.taints)) {
        dev.taints = dev.taints.map((t, j) => {
          if (!isObject(t)) return t;
          const taint = keep(t, 'taint', `${at}.taints[${j}]`, unknown);
          if (taint.timeAdded === undefined || taint.timeAdded === null) taint.timeAdded = now();
          return taint;
        });
      }
      return dev;
    });
  }
  return top;
}

/** A DeviceClass as the server stores it: unknown fields out. */
function normaliseClass(body: JsonObject, unknown: string[]): JsonObject {
  const top = keep(body, 'top', '', unknown);
  if (isObject(top.metadata)) top.metadata = keep(top.metadata, 'metadata', 'metadata', unknown);
  if (!isObject(top.spec)) return top;
  const spec = keep(top.spec, 'classSpec', 'spec', unknown);
  top.spec = spec;
  if (Array.isArray(spec.selectors))
    spec.selectors = spec.selectors.map((sel, i) => {
      if (!isObject(sel)) return sel;
      const out = keep(sel, 'selector', `spec.selectors[${i}]`, unknown);
      if (isObject(out.cel)) out.cel = keep(out.cel, 'cel', `spec.selectors[${i}].cel`, unknown);
      return out;
    });
  if (Array.isArray(spec.config))
    spec.config = spec.config.map((cfg, i) => {
      if (!isObject(cfg)) return cfg;
      const out = keep(cfg, 'classConfig', `spec.config[${i}]`, unknown);
      if (isObject(out.opaque)) out.opaque = keep(out.opaque, 'opaque', `spec.config[${i}].opaque`, unknown);
      return out;
    });
  return top;
}

function clone<T extends Json>(v: T): T {
  return structuredClone(v);
}

function meta(o: JsonObject): JsonObject {
  return isObject(o.metadata) ? o.metadata : {};
}

function str(v: Json | undefined): string | undefined {
  return typeof v === 'string' ? v : undefined;
}

// ---- selectors ----

type Requirement = { key: string; op: '=' | '!='; value: string };

function parseSelector(s: string, what: string): Requirement[] {
  if (s.trim() === '') return [];
  return s.split(',').map((part) => {
    const m = /^\s*([^=!\s]+)\s*(==|=|!=)\s*([^=!\s]*)\s*$/.exec(part);
    if (m === null)
      throw badRequest(
        `unable to parse requested ${what} selector "${s}": expected key=value, key==value or key!=value`,
      );
    return { key: m[1] ?? '', op: m[2] === '!=' ? '!=' : '=', value: m[3] ?? '' };
  });
}

const SLICE_FIELDS: Record<string, (o: JsonObject) => string> = {
  'metadata.name': (o) => str(meta(o).name) ?? '',
  'spec.nodeName': (o) => str(isObject(o.spec) ? o.spec.nodeName : undefined) ?? '',
  'spec.driver': (o) => str(isObject(o.spec) ? o.spec.driver : undefined) ?? '',
};

// ---- the server ----

interface Route {
  resource: 'resourceslices' | 'deviceclasses' | 'resourceclaims' | 'nodes' | 'selfsubjectaccessreviews';
  group: string;
  namespace?: string;
  name?: string;
}

function route(path: string): Route | undefined {
  const parts = path
    .split('/')
    .filter((p) => p !== '')
    .map(decodeURIComponent);
  const [a, b, c, d, e, f, g] = parts;
  if (a === 'apis' && b === GROUP && c === 'v1') {
    if ((d === 'resourceslices' || d === 'deviceclasses') && parts.length <= 5)
      return { resource: d, group: GROUP, ...(e !== undefined ? { name: e } : {}) };
    if (d === 'namespaces' && e !== undefined && f === 'resourceclaims' && g !== undefined && parts.length === 7)
      return { resource: 'resourceclaims', group: GROUP, namespace: e, name: g };
  }
  if (
    a === 'apis' &&
    b === 'authorization.k8s.io' &&
    c === 'v1' &&
    d === 'selfsubjectaccessreviews' &&
    parts.length === 4
  )
    return { resource: 'selfsubjectaccessreviews', group: 'authorization.k8s.io' };
  if (a === 'api' && b === 'v1' && c === 'nodes' && d !== undefined && parts.length === 4)
    return { resource: 'nodes', group: '', name: d };
  return undefined;
}

const GENERATE_ALPHABET = 'bcdfghjklmnpqrstvwxz2456789';

export class ApiServerStandIn extends EventEmitter implements SliceJanitor {
  readonly requests: RequestRecord[] = [];
  /** Slices by name, as stored. */
  readonly slices = new Map<string, JsonObject>();
  /** DeviceClasses by name, as stored. */
  readonly classes = new Map<string, JsonObject>();
  private readonly claims = new Map<string, JsonObject>();
  private readonly nodes = new Map<string, JsonObject>();
  private opts: ApiServerOptions;
  /** The https server's raw connections (see makeServer). */
  private readonly sockets = new Set<Socket>();
  private server: Server;
  private address: { port: number } | { path: string } | undefined;
  private rv = 1000;
  private readonly faults = new FaultTable();
  /** The open watches of ResourceSlices and their event history (apiserver-watch.ts). */
  readonly watches: WatchHub;

  private constructor(opts: ApiServerOptions) {
    super();
    this.opts = opts;
    this.watches = new WatchHub(opts.watchHistory);
    this.server = this.makeServer();
  }

  static async start(opts: ApiServerOptions = {}): Promise<ApiServerStandIn> {
    const s = new ApiServerStandIn(opts);
    await s.up();
    return s;
  }

  /** http(s)://127.0.0.1:<port> (for a unix socket: http://localhost, with `socketPath` to dial). */
  get url(): string {
    if (this.address === undefined) throw new Error('API server stand-in has not listened yet');
    const scheme = this.opts.tls === undefined ? 'http' : 'https';
    return 'port' in this.address ? `${scheme}://127.0.0.1:${this.address.port}` : 'http://localhost';
  }

  /** The certificates the next up() serves with (after a restart(): a rotated serving certificate or client CA). */
  useTls(tls: StandInTls): void {
    this.opts = { ...this.opts, tls };
  }

  /** The cluster upgraded in place: what GET /version says and the DRAPartitionableDevices gate from now on. */
  upgrade(to: Pick<ApiServerOptions, 'version' | 'partitionableDevices'>): void {
    this.opts = { ...this.opts, ...to };
  }

  get socketPath(): string | undefined {
    return this.opts.socketPath;
  }

  private makeServer(): Server {
    const handler = (req: IncomingMessage, res: ServerResponse): void => void this.handle(req, res);
    const tls = this.opts.tls;
    if (tls === undefined) return createServer(handler);
    // Client certificates are asked for and judged per request (authenticate), as the API server does.
    const client = tls.clientCa === undefined ? {} : { ca: tls.clientCa, requestCert: true, rejectUnauthorized: false };
    const server = createHttpsServer({ cert: tls.cert, key: tls.key, ...client }, handler);
    // A connection still in its TLS handshake (a client that does not trust the certificate) is no HTTP
    // connection yet, which closeAllConnections() leaves open: down() ends these itself.
    server.on('connection', (socket: Socket) => {
      this.sockets.add(socket);
      socket.once('close', () => this.sockets.delete(socket));
    });
    return server;
  }

  /** Listens (again, on the same address after down()). */
  async up(): Promise<void> {
    if (this.server.listening) return;
    this.server = this.makeServer();
    const path = this.opts.socketPath;
    if (path !== undefined) await rm(path, { force: true });
    await new Promise<void>((resolve, reject) => {
      this.server.once('error', reject);
      const done = (): void => {
        this.server.off('error', reject);
        resolve();
      };
      if (path !== undefined) this.server.listen(path, done);
      else
        this.server.listen(
          this.address !== undefined && 'port' in this.address ? this.address.port : 0,
          '127.0.0.1',
          done,
        );
    });
    this.address = path !== undefined ? { path } : { port: (this.server.address() as AddressInfo).port };
    this.emit('up');
  }

  /** Stops listening and drops every connection: clients see connection refused until up(). */
  async down(): Promise<void> {
    if (!this.server.listening) return;
    const closed = new Promise<void>((resolve) => this.server.close(() => resolve()));
    this.server.closeAllConnections();
    for (const socket of this.sockets) socket.destroy();
    await closed;
    this.emit('down');
  }

  async stop(): Promise<void> {
    await this.down();
    if (this.opts.socketPath !== undefined) await rm(this.opts.socketPath, { force: true });
    this.removeAllListeners();
  }

  private nextRv(): string {
    this.rv += 1;
    return String(this.rv);
  }

  /** Seeds a Node (GET /api/v1/nodes/<name>). */
  putNode(name: string, labels: Record<string, string> = {}): JsonObject {
    const node: JsonObject = {
      apiVersion: 'v1',
      kind: 'Node',
      metadata: { name, uid: randomUUID(), resourceVersion: this.nextRv(), creationTimestamp: now(), labels },
    };
    this.nodes.set(name, node);
    return clone(node);
  }

  /**
   * Seeds a ResourceClaim (spec and status as given; metadata filled) as the API server would have
   * stored it: its allocation validated as a status update is (request references, driver, pool and
   * device names, shareID a normalised UID, config sources, requests and opaque parameters) and its
   * consumed capacities canonical. Invalid: throws the 422 Status's error (HttpError, `status`
   * holding the Status). Without a spec, one is made with a request for each name the allocation uses.
   */
  putClaim(claim: {
    namespace: string;
    name: string;
    uid?: string;
    spec?: JsonObject;
    status?: JsonObject;
  }): JsonObject {
    const stored: JsonObject = {
      apiVersion: API_VERSION,
      kind: 'ResourceClaim',
      metadata: {
        name: claim.name,
        namespace: claim.namespace,
        uid: claim.uid ?? randomUUID(),
        resourceVersion: this.nextRv(),
        creationTimestamp: now(),
      },
      spec: claim.spec ?? specFor(claim.status),
      ...(claim.status !== undefined ? { status: clone(claim.status) } : {}),
    };
    const c = new Causes();
    if (!isDnsSubdomain(claim.name)) c.invalid('metadata.name', claim.name, DNS_SUBDOMAIN_MSG);
    validateClaimStatus(stored.status, requestNamesOf(stored.spec), c);
    if (c.list.length > 0) throw invalid('ResourceClaim', claim.name, c.list);
    normaliseClaimStatus(stored.status);
    this.claims.set(`${claim.namespace}/${claim.name}`, stored);
    return clone(stored);
  }

  deleteClaim(namespace: string, name: string): boolean {
    return this.claims.delete(`${namespace}/${name}`);
  }

  /** The kubelet's clean-up (SliceJanitor): deletes the node's slices, of one driver or all. */
  deleteNodeSlices(nodeName: string, driver?: string): number {
    let n = 0;
    for (const [name, s] of this.slices) {
      const spec = isObject(s.spec) ? s.spec : {};
      if (spec.nodeName === nodeName && (driver === undefined || spec.driver === driver)) {
        this.slices.delete(name);
        const rv = this.nextRv();
        this.changed('DELETED', { ...s, metadata: { ...meta(s), resourceVersion: rv } }, rv);
        n++;
      }
    }
    return n;
  }

  /** Resolves once `n` requests matching pred have been answered. */
  waitForRequests(pred: (r: RequestRecord) => boolean, n = 1, timeoutMs = 10_000): Promise<RequestRecord[]> {
    const probe = (): RequestRecord[] | undefined => {
      const got = this.requests.filter(pred);
      return got.length >= n ? got : undefined;
    };
    const now0 = probe();
    if (now0 !== undefined) return Promise.resolve(now0);
    return new Promise((resolve, reject) => {
      const on = (): void => {
        const v = probe();
        if (v !== undefined) {
          clearTimeout(timer);
          this.off('request', on);
          resolve(v);
        }
      };
      const timer = setTimeout(() => {
        this.off('request', on);
        reject(
          new Error(
            `API server stand-in: fewer than ${n} matching requests within ${timeoutMs} ms ` +
              `(seen: ${this.requests.map((r) => `${r.method} ${r.path} ${r.code}`).join('; ')})`,
          ),
        );
      }, timeoutMs);
      this.on('request', on);
    });
  }

  // ---- fault injection (apiserver-faults.ts) ----

  /** The next `rule.times` requests matching the rule go wrong as it says. */
  fault(rule: FaultRule): Fault {
    return this.faults.add(rule);
  }

  clearFaults(): void {
    this.faults.clear();
  }

  /** Goes down and comes back on the same address with the same objects (an API server restart). */
  async restart(): Promise<void> {
    await this.down();
    await this.up();
  }

  /** A fault matching the request, carried out: true when it was answered (or cut) there. */
  private async faulted(req: IncomingMessage, res: ServerResponse, url: URL, method: string): Promise<boolean> {
    const action = this.faults.take(method, url);
    if (action === undefined) return false;
    const code = await applyFault(action, req, res);
    if (code < 0) return false;
    this.requests.push({ method, path: url.pathname + url.search, user: undefined, code });
    this.emit('request');
    this.emit('fault', method, url.pathname + url.search, code);
    return true;
  }

  // ---- watch (apiserver-watch.ts) and changes by another client ----

  /** A BOOKMARK at the current resourceVersion to the open watches that asked for bookmarks. */
  bookmark(): void {
    this.watches.bookmark(this.rv, API_VERSION, 'ResourceSlice');
  }

  /** Drops the watch history (etcd's compaction): a watch from a resourceVersion before now gets 410. */
  compact(): void {
    this.watches.compact(this.rv);
  }

  /** Ends every open watch (abruptly, or with a 410 ERROR event); how many there were. */
  cutWatches(gone = false): number {
    return this.watches.cut(gone);
  }

  /** Another client deletes a slice (`kubectl delete resourceslice`). */
  removeSlice(name: string): void {
    this.remove(name, undefined);
  }

  /** Another client updates a slice (`kubectl edit`): its change applied as an unconditional update. */
  editSlice(name: string, change: (s: JsonObject) => void): JsonObject {
    const cur = this.slices.get(name);
    if (cur === undefined) throw notFound('resourceslices', GROUP, name);
    const next = clone(cur);
    change(next);
    delete meta(next).resourceVersion;
    return this.update(name, new URL('http://stand-in/'), next).body as JsonObject;
  }

  private changed(type: EventType, object: JsonObject, rv: string): void {
    this.watches.record(type, clone(object), Number(rv));
  }

  private sliceWatch(req: IncomingMessage, res: ServerResponse, url: URL): void {
    const matches = this.sliceMatcher(url);
    this.watches.serve(req, res, url, matches, () => [...this.slices.values()].filter(matches).map(clone));
  }

  private async handle(req: IncomingMessage, res: ServerResponse): Promise<void> {
    const url = new URL(req.url ?? '/', 'http://stand-in');
    const method = req.method ?? 'GET';
    if (await this.faulted(req, res, url, method)) return;
    let user: string | undefined;
    let code = 500;
    const headers: Record<string, string> = { 'content-type': 'application/json' };
    let body: Json;
    try {
      const r = route(url.pathname);
      const grant = this.authenticate(req);
      user = grant?.user;
      if (url.pathname === '/version' && method === 'GET') {
        // Open to every authenticated user, as system:discovery makes it on a real API server.
        const v = this.opts.version ?? DEFAULT_VERSION;
        const [, major = '1', minor = '0'] = /^v(\d+)\.(\d+)/.exec(v) ?? [];
        res.writeHead(200, headers);
        res.end(JSON.stringify({ major, minor, gitVersion: v, platform: 'linux/amd64' }));
        this.requests.push({ method, path: url.pathname, user, code: 200 });
        this.emit('request');
        return;
      }
      if (r === undefined)
        throw new HttpError(status(404, 'NotFound', 'the server could not find the requested resource', {}));
      const verb = this.verb(method, r, url);
      this.authorize(grant, verb, r);
      if (verb === 'watch') {
        this.sliceWatch(req, res, url);
        this.requests.push({ method, path: url.pathname + url.search, user, code: 200 });
        this.emit('request');
        this.emit('watch');
        return;
      }
      const input = method === 'POST' || method === 'PUT' || method === 'DELETE' ? await readJson(req) : undefined;
      const out = this.serve(verb, r, url, input, grant);
      code = out.code;
      body = out.body;
      if (out.warnings.length > 0) headers.warning = out.warnings.map((w) => `299 - ${JSON.stringify(w)}`).join(', ');
    } catch (err) {
      const s =
        err instanceof HttpError
          ? err.status
          : status(500, 'InternalError', `Internal error occurred: ${(err as Error).message}`);
      code = s.code;
      body = s as unknown as Json;
    }
    res.writeHead(code, headers);
    res.end(JSON.stringify(body));
    this.requests.push({ method, path: url.pathname + url.search, user, code });
    this.emit('request');
  }

  /** The grant of the request's client certificate or bearer token; undefined when authentication is off. */
  private authenticate(req: IncomingMessage): TokenGrant | undefined {
    const certs = this.opts.clientCertificates;
    const socket = req.socket as TLSSocket;
    if (certs !== undefined && socket.authorized === true) {
      const cn = String(socket.getPeerCertificate().subject?.CN ?? '');
      if (Object.hasOwn(certs, cn)) return certs[cn];
    }
    const tokens = this.opts.tokens;
    if (tokens === undefined && certs !== undefined) throw new HttpError(status(401, 'Unauthorized', 'Unauthorized'));
    if (tokens === undefined) return undefined;
    const m = /^Bearer (.+)$/.exec(req.headers.authorization ?? '');
    const grant = m === null || !Object.hasOwn(tokens, m[1] ?? '') ? undefined : tokens[m[1] ?? ''];
    if (grant === undefined) throw new HttpError(status(401, 'Unauthorized', 'Unauthorized'));
    return grant;
  }

  private verb(method: string, r: Route, url: URL): string {
    if (url.searchParams.get('watch') === 'true' || url.searchParams.get('watch') === '1') {
      if (r.resource === 'resourceslices' && r.name === undefined && method === 'GET') return 'watch';
      throw new HttpError(
        status(
          405,
          'MethodNotAllowed',
          'watch is modelled by the API server stand-in (test/support/apiserver.ts) for resourceslices only',
        ),
      );
    }
    const collection = r.name === undefined;
    if (r.resource === 'selfsubjectaccessreviews') {
      if (method === 'POST') return 'create';
      throw new HttpError(
        status(
          405,
          'MethodNotAllowed',
          `${method} on ${url.pathname} is not allowed: selfsubjectaccessreviews are only created`,
        ),
      );
    }
    if (r.resource === 'deviceclasses') {
      if (method === 'GET') return collection ? 'list' : 'get';
      if (method === 'POST' && collection) return 'create';
      if (method === 'DELETE' && !collection) return 'delete';
      throw new HttpError(
        status(
          405,
          'MethodNotAllowed',
          `${method} on ${url.pathname} is not modelled by the API server ` +
            `stand-in (test/support/apiserver.ts): deviceclasses are created, read, listed and deleted`,
        ),
      );
    }
    if (r.resource !== 'resourceslices') {
      if (method === 'GET') return 'get';
      throw new HttpError(
        status(
          405,
          'MethodNotAllowed',
          `${method} on ${url.pathname} is not modelled by the API server ` +
            `stand-in (test/support/apiserver.ts): only get of ${r.resource}`,
        ),
      );
    }
    switch (method) {
      case 'GET':
        return collection ? 'list' : 'get';
      case 'POST':
        if (collection) return 'create';
        break;
      case 'PUT':
        if (!collection) return 'update';
        break;
      case 'DELETE':
        return collection ? 'deletecollection' : 'delete';
    }
    throw new HttpError(
      status(
        405,
        'MethodNotAllowed',
        `${method} on ${url.pathname} is not modelled by the API server stand-in (test/support/apiserver.ts)`,
      ),
    );
  }

  private authorize(grant: TokenGrant | undefined, verb: string, r: Route): void {
    if (grant === undefined || r.resource === 'selfsubjectaccessreviews') return;
    const user = grant.user;
    if (allows(grant, verb, r.resource)) return;
    const what =
      r.name !== undefined ? `${qualified(r.resource, r.group)} "${r.name}"` : qualified(r.resource, r.group);
    const scope = r.namespace !== undefined ? `in the namespace "${r.namespace}"` : 'at the cluster scope';
    throw new HttpError(
      status(
        403,
        'Forbidden',
        `${what} is forbidden: User "${user}" cannot ${verb} ` +
          `resource "${r.resource}" in API group "${r.group}" ${scope}`,
        { ...(r.name !== undefined ? { name: r.name } : {}), group: r.group, kind: r.resource },
      ),
    );
  }

  private serve(
    verb: string,
    r: Route,
    url: URL,
    input: Json | undefined,
    grant?: TokenGrant,
  ): { code: number; body: Json; warnings: string[] } {
    if (r.resource === 'selfsubjectaccessreviews') return { code: 201, body: accessReview(input, grant), warnings: [] };
    if (r.resource === 'deviceclasses') return this.serveClass(verb, r.name ?? '', url, input);
    if (r.resource === 'nodes' || r.resource === 'resourceclaims') {
      const key = r.resource === 'nodes' ? (r.name ?? '') : `${r.namespace ?? ''}/${r.name ?? ''}`;
      const o = (r.resource === 'nodes' ? this.nodes : this.claims).get(key);
      if (o === undefined) throw notFound(r.resource, r.group, r.name ?? '');
      return { code: 200, body: clone(o), warnings: [] };
    }
    switch (verb) {
      case 'list':
        return { code: 200, body: this.list(url), warnings: [] };
      case 'get': {
        const s = this.slices.get(r.name ?? '');
        if (s === undefined) throw notFound('resourceslices', GROUP, r.name ?? '');
        return { code: 200, body: clone(s), warnings: [] };
      }
      case 'create':
        return this.create(url, input);
      case 'update':
        return this.update(r.name ?? '', url, input);
      case 'delete':
        return this.remove(r.name ?? '', input);
      case 'deletecollection': {
        // As the kubelet wipes a node's slices: DELETE on the collection with a fieldSelector.
        const list = this.list(url);
        const items = list.items as JsonObject[];
        for (const i of items) {
          const name = str(meta(i).name) ?? '';
          const gone = this.slices.get(name) as JsonObject;
          this.slices.delete(name);
          const rv = this.nextRv();
          this.changed('DELETED', { ...gone, metadata: { ...meta(gone), resourceVersion: rv } }, rv);
        }
        return { code: 200, body: { ...list, metadata: { resourceVersion: String(this.rv) } }, warnings: [] };
      }
    }
    throw new Error(`unexpected verb ${verb}`);
  }

  /**
   * Seeds a DeviceClass as a create through the API would (validated, unknown fields dropped): the
   * stored object, or throws the Status's error (HttpError) — AlreadyExists, Invalid.
   */
  putDeviceClass(input: JsonObject): JsonObject {
    return this.createClass(new URL('http://stand-in/'), input).body as JsonObject;
  }

  private serveClass(
    verb: string,
    name: string,
    url: URL,
    input: Json | undefined,
  ): { code: number; body: Json; warnings: string[] } {
    if (verb === 'create') return this.createClass(url, input);
    if (verb === 'list') {
      const items = [...this.classes.values()]
        .sort((a, b) => (str(meta(a).name) ?? '').localeCompare(str(meta(b).name) ?? ''))
        .map((o) => {
          const { apiVersion: _a, kind: _k, ...item } = clone(o);
          return item;
        });
      const body = {
        kind: 'DeviceClassList',
        apiVersion: API_VERSION,
        metadata: { resourceVersion: String(this.rv) },
        items,
      };
      return { code: 200, body, warnings: [] };
    }
    const stored = this.classes.get(name);
    if (stored === undefined) throw notFound('deviceclasses', GROUP, name);
    if (verb === 'get') return { code: 200, body: clone(stored), warnings: [] };
    this.classes.delete(name);
    this.nextRv();
    const ok: Status = {
      kind: 'Status',
      apiVersion: 'v1',
      metadata: {},
      status: 'Success',
      details: { name, group: GROUP, kind: 'deviceclasses', uid: String(meta(stored).uid) },
      code: 200,
    };
    return { code: 200, body: ok as unknown as Json, warnings: [] };
  }

  private createClass(url: URL, input: Json | undefined): { code: number; body: Json; warnings: string[] } {
    if (!isObject(input)) throw badRequest('the request body must be a DeviceClass JSON object');
    if (input.apiVersion !== undefined && input.apiVersion !== API_VERSION)
      throw badRequest(
        `the API version in the data (${String(input.apiVersion)}) does not ` +
          `match the expected API version (${API_VERSION})`,
      );
    if (input.kind !== undefined && input.kind !== 'DeviceClass')
      throw badRequest(`the kind in the data (${String(input.kind)}) does not match the expected kind (DeviceClass)`);
    const unknown: string[] = [];
    const obj = normaliseClass(clone(input), unknown);
    if (url.searchParams.get('fieldValidation') === 'Strict' && unknown.length > 0)
      throw badRequest(
        `DeviceClass in version "v1" cannot be handled as a DeviceClass: strict decoding error: ` +
          unknown.map((u) => `unknown field "${u}"`).join(', '),
      );
    const m = meta(obj);
    const name = str(m.name) ?? '';
    const c = new Causes();
    if (name === '') c.required('metadata.name', 'name or generateName is required');
    else if (!isDnsSubdomain(name)) c.invalid('metadata.name', name, DNS_SUBDOMAIN_MSG);
    validateClassSpec(obj.spec, c);
    if (c.list.length > 0) throw invalid('DeviceClass', name, c.list);
    if (this.classes.has(name))
      throw new HttpError(
        status(409, 'AlreadyExists', `deviceclasses.${GROUP} "${name}" already exists`, {
          name,
          group: GROUP,
          kind: 'deviceclasses',
        }),
      );
    const stored: JsonObject = {
      ...obj,
      apiVersion: API_VERSION,
      kind: 'DeviceClass',
      metadata: {
        ...m,
        name,
        uid: randomUUID(),
        resourceVersion: this.nextRv(),
        generation: 1,
        creationTimestamp: now(),
      },
    };
    this.classes.set(name, stored);
    const warnings =
      url.searchParams.get('fieldValidation') === 'Ignore' ? [] : unknown.map((u) => `unknown field "${u}"`);
    return { code: 201, body: clone(stored), warnings };
  }

  /** The request's field and label selectors as a test of one slice (400 for an unsupported field). */
  private sliceMatcher(url: URL): (s: JsonObject) => boolean {
    const fields = parseSelector(url.searchParams.get('fieldSelector') ?? '', 'field');
    for (const f of fields) {
      if (!(f.key in SLICE_FIELDS)) throw badRequest(`field label not supported: ${f.key}`);
    }
    const labels = parseSelector(url.searchParams.get('labelSelector') ?? '', 'label');
    const match = (req: Requirement, v: string): boolean => (req.op === '=' ? v === req.value : v !== req.value);
    return (s) => {
      if (!fields.every((f) => match(f, SLICE_FIELDS[f.key]?.(s) ?? ''))) return false;
      const l = meta(s).labels;
      return labels.every((q) => match(q, isObject(l) ? (str(l[q.key]) ?? '') : ''));
    };
  }

  private list(url: URL): JsonObject {
    const matches = this.sliceMatcher(url);
    const items: Json[] = [];
    for (const s of [...this.slices.values()].sort((a, b) =>
      (str(meta(a).name) ?? '').localeCompare(str(meta(b).name) ?? ''),
    )) {
      if (!matches(s)) continue;
      const item = clone(s);
      delete item.apiVersion;
      delete item.kind;
      items.push(item);
    }
    return {
      kind: 'ResourceSliceList',
      apiVersion: API_VERSION,
      metadata: { resourceVersion: String(this.rv) },
      items,
    };
  }

  private decodeSlice(input: Json | undefined, url: URL): { obj: JsonObject; warnings: string[] } {
    if (!isObject(input)) throw badRequest('the request body must be a ResourceSlice JSON object');
    const apiVersion = input.apiVersion;
    const kind = input.kind;
    if (apiVersion !== undefined && apiVersion !== API_VERSION)
      throw badRequest(
        `the API version in the data (${String(apiVersion)}) does not match the expected API version (${API_VERSION})`,
      );
    if (kind !== undefined && kind !== 'ResourceSlice')
      throw badRequest(`the kind in the data (${String(kind)}) does not match the expected kind (ResourceSlice)`);
    const unknown: string[] = [];
    const obj = normalise(clone(input), unknown);
    const mode = url.searchParams.get('fieldValidation') ?? 'Warn';
    if (mode === 'Strict' && unknown.length > 0) {
      throw badRequest(
        `ResourceSlice in version "v1" cannot be handled as a ResourceSlice: strict ` +
          `decoding error: ${unknown.map((u) => `unknown field "${u}"`).join(', ')}`,
      );
    }
    return { obj, warnings: mode === 'Ignore' ? [] : unknown.map((u) => `unknown field "${u}"`) };
  }

  private validate(obj: JsonObject, name: string, old?: JsonObject): void {
    const gate = this.opts.partitionableDevices ?? partitionableByDefault(this.opts.version ?? DEFAULT_VERSION);
    if (!gate) dropDisabledPartitionable(obj.spec, old?.spec);
    const c = new Causes();
    if (!isDnsSubdomain(name)) c.invalid('metadata.name', name, DNS_SUBDOMAIN_MSG);
    validateSpec(obj.spec, c);
    if (old !== undefined && isObject(old.spec) && isObject(obj.spec)) {
      const o = old.spec;
      const n = obj.spec;
      const poolName = (s: JsonObject): Json | undefined => (isObject(s.pool) ? s.pool.name : undefined);
      if (n.driver !== o.driver) c.invalid('spec.driver', n.driver, 'field is immutable');
      if (poolName(n) !== poolName(o)) c.invalid('spec.pool.name', poolName(n), 'field is immutable');
      if ((n.nodeName ?? null) !== (o.nodeName ?? null)) c.invalid('spec.nodeName', n.nodeName, 'field is immutable');
    }
    if (c.list.length > 0) throw invalid('ResourceSlice', name, c.list);
  }

  private create(url: URL, input: Json | undefined): { code: number; body: Json; warnings: string[] } {
    const { obj, warnings } = this.decodeSlice(input, url);
    const m = meta(obj);
    let name = str(m.name) ?? '';
    const generate = str(m.generateName);
    if (name === '' && generate !== undefined && generate !== '') {
      do {
        name =
          generate +
          Array.from({ length: 5 }, () => GENERATE_ALPHABET[Math.floor(Math.random() * GENERATE_ALPHABET.length)]).join(
            '',
          );
      } while (this.slices.has(name));
    }
    if (name === '')
      throw invalid('ResourceSlice', '', [
        {
          reason: 'FieldValueRequired',
          message: 'Required value: name or generateName is required',
          field: 'metadata.name',
        },
      ]);
    if (str(m.resourceVersion) !== undefined && m.resourceVersion !== '') {
      throw badRequest('resourceVersion should not be set on objects to be created');
    }
    this.validate(obj, name);
    if (this.slices.has(name)) {
      throw new HttpError(
        status(409, 'AlreadyExists', `resourceslices.${GROUP} "${name}" already exists`, {
          name,
          group: GROUP,
          kind: 'resourceslices',
        }),
      );
    }
    const stored: JsonObject = {
      ...obj,
      apiVersion: API_VERSION,
      kind: 'ResourceSlice',
      metadata: {
        ...m,
        name,
        uid: randomUUID(),
        resourceVersion: this.nextRv(),
        generation: 1,
        creationTimestamp: now(),
      },
    };
    this.slices.set(name, stored);
    this.changed('ADDED', stored, String(this.rv));
    return { code: 201, body: clone(stored), warnings };
  }

  private update(name: string, url: URL, input: Json | undefined): { code: number; body: Json; warnings: string[] } {
    const { obj, warnings } = this.decodeSlice(input, url);
    const m = meta(obj);
    if (str(m.name) !== name)
      throw badRequest(`the name of the object (${String(m.name ?? '')}) does not match the name on the URL (${name})`);
    const old = this.slices.get(name);
    if (old === undefined) throw notFound('resourceslices', GROUP, name);
    const oldMeta = meta(old);
    const rv = str(m.resourceVersion);
    if (rv !== undefined && rv !== '' && rv !== oldMeta.resourceVersion) throw conflict('resourceslices', GROUP, name);
    const uid = str(m.uid);
    if (uid !== undefined && uid !== '' && uid !== oldMeta.uid) {
      throw conflict(
        'resourceslices',
        GROUP,
        name,
        `Precondition failed: UID in precondition: ${uid}, UID in object meta: ${String(oldMeta.uid)}`,
      );
    }
    this.validate(obj, name, old);
    // An update that changes nothing is not written: the resourceVersion stays (as with etcd).
    const comparable = (o: JsonObject): string => {
      const { resourceVersion: _rv, uid: _uid, generation: _gen, creationTimestamp: _ct, ...rest } = meta(o);
      return JSON.stringify({ ...o, apiVersion: API_VERSION, kind: 'ResourceSlice', metadata: rest });
    };
    if (comparable(obj) === comparable(old)) return { code: 200, body: clone(old), warnings };
    const specChanged = JSON.stringify(obj.spec) !== JSON.stringify(old.spec);
    const gen = typeof oldMeta.generation === 'number' ? oldMeta.generation : 1;
    const stored: JsonObject = {
      ...obj,
      apiVersion: API_VERSION,
      kind: 'ResourceSlice',
      metadata: {
        ...m,
        name,
        uid: oldMeta.uid ?? null,
        creationTimestamp: oldMeta.creationTimestamp ?? null,
        generation: specChanged ? gen + 1 : gen,
        resourceVersion: this.nextRv(),
      },
    };
    this.slices.set(name, stored);
    this.changed('MODIFIED', stored, String(this.rv));
    return { code: 200, body: clone(stored), warnings };
  }

  private remove(name: string, input: Json | undefined): { code: number; body: Json; warnings: string[] } {
    const old = this.slices.get(name);
    if (old === undefined) throw notFound('resourceslices', GROUP, name);
    const pre = isObject(input) && isObject(input.preconditions) ? input.preconditions : {};
    const oldMeta = meta(old);
    const rv = str(pre.resourceVersion);
    if (rv !== undefined && rv !== oldMeta.resourceVersion) {
      throw conflict(
        'resourceslices',
        GROUP,
        name,
        `Precondition failed: ResourceVersion in precondition: ${rv}, ` +
          `ResourceVersion in object meta: ${String(oldMeta.resourceVersion)}`,
      );
    }
    const uid = str(pre.uid);
    if (uid !== undefined && uid !== oldMeta.uid) {
      throw conflict(
        'resourceslices',
        GROUP,
        name,
        `Precondition failed: UID in precondition: ${uid}, UID in object meta: ${String(oldMeta.uid)}`,
      );
    }
    this.slices.delete(name);
    const rvGone = this.nextRv();
    this.changed('DELETED', { ...old, metadata: { ...oldMeta, resourceVersion: rvGone } }, rvGone);
    const ok: Status = {
      kind: 'Status',
      apiVersion: 'v1',
      metadata: {},
      status: 'Success',
      details: { name, group: GROUP, kind: 'resourceslices', uid: String(oldMeta.uid) },
      code: 200,
    };
    return { code: 200, body: ok as unknown as Json, warnings: [] };
  }
}

/** Whether a grant allows a verb on a resource ("verb resource" pairs, either part "*"). */
function allows(grant: TokenGrant, verb: string, resource: string): boolean {
  return grant.allow.some((a) => {
    const [v, res] = a.split(/\s+/);
    return (v === '*' || v === verb) && (res === '*' || res === resource);
  });
}

/** A SelfSubjectAccessReview answered from the grant (no grant: authorization is off, all allowed). */
function accessReview(input: Json | undefined, grant: TokenGrant | undefined): Json {
  const spec = isObject(input) && isObject(input.spec) ? input.spec : undefined;
  const attrs = spec !== undefined && isObject(spec.resourceAttributes) ? spec.resourceAttributes : undefined;
  if (spec === undefined || attrs === undefined)
    throw invalid('SelfSubjectAccessReview', '', [
      {
        reason: 'FieldValueRequired',
        message: 'Required value: exactly one of nonResourceAttributes or resourceAttributes must be specified',
        field: 'spec.resourceAttributes',
      },
    ]);
  const verb = str(attrs.verb) ?? '';
  const resource = str(attrs.resource) ?? '';
  const allowed = grant === undefined || allows(grant, verb, resource);
  return {
    apiVersion: 'authorization.k8s.io/v1',
    kind: 'SelfSubjectAccessReview',
    metadata: { creationTimestamp: null },
    spec,
    status: allowed
      ? { allowed: true, reason: grant === undefined ? 'authorization is off' : `RBAC: allowed for ${grant.user}` }
      : { allowed: false },
  };
}

async function readJson(req: IncomingMessage): Promise<Json | undefined> {
  const chunks: Buffer[] = [];
  let size = 0;
  for await (const chunk of req) {
    const b = chunk as Buffer;
    size += b.length;
    if (size > MAX_BODY)
      throw new HttpError(status(413, 'RequestEntityTooLarge', `the request body is larger than ${MAX_BODY} bytes`));
    chunks.push(b);
  }
  const text = Buffer.concat(chunks).toString('utf8');
  if (text.trim() === '') return undefined;
  try {
    return JSON.parse(text) as Json;
  } catch (err) {
    throw badRequest(`the request body is not JSON: ${(err as Error).message}`);
  }
}
