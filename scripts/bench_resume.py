"""Resuming a long conversation after a restart: time to first token of its next turn with the prompt cache on disk
(the saved state restored) against without it (the whole conversation evaluated), side by side in one run, on the
starter model and a tiny hybrid model (recurrent state and checkpoints); the cost of the save after each reply (ms in
the engine before the next request can start, ms in the writer's thread, MB); the restore's throughput against a
plain read of the same file.

Each restart is a fresh model and context in this process (engine_ext.generate.Session, as the worker holds them; the
model's load time is left out of both sides). The state file is dropped from the page cache before each restore
(posix_fadvise DONTNEED after its fsync), so the restore reads the disk, not memory.

    python scripts/bench_resume.py                  # ~4,000 tokens, 3 runs, 2 threads
    python scripts/bench_resume.py --tokens 2000 -r 5 --json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

SENTENCE = "On day {i} the keeper climbed the stairs, trimmed the wick and wrote the weather in the log. "


def drop_from_page_cache(folder: Path) -> None:
    for path in folder.iterdir():
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def cold_read_mb_s(folder: Path) -> float:
    drop_from_page_cache(folder)
    total, t0 = 0, time.perf_counter()
    for path in folder.iterdir():
        with open(path, "rb") as file:
            while chunk := file.read(1 << 24):
                total += len(chunk)
    return total / 1e6 / (time.perf_counter() - t0)


def bench_model(name: str, path: Path, n_tokens: int, runs: int, threads: int) -> dict[str, Any]:
    from engine_ext.disk_cache import DiskCache
    from engine_ext.generate import Session
    from engine_ext.model import Context, Model
    from engine_ext.params import GREEDY, ContextParams
    from engine_ext.protocol import Generate

    model = Model(path)
    params = ContextParams(n_ctx=n_tokens + 512, n_batch=512, n_ubatch=512, n_threads=threads)
    text, i = "", 0
    while len(model.tokenize(text, add_special=True, parse_special=False)) < n_tokens:
        text += "".join(SENTENCE.format(i=i + k) for k in range(20))
        i += 20
    turn = text + " The next morning"
    folder = Path(tempfile.mkdtemp(prefix="bench-resume-"))
    parts = {"model": str(path), "bench": True}

    def request(prompt: str) -> Generate:
        return Generate(request_id=1, prompt=prompt, sampling=GREEDY, max_tokens=4, ignore_eos=True)

    def session(disk: bool) -> tuple[Session, Context]:
        ctx = Context(model, params)
        s = Session(model, ctx)
        s.disk = DiskCache(folder, parts, budget=1 << 40) if disk else None
        return s, ctx

    first, ctx = session(True)
    done = first.generate(request(text), lambda _e: None, lambda: False)
    n_conversation = done.stats.n_ctx_used
    t0 = time.perf_counter()
    first.save_to_disk()  # the part the next request waits for: llama.cpp copies the state out
    save_engine_ms = (time.perf_counter() - t0) * 1000.0
    assert first.disk is not None
    first.disk.wait()
    save_thread_ms, save_bytes = first.disk.last_save
    ctx.close()
    read_mb_s = cold_read_mb_s(folder)

    restored: list[float] = []
    evaluated: list[float] = []
    cached: list[int] = []
    restore_only: list[float] = []
    for _ in range(runs):
        for disk in (True, False):
            if disk:
                drop_from_page_cache(folder)
            s, ctx = session(disk)
            finished = s.generate(request(turn), lambda _e: None, lambda: False)
            (restored if disk else evaluated).append(finished.stats.ttft_ms)
            if disk:
                cached.append(s.restored_tokens)
                restore_only.append(s.restored_ms)
            ctx.close()
    model.close()
    restore_ms = statistics.median(restore_only)
    return {
        "model": name,
        "conversation_tokens": n_conversation,
        "ttft_restored_ms": statistics.median(restored),
        "restore_ms": restore_ms,
        "ttft_evaluated_ms": statistics.median(evaluated),
        "tokens_restored": min(cached),
        "save_engine_ms": save_engine_ms,
        "save_thread_ms": save_thread_ms,
        "save_mb": save_bytes / 1e6,
        "bytes_per_token": save_bytes / n_conversation,
        "restore_mb_s": save_bytes / 1e6 / (restore_ms / 1000.0),
        "disk_read_mb_s": read_mb_s,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tokens", type=int, default=4000, help="the conversation's length in tokens")
    parser.add_argument("-r", "--runs", type=int, default=3, help="restarts per side (the median is shown)")
    parser.add_argument("-t", "--threads", type=int, default=2)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()

    from app.core.model_paths import starter_model_path
    from tests.tiny_models import write_tiny_model

    models: list[tuple[str, Path]] = []
    starter = starter_model_path()
    if starter is not None:
        models.append(("starter (SmolLM2-135M Q4_1)", Path(starter)))
    models.append(("tiny qwen35 (hybrid)", write_tiny_model("qwen35", Path(tempfile.mkdtemp()) / "tiny-qwen35.gguf")))
    rows = [bench_model(name, path, args.tokens, args.runs, args.threads) for name, path in models]
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    head = (
        f"{'model':30} {'tokens':>7} {'TTFT restored':>14} {'TTFT evaluated':>15} {'restore':>8} "
        f"{'save (engine/thread)':>21} {'MB':>7} {'KiB/tok':>8} {'restore MB/s':>13} {'disk MB/s':>10}"
    )
    print(head)
    for r in rows:
        print(
            f"{r['model']:30} {r['conversation_tokens']:>7} {r['ttft_restored_ms']:>11.0f} ms "
            f"{r['ttft_evaluated_ms']:>12.0f} ms {r['restore_ms']:>5.0f} ms "
            f"{r['save_engine_ms']:>8.0f} / {r['save_thread_ms']:>5.0f} ms "
            f"{r['save_mb']:>7.1f} {r['bytes_per_token'] / 1024:>8.1f} {r['restore_mb_s']:>13.0f} "
            f"{r['disk_read_mb_s']:>10.0f}"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
