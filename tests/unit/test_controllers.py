"""The controllers without a screen or an App: a fake host records what they ask of the app and the engine."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from app.core.config import Config, SpeculativeSettings
from app.core.generation import GenerationRouter
from app.tui.controllers import ModelsController, SpeculationController, SteeringController
from engine_ext.protocol import SpeculativeStats


class FakeBridge:
    def __init__(self) -> None:
        self.calls: list[tuple[str, Any]] = []

    def set_speculative(self, params: Any) -> None:
        self.calls.append(("set_speculative", params))

    def set_steering(self, entries: Any) -> None:
        self.calls.append(("set_steering", entries))


@dataclass
class FakeHost:
    config: Config = field(default_factory=Config)
    bridge: Any = field(default_factory=FakeBridge)
    model: Any = None
    model_path: str | None = None
    engine_overrides: dict[str, Any] = field(default_factory=dict)
    start_engine: bool = False
    notices: list[str] = field(default_factory=list)
    saved: int = 0
    redrawn: int = 0
    loaded: list[Path] = field(default_factory=list)
    position: tuple[int, int] | None = None
    """The chat's reply being written: its message id and tokens so far (None: none)."""

    def notify(self, message: str, **_: Any) -> None:
        self.notices.append(message)

    def save_config_quietly(self) -> None:
        self.saved += 1

    def features_changed(self) -> None:
        self.redrawn += 1

    def reply_in_progress(self) -> bool:
        return False

    def reply_position(self) -> tuple[int, int] | None:
        return self.position

    def load_model(self, path: Path) -> None:
        self.loaded.append(path)


def _stats(**changes: Any) -> SpeculativeStats:
    stats = SpeculativeStats(1, 20, 40, 10, 0.25, 1.5, (), (), 1.0, 1.0, 5.0, 10.0, ())
    return replace(stats, **changes)


class Owner:
    def __init__(self) -> None:
        self.seen: list[str] = []

    async def generation_tokens(self, event: Any) -> None:
        self.seen.append("tokens")

    async def generation_finished(self, event: Any) -> None:
        self.seen.append("finished")

    async def generation_failed(self, event: Any) -> None:
        self.seen.append("failed")

    def generation_progress(self, event: Any) -> None:
        self.seen.append("progress")

    def generation_stats(self, stats: SpeculativeStats) -> None:
        self.seen.append("stats")

    def generation_lost(self) -> None:
        self.seen.append("lost")


def test_generation_events_go_to_the_owner_of_the_request() -> None:
    router, chat, side = GenerationRouter(), Owner(), Owner()
    assert router.owner(7) is None
    router.default = chat
    router.register(7, side)
    assert router.owner(7) is side and router.side_owner(7) is side
    assert router.owner(8) is chat and router.owner(None) is chat and router.side_owner(8) is None
    router.register(8, chat)
    assert router.side_owner(8) is None  # the default's own request is not a side run
    router.lost()
    assert side.seen == ["lost"] and chat.seen == []  # the app ends the chat's reply itself
    assert router.owner(7) is chat
    router.register(9, side)
    router.release(9)
    router.release(None)
    assert router.owner(9) is chat


def test_speculation_apply_toggle_refuse_and_the_slow_warning() -> None:
    host = FakeHost(model_path="/m/model.gguf", model=object())
    speculation = SpeculationController(host)  # type: ignore[arg-type]
    speculation.toggle()
    assert host.config.speculative.enabled and host.saved == 1 and host.redrawn == 1
    assert [c[0] for c in host.bridge.calls] == ["set_speculative"]
    assert host.notices[-1].startswith("Speculative decoding on (")
    host.config = replace(host.config, speculative=SpeculativeSettings(enabled=True, spec_type="ngram-mod"))
    speculation.stats_updated(_stats(), final=True)
    speculation.stats_updated(_stats(), final=True)
    assert sum("slower than plain decoding" in n for n in host.notices) == 1  # once per model and type
    speculation.refused()
    assert not host.config.speculative.enabled and speculation.drafters == ()


def test_steering_strengths_and_a_made_vector() -> None:
    host = FakeHost()
    models = ModelsController(host, SpeculationController(host))  # type: ignore[arg-type]
    steering = SteeringController(host, models)  # type: ignore[arg-type]
    steering.set_strength("/v/a.gguf", 0.5)
    steering.set_strength("/v/a.gguf", -0.25)
    steering.set_range(2, 5)
    settings = host.config.steering
    assert settings.vectors == ("/v/a.gguf",) and settings.strengths == (-0.25,)
    assert (settings.layer_start, settings.layer_end) == (2, 5)
    assert host.bridge.calls == [] and host.saved == 0  # no model: nothing sent; remembered only when asked
    assert steering.entries() == () and steering.readout() == ""  # the file does not exist: it cannot steer
    steering.remember()
    steering.vector_created("/v/b.gguf", 3, 10, 1.5)
    assert host.config.steering.vectors == ("/v/a.gguf", "/v/b.gguf") and host.saved == 2
    assert host.notices[-1].startswith("Made b.gguf: 3 layers from 10 pairs")


class ConversationsHost(FakeHost):
    """A FakeHost with a history and workers that run at once, on the caller's thread."""

    def __init__(self, store: Any) -> None:
        super().__init__()
        self.store = store
        self.shown: list[int] = []

    def run_worker(self, work: Any, *args: Any, **kwargs: Any) -> None:
        work()

    def call_from_thread(self, callback: Any, *args: Any, **kwargs: Any) -> Any:
        return callback(*args, **kwargs)

    def show_conversation(self, conversation_id: int) -> None:
        self.shown.append(conversation_id)


def test_export_names_say_the_conversation_number() -> None:
    from app.tui.controllers.conversations import export_stem

    assert export_stem("Happy -4 steering", 4) == "Happy--4-steering-conversation-4"
    assert export_stem("", 12) == "conversation-12" and export_stem("conversation", 3) == "conversation-3"
    assert export_stem("../../etc/passwd", 5) == "..-..-etc-passwd-conversation-5"


def test_conversations_export_then_import_round_trips(tmp_path: Path) -> None:
    from app.core.store import Store
    from app.tui.controllers import ConversationsController

    with Store(tmp_path / "history.db") as store:
        conversation = store.conversations.create_conversation("A/B: tea?")
        store.tree.add_user_message(conversation.id, "hello")
        host = ConversationsHost(store)
        controller = ConversationsController(host)
        results: list[Any] = []
        controller.export_in_background(conversation.id, results.append)
        (markdown, json_path) = results[0]
        # the number says what it is (issue 37: a bare "-4" read like a steering strength)
        assert markdown.name == f"A-B-tea-conversation-{conversation.id}.md"
        assert json_path.name == f"A-B-tea-conversation-{conversation.id}.json" and "hello" in markdown.read_text(
            encoding="utf-8"
        )
        controller.import_file(json_path)
        assert host.shown and host.shown[0] != conversation.id
        assert [m.content for m in store.tree.active_path(host.shown[0])] == ["hello"]
        assert host.notices == [f"Imported {json_path.name}."]
        controller.import_file(tmp_path / "missing.json")
        assert host.notices[-1].startswith(f"Could not import {tmp_path / 'missing.json'}")
        assert len(host.shown) == 1
        # an export naming a local file: imported without it, and said in the same one-line notice
        store.conversations.update_settings(conversation.id, settings={"sampling": {"output_file": "/etc/hostname"}})
        controller.export_in_background(conversation.id, results.append)
        controller.import_file(results[-1][1])
        assert len(host.shown) == 2 and "sampling.output_file were left out" in host.notices[-1]
        assert "output_file" not in store.conversations.get_conversation(host.shown[1]).settings["sampling"]


def test_a_replys_strength_changes_are_kept_with_it_and_the_export_says_them(tmp_path: Path) -> None:
    """Issue 49 item 17: the export kept one strength per reply though the slider moved while it was written."""
    from types import SimpleNamespace

    import numpy as np

    from app.core.store.export import features_note
    from app.core.vectors import vector_info
    from engine_ext.protocol import SteeringSet
    from engine_ext.steering.cvec_file import ControlVector, write_control_vector

    directions = {1: np.ones(64, dtype=np.float32) / 8}
    path = str(write_control_vector(ControlVector(directions, "llama", {}), tmp_path / "mood.gguf"))
    assert not isinstance(vector_info(path), str)  # read, as a worker reads it before the mix is sent
    host = FakeHost(model=SimpleNamespace(n_embd=64, architecture="llama"))
    steering = SteeringController(host, ModelsController(host, SpeculationController(host)))  # type: ignore[arg-type]
    steering.set_strength(path, 0.5)  # before the reply: its mix at the start
    steering.engine_applied(SteeringSet(True, 1, 1, (0.06,), (1,)))

    def mix(strength: float) -> list[dict[str, object]]:
        return [{"name": "mood", "file": "mood.gguf", "strength": strength}]

    host.position = (7, 12)
    steering.set_strength(path, 1.0)
    steering.set_strength(path, 1.5)  # moved again before the next token: that token has the last
    host.position = (7, 30)
    steering.set_strength(path, 0.0)  # off from token 30
    host.position = (7, 41)  # the reply ends
    recorded = steering.in_use()
    assert recorded == {
        "steering": {
            "vectors": [],
            "layers": [1, 1],
            "changes": [{"at": 0, "vectors": mix(0.5)}, {"at": 12, "vectors": mix(1.5)}, {"at": 30, "vectors": []}],
        }
    }
    said = "Steering: mood +0.50; from token 12: mood +1.50; from token 30: none on layers 1–1."
    assert features_note(recorded) == said
    # The next reply starts afresh: one strength all along, as before.
    host.position = (9, 0)
    steering.set_strength(path, 2.0)
    host.position = (9, 20)
    assert steering.in_use() == {"steering": {"vectors": mix(2.0), "layers": [1, 1]}}
