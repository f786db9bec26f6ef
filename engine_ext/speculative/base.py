"""The drafter interface (upstream's common_speculative_impl) and per-drafter statistics."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass, field

# A position of the target's history that a drafter reading its outputs did not read (it found the prefix cached):
# never equal to a token, so a history compared with it ends there.
UNREAD = -(1 << 40)


def common_prefix_length(a: Sequence[int], b: Sequence[int]) -> int:
    """How many leading tokens `a` and `b` share.

    A memory is kept in step with a growing token history at every step, so the usual answer is the whole shorter
    list: one slice comparison (C speed, ~1 µs per thousand tokens) answers it, and a mismatch is located by halving
    with slice comparisons, not by a Python loop over thousands of tokens.
    """
    if type(a) is not type(b):  # a list slice never equals a tuple slice
        a, b = list(a), list(b)
    if len(a) > len(b):
        a, b = b, a
    n = len(a)
    if a == (b if len(b) == n else b[:n]):  # one copy at most
        return n
    lo, hi = 0, n  # a[:lo] == b[:lo], a[:hi] != b[:hi]
    while hi - lo > 32:
        mid = (lo + hi) // 2
        if a[lo:mid] == b[lo:mid]:
            lo = mid
        else:
            hi = mid
    while a[lo] == b[lo]:
        lo += 1
    return lo


@dataclass
class DrafterStats:
    """Counters as upstream prints them (common/speculative.cpp: statistics <type>)."""

    n_call_begin: int = 0
    n_call_draft: int = 0
    n_call_accept: int = 0
    n_gen_drafts: int = 0  # drafts proposed (non-empty)
    n_acc_drafts: int = 0  # drafts of which at least one token was accepted
    n_gen_tokens: int = 0  # tokens proposed
    n_acc_tokens: int = 0  # tokens accepted by the target
    n_acc_per_pos: list[int] = field(default_factory=list)  # accepted count per draft position
    n_gen_per_pos: list[int] = field(default_factory=list)  # proposed count per draft position
    t_begin_ms: float = 0.0
    t_draft_ms: float = 0.0
    t_accept_ms: float = 0.0

    def record_draft(self, n_tokens: int) -> None:
        if n_tokens > 0:
            self.n_gen_drafts += 1
            self.n_gen_tokens += n_tokens
            count_positions(self.n_gen_per_pos, n_tokens)

    def record_accept(self, n_accepted: int) -> None:
        if n_accepted > 0:
            self.n_acc_drafts += 1
            self.n_acc_tokens += n_accepted
            count_positions(self.n_acc_per_pos, n_accepted)

    @property
    def acceptance_rate(self) -> float:
        return self.n_acc_tokens / self.n_gen_tokens if self.n_gen_tokens else 0.0

    @property
    def mean_accepted_length(self) -> float:
        """1 + accepted tokens per verify step (upstream's `#mean acc len`)."""
        return 1.0 + self.n_acc_tokens / self.n_call_accept if self.n_call_accept else 1.0

    def acceptance_per_position(self) -> list[float]:
        """Accepted tokens at each draft position per verify step (upstream's `#acc rate/pos`; non-increasing)."""
        return [a / self.n_call_accept for a in self.n_acc_per_pos] if self.n_call_accept else []

    def acceptance_where_drafted(self) -> list[float]:
        """At each draft position, the share of the drafts reaching it that were accepted there."""
        accepted = self.n_acc_per_pos
        return [(accepted[i] if i < len(accepted) else 0) / n for i, n in enumerate(self.n_gen_per_pos)]


def count_positions(counts: list[int], n: int) -> None:
    """Add one to counts[0..n-1], growing the list as needed (per-position statistics)."""
    if len(counts) < n:
        counts.extend([0] * (n - len(counts)))
    counts[:n] = [c + 1 for c in counts[:n]]


class Drafter(ABC):
    """One speculative implementation (ngram-*, draft-simple, draft-mtp, …).

    The driver calls, per generation: `begin(prompt)` once the prompt is in the target's memory; then per
    step `draft(tokens, id_last, n_max)` where `tokens` are all tokens in the target's memory and `id_last`
    the last token sampled by the target (not yet decoded); after verification `accept(n_accepted)`.
    Model-based drafters also see every target batch through `process`.
    """

    name: str = "drafter"
    # Whether --spec-draft-n-max caps this drafter's drafts. Upstream applies it to model drafters only; the
    # n-gram types have their own lengths (size_m, ngram-mod's n_max, ngram-cache's 8).
    follows_draft_n_max: bool = True
    # The first draft length (None: its longest), grown with measured acceptance (SpeculativeDriver), so a wrong
    # guess costs a few tokens' verification, not a long draft's.
    start_length: int | None = 4

    def __init__(self) -> None:
        self.stats = DrafterStats()

    def begin(self, prompt: Sequence[int]) -> None:
        """A new generation starts with `prompt` in the target's memory."""
        return None

    def process(self, tokens: Sequence[int], pos0: int) -> None:
        """The target just decoded `tokens` at positions pos0.. (model-based drafters read its outputs)."""
        return None

    @abstractmethod
    def draft(self, tokens: Sequence[int], id_last: int, n_max: int) -> list[int]:
        """Up to n_max tokens predicted to follow tokens + [id_last] (empty: no draft)."""

    def accept(self, n_accepted: int) -> None:
        """The target accepted the first n_accepted tokens of the last draft."""
        return None

    def close(self) -> None:
        """Free native resources (model-based drafters)."""
        return None
