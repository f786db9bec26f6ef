"""Typed, versioned messages between the engine client (UI process) and the engine worker process."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Final, Literal

from engine_ext.params import (
    ContextParams,
    DiskCacheParams,
    ModelParams,
    PromptTooLong,
    SamplingParams,
    SpeculativeParams,
    SteeringEntry,
)

if TYPE_CHECKING:
    from engine_ext.recovery import Fallback

# 2: parallel requests (Submit, SetQueueLimit, Busy); 3: EndThinking, reasoning budget; 4: count_only;
# 5: LoadModel.disk_cache; 6: Generate.suffix (fill in the middle), ModelInfo.tool_format
PROTOCOL_VERSION = 6

StopReason = Literal["eos", "stop_string", "max_tokens", "cancelled", "context_full"]


# Where a message's image goes in its text (llama.cpp's default media marker): each marker in `content` takes the
# message's next image; images no marker places come before the text.
IMAGE_MARKER: Final = "<__media__>"


@dataclass(frozen=True)
class ImageRef:
    """An image sent with a message: its sha256 (hex, of the file's bytes) and the bytes, or a path the worker reads.
    The worker keeps encoded images by that hash, so an image it has seen is neither read nor encoded again."""

    sha256: str
    data: bytes = b""
    path: str = ""
    name: str = ""  # what messages call it (a file name)


@dataclass(frozen=True)
class ChatMessage:
    role: str  # system | user | assistant | tool
    content: str
    tool_calls: str = ""  # assistant: the calls it made, a JSON array in OpenAI's shape (engine_ext.tool_calls)
    tool_call_id: str = ""  # tool: the id of the call this is the result of
    name: str = ""  # tool: the name of the tool that gave this result
    images: tuple[ImageRef, ...] = ()


# ----- requests (client → worker) -------------------------------------------------------------------


@dataclass(frozen=True)
class LoadModel:
    path: str
    model: ModelParams = ModelParams()
    context: ContextParams = ContextParams()
    disk_cache: DiskCacheParams = DiskCacheParams()  # off unless it names a folder or a file


@dataclass(frozen=True)
class UnloadModel:
    pass


@dataclass(frozen=True)
class Generate:
    """One generation: either chat `messages` (rendered with the model's template) or a raw `prompt`."""

    request_id: int
    messages: tuple[ChatMessage, ...] = ()
    prompt: str | None = None
    prompt_tokens: tuple[int, ...] | None = None  # pre-tokenized raw prompt (benchmarks)
    # With a raw `prompt`: fill in the middle between the prompt and this text, through the model's FIM tokens
    suffix: str | None = None
    sampling: SamplingParams = SamplingParams()
    max_tokens: int = -1  # -1: until end of generation or the context is full
    stop: tuple[str, ...] = ()
    ignore_eos: bool = False
    enable_thinking: bool | None = None  # passed to templates that understand it (Qwen3.x)
    continue_reply: bool = False  # messages end with a partial assistant reply to continue
    speculative: bool = True  # use the configured speculative decoding, if any
    grammar: str | None = None  # GBNF the reply must follow (engine_ext.grammar)
    json_schema: str | None = None  # or a JSON schema it must follow (converted to GBNF in the worker)
    tools: str | None = None  # JSON array of OpenAI-shaped tool definitions, given to the chat template
    tool_choice: str = "auto"  # auto | required (the reply is a call, by grammar) | none (tools not offered)
    reasoning_effort: str | None = None  # low | medium | high, passed to templates that understand it
    # Thinking tokens before the end of thinking is forced (engine_ext.reasoning): -1 unlimited, 0 no thinking at all
    reasoning_budget: int = -1
    reasoning_budget_message: str = ""  # forced before the template's end of thinking when the budget is spent
    # Only count the prompt's tokens as rendered (an API's count_tokens): Finished at once, nothing evaluated
    count_only: bool = False


@dataclass(frozen=True)
class Submit:
    """One generation among parallel ones (an API server's request): decoded in one batch with the others that run,
    each sequence with its own sampler, steering mix and n-gram drafting; its events carry `request.request_id`.

    Refused with a Busy event when the queue of requests waiting for a sequence is full (SetQueueLimit). `steering`
    is this request's control-vector mix (empty: none), whatever SetSteering applied for Generate; `speculative`
    its n-gram drafting (None: none)."""

    request: Generate
    steering: tuple[SteeringEntry, ...] = ()
    speculative: SpeculativeParams | None = None


@dataclass(frozen=True)
class SetQueueLimit:
    """The most Submit requests that wait for a free sequence; past it a request is refused (Busy)."""

    max_waiting: int


@dataclass(frozen=True)
class SetSpeculative:
    """Configure speculative decoding for the loaded model (no types: off); answered by SpeculativeSet."""

    params: SpeculativeParams


@dataclass(frozen=True)
class SetSteering:
    """Apply this mix of control vectors (empty: none); takes effect at the next token of a generation."""

    entries: tuple[SteeringEntry, ...]
    # Forget the prompt cache: what the context holds was computed under another mix (the API server sends it when a
    # request's mix differs from the last one's; the chat keeps its cache, so a slider acts on the reply as it streams).
    reset_cache: bool = False


@dataclass(frozen=True)
class MakeControlVector:
    """Make a control vector on the loaded model from a prompt-set file; answered by VectorMade."""

    prompt_set_path: str
    output_path: str
    method: str = "pca"  # pca | mean


@dataclass(frozen=True)
class Cancel:
    request_id: int


@dataclass(frozen=True)
class EndThinking:
    """Stop thinking now: the end of thinking is forced at the next token boundary of this request's reply, and the
    model goes on to answer (ignored when it is not thinking)."""

    request_id: int


@dataclass(frozen=True)
class Inspect:
    path: str


@dataclass(frozen=True)
class Shutdown:
    pass


@dataclass(frozen=True)
class SlotAction:
    """llama-server's slot actions (`POST /slots/{id}?action=...`): save a sequence's state to `path`, restore it from
    `path` (checked as the prompt cache's files are: engine_ext.disk_cache), or erase it. Without `request_id`: the
    single sequence's; with one, parallel sequence `slot`'s (engine_ext.seq_slots), answered with that id."""

    action: Literal["save", "restore", "erase"]
    path: str = ""
    slot: int = 0
    request_id: int | None = None


@dataclass(frozen=True)
class Embed:
    """Pooled embeddings of `texts` from the loaded model (llama.cpp's pooling: the model's, or mean for a model that
    names none); with `query`, a reranker's relevance of each text to it (rank pooling). Answered by `Embedded`."""

    texts: tuple[str, ...]
    query: str | None = None
    normalize: bool = True  # unit length (L2), as llama-server's /v1/embeddings gives them


Request = (
    LoadModel
    | UnloadModel
    | Generate
    | Submit
    | SetQueueLimit
    | SetSpeculative
    | SetSteering
    | MakeControlVector
    | Cancel
    | EndThinking
    | Inspect
    | SlotAction
    | Embed
    | Shutdown
)


# ----- events (worker → client) ---------------------------------------------------------------------


@dataclass(frozen=True)
class Hello:
    protocol_version: int
    pid: int
    llama_cpp_version: str
    system_info: str
    cpu_extra_bufts: tuple[str, ...] = ()  # llama.cpp's CPU extra buffer types in this build on this CPU (repacking)
    gpu_devices: int = 0  # devices layers can be offloaded to (GPU, integrated GPU, accelerator)


@dataclass(frozen=True)
class ModelInfo:
    path: str
    architecture: str
    description: str
    n_params: int
    size_bytes: int
    n_ctx: int
    n_ctx_train: int
    n_embd: int
    n_layer: int
    n_layer_nextn: int
    n_vocab: int
    is_recurrent: bool
    is_hybrid: bool
    has_chat_template: bool
    n_threads: int
    backend: str
    load_ms: float
    n_gpu_layers: int = -1  # as loaded (-ngl auto resolved)
    placement: str = ""  # with -ngl auto: what was placed where and why
    thinking_controls: tuple[str, ...] = ()  # what its chat template reads of enable_thinking, reasoning_effort
    mmproj: str = ""  # the projector loaded with the model (images); empty: none
    tool_format: str = (
        ""  # how its tool calls are written (engine_ext.tool_turn.tool_format; "generic": no tools shown)
    )


@dataclass(frozen=True)
class LoadProgress:
    fraction: float


@dataclass(frozen=True)
class Loaded:
    info: ModelInfo


@dataclass(frozen=True)
class Unloaded:
    pass


@dataclass(frozen=True)
class ThreadsChanged:
    """The engine changed its thread count between decode steps (engine_ext.threads): others use `others_cpus` of
    the `cpus` it may run on. Sent only when the count changes."""

    request_id: int
    threads: int
    others_cpus: float
    cpus: int


@dataclass(frozen=True)
class PromptProgress:
    """A long prompt is being read: `done` of `total` tokens are in the context (sent after each micro-batch)."""

    request_id: int
    done: int
    total: int


@dataclass(frozen=True)
class PromptEvaluated:
    """A request's prompt is in the context and its reply starts: the context in use from here on."""

    request_id: int
    prompt_tokens: int  # tokens in the prompt
    prompt_tokens_cached: int  # of which reused from the previous turn
    n_ctx: int


REJECTED_PREFIX: Final = "target/"
FORCED: Final = "forced"  # the provenance of a token the engine forced (the end of thinking): not sampled, not drafted
UNKNOWN_TOKEN: Final = -1  # a token id the engine does not say (a server's stream: one token per chunk)


def rejected_by(drafter: str) -> str:
    """The provenance of the target's token at the position where `drafter`'s draft was rejected."""
    return REJECTED_PREFIX + drafter


@dataclass(frozen=True)
class TokenChunk:
    """Newly generated tokens; `text` is answer text, `reasoning` the model's thinking, both may be ''."""

    request_id: int
    text: str
    reasoning: str
    token_ids: tuple[int, ...]
    # per token: "target", the drafter that proposed an accepted token, rejected_by(drafter) for the target's token
    # where that drafter's draft was rejected, or FORCED for a token the engine forced (the end of thinking)
    provenance: tuple[str, ...]
    text_ends: tuple[int, ...] = ()  # per token: len(text) once its text was added (empty: not known)


@dataclass(frozen=True)
class GenerationStats:
    prompt_tokens: int  # tokens in the prompt
    prompt_tokens_cached: int  # of which reused from the previous turn
    prompt_tokens_evaluated: int  # of which evaluated now
    prompt_ms: float
    generated_tokens: int
    decode_ms: float
    ttft_ms: float  # request received → first token sampled
    n_ctx: int
    n_ctx_used: int
    dropped_messages: int = 0  # oldest turns dropped to fit the context
    n_threads: int = 0  # the CPU threads decoding when the reply ended (they follow a busy machine; 0: not known)
    reasoning_tokens: int = 0  # tokens the model thought (its thinking block, forced tokens not counted)
    reasoning_ms: float = 0.0  # from its first thinking token to the end of thinking (or of the reply)
    image_tokens: int = 0  # of the prompt's tokens, those its images take (embeddings from the projector)
    images_encoded: int = 0  # images the projector encoded for this request (0: all came from its cache)
    image_encode_ms: float = 0.0  # the time encoding them took (part of prompt_ms)
    n_decode: int = 0  # llama_decode calls while this request ran (its prompt's and its reply's)
    n_decode_total: int = 0  # llama_decode calls of the engine's context so far (it counts from 0 at each load)

    @property
    def prompt_tps(self) -> float:
        return self.prompt_tokens_evaluated * 1000.0 / self.prompt_ms if self.prompt_ms > 0 else 0.0

    @property
    def decode_tps(self) -> float:
        # The first token comes from the prompt's logits; the rest each cost one decode.
        n = self.generated_tokens - 1
        return n * 1000.0 / self.decode_ms if n > 0 and self.decode_ms > 0 else 0.0

    def to_dict(self) -> dict[str, float | int]:
        images: dict[str, float | int] = {}
        if self.image_tokens or self.images_encoded:  # only for prompts with images: other outputs stay as they were
            images = {
                "image_tokens": self.image_tokens,
                "images_encoded": self.images_encoded,
                "image_encode_ms": round(self.image_encode_ms, 3),
            }
        return {
            "prompt_tokens": self.prompt_tokens,
            "prompt_tokens_cached": self.prompt_tokens_cached,
            "prompt_tokens_evaluated": self.prompt_tokens_evaluated,
            "prompt_ms": round(self.prompt_ms, 3),
            "prompt_tps": round(self.prompt_tps, 2),
            "generated_tokens": self.generated_tokens,
            "decode_ms": round(self.decode_ms, 3),
            "decode_tps": round(self.decode_tps, 2),
            "ttft_ms": round(self.ttft_ms, 3),
            "n_ctx": self.n_ctx,
            "n_ctx_used": self.n_ctx_used,
            "dropped_messages": self.dropped_messages,
            "n_threads": self.n_threads,
            "reasoning_tokens": self.reasoning_tokens,
            "reasoning_ms": round(self.reasoning_ms, 3),
        } | images


@dataclass(frozen=True)
class DrafterReport:
    """One drafter's statistics within a generation (upstream's `statistics <type>` line)."""

    name: str
    drafts: int  # non-empty drafts proposed
    proposed: int  # tokens proposed (upstream's "#gen tokens"); more than were drafted when a draft is cut at an
    # end-of-generation token before verification (SpeculativeStats.drafted counts what was verified)
    accepted: int  # tokens accepted by the target
    acceptance_per_position: tuple[float, ...]
    draft_ms: float


@dataclass(frozen=True)
class SpeculativeStats:
    """Speculative decoding statistics of one generation, so far (live) or final."""

    request_id: int
    steps: int  # verify steps that had a draft
    drafted: int  # tokens submitted for verification, as llama.cpp's n_drafted (a draft cut at an end-of-generation
    # token counts up to it); the drafters proposed `proposed` tokens
    accepted: int
    acceptance_rate: float  # accepted / drafted
    mean_accepted_length: float  # 1 + accepted / steps: tokens produced per target decode
    acceptance_per_position: tuple[float, ...]
    recent_acceptance: tuple[float, ...]  # accepted/drafted of the latest steps, oldest first (sparkline)
    draft_ms: float
    verify_ms: float
    effective_tps: float  # generated tokens per second of this generation
    plain_tps: float  # plain decoding speed measured on this model (0: not measured yet)
    drafters: tuple[DrafterReport, ...]
    n_max: int = 0  # the draft length in use (auto mode adapts it)
    status: str = ""  # what speculation is doing and why (auto mode explains pauses)

    @property
    def proposed(self) -> int:
        """Tokens the drafters proposed (at least `drafted`: what follows an end-of-generation token is not
        verified)."""
        return sum(d.proposed for d in self.drafters)

    def counts(self) -> str:
        """The three counts, named as everywhere they are shown: "proposed 138 · drafted 59 · accepted 41 (69%)"
        (the rate is of the drafted tokens, as llama.cpp's)."""
        rate = f" ({self.acceptance_rate:.0%})" if self.drafted else ""
        return f"proposed {self.proposed} · drafted {self.drafted} · accepted {self.accepted}{rate}"

    @property
    def speedup(self) -> float:
        return self.effective_tps / self.plain_tps if self.plain_tps > 0 else 0.0

    def to_dict(self) -> dict[str, object]:
        return {
            "steps": self.steps,
            "proposed": self.proposed,
            "drafted": self.drafted,
            "accepted": self.accepted,
            "acceptance_rate": round(self.acceptance_rate, 4),
            "mean_accepted_length": round(self.mean_accepted_length, 3),
            "acceptance_per_position": [round(v, 4) for v in self.acceptance_per_position],
            "draft_ms": round(self.draft_ms, 3),
            "verify_ms": round(self.verify_ms, 3),
            "effective_tps": round(self.effective_tps, 2),
            "plain_tps": round(self.plain_tps, 2),
            # None where nothing was drafted (or plain decoding is not measured yet): no speedup to speak of
            "speedup": round(self.speedup, 3) if self.drafted and self.plain_tps > 0 else None,
            "n_max": self.n_max,
            "status": self.status,
            "drafters": [
                {
                    "name": d.name,
                    "drafts": d.drafts,
                    "proposed": d.proposed,
                    "accepted": d.accepted,
                    "acceptance_per_position": [round(v, 4) for v in d.acceptance_per_position],
                    "draft_ms": round(d.draft_ms, 3),
                }
                for d in self.drafters
            ],
        }


@dataclass(frozen=True)
class SpeculativeUpdate:
    """Live speculative statistics while a generation runs (coalescable: only the latest matters)."""

    stats: SpeculativeStats


@dataclass(frozen=True)
class ToolCall:
    """One tool call parsed from a reply: `arguments` is a JSON object's text."""

    id: str
    name: str
    arguments: str


@dataclass(frozen=True)
class Finished:
    request_id: int
    stop_reason: StopReason
    stats: GenerationStats
    notices: tuple[str, ...] = field(default=())  # e.g. "dropped 2 oldest messages to fit the context"
    speculative: SpeculativeStats | None = None
    tool_calls: tuple[ToolCall, ...] = ()  # the calls the reply made (requests with tools), in order


@dataclass(frozen=True)
class Busy:
    """A Submit refused: `waiting` requests already wait for one of `slots` sequences (the queue's bound). The
    request never started; an API server answers 503 with Retry-After `retry_after_s`."""

    request_id: int
    waiting: int
    slots: int
    retry_after_s: int = 1


@dataclass(frozen=True)
class Failed:
    request_id: int | None
    error: str  # exception class name
    message: str
    n_prompt_tokens: int = 0  # PromptTooLong: the prompt's tokens and the context's size (else 0)
    n_ctx: int = 0

    @classmethod
    def of(cls, request_id: int | None, exc: BaseException) -> Failed:
        """The event of a request that failed with `exc`."""
        sizes = (exc.n_prompt_tokens, exc.n_ctx) if isinstance(exc, PromptTooLong) else (0, 0)
        return cls(request_id, type(exc).__name__, str(exc) or type(exc).__name__, *sizes)


@dataclass(frozen=True)
class SpeculativeSet:
    """Speculative decoding is configured: the drafters in chain order (empty: off)."""

    drafters: tuple[str, ...]
    notices: tuple[str, ...] = ()


@dataclass(frozen=True)
class SteeringSet:
    """The steering now applied: the layer range and the norm of the applied direction per layer 1..n_layer-1."""

    active: bool
    layer_start: int
    layer_end: int
    layer_norms: tuple[float, ...]
    steered_layers: tuple[int, ...]  # the layers this architecture lets a control vector act on
    notices: tuple[str, ...] = ()


@dataclass(frozen=True)
class VectorProgress:
    """Making a control vector: `done` of `total` steps of `phase` ("evaluating": prompt pairs, "directions":
    layers, "writing": the file), `phase_seconds` since that phase began (its rate gives an ETA), and `fraction` of
    every step of every phase (monotonic; 1.0 only once the file is written)."""

    done: int
    total: int
    phase: str = "evaluating"
    phase_seconds: float = 0.0
    fraction: float = 0.0


@dataclass(frozen=True)
class VectorMade:
    path: str
    layers: int
    pairs: int
    seconds: float


@dataclass(frozen=True)
class Inspected:
    path: str
    info: dict[str, object]


@dataclass(frozen=True)
class LogLine:
    level: str
    text: str


@dataclass(frozen=True)
class Crashed:
    """The worker process died (native abort, segfault, OOM kill); made by the client, not the worker."""

    exit_code: int | None
    log_tail: str
    log_path: str = ""  # the worker's log file (the whole log, where log_tail ends)
    gpu_devices: int = 0  # as the worker's Hello said: whether turning GPU offload off is a fallback to offer
    phase: str = ""  # what the worker was doing (engine_ext.engine_status.PHASES' key; "": not known)
    stopped: str = ""  # the client's watchdog ended it, and why (engine_ext.watchdog): not a crash
    fallbacks: tuple[Fallback, ...] = ()  # engine settings that could avoid it (told by whoever knows the settings)

    @property
    def description(self) -> str:
        if self.stopped:
            return self.stopped
        from engine_ext.engine_status import PHASES, native_phase

        return self._how() + (f" while {PHASES[self.phase]}" if native_phase(self.phase) else "")

    def _how(self) -> str:
        if self.exit_code is None:
            return "the engine process stopped responding"
        if self.exit_code < 0:
            import signal

            try:
                name = signal.Signals(-self.exit_code).name
            except ValueError:
                name = f"signal {-self.exit_code}"
            return f"the engine process was killed by {name}"
        return f"the engine process exited with code {self.exit_code}"


@dataclass(frozen=True)
class SlotDone:
    """A SlotAction's answer: the tokens saved, restored or erased, the file's bytes, and the time it took."""

    action: str
    n_tokens: int
    n_bytes: int = 0
    ms: float = 0.0
    request_id: int | None = None  # the SlotAction's (parallel sequences)


@dataclass(frozen=True)
class Embedded:
    """An Embed's answer: one vector per text (rerank: one score each, in a 1-tuple), the tokens read, the time."""

    vectors: tuple[tuple[float, ...], ...]
    n_tokens: int
    pooling: str  # mean | cls | last | rank
    ms: float = 0.0


Event = (
    Hello
    | LoadProgress
    | Loaded
    | Unloaded
    | PromptProgress
    | ThreadsChanged
    | PromptEvaluated
    | TokenChunk
    | Finished
    | Busy
    | Failed
    | Inspected
    | SpeculativeSet
    | SpeculativeUpdate
    | SteeringSet
    | VectorProgress
    | VectorMade
    | LogLine
    | SlotDone
    | Embedded
    | Crashed
)
