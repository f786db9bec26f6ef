"""Engine parameters and errors: plain data shared by the client (UI process) and the worker."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, Literal

from engine_ext import settings_schema as s
from engine_ext.settings_schema import (  # noqa: F401 - the names the engine's users import from here
    DEFAULT_SEED,
    GPU_LAYERS_AUTO,
    KV_CACHE_TYPES,
    SPLIT_MODES,
    Setting,
    SettingError,
)

FlashAttention = Literal["auto", "on", "off"]

DEFAULT_FIT_TARGET_MIB = s.FIT_TARGET_MIB.default  # memory left free on each device by -ngl auto


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


class PromptTooLong(EngineError):
    """The prompt does not fit the context even after dropping old turns (its sizes go to the API server's 400)."""

    def __init__(self, n_prompt_tokens: int, n_ctx: int) -> None:
        super().__init__(
            f"the prompt is {n_prompt_tokens} tokens but the context holds {n_ctx}; "
            "start a new conversation or raise the context size (-c)"
        )
        self.n_prompt_tokens = n_prompt_tokens
        self.n_ctx = n_ctx


def check_settings(values: object, settings: Iterable[Setting[Any]], error: type[EngineError] = EngineError) -> None:
    """The declarations' range/choices check (engine_ext.settings_schema) on `values`, raising `error`."""
    try:
        s.check_all(values, settings)
    except SettingError as refusal:
        raise error(str(refusal)) from None


@dataclass(frozen=True)
class ModelParams:
    """How a model file is loaded (llama.cpp names: -ngl, --no-mmap, --mlock, --no-repack)."""

    n_gpu_layers: int = s.N_GPU_LAYERS.default  # -1: every layer the backend can take; GPU_LAYERS_AUTO: fit
    use_mmap: bool = s.USE_MMAP.default
    use_mlock: bool = s.USE_MLOCK.default
    # CPU weights in llama.cpp's extra buffer types (AMX, CPU_REPACK, KleidiAI: weights repacked for this CPU's
    # matrix instructions); False is llama.cpp's --no-repack, the way around a repack path that crashes a CPU.
    use_extra_bufts: bool = s.USE_EXTRA_BUFTS.default
    load_mtp: bool = False  # load NextN (MTP) head weights; required before an MTP context is made
    main_gpu: int = s.MAIN_GPU.default
    rpc_servers: tuple[str, ...] = ()  # llama.cpp RPC servers (host:port) whose devices join this machine's
    split_mode: str = s.SPLIT_MODE.default  # none | layer | row | tensor (tensor: llama.cpp's meta-backend's)
    tensor_split: tuple[float, ...] = ()  # share of the model per device (llama.cpp --tensor-split)
    n_cpu_moe: int = s.N_CPU_MOE.default  # keep the expert tensors of the first N layers on the CPU
    fit_target_mib: int = s.FIT_TARGET_MIB.default  # with -ngl auto: MiB to leave free on each device
    mmproj: str | None = None  # the model's multimodal projector (llama.cpp --mmproj): images through libmtmd

    def validate(self) -> None:
        """Refuse what llama.cpp would reject or abort on."""
        check_settings(self, s.MODEL)
        if self.tensor_split and self.split_mode == "none":
            raise EngineError("--tensor-split needs a split mode other than none")
        if any(v < 0 for v in self.tensor_split) or (self.tensor_split and sum(self.tensor_split) <= 0):
            raise EngineError("--tensor-split takes non-negative shares that add up to more than 0")
        if self.n_gpu_layers == GPU_LAYERS_AUTO and self.split_mode == "tensor":
            raise EngineError("-ngl auto cannot plan -sm tensor (llama.cpp's fit refuses it too); give -ngl a count")


@dataclass(frozen=True)
class ContextParams:
    """How a context is made (llama.cpp names: -c, -b, -ub, -t, -tb, -fa, -ctk, -ctv)."""

    n_ctx: int = s.N_CTX.default  # 0: the model's training context
    n_batch: int = s.N_BATCH.default
    n_ubatch: int = s.N_UBATCH.default
    n_threads: int = s.N_THREADS.default  # 0: default_threads()
    n_threads_batch: int = 0  # 0: same as n_threads
    flash_attn: FlashAttention = s.FLASH_ATTN.default  # type: ignore[assignment]
    type_k: str = s.TYPE_K.default
    type_v: str = s.TYPE_V.default
    n_seq_max: int = 1
    n_rs_seq: int = 0  # recurrent-state rollback depth (speculative decoding on GDN/Mamba models)
    # With n_seq_max > 1 (parallel sequences): one KV buffer shared by all sequences (llama.cpp --kv-unified, what
    # llama-server's default -np takes), so a sequence can share another's prompt prefix; False: n_ctx / n_seq_max each.
    kv_unified: bool = True

    def validate(self) -> None:
        """Refuse values llama.cpp would reject or abort on."""
        check_settings(self, s.CONTEXT, ContextError)
        if self.n_threads_batch < 0:
            raise ContextError("thread counts must be positive (0 picks the default)")
        if self.type_v != "f16" and self.type_v != "f32" and self.flash_attn == "off":
            raise ContextError("a quantized V cache needs flash attention (-fa on or auto)")


@dataclass(frozen=True)
class DiskCacheParams:
    """The prompt cache on disk (engine_ext.disk_cache): the folder of state files ("": off), or one file (`run
    --prompt-cache FILE`, read only with --prompt-cache-ro), and the budget."""

    folder: str = ""
    budget_mib: int = s.CACHE_BUDGET_MIB.default  # 0: the smaller of 10 GiB and 10% of the free space
    file: str = ""
    read_only: bool = False

    @property
    def enabled(self) -> bool:
        return bool(self.folder or self.file)


@dataclass(frozen=True)
class SamplingParams:
    """A sampling preset (llama.cpp names); temperature 0 means greedy."""

    temperature: float = s.TEMPERATURE.default
    top_k: int = s.TOP_K.default
    top_p: float = s.TOP_P.default
    min_p: float = s.MIN_P.default
    repeat_penalty: float = s.REPEAT_PENALTY.default
    repeat_last_n: int = s.REPEAT_LAST_N.default
    presence_penalty: float = s.PRESENCE_PENALTY.default
    frequency_penalty: float = s.FREQUENCY_PENALTY.default
    seed: int = s.SEED.default
    # llama-server's further samplers (s.SAMPLING_MORE)
    top_n_sigma: float = s.TOP_N_SIGMA.default
    typical_p: float = s.TYPICAL_P.default
    mirostat: int = s.MIROSTAT.default
    mirostat_tau: float = s.MIROSTAT_TAU.default
    mirostat_eta: float = s.MIROSTAT_ETA.default
    dry_multiplier: float = s.DRY_MULTIPLIER.default
    dry_base: float = s.DRY_BASE.default
    dry_allowed_length: int = s.DRY_ALLOWED_LENGTH.default
    dry_penalty_last_n: int = s.DRY_PENALTY_LAST_N.default
    dry_sequence_breakers: tuple[str, ...] = s.DRY_SEQUENCE_BREAKERS
    xtc_probability: float = s.XTC_PROBABILITY.default
    xtc_threshold: float = s.XTC_THRESHOLD.default
    samplers: tuple[str, ...] = s.SAMPLER_NAMES  # their order (llama.cpp's names); mirostat replaces them

    @property
    def greedy(self) -> bool:
        return self.temperature <= 0.0

    def validate(self) -> None:
        check_settings(self, (*s.SAMPLING, *s.SAMPLING_MORE))
        unknown = [name for name in self.samplers if name not in s.SAMPLER_NAMES]
        if unknown:
            raise EngineError(f"unknown sampler {unknown[0][:40]!r}: {', '.join(s.SAMPLER_NAMES)}")


GREEDY = SamplingParams(temperature=0.0)


# Speculative types in upstream's chain order (common/speculative.cpp: the first that drafts wins); auto first.
SPEC_TYPES: tuple[str, ...] = s.SPEC_TYPE.choices


class SpeculativeConfigError(EngineError):
    """A speculative configuration llama.cpp would reject or abort on."""


@dataclass(frozen=True)
class SpeculativeParams:
    """Speculative decoding settings (llama.cpp names: --spec-type, --spec-draft-*); no types: off."""

    types: tuple[str, ...] = ()
    draft_model: str | None = None  # draft-simple: path of a smaller model with a compatible vocabulary
    n_max: int = s.DRAFT_N_MAX.default  # most tokens drafted per step
    n_min: int = s.DRAFT_N_MIN.default  # drafts shorter than this are not verified
    p_min: float = s.DRAFT_P_MIN.default  # model drafters stop at a token whose top-10 probability is below this
    # Draft lengths as upstream (n_max for model drafters, each n-gram type's own) instead of starting short and
    # growing with acceptance: for comparing acceptance with llama.cpp's own tools (--spec-draft-fixed).
    fixed_length: bool = s.DRAFT_FIXED.default

    @property
    def enabled(self) -> bool:
        return bool(self.types)

    def validate(self) -> None:
        unknown = [t for t in self.types if t not in SPEC_TYPES]
        if unknown:
            raise SpeculativeConfigError(
                f"unknown speculative type {', '.join(unknown)}; use one of {', '.join(SPEC_TYPES)}"
            )
        check_settings(self, (*s.DRAFT_NUMBERS, s.DRAFT_FIXED), SpeculativeConfigError)
        if self.n_min > self.n_max:
            raise SpeculativeConfigError(f"{s.DRAFT_N_MIN.flag} must be between 0 and {s.DRAFT_N_MAX.flag}")
        if "auto" in self.types and len(self.types) > 1:
            raise SpeculativeConfigError(f"{s.SPEC_TYPE.flag} auto picks the drafters itself: give it alone")
        if "draft-simple" in self.types and not self.draft_model:
            raise SpeculativeConfigError(f"draft-simple needs a draft model ({s.DRAFT_MODEL.flag} PATH)")


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
