#!/usr/bin/env bash
# Set up .venv in this clone: `scripts/setup.sh` for the chat app and the starter model, `scripts/setup.sh test` for
# the tests too. Safe to run again, in either order: what is installed already is kept, unless the tests need an
# engine built otherwise (then it says so and rebuilds it).
set -euo pipefail
cd "$(dirname "$0")/.."
case "${1:-}" in
  "") extra=starter ;;
  test) extra=test ;;
  *) echo "usage: scripts/setup.sh [test]" >&2; exit 2 ;;
esac

# The engine is llama-cpp-python, built from source by pip (about 5 minutes on 2 cores). Both set-ups build the same
# one: llama.cpp's RPC backend on (llmtui --rpc and rpc-server, and its tests), the multimodal library off (llmtui
# never loads it: about 23,000 lines of C++ fewer to compile). Your own CMAKE_ARGS come first, e.g. CMAKE_ARGS="-DGGML_CUDA=on".
export CMAKE_ARGS="${CMAKE_ARGS:-} -DGGML_RPC=on -DLLAVA_BUILD=off"

[ -x .venv/bin/python ] || python3 -m venv .venv
echo "setup: installing llmtui[$extra] into .venv (the first time, pip builds the engine from source: minutes)"
.venv/bin/pip install --disable-pip-version-check -e ".[$extra]"

# pip keeps an engine that is installed already (or a wheel it built before), whatever CMAKE_ARGS says now. The tests
# need the RPC backend: rebuild an engine that lacks it.
if [ "$extra" = test ] && ! .venv/bin/python -c 'import sys, llama_cpp; sys.exit(not llama_cpp.llama_supports_rpc())'
then
  echo "setup: the engine in .venv was built without llama.cpp's RPC backend, which the tests need;" \
       "rebuilding it with CMAKE_ARGS=\"$CMAKE_ARGS\" (minutes)"
  .venv/bin/pip install --disable-pip-version-check --force-reinstall --no-deps --no-cache-dir \
    "llama-cpp-python==$(.venv/bin/python -c 'import importlib.metadata as m; print(m.version("llama-cpp-python"))')"
fi
echo "setup: done"
