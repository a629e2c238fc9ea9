// koffi declarations of the NVML entry points the plugin calls, with the real ABI (NVIDIA's nvml.h).
// The basic set every driver has is bound when the library is opened; every other symbol is bound
// on first use, so a driver without it loses that one feature instead of failing to start.
import type { Koffi } from '../system/native.ts';
import { MIG_SYMBOLS } from './mig-symbols.ts';

type KoffiLib = ReturnType<Koffi['load']>;
type KoffiType = ReturnType<Koffi['struct']>;
export type NativeFn = (...args: unknown[]) => unknown;

export interface NvmlTypes {
  pciInfo: KoffiType;
  memory: KoffiType;
  eventData: KoffiType;
}

let types: NvmlTypes | undefined;

/** koffi type names are global to the process, so the types are declared once. */
export function nvmlTypes(koffi: Koffi): NvmlTypes {
  if (types === undefined) {
    koffi.pointer('nvmlDevice_t', koffi.opaque('nvmlDevice_st'));
    koffi.pointer('nvmlEventSet_t', koffi.opaque('nvmlEventSet_st'));
    types = {
      pciInfo: koffi.struct('nvmlPciInfo_t', {
        busIdLegacy: koffi.array('char', 16, 'String'),
        domain: 'unsigned int',
        bus: 'unsigned int',
        device: 'unsigned int',
        pciDeviceId: 'unsigned int',
        pciSubSystemId: 'unsigned int',
        busId: koffi.array('char', 32, 'String'),
      }),
      memory: koffi.struct('nvmlMemory_t', {
        total: 'unsigned long long',
        free: 'unsigned long long',
        used: 'unsigned long long',
      }),
      eventData: koffi.struct('nvmlEventData_t', {
        device: 'nvmlDevice_t',
        eventType: 'unsigned long long',
        eventData: 'unsigned long long',
        gpuInstanceId: 'unsigned int',
        computeInstanceId: 'unsigned int',
      }),
    };
  }
  return types;
}

/** Entry points bound eagerly: every NVML since the CUDA 10 era has them. */
export const BASIC_SYMBOLS = {
  nvmlInit_v2: 'int nvmlInit_v2()',
  nvmlShutdown: 'int nvmlShutdown()',
  nvmlErrorString: 'const char *nvmlErrorString(int result)',
  nvmlSystemGetDriverVersion: 'int nvmlSystemGetDriverVersion(char *version, unsigned int length)',
  nvmlDeviceGetCount_v2: 'int nvmlDeviceGetCount_v2(_Out_ unsigned int *count)',
  nvmlDeviceGetHandleByIndex_v2: 'int nvmlDeviceGetHandleByIndex_v2(unsigned int index, _Out_ nvmlDevice_t *device)',
  nvmlDeviceGetUUID: 'int nvmlDeviceGetUUID(nvmlDevice_t device, char *uuid, unsigned int length)',
  nvmlDeviceGetName: 'int nvmlDeviceGetName(nvmlDevice_t device, char *name, unsigned int length)',
  nvmlDeviceGetMinorNumber: 'int nvmlDeviceGetMinorNumber(nvmlDevice_t device, _Out_ unsigned int *minor)',
  nvmlDeviceGetPciInfo_v3: 'int nvmlDeviceGetPciInfo_v3(nvmlDevice_t device, _Out_ nvmlPciInfo_t *pci)',
  nvmlDeviceGetMemoryInfo: 'int nvmlDeviceGetMemoryInfo(nvmlDevice_t device, _Out_ nvmlMemory_t *memory)',
} as const;

/** Entry points bound on first use; older drivers may lack any of them. */
export const LAZY_SYMBOLS = {
  nvmlDeviceGetNumaNodeId: 'int nvmlDeviceGetNumaNodeId(nvmlDevice_t device, _Out_ unsigned int *node)',
  nvmlDeviceGetTopologyCommonAncestor:
    'int nvmlDeviceGetTopologyCommonAncestor(nvmlDevice_t a, nvmlDevice_t b, _Out_ int *level)',
  nvmlDeviceGetNvLinkState: 'int nvmlDeviceGetNvLinkState(nvmlDevice_t device, unsigned int link, _Out_ int *isActive)',
  nvmlDeviceGetNvLinkRemotePciInfo_v2:
    'int nvmlDeviceGetNvLinkRemotePciInfo_v2(nvmlDevice_t device, unsigned int link, _Out_ nvmlPciInfo_t *pci)',
  nvmlDeviceGetNvLinkRemoteDeviceType:
    'int nvmlDeviceGetNvLinkRemoteDeviceType(nvmlDevice_t device, unsigned int link, _Out_ int *type)',
  // The health thread (src/native/nvml_watch.c) calls the event functions; these two are bound only
  // to learn which wait the driver has (and to log, once, that the newer one is missing).
  nvmlEventSetWait_v2:
    'int nvmlEventSetWait_v2(nvmlEventSet_t set, _Out_ nvmlEventData_t *data, unsigned int timeoutms)',
  nvmlEventSetWait: 'int nvmlEventSetWait(nvmlEventSet_t set, _Out_ nvmlEventData_t *data, unsigned int timeoutms)',
  ...MIG_SYMBOLS,
  // Whether a GPU that cannot be read now is still at its PCI address (src/nvml/unreadable.ts).
  nvmlDeviceGetHandleByPciBusId_v2:
    'int nvmlDeviceGetHandleByPciBusId_v2(const char *pciBusId, _Out_ nvmlDevice_t *device)',
  // Node labels (src/nvml/node-facts.ts).
  nvmlSystemGetCudaDriverVersion_v2: 'int nvmlSystemGetCudaDriverVersion_v2(_Out_ int *cudaDriverVersion)',
  nvmlDeviceGetCudaComputeCapability:
    'int nvmlDeviceGetCudaComputeCapability(nvmlDevice_t device, _Out_ int *major, _Out_ int *minor)',
  // Compute mode (src/nvml/compute-mode.ts), for MPS sharing; nvmlComputeMode_t is a C enum (int).
  nvmlDeviceGetComputeMode: 'int nvmlDeviceGetComputeMode(nvmlDevice_t device, _Out_ int *mode)',
  nvmlDeviceSetComputeMode: 'int nvmlDeviceSetComputeMode(nvmlDevice_t device, int mode)',
} as const;

export type BasicSymbol = keyof typeof BASIC_SYMBOLS;
export type LazySymbol = keyof typeof LAZY_SYMBOLS;

/** Binds a declaration; returns undefined when the library lacks the symbol. */
export function bind(lib: KoffiLib, declaration: string): NativeFn | undefined {
  try {
    return lib.func(declaration) as NativeFn;
  } catch {
    return undefined;
  }
}
