"""The chat app with documents, on the tiny llama through the real engine worker: F12 attaches a folder, a question
goes out with the numbered passages, the reply lists its sources (Enter shows the passage), and the history keeps
them through a reload and an export and import; the folder stays attached to the conversation after the app is
closed."""

from __future__ import annotations

from pathlib import Path

import pytest
from textual.widgets import Input

from app.core.config import SamplingSettings
from app.core.documents.retrieval import INSTRUCTION, shown_path
from app.tui.app import LlmtuiApp
from app.tui.widgets.source_block import SourceBlock
from engine_ext.untrusted_text import one_line
from tests.pilot import ready, reply_done
from tests.waits import wait_until

pytestmark = pytest.mark.anyio

NOTES = Path(__file__).parents[1] / "fixtures" / "documents" / "notes"


async def test_f12_attaches_a_folder_and_the_reply_keeps_its_sources(
    tiny_models: dict[str, Path], tmp_path: Path
) -> None:
    app = LlmtuiApp(str(tiny_models["llama"]), default_sampling=SamplingSettings(temperature=0.0, max_tokens=6))
    sent: list[object] = []
    async with app.run_test(size=(110, 34)) as pilot:
        chat = await ready(pilot)
        bridge = app.generation.host.bridge
        generate = bridge.generate

        def recording(messages: object, *args: object, **kwargs: object) -> int:
            sent.append(messages)
            return generate(messages, *args, **kwargs)  # type: ignore[arg-type]

        bridge.generate = recording  # type: ignore[method-assign]
        binary = tmp_path / "photo-notes.txt"
        binary.write_bytes(b"\x89PNG\x00\x00")
        chat.documents.attach_document(binary)  # nothing readable: not attached, said why
        said = f"Not attached: {one_line(shown_path(str(binary)), 80)}: read 0 files (0 KB); skipped 1 binary."
        # (the path as the notice shows it: cut at 80 characters, where xdist's longer temporary folders go past)
        await wait_until(pilot, lambda: said in [n.message for n in app._notifications], "the refusal")  # noqa: SLF001
        assert chat.documents.document_sources(None) == []
        await pilot.press("f12")
        await wait_until(pilot, lambda: bool(app.screen.query("#text-prompt-input")), "the path prompt")
        app.screen.query_one("#text-prompt-input", Input).value = str(NOTES)
        await pilot.press("enter")
        await wait_until(
            pilot, lambda: chat.documents.document_sources(None) == [NOTES.absolute()], "the folder attached"
        )
        await chat.replies.send("How do I roll back a release of the billing service?")
        await reply_done(pilot)
        asked = sent[-1][-1]  # type: ignore[index]
        text = asked[1] if isinstance(asked, tuple) else asked.content  # type: ignore[union-attr]
        assert text.startswith("Sources:\n\n[1] ") and "work/deploy.md:1-10" in text and INSTRUCTION in text
        conversation = chat.conversation_id
        assert conversation is not None
        reply = app.store.tree.active_path(conversation)[-1]
        kept = reply.stats["citations"]
        assert kept[0]["file"].endswith("work/deploy.md") and kept[0]["lines"] == [1, 10]
        assert "make rollback" in kept[0]["text"]
        question = app.store.tree.active_path(conversation)[-2]
        assert question.content == "How do I roll back a release of the billing service?"  # the history: as typed

        blocks = list(chat.transcript.query(SourceBlock))
        assert len(blocks) == len(kept) and "work/deploy.md:1-10" in str(blocks[0].render())
        blocks[0].focus()
        await pilot.press("enter")
        assert blocks[0].expanded and "make rollback" in str(blocks[0].render())

        await chat.reload_transcript()
        await pilot.pause()
        assert len(chat.transcript.query(SourceBlock)) == len(kept)
        copy = app.store.exports.import_json(app.store.exports.export_json(conversation))
        again = app.store.tree.active_path(copy.conversation_id)[-1]
        assert again.stats["citations"] == kept
        assert app.store.conversations.get_conversation(conversation).settings["documents"] == [str(NOTES.absolute())]

    reopened = LlmtuiApp(str(tiny_models["llama"]), default_sampling=SamplingSettings(temperature=0.0, max_tokens=4))
    async with reopened.run_test(size=(110, 34)) as pilot:  # the app opened again: the folder is still attached
        chat = await ready(pilot)
        await chat.conversations.open_conversation(conversation)
        assert chat.documents.document_sources(conversation) == [NOTES.absolute()]
        sent.clear()
        bridge = reopened.generation.host.bridge
        generate = bridge.generate
        bridge.generate = recording  # type: ignore[method-assign]
        await chat.replies.send("And where do new starters get their laptop?")
        await reply_done(pilot)
        asked = sent[-1][-1]  # type: ignore[index]
        text = asked[1] if isinstance(asked, tuple) else asked.content  # type: ignore[union-attr]
        assert text.startswith("Sources:\n\n[1] ") and "work/onboarding.md" in text
