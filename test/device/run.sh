#!/usr/bin/env bash
# The checks a session runs on a machine with a real NVIDIA GPU and driver: the packaged executable
# (unpacked from the .deb in dist/, not installed, or dist/gpu-device-plugin.xz where no .deb was built)
# against the real NVML — --version, info, info --json,
# check, a short daemon run with no kubelet — beside nvidia-smi, and every NVML read of the health
# signals through nvml-probe.c. Everything it prints also lands in $OUT.
set -u
out=${OUT:-/tmp/device-out}
mkdir -p "$out"
here=$(cd "$(dirname "$0")" && pwd)
deb=$(ls dist/gpu-device-plugin_*_amd64.deb 2>/dev/null | head -n 1)
step() { printf '\n===== %s\n' "$*"; }
{
  step "host"; uname -a; cat /etc/os-release | head -n 2; nproc
  step "nvidia-smi"; nvidia-smi; nvidia-smi topo -m
  nvidia-smi -q > "$out/nvidia-smi-q.txt" 2>&1; echo "(nvidia-smi -q: $(wc -l < "$out/nvidia-smi-q.txt") lines in nvidia-smi-q.txt)"
  step "nvidia-smi -q: the health-relevant sections"
  grep -A4 -E 'Remapped Rows|Retired Pages|Volatile|Aggregate|Recovery|Replays|Link Width|Clocks Event Reasons|Throttle|MIG Mode|Compute Mode|Driver Version|CUDA Version' \
    "$out/nvidia-smi-q.txt" | head -n 160
  step "package"
  pkg=$(mktemp -d)
  if [ -n "$deb" ]; then
    if command -v dpkg-deb > /dev/null; then dpkg-deb -x "$deb" "$pkg"; else (cd "$pkg" && ar x "$deb" && tar xf data.tar.*); fi
    echo "$deb unpacked"
  elif [ -f dist/gpu-device-plugin.xz ]; then
    mkdir -p "$pkg/usr/bin" && xz -dc dist/gpu-device-plugin.xz > "$pkg/usr/bin/gpu-device-plugin"
    chmod 755 "$pkg/usr/bin/gpu-device-plugin" && echo "dist/gpu-device-plugin.xz unpacked"
  else echo "neither a .deb nor dist/gpu-device-plugin.xz in dist/"; fi
  bin=$pkg/usr/bin/gpu-device-plugin
  step "--version"; "$bin" --version
  step "info"; timeout 60 "$bin" info; echo "exit $?"
  step "info --json"; timeout 60 "$bin" info --json > "$out/info.json"; echo "exit $?"; head -c 6000 "$out/info.json"; echo
  step "check"; timeout 60 "$bin" check; echo "exit $?"
  run=$(mktemp -d)
  printf 'version: v1\nhealth:\n  signals:\n    clocks: off\n  pcieReplaysPerMinute: 4\n' > "$run/config.yaml"
  step "check with a health section in the config file"; timeout 60 "$bin" check --config-file "$run/config.yaml"; echo "exit $?"
  step "daemon, 12 s, no kubelet, probes every second"
  timeout -s TERM 12 "$bin" --kubelet-socket "$run/kubelet.sock" --log-level debug --fail-on-init-error=true \
    --health-probe-interval=1 2>&1 | grep -v ' DEBUG gave memory back' | head -n 150
  echo "exit ${PIPESTATUS[0]}"
  step "nvml-probe"
  probe=$here/nvml-probe
  if command -v gcc > /dev/null; then gcc -O1 -o "$run/nvml-probe" "$here/nvml-probe.c" -ldl && probe=$run/nvml-probe; fi
  if [ -x "$probe" ]; then "$probe"; else echo "no gcc and no prebuilt probe"; fi
} 2>&1 | tee "$out/device.txt"
