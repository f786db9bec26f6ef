"""llama-server's slot actions on the parallel sequences (`serve --parallel N --slot-save-path DIR`, `POST
/slots/{id}?action=save|restore|erase`): sequence `id` of the worker's ParallelScheduler (engine_ext.parallel) saved
to a file of the prompt cache's format, restored from one, or emptied.

The files are the single sequence's (`serve --parallel 1`, engine_ext.worker's `slot`): the same header, checksums,
size bound and key, owner-only, written whole before the answer; a restore reads and checks the whole file (its
header, the key of this model, build, KV layout and a steering mix, the payload's checksum, tokens of this vocabulary
that fit a sequence's context) before llama.cpp reads a byte of it. The state restored is what the sequence holds:
the next request whose prompt starts with its tokens is placed on it and reuses them (engine_ext.parallel's `_place`).

An action on a sequence that is answering a request waits until that reply ends, as llama-server defers it; it runs
after the step that ended the reply, before another request can take the sequence. Other sequences go on meanwhile.
"""

from __future__ import annotations

import ctypes
import time
import traceback
from pathlib import Path
from typing import Any

from engine_ext.bindings import C
from engine_ext.disk_cache import DiskCache, DiskCacheError, StateFile, read_state_header
from engine_ext.params import EngineError
from engine_ext.protocol import Failed, SlotAction, SlotDone
from engine_ext.seq_batch import seq_remove
from engine_ext.seq_disk import _set_state


def single_slot(worker: Any, request: SlotAction) -> None:
    """The action on the single sequence (`serve --parallel 1`): a state file of the prompt cache's format (checked
    whole before llama.cpp reads it: engine_ext.session_state), written at once (not in a thread)."""
    session = worker.session
    if session is None:
        raise EngineError("no model is loaded")
    t0 = time.perf_counter()
    if request.action == "erase":
        n_tokens = len(session.cached)
        session.reset_cache()
        worker.send(_done(request, n_tokens, 0, t0))
        return
    path = Path(request.path)
    files = DiskCache(path.parent, worker.disk_parts, single_file=path, model=Path(worker.model.path).name)
    n_tokens = session.save_file(files) if request.action == "save" else session.restore_file(files)
    worker.send(_done(request, n_tokens, path.stat().st_size, t0))


def take(worker: Any, request: SlotAction) -> None:
    """Run `request` (engine_ext.worker's Worker: its session, scheduler and `slot_waits`) on its sequence now, or
    after the reply that sequence is answering. EngineError for a slot id out of range or no model."""
    if worker.session is None:
        raise EngineError("no model is loaded")
    if worker.scheduler is None:
        worker._new_scheduler()
    scheduler = worker.scheduler
    if not scheduler.active:
        mixer = worker.mixer
        scheduler.activate(mixer.active.entries if mixer is not None and mixer.active is not None else ())
    n_slots = len(scheduler.slots)
    if not 0 <= request.slot < n_slots:
        raise EngineError(f"invalid slot id {request.slot}: this server has slots 0 to {n_slots - 1}")
    if scheduler.slots[request.slot].job is not None:
        worker.slot_waits.append(request)
        return
    _answer(worker, scheduler, request)


def run_waiting(worker: Any, scheduler: Any) -> None:
    """The waiting actions whose sequence went idle (after a step, before the next one admits a request)."""
    for request in [r for r in worker.slot_waits if scheduler.slots[r.slot].job is None]:
        worker.slot_waits.remove(request)
        _answer(worker, scheduler, request)


def drop_waiting(worker: Any, why: str, request_id: int | None = None) -> None:
    """End the waiting actions (of `request_id`, or all) with Failed: the client went away, or the model goes."""
    for request in [r for r in worker.slot_waits if request_id in (None, r.request_id)]:
        worker.slot_waits.remove(request)
        worker.send(Failed(request.request_id, "Cancelled" if request_id is not None else "EngineError", why))


def _answer(worker: Any, scheduler: Any, request: SlotAction) -> None:
    """Run the action; its SlotDone, or Failed in one line (the sequence as it was, or emptied)."""
    try:
        worker.send(run(scheduler, request, worker.disk_parts, Path(worker.model.path).name))
    except Exception as exc:
        if not isinstance(exc, EngineError):
            traceback.print_exc()  # to the engine log: a bug, not a user's error
        worker.send(Failed.of(request.request_id, exc))


def run(scheduler: Any, request: SlotAction, parts: dict[str, object], model: str) -> SlotDone:
    """`request` on its idle sequence of `scheduler`, its files keyed by `parts` (the worker's disk_parts)."""
    t0 = time.perf_counter()
    slot = scheduler.slots[request.slot]
    disk = scheduler.disk  # the prompt cache's view of the sequences (None when it is off)
    if request.action == "erase":
        n_tokens = len(slot.tokens)
        seq_remove(scheduler.ctx, slot.seq, -1)
        slot.tokens = []
        if disk is not None:
            disk.forget(slot.seq)
        return _done(request, n_tokens, 0, t0)
    path = Path(request.path)
    files = DiskCache(path.parent, parts, single_file=path, model=model)
    if request.action == "save":
        n_tokens = save(scheduler, slot, files)
    else:
        n_tokens = restore(scheduler, slot, files)
        if disk is not None:
            disk.forget(slot.seq)
    return _done(request, n_tokens, path.stat().st_size, t0)


def _done(request: SlotAction, n_tokens: int, n_bytes: int, t0: float) -> SlotDone:
    ms = (time.perf_counter() - t0) * 1000.0
    return SlotDone(request.action, n_tokens, n_bytes, ms, request_id=request.request_id)


def save(scheduler: Any, slot: Any, files: DiskCache) -> int:
    """All of `slot`'s sequence written to `files`' one file before this returns; its tokens. EngineError (one line)
    when it holds nothing to save or the file could not be written."""
    tokens = tuple(slot.tokens)
    if not tokens:
        raise EngineError("the slot holds nothing to save")
    if min(tokens) < 0:
        raise EngineError("the slot holds a prompt with images: it is not saved to a file")
    if slot.seq in scheduler.drafts.pending:
        raise EngineError("the slot's recurrent state is rolled back at its next step: save it after one more reply")
    ctx = scheduler.ctx
    size = int(C.llama_state_seq_get_size_ext(ctx.handle, slot.seq, 0))
    buf = (ctypes.c_uint8 * max(size, 1))()
    if size <= 0 or int(C.llama_state_seq_get_data_ext(ctx.handle, buf, size, slot.seq, 0)) != size:
        raise EngineError(f"llama.cpp did not copy out sequence {slot.seq}'s state")
    files.save(tokens, memoryview(buf).cast("B"), [], key=files.key_of(_steering(slot.mix)))
    files.wait()
    notices = files.take_notices()
    if notices:
        raise EngineError(notices[0])
    return len(tokens)


def restore(scheduler: Any, slot: Any, files: DiskCache) -> int:
    """All of `files`' one file restored into `slot`'s sequence (checked whole first); its tokens. DiskCacheError (one
    line) when the file is refused: the sequence as it was, or emptied when llama.cpp refused the checked state."""
    assert files.single_file is not None
    header, mix = _checked_header(scheduler, files, files.single_file)
    try:
        state, _checkpoints = files.load(header)
    except FileNotFoundError:
        raise DiskCacheError(f"prompt cache: {header.path} was deleted while it was read") from None
    ctx = scheduler.ctx
    seq_remove(ctx, slot.seq, -1)
    slot.tokens = []
    scheduler.drafts.pending.discard(slot.seq)
    if not _set_state(ctx, slot.seq, state, 0):
        seq_remove(ctx, slot.seq, -1)
        raise DiskCacheError(f"prompt cache: llama.cpp refused the state in {header.path}; the slot is empty")
    slot.tokens, slot.mix = list(header.tokens), mix
    return len(header.tokens)


def _checked_header(scheduler: Any, files: DiskCache, path: Path) -> tuple[StateFile, tuple[Any, ...]]:
    """The file's checked header and the steering mix its key names (the server's, none, or a sequence's now)."""
    try:
        header = read_state_header(path, files.budget)
    except FileNotFoundError:
        raise DiskCacheError(f"prompt cache: {path.name} does not exist in the --slot-save-path folder") from None
    mixes = [scheduler.base_mix, (), *(s.mix for s in scheduler.slots)]
    mix = next((m for m in mixes if files.key_of(_steering(m)) == header.key), None)
    if mix is None:
        raise DiskCacheError(f"prompt cache: {path.name} was saved for another model file, engine build or settings")
    n_vocab = scheduler.model.n_vocab
    if any(not 0 <= t < n_vocab for t in header.tokens):
        raise DiskCacheError(f"prompt cache: {path.name} holds tokens that are not this model's")
    if len(header.tokens) > scheduler.n_ctx_seq:
        raise DiskCacheError(
            f"prompt cache: {path.name} holds {len(header.tokens)} tokens; a slot's context is {scheduler.n_ctx_seq}"
        )
    return header, mix


def _steering(mix: tuple[Any, ...]) -> list[str]:
    """A steering mix as the prompt cache's key names it (engine_ext.worker's disk_parts)."""
    return [repr(entry) for entry in mix]
