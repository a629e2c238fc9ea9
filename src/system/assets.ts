// Files the program carries with it. Inside the single executable they are SEA assets; when the
// sources run directly (tests, development) they are read from the checkout.
import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import { createRequire } from 'node:module';
import sea from 'node:sea';

/** The .proto files (src/api/proto.ts's ProtoFile), the koffi native module and our own C library. */
export type AssetName =
  | 'deviceplugin.proto'
  | 'podresources.proto'
  | 'pluginregistration.proto'
  | 'dra-v1.proto'
  | 'dra-v1beta1.proto'
  | 'dra-health-v1alpha1.proto'
  | 'dra-health-v1.proto'
  | 'koffi.node'
  | 'nvml-watch.so';

export function runningAsSea(): boolean {
  return sea.isSea();
}

/** Repository root when running from source (two levels above this file). */
function sourceRoot(): string {
  return join(import.meta.dirname, '..', '..');
}

/** Where an asset lives in a checkout. Used by the build to embed it and by source runs to read it. */
export function assetSourcePath(name: AssetName): string {
  switch (name) {
    case 'deviceplugin.proto':
    case 'podresources.proto':
    case 'pluginregistration.proto':
    case 'dra-v1.proto':
    case 'dra-v1beta1.proto':
    case 'dra-health-v1alpha1.proto':
    case 'dra-health-v1.proto':
      return join(sourceRoot(), 'proto', name);
    case 'koffi.node': {
      const req = createRequire(join(sourceRoot(), 'package.json'));
      const pkg = req.resolve(`@koromix/koffi-${process.platform}-${process.arch}/package.json`);
      return join(pkg, '..', `${process.platform}_${process.arch}`, 'koffi.node');
    }
    // Our own C library (src/native/), built for runs from source by build/native.ts.
    case 'nvml-watch.so':
      return join(sourceRoot(), '.cache', 'native', process.arch, 'nvml-watch.so');
  }
}

/**
 * An asset's bytes without a copy where possible: inside the executable a view of the mapped blob
 * (read-only: never write to it), from source the file read.
 */
export function assetBytes(name: AssetName): Uint8Array {
  if (sea.isSea()) return new Uint8Array(sea.getRawAsset(name));
  return readFileSync(assetSourcePath(name));
}

export function readAsset(name: AssetName): Buffer {
  if (sea.isSea()) return Buffer.from(sea.getAsset(name));
  return readFileSync(assetSourcePath(name));
}
