"""F4 marks the catalog's embedding model and reranker and refuses to open either to chat with, saying what it is
for; F3 shows [documents]' two models and saves them; F12's notice says how the documents are searched."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
from textual.widgets import Input, OptionList

from app.core.config import load_config
from app.core.documents.retrieval_models import not_for_chat
from app.tui.app import LlmtuiApp
from app.tui.screens.models_detail import catalog_label, entry_text
from app.tui.screens.settings_screen import SettingsScreen
from models_catalog.catalog import load_catalog
from tests.tiny_models import write_tiny_embedder
from tests.tui.test_tui_models import open_models
from tests.tui.test_tui_models_local import highlight_local
from tests.waits import wait_until

NOTES = Path(__file__).parents[1] / "fixtures" / "documents" / "notes"


def test_the_catalog_list_marks_what_is_not_to_chat_with(tiny_models: dict[str, Path], tmp_path: Path) -> None:
    catalog = load_catalog()
    labels = {e.id: catalog_label(e).plain for e in catalog}
    assert labels["embeddinggemma-300m"].endswith("embedding model") and labels["bge-reranker-v2-m3"].endswith(
        "reranker"
    )
    assert not any("embedding" in labels[e.id] or "reranker" in labels[e.id] for e in catalog.chat_models())
    embed = catalog.get("embeddinggemma-300m")
    assert embed is not None and "An embedding model, not a model to chat with" in entry_text(embed, None).plain
    embedder = write_tiny_embedder(tmp_path / "tiny-embedder.gguf")
    reranker = write_tiny_embedder(tmp_path / "tiny-reranker.gguf", rerank=True)
    said = not_for_chat(embedder)
    assert said is not None and said.startswith("tiny-embedder.gguf is an embedding model") and "F3" in said
    assert "is a reranker (rank pooling), not a model to chat with" in (not_for_chat(reranker) or "")
    assert not_for_chat(tiny_models["llama"]) is None


@pytest.mark.anyio
async def test_u_on_an_embedding_model_says_what_it_is_for_and_keeps_the_chat_model(
    tiny_models: dict[str, Path], tmp_path: Path
) -> None:
    folder = tmp_path / "models"
    folder.mkdir()
    embedder = write_tiny_embedder(folder / "tiny-embedder.gguf")
    app = LlmtuiApp(str(tiny_models["llama"]), start_engine=False)
    async with app.run_test(size=(120, 40)) as pilot:
        app.save_settings(replace(app.config, model_folders=(str(folder),)))
        before = app.model_path
        screen = await open_models(pilot)
        catalog = [str(o.prompt) for o in screen.query_one("#catalog-list", OptionList).options]
        assert sum("embedding model" in text for text in catalog) == 1
        await pilot.press("3")
        await wait_until(pilot, lambda: any(m.path == embedder for m in screen.local_models), "the folder's model")
        await highlight_local(pilot, screen, str([m.path for m in screen.local_models].index(embedder)))
        await pilot.press("u")
        said = "tiny-embedder.gguf is an embedding model (its GGUF names a pooling), not a model to chat with"
        await wait_until(
            pilot,
            lambda: any(said in str(n.message) for n in app._notifications),
            "the refusal",  # noqa: SLF001
        )
        assert app.screen is screen and app.model_path == before


@pytest.mark.anyio
async def test_f3_shows_and_saves_the_documents_models(tiny_models: dict[str, Path], tmp_path: Path) -> None:
    app = LlmtuiApp(str(tiny_models["llama"]), start_engine=False)
    async with app.run_test(size=(120, 40)) as pilot:
        await pilot.press("f3")
        await wait_until(pilot, lambda: isinstance(app.screen, SettingsScreen), "the settings")
        field = app.screen.query_one("#documents-embed_model", Input)
        assert field.value == "" and field.placeholder == "the catalog's, once downloaded"
        field.value = "none"
        await pilot.press("ctrl+s")
        await wait_until(pilot, lambda: not isinstance(app.screen, SettingsScreen), "the settings saved")
        assert load_config().documents.embed_model == "none" and load_config().documents.rerank_model == ""


@pytest.mark.anyio
async def test_f12_searches_with_the_embedding_model_the_settings_name(
    tiny_models: dict[str, Path], tmp_path: Path
) -> None:
    from app.core.config import SamplingSettings
    from app.core.documents.retrieval import Retrieval
    from tests.pilot import ready, reply_done

    embedder = write_tiny_embedder(tmp_path / "tiny-embedder.gguf")
    app = LlmtuiApp(str(tiny_models["llama"]), default_sampling=SamplingSettings(temperature=0.0, max_tokens=2))
    async with app.run_test(size=(110, 34)) as pilot:
        chat = await ready(pilot)
        chat.documents.attach_document(NOTES)
        hint = "BM25 search: embedding model none on disk; `llmtui models pull embeddinggemma-300m` fetches one"
        await wait_until(
            pilot,
            lambda: any(hint in str(n.message) for n in app._notifications),
            "the BM25 notice",  # noqa: SLF001
        )
        app.save_settings(replace(app.config, documents=replace(app.config.documents, embed_model=str(embedder))))
        found: list[Retrieval] = []
        ask = chat.documents._ask  # noqa: SLF001

        def recording(*args: object) -> Retrieval:
            found.append(ask(*args))  # type: ignore[arg-type]
            return found[-1]

        chat.documents._ask = recording  # type: ignore[method-assign,assignment]  # noqa: SLF001
        await chat.replies.send("How do I roll back a release of the billing service?")
        await reply_done(pilot)
        assert found and found[0].notes[0].endswith("searched with BM25 and embeddings (tiny-embedder.gguf)")
        assert any(c.file.endswith("work/deploy.md") for c in found[0].citations)  # random weights: fused, not first
        more = tmp_path / "more.md"
        more.write_text("# Boiler\n\nThe boiler is serviced every October.\n")
        chat.documents.attach_document(more)  # the notice of a second source names the model
        said = "hybrid search: BM25 and embeddings from tiny-embedder.gguf"
        await wait_until(
            pilot,
            lambda: any(said in str(n.message) for n in app._notifications),
            "the hybrid notice",  # noqa: SLF001
        )


@pytest.mark.anyio
@pytest.mark.usefixtures("app_dirs")
async def test_the_app_opened_on_an_embedding_model_says_what_it_is_for(tmp_path: Path) -> None:
    from app.core.config import SamplingSettings

    embedder = write_tiny_embedder(tmp_path / "tiny-embedder.gguf")
    app = LlmtuiApp(str(embedder), default_sampling=SamplingSettings(temperature=0.0, max_tokens=4))
    async with app.run_test(size=(100, 30)) as pilot:
        await wait_until(pilot, lambda: app.engine_state == "error", "the load to be refused")
        said = "tiny-embedder.gguf is an embedding model (its GGUF names a pooling), not a model to chat with"
        assert any(said in str(n.message) for n in app._notifications)  # noqa: SLF001
        assert app.model is None
