"""The parallel sequences' states on disk (`serve --parallel N`): engine_ext.disk_cache's files, one per saved state.

A sequence's state is saved when its request finishes (it goes idle: a `kill -9` after that loses nothing), and
again before its cells are given to another prompt (evicted) or the model goes (the server stops) when it changed
since. A request whose prompt starts with a saved state gets it back into its sequence (llama_state_seq_set_data_ext,
then cut back to the common prefix, or a checkpoint of a recurrent memory) when that spares more than what the
sequences and host memory hold. llama.cpp copies a sequence's state out on the decoding thread (one copy of its
cells); the hashing and writing happen in the disk cache's writer thread, so the other sequences go on decoding.

The files are the single sequence's (the same header, checksums and budget, the same key for the same model, build,
KV types and steering mix), so what one path saved the other restores. Images: a span's token id is this process's
own (engine_ext.vision), so a state is saved with each image chunk as its place among the images (-1, -2, ...) and
keyed by the images' identities (content hash, chunk) and the projector's: cells computed from other images are never
restored.
"""

from __future__ import annotations

import ctypes
import functools
import time
from collections.abc import Hashable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from engine_ext.bindings import C
from engine_ext.disk_cache import MIN_GAIN_TOKENS, DiskCache, DiskCacheError, StateFile, model_identity
from engine_ext.model import Context
from engine_ext.seq_batch import seq_remove
from engine_ext.speculative.base import common_prefix_length

if TYPE_CHECKING:
    from engine_ext.vision import Vision

MAX_SEQ_CHECKPOINTS = 8  # a recurrent sequence's checkpoints kept (its conversation's last prompt ends)
Images = list[list[object]]  # each image chunk met: [its image's sha256, the chunk's index among the image's parts]


class SeqDisk:
    """The disk cache seen from the parallel sequences of one context."""

    def __init__(self, disk: DiskCache, ctx: Context, *, whole_state: bool, vision: Vision | None) -> None:
        self.disk = disk
        self.ctx = ctx
        self.whole_state = whole_state  # a recurrent memory: restored whole, or at one of the file's checkpoints
        self.vision = vision
        self._saved: dict[int, tuple[Hashable, tuple[int, ...]]] = {}  # seq -> (mix, tokens) its file holds
        # seq -> checkpoints of a recurrent memory: (mix, tokens, the state's recurrent part after them)
        self._checkpoints: dict[int, list[tuple[Hashable, tuple[int, ...], bytes]]] = {}
        self.notices: list[str] = []  # files refused since the last take_notices

    def take_notices(self) -> tuple[str, ...]:
        notices, self.notices = (*self.notices, *self.disk.take_notices()), []
        return notices

    # ----- saving --------------------------------------------------------------------------------------

    def save(self, seq: int, tokens: Sequence[int], mix: tuple[Hashable, ...], *, final: bool = False) -> None:
        """Save what sequence `seq` holds (`tokens`, computed under `mix`), unless its file holds it already, or
        (but `final`: evicted, stopping) it only added fewer than MIN_GAIN_TOKENS to the state saved last."""
        disk = self.disk
        held = tuple(tokens)
        if disk.read_only or not held or self._saved.get(seq) == (mix, held):
            return
        saved_mix, saved = self._saved.get(seq, ((), ()))
        grew = saved_mix == mix and common_prefix_length(saved, held) == len(saved)
        if not final and grew and len(held) - len(saved) < MIN_GAIN_TOKENS:
            return
        stable = stable_tokens(held, self.vision)
        if stable is None:
            return
        size = int(C.llama_state_seq_get_size_ext(self.ctx.handle, seq, 0))
        if size <= 0:
            return
        buf = (ctypes.c_uint8 * size)()
        if int(C.llama_state_seq_get_data_ext(self.ctx.handle, buf, size, seq, 0)) != size:
            self.notices.append(f"prompt cache: llama.cpp did not copy out sequence {seq}'s state; it is not saved")
            return
        checkpoints = [
            (len(t), data) for m, t, data in self._checkpoints.get(seq, ()) if m == mix and held[: len(t)] == t
        ]
        disk.save(
            stable[0],
            memoryview(buf).cast("B"),
            checkpoints,
            key=images_key(disk, stable[1], self.vision, [repr(e) for e in mix]),
        )
        self._saved[seq] = (mix, held)

    def checkpoint(self, seq: int, tokens: Sequence[int], mix: tuple[Hashable, ...]) -> None:
        """Keep the recurrent part of sequence `seq`'s state after `tokens` (a prompt, before its reply), saved with
        its state: a later prompt that shares the prompt but not the reply is restored at it."""
        if not self.whole_state or self.disk.read_only or not tokens:
            return
        flags = C.LLAMA_STATE_SEQ_FLAGS_PARTIAL_ONLY
        size = int(C.llama_state_seq_get_size_ext(self.ctx.handle, seq, flags))
        buf = (ctypes.c_uint8 * max(size, 1))()
        if size <= 0 or int(C.llama_state_seq_get_data_ext(self.ctx.handle, buf, size, seq, flags)) != size:
            return
        held = tuple(tokens)
        kept = [cp for cp in self._checkpoints.get(seq, ()) if cp[0] == mix and held[: len(cp[1])] == cp[1]]
        self._checkpoints[seq] = [*kept[-(MAX_SEQ_CHECKPOINTS - 1) :], (mix, held, bytes(buf))]

    def forget(self, seq: int) -> None:
        """Sequence `seq` holds something else now (a slot restored from a file or erased): saved again when it
        goes idle."""
        self._saved.pop(seq, None)
        self._checkpoints.pop(seq, None)

    def save_all(self, slots: Sequence[Any]) -> None:
        """Save each sequence's state that changed since its last save (the model goes: the server stops); `slots`:
        engine_ext.parallel's, each with its sequence, tokens and mix."""
        for slot in slots:
            if slot.tokens:
                self.save(slot.seq, slot.tokens, slot.mix, final=True)

    # ----- restoring -----------------------------------------------------------------------------------

    def restore(self, seq: int, tokens: Sequence[int], mix: tuple[Hashable, ...], have: int) -> int | None:
        """Make sequence `seq` hold the longest prefix of `tokens` (all but the last) a file of `mix` gives, when it
        is longer than `have` by MIN_GAIN_TOKENS: its length; 0 when a file passed its checks and llama.cpp still
        refused it (the sequence emptied); None when no file gives more (the sequence untouched)."""
        if len(tokens) - 1 < have + MIN_GAIN_TOKENS:
            return None
        steering = [repr(entry) for entry in mix]
        found = best_state(
            self.disk, tokens[: len(tokens) - 1], have, self.vision, truncatable=not self.whole_state, steering=steering
        )
        if found is None:
            return None
        header, usable = found
        t0 = time.perf_counter()
        try:
            state, checkpoints = self.disk.load(header)
        except FileNotFoundError:  # evicted by a save meanwhile
            return None
        except DiskCacheError as error:
            self.notices.append(str(error))
            return None
        ctx = self.ctx
        seq_remove(ctx, seq, -1)
        self._saved.pop(seq, None)
        self._checkpoints.pop(seq, None)
        if not _set_state(ctx, seq, state, 0) or not self._cut(seq, usable, len(header.tokens), checkpoints):
            seq_remove(ctx, seq, -1)
            self.notices.append(f"prompt cache: llama.cpp refused the state in {header.path}; evaluated instead")
            return 0
        self._saved[seq] = (mix, tuple(tokens[:usable]))
        self._checkpoints[seq] = [(mix, tuple(tokens[:n]), bytes(d)) for n, d in checkpoints if n <= usable]
        print(
            f"--- prompt cache: {usable} tokens restored into sequence {seq} from {header.path.name} "
            f"({header.payload_size >> 20} MiB) in {(time.perf_counter() - t0) * 1000.0:.0f} ms",
            flush=True,
        )
        return usable

    def restore_into(self, slot: Any, tokens: Sequence[int], mix: tuple[Hashable, ...], have: int) -> bool:
        """`restore` into an engine_ext.parallel slot (its sequence and tokens); False: the slot untouched."""
        restored = self.restore(slot.seq, tokens, mix, have)
        if restored is None:
            return False
        slot.tokens = list(tokens[:restored])  # 0: refused by llama.cpp, the sequence emptied
        return True

    def _cut(self, seq: int, usable: int, n_saved: int, checkpoints: list[tuple[int, memoryview]]) -> bool:
        """Cut sequence `seq` (holding `n_saved` tokens) back to `usable`: a KV cache drops the rest, a recurrent
        memory takes the checkpoint there (its KV part, of a hybrid model, then dropped past it)."""
        if usable >= n_saved:
            return True
        if self.whole_state:
            data = next((d for n, d in checkpoints if n == usable), None)
            if data is None or not _set_state(self.ctx, seq, data, C.LLAMA_STATE_SEQ_FLAGS_PARTIAL_ONLY):
                return False
        return seq_remove(self.ctx, seq, usable) or self.whole_state


def stable_tokens(tokens: Sequence[int], vision: Vision | None) -> tuple[tuple[int, ...], Images] | None:
    """`tokens` as a state file holds them (each image span's id as its chunk's place among the images, -1 first)
    and the images' identities in that order; None when a span is not this projector's."""
    if not tokens or min(tokens) >= 0:
        return tuple(tokens), []
    if vision is None:
        return None
    images: Images = []
    places: dict[int, int] = {}
    out = []
    for token in tokens:
        if token >= 0:
            out.append(token)
            continue
        place = places.get(token)
        if place is None:
            identity = vision.span_key(token)
            if identity is None:
                return None
            images.append(list(identity))
            place = places[token] = -len(images)
        out.append(place)
    return tuple(out), images


def images_key(disk: DiskCache, images: Images, vision: Vision | None, steering: object = None) -> str:
    """The key of `disk`'s states under `steering` (None: its own mix) after `images` through `vision`'s projector
    (no image: the text-only key)."""
    if not images:
        return disk.key_of(steering)
    assert vision is not None
    path = Path(vision.path).resolve()
    st = path.stat()
    return disk.key_of(steering, images, _projector_identity(str(path), st.st_size, st.st_mtime_ns))


@functools.lru_cache(maxsize=8)
def _projector_identity(path: str, _size: int, _mtime_ns: int) -> dict[str, object]:
    return model_identity(Path(path))


def best_state(
    disk: DiskCache,
    tokens: Sequence[int],
    have: int,
    vision: Vision | None,
    *,
    truncatable: bool,
    steering: object = None,
) -> tuple[StateFile, int] | None:
    """The saved state (of `steering`, None: the disk's own mix) giving the most of `tokens` (more than `have` by
    MIN_GAIN_TOKENS; images: a state after the same first images, or text only), and how many tokens."""
    stable = stable_tokens(tokens, vision)
    if stable is None:
        return None
    wanted, images = stable
    found = None
    for n_images in range(len(images) + 1):  # states after the first n images of the prompt (none: text only)
        key = images_key(disk, images[:n_images], vision, steering)
        hit = disk.best(wanted, have, truncatable=truncatable, key=key)
        if hit is not None and (found is None or hit[1] > found[1]):
            found = hit
    return found


def _set_state(ctx: Context, seq: int, data: memoryview, flags: int) -> bool:
    """Load a state this cache verified into sequence `seq` (llama.cpp's reader is not for hostile bytes)."""
    buf = (ctypes.c_uint8 * len(data)).from_buffer(data)
    return int(C.llama_state_seq_set_data_ext(ctx.handle, buf, len(data), seq, flags)) == len(data)


def seq_disk_of(disk: DiskCache | None, ctx: Context, whole_state: bool, vision: Vision | None) -> SeqDisk | None:
    """The parallel sequences' view of the session's disk cache (None when it is off or one file: `run`'s)."""
    if disk is None or disk.single_file is not None:
        return None
    return SeqDisk(disk, ctx, whole_state=whole_state, vision=vision)
