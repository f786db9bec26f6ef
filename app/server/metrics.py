"""Server counters, rendered as Prometheus text (`GET /metrics`), named as llama-server names them where it has the
same figure (`llamacpp:…`), so its dashboards read llmtui too; llmtui's speculative counters beside them."""

from __future__ import annotations

import re
import threading
from dataclasses import dataclass

from engine_ext.protocol import Finished

MAX_AGENT_CHARS = 24
_AGENT_CHARS = re.compile(r"[^A-Za-z0-9._/-]")


def short_agent(user_agent: str | None) -> str:
    """A client's User-Agent as the stats bar names it: its first product without the version ("claude-cli/2.1.197
    (external, cli)" → "claude-cli", "OpenAI/Python 1.109.1" → "OpenAI/Python"), plain characters only, at most
    MAX_AGENT_CHARS; '' for none."""
    first = (user_agent or "")[:200].split(maxsplit=1)
    if not first:
        return ""
    name, _, version = first[0].partition("/")
    if version and not version[:1].isdigit():
        name = f"{name}/{version}"
    return _AGENT_CHARS.sub("", name)[:MAX_AGENT_CHARS]


@dataclass
class _Totals:
    requests: int = 0
    refused: int = 0  # 4xx and 503 answers
    failed: int = 0  # the engine failed or crashed
    prompt_tokens: int = 0
    prompt_tokens_cached: int = 0
    prompt_ms: float = 0.0
    predicted_tokens: int = 0
    predicted_ms: float = 0.0
    draft_n: int = 0
    draft_accepted: int = 0
    draft_steps: int = 0
    decodes: int = 0  # the engine's llama_decode calls while this server ran
    decodes_seen: int = 0  # the engine's own count at the last reply (it starts again at 0 when the engine restarts)
    slot_decodes: int = 0  # the llama_decode calls each reply took part in, added up (busy slots per decode)
    tokens_max: int = 0  # the longest sequence: a prompt and its reply
    processing: int = 0
    deferred: int = 0
    last_predicted_per_second: float = 0.0


class Metrics:
    """Thread-safe counters: the backend's thread adds, the HTTP handlers read."""

    def __init__(self, slots: int = 1) -> None:
        self._lock = threading.Lock()
        self._t = _Totals()
        self.slots = slots  # requests the engine decodes together (serve --parallel)
        self._loading: dict[str, float] = {}  # a router's models loading now: id → fraction loaded
        self._agent = ""  # the last client that asked for a reply (short_agent)

    def request(self) -> None:
        with self._lock:
            self._t.requests += 1

    def client(self, user_agent: str | None) -> None:
        """A request for a reply came from this User-Agent."""
        agent = short_agent(user_agent)
        with self._lock:
            self._agent = agent

    @property
    def last_client(self) -> str:
        """The last client that asked for a reply, shortened ('' before any, or when it sent no User-Agent)."""
        with self._lock:
            return self._agent

    def refused(self) -> None:
        with self._lock:
            self._t.refused += 1

    def failed(self) -> None:
        with self._lock:
            self._t.failed += 1

    def queue(self, processing: int, deferred: int) -> None:
        with self._lock:
            self._t.processing, self._t.deferred = processing, deferred

    def loading(self, model: str, fraction: float | None) -> None:
        """A router's model `model` is `fraction` loaded (None: no longer loading); /health and /metrics say it."""
        with self._lock:
            if fraction is None:
                self._loading.pop(model, None)
            else:
                self._loading[model] = fraction

    def finished(self, done: Finished) -> None:
        s = done.stats
        with self._lock:
            t = self._t
            t.prompt_tokens += s.prompt_tokens_evaluated
            t.prompt_tokens_cached += s.prompt_tokens_cached
            t.prompt_ms += s.prompt_ms
            restarted = s.n_decode_total < t.decodes_seen
            t.decodes += s.n_decode_total - (0 if restarted else t.decodes_seen)
            t.decodes_seen = s.n_decode_total
            t.slot_decodes += s.n_decode
            t.tokens_max = max(t.tokens_max, s.prompt_tokens + s.generated_tokens)
            t.predicted_tokens += s.generated_tokens
            t.predicted_ms += s.decode_ms
            t.last_predicted_per_second = s.decode_tps
            if done.speculative is not None:
                t.draft_n += done.speculative.drafted
                t.draft_accepted += done.speculative.accepted
                t.draft_steps += done.speculative.steps

    def queue_now(self) -> tuple[int, int]:
        """Requests generating and waiting now."""
        with self._lock:
            return self._t.processing, self._t.deferred

    @property
    def in_flight(self) -> int:
        with self._lock:
            return self._t.processing + self._t.deferred

    def health(self) -> dict[str, object]:
        """`GET /health` as llama-server answers it; with parallel slots, their counts as llama-server gave them
        (`slots_idle`, `slots_processing`). One slot answers as it always did; a router's models that are loading
        are listed with their progress (`models_loading`)."""
        with self._lock:
            processing = self._t.processing
            loading = {model: round(fraction, 3) for model, fraction in self._loading.items()}
        answer: dict[str, object] = {"status": "ok"}
        if self.slots > 1:
            answer.update(slots_idle=max(0, self.slots - processing), slots_processing=processing)
        if loading:
            answer["models_loading"] = loading
        return answer

    def render(self) -> str:
        with self._lock:
            t = _Totals(**vars(self._t))
            loading = sorted(self._loading.items())
        rows = [
            ("llamacpp:prompt_tokens_total", "counter", "Prompt tokens evaluated.", t.prompt_tokens),
            (
                "llamacpp:prompt_tokens_cached_total",
                "counter",
                "Prompt tokens reused from the cache.",
                t.prompt_tokens_cached,
            ),
            ("llamacpp:prompt_seconds_total", "counter", "Prompt evaluation time.", t.prompt_ms / 1000),
            ("llamacpp:tokens_predicted_total", "counter", "Tokens generated.", t.predicted_tokens),
            ("llamacpp:tokens_predicted_seconds_total", "counter", "Generation time.", t.predicted_ms / 1000),
            ("llamacpp:n_decode_total", "counter", "llama_decode() calls of the engine's context.", t.decodes),
            ("llamacpp:n_tokens_max", "counter", "The longest sequence seen (prompt and reply).", t.tokens_max),
            ("llamacpp:spec_decode_num_draft_tokens_total", "counter", "Draft tokens verified.", t.draft_n),
            ("llamacpp:spec_decode_num_accepted_tokens_total", "counter", "Draft tokens accepted.", t.draft_accepted),
            ("llamacpp:spec_decode_num_drafts_total", "counter", "Verification steps with a draft.", t.draft_steps),
            (
                "llamacpp:prompt_tokens_seconds",
                "gauge",
                "Average prompt throughput in tokens/s.",
                t.prompt_tokens * 1000 / t.prompt_ms if t.prompt_ms else 0.0,
            ),
            (
                "llamacpp:predicted_tokens_seconds",
                "gauge",
                "Average generation throughput in tokens/s.",
                t.predicted_tokens * 1000 / t.predicted_ms if t.predicted_ms else 0.0,
            ),
            ("llamacpp:requests_processing", "gauge", "Requests being generated.", t.processing),
            ("llamacpp:requests_deferred", "gauge", "Requests waiting for the engine.", t.deferred),
            (
                "llamacpp:n_busy_slots_per_decode",
                "gauge",
                "Average number of requests in each llama_decode() call.",
                t.slot_decodes / max(t.decodes, 1),
            ),
            ("llmtui_slots", "gauge", "Requests the engine decodes together (--parallel).", self.slots),
            ("llmtui_requests_total", "counter", "Requests answered or refused.", t.requests),
            ("llmtui_requests_refused_total", "counter", "Requests refused (4xx, 503).", t.refused),
            ("llmtui_requests_failed_total", "counter", "Requests the engine failed.", t.failed),
            ("llmtui_draft_tokens_total", "counter", "Draft tokens verified.", t.draft_n),
            ("llmtui_draft_tokens_accepted_total", "counter", "Draft tokens accepted.", t.draft_accepted),
            (
                "llmtui_draft_acceptance_ratio",
                "gauge",
                "Accepted of verified draft tokens.",
                t.draft_accepted / t.draft_n if t.draft_n else 0.0,
            ),
            (
                "llmtui_last_predicted_tokens_seconds",
                "gauge",
                "The last reply's decode speed.",
                t.last_predicted_per_second,
            ),
        ]
        out: list[str] = []
        for name, kind, help_text, value in rows:
            out += [f"# HELP {name} {help_text}", f"# TYPE {name} {kind}", f"{name} {float(value):.6g}"]
        if loading:  # a router's loads (serve without -m), as /health's models_loading
            name = "llmtui_model_load_progress"
            out += [f"# HELP {name} A model being loaded: the fraction loaded.", f"# TYPE {name} gauge"]
            out += [f'{name}{{model="{_label(model)}"}} {fraction:.6g}' for model, fraction in loading]
        return "\n".join(out) + "\n"


def _label(text: str) -> str:
    """A Prometheus label value: backslash, double quote and line feed escaped."""
    return text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
