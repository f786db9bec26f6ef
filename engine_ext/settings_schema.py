"""The settings model: every engine, sampling and speculative setting declared once, with its type, default, range or
choices, help, llama.cpp's flag and the config.toml table it is saved in (the declaration type: engine_ext.setting).

Everything else is derived from these declarations: the engine params' defaults and validation (engine_ext.params),
the command line's flags, defaults and ranges (app/cli/flags.py, app/cli/engine_args.py), config.toml's reading,
checking and writing (app/core/config.py, with tomlkit: the user's comments and order stay), and the fields, labels,
defaults and checks of the settings screen (F3), the speculative panel (F9) and the conversation settings (sampling
presets). The speculative settings are declared beside the types they apply to, in the speculative catalogue
(engine_ext.spec_catalog: SPEC_TYPE's choices are its types, its table names their flags), and listed here with the
rest. App-only settings (theme, UI switches) are declared the same way in app/core/app_settings_schema.py. This module
imports nothing from llmtui but engine_ext.setting and engine_ext.spec_catalog, never textual, rich or llama_cpp.

How to add a setting:

1. Declare it once: ``NEW = Setting("name", int, default, "help for --help", label="words for messages",
   flag="--llama-cpp-flag", saved_in="engine", minimum=..., maximum=...)``: here for the engine and sampling,
   in engine_ext/spec_catalog.py for speculative decoding, in app/core/app_settings_schema.py for the UI only. Add it
   to its group (MODEL, CONTEXT, ENGINE, SAMPLING, SPECULATIVE here; UI, SPECULATIVE, PRESET in
   app/core/app_settings_schema.py): the group gives it its config.toml key (``saved_in``), its CLI flag (``flag``,
   the command's add_*_args), its field on the screen that shows the group and its range/choices check on every one
   of those surfaces.
2. Add the field to the dataclass that carries it, with ``= NEW.default``: the engine params (ModelParams,
   ContextParams, SamplingParams, SpeculativeParams) and, for a saved setting, the app's settings dataclass of the
   same group (app/core/config.py: EngineSettings, SpeculativeSettings, SamplingSettings, Config). Values go from one
   to the other by ``values_of(settings, GROUP)``, never field by field.
3. Use it where it takes effect (the worker, the sampler chain, a drafter). Nothing else: the flag, the config key,
   the screen field, its default and the range check all come from the declaration (tests/unit/test_settings_schema.py
   checks that every surface agrees with it).
"""

from __future__ import annotations

from typing import Any

from engine_ext.setting import Setting, SettingError, check_all, values_of  # noqa: F401 - the declarations' users
from engine_ext.spec_catalog import (  # noqa: F401 - the speculative settings, declared with the catalogue's types
    DRAFT_FIXED,
    DRAFT_MODEL,
    DRAFT_N_MAX,
    DRAFT_N_MIN,
    DRAFT_NUMBERS,
    DRAFT_P_MIN,
    SPEC_TYPE,
)

INT32_MAX = (1 << 31) - 1
UINT32_MAX = (1 << 32) - 1
MAX_CONTEXT = 1 << 24  # beyond it llama.cpp's KV cache cannot be allocated
GPU_LAYERS_AUTO = -2  # -ngl auto: as many layers as the free device memory holds (engine_ext.placement)
DEFAULT_SEED = 0xFFFFFFFF  # LLAMA_DEFAULT_SEED: a random seed per generation
# KV cache element types llama.cpp accepts for K and V (names as in llama.cpp's --cache-type-k/-v).
KV_CACHE_TYPES: tuple[str, ...] = ("f32", "f16", "bf16", "q8_0", "q4_0", "q4_1", "iq4_nl", "q5_0", "q5_1")
SPLIT_MODES: tuple[str, ...] = ("none", "layer", "row", "tensor")  # llama_split_mode 0..3
FLASH_ATTENTION_MODES: tuple[str, ...] = ("auto", "on", "off")


# ----- how a model loads (ModelParams) --------------------------------------------------------------------------

N_GPU_LAYERS = Setting(
    "n_gpu_layers",
    int,
    -1,
    "layers on the GPU (-1 or all: every layer; auto: as many as free device memory holds)",
    label="GPU layers",
    short="-ngl",
    flag="--n-gpu-layers",
    saved_in="engine",
    minimum=GPU_LAYERS_AUTO,
    maximum=INT32_MAX,
    meaning="auto, -1 all, 0 none",
    wanted="auto, -1 (all), 0 (none) or a positive number",
)
FIT_TARGET_MIB = Setting(
    "fit_target_mib",
    int,
    1024,  # llama.cpp's --fit-target default
    "with -ngl auto: memory to leave free on each device",
    label="the fit target",
    flag="--fit-target",
    saved_in="engine",
    minimum=0,
    maximum=INT32_MAX,
    title="Kept free by auto, MiB (--fit-target)",
)
SPLIT_MODE = Setting(
    "split_mode",
    str,
    "layer",
    "how to split the model across devices (tensor: llama.cpp's tensor parallelism)",
    label="split mode",
    short="-sm",
    flag="--split-mode",
    saved_in="engine",
    choices=SPLIT_MODES,
)
TENSOR_SPLIT = Setting(
    "tensor_split",
    str,
    "",
    "share of the model per device",
    label="tensor split",
    short="-ts",
    flag="--tensor-split",
    saved_in="engine",
    meaning="shares, e.g. 3,1",
)
MAIN_GPU = Setting(
    "main_gpu",
    int,
    0,
    "the device for the whole model with -sm none",
    label="main GPU",
    short="-mg",
    flag="--main-gpu",
    saved_in="engine",
    minimum=0,
    maximum=1023,
    meaning="device index",
)
N_CPU_MOE = Setting(
    "n_cpu_moe",
    int,
    0,
    "keep the experts of the first N layers on the CPU (MoE models)",
    label="CPU MoE layers",
    flag="--n-cpu-moe",
    saved_in="engine",
    minimum=0,
    maximum=4096,  # more than the model has means every layer
    title="Experts on CPU, layers (--n-cpu-moe)",
)
USE_MMAP = Setting(
    "use_mmap",
    bool,
    True,
    "read the model into memory instead of mapping it",
    label="map the model file",
    flag="--no-mmap",
    saved_in="engine",
)
USE_MLOCK = Setting(
    "use_mlock", bool, False, "lock the model in RAM", label="lock the model in RAM", flag="--mlock", saved_in="engine"
)
USE_EXTRA_BUFTS = Setting(
    "use_extra_bufts",
    bool,
    True,
    "keep CPU weights as stored: no repacking for this CPU's matrix instructions (AMX, CPU_REPACK); avoids a "
    "repack path that crashes",
    label="repack weights for this CPU",
    flag="--no-repack",
    saved_in="engine",
)
RPC_SERVERS = Setting(
    "rpc_servers",
    str,
    "",
    "llama.cpp RPC servers to use as devices",
    label="RPC servers",
    flag="--rpc",
    saved_in="engine",
    meaning="HOST:PORT, …",
)

# ----- how a context is made (ContextParams) --------------------------------------------------------------------

N_CTX = Setting(
    "n_ctx",
    int,
    4096,
    "context size in tokens (0: model's; llama.cpp rounds it up to a multiple of 256)",
    label="context size",
    short="-c",
    flag="--ctx-size",
    saved_in="engine",
    minimum=0,
    maximum=MAX_CONTEXT,
    meaning="0: the model's",
)
N_THREADS = Setting(
    "n_threads",
    int,
    0,
    "threads (default: one per physical core)",
    label="threads",
    short="-t",
    flag="--threads",
    saved_in="engine",
    minimum=0,
    maximum=1024,
    meaning="0: one per core",
)
N_BATCH = Setting(
    "n_batch",
    int,
    2048,
    "logical batch size",
    label="batch size",
    short="-b",
    flag="--batch-size",
    saved_in="engine",
    minimum=1,
    maximum=MAX_CONTEXT,
)
N_UBATCH = Setting(
    "n_ubatch",
    int,
    512,
    "physical batch size",
    label="micro-batch size",
    short="-ub",
    flag="--ubatch-size",
    saved_in="engine",
    minimum=1,
    maximum=MAX_CONTEXT,
)
FLASH_ATTN = Setting(
    "flash_attn",
    str,
    "auto",
    "flash attention",
    label="flash attention",
    short="-fa",
    flag="--flash-attn",
    saved_in="engine",
    choices=FLASH_ATTENTION_MODES,
)
TYPE_K = Setting(
    "type_k",
    str,
    "f16",
    "KV cache type for K",
    label="KV cache type K",
    short="-ctk",
    flag="--cache-type-k",
    saved_in="engine",
    choices=KV_CACHE_TYPES,
)
TYPE_V = Setting(
    "type_v",
    str,
    "f16",
    "KV cache type for V",
    label="KV cache type V",
    short="-ctv",
    flag="--cache-type-v",
    saved_in="engine",
    choices=KV_CACHE_TYPES,
)

# ----- the prompt cache on disk (DiskCacheParams; engine_ext.disk_cache) -----------------------------------------

CACHE_DISK = Setting(
    "disk",
    bool,
    True,
    "save each conversation's engine state to disk after a reply and restore it when the conversation goes on "
    "(after a restart, a crash or a model switch too)",
    label="prompt cache on disk",
    saved_in="cache",
)
CACHE_BUDGET_MIB = Setting(
    "budget_mib",
    int,
    0,
    "the disk the prompt cache may take, in MiB (the least recently used state goes first)",
    label="prompt cache budget",
    saved_in="cache",
    minimum=0,
    maximum=1 << 30,
    meaning="0: the smaller of 10 GiB and 10% of the free space",
)

# ----- sampling (SamplingParams) ----------------------------------------------------------------------------------

TEMPERATURE = Setting(
    "temperature", float, 0.8, "temperature (0: greedy)", label="temperature", flag="--temp", minimum=0.0
)
TOP_K = Setting("top_k", int, 40, "top-k (0 disables it)", label="top-k", flag="--top-k", minimum=0, maximum=INT32_MAX)
TOP_P = Setting("top_p", float, 0.95, "top-p", label="top-p", flag="--top-p", minimum=0.0, maximum=1.0)
MIN_P = Setting("min_p", float, 0.05, "min-p", label="min-p", flag="--min-p", minimum=0.0, maximum=1.0)
REPEAT_PENALTY = Setting(
    "repeat_penalty",
    float,
    1.0,
    "repeat penalty (1 disables it)",
    label="repeat penalty",
    flag="--repeat-penalty",
    minimum=0.0,
    above_minimum=True,
)
REPEAT_LAST_N = Setting(
    "repeat_last_n",
    int,
    64,
    "tokens the repeat penalty looks back on",
    label="repeat-last-n",
    flag="--repeat-last-n",
    minimum=-1,
    maximum=MAX_CONTEXT,
    meaning="-1: the context",
)
PRESENCE_PENALTY = Setting("presence_penalty", float, 0.0, "presence penalty", flag="--presence-penalty")
FREQUENCY_PENALTY = Setting("frequency_penalty", float, 0.0, "frequency penalty", flag="--frequency-penalty")
SEED = Setting(
    "seed",
    int,
    DEFAULT_SEED,
    "RNG seed (default, -1: random)",
    label="seed",
    short="-s",
    flag="--seed",
    minimum=-1,
    maximum=UINT32_MAX,
    meaning="-1: random",
    wanted=f"-1 (random) or between 0 and {UINT32_MAX}",
)
N_PREDICT = Setting(
    "max_tokens",
    int,
    -1,
    "most tokens to generate (-1: no limit)",
    label="max tokens",
    short="-n",
    flag="--n-predict",
    minimum=-1,
    maximum=INT32_MAX,
    excluded=(0,),  # 0 would mean "no limit" to the engine but "nothing" to llama.cpp
    meaning="-1: no limit",
    wanted="-1 (no limit) or positive",
)

# ----- llama-server's further samplers (SamplingParams; per request on the API server, in llama.cpp's chain order) ----

# llama.cpp's sampler names (common/sampling.cpp) in its default order; a request's `samplers` orders them.
SAMPLER_NAMES: tuple[str, ...] = (
    "penalties", "dry", "top_n_sigma", "top_k", "typ_p", "top_p", "min_p", "xtc", "temperature",
)  # fmt: skip
SAMPLER_CHARS = dict(zip("edskypmxt", SAMPLER_NAMES, strict=True))  # llama-server's one-letter names
SAMPLER_ALIASES = {"typical_p": "typ_p", "nucleus": "top_p", "temp": "temperature", "typ": "typ_p"}
TYPICAL_P = Setting(
    "typical_p", float, 1.0, "locally typical sampling (1 disables it)", flag="--typical", minimum=0.0, maximum=1.0
)
MIROSTAT = Setting(
    "mirostat",
    int,
    0,
    "Mirostat sampling (0: off, 1: Mirostat, 2: Mirostat 2.0)",
    flag="--mirostat",
    minimum=0,
    maximum=2,
)
MIROSTAT_TAU = Setting("mirostat_tau", float, 5.0, "Mirostat's target entropy", flag="--mirostat-ent", minimum=0.0)
MIROSTAT_ETA = Setting("mirostat_eta", float, 0.1, "Mirostat's learning rate", flag="--mirostat-lr", minimum=0.0)
TOP_N_SIGMA = Setting(
    "top_n_sigma",
    float,
    -1.0,
    "keeps tokens within n standard deviations of the top logit (below 0: off)",
    flag="--top-nsigma",
)
DRY_MULTIPLIER = Setting(
    "dry_multiplier", float, 0.0, "DRY repetition penalty (0 disables it)", flag="--dry-multiplier", minimum=0.0
)
DRY_BASE = Setting(
    "dry_base", float, 1.75, "DRY's base (below 1: 1.75, as llama-server takes it)", flag="--dry-base", minimum=0.0
)
DRY_ALLOWED_LENGTH = Setting(
    "dry_allowed_length",
    int,
    2,
    "repeats DRY lets pass unpenalised",
    flag="--dry-allowed-length",
    minimum=0,
    maximum=INT32_MAX,
)
DRY_PENALTY_LAST_N = Setting(
    "dry_penalty_last_n",
    int,
    64,
    "tokens DRY looks back on (0 disables it)",
    flag="--dry-penalty-last-n",
    minimum=0,
    maximum=INT32_MAX,
)
# Lists, not settings (a Setting is one value): DRY's sequence breakers and the samplers' order, llama.cpp's defaults.
DRY_SEQUENCE_BREAKERS: tuple[str, ...] = ("\n", ":", '"', "*")
MAX_DRY_BREAKERS, MAX_DRY_BREAKER_CHARS = 64, 64  # what a request may give
XTC_PROBABILITY = Setting(
    "xtc_probability",
    float,
    0.0,
    "XTC's chance to cut the top tokens (0 disables it)",
    flag="--xtc-probability",
    minimum=0.0,
    maximum=1.0,
)
XTC_THRESHOLD = Setting(
    "xtc_threshold", float, 0.1, "XTC's probability threshold", flag="--xtc-threshold", minimum=0.0, maximum=1.0
)

# ----- reasoning (Generate's reasoning fields; engine_ext.reasoning) ---------------------------------------------

REASONING_EFFORTS: tuple[str, ...] = ("default", "low", "medium", "high")  # llama.cpp's names ("default": unset)
REASONING_BUDGET = Setting(
    "reasoning_budget",
    int,
    -1,
    "thinking tokens before the end of thinking is forced and the model answers (-1: unlimited, 0: no thinking)",
    label="reasoning budget",
    flag="--reasoning-budget",
    minimum=-1,
    maximum=INT32_MAX,
    meaning="-1: unlimited, 0: none",
    wanted="-1 (unlimited), 0 (no thinking) or a number of tokens",
)
REASONING_BUDGET_MESSAGE = Setting(
    "reasoning_budget_message",
    str,
    "",
    "text forced before the end of thinking when the reasoning budget is spent",
    label="reasoning budget message",
    flag="--reasoning-budget-message",
)
REASONING_EFFORT = Setting(
    "reasoning_effort",
    str,
    "default",
    "reasoning effort, for chat templates that read it (default: the template's own)",
    label="reasoning effort",
    flag="--reasoning-effort",
    choices=REASONING_EFFORTS,
)

# ----- the groups: which params dataclass, config table, CLI flags and screen each setting goes to ----------------

# Numbers and switches ModelParams / ContextParams take as they are (n_gpu_layers, tensor_split and rpc_servers
# have their own text forms: "auto", "3,1", "HOST:PORT, …").
MODEL: tuple[Setting[Any], ...] = (
    N_GPU_LAYERS,
    FIT_TARGET_MIB,
    SPLIT_MODE,
    MAIN_GPU,
    N_CPU_MOE,
    USE_MMAP,
    USE_MLOCK,
    USE_EXTRA_BUFTS,
)
MODEL_LISTS: tuple[Setting[Any], ...] = (TENSOR_SPLIT, RPC_SERVERS)
CONTEXT: tuple[Setting[Any], ...] = (N_CTX, N_THREADS, N_BATCH, N_UBATCH, FLASH_ATTN, TYPE_K, TYPE_V)
# The engine settings in the order the command line and the settings screen (F3) list them.
ENGINE: tuple[Setting[Any], ...] = (
    N_CTX,
    N_THREADS,
    N_GPU_LAYERS,
    FIT_TARGET_MIB,
    SPLIT_MODE,
    TENSOR_SPLIT,
    MAIN_GPU,
    N_CPU_MOE,
    FLASH_ATTN,
    TYPE_K,
    TYPE_V,
    N_BATCH,
    N_UBATCH,
    USE_MMAP,
    USE_MLOCK,
    USE_EXTRA_BUFTS,
    RPC_SERVERS,
)
SAMPLING: tuple[Setting[Any], ...] = (
    TEMPERATURE,
    TOP_K,
    TOP_P,
    MIN_P,
    REPEAT_PENALTY,
    REPEAT_LAST_N,
    PRESENCE_PENALTY,
    FREQUENCY_PENALTY,
    SEED,
)
# llama-server's further samplers: taken per request by the API server (no screen shows them and the command line
# does not take them; `flag` names llama.cpp's own).
SAMPLING_MORE: tuple[Setting[Any], ...] = (
    TOP_N_SIGMA,
    TYPICAL_P,
    MIROSTAT,
    MIROSTAT_TAU,
    MIROSTAT_ETA,
    DRY_MULTIPLIER,
    DRY_BASE,
    DRY_ALLOWED_LENGTH,
    DRY_PENALTY_LAST_N,
    XTC_PROBABILITY,
    XTC_THRESHOLD,
)
SPECULATIVE: tuple[Setting[Any], ...] = (SPEC_TYPE, DRAFT_MODEL, *DRAFT_NUMBERS, DRAFT_FIXED)
CACHE: tuple[Setting[Any], ...] = (CACHE_DISK, CACHE_BUDGET_MIB)
# A chat request's reasoning controls (run and chat's flags; per request on the API server).
REASONING: tuple[Setting[Any], ...] = (REASONING_BUDGET, REASONING_BUDGET_MESSAGE, REASONING_EFFORT)


def effort_or_none(effort: str) -> str | None:
    """A reasoning effort as Generate takes it: None for "default" (the template decides)."""
    return None if effort == REASONING_EFFORT.default else effort
