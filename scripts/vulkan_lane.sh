#!/usr/bin/env bash
# The device lane: the engine built for Vulkan, run on a Vulkan device (on a machine without a GPU, Mesa's lavapipe,
# a Vulkan driver that runs on the CPU), with the device tests (tests/device). Run it before resolving any change
# that touches the engine; it does not fit CI's time budget (see the README's "Vulkan build (verified here)").
#
#   scripts/vulkan_lane.sh [pytest arguments…]
#
# 1. installs the Debian/Ubuntu packages the Vulkan build and lavapipe need, if missing (apt-get; root or sudo);
# 2. builds the Vulkan engine into .venv-vulkan with scripts/build_engine.sh (skipped when it is built already
#    with the same patches and CMake arguments);
# 3. runs tests/device with GGML_VK_VISIBLE_DEVICES=0 (llama.cpp skips CPU-type Vulkan devices unless named), and
#    prints the speculation table (drafter × architecture: identical / diverged / refused, with counts) and times.
set -euo pipefail
cd "$(dirname "$0")/.."
venv=${LLMTUI_VULKAN_VENV:-.venv-vulkan}
lane_start=$(date +%s)

packages=(mesa-vulkan-drivers libvulkan-dev glslc spirv-headers vulkan-tools)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  sudo=""
  [ "$(id -u)" -eq 0 ] || sudo=sudo
  echo "vulkan_lane: installing ${missing[*]}"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "${missing[@]}" >/dev/null
fi
t_packages=$(( $(date +%s) - lane_start ))

export GGML_VK_VISIBLE_DEVICES=${GGML_VK_VISIBLE_DEVICES:-0}
if command -v vulkaninfo >/dev/null; then
  vulkaninfo --summary 2>/dev/null | sed -n 's/^[[:space:]]*deviceName[[:space:]]*=[[:space:]]*/vulkan_lane: Vulkan device: /p'
fi

t0=$(date +%s)
scripts/build_engine.sh vulkan "$venv"
t_build=$(( $(date +%s) - t0 ))

report=$(mktemp /tmp/llmtui-device-report.XXXXXX.json)
rm -f "$report"
t0=$(date +%s)
status=0
LLMTUI_DEVICE_REPORT="$report" "$venv/bin/python" -m pytest -p no:cacheprovider tests/device -m device -q -rs "$@" \
  || status=$?
t_tests=$(( $(date +%s) - t0 ))

"$venv/bin/python" - "$report" <<'EOF'
import collections, json, os, sys
path = sys.argv[1]
rows = [json.loads(line) for line in open(path)] if os.path.isfile(path) else []
if not rows:
    print("vulkan_lane: no speculation rows (tests skipped or not run)")
    sys.exit(0)
print()
print(f"{'drafter':14} {'architecture':15} {'draft':20} {'on the device':13} {'drafted':>7} {'accepted':>8}  "
      f"{'plain: device vs CPU':28} detail")
for r in sorted(rows, key=lambda r: (r["drafter"], r["arch"], r["draft"] or "")):
    print(f"{r['drafter']:14} {r['arch']:15} {(r['draft'] or '-'):20} {r['outcome']:13} {r['drafted']:7} "
          f"{r['accepted']:8}  {r['plain_device_vs_cpu']:28} {r['detail']}")
counts = collections.Counter(r["outcome"] for r in rows)
print("counts: " + ", ".join(f"{k} {v}" for k, v in sorted(counts.items())) + f" (of {len(rows)})")
os.remove(path)
EOF
echo "vulkan_lane: times: packages ${t_packages} s, engine build ${t_build} s, device tests ${t_tests} s," \
     "whole lane $(( $(date +%s) - lane_start )) s"
exit $status
