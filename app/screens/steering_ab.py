"""The steering A/B view (b on the steering screen): one prompt, greedy, without and with steering side by side."""

from __future__ import annotations

from typing import TYPE_CHECKING

from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical, VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Input, Label, Static

from app.config import SamplingSettings
from app.messages import GenerationFailed, GenerationFinished, TokensArrived

if TYPE_CHECKING:
    from app.tui import LlmtuiApp

AB_SAMPLING = SamplingSettings(temperature=0.0, max_tokens=128)
DEFAULT_PROMPT = "How was your day?"


class SteeringABScreen(ModalScreen[None]):
    """Enter runs the prompt twice (greedy): A without steering, then B with the current mix; Esc closes.

    | Key | Action |
    | :- | :- |
    | enter | Run A then B. |
    | escape | Close (stops a run in progress). |
    """

    BINDINGS = [Binding("escape", "close", "Close")]

    app: LlmtuiApp

    def __init__(self, prompt: str = DEFAULT_PROMPT, mix: str = "") -> None:
        super().__init__(classes="dialog-screen")
        self.initial_prompt = prompt
        self.mix = mix
        self.texts = {"a": "", "b": ""}
        self.running: str | None = None
        """'a' or 'b' while that side is being written."""
        self.request_id: int | None = None
        self.runs_done = 0
        """Completed A/B runs (tests wait on it)."""

    def compose(self) -> ComposeResult:
        with Vertical(classes="dialog wide", id="steering-ab"):
            yield Label("A/B: the same prompt, greedy, without and with steering", classes="dialog-title")
            yield Input(self.initial_prompt, placeholder="a prompt to compare", id="ab-prompt", compact=True)
            with Horizontal(id="ab-sides"):
                with Vertical(classes="ab-side"):
                    yield Label("A · without steering", classes="ab-title")
                    with VerticalScroll():
                        yield Static("", id="ab-a")
                with Vertical(classes="ab-side"):
                    yield Label(f"B · with {self.mix or 'steering'}", classes="ab-title", id="ab-b-title")
                    with VerticalScroll():
                        yield Static("", id="ab-b")
            yield Label("Enter run · Esc close", classes="dialog-hint", id="ab-hint")

    def on_mount(self) -> None:
        self.query_one(Input).focus()

    def on_input_submitted(self, event: Input.Submitted) -> None:
        event.stop()
        self.run(event.value.strip())

    def run(self, prompt: str) -> None:
        if not prompt or self.running is not None:
            return
        if self.app.model is None or self.app.engine_state not in ("ready",):
            self.notify("The model is not ready (or a reply is being written).", severity="warning")
            return
        self.prompt = prompt
        self.texts = {"a": "", "b": ""}
        for side in "ab":
            self.query_one(f"#ab-{side}", Static).update("")
        self._start("a")

    def _start(self, side: str) -> None:
        self.running = side
        # A runs on the base model; B with the user's mix. Steering changes are applied in order by the engine.
        self.app.bridge.set_steering(() if side == "a" else self.app.steering_entries())
        self.request_id = self.app.bridge.generate([("user", self.prompt)], AB_SAMPLING)
        self.query_one("#ab-hint", Label).update(f"writing {side.upper()}… · Esc close")

    def owns(self, request_id: int | None) -> bool:
        return request_id is not None and request_id == self.request_id

    def tokens(self, event: TokensArrived) -> None:
        if self.running is None:
            return
        self.texts[self.running] += event.text
        self.query_one(f"#ab-{self.running}", Static).update(self.texts[self.running])

    def finished(self, event: GenerationFinished | GenerationFailed) -> None:
        side = self.running
        self.request_id = None
        if isinstance(event, GenerationFailed):
            self.running = None
            self.app.bridge.set_steering(self.app.steering_entries())
            self.query_one("#ab-hint", Label).update(f"failed: {event.error} · Enter run · Esc close")
            return
        if side == "a":
            self._start("b")
            return
        self.running = None
        self.runs_done += 1
        same = self.texts["a"] == self.texts["b"]
        note = "the same text: try a higher strength · " if same else ""
        self.query_one("#ab-hint", Label).update(f"{note}Enter run again · Esc close")

    def action_close(self) -> None:
        if self.request_id is not None:
            self.app.bridge.cancel(self.request_id)
            self.request_id = None
            self.app.bridge.set_steering(self.app.steering_entries())
        self.dismiss(None)
