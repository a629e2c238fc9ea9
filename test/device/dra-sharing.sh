#!/usr/bin/env bash
# DRA sharing on a machine with a real NVIDIA GPU: the packaged executable's MPS unit program as the DRA
# sharing agent (`mps-control-daemon --kubelet-api=dra`), fed the request files the plugin writes, against the
# real nvidia-smi and nvidia-cuda-mps-control; then real CUDA clients (mps-probe.c, through libcuda) under
# each claim's daemon, to see what its pinned-memory limit does: a client's allocations beyond its claim's
# limit, a client asking a higher limit for itself, and two claims' daemons on one GPU at once.
# Everything it prints also lands in $OUT/dra-sharing.txt.
set -u
out=${OUT:-/tmp/device-out}
mkdir -p "$out"
here=$(cd "$(dirname "$0")" && pwd)
step() { printf '\n===== %s\n' "$*"; }
{
  pkg=$(mktemp -d)
  deb=$(ls dist/gpu-device-plugin_*_amd64.deb 2>/dev/null | head -n 1)
  if [ -n "$deb" ]; then
    if command -v dpkg-deb > /dev/null; then dpkg-deb -x "$deb" "$pkg"; else (cd "$pkg" && ar x "$deb" && tar xf data.tar.*); fi
  else
    mkdir -p "$pkg/usr/bin" && xz -dc dist/gpu-device-plugin.xz > "$pkg/usr/bin/gpu-device-plugin"
    chmod 755 "$pkg/usr/bin/gpu-device-plugin"
  fi
  bin=$pkg/usr/bin/gpu-device-plugin
  work=$(mktemp -d)
  probe=$work/mps-probe
  gcc -O1 -o "$probe" "$here/mps-probe.c" -ldl || probe=$here/mps-probe
  uuid=${GPU_UUID:-$(nvidia-smi --query-gpu=uuid --format=csv,noheader -i 0)}
  step "nvidia-smi compute-policy (help, list)"; nvidia-smi compute-policy --help 2>&1 | head -n 40
  nvidia-smi compute-policy -l; echo "exit $?"
  step "the MPS control program"; command -v nvidia-cuda-mps-control || ls /usr/bin/nvidia-cuda-mps-*
  step "a client without MPS (the GPU's own memory)"; "$probe" 3072; echo "exit $?"

  root=$work/mps
  step "the agent: mps-control-daemon --kubelet-api=dra --mps-root=$root"
  # DRA mode's options want a kubeconfig; the agent never reads it (the plugin talks to the API server).
  echo '{}' > "$work/kubeconfig"
  "$bin" mps-control-daemon --kubelet-api=dra --kubeconfig="$work/kubeconfig" --mps-root="$root" --log-level=debug \
    > "$out/agent.log" 2>&1 &
  agent=$!
  for _ in $(seq 50); do [ -d "$root/dra/requests" ] && break; sleep 0.2; done
  ask() { # uid id request-json
    printf '{"version":"gpu-device-plugin.dra-sharing/v1","id":"%s","request":%s}\n' "$2" "$3" > "$root/dra/requests/.$1"
    mv "$root/dra/requests/.$1" "$root/dra/requests/$1.json"
    for _ in $(seq 100); do grep -qs "\"$2\"" "$root/dra/answers/$1.json" && break; sleep 0.2; done
    echo "answer $1: $(cat "$root/dra/answers/$1.json" 2>/dev/null || echo none)"
  }
  claim() { printf '{"namespace":"dev","name":"%s","uid":"%s"}' "$1" "$1"; }
  mps() { # uid MiB
    printf '{"claim":%s,"timeSlices":[],"mps":{"activeThreadPercentage":50,"exclusive":false,"units":[{"uuid":"%s","gpuIndex":0,"pinnedMemLimitMiB":%s}]}}' \
      "$(claim "$1")" "$uuid" "$2"
  }
  # A client of one claim's daemon: the claim's pipe, and its shm as /dev/shm, as the claim's CDI spec gives a container.
  client() { # uid [env...] -- probe args
    local uid=$1; shift
    unshare --mount --propagation private bash -c \
      'mount --bind "$1/shm" /dev/shm && shift && exec env CUDA_MPS_PIPE_DIRECTORY="$0" "$@"' \
      "$root/dra/claims/$uid/mps/pipe" "$root/dra/claims/$uid" "$@"
  }

  step "a TimeSlicing claim (Long) on GPU 0"
  ask ts ts-1 "{\"claim\":$(claim ts),\"timeSlices\":[{\"uuid\":\"$uuid\",\"interval\":\"Long\"}]}"
  nvidia-smi compute-policy -l
  step "two MPS claims sharing GPU 0: share-a 2048 MiB, share-b 4096 MiB"
  ask share-a a-1 "$(mps share-a 2048)"
  ask share-b b-1 "$(mps share-b 4096)"
  for u in share-a share-b; do
    echo "$u: get_default_device_pinned_mem_limit 0 → $(echo 'get_default_device_pinned_mem_limit 0' |
      CUDA_MPS_PIPE_DIRECTORY=$root/dra/claims/$u/mps/pipe nvidia-cuda-mps-control)"
  done
  step "share-a: 1024 MiB then 1536 MiB more (2560 > its 2048)"; client share-a "$probe" 1024 1536; echo "exit $?"
  step "share-a asking itself CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=8192M: 3072 MiB"
  client share-a env CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=8192M "$probe" 3072; echo "exit $?"
  step "share-a asking itself 1024M (lower than its claim's): 1536 MiB"
  client share-a env CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=1024M "$probe" 1536; echo "exit $?"
  step "share-b: 3072 MiB (within its 4096)"; client share-b "$probe" 3072; echo "exit $?"
  step "both at once: share-a holds 1024 MiB for 6 s while share-b allocates 3072 MiB"
  client share-a "$probe" -h 6 1024 &
  holder=$!
  sleep 2
  client share-b "$probe" 3072; echo "share-b exit $?"
  nvidia-smi --query-compute-apps=pid,process_name,used_memory --format=csv
  wait "$holder"; echo "share-a exit $?"
  step "the requests withdrawn (unprepare)"
  rm -f "$root/dra/requests/"*.json
  for _ in $(seq 100); do [ -z "$(ls "$root/dra/answers" 2>/dev/null)" ] && break; sleep 0.2; done
  echo "answers left: $(ls "$root/dra/answers" | wc -l); claim directories left: $(ls "$root/dra/claims" 2>/dev/null | wc -l)"
  nvidia-smi compute-policy -l
  pgrep -a nvidia-cuda-mps || echo "no MPS process left"
  kill -TERM "$agent"; wait "$agent"; echo "agent exit $?"
  step "agent log"; grep -v ' DEBUG gave memory back' "$out/agent.log" | head -n 80
} 2>&1 | tee "$out/dra-sharing.txt"
