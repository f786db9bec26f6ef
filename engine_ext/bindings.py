"""ctypes access to llama.cpp: llama-cpp-python's bindings plus the llama-ext.h functions it lacks."""

from __future__ import annotations

import ctypes
import importlib
import sys
from collections.abc import Callable, Sequence
from functools import cache
from pathlib import Path
from types import ModuleType
from typing import Any

import llama_cpp
from llama_cpp import llama_cpp_ext

# Re-exported so the rest of engine_ext has one place that names the native library.
C = llama_cpp
ext = llama_cpp_ext
__all__ = [
    "C",
    "ext",
    "log_llama_to_stderr",
    "ExtensionUnavailable",
    "logits_address",
    "target_layer_ids",
    "missing_ext_functions",
    "mtmd",
    "MultimodalUnavailable",
]


# ggml.h's enum ggml_log_level. llama-cpp-python 0.3.36's own log callback maps levels by an older enum (DEBUG as
# INFO, ERROR as DEBUG): at its INFO level the log file got every debug line (thousands per model load) and no
# error, so llmtui installs its own callback.
GGML_LOG_LEVEL_DEBUG, GGML_LOG_LEVEL_INFO, GGML_LOG_LEVEL_WARN, GGML_LOG_LEVEL_ERROR = 1, 2, 3, 4
GGML_LOG_LEVEL_CONT = 5
_log_callbacks: list[Any] = []  # ctypes callbacks llama.cpp holds a pointer to: never collected


def log_llama_to_stderr(min_level: int = GGML_LOG_LEVEL_INFO) -> None:
    """Write llama.cpp's and ggml's log lines at `min_level` and up (a continuation as the line it continues)
    to sys.stderr, which is the engine log file in the worker."""
    keep_next = False

    @llama_cpp.llama_log_callback  # type: ignore[untyped-decorator,misc]
    def callback(level: int, text: bytes, _user_data: ctypes.c_void_p) -> None:
        nonlocal keep_next
        keep = keep_next if level == GGML_LOG_LEVEL_CONT else level >= min_level
        keep_next = keep
        if keep:
            sys.stderr.write(text.decode("utf-8", errors="replace"))
            sys.stderr.flush()  # the tail shown after a crash must hold the last lines

    _log_callbacks[:] = [callback]
    llama_cpp.llama_log_set(callback, ctypes.c_void_p(0))


class ExtensionUnavailable(RuntimeError):
    """The installed llama.cpp library does not export a llama-ext.h function llmtui needs."""


def _bind(symbols: Sequence[str], argtypes: list[Any], restype: Any) -> Callable[..., Any] | None:
    """Look a C++ (name-mangled) function up under each candidate symbol; None when none is exported."""
    lib = llama_cpp.llama_cpp._lib
    for symbol in symbols:
        func = getattr(lib, symbol, None)
        if func is not None:
            func.argtypes = argtypes
            func.restype = restype
            return func  # type: ignore[no-any-return]
    return None


class _ExtFunction:
    """A llama-ext.h function bound by mangled name; calling it when missing raises ExtensionUnavailable."""

    def __init__(self, name: str, symbols: Sequence[str], argtypes: list[Any], restype: Any) -> None:
        self.name = name
        self.symbols = tuple(symbols)
        self._func = _bind(symbols, argtypes, restype)

    @property
    def available(self) -> bool:
        return self._func is not None

    def __call__(self, *args: Any) -> Any:
        if self._func is None:
            raise ExtensionUnavailable(
                f"llama.cpp function {self.name} is not exported by the installed llama-cpp-python "
                f"(looked for {', '.join(self.symbols)}). llmtui needs llama-cpp-python==0.3.36 with its patches; "
                "rebuild it with scripts/setup.sh from a clone of llmtui"
            )
        return self._func(*args)


_ctx = llama_cpp.llama_context_p_ctypes
_model = llama_cpp.llama_model_p_ctypes


def _address_getter(name: str) -> Callable[..., int | None]:
    """A second binding of a `float * f(llama_context *)` function that returns the address as an int.

    `lib[name]` makes a function object of its own (attribute access would share llama-cpp-python's, whose
    restype is a float pointer): an int needs no pointer object and no ctypes.cast. Right after llama_decode
    every Python step runs with cold caches, so the verify loop reads the logits address this way.
    """
    func = llama_cpp.llama_cpp._lib[name]
    func.argtypes = [_ctx]
    func.restype = ctypes.c_void_p
    return func  # type: ignore[no-any-return]


# LLAMA_API float * llama_get_logits(struct llama_context * ctx): the address, or None
logits_address = _address_getter("llama_get_logits")

# Itanium (gcc/clang) and MSVC manglings; llama-ext.h is C++ without extern "C".

# LLAMA_API void llama_set_embeddings_layer_inp(struct llama_context * ctx, uint32_t lid, bool value);
set_embeddings_layer_inp = _ExtFunction(
    "llama_set_embeddings_layer_inp",
    (
        "_Z30llama_set_embeddings_layer_inpP13llama_contextjb",
        "?llama_set_embeddings_layer_inp@@YAXPEAUllama_context@@I_N@Z",
    ),
    [_ctx, ctypes.c_uint32, ctypes.c_bool],
    None,
)

# LLAMA_API float * llama_get_embeddings_layer_inp(struct llama_context * ctx, uint32_t lid);
get_embeddings_layer_inp = _ExtFunction(
    "llama_get_embeddings_layer_inp",
    (
        "_Z30llama_get_embeddings_layer_inpP13llama_contextj",
        "?llama_get_embeddings_layer_inp@@YAPEAMPEAUllama_context@@I@Z",
    ),
    [_ctx, ctypes.c_uint32],
    ctypes.POINTER(ctypes.c_float),
)

# LLAMA_API int32_t llama_model_dflash_selector_top_k(const struct llama_model * model);
model_dflash_selector_top_k = _ExtFunction(
    "llama_model_dflash_selector_top_k",
    (
        "_Z33llama_model_dflash_selector_top_kPK11llama_model",
        "?llama_model_dflash_selector_top_k@@YAHPEBUllama_model@@@Z",
    ),
    [_model],
    ctypes.c_int32,
)

# LLAMA_API const int32_t * llama_model_target_layer_ids(const struct llama_model * model);
model_target_layer_ids = _ExtFunction(
    "llama_model_target_layer_ids",
    (
        "_Z28llama_model_target_layer_idsPK11llama_model",
        "?llama_model_target_layer_ids@@YAPEBHPEBUllama_model@@@Z",
    ),
    [_model],
    ctypes.POINTER(ctypes.c_int32),
)

# LLAMA_API uint32_t llama_model_target_layer_ids_n(const struct llama_model * model);
model_target_layer_ids_n = _ExtFunction(
    "llama_model_target_layer_ids_n",
    (
        "_Z30llama_model_target_layer_ids_nPK11llama_model",
        "?llama_model_target_layer_ids_n@@YAIPEBUllama_model@@@Z",
    ),
    [_model],
    ctypes.c_uint32,
)

EXT_FUNCTIONS: tuple[_ExtFunction, ...] = (
    set_embeddings_layer_inp,
    get_embeddings_layer_inp,
    model_dflash_selector_top_k,
    model_target_layer_ids,
    model_target_layer_ids_n,
)


def target_layer_ids(model: Any) -> list[int]:
    """The target layer ids an EAGLE3/DFlash draft model reads (empty for other models)."""
    count = int(model_target_layer_ids_n(model))
    if count == 0:
        return []
    ids = model_target_layer_ids(model)
    return [int(ids[i]) for i in range(count)]


@cache
def ggml_lib() -> ctypes.CDLL:
    """libggml (the backend registry) from the directory llama-cpp-python loaded libllama from."""
    lib_dir = Path(C.llama_cpp._lib._name).parent
    # The soname libllama links against first: wheels hold copies, not symlinks, and opening another file
    # of the same library would load a second, separate backend registry.
    for name in ("libggml.so.0", "libggml.0.dylib", "libggml.so", "libggml.dylib", "ggml.dll"):
        if (lib_dir / name).exists():
            lib = ctypes.CDLL(str(lib_dir / name))
            break
    else:  # statically linked into libllama
        lib = C.llama_cpp._lib
    # size_t ggml_backend_reg_count(void); ggml_backend_reg_t ggml_backend_reg_get(size_t);
    # const char * ggml_backend_reg_name(ggml_backend_reg_t);
    lib.ggml_backend_reg_count.restype = ctypes.c_size_t
    lib.ggml_backend_reg_get.argtypes = [ctypes.c_size_t]
    lib.ggml_backend_reg_get.restype = ctypes.c_void_p
    lib.ggml_backend_reg_name.argtypes = [ctypes.c_void_p]
    lib.ggml_backend_reg_name.restype = ctypes.c_char_p
    # size_t ggml_backend_dev_count(void); ggml_backend_dev_t ggml_backend_dev_get(size_t);
    lib.ggml_backend_dev_count.restype = ctypes.c_size_t
    lib.ggml_backend_dev_get.argtypes = [ctypes.c_size_t]
    lib.ggml_backend_dev_get.restype = ctypes.c_void_p
    # const char * ggml_backend_dev_name/description(ggml_backend_dev_t);
    for fn in (lib.ggml_backend_dev_name, lib.ggml_backend_dev_description):
        fn.argtypes = [ctypes.c_void_p]
        fn.restype = ctypes.c_char_p
    # void ggml_backend_dev_memory(ggml_backend_dev_t, size_t * free, size_t * total);
    lib.ggml_backend_dev_memory.argtypes = [
        ctypes.c_void_p,
        ctypes.POINTER(ctypes.c_size_t),
        ctypes.POINTER(ctypes.c_size_t),
    ]
    lib.ggml_backend_dev_memory.restype = None
    # enum ggml_backend_dev_type ggml_backend_dev_type(ggml_backend_dev_t);
    lib.ggml_backend_dev_type.argtypes = [ctypes.c_void_p]
    lib.ggml_backend_dev_type.restype = ctypes.c_int
    # ggml_backend_reg_t ggml_backend_reg_by_name(const char * name);
    lib.ggml_backend_reg_by_name.argtypes = [ctypes.c_char_p]
    lib.ggml_backend_reg_by_name.restype = ctypes.c_void_p
    # void * ggml_backend_reg_get_proc_address(ggml_backend_reg_t reg, const char * name);
    lib.ggml_backend_reg_get_proc_address.argtypes = [ctypes.c_void_p, ctypes.c_char_p]
    lib.ggml_backend_reg_get_proc_address.restype = ctypes.c_void_p
    # void ggml_backend_register(ggml_backend_reg_t reg);
    lib.ggml_backend_register.argtypes = [ctypes.c_void_p]
    lib.ggml_backend_register.restype = None
    # ggml_backend_dev_t ggml_backend_dev_by_type(enum ggml_backend_dev_type type);
    lib.ggml_backend_dev_by_type.argtypes = [ctypes.c_int]
    lib.ggml_backend_dev_by_type.restype = ctypes.c_void_p
    return lib


class TensorBuftOverride(ctypes.Structure):
    """struct llama_model_tensor_buft_override { const char * pattern; ggml_backend_buffer_type_t buft; }"""

    _fields_ = [("pattern", ctypes.c_char_p), ("buft", ctypes.c_void_p)]


@cache
def ggml_cpu_buffer_type() -> int:
    """ggml_backend_cpu_buffer_type() from libggml-cpu (the soname libllama uses, as for ggml_lib)."""
    lib_dir = Path(C.llama_cpp._lib._name).parent
    for name in ("libggml-cpu.so.0", "libggml-cpu.0.dylib", "libggml-cpu.so", "libggml-cpu.dylib", "ggml-cpu.dll"):
        if (lib_dir / name).exists():
            lib = ctypes.CDLL(str(lib_dir / name))
            break
    else:
        lib = C.llama_cpp._lib
    # ggml_backend_buffer_type_t ggml_backend_cpu_buffer_type(void);
    lib.ggml_backend_cpu_buffer_type.restype = ctypes.c_void_p
    return int(lib.ggml_backend_cpu_buffer_type())


@cache
def cpu_extra_buffer_types() -> tuple[str, ...]:
    """Names of the CPU backend's extra buffer types in this build on this CPU (e.g. AMX, CPU_REPACK, KLEIDIAI):
    where llama.cpp puts weights it repacks for the CPU's matrix instructions unless --no-repack. Empty when the
    build has none or the CPU supports none (ggml-cpu.cpp ggml_backend_cpu_device_get_extra_buffers_type)."""
    C.llama_backend_init()
    lib = ggml_lib()
    reg = lib.ggml_backend_reg_by_name(b"CPU")
    dev = lib.ggml_backend_dev_by_type(0)  # GGML_BACKEND_DEVICE_TYPE_CPU
    if not reg or not dev:
        return ()
    address = lib.ggml_backend_reg_get_proc_address(reg, b"ggml_backend_dev_get_extra_bufts")
    if not address:
        return ()
    # ggml_backend_buffer_type_t * (*)(ggml_backend_dev_t): a NULL-terminated array
    get_extra = ctypes.CFUNCTYPE(ctypes.POINTER(ctypes.c_void_p), ctypes.c_void_p)(address)
    # const char * ggml_backend_buft_name(ggml_backend_buffer_type_t buft);
    lib.ggml_backend_buft_name.argtypes = [ctypes.c_void_p]
    lib.ggml_backend_buft_name.restype = ctypes.c_char_p
    array = get_extra(dev)
    names: list[str] = []
    for i in range(16):  # ggml lists at most a handful (AMX, KleidiAI, repack, SpaceMiT); never loop unbounded
        if not array or not array[i]:
            break
        names.append((lib.ggml_backend_buft_name(array[i]) or b"?").decode("utf-8", errors="replace"))
    return tuple(names)


def offload_device_count() -> int:
    """How many devices ggml can offload to here (GPUs, integrated GPUs, accelerators; RPC servers join later)."""
    C.llama_backend_init()
    lib = ggml_lib()
    count = min(int(lib.ggml_backend_dev_count()), 256)  # never loop on a garbage count
    return sum(1 for i in range(count) if lib.ggml_backend_dev_type(lib.ggml_backend_dev_get(i)) in (1, 2, 3))


def missing_ext_functions() -> list[str]:
    """Names of the llama-ext.h functions the installed library does not export."""
    return [f.name for f in EXT_FUNCTIONS if not f.available]


class MultimodalUnavailable(RuntimeError):
    """The installed engine has no libmtmd (llama-cpp-python built with LLAVA_BUILD off)."""


@cache
def mtmd() -> ModuleType:
    """llama-cpp-python's libmtmd bindings (llama_cpp.mtmd_cpp), loaded on first use: importing them opens libmtmd,
    which an engine built without the multimodal library lacks (MultimodalUnavailable then)."""
    try:
        module = importlib.import_module("llama_cpp.mtmd_cpp")
    except (OSError, RuntimeError, FileNotFoundError) as exc:
        raise MultimodalUnavailable(
            "this engine was built without libmtmd (llama.cpp's multimodal library), so it cannot read images; "
            f"rebuild it with scripts/setup.sh ({exc})"
        ) from None
    if _log_callbacks:  # libmtmd logs through llmtui's callback too (the engine log, at its level), not to stderr raw
        module.mtmd_log_set(_log_callbacks[0], None)
        module.mtmd_helper_log_set(_log_callbacks[0], None)
    return module
