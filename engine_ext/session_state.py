"""What the Session's sequence 0 holds, kept: checkpoints in memory, and the prompt cache on disk (a prompt's longest
prefix restored from a state file, a whole file restored for llama-server's slot restore, the state saved after a
reply)."""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

from engine_ext.disk_cache import MIN_GAIN_TOKENS, DiskCache, DiskCacheError, StateFile
from engine_ext.model import Checkpoint, Context
from engine_ext.params import EngineError
from engine_ext.seq_disk import best_state, images_key, stable_tokens
from engine_ext.speculative.base import common_prefix_length
from engine_ext.speculative.driver import SpeculativeDriver

MAX_CHECKPOINTS = 8


class SessionState:
    """`engine_ext.generate.Session`'s checkpoints and state files; the first attributes are the Session's."""

    ctx: Context
    cached: list[int]  # tokens whose state is in sequence 0, in order
    checkpoints: list[Checkpoint]
    uses_checkpoints: bool
    spec: SpeculativeDriver | None
    disk: DiskCache | None = None  # the prompt cache on disk (engine_ext.disk_cache), when it is on
    vision: Any  # engine_ext.vision.Vision: image spans saved by their images' identity (engine_ext.seq_disk)
    _saved: tuple[int, ...] = ()  # the tokens whose state was last saved to disk
    restored_tokens = 0  # tokens the last prompt took from a state file
    restored_ms = 0.0  # the time that took (reading, checking, llama.cpp loading it)
    _disk_notices: tuple[str, ...] = ()  # state files refused for this request

    def reset_cache(self) -> None:
        """Forget what the context holds (the next prompt is evaluated in full)."""
        self.ctx.clear()
        self.cached = []
        self.checkpoints = []
        self._saved = ()

    def _checkpoint(self) -> None:
        if not self.uses_checkpoints or not self.cached:
            return
        key = tuple(self.cached)
        self.checkpoints = [cp for cp in self.checkpoints if cp.tokens != key]
        self.checkpoints.append(self.ctx.save_checkpoint(key))
        del self.checkpoints[:-MAX_CHECKPOINTS]

    def _restore_from_disk(self, tokens: Sequence[int], n_common: int) -> int | None:
        """Make sequence 0 hold the longest prefix of `tokens` a state file gives, when it is longer than what the
        memory holds (`n_common`) by MIN_GAIN_TOKENS; its length, or None (the memory as it was, or cleared when a
        file passed its checks and llama.cpp still refused it). A refused file is a notice of the reply."""
        disk = self.disk
        if disk is None or n_common + MIN_GAIN_TOKENS > len(tokens) - 1:
            return None  # the memory holds (nearly) all a file could give
        if self.spec is not None and self.spec.reads_batches:
            return None  # model drafters must see every row
        wanted = tokens[: len(tokens) - 1]
        found = best_state(disk, wanted, n_common, self.vision, truncatable=not self.uses_checkpoints)
        if found is None:
            return None
        header, usable = found
        try:
            restored = self._load_state(disk, header, usable)
        except DiskCacheError as error:
            self._disk_notices += (str(error),)
            return None
        if restored is not None and min(wanted) < 0:  # a file's image places as this process's span ids
            self.cached = list(tokens[:restored])
            kept = [c for c in self.checkpoints if len(c.tokens) <= restored]
            self.checkpoints = [Checkpoint(tuple(tokens[: len(c.tokens)]), c.data) for c in kept]
            self._saved = tuple(self.cached)
        return restored

    def _load_state(self, disk: DiskCache, header: StateFile, usable: int) -> int | None:
        """Make sequence 0 hold the first `usable` tokens of a state file (read and checked whole first); its length,
        or None when the file was deleted meanwhile or no checkpoint gives `usable` (the memory as it was, or
        cleared). DiskCacheError when the file or llama.cpp refuses it (the memory cleared)."""
        t0 = time.perf_counter()
        try:
            state, checkpoints = disk.load(header)
        except FileNotFoundError:  # evicted by the last save's thread meanwhile
            return None
        self.ctx.clear()
        self.cached, self.checkpoints = [], []
        if not self.ctx.set_sequence_state(state):
            self.ctx.clear()
            raise DiskCacheError(f"prompt cache: llama.cpp refused the state in {header.path}; evaluated instead")
        self.cached = list(header.tokens)
        self.checkpoints = [Checkpoint(header.tokens[:n], bytes(data)) for n, data in checkpoints]
        if usable < len(self.cached) and (self.uses_checkpoints or not self.ctx.truncate(usable)):
            checkpoint = next((cp for cp in self.checkpoints if len(cp.tokens) == usable), None)
            if checkpoint is None:  # a memory that cannot be cut back, and no checkpoint there
                self.reset_cache()
                return None
            self.ctx.restore_checkpoint(checkpoint)
        del self.cached[usable:]
        self.restored_tokens = usable
        self.restored_ms = (time.perf_counter() - t0) * 1000.0
        self._saved = tuple(header.tokens)
        print(
            f"--- prompt cache: {usable} tokens restored from {header.path.name} "
            f"({header.payload_size >> 20} MiB) in {self.restored_ms:.0f} ms",
            flush=True,
        )
        return usable

    def restore_file(self, disk: DiskCache) -> int:
        """All of `disk`'s one file restored into sequence 0 (llama-server's slot restore); its tokens. DiskCacheError
        (one line) when the file is refused; the memory is then as it was, or empty."""
        assert disk.single_file is not None
        header = disk.header_of(disk.single_file)
        restored = self._load_state(disk, header, len(header.tokens))
        if restored is None:
            raise DiskCacheError(f"prompt cache: {disk.single_file} was deleted while it was read")
        return restored

    def save_to_disk(self, *, final: bool = False) -> None:
        """Save what sequence 0 holds to the disk cache (after a reply was sent; `final`: before the model goes):
        llama.cpp copies the state out here, the cache hashes and writes it in its thread. Not while the last save is
        still being written (the next reply's save, or the final one, catches up: a save never waits for another),
        not when the memory only added fewer than MIN_GAIN_TOKENS to the last saved state (but the final save),
        A conversation with images is saved with each image chunk as its place among the images, keyed by their
        identity and the projector's (engine_ext.seq_disk)."""
        disk, cached = self.disk, self.cached
        if disk is None or disk.read_only or not cached or tuple(cached) == self._saved:
            return
        key = tuple(cached)
        n_same = common_prefix_length(self._saved, key)
        if not final and (disk.busy or (n_same == len(self._saved) and len(key) - n_same < MIN_GAIN_TOKENS)):
            return
        stable = stable_tokens(key, self.vision)
        if stable is None:  # an image span this projector does not know: nothing a restore could match
            return
        state_key = images_key(disk, stable[1], self.vision) if stable[1] else None
        disk.save(stable[0], self.ctx.sequence_state(), self._checkpoints_of(key), key=state_key)
        self._saved = key

    def save_file(self, disk: DiskCache) -> int:
        """All of sequence 0 saved to `disk`'s one file, written before this returns (llama-server's slot save); its
        tokens. EngineError (one line) when there is nothing to save or the file could not be written."""
        if not self.cached or min(self.cached) < 0:
            raise EngineError("the slot holds nothing to save" if not self.cached else "a prompt with images")
        key = tuple(self.cached)
        disk.save(key, self.ctx.sequence_state(), self._checkpoints_of(key))
        disk.wait()
        notices = disk.take_notices()
        if notices:
            raise EngineError(notices[0])
        return len(key)

    def _checkpoints_of(self, key: tuple[int, ...]) -> list[tuple[int, bytes]]:
        """The checkpoints on the way to `key`, as a state file lists them."""
        return [(len(cp.tokens), cp.data) for cp in self.checkpoints if key[: len(cp.tokens)] == cp.tokens]
