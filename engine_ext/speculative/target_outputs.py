"""Extra outputs drafters ask of the target context, counted per context so several drafters can share one.

draft-mtp and draft-eagle3 (a target layer id equal to n_layer) both turn on the target's final hidden state
(`llama_set_embeddings_nextn`); draft-eagle3 and draft-dflash both turn on layer inputs
(`llama_set_embeddings_layer_inp`). A drafter that turned an output on releases it when it closes; the output
goes off only when no other drafter still holds it.
"""

from __future__ import annotations

from weakref import WeakKeyDictionary

from engine_ext import bindings
from engine_ext.bindings import ext
from engine_ext.model import Context, ContextError

NEXTN = -1  # the key of the final hidden state among the layer ids

_held: WeakKeyDictionary[Context, dict[int, int]] = WeakKeyDictionary()


def _set(ctx: Context, key: int, on: bool) -> None:
    if key == NEXTN:
        ext.llama_set_embeddings_nextn(ctx.handle, on, False)
    else:
        bindings.set_embeddings_layer_inp(ctx.handle, key, on)


def acquire(ctx: Context, key: int) -> None:
    """Turn the output on (NEXTN, or the input of layer `key`) for one more holder."""
    counts = _held.setdefault(ctx, {})
    if counts.get(key, 0) == 0:
        _set(ctx, key, True)
    counts[key] = counts.get(key, 0) + 1


def release(ctx: Context, key: int) -> None:
    """One holder is done with the output; it goes off with the last one."""
    counts = _held.get(ctx)
    if counts is None or counts.get(key, 0) <= 0:
        return
    counts[key] -= 1
    if counts[key] == 0:
        del counts[key]
        try:
            _set(ctx, key, False)
        except ContextError:  # the context is closed: nothing left to turn off
            pass


def holders(ctx: Context, key: int) -> int:
    """How many drafters hold the output now."""
    return _held.get(ctx, {}).get(key, 0)
