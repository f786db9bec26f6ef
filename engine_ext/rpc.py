"""llama.cpp RPC: use remote ggml devices (`--rpc host:port,…`) and serve this machine's (`llmtui rpc-server`)."""

from __future__ import annotations

import ctypes
from collections.abc import Sequence

from engine_ext.bindings import C, ggml_lib
from engine_ext.params import EngineError, ascii_digits

_added: set[str] = set()


def _rpc_proc(name: str) -> int:
    if not C.llama_supports_rpc():
        raise EngineError(
            "this engine was built without RPC; rebuild it with: "
            'CMAKE_ARGS="-DGGML_RPC=ON" pip install --force-reinstall --no-cache-dir --no-deps llama-cpp-python==0.3.36'
        )
    lib = ggml_lib()
    reg = lib.ggml_backend_reg_by_name(b"RPC")
    address = lib.ggml_backend_reg_get_proc_address(reg, name.encode()) if reg else None
    if not address:
        raise EngineError(f"the RPC backend does not provide {name}")
    return int(address)


def add_rpc_servers(endpoints: Sequence[str]) -> None:
    """Register each host:port as ggml devices (common/arg.cpp add_rpc_devices); once per process."""
    C.llama_backend_init()
    fresh = [e for e in endpoints if e not in _added]
    if not fresh:
        return
    # ggml_backend_reg_t ggml_backend_rpc_add_server(const char * endpoint);
    add_server = ctypes.CFUNCTYPE(ctypes.c_void_p, ctypes.c_char_p)(_rpc_proc("ggml_backend_rpc_add_server"))
    lib = ggml_lib()
    for endpoint in fresh:
        host, _, port = endpoint.rpartition(":")
        if not host or not ascii_digits(port):
            raise EngineError(f"RPC server {endpoint!r} must be host:port")
        reg = add_server(endpoint.encode())
        if not reg:
            raise EngineError(f"could not reach the RPC server at {endpoint}")
        lib.ggml_backend_register(reg)
        _added.add(endpoint)


def serve_rpc(endpoint: str, n_threads: int, cache_dir: str | None = None) -> None:
    """Serve this machine's CPU device to llama.cpp RPC clients (blocks; tools/rpc/rpc-server.cpp)."""
    C.llama_backend_init()
    # void ggml_backend_rpc_start_server(const char * endpoint, const char * cache_dir, size_t n_threads,
    #                                    size_t n_devices, ggml_backend_dev_t * devices);
    start = ctypes.CFUNCTYPE(
        None, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_size_t, ctypes.c_size_t, ctypes.POINTER(ctypes.c_void_p)
    )(_rpc_proc("ggml_backend_rpc_start_server"))
    cpu = ggml_lib().ggml_backend_dev_by_type(0)
    devices = (ctypes.c_void_p * 1)(cpu)
    start(endpoint.encode(), cache_dir.encode() if cache_dir else None, n_threads, 1, devices)
