"""The model in use: which engine (the local worker or a remote server), loading with the drafts found first, the
engine settings it loads with, and its facts."""

from __future__ import annotations

import threading
from dataclasses import replace
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING

from app.core.documents.retrieval_models import not_for_chat
from app.core.model_paths import usable_folders
from app.core.remote_engine import RemoteChoice
from app.core.speculation_facts import ModelFacts, find_drafts, model_facts
from models_catalog.pairing import local_mmproj

if TYPE_CHECKING:
    from app.core.config import EngineSettings
    from app.core.engine import Engine
    from app.tui.controllers.host import ModelsHost
    from app.tui.controllers.speculation import SpeculationController
    from models_catalog.drafts import DraftCandidate


class ModelsController:
    """Loads local models (drafts found off the event loop, then the speculative load options) and switches
    between the local engine and remote ones."""

    def __init__(self, host: ModelsHost, speculation: SpeculationController) -> None:
        self.host = host
        self.speculation = speculation
        self.closing: list[threading.Thread] = []
        """Local engines being closed in the background (joined when the app ends)."""

    # ----- which engine -----

    def replace_bridge(self, bridge: Engine) -> None:
        """Use `bridge` from now on; the old one is closed in a thread (a local worker's memory is freed without
        holding up the UI); what it still posts is told apart by the engine it came from."""
        host = self.host
        old, host.bridge = host.bridge, bridge
        closing = threading.Thread(target=old.close, name="llmtui-close-engine", daemon=True)
        closing.start()
        self.closing.append(closing)

    def use_remote(self, choice: RemoteChoice) -> None:
        """Switch to a remote engine's model (the local engine is shut down; picking a local model starts it)."""
        host = self.host
        remote = host.remote_bridge(choice.remote, choice.model)
        self.replace_bridge(remote)
        host.model_path = choice.path
        host.model = None
        if host.start_engine:
            remote.load(choice.path, self.engine_settings())
        host.set_engine_state("loading")

    def join_closing(self, timeout_s: float) -> None:
        for closing in self.closing:
            closing.join(timeout_s)

    # ----- loading a local model -----

    def load(self, path: Path) -> None:
        host = self.host
        if not host.bridge.capabilities.loads_files:
            self.replace_bridge(host.local_bridge())
        host.model_path = str(path)
        host.model = None
        self.speculation.forget_drafts()
        if host.start_engine:
            host.bridge.start()
            host.run_worker(
                partial(self.find_drafts_then_load, str(path)),
                name="find_drafts_then_load",
                group="load-model",
                exclusive=True,
                thread=True,
            )
        host.set_engine_state("loading")

    def engine_settings(self) -> EngineSettings:
        """The engine settings models load with: the saved ones, with this session's overrides."""
        return replace(self.host.config.engine, **self.host.engine_overrides)

    def facts(self) -> ModelFacts | None:
        model = self.host.model
        return model_facts(model.path) if model is not None else None

    def find_drafts_then_load(self, path: str) -> None:
        """Find the drafts the model brings along (it reads GGUF headers: ~0.1 s per file of a large vocabulary),
        then load it with the options they call for (a model drafter's rollback depth). Runs in a thread."""
        missing: list[tuple[str, str]] = []
        refusal = not_for_chat(Path(path))
        if refusal is not None:  # an embedding model or a reranker: said as a draft opened as the model is
            self.host.call_from_thread(self.refuse, path, refusal)
            return
        try:
            found, missing = find_drafts(path, usable_folders(self.host.config.model_folders))
        except Exception as error:  # noqa: BLE001 - finding drafts must never keep a model from loading
            self.host.call_from_thread(
                self.host.notify, f"Draft sidecars were not looked for: {error}", severity="warning"
            )
            found = []
        try:
            model_facts(path)  # the model's header, read here (cached) and not by load_found on the event loop
        except Exception:  # noqa: BLE001, S110 - a header it cannot read: the load says why
            pass
        projector = local_mmproj(Path(path))  # loads with it, so the model sees images
        self.host.call_from_thread(
            self.load_found, path, tuple(found), tuple(missing), str(projector) if projector else ""
        )

    def refuse(self, path: str, message: str) -> None:
        """The model at `path` is not loaded to chat with: the engine state is an error, and the notice says why."""
        if path != self.host.model_path:
            return  # another model was chosen meanwhile
        self.host.set_engine_state("error")
        self.host.notify(message, severity="error", timeout=15)

    def load_found(
        self,
        path: str,
        sidecars: tuple[DraftCandidate, ...],
        missing: tuple[tuple[str, str], ...],
        mmproj: str = "",
    ) -> None:
        host = self.host
        if path != host.model_path or not host.bridge.capabilities.loads_files:
            return  # another model (or a server) was chosen meanwhile
        self.speculation.draft_sidecars, self.speculation.missing_drafts = sidecars, missing
        host.bridge.load(
            path,
            self.engine_settings(),
            mmproj=mmproj,
            disk_cache=host.config.cache.disk_cache_params(),
            **self.speculation.load_options(path),
        )
