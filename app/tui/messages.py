"""Textual messages the engine bridge posts to the app: what happened in the engine, as plain data."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

from textual.message import Message

from engine_ext.cpu import CpuLoad
from engine_ext.protocol import SpeculativeStats, SteeringSet, ToolCall
from engine_ext.recovery import Fallback

StatsDict = dict[str, Any]


class MessageTarget(Protocol):
    """What the bridges post these messages to (the App; the CLI's inbox for --remote)."""

    def post_message(self, message: Message) -> bool: ...


@dataclass(frozen=True)
class ModelSummary:
    """What the UI shows about a loaded model."""

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


class EngineStarting(Message):
    """A worker process is being started."""


class EngineStarted(Message):
    """The worker greeted us."""

    def __init__(self, pid: int, llama_cpp_version: str) -> None:
        super().__init__()
        self.pid = pid
        self.llama_cpp_version = llama_cpp_version


class ModelLoadStarted(Message):
    """A model file is being loaded."""

    def __init__(self, path: str) -> None:
        super().__init__()
        self.path = path


class ModelLoadProgress(Message, bubble=False):
    """Loading progress, 0..1; a newer one replaces an unprocessed older one."""

    def __init__(self, path: str, fraction: float) -> None:
        super().__init__()
        self.path = path
        self.fraction = fraction

    def can_replace(self, message: Message) -> bool:
        return isinstance(message, ModelLoadProgress)


class ModelLoaded(Message):
    """The model is ready to generate."""

    def __init__(self, model: ModelSummary) -> None:
        super().__init__()
        self.model = model


class ModelLoadFailed(Message):
    """The model could not be loaded; `error` says why in words a user understands."""

    def __init__(self, path: str, error: str) -> None:
        super().__init__()
        self.path = path
        self.error = error


DraftSpan = tuple[int, int, str]
"""[start, end) of a text that came from accepted draft tokens, and the drafter that proposed them ("": not known)."""


def add_span(spans: list[DraftSpan], start: int, end: int, source: str = "") -> None:
    """Append [start, end) from drafter `source` to sorted, disjoint `spans`, merging it with the last one when they
    touch and came from the same drafter."""
    if end <= start:
        return
    if spans and spans[-1][1] >= start and spans[-1][2] == source:
        spans[-1] = (spans[-1][0], max(spans[-1][1], end), source)
    else:
        spans.append((start, end, source))


class TokensArrived(Message, bubble=False):
    """Generated text for one request (consecutive chunks merged in order, never dropped or replaced).

    `draft_spans` are the (start, end, drafter) character ranges of `text` that came from accepted draft tokens of
    speculative decoding (empty when nothing was drafted, or when the engine does not say).
    """

    def __init__(
        self, request_id: int, text: str, reasoning: str, n_tokens: int, draft_spans: tuple[DraftSpan, ...] = ()
    ) -> None:
        super().__init__()
        self.request_id = request_id
        self.text = text
        self.reasoning = reasoning
        self.n_tokens = n_tokens
        self.draft_spans = draft_spans


class PromptProgressed(Message, bubble=False):
    """A long prompt is being read: `done` of its `total` tokens are in the context."""

    def __init__(self, request_id: int, done: int, total: int) -> None:
        super().__init__()
        self.request_id = request_id
        self.done = done
        self.total = total


class GenerationStatsUpdated(Message, bubble=False):
    """Live decode speed (and, once the prompt is evaluated, the context in use) while streaming; a newer one
    replaces an unprocessed older one. `cpu`: other programs' CPU use during this reply and the engine's threads
    (None: not measured yet, or not measurable: another OS, a remote engine)."""

    def __init__(
        self,
        request_id: int,
        n_tokens: int,
        tokens_per_s: float | None,
        ttft_ms: float | None,
        prompt_tokens: int | None = None,
        n_ctx: int | None = None,
        cpu: CpuLoad | None = None,
    ) -> None:
        super().__init__()
        self.request_id = request_id
        self.n_tokens = n_tokens
        self.tokens_per_s = tokens_per_s  # None: no token yet
        self.ttft_ms = ttft_ms
        self.prompt_tokens = prompt_tokens  # None: not known (yet)
        self.n_ctx = n_ctx
        self.cpu = cpu

    def can_replace(self, message: Message) -> bool:
        return isinstance(message, GenerationStatsUpdated) and message.request_id == self.request_id


class GenerationFinished(Message):
    """A generation ended normally: `stop_reason` is eos, stop_string, max_tokens, cancelled or context_full."""

    def __init__(
        self,
        request_id: int,
        stop_reason: str,
        stats: StatsDict,
        notices: tuple[str, ...],
        tool_calls: tuple[ToolCall, ...] = (),
    ) -> None:
        super().__init__()
        self.request_id = request_id
        self.stop_reason = stop_reason
        self.stats = stats
        self.notices = notices
        self.tool_calls = tool_calls
        """The calls the reply made (requests that offered tools)."""


class GenerationFailed(Message):
    """The engine refused or failed a generation (the worker is still alive)."""

    def __init__(self, request_id: int | None, error: str) -> None:
        super().__init__()
        self.request_id = request_id
        self.error = error


class EngineCrashed(Message):
    """The worker process died; `log_tail` is the end of its log (the whole log at `log_path`), `fallbacks` the engine
    settings that could avoid the crash, to try from the crash dialog."""

    def __init__(
        self,
        description: str,
        log_tail: str,
        exit_code: int | None,
        log_path: str = "",
        fallbacks: tuple[Fallback, ...] = (),
    ) -> None:
        super().__init__()
        self.description = description
        self.log_tail = log_tail
        self.exit_code = exit_code
        self.log_path = log_path
        self.fallbacks = fallbacks


class EngineRecovering(Message):
    """The worker is being restarted, the model reloaded: after a native crash early on with CPU weight repacking on,
    without it (a reply in flight sent again; `notice` says so in one line), or as it was after the watchdog ended a
    stuck worker or a request crashed it (`notice` empty: the reply it ended says why)."""

    def __init__(self, notice: str) -> None:
        super().__init__()
        self.notice = notice


class SpeculativeConfigured(Message):
    """Speculative decoding is set up: the drafters in chain order (empty: off)."""

    def __init__(self, drafters: tuple[str, ...], notices: tuple[str, ...]) -> None:
        super().__init__()
        self.drafters = drafters
        self.notices = notices


class SpeculativeStatsUpdated(Message, bubble=False):
    """Live (or, with `final`, a finished reply's) speculative statistics; a newer one replaces an older one."""

    def __init__(self, stats: SpeculativeStats, final: bool = False) -> None:
        super().__init__()
        self.stats = stats
        self.final = final

    def can_replace(self, message: Message) -> bool:
        return isinstance(message, SpeculativeStatsUpdated) and not message.final


class SteeringApplied(Message):
    """The engine applies this steering now (the worker's SteeringSet)."""

    def __init__(self, applied: SteeringSet) -> None:
        super().__init__()
        self.applied = applied


class VectorProgressed(Message, bubble=False):
    """Making a control vector: `done` of `total` steps of `phase` (the worker's VectorProgress: prompt pairs,
    layers, the file), `phase_seconds` into that phase, `fraction` of the whole; a newer one replaces an older one."""

    def __init__(
        self, done: int, total: int, phase: str = "evaluating", phase_seconds: float = 0.0, fraction: float = 0.0
    ) -> None:
        super().__init__()
        self.done = done
        self.total = total
        self.phase = phase
        self.phase_seconds = phase_seconds
        self.fraction = fraction

    def can_replace(self, message: Message) -> bool:
        return isinstance(message, VectorProgressed)


class VectorCreated(Message):
    """A control vector was made and written to `path`."""

    def __init__(self, path: str, layers: int, pairs: int, seconds: float) -> None:
        super().__init__()
        self.path = path
        self.layers = layers
        self.pairs = pairs
        self.seconds = seconds


class EngineRequestFailed(Message):
    """A speculative, steering or make-vector request was refused; `kind` says which, `error` why."""

    def __init__(self, kind: str, error: str) -> None:
        super().__init__()
        self.kind = kind
        self.error = error
