"""The prompt cache on disk with llama.cpp: a conversation's state restored by a new worker (a restart), exactly for a
hybrid model, refused files that leave the reply as a fresh evaluation gives it, and the engine's own notices."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx2 as httpx
import pytest

from app.core.paths import prompt_cache_dir
from engine_ext.client import EngineClient
from engine_ext.disk_cache import SUFFIX, DiskCache, folder_bytes
from engine_ext.generate import Session
from engine_ext.model import Context, Model
from engine_ext.params import GREEDY, ContextParams, DiskCacheParams, ModelParams
from engine_ext.protocol import Finished, Generate, TokenChunk
from tests.rpc_server import ROOT, free_port
from tests.waits import wait_for

CTX = ContextParams(n_ctx=1024, n_batch=256, n_ubatch=256, n_threads=2)
FIRST = "The history of the lighthouse keeper: " + " ".join(f"day {i} the lamp was lit at dusk." for i in range(12))


def reply(client_or_session: EngineClient | Session, prompt: str, max_tokens: int = 12) -> tuple[list[int], Finished]:
    request = Generate(request_id=1, prompt=prompt, sampling=GREEDY, max_tokens=max_tokens, ignore_eos=True)
    ids: list[int] = []
    if isinstance(client_or_session, Session):

        def emit(event: object) -> None:
            if isinstance(event, TokenChunk):
                ids.extend(event.token_ids)

        done = client_or_session.generate(request, emit, lambda: False)  # type: ignore[arg-type]
        return ids, done
    for event in client_or_session.generate(request):
        if isinstance(event, TokenChunk):
            ids.extend(event.token_ids)
        elif isinstance(event, Finished):
            return ids, event
    raise AssertionError(f"no Finished: {event}")


@contextmanager
def session(
    path: Path, folder: Path | None, parts: dict[str, object] | None = None, budget: int = 0
) -> Iterator[Session]:
    model = Model(path)
    ctx = Context(model, CTX)
    try:
        s = Session(model, ctx)
        if folder is not None:
            s.disk = DiskCache(folder, parts or {"model": str(path)}, budget=budget)
        yield s
        if s.disk is not None:
            s.disk.close()
    finally:
        ctx.close()
        model.close()


def test_a_second_worker_resumes_the_conversation_from_disk(tiny_models: dict[str, Path], tmp_path: Path) -> None:
    """A restart: the first worker saves the conversation after its reply; the second restores it for the next turn
    (its stats count the restored tokens as cached) and answers as a fresh evaluation does."""
    folder = tmp_path / "prompt-cache"
    disk = DiskCacheParams(folder=str(folder))
    path = tiny_models["llama"]
    with EngineClient(tmp_path / "one.log") as client:
        client.start()
        client.load(path, ModelParams(), CTX, disk_cache=disk)
        first_ids, first = reply(client, FIRST)
    assert first.stats.prompt_tokens_cached == 0
    files = list(folder.glob(f"*{SUFFIX}"))
    assert len(files) == 1 and oct(files[0].stat().st_mode & 0o777) == "0o600"
    with EngineClient(tmp_path / "two.log") as client:
        client.start()
        client.load(path, ModelParams(), CTX, disk_cache=disk)
        first_text = client_text = None  # noqa: F841 - the prompt goes on from the reply's text
        with session(path, None) as fresh_session:
            first_text = b"".join(fresh_session.model.token_piece(t) for t in first_ids).decode("utf-8", "replace")
            second_prompt = FIRST + first_text + " And on the next day"
            fresh_ids, fresh = reply(fresh_session, second_prompt)
        restored_ids, restored = reply(client, second_prompt)
    assert restored.stats.prompt_tokens_cached >= first.stats.prompt_tokens  # the first prompt was not read again
    assert fresh.stats.prompt_tokens_cached == 0
    assert restored_ids == fresh_ids
    assert "prompt cache:" in (tmp_path / "two.log").read_text()  # the log says what was restored


def test_switching_back_to_a_model_restores_its_conversation(tiny_models: dict[str, Path], tmp_path: Path) -> None:
    """A model switch: the conversation with the first model is saved, the second model's loads and answers, and
    switching back restores the first conversation instead of evaluating it."""
    disk = DiskCacheParams(folder=str(tmp_path / "prompt-cache"))
    with EngineClient(tmp_path / "engine.log") as client:
        client.start()
        client.load(tiny_models["llama"], ModelParams(), CTX, disk_cache=disk)
        _ids, first = reply(client, FIRST)
        client.load(tiny_models["qwen3"], ModelParams(), CTX, disk_cache=disk)
        _ids, other = reply(client, FIRST)
        assert other.stats.prompt_tokens_cached == 0  # another model's state is never restored
        client.load(tiny_models["llama"], ModelParams(), CTX, disk_cache=disk)
        _ids, back = reply(client, FIRST + " Again")
    assert back.stats.prompt_tokens_cached >= first.stats.prompt_tokens - 1


@pytest.mark.parametrize("kind", ["qwen35", "qwen3next"])
def test_a_hybrid_model_is_restored_exactly(tiny_models: dict[str, Path], tmp_path: Path, kind: str) -> None:
    """Recurrent state and its checkpoints come back: the next turn's greedy reply equals a fresh evaluation's, and
    a branch from before the end of the saved state restores at a checkpoint."""
    path = tiny_models[kind]
    folder = tmp_path / "cache"
    with session(path, folder) as first:
        first_ids, first_done = reply(first, FIRST)
        first.save_to_disk()
        text = b"".join(first.model.token_piece(t) for t in first_ids).decode("utf-8", "replace")
    second_prompt = FIRST + text + " Then"
    with session(path, None) as fresh:
        fresh_ids, _ = reply(fresh, second_prompt)
        branch_ids, _ = reply(fresh, FIRST + " A different turn")
    with session(path, folder) as resumed:
        ids, done = reply(resumed, second_prompt)
        assert done.stats.prompt_tokens_cached >= first_done.stats.prompt_tokens - 1
        assert ids == fresh_ids and done.notices == ()
    with session(path, folder) as branched:  # shares the first prompt but its last token: the checkpoint there
        ids, done = reply(branched, FIRST + " A different turn")
        assert done.stats.prompt_tokens_cached >= first_done.stats.prompt_tokens - 2
        assert ids == branch_ids


def _corrupt(path: Path) -> None:
    with open(path, "r+b") as file:
        file.seek(-3, os.SEEK_END)
        file.write(b"\xff\x00\xff")


def _truncate(path: Path) -> None:
    os.truncate(path, path.stat().st_size // 2)


def _link(path: Path) -> None:
    target = path.with_name("elsewhere.bin")
    os.replace(path, target)
    path.symlink_to(target)


@pytest.mark.parametrize(
    ("spoil", "said"),
    [(_corrupt, "checksum does not match"), (_truncate, "is truncated"), (_link, "symbolic link"), (None, "another")],
)
def test_a_spoiled_state_file_is_refused_and_the_reply_is_evaluated(
    tiny_models: dict[str, Path], tmp_path: Path, spoil: object, said: str
) -> None:
    path = tiny_models["llama"]
    folder = tmp_path / "cache"
    with session(path, folder) as first:
        first.generate(Generate(1, prompt=FIRST, sampling=GREEDY, max_tokens=4), lambda e: None, lambda: False)
        first.save_to_disk()
    (saved,) = folder.glob(f"*{SUFFIX}")
    if spoil is None:  # foreign: saved by another model (or build, or KV types) under this file's name
        with session(tiny_models["qwen3"], tmp_path / "other", {"model": "another"}) as other:
            other.generate(Generate(1, prompt=FIRST, sampling=GREEDY, max_tokens=4), lambda e: None, lambda: False)
            other.save_to_disk()
        (foreign,) = (tmp_path / "other").glob(f"*{SUFFIX}")
        os.replace(foreign, saved)
    else:
        spoil(saved)  # type: ignore[operator]
    prompt = FIRST + " and the keeper slept."
    with session(path, None) as fresh:
        fresh_ids, _ = reply(fresh, prompt)
    with session(path, folder) as resumed:
        ids, done = reply(resumed, prompt)
    assert done.stats.prompt_tokens_cached == 0 and ids == fresh_ids
    (notice,) = [n for n in done.notices if n.startswith("prompt cache:")]
    assert said in notice and "\n" not in notice and len(notice) <= 320


def test_saves_stay_within_the_budget(tiny_models: dict[str, Path], tmp_path: Path) -> None:
    path = tiny_models["llama"]
    folder = tmp_path / "cache"
    with session(path, folder, budget=1) as probe:  # how big one conversation's state is
        reply(probe, FIRST)
        one = len(probe.ctx.sequence_state())
    budget = int(one * 2.5)
    with session(path, folder, budget=budget) as s:
        for topic in ("apples", "rivers", "engines"):
            s.reset_cache()
            reply(s, f"Tell me about {topic}. " + FIRST)
            s.save_to_disk()
            s.disk.wait()  # type: ignore[union-attr]
        assert 0 < folder_bytes(folder) <= budget and len(list(folder.glob(f"*{SUFFIX}"))) == 2


def test_run_prompt_cache_file_restores_the_prompt_and_ro_leaves_it(
    tiny_models: dict[str, Path], tmp_path: Path
) -> None:
    """`run --prompt-cache FILE` as llama-cli has it: the second run with a prompt that starts with the first's reads
    it from FILE; --prompt-cache-ro does not write FILE."""
    import json
    import subprocess
    import sys

    state = tmp_path / "prompt.state"

    def run(prompt: str, *extra: str) -> dict[str, object]:
        args = ["run", "-m", str(tiny_models["llama"]), "--raw", "-p", prompt, "--temp", "0", "-n", "4", "-t", "2"]
        result = subprocess.run(
            [sys.executable, "-m", "app", *args, "-c", "1024", "--json", "--prompt-cache", str(state), *extra],
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert result.returncode == 0, result.stderr
        return json.loads(result.stdout)  # type: ignore[no-any-return]

    first = run(FIRST)
    assert state.is_file() and oct(state.stat().st_mode & 0o777) == "0o600"
    saved = state.read_bytes()
    again = run(FIRST + " more", "--prompt-cache-ro")
    stats = again["stats"]
    assert isinstance(stats, dict) and stats["prompt_tokens_cached"] >= first["stats"]["prompt_tokens"]  # type: ignore[index]
    assert state.read_bytes() == saved  # read only
    state.write_bytes(saved[:-10])  # truncated: refused in one line, evaluated instead
    spoiled = run(FIRST + " more")
    assert spoiled["stats"]["prompt_tokens_cached"] == 0  # type: ignore[index]
    assert any("truncated" in n for n in spoiled["notices"])  # type: ignore[union-attr]


@contextmanager
def serving(model: Path, *extra: str) -> Iterator[tuple[subprocess.Popen[str], str]]:
    """`llmtui serve` on `model` in its own process group (a kill takes its worker too), once /health answers."""
    port = free_port()
    args = ["-m", str(model), "-t", "2", "-c", "1024", "--temp", "0", "--port", str(port), *extra]
    process = subprocess.Popen(
        [sys.executable, "-m", "app", "serve", *args],
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        text=True,
        start_new_session=True,
    )
    base = f"http://127.0.0.1:{port}"

    def healthy() -> bool:
        assert process.poll() is None, "llmtui serve exited"
        try:
            return httpx.get(f"{base}/health", timeout=1).status_code == 200
        except httpx.HTTPError:
            return False

    try:
        wait_for(healthy, "llmtui serve to answer /health", timeout_s=120, interval_s=0.2)
        yield process, base
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
        process.wait(30)


def complete(base: str, prompt: str) -> dict[str, int]:
    body = {"prompt": prompt, "max_tokens": 4, "temperature": 0}
    answer = httpx.post(f"{base}/v1/completions", json=body, timeout=120)
    assert answer.status_code == 200, answer.text
    usage = answer.json()["usage"]
    return {"prompt": usage["prompt_tokens"], "cached": usage["prompt_tokens_details"]["cached_tokens"]}


def test_serve_resumes_a_clients_prompt_after_kill_9(tiny_models: dict[str, Path]) -> None:
    """`serve` (one sequence) saves the state when a reply finishes; after the server and its worker are killed
    (SIGKILL, no shutdown), a new server restores it for a request that starts with that prompt."""
    with serving(tiny_models["llama"]) as (_process, base):
        first = complete(base, FIRST)
        wait_for(lambda: any(prompt_cache_dir().glob(f"*{SUFFIX}")), "the state file", timeout_s=30)
    with serving(tiny_models["llama"]) as (_process, base):
        second = complete(base, FIRST + " The keeper wrote it down.")
    assert first["cached"] == 0 and second["cached"] >= first["prompt"]


def test_serve_slot_save_erase_and_restore_as_llama_server(tiny_models: dict[str, Path], tmp_path: Path) -> None:
    """llama-server's POST /slots/0?action=save|erase|restore (the prompt cache on disk off, so the restore is the
    slot's): the restored state serves the next request; bad names, actions and files are refused in one line."""
    from app.core.paths import config_path

    config_path().parent.mkdir(parents=True, exist_ok=True)
    config_path().write_text("[cache]\ndisk = false\n")
    slots = tmp_path / "slots"
    with serving(tiny_models["llama"], "--slot-save-path", str(slots)) as (_process, base):
        first = complete(base, FIRST)

        def slot(action: str, body: dict[str, object] | None = None) -> httpx.Response:
            return httpx.post(f"{base}/slots/0?action={action}", json=body or {}, timeout=60)

        saved = slot("save", {"filename": "keeper.bin"}).json()
        assert saved["id_slot"] == 0 and saved["filename"] == "keeper.bin" and saved["n_saved"] >= first["prompt"]
        assert saved["n_written"] == (slots / "keeper.bin").stat().st_size and "save_ms" in saved["timings"]
        assert oct((slots / "keeper.bin").stat().st_mode & 0o777) == "0o600"
        assert slot("erase").json() == {"id_slot": 0, "n_erased": saved["n_saved"]}
        assert complete(base, FIRST)["cached"] == 0  # erased
        restored = slot("restore", {"filename": "keeper.bin"}).json()
        assert restored["n_restored"] == saved["n_saved"] and restored["n_read"] == saved["n_written"]
        assert complete(base, FIRST + " And again")["cached"] >= first["prompt"]
        for body, action in (({"filename": "../keeper.bin"}, "save"), ({"filename": "x"}, "bogus"), ({}, "restore")):
            refused = slot(action, body)
            assert refused.status_code == 400 and "\n" not in refused.json()["error"]["message"]
        assert httpx.post(f"{base}/slots/1?action=erase", json={}, timeout=30).status_code == 400
        (slots / "spoiled.bin").write_bytes((slots / "keeper.bin").read_bytes()[:-7])
        (slots / "model.bin").write_bytes(b"GGUF" + bytes(64))
        for name, said in (("spoiled.bin", "truncated"), ("model.bin", "wrong magic"), ("none.bin", "does not exist")):
            refused = slot("restore", {"filename": name})
            assert refused.status_code == 400 and said in refused.json()["error"]["message"], refused.text
        assert complete(base, FIRST)["prompt"] == first["prompt"]  # the server goes on
    with serving(tiny_models["llama"]) as (_process, base):
        off = httpx.post(f"{base}/slots/0?action=save", json={"filename": "a.bin"}, timeout=30)
        assert off.status_code == 501 and "--slot-save-path" in off.json()["error"]["message"]


def test_a_save_never_waits_for_the_one_being_written(
    tiny_models: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """While a save is still being written, the next reply's save is left out (the engine does not wait for the
    disk); the final save, before the model goes, writes the latest state."""
    import threading
    import time

    release = threading.Event()
    written: list[int] = []
    original = DiskCache._write

    def slow_write(self: DiskCache, key: str, tokens: tuple[int, ...], *rest: object) -> None:
        release.wait(30)
        written.append(len(tokens))
        original(self, key, tokens, *rest)  # type: ignore[arg-type]

    monkeypatch.setattr(DiskCache, "_write", slow_write)
    folder = tmp_path / "cache"
    with session(tiny_models["llama"], folder) as s:
        reply(s, FIRST)
        s.save_to_disk()  # its writer waits for `release`
        _ids, second = reply(s, FIRST + " and the storm came. " * 4)
        t0 = time.perf_counter()
        s.save_to_disk()
        assert time.perf_counter() - t0 < 1.0 and s.disk is not None and s.disk.busy
        release.set()
        s.disk.wait()
        s.save_to_disk(final=True)
        s.disk.wait()
    assert written == [written[0], second.stats.n_ctx_used] and written[0] < second.stats.n_ctx_used
