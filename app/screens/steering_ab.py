"""The steering A/B view (b on the steering screen): one prompt, greedy, without and with steering side by side."""

from __future__ import annotations

from textual.app import ComposeResult
from textual.containers import Horizontal, Vertical, VerticalScroll
from textual.widgets import Input, Label, Static

from app.config import SamplingSettings
from app.messages import TokensArrived
from app.screens.ab_run import ABRunScreen

AB_SAMPLING = SamplingSettings(temperature=0.0, max_tokens=128)
DEFAULT_PROMPT = "How was your day?"


class SteeringABScreen(ABRunScreen):
    """Enter runs the prompt twice (greedy): A without steering, then B with the current mix; Esc closes.

    | Key | Action |
    | :- | :- |
    | enter | Run A then B. |
    | escape | Close (stops a run in progress). |
    """

    SAMPLING = AB_SAMPLING

    def __init__(self, prompt: str = DEFAULT_PROMPT, mix: str = "") -> None:
        super().__init__(prompt)
        self.mix = mix
        self.texts = {"a": "", "b": ""}

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

    def reset(self) -> None:
        self.texts = {"a": "", "b": ""}
        for side in "ab":
            self.query_one(f"#ab-{side}", Static).update("")

    def configure(self, side: str) -> None:
        # A runs on the base model; B with the user's mix.
        self.app.bridge.set_steering(() if side == "a" else self.app.steering_entries())

    def restore(self) -> None:
        self.app.bridge.set_steering(self.app.steering_entries())

    def add(self, side: str, event: TokensArrived) -> None:
        self.texts[side] += event.text
        self.query_one(f"#ab-{side}", Static).update(self.texts[side])

    def completed(self) -> None:
        # B ran with the user's own mix: nothing to restore.
        same = self.texts["a"] == self.texts["b"]
        note = "the same text: try a higher strength · " if same else ""
        self.hint(f"{note}Enter run again · Esc close")
