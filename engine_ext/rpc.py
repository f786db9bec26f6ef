"""llama.cpp RPC: use remote ggml devices (`--rpc host:port,…`) and serve this machine's (`llmtui rpc-server`)."""

from __future__ import annotations

import ctypes
import socket
from collections.abc import Sequence

from engine_ext.bindings import C, ggml_lib
from engine_ext.params import EngineError, ascii_digits

_added: set[str] = set()


def _rpc_proc(name: str) -> int:
    if not C.llama_supports_rpc():
        raise EngineError(
            "this engine was built without RPC; rebuild it with: "
            "scripts/setup.sh from a clone of llmtui (it turns RPC on)"
        )
    lib = ggml_lib()
    reg = lib.ggml_backend_reg_by_name(b"RPC")
    address = lib.ggml_backend_reg_get_proc_address(reg, name.encode()) if reg else None
    if not address:
        raise EngineError(f"the RPC backend does not provide {name}")
    return int(address)


# How long the check before registering waits for an RPC server to accept a connection
RPC_CONNECT_TIMEOUT_S = 5.0


def check_rpc_endpoint(endpoint: str, timeout_s: float = RPC_CONNECT_TIMEOUT_S) -> None:
    """EngineError (one line) unless ``endpoint`` is host:port and something there accepts a TCP connection within
    ``timeout_s``: ggml-rpc aborts the process when it cannot connect (ggml-rpc.cpp "Failed to connect")."""
    host, _, port = endpoint.rpartition(":")
    if not host or not ascii_digits(port) or not 0 < int(port) < 65536:
        raise EngineError(f"RPC server {endpoint[:100]!r} must be host:port (a port from 1 to 65535)")
    try:
        with socket.create_connection((host.strip("[]"), int(port)), timeout=timeout_s):
            pass
    except OSError as exc:
        reason = f"no answer in {timeout_s:g} s" if isinstance(exc, TimeoutError) else exc.strerror or exc
        raise EngineError(
            f"cannot reach the RPC server at {endpoint[:100]} ({reason}); start `llmtui rpc-server` there or fix --rpc"
        ) from None


def add_rpc_servers(endpoints: Sequence[str]) -> None:
    """Register each host:port as ggml devices (common/arg.cpp add_rpc_devices); once per process. Each is checked
    first, at every load (check_rpc_endpoint): one that cannot be reached is a message, not an abort."""
    C.llama_backend_init()
    for endpoint in endpoints:  # the registered ones too: a server that went away aborts the next load as well
        check_rpc_endpoint(endpoint)
    fresh = [e for e in endpoints if e not in _added]
    if not fresh:
        return
    # ggml_backend_reg_t ggml_backend_rpc_add_server(const char * endpoint);
    add_server = ctypes.CFUNCTYPE(ctypes.c_void_p, ctypes.c_char_p)(_rpc_proc("ggml_backend_rpc_add_server"))
    lib = ggml_lib()
    for endpoint in fresh:
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
