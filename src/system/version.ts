// Version facts, filled in by the build (build/build.ts); a source run says "dev".
declare const __VERSION__: string | undefined;
declare const __GIT_COMMIT__: string | undefined;

export const VERSION: string = typeof __VERSION__ === 'string' ? __VERSION__ : '0.0.0-dev';
export const GIT_COMMIT: string = typeof __GIT_COMMIT__ === 'string' ? __GIT_COMMIT__ : 'unknown';

export function versionText(): string {
  return `gpu-device-plugin ${VERSION} (commit ${GIT_COMMIT}, node ${process.version})\n`;
}
