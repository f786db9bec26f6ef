"""Engine parameters and errors: plain data shared by the client (UI process) and the worker."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from engine_ext.spec_catalog import SPEC_TYPE_NAMES

FlashAttention = Literal["auto", "on", "off"]

# KV cache element types llama.cpp accepts for K and V (names as in llama.cpp's --cache-type-k/-v).
KV_CACHE_TYPES: tuple[str, ...] = ("f32", "f16", "bf16", "q8_0", "q4_0", "q4_1", "iq4_nl", "q5_0", "q5_1")

SPLIT_MODES: tuple[str, ...] = ("none", "layer", "row", "tensor")  # llama_split_mode 0..3

# -ngl auto: as many layers as the free device memory holds (engine_ext.placement resolves it before loading)
GPU_LAYERS_AUTO = -2
DEFAULT_FIT_TARGET_MIB = 1024  # memory left free on each device by -ngl auto (llama.cpp's --fit-target default)

DEFAULT_SEED = 0xFFFFFFFF  # LLAMA_DEFAULT_SEED: a random seed per generation


def ascii_digits(text: str) -> bool:
    """Whether ``text`` is one or more ASCII digits 0-9: the numbers llama.cpp (std::stoi), GGUF tensor names, host
    ports and HTTP headers mean. str.isdigit() also accepts '١', '²' and every other Unicode digit, and int() reads
    most of them ('direction.١' would be layer 1), so text from a file or a server is checked with this."""
    return text.isascii() and text.isdigit()


class EngineError(Exception):
    """An error a user can act on (bad file, bad setting); the message says what and what to do."""


class ModelLoadError(EngineError):
    """llama.cpp could not load a model file."""


class ContextError(EngineError):
    """llama.cpp could not create or use a context."""


@dataclass(frozen=True)
class ModelParams:
    """How a model file is loaded (llama.cpp names: -ngl, --no-mmap, --mlock, --no-repack)."""

    n_gpu_layers: int = -1  # -1: every layer that the backend can take; GPU_LAYERS_AUTO: fit to free memory
    use_mmap: bool = True
    use_mlock: bool = False
    # CPU weights in llama.cpp's extra buffer types (AMX, CPU_REPACK, KleidiAI: weights repacked for this CPU's
    # matrix instructions); False is llama.cpp's --no-repack, the way around a repack path that crashes a CPU.
    use_extra_bufts: bool = True
    load_mtp: bool = False  # load NextN (MTP) head weights; required before an MTP context is made
    main_gpu: int = 0
    rpc_servers: tuple[str, ...] = ()  # llama.cpp RPC servers (host:port) whose devices join this machine's
    split_mode: str = "layer"  # none | layer | row | tensor (tensor: llama.cpp's meta-backend parallelism)
    tensor_split: tuple[float, ...] = ()  # share of the model per device (llama.cpp --tensor-split)
    n_cpu_moe: int = 0  # keep the expert tensors of the first N layers on the CPU (--n-cpu-moe)
    fit_target_mib: int = DEFAULT_FIT_TARGET_MIB  # with -ngl auto: MiB to leave free on each device
    mmproj: str | None = None  # the model's multimodal projector (llama.cpp --mmproj): images through libmtmd

    def validate(self) -> None:
        """Refuse what llama.cpp would reject or abort on."""
        if self.split_mode not in SPLIT_MODES:
            raise EngineError(f"split mode must be one of {', '.join(SPLIT_MODES)}, not {self.split_mode!r}")
        if self.tensor_split and self.split_mode == "none":
            raise EngineError("--tensor-split needs a split mode other than none")
        if any(v < 0 for v in self.tensor_split) or (self.tensor_split and sum(self.tensor_split) <= 0):
            raise EngineError("--tensor-split takes non-negative shares that add up to more than 0")
        if self.n_cpu_moe < 0 or self.main_gpu < 0:
            raise EngineError("--n-cpu-moe and --main-gpu must not be negative")
        if self.n_gpu_layers < GPU_LAYERS_AUTO:
            raise EngineError(f"GPU layers must be auto, -1 (all), 0 (none) or a count, not {self.n_gpu_layers}")
        if self.n_gpu_layers == GPU_LAYERS_AUTO and self.split_mode == "tensor":
            raise EngineError("-ngl auto cannot plan -sm tensor (llama.cpp's fit refuses it too); give -ngl a count")
        if self.fit_target_mib < 0:
            raise EngineError("--fit-target must not be negative")


@dataclass(frozen=True)
class ContextParams:
    """How a context is made (llama.cpp names: -c, -b, -ub, -t, -tb, -fa, -ctk, -ctv)."""

    n_ctx: int = 4096  # 0: the model's training context
    n_batch: int = 2048
    n_ubatch: int = 512
    n_threads: int = 0  # 0: default_threads()
    n_threads_batch: int = 0  # 0: same as n_threads
    flash_attn: FlashAttention = "auto"
    type_k: str = "f16"
    type_v: str = "f16"
    n_seq_max: int = 1
    n_rs_seq: int = 0  # recurrent-state rollback depth (speculative decoding on GDN/Mamba models)

    def validate(self) -> None:
        """Refuse values llama.cpp would reject or abort on."""
        if self.n_ctx < 0:
            raise ContextError(f"context size must be 0 (model default) or positive, not {self.n_ctx}")
        if self.n_batch < 1 or self.n_ubatch < 1:
            raise ContextError("batch and micro-batch sizes must be at least 1")
        if self.n_threads < 0 or self.n_threads_batch < 0:
            raise ContextError("thread counts must be positive (0 picks the default)")
        for name in (self.type_k, self.type_v):
            if name not in KV_CACHE_TYPES:
                raise ContextError(f"unknown KV cache type {name!r}; use one of {', '.join(sorted(KV_CACHE_TYPES))}")
        if self.flash_attn not in ("auto", "on", "off"):
            raise ContextError(f"flash attention must be auto, on or off, not {self.flash_attn!r}")
        if self.type_v != "f16" and self.type_v != "f32" and self.flash_attn == "off":
            raise ContextError("a quantized V cache needs flash attention (-fa on or auto)")


@dataclass(frozen=True)
class SamplingParams:
    """A sampling preset (llama.cpp names); temperature 0 means greedy."""

    temperature: float = 0.8
    top_k: int = 40
    top_p: float = 0.95
    min_p: float = 0.05
    repeat_penalty: float = 1.0
    repeat_last_n: int = 64
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    seed: int = DEFAULT_SEED

    @property
    def greedy(self) -> bool:
        return self.temperature <= 0.0

    def validate(self) -> None:
        if self.temperature < 0:
            raise EngineError(f"temperature must be ≥ 0, not {self.temperature}")
        if self.top_k < 0:
            raise EngineError(f"top-k must be ≥ 0 (0 disables it), not {self.top_k}")
        if not 0.0 <= self.top_p <= 1.0:
            raise EngineError(f"top-p must be between 0 and 1, not {self.top_p}")
        if not 0.0 <= self.min_p <= 1.0:
            raise EngineError(f"min-p must be between 0 and 1, not {self.min_p}")
        if self.repeat_penalty <= 0:
            raise EngineError(f"repeat penalty must be > 0 (1 disables it), not {self.repeat_penalty}")
        if self.repeat_last_n < -1:
            raise EngineError("repeat-last-n must be -1 (whole context), 0 (off) or positive")


GREEDY = SamplingParams(temperature=0.0)


# Speculative types in upstream's chain order (common/speculative.cpp: the first that drafts wins); auto first.
SPEC_TYPES: tuple[str, ...] = SPEC_TYPE_NAMES


class SpeculativeConfigError(EngineError):
    """A speculative configuration llama.cpp would reject or abort on."""


@dataclass(frozen=True)
class SpeculativeParams:
    """Speculative decoding settings (llama.cpp names: --spec-type, --spec-draft-*); no types: off."""

    types: tuple[str, ...] = ()
    draft_model: str | None = None  # draft-simple: path of a smaller model with a compatible vocabulary
    n_max: int = 16  # most tokens drafted per step
    n_min: int = 0  # drafts shorter than this are not verified
    p_min: float = 0.0  # model drafters stop at a token whose top-10 probability is below this
    # Draft lengths as upstream (n_max for model drafters, each n-gram type's own) instead of starting short and
    # growing with acceptance: for comparing acceptance with llama.cpp's own tools (--spec-draft-fixed).
    fixed_length: bool = False

    @property
    def enabled(self) -> bool:
        return bool(self.types)

    def validate(self) -> None:
        unknown = [t for t in self.types if t not in SPEC_TYPES]
        if unknown:
            raise SpeculativeConfigError(
                f"unknown speculative type {', '.join(unknown)}; use one of {', '.join(SPEC_TYPES)}"
            )
        if self.n_max < 1:
            raise SpeculativeConfigError(f"--spec-draft-n-max must be at least 1, not {self.n_max}")
        if not 0 <= self.n_min <= self.n_max:
            raise SpeculativeConfigError("--spec-draft-n-min must be between 0 and --spec-draft-n-max")
        if not 0.0 <= self.p_min <= 1.0:
            raise SpeculativeConfigError(f"--spec-draft-p-min must be between 0 and 1, not {self.p_min}")
        if "auto" in self.types and len(self.types) > 1:
            raise SpeculativeConfigError("--spec-type auto picks the drafters itself: give it alone")
        if "draft-simple" in self.types and not self.draft_model:
            raise SpeculativeConfigError("draft-simple needs a draft model (--spec-draft-model PATH)")


# llama.cpp takes any strength (--control-vector-scaled FILE S): vectors made by llama-cvector-generator steer at
# ±4 or more. Far beyond this the hidden states overflow (inf, then NaN logits); nothing sensible needs it.
MAX_STEERING_STRENGTH = 1000.0


@dataclass(frozen=True)
class SteeringEntry:
    """One control vector in the mix (llama.cpp: --control-vector-scaled F:S, --control-vector-layer-range)."""

    path: str
    strength: float = 1.0  # any finite number within ±MAX_STEERING_STRENGTH, as llama.cpp takes it
    layer_start: int = 0  # first steered layer (0: the architecture's default)
    layer_end: int = 0  # last steered layer, inclusive (0: the architecture's default)
    layer_weights: tuple[float, ...] = ()  # optional per-layer factors, index = layer - 1

    def validate(self) -> None:
        if not -MAX_STEERING_STRENGTH <= self.strength <= MAX_STEERING_STRENGTH:  # also refuses NaN
            raise EngineError(
                f"steering strength must be a number from -{MAX_STEERING_STRENGTH:g} to "
                f"{MAX_STEERING_STRENGTH:g}, not {self.strength}"
            )
        if self.layer_start < 0 or self.layer_end < 0 or (self.layer_end and self.layer_end < self.layer_start):
            raise EngineError(f"invalid steering layer range {self.layer_start}..{self.layer_end}")
