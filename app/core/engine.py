"""The engine interface: what the UI, the CLI and the server ask of an engine, the local worker or a remote server.

One Protocol, two implementations (`app/tui/bridge.py`'s `EngineBridge`, the local worker; `app/tui/remote_bridge.py`'s
`RemoteBridge`, an OpenAI-compatible server). What only some engines can do is declared in `EngineCapabilities`, or
is a method with a default here, so no caller asks which engine it holds.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from app.core.config import SamplingSettings
from engine_ext.params import DiskCacheParams
from engine_ext.protocol import ChatMessage

if TYPE_CHECKING:
    from app.core.config import Config, EngineSettings
    from app.core.engine_share import SharedEngine
    from engine_ext.params import SpeculativeParams, SteeringEntry


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
    """What the app asks of an engine. Every call returns at once; what happens comes back as the engine protocol's
    events (`engine_ext/protocol.py`), each carrying its request id where it has one."""

    capabilities: EngineCapabilities

    @property
    def model_path(self) -> str | None:
        """The model last asked for: a file, or "remote:NAME/MODEL" (None: none yet)."""

    @property
    def pid(self) -> int | None:
        """The engine's process on this machine (None: not started, or not on this machine)."""

    def start(self) -> None:
        """Start the engine (a worker process) if it is not running."""

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

    def shared_engine(self) -> SharedEngine | None:
        """The engine the app's API server runs its requests on, between the chat's replies (None: this one
        cannot serve them)."""
        return None

    def close(self, timeout_s: float = 5.0) -> None:
        """Stop everything in flight and end the engine; nothing is posted afterwards. Idempotent."""
