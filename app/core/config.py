"""User settings: engine options, model folders and UI choices, validated and kept in `config.toml`."""

from __future__ import annotations

import math
import os
import re
import tomllib
from collections.abc import MutableMapping
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any, Final
from urllib.parse import urlsplit

import tomlkit
from tomlkit.exceptions import ParseError as TomlParseError
from tomlkit.items import AoT

from app.core import app_settings_schema as ui
from app.core.app_settings_schema import THEMES  # noqa: F401 - the screens' choices
from app.core.model_presets import ModelPreset, PresetError, presets_from_toml, update_presets
from app.core.owner_only_dirs import private_dir, write_private_text
from app.core.paths import CONFIG_FILE_NAME, config_path, prompt_cache_dir
from app.core.server_access import host_refusal, origin_refusal, split_names
from engine_ext import settings_schema as s
from engine_ext.params import (
    GPU_LAYERS_AUTO,  # `-ngl auto`: as many layers as free device memory allows; "auto" in config.toml
    ContextParams,
    DiskCacheParams,
    EngineError,
    ModelParams,
    SamplingParams,
    SpeculativeParams,
    SteeringEntry,
    ascii_digits,
)
from engine_ext.settings_schema import FLASH_ATTENTION_MODES, Setting, SettingError  # noqa: F401 - F3's choices
from engine_ext.untrusted_text import one_line_message

REMOTE_NAME_PATTERN: Final = re.compile(r"^[\w.-]{1,40}$")
ENV_VAR_PATTERN: Final = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


class ConfigError(Exception):
    """A settings value or file a user has to fix; the message names the setting and what is allowed."""


MAX_CONFIG_BYTES: Final = 1 << 20
"""config.toml is read up to this size (a settings file is a few KB)."""
MAX_TOML_NESTING: Final = 100
"""How deep arrays and inline tables nest, and how many parts a dotted key has, at most in config.toml: tomlkit's own
limit, so every file the readers take the writer keeps. Deeper nesting overflows tomllib's recursion (an array 500
deep), and a dotted key of 20,000 parts takes tomllib 1.5 GB."""

# What the nesting scan skips: strings (each kind, as TOML ends them) and comments; and what it counts.
_TOML_SKIPPED = {
    '"""': re.compile(r'(?:[^"\\]|\\[\s\S]|"{1,2}(?!"))*"{3,5}'),
    "'''": re.compile(r"(?:[^']|'{1,2}(?!'))*'{3,5}"),
    '"': re.compile(r'(?:[^"\\\n]|\\.)*"'),
    "'": re.compile(r"[^'\n]*'"),
    "#": re.compile(r"[^\n]*"),
}
_TOML_TOKEN = re.compile(r"'''|\"\"\"|[\"'#\[{\]}.=,\n]")


def toml_nesting(text: str, stop_above: int = MAX_TOML_NESTING) -> int:
    """The deepest nesting of arrays and inline tables in TOML `text`, or the most parts of a dotted key, whichever
    is more; a linear scan, outside strings and comments, that ends once the nesting passes `stop_above`. At an
    unterminated string it stops: a parser stops there too."""
    deepest = depth = parts = 0
    position = 0
    while deepest <= stop_above and (match := _TOML_TOKEN.search(text, position)):
        token, position = match.group(), match.end()
        if token in _TOML_SKIPPED:
            skipped = _TOML_SKIPPED[token].match(text, position)
            if skipped is None:
                break
            position = skipped.end()
        elif token == ".":
            parts += 1
            deepest = max(deepest, parts + 1)
        else:
            parts = 0
            depth = depth + 1 if token in "[{" else max(depth - 1, 0) if token in "]}" else depth
            deepest = max(deepest, depth)
    return deepest


def read_config_text(path: Path) -> str:
    """config.toml's text ("" when there is none); ConfigError, one line naming the file, when it cannot be read,
    is larger than MAX_CONFIG_BYTES or is not UTF-8."""
    try:
        with open(path, "rb") as file:
            data = file.read(MAX_CONFIG_BYTES + 1)
    except FileNotFoundError:
        return ""
    except OSError as error:
        raise ConfigError(one_line_message(path, f"cannot read it: {error.strerror or error}")) from None
    if len(data) > MAX_CONFIG_BYTES:
        raise ConfigError(one_line_message(path, f"larger than {MAX_CONFIG_BYTES} bytes", "is it a settings file?"))
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as error:
        raise ConfigError(one_line_message(path, f"not UTF-8 text (byte {error.start})")) from None


def toml_tables(text: str, source: str = CONFIG_FILE_NAME) -> dict[str, Any]:
    """config.toml's text parsed (tomllib), nesting bounded first (MAX_TOML_NESTING): every reader of the file takes
    it from here. ConfigError, one line naming `source`, when it is not TOML or nests too deep."""
    if len(text) > MAX_CONFIG_BYTES:
        raise ConfigError(one_line_message(source, f"larger than {MAX_CONFIG_BYTES} bytes"))
    if toml_nesting(text) > MAX_TOML_NESTING:
        raise ConfigError(
            one_line_message(source, f"nested more than {MAX_TOML_NESTING} levels deep (arrays, tables or dotted keys)")
        )
    try:
        return tomllib.loads(text)
    except (tomllib.TOMLDecodeError, RecursionError) as error:
        raise ConfigError(one_line_message(source, f"not valid TOML: {error}")) from None


def check_settings(values: object, settings: tuple[Setting[Any], ...]) -> None:
    """The declarations' one range/choices check (engine_ext.settings_schema), as a ConfigError."""
    try:
        s.check_all(values, settings)
    except SettingError as error:
        raise ConfigError(str(error)) from None


def parse_field(setting: Setting[Any], text: str, where: str = "") -> Any:
    """A value typed into a screen's field for `setting`, as a ConfigError ("{where}: 'x' is not a number")."""
    try:
        return setting.parse(text, where)
    except SettingError as error:
        raise ConfigError(str(error)) from None


ENGINE_CHECKED = tuple(setting for setting in s.ENGINE if setting not in s.MODEL_LISTS)
"""The engine settings checked by their declaration (tensor split and RPC servers are lists, checked below)."""


@dataclass(frozen=True)
class EngineSettings:
    """How models are loaded and run, with llama.cpp's names: -c, -t, -ngl, --fit-target, -fa, -ctk/-ctv, -b, -ub,
    -sm, -ts, -mg, --n-cpu-moe, --no-mmap, --mlock, --no-repack, --rpc."""

    n_ctx: int = s.N_CTX.default
    n_threads: int = s.N_THREADS.default
    n_gpu_layers: int = s.N_GPU_LAYERS.default  # -1: all, 0: none, GPU_LAYERS_AUTO: as many as fit
    flash_attn: str = s.FLASH_ATTN.default
    type_k: str = s.TYPE_K.default
    type_v: str = s.TYPE_V.default
    n_batch: int = s.N_BATCH.default
    n_ubatch: int = s.N_UBATCH.default
    split_mode: str = s.SPLIT_MODE.default
    tensor_split: tuple[float, ...] = ()
    main_gpu: int = s.MAIN_GPU.default
    n_cpu_moe: int = s.N_CPU_MOE.default
    use_mmap: bool = s.USE_MMAP.default
    use_mlock: bool = s.USE_MLOCK.default
    use_extra_bufts: bool = s.USE_EXTRA_BUFTS.default  # weights repacked for this CPU; False: --no-repack
    rpc_servers: tuple[str, ...] = ()
    fit_target_mib: int = s.FIT_TARGET_MIB.default  # with -ngl auto: MiB left free on each device

    def validate(self) -> None:
        """Raise ConfigError naming the first bad value (and combinations llama.cpp would reject or abort on)."""
        check_settings(self, ENGINE_CHECKED)
        if not all(math.isfinite(v) for v in self.tensor_split):
            raise ConfigError("tensor split shares must be finite numbers")
        for server in self.rpc_servers:
            host, _, port = server.rpartition(":")
            if not host or not ascii_digits(port) or not 0 < int(port) < 65536:
                raise ConfigError(f"RPC server {server!r} should be HOST:PORT (for example 192.168.1.20:50052)")
        try:
            self.model_params().validate()
            self.context_params().validate()
        except EngineError as error:
            raise ConfigError(str(error)) from error

    def model_params(self) -> ModelParams:
        return ModelParams(**s.values_of(self, (*s.MODEL, *s.MODEL_LISTS)))

    def context_params(self) -> ContextParams:
        values = s.values_of(self, s.CONTEXT)
        values["n_ubatch"] = min(self.n_ubatch, self.n_batch)  # llama.cpp clamps -ub to -b the same way
        return ContextParams(**values)


def gpu_layers_text(n_gpu_layers: int) -> str:
    """How the settings screen and config.toml write -ngl: "auto" for the automatic fit, else the number."""
    return "auto" if n_gpu_layers == GPU_LAYERS_AUTO else str(n_gpu_layers)


def parse_gpu_layers(text: str) -> int:
    """-ngl as typed: "auto", -1 (all), 0 (none) or a count (ConfigError otherwise)."""
    text = text.strip().casefold()
    if text == "auto":
        return GPU_LAYERS_AUTO
    try:
        value = int(text)
    except ValueError:
        raise ConfigError(f"GPU layers: {text!r} should be auto, -1 (all), 0 (none) or a number of layers") from None
    if value < -1:
        raise ConfigError(f"GPU layers: {value} should be auto, -1 (all), 0 (none) or a number of layers")
    return value


REMOTE_STALL_TIMEOUT_S = 60.0
MIN_STALL_TIMEOUT_S = 1.0
MAX_STALL_TIMEOUT_S = 3600.0


@dataclass(frozen=True)
class RemoteSettings:
    """An OpenAI-compatible endpoint (llama-server, vLLM, SGLang…) used as an engine: `[[remote]]` in config.toml.

    The key comes from the environment variable `api_key_env` when set (preferred: it stays out of the file),
    else from `api_key`. Neither is ever shown: `masked_key` is what the UI prints.
    """

    name: str
    base_url: str
    api_key_env: str = ""
    api_key: str = field(default="", repr=False)
    model: str = ""  # the model to use when none is picked ('' : the first the server lists)
    # A reply ends when the server sends no text (keep-alives and empty events do not count) for this long.
    stall_timeout_s: float = REMOTE_STALL_TIMEOUT_S

    def validate(self) -> None:
        if not REMOTE_NAME_PATTERN.match(self.name):
            raise ConfigError(f"remote engine name {self.name!r} should be 1-40 letters, digits, '.', '_' or '-'")
        if not MIN_STALL_TIMEOUT_S <= self.stall_timeout_s <= MAX_STALL_TIMEOUT_S:
            raise ConfigError(
                f"remote engine {self.name}: stall_timeout_s is {self.stall_timeout_s:g}; it should be "
                f"{MIN_STALL_TIMEOUT_S:g} to {MAX_STALL_TIMEOUT_S:g} seconds"
            )
        parts = urlsplit(self.base_url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ConfigError(
                f"remote engine {self.name}: base URL {self.base_url!r} should start with http:// or "
                "https:// and name a host (for example http://127.0.0.1:8080/v1)"
            )
        try:
            parts.port  # noqa: B018 - raises ValueError on a bad port
        except ValueError:
            raise ConfigError(f"remote engine {self.name}: base URL {self.base_url!r} has a bad port") from None
        if parts.query or parts.fragment:
            raise ConfigError(f"remote engine {self.name}: base URL should not have a query or fragment")
        if self.api_key_env and not ENV_VAR_PATTERN.match(self.api_key_env):
            raise ConfigError(f"remote engine {self.name}: {self.api_key_env!r} is not an environment variable name")
        if any(c.isspace() for c in self.api_key):
            raise ConfigError(f"remote engine {self.name}: the API key should not contain spaces")

    def resolved_key(self) -> str:
        """The key to send ('' : none): the environment variable's value when it is set, else `api_key`."""
        if self.api_key_env:
            value = os.environ.get(self.api_key_env, "")
            if value:
                return value
        return self.api_key

    def masked_key(self) -> str:
        """What the UI shows about the key: where it comes from, never its value."""
        if self.api_key_env:
            state = "set" if os.environ.get(self.api_key_env) else "not set"
            return f"${self.api_key_env} ({state})"
        if self.api_key:
            return "key in config.toml (hidden)"
        return "no key"


@dataclass(frozen=True)
class SamplingSettings:
    """A sampling preset as stored per conversation and in named presets (plus max tokens)."""

    temperature: float = s.TEMPERATURE.default
    top_k: int = s.TOP_K.default
    top_p: float = s.TOP_P.default
    min_p: float = s.MIN_P.default
    repeat_penalty: float = s.REPEAT_PENALTY.default
    max_tokens: int = ui.REPLY_LIMIT.default  # the chat's reply limit (the CLI's -n and the API's have none)
    seed: int = ui.SAMPLING_SEED.default  # -1: a random seed per reply
    reasoning_budget: int = s.REASONING_BUDGET.default  # thinking tokens before the end is forced (-1: unlimited)
    reasoning_effort: str = s.REASONING_EFFORT.default  # for templates that read it ("default": the template's)
    output_format: str = ui.OUTPUT_FORMAT.default  # text | json | json_schema | grammar (app/core/output_format.py)
    output_file: str = ui.OUTPUT_FILE.default  # the schema or grammar file of json_schema and grammar

    def validate(self) -> None:
        check_settings(self, ui.PRESET)
        if self.output_format in ("json_schema", "grammar") and not self.output_file.strip():
            raise ConfigError(f"Output file: give the file of the {self.output_format.replace('_', ' ')}")
        try:
            self.sampling_params().validate()
        except EngineError as error:
            raise ConfigError(str(error)) from error

    def sampling_params(self) -> SamplingParams:
        seed = s.SEED.default if self.seed < 0 else self.seed
        return SamplingParams(**s.values_of(self, ui.PRESET_SAMPLING), seed=seed)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> SamplingSettings:
        """Settings from a stored dict; unknown keys are ignored, wrong types fall back to the default."""
        defaults = cls()
        values: dict[str, Any] = {}
        for f in fields(cls):
            value = data.get(f.name, getattr(defaults, f.name))
            default = getattr(defaults, f.name)
            if isinstance(default, float) and isinstance(value, int | float) and not isinstance(value, bool):
                values[f.name] = float(value)
            elif isinstance(default, int) and isinstance(value, int) and not isinstance(value, bool):
                values[f.name] = value
            elif isinstance(default, str) and isinstance(value, str):
                values[f.name] = value
            else:
                values[f.name] = default
        return cls(**values)


@dataclass(frozen=True)
class SpeculativeSettings:
    """Speculative decoding as the user chose it (F8 toggles it, F9 picks the type; llama.cpp's names)."""

    enabled: bool = ui.SPEC_ENABLED.default
    spec_type: str = s.SPEC_TYPE.default
    draft_model: str = s.DRAFT_MODEL.default  # draft-simple / eagle3 / dflash / dspark file, or an mtp-*.gguf
    n_max: int = s.DRAFT_N_MAX.default
    n_min: int = s.DRAFT_N_MIN.default
    p_min: float = s.DRAFT_P_MIN.default

    def params(self, *, enabled: bool | None = None) -> SpeculativeParams:
        """What the engine gets (no types while disabled: off; `enabled` overrides the switch)."""
        on = self.enabled if enabled is None else enabled
        return SpeculativeParams(
            types=(self.spec_type,) if on else (),
            draft_model=self.draft_model or None,
            **s.values_of(self, s.DRAFT_NUMBERS),
        )

    def validate(self) -> None:
        check_settings(self, ui.SPECULATIVE)
        try:
            self.params(enabled=True).validate()
        except EngineError as error:
            raise ConfigError(str(error)) from error


@dataclass(frozen=True)
class SteeringSettings:
    """The control vectors the user steers with (F6): files and strengths (any finite number within ±1000, as
    llama.cpp takes them), one layer range (0: default)."""

    vectors: tuple[str, ...] = ()
    strengths: tuple[float, ...] = ()
    layer_start: int = 0
    layer_end: int = 0

    def entries(self) -> tuple[SteeringEntry, ...]:
        """The vectors with a non-zero strength, as the engine applies them."""
        return tuple(
            SteeringEntry(path, strength, self.layer_start, self.layer_end)
            for path, strength in zip(self.vectors, self.strengths, strict=False)
            if strength != 0.0
        )

    def validate(self) -> None:
        if len(self.vectors) != len(self.strengths):
            raise ConfigError("steering.vectors and steering.strengths should have the same length")
        try:
            for path, strength in zip(self.vectors, self.strengths, strict=True):
                SteeringEntry(path, strength, self.layer_start, self.layer_end).validate()
        except EngineError as error:
            raise ConfigError(str(error)) from error


@dataclass(frozen=True)
class CacheSettings:
    """The prompt cache on disk (`[cache]`): on or off, and its budget (engine_ext.disk_cache)."""

    disk: bool = s.CACHE_DISK.default
    budget_mib: int = s.CACHE_BUDGET_MIB.default  # 0: the smaller of 10 GiB and 10% of the free space

    def validate(self) -> None:
        check_settings(self, s.CACHE)

    def disk_cache_params(self) -> DiskCacheParams:
        """What the engine is told when it loads a model: the cache folder (none when it is off) and the budget."""
        folder = str(prompt_cache_dir()) if self.disk else ""
        return DiskCacheParams(**s.values_of(self, (s.CACHE_BUDGET_MIB,)), folder=folder)


@dataclass(frozen=True)
class ServerConfig:
    """The app's API server (F10): where it listens, the environment variable holding its key, and whether it starts
    with the app. `llmtui serve` has its own flags."""

    enabled: bool = ui.SERVER_ENABLED.default
    router: bool = ui.SERVER_ROUTER.default  # every local model, in a `llmtui serve` child process
    host: str = ui.SERVER_HOST.default
    port: int = ui.SERVER_PORT.default
    api_key_env: str = ui.SERVER_KEY_ENV.default
    allowed_hosts: str = ui.SERVER_ALLOWED_HOSTS.default
    cors_origins: str = ui.SERVER_CORS.default

    def validate(self) -> None:
        check_settings(self, ui.SERVER)
        if not self.host.strip() or any(c.isspace() for c in self.host) or len(self.host) > 255:
            raise ConfigError(f"server.host must be an address such as 127.0.0.1, not {self.host[:60]!r}")
        name = self.api_key_env
        if name and not (name.replace("_", "a").isalnum() and name.isascii() and not name[0].isdigit()):
            raise ConfigError(f"server.api_key_env must be an environment variable's name, not {name[:60]!r}")
        for setting, refusal in ((ui.SERVER_ALLOWED_HOSTS, host_refusal), (ui.SERVER_CORS, origin_refusal)):
            for item in split_names(getattr(self, setting.name)):
                why = refusal(item)
                if why is not None:
                    raise ConfigError(f"server.{setting.name}: {why}")


@dataclass(frozen=True)
class DocumentsSettings:
    """[documents]: the documents' embedding model and reranker ('' : the catalog's once downloaded; "none": none)."""

    embed_model: str = ui.DOCS_EMBED_MODEL.default
    rerank_model: str = ui.DOCS_RERANK_MODEL.default


@dataclass(frozen=True)
class Config:
    """Everything in config.toml."""

    engine: EngineSettings = field(default_factory=EngineSettings)
    model_folders: tuple[str, ...] = ()
    last_model: str = ""
    model_presets: tuple[ModelPreset, ...] = ()  # [models."ID"] tables (app/core/model_presets.py)
    theme: str = ui.THEME.default
    show_sidebar: bool = ui.SHOW_SIDEBAR.default
    draft_colouring: bool = ui.DRAFT_COLOURING.default  # accepted draft tokens coloured in the transcript (F7)
    spec_details: bool = ui.SPEC_DETAILS.default  # the speculative meter expanded into its details (ctrl+o)
    speculative: SpeculativeSettings = field(default_factory=SpeculativeSettings)
    steering: SteeringSettings = field(default_factory=SteeringSettings)
    remotes: tuple[RemoteSettings, ...] = ()
    server: ServerConfig = field(default_factory=ServerConfig)
    cache: CacheSettings = field(default_factory=CacheSettings)
    documents: DocumentsSettings = field(default_factory=DocumentsSettings)

    def validate(self) -> None:
        self.engine.validate()
        self.server.validate()
        check_settings(self.documents, ui.DOCUMENTS)
        self.cache.validate()
        self.speculative.validate()
        self.steering.validate()
        names: set[str] = set()
        for remote in self.remotes:
            remote.validate()
            if remote.name.casefold() in names:
                raise ConfigError(f"two remote engines are named {remote.name!r}; names must differ")
            names.add(remote.name.casefold())
        check_settings(self, ui.UI)
        for folder in self.model_folders:
            if not folder.strip():
                raise ConfigError("a model folder cannot be empty")


def _typed(table: dict[str, Any], key: str, kind: type, default: Any, where: str) -> Any:
    if key not in table:
        return default
    value = table[key]
    if kind is float and isinstance(value, int) and not isinstance(value, bool):
        value = float(value)
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        raise ConfigError(f"{where}{key} should be {kind.__name__}, not {value!r}")
    return value


def config_from_toml(text: str, source: str = CONFIG_FILE_NAME) -> Config:
    """Parse and validate config.toml text (ConfigError says what to fix)."""
    data = toml_tables(text, source)
    defaults = Config()
    engine_table = data.get("engine", {})
    if not isinstance(engine_table, dict):
        raise ConfigError(f"{source}: [engine] should be a table")
    engine_values = _engine_values(engine_table)
    models_table = data.get("models", {})
    ui_table = data.get("ui", {})
    if not isinstance(models_table, dict) or not isinstance(ui_table, dict):
        raise ConfigError(f"{source}: [models] and [ui] should be tables")
    folders = models_table.get("folders", [])
    if not isinstance(folders, list) or not all(isinstance(item, str) for item in folders):
        raise ConfigError(f"{source}: models.folders should be a list of folder paths")
    try:
        presets = presets_from_toml(models_table)
    except PresetError as error:
        raise ConfigError(f"{source}: {error}") from None
    config = Config(
        engine=EngineSettings(**engine_values),
        model_folders=tuple(folders),
        model_presets=presets,
        last_model=_typed(models_table, "last_model", str, defaults.last_model, "models."),
        **_declared_values(ui_table, ui.UI),
        speculative=SpeculativeSettings(**_declared_values(_table(data, "speculative", source), ui.SPECULATIVE)),
        steering=_steering_from_toml(data, source),
        remotes=_remotes_from_toml(data, source),
        server=ServerConfig(**_declared_values(_table(data, "server", source), ui.SERVER)),
        cache=CacheSettings(**_declared_values(_table(data, "cache", source), s.CACHE)),
        documents=DocumentsSettings(**_declared_values(_table(data, "documents", source), ui.DOCUMENTS)),
    )
    try:
        config.validate()
    except ConfigError as error:
        raise ConfigError(f"{source}: {error}") from error
    return config


def _declared_values(table: dict[str, Any], settings: tuple[Setting[Any], ...]) -> dict[str, Any]:
    """The values of `settings` in a config.toml table (each its declaration's type; missing: its default); their
    range is checked by the settings' validate."""
    return {
        setting.name: _typed(table, setting.name, setting.kind, setting.default, f"{setting.saved_in}.")
        for setting in settings
    }


def _engine_values(table: dict[str, Any]) -> dict[str, Any]:
    values = _declared_values(table, tuple(setting for setting in ENGINE_CHECKED if setting is not s.N_GPU_LAYERS))
    for f in (s.N_GPU_LAYERS.name, *(setting.name for setting in s.MODEL_LISTS)):
        if f == "n_gpu_layers":
            layers = table.get(f, s.N_GPU_LAYERS.default)
            values[f] = parse_gpu_layers(layers) if isinstance(layers, str) else _typed(table, f, int, -1, "engine.")
        elif f == "tensor_split":
            shares = table.get(f, [])
            if not isinstance(shares, list) or not all(
                isinstance(v, int | float) and not isinstance(v, bool) for v in shares
            ):
                raise ConfigError("engine.tensor_split should be a list of numbers (shares per device)")
            values[f] = tuple(float(v) for v in shares)
        else:
            servers = table.get(f, [])
            if not isinstance(servers, list) or not all(isinstance(v, str) for v in servers):
                raise ConfigError('engine.rpc_servers should be a list of "HOST:PORT" strings')
            values[f] = tuple(servers)
    return values


def _remotes_from_toml(data: dict[str, Any], source: str) -> tuple[RemoteSettings, ...]:
    items = data.get("remote", [])
    if not isinstance(items, list) or not all(isinstance(item, dict) for item in items):
        raise ConfigError(f"{source}: remote engines should be [[remote]] tables")
    remotes = []
    for item in items:
        name = _typed(item, "name", str, "", "remote.")
        where = f"remote {name or '(unnamed)'}: "
        if not name or "base_url" not in item:
            raise ConfigError(f"{source}: every [[remote]] needs a name and a base_url")
        remotes.append(
            RemoteSettings(
                name=name,
                base_url=_typed(item, "base_url", str, "", where),
                api_key_env=_typed(item, "api_key_env", str, "", where),
                api_key=_typed(item, "api_key", str, "", where),
                model=_typed(item, "model", str, "", where),
                stall_timeout_s=_typed(item, "stall_timeout_s", float, REMOTE_STALL_TIMEOUT_S, where),
            )
        )
    return tuple(remotes)


def _table(data: dict[str, Any], name: str, source: str) -> dict[str, Any]:
    table = data.get(name, {})
    if not isinstance(table, dict):
        raise ConfigError(f"{source}: [{name}] should be a table")
    return table


def _steering_from_toml(data: dict[str, Any], source: str) -> SteeringSettings:
    table, defaults = _table(data, "steering", source), SteeringSettings()
    vectors, strengths = table.get("vectors", []), table.get("strengths", [])
    if not isinstance(vectors, list) or not all(isinstance(v, str) for v in vectors):
        raise ConfigError(f"{source}: steering.vectors should be a list of control-vector files")
    if not isinstance(strengths, list) or not all(
        isinstance(v, int | float) and not isinstance(v, bool) for v in strengths
    ):
        raise ConfigError(f"{source}: steering.strengths should be a list of numbers")
    return SteeringSettings(
        vectors=tuple(vectors),
        strengths=tuple(float(v) for v in strengths),
        layer_start=_typed(table, "layer_start", int, defaults.layer_start, "steering."),
        layer_end=_typed(table, "layer_end", int, defaults.layer_end, "steering."),
    )


CONFIG_HEADER = "llmtui settings: the settings screen changes the values; your comments, order and other keys stay"


def _config_tables(config: Config) -> dict[str, dict[str, object]]:
    """config.toml's tables for `config` (all but [[remote]]), as plain TOML values."""
    engine: dict[str, object] = {key: _plain(value) for key, value in s.values_of(config.engine, s.ENGINE).items()}
    engine["n_gpu_layers"] = config.engine.n_gpu_layers if config.engine.n_gpu_layers >= -1 else "auto"
    return {
        "engine": engine,
        "models": {"folders": list(config.model_folders), "last_model": config.last_model},
        "ui": s.values_of(config, ui.UI),
        "speculative": s.values_of(config.speculative, ui.SPECULATIVE),
        "steering": {key: _plain(value) for key, value in asdict(config.steering).items()},
        "server": {key: _plain(value) for key, value in asdict(config.server).items()},
        "cache": s.values_of(config.cache, s.CACHE),
        "documents": s.values_of(config.documents, ui.DOCUMENTS),
    }


def _plain(value: object) -> object:
    """A TOML value as Python compares it: tuples as lists, tomlkit's items unwrapped."""
    if isinstance(value, tuple | list):
        return [_plain(item) for item in value]
    unwrap = getattr(value, "unwrap", None)
    return unwrap() if callable(unwrap) else value


def _update(table: MutableMapping[str, Any], values: dict[str, object]) -> None:
    """Set each value in `table` where it differs (an unchanged value keeps how the user wrote it, and every
    comment stays where it was)."""
    for key, value in values.items():
        if key not in table or _plain(table[key]) != value:
            table[key] = value


def _update_remotes(document: tomlkit.TOMLDocument, remotes: tuple[RemoteSettings, ...]) -> None:
    """[[remote]] tables for `remotes`, each remote's table kept (with its comments) when one had its name."""
    previous = document.get("remote")
    kept = {table.get("name"): table for table in previous} if isinstance(previous, AoT) else {}
    if "remote" in document:
        del document["remote"]
    if not remotes:
        return
    tables = tomlkit.aot()
    for remote in remotes:
        table = kept.pop(remote.name, None) or tomlkit.table()
        values = {
            key: value
            for key, value in asdict(remote).items()
            if key in ("name", "base_url")
            or (value and not (key == "stall_timeout_s" and value == REMOTE_STALL_TIMEOUT_S))
        }
        for key in [key for key in asdict(remote) if key in table and key not in values]:
            del table[key]
        _update(table, values)
        tables.append(table)
    document["remote"] = tables


def config_to_toml(config: Config, previous: str = "") -> str:
    """config.toml text for `config`: `previous` (the file as it was) with the values that changed written in
    place, so the user's comments, order and other keys stay; a new file when there was none or it was not TOML."""
    try:
        document = tomlkit.parse(previous) if previous.strip() else None
    except TomlParseError:
        document = None
    if document is None:
        document = tomlkit.document()
        document.add(tomlkit.comment(CONFIG_HEADER))
    for name, values in _config_tables(config).items():
        table = document.get(name)
        if not isinstance(table, MutableMapping):
            table = tomlkit.table()
            if name in document:
                del document[name]
            document[name] = table
        _update(table, values)
    update_presets(document["models"], config.model_presets)
    _update_remotes(document, config.remotes)
    return tomlkit.dumps(document)


def load_config(path: Path | None = None) -> Config:
    """The saved settings (defaults when there is no file); ConfigError when the file is bad."""
    path = path or config_path()
    text = read_config_text(path)
    return config_from_toml(text, str(path)) if text else Config()


def save_config(config: Config, path: Path | None = None) -> None:
    """Validate and write the settings atomically (a 0600 temporary file renamed over the old one, in a 0700
    folder), keeping the file's comments, order and other keys (config_to_toml)."""
    config.validate()
    path = path or config_path()
    previous = read_config_text(path)
    try:
        private_dir(path.parent)
        write_private_text(path, config_to_toml(config, previous))
    except OSError as error:
        raise ConfigError(f"cannot save settings to {path}: {error}") from error
