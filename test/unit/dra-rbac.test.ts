// The DRA documents the packages ship (packaging/dra/): valid YAML whose objects have the
// fields the API server requires, names that agree with each other (ClusterRole and binding, policy
// and binding, the identity in the kubeconfig steps and in the policy), the policy's CEL doing what
// it says for the node's own and another node's slices, the role letting `check` list DeviceClasses without the
// daemon's start asking for it, and the drop-in opening exactly the directories the options default to.
import { test } from 'node:test';
import { DEFAULT_MPS_ROOT } from '../../src/core/mps.ts';
import { CDI_WRITE_DIR } from '../../src/dra/cdi.ts';
import assert from 'node:assert/strict';
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { draClassesCheck } from '../../src/cli/check-dra-classes.ts';
import type { NodeReport } from '../../src/cli/inspect.ts';
import { KubeClient } from '../../src/k8s/client.ts';
import { loadKubeconfig } from '../../src/k8s/kubeconfig.ts';
import { DRA_ACCESS, checkAccess } from '../../src/k8s/resources.ts';
import { ApiServerStandIn } from '../support/apiserver.ts';
import type { JsonObject } from '../support/apiserver.ts';
import { tokenKubeconfig } from '../support/dra-fixtures.ts';
import { loadYaml } from '../../src/config/config.ts';
import { DEFAULT_DRA_DRIVER_NAME } from '../../src/config/options.ts';
import { OPTION_SPECS } from '../../src/config/option-table.ts';
import { parseUnitSandbox } from '../../src/cli/sandbox.ts';

const ROOT = join(import.meta.dirname, '..', '..');
const DIR = join(ROOT, 'packaging', 'dra');
type Obj = Record<string, unknown>;

function documents(name: string): Obj[] {
  const docs = loadYaml().parseAllDocuments(readFileSync(join(DIR, name), 'utf8'));
  assert.ok(Array.isArray(docs), `${name}: documents`);
  return docs.map((d, i) => {
    assert.deepEqual(d.errors, [], `${name} document ${i}: YAML errors`);
    const js = d.toJS() as unknown;
    assert.ok(typeof js === 'object' && js !== null && !Array.isArray(js), `${name} document ${i} is a mapping`);
    return js as Obj;
  });
}

/** apiVersion, kind, and a metadata.name that is a valid object name (path segment, ≤ 253). */
function object(doc: Obj, apiVersion: string, kind: string): { name: string; spec: Obj } {
  assert.equal(doc.apiVersion, apiVersion);
  assert.equal(doc.kind, kind);
  const name = (doc.metadata as Obj | undefined)?.name;
  assert.ok(
    typeof name === 'string' &&
      name.length > 0 &&
      name.length <= 253 &&
      !/[/%]/.test(name) &&
      name !== '.' &&
      name !== '..',
    `${kind} name ${String(name)}`,
  );
  return { name, spec: (doc.spec ?? {}) as Obj };
}

const strings = (v: unknown, what: string): string[] => {
  assert.ok(
    Array.isArray(v) && v.length > 0 && v.every((x) => typeof x === 'string'),
    `${what}: a non-empty list of strings`,
  );
  return v as string[];
};

test("rbac.yaml: a ClusterRole with exactly what the DRA mode needs, bound to the nodes' group", () => {
  const [role, binding, ...rest] = documents('rbac.yaml');
  assert.equal(rest.length, 0);
  const r = object(role!, 'rbac.authorization.k8s.io/v1', 'ClusterRole');
  const rules = role!.rules as Obj[];
  const verbs = new Set(['get', 'list', 'watch', 'create', 'update', 'patch', 'delete', 'deletecollection']);
  const granted = new Map<string, string[]>();
  for (const rule of rules) {
    const groups = rule.apiGroups as string[];
    assert.ok(Array.isArray(groups) && groups.length > 0);
    for (const v of strings(rule.verbs, 'verbs')) assert.ok(verbs.has(v), `verb ${v}`);
    for (const res of strings(rule.resources, 'resources'))
      for (const g of groups)
        granted.set(`${g}/${res}`, [...(granted.get(`${g}/${res}`) ?? []), ...(rule.verbs as string[])]);
  }
  assert.deepEqual(Object.fromEntries(granted), {
    'resource.k8s.io/resourceslices': ['get', 'list', 'watch', 'create', 'update', 'patch', 'delete'],
    'resource.k8s.io/resourceclaims': ['get'],
    '/nodes': ['get'],
    'resource.k8s.io/deviceclasses': ['list'],
  });
  const b = object(binding!, 'rbac.authorization.k8s.io/v1', 'ClusterRoleBinding');
  assert.ok(b.name);
  assert.deepEqual(binding!.roleRef, { apiGroup: 'rbac.authorization.k8s.io', kind: 'ClusterRole', name: r.name });
  assert.deepEqual(binding!.subjects, [
    { apiGroup: 'rbac.authorization.k8s.io', kind: 'Group', name: 'gpu-device-plugin:nodes' },
  ]);
});

/** The ClusterRole's grants in rbac.yaml as the API server stand-in's "verb resource" pairs. */
function roleGrants(): string[] {
  const rules = documents('rbac.yaml')[0]!.rules as Obj[];
  return rules.flatMap((r) =>
    strings(r.resources, 'resources').flatMap((res) => strings(r.verbs, 'verbs').map((v) => `${v} ${res}`)),
  );
}

const ONE_GPU: NodeReport = {
  library: 'fake',
  driverVersion: '580',
  gpus: [
    {
      index: 0,
      uuid: 'GPU-0',
      name: 'NVIDIA A100-SXM4-80GB',
      minor: 0,
      busId: '00000000:01:00.0',
      memoryBytes: 80 * 2 ** 30,
      numaNode: 0,
      health: 'Healthy',
    },
  ],
  pairs: [[null]],
  mig: null,
};

test(
  "rbac.yaml lets `check` list the cluster's DeviceClasses, which the daemon's start does not ask: " +
    'a role applied before that rule keeps the daemon starting',
  async (t) => {
    const granted = roleGrants();
    const before = granted.filter((g) => g !== 'list deviceclasses');
    assert.equal(before.length, granted.length - 1, 'the role grants list deviceclasses');
    assert.ok(
      DRA_ACCESS.every((n) => n.resource !== 'deviceclasses'),
      "the start's access check does not ask for DeviceClasses",
    );
    const api = await ApiServerStandIn.start({
      tokens: {
        now: { user: 'gpu-device-plugin:node:n', allow: granted },
        old: { user: 'gpu-device-plugin:node:n', allow: before },
      },
    });
    const dir = mkdtempSync(join(tmpdir(), 'gdp-rbac-'));
    t.after(async () => {
      await api.stop();
      rmSync(dir, { recursive: true, force: true });
    });
    api.putDeviceClass(documents('deviceclass.yaml')[0] as JsonObject);
    for (const token of ['now', 'old']) {
      const kubeconfig = join(dir, token);
      writeFileSync(kubeconfig, tokenKubeconfig(api.url, token));
      const client = new KubeClient(await loadKubeconfig(kubeconfig));
      try {
        assert.deepEqual(await checkAccess(client), { ok: true }, `${token} role: the start's access check passes`);
      } finally {
        client.close();
      }
      const [line] = await draClassesCheck(kubeconfig, true, ONE_GPU, 'none', DEFAULT_DRA_DRIVER_NAME);
      if (token === 'now') {
        assert.equal(line?.status, 'PASS', `the shipped role: the classes are listed (${line?.detail})`);
      } else {
        assert.equal(line?.status, 'INFO');
        assert.match(String(line?.detail), /^not checked: .*predates the shipped rbac\.yaml/);
        assert.match(String(line?.fix), /kubectl apply -f \/usr\/share\/doc\/gpu-device-plugin\/dra\/rbac\.yaml$/);
      }
    }
  },
);

/**
 * The policy's CEL, evaluated: the expressions use only member access, `==`, `&&`, `?:`, string
 * literals, startsWith, split, indexing and has(), which mean the same in JavaScript once `==` is
 * `===` and has(x) is "x is defined". Anything else in them fails the translation check below.
 */
function cel(expr: string): (vars: Obj) => unknown {
  const stripped = expr.replace(/'[^']*'/g, "''");
  assert.match(stripped, /^[\w.\s()'[\]=&|?:!+,-]*$/, `CEL outside the translatable subset: ${expr}`);
  assert.doesNotMatch(
    stripped,
    /\b(?:size|matches|exists|all|filter|map|in)\b/,
    `CEL macro outside the subset: ${expr}`,
  );
  const js = expr
    .replace(/==/g, '===')
    .replace(/!===/g, '!==')
    .replace(/\bhas\(([^)]+)\)/g, '($1 !== undefined)');
  // eslint-disable-next-line @typescript-eslint/no-implied-eval
  const f = new Function('request', 'object', 'oldObject', 'variables', `return (${js});`) as (
    ...a: unknown[]
  ) => unknown;
  return (v) => f(v.request, v.object, v.oldObject, v.variables);
}

test(
  'admission-policy.yaml: a ValidatingAdmissionPolicy and binding ' +
    'the API accepts, confining a node to its own ResourceSlices',
  () => {
    const [policy, binding, ...rest] = documents('admission-policy.yaml');
    assert.equal(rest.length, 0);
    const p = object(policy!, 'admissionregistration.k8s.io/v1', 'ValidatingAdmissionPolicy');
    assert.ok(['Fail', 'Ignore'].includes(p.spec.failurePolicy as string));
    const rules = (p.spec.matchConstraints as Obj).resourceRules as Obj[];
    assert.ok(rules.length > 0);
    for (const r of rules) {
      assert.deepEqual(strings(r.apiGroups, 'apiGroups'), ['resource.k8s.io']);
      strings(r.apiVersions, 'apiVersions');
      assert.deepEqual(strings(r.operations, 'operations'), ['CREATE', 'UPDATE', 'DELETE']);
      assert.deepEqual(strings(r.resources, 'resources'), ['resourceslices']);
    }
    const conditions = p.spec.matchConditions as Obj[];
    const variables = p.spec.variables as Obj[];
    const validations = p.spec.validations as Obj[];
    for (const c of conditions)
      assert.match(c.name as string, /^[a-z0-9]([-a-z0-9]*[a-z0-9])?$/, 'a matchCondition name is a qualified name');
    for (const v of variables)
      assert.match(v.name as string, /^[A-Za-z_][A-Za-z0-9_]*$/, 'a variable name is a CEL identifier');
    assert.ok(validations.length > 0);
    for (const v of validations) {
      assert.ok(typeof v.expression === 'string');
      if (v.reason !== undefined)
        assert.ok(['Unauthorized', 'Forbidden', 'Invalid', 'RequestEntityTooLarge'].includes(v.reason as string));
      for (const used of `${v.expression as string} ${(v.messageExpression as string | undefined) ?? ''}`.matchAll(
        /variables\.(\w+)/g,
      )) {
        assert.ok(
          variables.some((x) => x.name === used[1]),
          `variables.${used[1]} is defined`,
        );
      }
    }
    const b = object(binding!, 'admissionregistration.k8s.io/v1', 'ValidatingAdmissionPolicyBinding');
    assert.equal(b.spec.policyName, p.name);
    const actions = strings(b.spec.validationActions, 'validationActions');
    assert.ok(
      actions.every((a) => ['Deny', 'Warn', 'Audit'].includes(a)) &&
        !(actions.includes('Deny') && actions.includes('Warn')),
    );
    assert.ok(actions.includes('Deny'), 'it denies, not only warns');

    // What it does, for the identity the kubeconfig steps make.
    const admit = (username: string, operation: string, slice: Obj): 'not matched' | 'allowed' | 'denied' => {
      const request = { userInfo: { username }, operation };
      const base: Obj = {
        request,
        object: operation === 'DELETE' ? null : slice,
        oldObject: operation === 'CREATE' ? null : slice,
      };
      if (!conditions.every((c) => cel(c.expression as string)(base) === true)) return 'not matched';
      const vars: Obj = {};
      for (const v of variables) vars[v.name as string] = cel(v.expression as string)({ ...base, variables: vars });
      return validations.every((v) => cel(v.expression as string)({ ...base, variables: vars }) === true)
        ? 'allowed'
        : 'denied';
    };
    const own = { spec: { driver: 'gpu.nvidia.com', nodeName: 'gpu-7' } };
    const other = { spec: { driver: 'gpu.nvidia.com', nodeName: 'gpu-8' } };
    const everywhere = { spec: { driver: 'gpu.nvidia.com', allNodes: true } };
    const me = 'gpu-device-plugin:node:gpu-7';
    for (const op of ['CREATE', 'UPDATE', 'DELETE']) {
      assert.equal(admit(me, op, own), 'allowed', `${op} own`);
      assert.equal(admit(me, op, other), 'denied', `${op} another node's`);
      assert.equal(admit(me, op, everywhere), 'denied', `${op} a slice for all nodes`);
    }
    assert.equal(
      admit('system:serviceaccount:nvidia:dra-driver', 'CREATE', other),
      'not matched',
      "other identities are not this policy's business",
    );
    assert.equal(admit('gpu-device-plugin:node:', 'CREATE', own), 'denied', 'an empty node name matches no slice');
    // The identity the credential steps make is the one the policy and the binding name.
    const steps = readFileSync(join(DIR, 'README.md'), 'utf8');
    assert.match(steps, /-subj "\/O=gpu-device-plugin:nodes\/CN=gpu-device-plugin:node:\$NODE"/);
    assert.match(steps, /signerName: kubernetes\.io\/kube-apiserver-client/);
    for (const f of ['rbac.yaml', 'admission-policy.yaml', 'deviceclass.yaml'])
      assert.ok(steps.includes(`\`${f}\``), `the steps name ${f}`);
  },
);

test("deviceclass.yaml: a resource.k8s.io/v1 DeviceClass selecting the default driver's GPUs as nvidia.com/gpu", () => {
  const [cls, ...rest] = documents('deviceclass.yaml');
  assert.equal(rest.length, 0);
  const c = object(cls!, 'resource.k8s.io/v1', 'DeviceClass');
  assert.equal(c.name, DEFAULT_DRA_DRIVER_NAME);
  assert.equal(c.spec.extendedResourceName, 'nvidia.com/gpu');
  const selectors = c.spec.selectors as Obj[];
  assert.equal(selectors.length, 1);
  const expr = (selectors[0]!.cel as Obj).expression as string;
  assert.ok(expr.includes(`device.driver == '${DEFAULT_DRA_DRIVER_NAME}'`), expr);
  assert.ok(expr.includes(`device.attributes['${DEFAULT_DRA_DRIVER_NAME}'].type == 'gpu'`), expr);
});

test('the DRA drop-in opens the directories the options default to, and creates them', () => {
  const text = readFileSync(join(ROOT, 'systemd', 'dra.conf'), 'utf8');
  const def = (key: string): string => OPTION_SPECS.find((s) => s.key === key)?.default ?? '';
  const want = [def('kubeletPluginsRegistry'), `${def('kubeletPluginsDir')}/${DEFAULT_DRA_DRIVER_NAME}`];
  // Sharing claims: only the requests under the package's MPS root (the answers and the claims' directories are
  // the MPS unit's), and the CDI specs where the runtime reads them.
  const sharing = [`${DEFAULT_MPS_ROOT}/dra/requests`, CDI_WRITE_DIR];
  assert.deepEqual(parseUnitSandbox([text]).readWritePaths, [...want, ...sharing]);
  // The rest of /run (the MPS root's other files) read-only, whatever ProtectSystem= leaves of it.
  assert.deepEqual(parseUnitSandbox([text]).readOnlyPaths, ['/run']);
  const mkdir = /^ExecStartPre=\+\/bin\/sh -c 'umask 0027 && exec mkdir -p (.+)'$/m.exec(text);
  assert.deepEqual(mkdir?.[1]?.split(' '), want);
  const shared = /^ExecStartPre=\+\/bin\/sh -c 'umask 0022 && exec mkdir -p (.+)'$/m.exec(text);
  assert.deepEqual(shared?.[1]?.split(' '), sharing);
});
