"""After the engine worker dies natively: the automatic retry without CPU weight repacking, and the fallbacks a user
can try next. One policy for the chat app and the command line.

A Xeon with AMX crashed on the first message inside llama.cpp's AMX repack path (`ggml_backend_amx_mul_mat`), and
so did llama.cpp's own tools built from the same source, unless --no-repack. A crash while loading or during the
first replies after a load, with weights repacked, is blamed on the repacking and retried once without it.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from engine_ext.params import ContextParams, ModelParams

# A crash while loading, or before this many replies have finished since the load, counts as early.
EARLY_REPLIES = 2
SMALL_CONTEXT = 2048


def native_crash(exit_code: int | None) -> bool:
    """Whether a worker's exit status is a native fault (SIGSEGV, SIGBUS, SIGILL, SIGFPE, SIGABRT), not a kill (the
    out-of-memory killer's SIGKILL, a user's SIGTERM) or an exit."""
    import signal

    faults = {signal.SIGSEGV, signal.SIGILL, signal.SIGFPE, signal.SIGABRT, getattr(signal, "SIGBUS", signal.SIGSEGV)}
    return exit_code is not None and exit_code < 0 and -exit_code in {int(f) for f in faults}


def repack_retry(model: ModelParams, extra_bufts: tuple[str, ...]) -> ModelParams | None:
    """The model parameters to retry an early native crash with: repacking off, when it was on and this build on this
    CPU has extra buffer types to repack into; None when there is nothing to turn off."""
    if model.use_extra_bufts and extra_bufts:
        return replace(model, use_extra_bufts=False)
    return None


def retry_notice(extra_bufts: tuple[str, ...], keep_off: str) -> str:
    """The one line said when the engine is restarted without repacking; `keep_off` says how to make it permanent."""
    kinds = ", ".join(extra_bufts) or "repack"
    return (
        f"The engine crashed natively with CPU weight repacking on ({kinds}); restarted without it "
        f"(--no-repack). {keep_off}"
    )


@dataclass(frozen=True)
class Fallback:
    """One way to load that avoids a native crash path: a single engine setting changed (the field of ModelParams or
    ContextParams, and of the app's engine settings, which use the same names)."""

    key: str  # no-repack, threads, no-mmap, cpu-only, small-context
    what: str  # in words: "1 thread instead of 2"
    flag: str  # llama.cpp's flag: "-t 1"
    field: str  # use_extra_bufts, n_threads, use_mmap, n_gpu_layers, n_ctx
    value: int | bool


def fallbacks(model: ModelParams, context: ContextParams, n_threads: int, gpu_devices: int) -> tuple[Fallback, ...]:
    """What can still be turned down, in the order worth trying: repacking, threads (`n_threads` is the count in use),
    memory mapping, GPU offload (with `gpu_devices` or RPC servers to offload to), the context size. Settings already
    at their safe value are left out."""
    found: list[Fallback] = []
    if model.use_extra_bufts:
        found.append(Fallback("no-repack", "no CPU weight repacking", "--no-repack", "use_extra_bufts", False))
    if n_threads > 1:
        fewer = max(1, n_threads // 2)
        found.append(
            Fallback(
                "threads",
                f"{fewer} thread{'s' if fewer > 1 else ''} instead of {n_threads}",
                f"-t {fewer}",
                "n_threads",
                fewer,
            )
        )
    if model.use_mmap:
        found.append(Fallback("no-mmap", "the model read into memory, not mapped", "--no-mmap", "use_mmap", False))
    if model.n_gpu_layers != 0 and (gpu_devices > 0 or model.rpc_servers):
        found.append(Fallback("cpu-only", "CPU only, no GPU offload", "-ngl 0", "n_gpu_layers", 0))
    if context.n_ctx == 0 or context.n_ctx > SMALL_CONTEXT:
        found.append(
            Fallback("small-context", f"a {SMALL_CONTEXT}-token context", f"-c {SMALL_CONTEXT}", "n_ctx", SMALL_CONTEXT)
        )
    return tuple(found)
