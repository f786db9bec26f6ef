"""Making a control vector from positive/negative prompt pairs (tools/cvector-generator, notes §4.4).

Each pair is rendered through the model's chat template, both sides padded to one length, evaluated from a
cleared memory; the input of layer il (= the output of layer il-1) is read for every token. Per layer the
differences positive − negative are reduced by PCA (dominant eigenvector of DᵀD, not mean-centred, as
upstream) or by their mean, stored as `direction.il` (upstream's index convention, so files interchange), and
oriented so that a positive strength moves toward the positive prompts.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Literal

import numpy as np

from engine_ext import bindings
from engine_ext.archs import LAYER_INPUT_ARCHS
from engine_ext.chat_prompt import render_chat
from engine_ext.model import Context, Model
from engine_ext.params import ContextParams, EngineError
from engine_ext.steering.cvec_file import ControlVector
from engine_ext.steering.prompt_sets import PromptSet

Method = Literal["pca", "mean"]
Phase = Literal["evaluating", "directions", "writing"]
PHASES: tuple[Phase, ...] = ("evaluating", "directions", "writing")
"""The steps of making a vector, in order: each prompt pair is evaluated, a direction is reduced per layer, the
file is written (the worker reports the last)."""
ProgressCallback = Callable[[Phase, int, int], None]
"""(phase, done, total): called with done = 0 when a phase begins and after each of its steps."""
ROW_EPSILON = 1e-6  # upstream keeps a difference row only if some element exceeds this


def pca_direction(diffs: np.ndarray) -> np.ndarray:
    """Unit dominant eigenvector of DᵀD (upstream's power iteration, solved exactly).

    The n_embd × n_embd Gram matrix is much smaller than D (rows = tokens × pairs), so eigh on it is ~3× faster
    than an SVD of D for the same vector.
    """
    d = diffs.astype(np.float64)
    _, vectors = np.linalg.eigh(d.T @ d)
    return np.asarray(vectors[:, -1], dtype=np.float64)


def mean_direction(diffs: np.ndarray) -> np.ndarray:
    mean = np.asarray(diffs.astype(np.float64).mean(axis=0), dtype=np.float64)
    norm = float(np.linalg.norm(mean))
    return mean / norm if norm > 0 else mean


def reduce_differences(diffs: np.ndarray, method: Method) -> np.ndarray:
    """The direction for one layer, signed so the positive side projects positively."""
    rows = diffs[(diffs > ROW_EPSILON).any(axis=1)]
    if rows.shape[0] == 0:
        return np.zeros(diffs.shape[1], dtype=np.float32)
    direction = pca_direction(rows) if method == "pca" else mean_direction(rows)
    if float((rows @ direction).mean()) < 0:
        direction = -direction
    return direction.astype(np.float32)


def make_control_vector(
    model: Model,
    prompt_set: PromptSet,
    *,
    method: Method = "pca",
    n_threads: int = 0,
    progress: ProgressCallback | None = None,
) -> ControlVector:
    """Evaluate every pair on a fresh context of `model` and reduce the per-layer differences, saying so through
    `progress` as each pair is evaluated ("evaluating", n, pairs) and each layer reduced ("directions", k, layers)."""
    arch = model.architecture
    if arch not in LAYER_INPUT_ARCHS:
        raise EngineError(
            f"making control vectors needs the per-layer hidden states, which llama.cpp's {arch} graph does "
            "not expose; make the vector with llama.cpp's cvector-generator and load the file here"
        )
    n_layer, n_embd = model.n_layer, model.n_embd
    template = model.chat_template
    bos = model.token_text(model.bos_token) if model.bos_token >= 0 else ""
    eos = model.token_text(model.eos_token) if model.eos_token >= 0 else ""

    def tokens_of(text: str) -> list[int]:
        rendered = render_chat(template, [{"role": "user", "content": text}], bos_token=bos, eos_token=eos)
        toks = model.tokenize(rendered, add_special=False, parse_special=True)
        if model.add_bos and model.bos_token >= 0 and (not toks or toks[0] != model.bos_token):
            toks.insert(0, model.bos_token)
        return toks

    pad = (model.tokenize(" ", add_special=False, parse_special=False) or [model.eos_token])[-1]
    encoded = [(tokens_of(p), tokens_of(n)) for p, n in prompt_set.pairs]
    longest = max(max(len(p), len(n)) for p, n in encoded)
    ctx = Context(
        model, ContextParams(n_ctx=longest + 8, n_batch=longest + 8, n_ubatch=longest + 8, n_threads=n_threads)
    )
    diffs: list[list[np.ndarray]] = [[] for _ in range(n_layer)]
    report: ProgressCallback = progress or (lambda phase, done, total: None)
    report("evaluating", 0, len(encoded))
    try:
        for il in range(1, n_layer):
            bindings.set_embeddings_layer_inp(ctx.handle, il, True)
        for index, (pos, neg) in enumerate(encoded):
            length = max(len(pos), len(neg))
            pos = pos + [pad] * (length - len(pos))
            neg = neg + [pad] * (length - len(neg))
            hidden = [_layer_inputs(ctx, toks, n_layer, n_embd) for toks in (pos, neg)]
            for il in range(1, n_layer):
                diffs[il].append(hidden[0][il] - hidden[1][il])
            report("evaluating", index + 1, len(encoded))
    finally:
        ctx.close()
    # PCA of each layer's differences is most of the time on a wide model: one step per layer.
    directions: dict[int, np.ndarray] = {}
    report("directions", 0, n_layer - 1)
    for il in range(1, n_layer):
        directions[il] = reduce_differences(np.concatenate(diffs[il]), method)
        diffs[il] = []  # the rows of a reduced layer are not needed again
        report("directions", il, n_layer - 1)
    return ControlVector(
        directions,
        model_hint=arch,
        metadata={
            "llmtui.prompt_set": prompt_set.name,
            "llmtui.positive": prompt_set.positive_label,
            "llmtui.negative": prompt_set.negative_label,
            "llmtui.method": method,
            "llmtui.model": model.path.name,
            "llmtui.pairs": str(len(prompt_set.pairs)),
        },
    )


def _layer_inputs(ctx: Context, tokens: Sequence[int], n_layer: int, n_embd: int) -> list[np.ndarray]:
    """Input rows of every layer 1..n_layer-1 for `tokens` evaluated from an empty memory."""
    ctx.clear()
    ctx.decode(tokens, 0)
    out: list[np.ndarray] = [np.zeros((0, n_embd), dtype=np.float32)]
    for il in range(1, n_layer):
        ptr = bindings.get_embeddings_layer_inp(ctx.handle, il)
        if not ptr:
            raise EngineError(f"llama.cpp returned no hidden states for layer {il}")
        out.append(np.ctypeslib.as_array(ptr, shape=(len(tokens), n_embd)).copy())
    return out
