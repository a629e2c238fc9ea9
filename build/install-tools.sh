#!/usr/bin/env bash
# Installs the system tools that the build and the tests need, from Debian's packages: gcc (the
# fake NVML), strip (the executable), unshare and mount (the mount-namespace test), and what
# `npm run package` and test/e2e/packaging.test.ts use, what `npm run repo` and its tests use, and
# debootstrap and systemd-nspawn for the real-systemd test (test/system/). Only what is missing is installed, so a
# second run does nothing.
#
#   gcc                                       gcc
#   strip                                     binutils
#   unshare, mount                            util-linux, mount
#   dpkg-deb, dpkg (throwaway-root installs)  dpkg        dpkg-shlibdeps          dpkg-dev
#   rpmbuild, rpm (throwaway-root installs)   rpm
#   lintian (and man, which it uses)          lintian, man-db
#   systemd-analyze (verify, security)        systemd     gzip, xz                gzip, xz-utils
#   setpriv (lintian runs unprivileged)       util-linux
#   aarch64: strip the arm64 runtime          binutils-aarch64-linux-gnu
#   aarch64: cross-build the fake NVML        gcc-aarch64-linux-gnu, libc6-dev-arm64-cross
#   aarch64: run the arm64 executable, and    qemu-user-static, binfmt-support (update-binfmts),
#            its node at build (the blob's    libc6-arm64-cross, libstdc++6-arm64-cross,
#            code cache; emulated, libraries  libgcc-s1-arm64-cross, libatomic1-arm64-cross
#            under /usr/aarch64-linux-gnu)
#   debootstrap (Debian 12 rootfs)            debootstrap
#   systemd-nspawn (boots it, real systemd)   systemd-container
#   nsenter (enters the booted container)     util-linux
#   promtool (lints the metrics file)         prometheus  (19 MB download, 96 MB installed)
#   /usr/bin/time (npm run bench: peak RSS)   time
#   npm run repo: the apt indexes             apt-utils (apt-ftparchive)
#                 the yum/dnf repodata        createrepo-c (createrepo_c)
#                 signatures                  gpg, gpgconf, gpg-agent, rpm (rpmsign, rpmkeys)
#   its test: dnf reads the yum repository    dnf
#
# Afterwards (every run, whether or not something was installed) the kernel is made to run aarch64
# programs through qemu: binfmt_misc is mounted where PID 1 did not (containers without systemd)
# and the qemu-aarch64 handler is enabled. test/e2e/arm64.test.ts fails when that is missing.
set -euo pipefail

declare -A package_of=(
  [gcc]=gcc
  [strip]=binutils
  [unshare]=util-linux
  [mount]=mount
  [dpkg]=dpkg
  [dpkg-deb]=dpkg
  [dpkg-shlibdeps]=dpkg-dev
  [rpm]=rpm
  [rpmbuild]=rpm
  [lintian]=lintian
  [man]=man-db
  [systemd-analyze]=systemd
  [gzip]=gzip
  [xz]=xz-utils
  [setpriv]=util-linux
  [aarch64-linux-gnu-strip]=binutils-aarch64-linux-gnu
  [aarch64-linux-gnu-gcc]=gcc-aarch64-linux-gnu
  [qemu-aarch64-static]=qemu-user-static
  [update-binfmts]=binfmt-support
  [debootstrap]=debootstrap
  [systemd-nspawn]=systemd-container
  [nsenter]=util-linux
  [promtool]=prometheus
  [apt-ftparchive]=apt-utils
  [createrepo_c]=createrepo-c
  [gpg]=gpg
  [gpgconf]=gpgconf
  [gpg-agent]=gpg-agent
  [rpmsign]=rpm
  [rpmkeys]=rpm
  [dnf]=dnf
)

# Files that tell whether a package without a command of its own is installed.
declare -A package_of_file=(
  [/usr/aarch64-linux-gnu/lib/ld-linux-aarch64.so.1]=libc6-arm64-cross
  [/usr/aarch64-linux-gnu/include/stdio.h]=libc6-dev-arm64-cross
  [/usr/aarch64-linux-gnu/lib/libstdc++.so.6]=libstdc++6-arm64-cross
  [/usr/aarch64-linux-gnu/lib/libgcc_s.so.1]=libgcc-s1-arm64-cross
  [/usr/aarch64-linux-gnu/lib/libatomic.so.1]=libatomic1-arm64-cross
  [/usr/bin/time]=time
)

sudo=()
if [ "$(id -u)" -ne 0 ]; then sudo=(sudo); fi

# qemu-user-static registers its handlers with binfmt-support; the kernel needs binfmt_misc mounted.
enable_aarch64_emulation() {
  if [ ! -e /proc/sys/fs/binfmt_misc/register ]; then
    "${sudo[@]}" mount -t binfmt_misc binfmt_misc /proc/sys/fs/binfmt_misc || {
      echo "install-tools.sh: cannot mount binfmt_misc (a container without the privilege?); aarch64 programs cannot be emulated" >&2
      exit 1
    }
  fi
  if [ "$(head -n1 /proc/sys/fs/binfmt_misc/qemu-aarch64 2>/dev/null)" != enabled ]; then
    "${sudo[@]}" update-binfmts --enable qemu-aarch64 || {
      echo "install-tools.sh: update-binfmts could not enable qemu-aarch64; aarch64 programs cannot be emulated" >&2
      exit 1
    }
  fi
}

missing=()
for tool in "${!package_of[@]}"; do
  command -v "$tool" >/dev/null 2>&1 || missing+=("${package_of[$tool]}")
done
for file in "${!package_of_file[@]}"; do
  [ -e "$file" ] || missing+=("${package_of_file[$file]}")
done
if [ ${#missing[@]} -eq 0 ]; then
  enable_aarch64_emulation
  exit 0
fi

mapfile -t packages < <(printf '%s\n' "${missing[@]}" | sort -u)
if ! command -v apt-get >/dev/null 2>&1; then
  echo "install-tools.sh: missing ${packages[*]}, and there is no apt-get to install them with" >&2
  exit 1
fi
echo "install-tools.sh: installing ${packages[*]}" >&2
export DEBIAN_FRONTEND=noninteractive
"${sudo[@]}" apt-get update -qq
"${sudo[@]}" apt-get install -y -qq --no-install-recommends "${packages[@]}" >/dev/null
enable_aarch64_emulation
