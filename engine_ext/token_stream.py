"""Sampled tokens into TokenChunks: each token's bytes and end-of-generation flag, UTF-8 assembly, stop strings,
the reasoning split and coalescing (one ReplyStream per reply, in the single-sequence and the parallel loops)."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from itertools import accumulate

from engine_ext.model import Model
from engine_ext.protocol import Event, Generate, StopReason, TokenChunk
from engine_ext.reply_stream import ReasoningSplitter, StopStringMatcher, Utf8StreamDecoder

CHUNK_INTERVAL_S = 1 / 15  # coalesce streamed text: the pipe carries 15 messages/s at most (the UI draws 15/s)
# Accepted runs at least this long are streamed in one go; shorter ones token by token, through the code the
# step's first token just ran (right after llama_decode, fresh code costs cache misses more than the tokens do).
BULK_RUN = 8


@dataclass
class PromptPlan:
    tokens: list[int]
    text: str | None  # the prompt's text when it has one (not for pre-tokenized prompts)
    dropped_messages: int
    opens_reasoning: bool
    chat: bool
    # Evaluate the last prompt token on its own, as a regenerate of this prompt will (so greedy replies
    # repeat exactly); off for pre-tokenized benchmark prompts, measured as one batch like llama-bench.
    split_last: bool = True
    # The prompt ends inside the answer of a reply being continued: the reply goes on from there, leading space
    # and all (a new reply's leading whitespace is dropped).
    continues_answer: bool = False


class TokenInfo:
    """Each token's bytes and end-of-generation flag, asked of llama.cpp once per model (both are fixed).

    The flags are kept as sets, so a whole run of tokens is checked with set operations, not a call per token.
    """

    def __init__(self, model: Model) -> None:
        self.model = model
        self.pieces: dict[int, bytes] = {}
        self.known: set[int] = set()  # tokens whose flag was asked
        self.eog: set[int] = set()  # of those, the end-of-generation tokens

    def piece(self, token: int) -> bytes:
        piece = self.pieces.get(token)
        if piece is None:
            piece = self.pieces[token] = self.model.token_piece(token)
        return piece

    def pieces_of(self, tokens: Sequence[int]) -> list[bytes]:
        """The bytes of each token (one llama.cpp call per token not seen before)."""
        pieces = self.pieces
        for token in set(tokens).difference(pieces):
            pieces[token] = self.model.token_piece(token)
        return list(map(pieces.__getitem__, tokens))

    def is_eog(self, token: int) -> bool:
        if token not in self.known:
            self._ask(token)
        return token in self.eog

    def first_eog(self, tokens: Sequence[int], start: int = 0, stop: int | None = None) -> int:
        """Index of the first end-of-generation token in tokens[start:stop]; `stop` (len(tokens)) when none."""
        end = len(tokens) if stop is None else stop
        rest = tokens[start:end]
        if self.known.issuperset(rest) and self.eog.isdisjoint(rest):
            return end
        return next((i for i in range(start, end) if self.is_eog(tokens[i])), end)

    def _ask(self, token: int) -> None:
        if self.model.is_eog(token):
            self.eog.add(token)
        self.known.add(token)


class ReplyStream:
    """Turns sampled tokens into TokenChunks: UTF-8 assembly, stop strings, reasoning split, coalescing."""

    def __init__(
        self,
        model: Model,
        request: Generate,
        plan: PromptPlan,
        emit: Callable[[Event], None],
        token_info: TokenInfo | None = None,
    ) -> None:
        info = token_info if token_info is not None else TokenInfo(model)
        self.info = info
        self.emit = emit
        self.request_id = request.request_id
        self.ignore_eos = request.ignore_eos
        self.is_eog = info.is_eog
        self.piece = info.piece
        self.utf8 = Utf8StreamDecoder()
        self.stopper = StopStringMatcher(list(request.stop))
        self.has_stops = any(request.stop)
        self.splitter = (
            ReasoningSplitter(starts_in_reasoning=plan.opens_reasoning, starts_in_answer=plan.continues_answer)
            if plan.chat
            else None
        )
        self.text: list[str] = []
        self.reasoning: list[str] = []
        self.ids: list[int] = []
        self.sources: list[str] = []
        self.text_ends: list[int] = []  # per token: characters of answer text in this chunk once it was added
        self.text_len = 0
        self.last_flush = 0.0
        self.stopped = False

    def push(self, token: int, source: str, now: float) -> StopReason | None:
        """Add one sampled token; returns why generation stops at it, if it does."""
        if not self.ignore_eos and self.is_eog(token):
            return "eos"
        if self._add_token(token, source):
            return "stop_string"
        if now - self.last_flush >= CHUNK_INTERVAL_S:  # also true for the first token
            self.flush(now)
        return None

    def push_many(self, tokens: Sequence[int], sources: Sequence[str], now: float) -> tuple[int, StopReason | None]:
        """Add the tokens of one speculative step, sampled at `now`, exactly as push() one by one would.

        Returns how many tokens were taken (the one generation stops at included) and why generation stops, if it
        does. Only the first token can start a new chunk (the others share its `now`), so the others are added
        without the flush check; a long run with neither stop strings nor a reasoning split, all at once.
        """
        if not tokens:
            return 0, None
        reason = self.push(tokens[0], sources[0], now)
        n = len(tokens)
        if reason is not None or n == 1:
            return 1, reason
        if n < BULK_RUN or self.has_stops or self.splitter is not None:
            for i in range(1, n):
                if not self.ignore_eos and self.is_eog(tokens[i]):
                    return i + 1, "eos"
                if self._add_token(tokens[i], sources[i]):
                    return i + 1, "stop_string"
            return n, None
        end = n if self.ignore_eos else self.info.first_eog(tokens, 1)
        if end > 1:
            self._add_answer_run(tokens[1:end], sources[1:end])
        return (end + 1, "eos") if end < n else (n, None)

    def _add_answer_run(self, tokens: Sequence[int], sources: Sequence[str]) -> None:
        """Add tokens whose text is all answer text as it comes (no stop strings, no reasoning split)."""
        self.ids.extend(tokens)
        self.sources.extend(sources)
        pieces = self.info.pieces_of(tokens)
        data = b"".join(pieces)
        lengths: Iterable[int]
        if data.isascii():
            # ASCII completes each character at once, so a token's text is its piece; but an unfinished character
            # held from before becomes U+FFFD, which the decoder gives with the first non-empty piece.
            text = self.utf8.feed(data)
            lengths = list(map(len, pieces))
            if len(text) > len(data):
                first = next(i for i, size in enumerate(lengths) if size)
                lengths[first] += len(text) - len(data)
        else:
            texts = list(map(self.utf8.feed, pieces))
            text = "".join(texts)
            lengths = map(len, texts)
        ends = list(accumulate(lengths, initial=self.text_len))
        self.text_ends.extend(ends[1:])
        self.text_len = ends[-1]
        if text:
            self.text.append(text)

    def _add_token(self, token: int, source: str) -> bool:
        """Add one token and its text; returns whether it completes a stop string."""
        self.ids.append(token)
        self.sources.append(source)
        if self.has_stops:
            text, stopped = self.stopper.feed(self.utf8.feed(self.piece(token)))
        else:
            text, stopped = self.utf8.feed(self.piece(token)), False
        self._route(text)
        self.text_ends.append(self.text_len)
        if stopped:
            self.stopped = True
        return stopped

    def _route(self, text: str) -> None:
        if not text:
            return
        if self.splitter is None:
            self._add(text)
            return
        for kind, part in self.splitter.feed(text):
            self._add(part, reasoning=kind == "reasoning")

    def _add(self, part: str, *, reasoning: bool = False) -> None:
        if reasoning:
            self.reasoning.append(part)
        else:
            self.text.append(part)
            self.text_len += len(part)  # answer characters in this chunk so far (text_ends)

    def flush(self, now: float | None = None) -> None:
        if self.ids or self.text or self.reasoning:
            self.emit(
                TokenChunk(
                    self.request_id,
                    "".join(self.text),
                    "".join(self.reasoning),
                    tuple(self.ids),
                    tuple(self.sources),
                    tuple(self.text_ends),
                )
            )
            self.text_ends.clear()
            self.text_len = 0
            self.text.clear()
            self.reasoning.clear()
            self.ids.clear()
            self.sources.clear()
        self.last_flush = time.perf_counter() if now is None else now

    def finish(self) -> None:
        """Emit whatever is held back (a partial stop-string prefix, an open reasoning block)."""
        if not self.stopped:
            self._route(self.stopper.feed(self.utf8.flush())[0] + self.stopper.flush())
        if self.splitter is not None:
            for kind, part in self.splitter.flush():
                self._add(part, reasoning=kind == "reasoning")
        self.flush()
