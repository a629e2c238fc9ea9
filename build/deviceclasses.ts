// Writes packaging/dra/deviceclasses-mig.yaml: one DeviceClass per MIG profile of the table in
// src/cli/check-dra-class-table.ts (the file is committed; test/unit/dra-classes.test.ts holds it to the
// table). Run after changing the table: node build/deviceclasses.ts
import { writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { MIG_FILE, migClassName, migClassResource, shippedMigProfiles } from '../src/cli/check-dra-class-table.ts';
import { DEFAULT_DRA_DRIVER_NAME } from '../src/config/options.ts';

export const MIG_CLASSES_PATH = join(import.meta.dirname, '..', 'packaging', 'dra', MIG_FILE);

/** The file's text: a header, then one DeviceClass document per profile. */
export function migClassesYaml(driver = DEFAULT_DRA_DRIVER_NAME): string {
  const head = [
    '# DeviceClasses for the MIG devices gpu-device-plugin publishes in DRA mode (driver gpu.nvidia.com), one',
    '# per MIG profile of the GPUs NVIDIA ships with MIG. Each selects the MIG devices of its profile and',
    '# names the extended resource the device plugin (--mig-strategy=mixed) advertises them under, so pods',
    '# that ask nvidia.com/mig-<profile> keep working when their node moves to DRA. A class whose profile no',
    '# node has costs nothing. Generated from src/cli/check-dra-class-table.ts by build/deviceclasses.ts.',
    `# kubectl apply -f ${MIG_FILE}`,
  ];
  const docs = shippedMigProfiles().map(({ profile, gpus }) =>
    [
      `# MIG ${profile}: ${gpus.join(', ')}`,
      'apiVersion: resource.k8s.io/v1',
      'kind: DeviceClass',
      'metadata:',
      `  name: ${migClassName(profile)}`,
      'spec:',
      '  selectors:',
      '    - cel:',
      '        expression: >-',
      `          device.driver == '${driver}' &&`,
      `          device.attributes['${driver}'].type == 'mig' &&`,
      `          device.attributes['${driver}'].profile == '${profile}'`,
      `  extendedResourceName: ${migClassResource(profile)}`,
    ].join('\n'),
  );
  return `${head.join('\n')}\n${docs.map((d) => `---\n${d}\n`).join('')}`;
}

if (process.argv[1] === import.meta.filename) {
  writeFileSync(MIG_CLASSES_PATH, migClassesYaml());
  process.stdout.write(`wrote ${MIG_CLASSES_PATH}\n`);
}
