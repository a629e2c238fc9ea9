#!/usr/bin/env bash
# Installs the system tools that the build and the tests need, from Debian's packages: gcc (the
# fake NVML), strip (the executable), unshare and mount (the mount-namespace test), and what
# `npm run package` and test/e2e/packaging.test.ts use, and debootstrap and systemd-nspawn
# for the real-systemd test (test/system/). Only what is missing is installed, so a
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
#   debootstrap (Debian 12 rootfs)            debootstrap
#   systemd-nspawn (boots it, real systemd)   systemd-container
#   nsenter (enters the booted container)     util-linux
#   promtool (lints the metrics file)         prometheus  (19 MB download, 96 MB installed)
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
  [debootstrap]=debootstrap
  [systemd-nspawn]=systemd-container
  [nsenter]=util-linux
  [promtool]=prometheus
)

missing=()
for tool in "${!package_of[@]}"; do
  command -v "$tool" >/dev/null 2>&1 || missing+=("${package_of[$tool]}")
done
[ ${#missing[@]} -eq 0 ] && exit 0

mapfile -t packages < <(printf '%s\n' "${missing[@]}" | sort -u)
if ! command -v apt-get >/dev/null 2>&1; then
  echo "install-tools.sh: missing ${packages[*]}, and there is no apt-get to install them with" >&2
  exit 1
fi
sudo=()
if [ "$(id -u)" -ne 0 ]; then sudo=(sudo); fi
echo "install-tools.sh: installing ${packages[*]}" >&2
export DEBIAN_FRONTEND=noninteractive
"${sudo[@]}" apt-get update -qq
"${sudo[@]}" apt-get install -y -qq --no-install-recommends "${packages[@]}" >/dev/null
