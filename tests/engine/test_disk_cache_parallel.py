"""The prompt cache on disk for parallel sequences (engine_ext.seq_disk, `serve --parallel N`): each sequence's state
saved when its request finishes, restored into a sequence after a restart (the stats count it as cached, the greedy
reply equals a fresh evaluation's), sequences saved independently, a spoiled file refused in one line, images in
the key (a state is restored only for the same image), and `serve --parallel 2` after `kill -9`."""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from app.core.paths import prompt_cache_dir
from engine_ext.disk_cache import SUFFIX, DiskCache
from engine_ext.generate import Session
from engine_ext.model import Context, Model
from engine_ext.params import GREEDY, ContextParams
from engine_ext.protocol import ChatMessage, Finished, Generate, ImageRef
from tests.engine.test_disk_cache import FIRST, complete, serving
from tests.engine.test_parallel import Run, alone, open_session
from tests.waits import wait_for

SECOND = "A ledger of the harbour: " + " ".join(f"ship {i} came in with salt and left with wool." for i in range(10))


@contextmanager
def parallel_session(path: Path, folder: Path | None, n_seq: int = 2, mmproj: Path | None = None) -> Iterator[Session]:
    """A session with `n_seq` sequences, each its own KV stream (as `serve --parallel N` loads), its states saved
    in `folder`."""
    model = Model(path)
    ctx = Context(model, ContextParams(n_ctx=2048, n_batch=256, n_threads=2, n_seq_max=n_seq, kv_unified=False))
    session = Session(model, ctx)
    try:
        if mmproj is not None:
            from engine_ext.vision import Vision

            session.vision = Vision(mmproj, model, n_threads=2, use_gpu=False)
        if folder is not None:
            session.disk = DiskCache(folder, {"model": str(path)})
        yield session
    finally:
        if session.disk is not None:
            session.disk.close()
        if session.vision is not None:
            session.vision.close()
        ctx.close()
        model.close()


def drained(session: Session | Run, *requests: Generate) -> Run:
    """The requests run together (on a new scheduler, or `session`'s again); the sequences go idle (released: each
    state saved) and the saves are written."""
    run = Run(session) if isinstance(session, Session) else session
    if not run.scheduler.active:
        run.scheduler.activate(())
    for request in requests:
        run.submit(request)
    run.drain()
    run.scheduler.release()
    if run.scheduler.session.disk is not None:
        run.scheduler.session.disk.wait()
    return run


def greedy(request_id: int, prompt: str, n: int = 10) -> Generate:
    return Generate(request_id, prompt=prompt, sampling=GREEDY, max_tokens=n, ignore_eos=True)


@pytest.mark.parametrize("kind", ["llama", "qwen35"])  # a KV cache, and a hybrid recurrent memory
def test_two_sequences_saved_apart_and_restored_after_a_restart(
    tiny_models: dict[str, Path], tmp_path: Path, kind: str
) -> None:
    path, folder = tiny_models[kind], tmp_path / "cache"
    with parallel_session(path, folder) as first:
        run = drained(first, greedy(1, FIRST), greedy(2, SECOND))
        texts = [b"".join(map(first.model.token_piece, run.tokens(i))).decode("utf-8", "replace") for i in (1, 2)]
        prompts = [run.finished(i).stats.prompt_tokens for i in (1, 2)]
    assert len(list(folder.glob(f"*{SUFFIX}"))) == 2  # one file per sequence
    follow = [greedy(3, FIRST + texts[0] + " Then the storm"), greedy(4, SECOND + texts[1] + " And the tide")]
    with open_session(path, n_ctx=1024) as single:
        expected = [alone(single, r) for r in follow]
    with parallel_session(path, folder) as resumed:  # a restart: a new context, the states from disk
        run = drained(resumed, *follow)
        for request, want, n_prompt in zip(follow, expected, prompts, strict=True):
            done = run.finished(request.request_id)
            assert done.stats.prompt_tokens_cached >= n_prompt, done
            assert run.tokens(request.request_id) == want and done.notices == ()


def test_a_corrupted_state_file_is_refused_in_one_line(tiny_models: dict[str, Path], tmp_path: Path) -> None:
    path, folder = tiny_models["llama"], tmp_path / "cache"
    with parallel_session(path, folder) as first:
        drained(first, greedy(1, FIRST))
    (saved,) = folder.glob(f"*{SUFFIX}")
    with open(saved, "r+b") as file:
        file.seek(-5, 2)
        file.write(b"\x00\xff\x00\xff\x00")
    later = greedy(2, FIRST + " and the keeper slept.")
    with open_session(path, n_ctx=1024) as single:
        expected = alone(single, later)
    with parallel_session(path, folder) as resumed:
        run = drained(resumed, later)
    done = run.finished(2)
    assert done.stats.prompt_tokens_cached == 0 and run.tokens(2) == expected
    (notice,) = [n for n in done.notices if n.startswith("prompt cache:")]
    assert "checksum does not match" in notice and "\n" not in notice and len(notice) <= 320


def test_serve_parallel_resumes_after_kill_9(tiny_models: dict[str, Path]) -> None:
    """`serve --parallel 2`: a finished reply's sequence is saved at once; after the server and its worker are
    killed (SIGKILL), a new server restores it for a request that starts with that prompt (usage's cached tokens)."""
    with serving(tiny_models["llama"], "--parallel", "2") as (_process, base):
        first = complete(base, FIRST)
        wait_for(lambda: any(prompt_cache_dir().glob(f"*{SUFFIX}")), "the state file", timeout_s=30)
    with serving(tiny_models["llama"], "--parallel", "2") as (_process, base):
        second = complete(base, FIRST + " The keeper wrote it down.")
    assert first["cached"] == 0 and second["cached"] >= first["prompt"]


def _image(seed: int) -> ImageRef:
    from tests.tiny_mmproj import png_bytes

    data = png_bytes(40, 30, seed=seed)
    return ImageRef(hashlib.sha256(data).hexdigest(), data=data, name=f"picture-{seed}.png")


def _turn(request_id: int, picture: ImageRef, *more: ChatMessage) -> Generate:
    first = ChatMessage("user", "What is in the picture? " + FIRST, images=(picture,))
    return Generate(request_id, messages=(first, *more), sampling=GREEDY, max_tokens=8, ignore_eos=True)


def test_an_image_conversation_is_restored_only_with_the_same_image(
    tiny_models: dict[str, Path], tmp_path: Path
) -> None:
    from engine_ext.bindings import MultimodalUnavailable, mtmd
    from tests.tiny_mmproj import write_tiny_mmproj

    try:
        mtmd()
    except MultimodalUnavailable:
        pytest.skip("this engine was built without libmtmd")
    mmproj = write_tiny_mmproj(tmp_path / "mmproj-tiny-llama-f32.gguf")
    path, folder = tiny_models["llama"], tmp_path / "cache"
    more = (ChatMessage("assistant", "a lamp"), ChatMessage("user", "and the colours?"))
    same, other = _turn(2, _image(0), *more), _turn(3, _image(1), *more)
    expected = {}
    for request in (same, other):
        with parallel_session(path, None, mmproj=mmproj) as fresh:
            expected[request.request_id] = drained(fresh, request).tokens(request.request_id)
    with parallel_session(path, folder, mmproj=mmproj) as first:
        n_prompt = drained(first, _turn(1, _image(0))).finished(1).stats.prompt_tokens
    assert len(list(folder.glob(f"*{SUFFIX}"))) == 1
    with parallel_session(path, folder, mmproj=mmproj) as resumed:  # a restart: other span ids, the same images
        run = drained(resumed, other)
        done: Finished = run.finished(3)
        assert done.stats.prompt_tokens_cached < 32 and run.tokens(3) == expected[3]  # another image: not restored
        run = drained(run, same)
        done = run.finished(2)
        assert done.stats.prompt_tokens_cached >= n_prompt - 1 and run.tokens(2) == expected[2]


def test_an_evicted_sequence_is_saved_before_its_cells_go(tiny_models: dict[str, Path], tmp_path: Path) -> None:
    """A reply that added too little to be saved when it finished (MIN_GAIN_TOKENS) is saved when its sequence is
    given to another prompt, while the others decode (the state file then holds all of it)."""
    from engine_ext.disk_cache import list_state_files

    path, folder = tiny_models["llama"], tmp_path / "cache"
    with parallel_session(path, folder) as session:
        run = Run(session)
        for request in (greedy(1, FIRST, 1), greedy(2, FIRST + " Short.", 2)):  # the second extends the first
            run.submit(request)
            run.drain()
        assert session.disk is not None
        session.disk.wait()
        (before,) = [row[3] for row in list_state_files(folder)]
        n_short = run.finished(2).stats.n_ctx_used
        assert before is not None and len(before.tokens) < n_short  # the short reply was not saved
        run.submit(greedy(3, SECOND, 24))  # takes the empty sequence
        run.submit(greedy(4, "Something else entirely: " + SECOND, 4))  # takes (evicts) the short reply's
        run.drain()
        session.disk.wait()
        saved = sorted(len(row[3].tokens) for row in list_state_files(folder) if row[3] is not None)
    assert n_short in saved


def test_the_single_sequence_restores_an_image_conversation_only_with_the_same_image(
    tiny_models: dict[str, Path], tmp_path: Path
) -> None:
    """The chat app's path (one sequence): a conversation with an image is saved too, keyed by the image."""
    from engine_ext.bindings import MultimodalUnavailable, mtmd
    from tests.tiny_mmproj import write_tiny_mmproj

    try:
        mtmd()
    except MultimodalUnavailable:
        pytest.skip("this engine was built without libmtmd")
    mmproj = write_tiny_mmproj(tmp_path / "mmproj-tiny-llama-f32.gguf")
    path, folder = tiny_models["llama"], tmp_path / "cache"
    more = (ChatMessage("assistant", "a lamp"), ChatMessage("user", "and the colours?"))

    def ask(session: Session, request: Generate) -> tuple[list[int], Finished]:
        ids: list[int] = []
        done = session.generate(request, lambda e: ids.extend(getattr(e, "token_ids", ())), lambda: False)
        return ids, done

    expected = {}
    for request in (_turn(2, _image(0), *more), _turn(3, _image(1), *more)):
        with parallel_session(path, None, n_seq=1, mmproj=mmproj) as fresh:
            expected[request.request_id] = ask(fresh, request)[0]
    with parallel_session(path, folder, n_seq=1, mmproj=mmproj) as first:
        _ids, done = ask(first, _turn(1, _image(0)))
        first.save_to_disk()
        n_prompt = done.stats.prompt_tokens
    assert len(list(folder.glob(f"*{SUFFIX}"))) == 1  # saved, with its image
    with parallel_session(path, folder, n_seq=1, mmproj=mmproj) as resumed:
        ids, done = ask(resumed, _turn(3, _image(1), *more))
        assert done.stats.prompt_tokens_cached < 32 and ids == expected[3]
    with parallel_session(path, folder, n_seq=1, mmproj=mmproj) as resumed:
        ids, done = ask(resumed, _turn(2, _image(0), *more))
        assert done.stats.prompt_tokens_cached >= n_prompt - 1 and ids == expected[2]
