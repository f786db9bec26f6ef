"""The engine interface: what the UI, the CLI and the server ask of an engine, the local worker or a remote server.

One Protocol, two implementations (`app/tui/bridge.py`'s `EngineBridge`, the local worker; `app/tui/remote_bridge.py`'s
`RemoteBridge`, an OpenAI-compatible server). What only some engines can do is declared in `EngineCapabilities`, or
is a method with a default here, so no caller asks which engine it holds.

Both answer in one vocabulary: the engine protocol's events (`engine_ext/protocol.py`: `TokenChunk`, `Finished`,
`Failed`, `Loaded`…), and the five that only the app's side of an engine knows (`Starting`, `LoadStarted`,
`ReplyStats`, `ReplyHeld`, `Recovering`, below): `EngineEvent` is any of them.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from app.core.config import SamplingSettings
from engine_ext.cpu import CpuLoad
from engine_ext.params import DiskCacheParams
from engine_ext.protocol import ChatMessage, Event, ModelInfo

if TYPE_CHECKING:
    from app.core.config import Config, EngineSettings
    from app.core.engine_share import SharedEngine
    from engine_ext.params import SpeculativeParams, SteeringEntry


@dataclass(frozen=True)
class Starting:
    """A worker process is being started."""


@dataclass(frozen=True)
class LoadStarted:
    """A model is being loaded (a file), or a server asked for its models (a remote engine)."""

    path: str


@dataclass(frozen=True)
class ReplyStats:
    """A reply's live figures while it streams, measured on the app's side: decode speed, time to the first token,
    and, once the prompt is evaluated, the context in use. `cpu`: other programs' CPU use during the reply and the
    engine's threads (None: not measured yet, or not measurable: another OS, a remote engine)."""

    request_id: int
    n_tokens: int
    tokens_per_s: float | None  # None: no token yet
    ttft_ms: float | None
    prompt_tokens: int | None = None  # None: not known (yet)
    n_ctx: int | None = None
    cpu: CpuLoad | None = None


@dataclass(frozen=True)
class ReplyHeld:
    """A reply of the app's waits for the API server's requests on the app's engine (`ahead`: how many run before
    it); it starts when they are done, and says so with `ahead` 0."""

    request_id: int
    ahead: int


@dataclass(frozen=True)
class Recovering:
    """The worker is being restarted, the model reloaded: after a native crash early on with CPU weight repacking on,
    without it (a reply in flight sent again; `notice` says so in one line), or as it was after the watchdog ended a
    stuck worker or a request crashed it (`notice` empty: the reply it ended says why)."""

    notice: str


EngineEvent = Event | Starting | LoadStarted | ReplyStats | ReplyHeld | Recovering
"""What an engine tells the app: the protocol's events and the app side's own."""


@dataclass(frozen=True)
class ModelSummary:
    """What the UI shows about a loaded model (an engine's `describe` of the protocol's `ModelInfo`)."""

    path: str
    name: str
    architecture: str
    backend: str
    n_ctx: int
    n_params: int
    size_bytes: int
    load_ms: float
    placement: str = ""  # with -ngl auto: what the engine placed where and why
    n_threads: int = 0  # decode threads in use (0: not known, a remote engine)
    repack: bool = True  # CPU weights loaded into llama.cpp's extra buffer types (False: --no-repack)
    n_embd: int = 0  # the model's embedding width (0: not known, a remote engine)
    thinking_controls: tuple[str, ...] | None = None  # what its template reads of them (None: not known, remote)
    mmproj: str = ""  # the projector loaded with it: the model sees images ("" none, or a remote engine)
    tool_format: str = ""  # how it writes tool calls ("generic": llama.cpp's generic format; "": not known, remote)

    @property
    def sees_images(self) -> bool:
        return bool(self.mmproj)


@dataclass(frozen=True)
class EngineCapabilities:
    """What an engine can do besides generating text; the UI offers only what its engine declares."""

    loads_files: bool
    """It loads model files from this machine (the local worker); False: the model is a server's, named by id."""
    tools: bool = False
    """It reads the tool calls of a reply back (`Finished.tool_calls`), so the chat may offer tools."""
    speculation: bool = False
    """llmtui's speculative decoding (`set_speculative`; a server drafts on its own if at all)."""
    steering: bool = False
    """Control vectors: `set_steering` and `make_vector`."""
    images: bool = False
    """Images go with the messages (to a model loaded with its projector)."""


class Engine(Protocol):
    """What the app asks of an engine. Every call returns at once; what happens comes back as `EngineEvent`s, each
    carrying its request id where it has one."""

    capabilities: EngineCapabilities

    @property
    def model_path(self) -> str | None:
        """The model last asked for: a file, or "remote:NAME/MODEL" (None: none yet)."""

    @property
    def pid(self) -> int | None:
        """The engine's process on this machine (None: not started, or not on this machine)."""

    def start(self) -> None:
        """Start the engine (a worker process) if it is not running."""

    def describe(self, info: ModelInfo) -> ModelSummary:
        """What the UI shows of the model its `Loaded` event reports (names made safe to show)."""

    def load(
        self,
        path: str,
        engine: EngineSettings,
        *,
        load_mtp: bool = False,
        n_rs_seq: int = 0,
        mmproj: str = "",
        disk_cache: DiskCacheParams = DiskCacheParams(),
    ) -> None:
        """Load the model `path` names, with these engine settings; MTP heads and rollback depth for speculation, the
        projector paired with it (images), and the prompt cache on disk (an engine ignores what it has no use for)."""

    def restart(self, engine: EngineSettings | None = None) -> None:
        """Start again (after a crash or an error) with the model last asked for; `engine`: the settings saved
        since it was loaded."""

    def generate(
        self,
        messages: Sequence[tuple[str, str] | ChatMessage],
        sampling: SamplingSettings,
        *,
        continue_reply: bool = False,
        tools: str | None = None,
    ) -> int:
        """Queue a generation; its request id (carried by every event of that request). `tools`: OpenAI-shaped
        definitions offered to the model (only to an engine whose capabilities say `tools`)."""

    def cancel(self, request_id: int) -> None:
        """Stop the request; it still ends with a finished event (stop reason "cancelled")."""

    def end_thinking(self, request_id: int) -> bool:
        """Stop the request's thinking now (it answers); whether this engine can."""
        return False

    def set_speculative(self, params: SpeculativeParams) -> None:
        """Configure speculative decoding (no types: off); an engine without it refuses anything but off."""

    def set_steering(self, entries: tuple[SteeringEntry, ...]) -> None:
        """Apply a control-vector mix (empty: none); an engine without steering refuses a mix."""

    def make_vector(self, prompt_set_path: str, output_path: str, method: str = "pca") -> None:
        """Make a control vector on the loaded model; an engine without steering refuses."""

    def settings_saved(self, config: Config) -> None:
        """The user saved new settings: what applies at once to this engine (a remote endpoint's key) does."""
        return None

    def stop_served(self) -> None:
        """Stop the API server's requests on this engine, running and waiting (a reply of the app's held behind
        them starts at once); nothing where the engine serves none."""
        return None

    def shared_engine(self) -> SharedEngine | None:
        """The engine the app's API server runs its requests on, between the chat's replies (None: this one
        cannot serve them)."""
        return None

    def close(self, timeout_s: float = 5.0) -> None:
        """Stop everything in flight and end the engine; nothing is posted afterwards. Idempotent."""
