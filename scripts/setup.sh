#!/usr/bin/env bash
# Set up .venv in this clone: `scripts/setup.sh` for the chat app and the starter model, `scripts/setup.sh test` for
# the tests too. Safe to run again, in either order: what is installed already is kept, unless the engine in .venv
# is not the one these patches and CMake arguments build (then it says so and rebuilds it).
set -euo pipefail
cd "$(dirname "$0")/.."
case "${1:-}" in
  "") extra=starter ;;
  test) extra=test ;;
  *) echo "usage: scripts/setup.sh [test]" >&2; exit 2 ;;
esac

[ -x .venv/bin/python ] || python3 -m venv .venv

# The engine is llama-cpp-python 0.3.36 built from its sdist with patches/llama.cpp/*.patch applied (about 5 minutes
# on 2 cores), by scripts/build_engine.sh: llama.cpp's RPC backend on (llmtui --rpc and rpc-server, and their tests),
# the multimodal library libmtmd on (images through a model's mmproj projector; its ffmpeg video helpers off), your
# own CMAKE_ARGS after those (so yours win), e.g. CMAKE_ARGS="-DGGML_CUDA=on". The engine records its patches
# (llama_cpp/llmtui_engine.json); an engine already in .venv with the same record is kept, any other (an older
# set-up's, a wheel from pip's cache) is rebuilt.
LLMTUI_ENGINE_ONLY=1 scripts/build_engine.sh auto .venv

# llmtui itself: pip keeps the engine just installed (the same pinned version).
echo "setup: installing llmtui[$extra] into .venv"
.venv/bin/pip install --disable-pip-version-check -q -e ".[$extra]"
.venv/bin/python -c 'import importlib.metadata as m; assert m.version("llama-cpp-python") == "0.3.36"'
echo "setup: done"
