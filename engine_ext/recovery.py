"""After the engine worker dies natively: the automatic retry with one CPU extra buffer type fewer, remembered for
this CPU and engine build, and the fallbacks a user can try next. One policy for the chat app and every command.

A Xeon with AMX crashed on the first message inside llama.cpp's AMX path (`ggml_backend_amx_mul_mat`; a GCC 12
miscompile that patch 0003 fixes), and so did llama.cpp's own tools built from the same source. A crash while
loading or during the first replies after a load, with weights repacked, is blamed on the repacking: the worker is
started again without the first extra buffer type it repacked for (AMX before CPU_REPACK, llama.cpp's order), the
others kept (patch 0004's GGML_CPU_SKIP_EXTRA_BUFTS), and that is remembered in a small file keyed by this CPU and
this engine build, so the next start does not crash again. A crash that persists drops the next one, down to none.
A new engine build (or another CPU) starts with a clean slate; `llmtui doctor --forget-crashes` forgets by hand.
"""

from __future__ import annotations

import hashlib
import json
import time
from dataclasses import dataclass, replace
from pathlib import Path

from engine_ext.params import ContextParams, ModelParams

SKIP_ENV = "GGML_CPU_SKIP_EXTRA_BUFTS"  # patch 0004: CPU extra buffer types (by name) the worker leaves out
MEMORY_MAX_BYTES = 64 * 1024  # the memory file is tiny; anything bigger is not ours and reads as empty
MEMORY_MAX_ENTRIES = 32  # CPUs x engine builds remembered (the oldest are dropped)

# A crash while loading, or before this many replies have finished since the load, counts as early.
EARLY_REPLIES = 2
SMALL_CONTEXT = 2048


def native_crash(exit_code: int | None) -> bool:
    """Whether a worker's exit status is a native fault (SIGSEGV, SIGBUS, SIGILL, SIGFPE, SIGABRT), not a kill (the
    out-of-memory killer's SIGKILL, a user's SIGTERM) or an exit."""
    import signal

    faults = {signal.SIGSEGV, signal.SIGILL, signal.SIGFPE, signal.SIGABRT, getattr(signal, "SIGBUS", signal.SIGSEGV)}
    return exit_code is not None and exit_code < 0 and -exit_code in {int(f) for f in faults}


def blames_repacking(phase: str) -> bool:
    """Whether a native crash in `phase` (engine_ext.engine_status) can be the repacked weights': loading them, or a
    decode or an image's encode, where their kernels run; never a grammar, the tokenizer or a sampler. An unknown
    phase ("": a worker that marked none) is blamed, as before phases were marked."""
    from engine_ext.engine_status import REPACKED_WEIGHTS_PHASES

    return not phase or phase in REPACKED_WEIGHTS_PHASES


REQUEST_CRASH_ADVICE = "the request was refused; the speed settings are kept (the crash was not theirs)"
REQUEST_PHASES = frozenset({"grammar", "tokenize", "sample"})  # native work on what a request brings


def request_crash(exit_code: int | None, phase: str) -> bool:
    """Whether a worker's death was a native fault in the request's own native work (its grammar, its text's
    tokens, its sampler): the request is refused, the engine restarted as it was, nothing remembered."""
    return native_crash(exit_code) and phase in REQUEST_PHASES


def repack_retry(model: ModelParams, extra_bufts: tuple[str, ...]) -> ModelParams | None:
    """The model parameters to retry an early native crash with: repacking off, when it was on and this build on this
    CPU has extra buffer types to repack into; None when there is nothing to turn off. (What an engine without patch
    0004 can do; `next_skip` drops one buffer type at a time.)"""
    if model.use_extra_bufts and extra_bufts:
        return replace(model, use_extra_bufts=False)
    return None


def next_skip(model: ModelParams, skipped: tuple[str, ...], extra_bufts: tuple[str, ...]) -> tuple[str, ...] | None:
    """The extra buffer types to leave out after an early native crash: those left out already and the first one the
    crashed worker still repacked for (`extra_bufts`, in llama.cpp's order: AMX, KLEIDIAI, CPU_REPACK). None when
    repacking was off or there is none left to drop: the crash was not the repacking's."""
    if not model.use_extra_bufts or not extra_bufts:
        return None
    return (*skipped, extra_bufts[0])


def retry_notice(dropped: str, kept: tuple[str, ...], keep_off: str) -> str:
    """The one line said when the engine is restarted without the extra buffer type `dropped` (`kept`: those it still
    repacks for); `keep_off` says how to turn repacking off altogether."""
    rest = f"{', '.join(kept)} kept" if kept else "no repacking left"
    return (
        f"The engine crashed natively with CPU weights repacked for {dropped}; restarted without {dropped} ({rest}), "
        f"and it stays so on this CPU with this engine build. {keep_off}"
    )


def machine_key(cpuinfo: Path = Path("/proc/cpuinfo"), engine_dir: Path | None = None) -> str:
    """This CPU (its model name and feature flags) and this engine build (the installed llama_cpp package's
    libraries: size and time, and its build record), as a short hash; read without importing llama_cpp."""
    digest = hashlib.sha256()
    try:
        with open(cpuinfo, "rb") as file:
            text = file.read(256 * 1024).decode("ascii", "replace")
        first = text.split("\n\n", 1)[0]
        digest.update(
            "\n".join(
                line for line in first.splitlines() if line.startswith(("model name", "flags", "Features", "CPU part"))
            ).encode()
        )
    except OSError:
        import platform

        digest.update(f"{platform.machine()} {platform.processor()}".encode())
    if engine_dir is None:
        import importlib.util

        spec = importlib.util.find_spec("llama_cpp")
        engine_dir = Path(spec.origin).parent if spec is not None and spec.origin else None
    if engine_dir is not None:
        for path in sorted((engine_dir / "lib").glob("*")) + [engine_dir / "llmtui_engine.json"]:
            try:
                st = path.stat()
            except OSError:
                continue
            digest.update(f"{path.name} {st.st_size} {st.st_mtime_ns}".encode())
    return digest.hexdigest()[:24]


class RepackMemory:
    """Which CPU extra buffer types crashed this CPU with this engine build: a small JSON file (0600), read bounded
    (a missing, oversized or garbled file is an empty memory), written whole."""

    def __init__(self, path: Path, key: str | None = None) -> None:
        self.path = Path(path)
        self.key = key if key is not None else machine_key()

    def _entries(self) -> dict[str, dict[str, object]]:
        try:
            with open(self.path, "rb") as file:
                raw = file.read(MEMORY_MAX_BYTES + 1)
            data = json.loads(raw) if len(raw) <= MEMORY_MAX_BYTES else {}
        except (OSError, ValueError):
            return {}
        entries = data.get("entries") if isinstance(data, dict) else None
        return {k: v for k, v in entries.items() if isinstance(v, dict)} if isinstance(entries, dict) else {}

    def skipped(self) -> tuple[str, ...]:
        """The extra buffer types to leave out on this CPU with this engine build (names of at most 32 characters)."""
        skip = self._entries().get(self.key, {}).get("skip")
        if not isinstance(skip, list):
            return ()
        return tuple(s for s in skip if isinstance(s, str) and 0 < len(s) <= 32 and s.replace("_", "").isalnum())[:8]

    def describe(self) -> str:
        """One line for `llmtui doctor`: what is left out since when, or ""."""
        entry = self._entries().get(self.key, {})
        skip = self.skipped()
        if not skip:
            return ""
        when = entry.get("when")
        since = f" since {when}" if isinstance(when, str) and len(when) <= 32 else ""
        return f"left out after a native crash{since}: {', '.join(skip)}"

    def remember(self, skip: tuple[str, ...]) -> None:
        entries = self._entries()
        entries.pop(self.key, None)
        entries[self.key] = {"skip": list(skip), "when": time.strftime("%Y-%m-%d %H:%M")}
        self._write(dict(list(entries.items())[-MEMORY_MAX_ENTRIES:]))

    def forget(self) -> bool:
        """Forget this CPU's and build's entry; whether there was one."""
        entries = self._entries()
        if entries.pop(self.key, None) is None:
            return False
        self._write(entries)
        return True

    def _write(self, entries: dict[str, dict[str, object]]) -> None:
        from engine_ext.private_files import write_private_text

        write_private_text(self.path, json.dumps({"version": 1, "entries": entries}, indent=1))


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
