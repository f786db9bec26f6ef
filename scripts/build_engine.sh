#!/usr/bin/env bash
# Build llmtui's engine (llama-cpp-python==0.3.36) from its sdist with our patches to the vendored llama.cpp
# (patches/llama.cpp/*.patch, applied in name order), for one backend, into a venv; then install llmtui itself (with
# its test extras) into that venv so `VENV/bin/llmtui` and `VENV/bin/python -m pytest` use this engine.
#
#   scripts/build_engine.sh BACKEND VENV        BACKEND: auto | cpu | vulkan | cuda | metal | rocm
#
# `auto` (what scripts/setup.sh uses) adds no backend argument of its own: the backend is whatever your CMAKE_ARGS
# turn on (CPU when they name none), and the record names it. LLMTUI_ENGINE_ONLY=1 installs the engine only, not
# llmtui[test] beside it (scripts/setup.sh installs llmtui with the extras it wants).
#
# Your own CMAKE_ARGS are passed through after the backend's (so yours win), e.g.
#   CMAKE_ARGS="-DCMAKE_CUDA_ARCHITECTURES=89" scripts/build_engine.sh cuda .venv-cuda
# The engine records what it was built with (backend, CMake arguments, each patch's name and sha256) in
# llama_cpp/llmtui_engine.json inside the installed package; `llmtui doctor` shows it as "engine patches: …".
# Running it again with the same patches, backend and arguments skips the build (LLMTUI_FORCE_BUILD=1 rebuilds);
# CMake's build folder (build/engine-BACKEND) is kept, so a changed patch recompiles only what it touches.
# Both README set-ups (scripts/setup.sh) build their engine with this script, so every engine llmtui sets up carries
# the patches; pip never builds or takes from its cache an unpatched one (--no-cache-dir, a forced reinstall).
set -euo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)

usage() { echo "usage: scripts/build_engine.sh auto|cpu|vulkan|cuda|metal|rocm VENV" >&2; exit 2; }
[ $# -eq 2 ] || usage
backend=$1
venv=$2
if [ "$backend" = auto ]; then
  # The backend your CMAKE_ARGS turn on, for the record and the build folder; no argument added.
  case " ${CMAKE_ARGS:-} " in
    *-DGGML_CUDA=[Oo][Nn]*|*-DGGML_CUDA=1*) backend=cuda ;;
    *-DGGML_HIP=[Oo][Nn]*|*-DGGML_HIP=1*) backend=rocm ;;
    *-DGGML_VULKAN=[Oo][Nn]*|*-DGGML_VULKAN=1*) backend=vulkan ;;
    *-DGGML_METAL=[Oo][Nn]*|*-DGGML_METAL=1*) backend=metal ;;
    *) backend=cpu ;;
  esac
fi
case "$backend" in
  cpu) backend_args="" ;;
  vulkan) backend_args="-DGGML_VULKAN=on" ;;
  cuda) backend_args="-DGGML_CUDA=on" ;;
  metal) backend_args="-DGGML_METAL=on" ;;
  rocm) backend_args="-DGGML_HIP=on" ;;
  *) usage ;;
esac
[ "$1" = auto ] && backend_args=""  # auto: CMAKE_ARGS alone
version=0.3.36
# As scripts/setup.sh: the RPC backend on (llmtui --rpc, rpc-server and their tests), the multimodal library
# (libmtmd: images with a model's mmproj projector) on, without its video helpers (MTMD_VIDEO: they run ffmpeg on
# media stb_image cannot decode; llmtui sends libmtmd only images it checked, and no subprocess of the engine's).
cmake_args="$backend_args -DGGML_RPC=on -DLLAVA_BUILD=on -DMTMD_VIDEO=off ${CMAKE_ARGS:-}"
cmake_args=$(echo "$cmake_args" | xargs)  # one space between arguments: the record compares equal across runs

src_cache="$root/build/engine-src"
work="$root/build/engine-$backend"
tree="$work/llama_cpp_python-$version"
mkdir -p "$src_cache" "$work"

[ -x "$venv/bin/python" ] || python3 -m venv "$venv"
py="$venv/bin/python"

# The record this build would write: compared with the installed one to skip a build that is already there.
record=$(BACKEND="$backend" CMAKE_ARGS_USED="$cmake_args" VERSION="$version" "$py" - "$root"/patches/llama.cpp/*.patch <<'EOF'
import hashlib, json, os, sys
patches = [{"name": os.path.basename(p), "sha256": hashlib.sha256(open(p, "rb").read()).hexdigest()}
           for p in sorted(sys.argv[1:]) if os.path.isfile(p)]
print(json.dumps({"llama_cpp_python": os.environ["VERSION"], "backend": os.environ["BACKEND"],
                  "cmake_args": os.environ["CMAKE_ARGS_USED"], "patches": patches}, indent=1, sort_keys=True))
EOF
)
installed=$("$py" - <<'EOF' 2>/dev/null || true
import importlib.util, pathlib
spec = importlib.util.find_spec("llama_cpp")
if spec and spec.origin:
    p = pathlib.Path(spec.origin).parent / "llmtui_engine.json"
    print(p.read_text().rstrip("\n") if p.is_file() else "")
EOF
)
if [ "${LLMTUI_FORCE_BUILD:-0}" != 1 ] && [ "$installed" = "$record" ]; then
  echo "build_engine: $venv already has this engine ($backend, same patches and CMake arguments): not rebuilding"
else
  if "$py" -c 'import importlib.util, sys; sys.exit(importlib.util.find_spec("llama_cpp") is None)' 2>/dev/null; then
    if [ -z "$installed" ]; then why="without llmtui's patches (a plain pip build or a cached wheel)"
    else why="with other patches or CMake arguments"; fi
    echo "build_engine: the engine in $venv was built $why: rebuilding it"
  fi
  sdist="$src_cache/llama_cpp_python-$version.tar.gz"
  if [ ! -f "$sdist" ]; then
    echo "build_engine: downloading the llama-cpp-python $version sdist"
    "$py" -m pip download --disable-pip-version-check --no-deps --no-binary :all: \
      "llama-cpp-python==$version" -d "$src_cache" >/dev/null
  fi
  # A fresh tree each time (tar keeps the archive's times, so CMake's kept build folder recompiles only what the
  # patches change); files a patch touched last time are touched now too, so removing a patch recompiles them.
  rm -rf "$tree"
  tar xzf "$sdist" -C "$work"
  applied=()
  for p in "$root"/patches/llama.cpp/*.patch; do
    [ -f "$p" ] || continue
    echo "build_engine: applying $(basename "$p")"
    patch -p1 --forward --batch --quiet -d "$tree/vendor/llama.cpp" < "$p"
    applied+=("$p")
  done
  touched="$work/patched-files.txt"
  if [ -f "$touched" ]; then
    while read -r f; do [ -f "$tree/vendor/llama.cpp/$f" ] && touch "$tree/vendor/llama.cpp/$f"; done < "$touched"
  fi
  if [ ${#applied[@]} -gt 0 ]; then
    sed -n 's|^+++ b/\([^[:space:]]*\).*|\1|p' "${applied[@]}" | sort -u > "$touched"
  else
    : > "$touched"
  fi
  printf '%s\n' "$record" > "$tree/llama_cpp/llmtui_engine.json"

  echo "build_engine: building llama-cpp-python $version for $backend with CMAKE_ARGS=\"$cmake_args\" (minutes:" \
       "the first CPU build took about 5 minutes on 2 cores here, Vulkan 941 s, a rebuild after a patch change 230 s)"
  start=$(date +%s)
  CMAKE_ARGS="$cmake_args" CMAKE_BUILD_PARALLEL_LEVEL="${CMAKE_BUILD_PARALLEL_LEVEL:-$(nproc)}" \
    "$py" -m pip install --disable-pip-version-check --force-reinstall --no-deps --no-cache-dir \
      --config-settings=build-dir="$work/cmake" "$tree"
  echo "build_engine: engine built and installed in $(( $(date +%s) - start )) s"
fi

# llmtui and its test extras beside the engine: pip keeps the engine just installed (same version).
if [ "${LLMTUI_ENGINE_ONLY:-0}" != 1 ] && ! "$py" -c 'import app, engine_ext, pytest' 2>/dev/null; then
  echo "build_engine: installing llmtui[test] into $venv"
  "$py" -m pip install --disable-pip-version-check -q -e "$root[test]"
fi
"$py" -c 'import importlib.metadata as m; assert m.version("llama-cpp-python") == "'"$version"'"'
echo "build_engine: done ($venv, $backend)"
