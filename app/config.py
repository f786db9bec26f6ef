"""User settings: engine options, model folders and UI choices, validated and kept in `config.toml`."""

from __future__ import annotations

import math
import os
import re
import tomllib
from collections.abc import MutableMapping
from dataclasses import asdict, dataclass, field, fields, replace
from pathlib import Path
from typing import Any, Final
from urllib.parse import urlsplit

import tomlkit
from tomlkit.exceptions import ParseError as TomlParseError
from tomlkit.items import AoT

from app.paths import CONFIG_FILE_NAME, config_path
from app.private_files import private_dir, write_private_text
from engine_ext.params import (
    DEFAULT_FIT_TARGET_MIB,
    GPU_LAYERS_AUTO,  # `-ngl auto`: as many layers as free device memory allows; "auto" in config.toml
    KV_CACHE_TYPES,
    SPEC_TYPES,
    SPLIT_MODES,
    ContextParams,
    EngineError,
    ModelParams,
    SamplingParams,
    SpeculativeParams,
    SteeringEntry,
    ascii_digits,
)

THEMES: Final = ("dark", "light")
FLASH_ATTENTION_MODES: Final = ("auto", "on", "off")
REMOTE_NAME_PATTERN: Final = re.compile(r"^[\w.-]{1,40}$")
ENV_VAR_PATTERN: Final = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


class ConfigError(Exception):
    """A settings value or file a user has to fix; the message names the setting and what is allowed."""


@dataclass(frozen=True)
class EngineSettings:
    """How models are loaded and run, with llama.cpp's names: -c, -t, -ngl, --fit-target, -fa, -ctk/-ctv, -b, -ub,
    -sm, -ts, -mg, --n-cpu-moe, --no-mmap, --mlock, --no-repack, --rpc."""

    n_ctx: int = 4096
    n_threads: int = 0
    n_gpu_layers: int = -1  # -1: all, 0: none, GPU_LAYERS_AUTO: as many as fit
    flash_attn: str = "auto"
    type_k: str = "f16"
    type_v: str = "f16"
    n_batch: int = 2048
    n_ubatch: int = 512
    split_mode: str = "layer"
    tensor_split: tuple[float, ...] = ()
    main_gpu: int = 0
    n_cpu_moe: int = 0
    use_mmap: bool = True
    use_mlock: bool = False
    use_extra_bufts: bool = True  # weights repacked for this CPU (AMX, CPU_REPACK); False: --no-repack
    rpc_servers: tuple[str, ...] = ()
    fit_target_mib: int = DEFAULT_FIT_TARGET_MIB  # with -ngl auto: MiB left free on each device

    def validate(self) -> None:
        """Raise ConfigError naming the first bad value (and combinations llama.cpp would reject or abort on)."""
        if self.n_ctx < 0 or self.n_ctx > 1 << 24:
            raise ConfigError(f"context size must be 0 (the model's) or a positive number of tokens, not {self.n_ctx}")
        if self.n_threads < 0 or self.n_threads > 1024:
            raise ConfigError(f"threads must be 0 (automatic) or a positive number, not {self.n_threads}")
        if self.n_gpu_layers < GPU_LAYERS_AUTO:
            raise ConfigError(
                f"GPU layers must be auto, -1 (all), 0 (none) or a positive number, not {self.n_gpu_layers}"
            )
        if self.flash_attn not in FLASH_ATTENTION_MODES:
            raise ConfigError(f"flash attention must be auto, on or off, not {self.flash_attn!r}")
        for name, value in (("K", self.type_k), ("V", self.type_v)):
            if value not in KV_CACHE_TYPES:
                raise ConfigError(f"KV cache type {name} must be one of {', '.join(KV_CACHE_TYPES)}, not {value!r}")
        if self.n_batch < 1:
            raise ConfigError(f"batch size must be at least 1, not {self.n_batch}")
        if self.n_ubatch < 1:
            raise ConfigError(f"micro-batch size must be at least 1, not {self.n_ubatch}")
        if self.split_mode not in SPLIT_MODES:
            raise ConfigError(f"split mode must be one of {', '.join(SPLIT_MODES)}, not {self.split_mode!r}")
        if not all(math.isfinite(v) for v in self.tensor_split):
            raise ConfigError("tensor split shares must be finite numbers")
        if self.main_gpu < 0 or self.n_cpu_moe < 0 or self.fit_target_mib < 0:
            raise ConfigError("main GPU, CPU MoE layers and the fit target must not be negative")
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
        return ModelParams(
            n_gpu_layers=self.n_gpu_layers,
            use_mmap=self.use_mmap,
            use_mlock=self.use_mlock,
            use_extra_bufts=self.use_extra_bufts,
            main_gpu=self.main_gpu,
            rpc_servers=self.rpc_servers,
            split_mode=self.split_mode,
            tensor_split=self.tensor_split,
            n_cpu_moe=self.n_cpu_moe,
            fit_target_mib=self.fit_target_mib,
        )

    def context_params(self) -> ContextParams:
        return ContextParams(
            n_ctx=self.n_ctx,
            n_batch=self.n_batch,
            n_ubatch=min(self.n_ubatch, self.n_batch),  # llama.cpp clamps -ub to -b the same way
            n_threads=self.n_threads,
            flash_attn=self.flash_attn,  # type: ignore[arg-type]
            type_k=self.type_k,
            type_v=self.type_v,
        )


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

    temperature: float = 0.8
    top_k: int = 40
    top_p: float = 0.95
    min_p: float = 0.05
    repeat_penalty: float = 1.0
    max_tokens: int = -1
    seed: int = -1  # -1: a random seed per reply

    def validate(self) -> None:
        if not all(math.isfinite(v) for v in (self.temperature, self.top_p, self.min_p, self.repeat_penalty)):
            raise ConfigError("sampling values must be finite numbers")
        if self.max_tokens < -1 or self.max_tokens == 0:
            raise ConfigError(f"max tokens must be -1 (no limit) or positive, not {self.max_tokens}")
        if self.seed < -1 or self.seed > 0xFFFFFFFF:
            raise ConfigError(f"seed must be -1 (random) or between 0 and {0xFFFFFFFF}, not {self.seed}")
        try:
            self.sampling_params().validate()
        except EngineError as error:
            raise ConfigError(str(error)) from error

    def sampling_params(self) -> SamplingParams:
        base = SamplingParams()
        return replace(
            base,
            temperature=self.temperature,
            top_k=self.top_k,
            top_p=self.top_p,
            min_p=self.min_p,
            repeat_penalty=self.repeat_penalty,
            seed=base.seed if self.seed < 0 else self.seed,
        )

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
            else:
                values[f.name] = default
        return cls(**values)


@dataclass(frozen=True)
class SpeculativeSettings:
    """Speculative decoding as the user chose it (F8 toggles it, F9 picks the type; llama.cpp's names)."""

    enabled: bool = False
    spec_type: str = "auto"
    draft_model: str = ""  # draft-simple / eagle3 / dflash / dspark file, or an mtp-*.gguf sidecar
    n_max: int = 16
    n_min: int = 0
    p_min: float = 0.0

    def params(self) -> SpeculativeParams:
        """What the engine gets (no types while disabled: off)."""
        return SpeculativeParams(
            types=(self.spec_type,) if self.enabled else (),
            draft_model=self.draft_model or None,
            n_max=self.n_max,
            n_min=self.n_min,
            p_min=self.p_min,
        )

    def validate(self) -> None:
        if self.spec_type not in SPEC_TYPES:
            raise ConfigError(f"speculative type must be one of {', '.join(SPEC_TYPES)}, not {self.spec_type!r}")
        try:
            replace(self.params(), types=(self.spec_type,)).validate()
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
class Config:
    """Everything in config.toml."""

    engine: EngineSettings = field(default_factory=EngineSettings)
    model_folders: tuple[str, ...] = ()
    last_model: str = ""
    theme: str = "dark"
    show_sidebar: bool = True
    draft_colouring: bool = False  # colour text from accepted draft tokens in the transcript (F7)
    spec_details: bool = False  # the speculative meter expanded into its details (ctrl+o)
    speculative: SpeculativeSettings = field(default_factory=SpeculativeSettings)
    steering: SteeringSettings = field(default_factory=SteeringSettings)
    remotes: tuple[RemoteSettings, ...] = ()

    def validate(self) -> None:
        self.engine.validate()
        self.speculative.validate()
        self.steering.validate()
        names: set[str] = set()
        for remote in self.remotes:
            remote.validate()
            if remote.name.casefold() in names:
                raise ConfigError(f"two remote engines are named {remote.name!r}; names must differ")
            names.add(remote.name.casefold())
        if self.theme not in THEMES:
            raise ConfigError(f"theme must be one of {', '.join(THEMES)}, not {self.theme!r}")
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
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as error:
        raise ConfigError(f"{source} is not valid TOML: {error}") from error
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
    config = Config(
        engine=EngineSettings(**engine_values),
        model_folders=tuple(folders),
        last_model=_typed(models_table, "last_model", str, defaults.last_model, "models."),
        theme=_typed(ui_table, "theme", str, defaults.theme, "ui."),
        show_sidebar=_typed(ui_table, "show_sidebar", bool, defaults.show_sidebar, "ui."),
        draft_colouring=_typed(ui_table, "draft_colouring", bool, defaults.draft_colouring, "ui."),
        spec_details=_typed(ui_table, "spec_details", bool, defaults.spec_details, "ui."),
        speculative=_speculative_from_toml(data, source),
        steering=_steering_from_toml(data, source),
        remotes=_remotes_from_toml(data, source),
    )
    try:
        config.validate()
    except ConfigError as error:
        raise ConfigError(f"{source}: {error}") from error
    return config


def _engine_values(table: dict[str, Any]) -> dict[str, Any]:
    defaults = EngineSettings()
    values: dict[str, Any] = {}
    for f in fields(EngineSettings):
        default = getattr(defaults, f.name)
        if f.name == "n_gpu_layers" and isinstance(table.get(f.name), str):
            values[f.name] = parse_gpu_layers(table[f.name])
        elif f.name == "tensor_split":
            shares = table.get(f.name, [])
            if not isinstance(shares, list) or not all(
                isinstance(v, int | float) and not isinstance(v, bool) for v in shares
            ):
                raise ConfigError("engine.tensor_split should be a list of numbers (shares per device)")
            values[f.name] = tuple(float(v) for v in shares)
        elif f.name == "rpc_servers":
            servers = table.get(f.name, [])
            if not isinstance(servers, list) or not all(isinstance(v, str) for v in servers):
                raise ConfigError('engine.rpc_servers should be a list of "HOST:PORT" strings')
            values[f.name] = tuple(servers)
        else:
            values[f.name] = _typed(table, f.name, type(default), default, "engine.")
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


def _speculative_from_toml(data: dict[str, Any], source: str) -> SpeculativeSettings:
    table, defaults = _table(data, "speculative", source), SpeculativeSettings()
    return SpeculativeSettings(
        **{
            f.name: _typed(table, f.name, type(getattr(defaults, f.name)), getattr(defaults, f.name), "speculative.")
            for f in fields(SpeculativeSettings)
        }
    )


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
    engine: dict[str, object] = {key: _plain(value) for key, value in asdict(config.engine).items()}
    engine["n_gpu_layers"] = config.engine.n_gpu_layers if config.engine.n_gpu_layers >= -1 else "auto"
    return {
        "engine": engine,
        "models": {"folders": list(config.model_folders), "last_model": config.last_model},
        "ui": {
            "theme": config.theme,
            "show_sidebar": config.show_sidebar,
            "draft_colouring": config.draft_colouring,
            "spec_details": config.spec_details,
        },
        "speculative": {key: _plain(value) for key, value in asdict(config.speculative).items()},
        "steering": {key: _plain(value) for key, value in asdict(config.steering).items()},
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
    _update_remotes(document, config.remotes)
    return tomlkit.dumps(document)


def load_config(path: Path | None = None) -> Config:
    """The saved settings (defaults when there is no file); ConfigError when the file is bad."""
    path = path or config_path()
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return Config()
    except (OSError, UnicodeDecodeError) as error:
        raise ConfigError(f"cannot read {path}: {error}") from error
    return config_from_toml(text, str(path))


def save_config(config: Config, path: Path | None = None) -> None:
    """Validate and write the settings atomically (a 0600 temporary file renamed over the old one, in a 0700
    folder), keeping the file's comments, order and other keys (config_to_toml)."""
    config.validate()
    path = path or config_path()
    try:
        previous = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError):  # none yet, or unreadable: written anew
        previous = ""
    try:
        private_dir(path.parent)
        write_private_text(path, config_to_toml(config, previous))
    except OSError as error:
        raise ConfigError(f"cannot save settings to {path}: {error}") from error
