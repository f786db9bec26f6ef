"""What the A/B views share: one prompt run twice, greedy, A then B with one thing changed, side by side."""

from __future__ import annotations

from abc import abstractmethod
from typing import TYPE_CHECKING, ClassVar

from textual.binding import Binding
from textual.screen import ModalScreen
from textual.timer import Timer
from textual.widgets import Label

from app.core.config import SamplingSettings
from app.tui.widgets.prompt_input import PromptInput
from engine_ext.protocol import Failed, Finished, PromptProgress, SpeculativeStats, TokenChunk

if TYPE_CHECKING:
    from app.core.engine import ReplyHeld, ReplyStats
    from app.tui.shell import LlmtuiShell

# Engine states a run waits out, and what it says it waits for.
WAIT_STATES = {
    "starting": "the engine to start",
    "loading": "the model to load",
    "generating": "the chat's reply to end",
}


class ABRunScreen(ModalScreen[None]):
    """Enter runs the prompt as A, then as B; Esc closes (cancelling a run and restoring the engine).

    A subclass says what each side changes in the engine (`configure`), how to put the user's own setting back
    (`restore`), what to do with the text (`add`) and with a side's end (`side_finished`, `completed`). The app
    routes the generations this screen asked for to it (it sends them through the generation controller,
    `app.generation`, which registers their request ids with its router).
    """

    DEFAULT_CSS = """
    ABRunScreen .ab-prompt {
        height: auto;
        max-height: 3;
    }
    """

    BINDINGS = [Binding("escape", "close", "Close", tooltip="Close the A/B view: stops a run in progress")]
    SAMPLING: ClassVar[SamplingSettings]
    ROUNDS: ClassVar[int] = 1
    """How often each side runs, in turns (A, B, A, B, …): more rounds measure the speeds' run-to-run noise. The
    text shown is the first round's (greedy: every round writes the same)."""

    app: LlmtuiShell

    def __init__(self, prompt: str) -> None:
        super().__init__(classes="dialog-screen")
        self.initial_prompt = prompt
        self.prompt = prompt
        self.running: str | None = None
        """'a' or 'b' while that side is being written."""
        self.request_id: int | None = None
        self.runs_done = 0
        """Completed A/B runs (tests wait on it)."""
        self.round = 0
        """The round being run (0 .. ROUNDS - 1)."""
        self.waiting = ""
        """A prompt to run once the engine is free (it was loading, or writing a chat reply)."""
        self._wait_timer: Timer | None = None
        self.side_stats: dict[str, SpeculativeStats] = {}
        """The latest speculative statistics of each side that speculated (final once the side has ended)."""

    def prompt_input(self, id: str, placeholder: str) -> PromptInput:  # noqa: A002
        """The view's prompt, loaded with the one it opened on: it wraps between words on up to three lines (then
        scrolls) and shows from its start (a one-line Input showed a long prompt from its end, starting mid-word);
        Enter runs it, Shift+Enter adds a line."""
        prompt = PromptInput(id=id, placeholder=placeholder)
        prompt.add_class("ab-prompt")
        prompt.load_text(self.initial_prompt)
        return prompt

    def on_mount(self) -> None:
        self.query_one(".ab-prompt").focus()

    def on_prompt_input_submitted(self, event: PromptInput.Submitted) -> None:
        event.stop()
        self.run(event.text.strip())

    def run(self, prompt: str) -> None:
        """Run A then B on `prompt`; while the engine loads or writes a chat reply, once it is done."""
        if not prompt or self.running is not None:
            return
        state = self.app.engine_state
        if state in WAIT_STATES:
            self.waiting = prompt
            then = " (then Esc stops the reply)" if state == "generating" else ""
            self.hint(f"waiting for {WAIT_STATES[state]}… · Esc close{then}")
            if self._wait_timer is None:
                self._wait_timer = self.set_interval(0.2, self._run_waiting)
            return
        if self.app.model is None or state != "ready":
            self.notify(f"The engine is {state}: no model to run the prompt on.", severity="warning")
            return
        if not self.can_run():
            return
        self.prompt = prompt
        self.side_stats = {}
        self.round = 0
        self.reset()
        self.start("a")

    def _run_waiting(self) -> None:
        if self.app.engine_state in WAIT_STATES:
            return
        if self._wait_timer is not None:
            self._wait_timer.stop()
            self._wait_timer = None
        prompt, self.waiting = self.waiting, ""
        self.run(prompt)

    def hint(self, text: str) -> None:
        self.query_one(".dialog-hint", Label).update(text)

    def start(self, side: str) -> None:
        self.running = side
        # Requests reach the engine in order: the change applies to the generation queued after it.
        self.configure(side)
        self.request_id = self.app.generation.run([("user", self.prompt)], self.SAMPLING, self)
        rounds = f" (round {self.round + 1} of {self.ROUNDS}, to measure the noise)" if self.ROUNDS > 1 else ""
        self.hint(f"writing {side.upper()}…{rounds} · Esc close")

    def owns(self, request_id: int | None) -> bool:
        return request_id is not None and request_id == self.request_id

    def tokens(self, event: TokenChunk) -> None:
        if self.running is not None and self.round == 0:
            self.add(self.running, event)

    # ----- generation events (the app routes this screen's requests here) -----

    async def generation_tokens(self, event: TokenChunk) -> None:
        self.tokens(event)

    async def generation_finished(self, event: Finished) -> None:
        self.finished(event)

    async def generation_failed(self, event: Failed) -> None:
        self.finished(event)

    def generation_progress(self, event: PromptProgress | ReplyStats | ReplyHeld) -> None:
        """The views show the text as it comes, not the speed."""

    def generation_stats(self, stats: SpeculativeStats) -> None:
        self.speculative_stats(stats)

    def generation_lost(self) -> None:
        self.engine_crashed()

    async def generation_crashed(self, description: str) -> None:
        self.engine_crashed()  # (the chat's replies are told this way; a view's runs through generation_lost)

    def speculative_stats(self, stats: SpeculativeStats) -> None:
        if self.running is not None and stats.request_id == self.request_id:
            self.side_stats[self.running] = stats

    def finished(self, event: Finished | Failed) -> None:
        side = self.running
        if side is None:
            return
        self.app.generation.router.release(self.request_id)
        self.request_id = None
        if isinstance(event, Failed):
            self.running = None
            self.restore()
            self.hint(f"failed: {event.message} · Enter run · Esc close")
            return
        self.side_finished(side, event)
        if side == "a":
            self.start("b")
            return
        if self.round + 1 < self.ROUNDS:
            self.round += 1
            self.start("a")
            return
        self.running = None
        self.runs_done += 1
        self.completed()

    def engine_crashed(self) -> None:
        """The engine died mid-run: a restarted engine knows nothing of this run (nor of the user's settings, which
        the app sends it again once the model is loaded)."""
        if self.running is not None:
            self.running, self.request_id = None, None
            self.hint("the engine crashed · once it is restarted, Enter runs again · Esc close")

    def action_close(self) -> None:
        if self._wait_timer is not None:
            self._wait_timer.stop()
        if self.request_id is not None:
            self.app.generation.cancel(self.request_id)
            self.request_id = None
            self.restore()
        self.running = None
        self.dismiss(None)

    # ----- what a subclass says -----

    def can_run(self) -> bool:
        """Whether the engine is set up for this run (else say why)."""
        return True

    def reset(self) -> None:
        """Clear both sides before a run."""

    @abstractmethod
    def configure(self, side: str) -> None:
        """Set the engine up for `side` ('a' or 'b')."""

    @abstractmethod
    def restore(self) -> None:
        """Give the engine back the user's own setting."""

    @abstractmethod
    def add(self, side: str, event: TokenChunk) -> None:
        """Show a chunk of `side`'s reply."""

    def side_finished(self, side: str, event: Finished) -> None:
        """A side ended normally (before B starts, or before `completed`)."""

    def completed(self) -> None:
        """B ended: both sides are there."""
