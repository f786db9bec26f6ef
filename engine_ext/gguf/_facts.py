"""What a GGUF file says about its model (GGUFInfo, DraftInfo, SSMParams), read from the header(s) only: inspect_gguf
for a local file or split model, inspect_gguf_reader for a remote one, read_chat_template."""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from engine_ext.gguf._layers import (
    RECURRENT_TYPE,
    classify_layers,
    find_moe_variant,
    layout_string,
    sliding_window_layers,
)
from engine_ext.gguf._metadata import MAX_SPLITS, IntOrLayers, Metadata, per_layer_values
from engine_ext.gguf._reader import (
    GGML_TYPES,
    HINT_CORRUPT,
    MAX_COUNT,
    VT,
    Header,
    ReadAt,
    TensorInfo,
    gguf_error,
    guarded,
    open_file_source,
    read_header,
    read_header_through,
    some_items,
    validation_error,
)
from engine_ext.gguf._validate import check_hparams
from engine_ext.params import ascii_digits
from engine_ext.untrusted_text import shown


@dataclass(frozen=True)
class SSMParams:
    """Recurrent-layer sizes ({arch}.ssm.*, wkv, shortconv, kda); None where the key is absent."""

    conv_kernel: int | None = None
    inner_size: int | None = None
    state_size: int | None = None
    group_count: int | None = None
    time_step_rank: int | None = None
    wkv_head_size: int | None = None
    token_shift_count: int | None = None
    shortconv_l_cache: int | None = None
    kda_head_dim: int | None = None


@dataclass(frozen=True)
class DraftInfo:
    """Speculative-draft facts: what llama.cpp would auto-detect this file as, and the draft keys."""

    draft_type: str | None = None  # None, "draft-mtp", "dflash", "dflash2", "dspark", "eagle3"
    target_layers: tuple[int, ...] | None = None
    target_hidden_size: int | None = None
    block_size: int | None = None
    mask_token_id: int | None = None
    sample_from_anchor: bool | None = None  # absent means true for DSpark
    has_confidence_head: bool | None = None
    causal_attention: bool | None = None
    selector_top_k: int | None = None


@dataclass(frozen=True)
class GGUFInfo:
    """What a GGUF file (with its split shards) says about the model, read from headers only.

    Per-layer values (``head_count``, ``expert_used_count``, ...) are an int when the file stores a scalar and
    a tuple (one entry per block, MTP blocks included) when it stores an array, exactly as stored.
    """

    path: str
    file_size: int
    total_size: int
    gguf_version: int
    alignment: int
    n_kv: int
    n_tensors: int
    architecture: str | None
    name: str | None
    file_type: int | None
    file_type_label: str
    file_type_guessed: bool
    n_params: int
    weights_bytes: int
    tensor_types: dict[str, int]
    tensor_type_bytes: dict[str, int]
    context_length: int | None
    embedding_length: int | None
    block_count: int | None
    n_layer_nextn: int
    n_layer_trunk: int | None
    feed_forward_length: IntOrLayers | None
    head_count: IntOrLayers | None
    head_count_kv: IntOrLayers | None  # as stored, else head_count (llama.cpp's default)
    key_length: int | None  # per-head K size: stored, else embedding_length / head_count[0]
    value_length: int | None
    key_length_swa: int | None
    value_length_swa: int | None
    is_mla: bool
    sliding_window: int | None
    swa_layers: tuple[bool, ...] | None
    layer_kinds: tuple[str, ...]
    recurrent_type: str | None
    ssm: SSMParams
    expert_count: int | None
    expert_used_count: IntOrLayers | None
    expert_feed_forward_length: IntOrLayers | None
    expert_shared_count: int | None
    expert_shared_feed_forward_length: int | None
    moe_variant: str | None
    is_mtp_sidecar: bool
    draft: DraftInfo
    vocab_size: int | None
    tokenizer_model: str | None
    tokenizer_pre: str | None
    bos_token_id: int | None
    eos_token_id: int | None
    has_chat_template: bool
    chat_template_names: tuple[str, ...]
    sampling_defaults: dict[str, Any]
    split_count: int
    split_paths: tuple[str, ...]
    split_missing: tuple[str, ...]
    warnings: tuple[str, ...] = field(default=())
    # weight bytes of each block `blk.N.*` (index N; MTP blocks included) and of the output head (`output.*`,
    # `output_norm.*`, or a duplicate of token_embd when tied): what one more GPU layer costs (engine_ext.placement)
    layer_weights_bytes: tuple[int, ...] = field(default=())
    output_weights_bytes: int = 0

    @property
    def draft_type(self) -> str | None:
        """Shortcut for ``draft.draft_type``."""
        return self.draft.draft_type

    @property
    def layout(self) -> str:
        """Compact layer layout, e.g. ``"A M E M E + 1 MTP"``."""
        return layout_string(self.layer_kinds)

    def to_dict(self) -> dict[str, Any]:
        """A JSON-safe dict (tuples become lists) with the derived ``layout`` and ``draft_type``."""
        out = json_safe(asdict(self))
        assert isinstance(out, dict)
        out["layout"] = self.layout
        out["draft_type"] = self.draft_type
        return out


def json_safe(value: Any) -> Any:
    if isinstance(value, dict):
        return {str(k): json_safe(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [json_safe(v) for v in value]
    if isinstance(value, float) and value != value:  # NaN is not JSON
        return None
    return value


# llama_ftype_name() in src/llama-model-loader.cpp
# fmt: off
_FTYPE_LABELS: dict[int, str] = {
    0: "all F32", 1: "F16", 32: "BF16", 40: "Q1_0", 41: "Q2_0", 2: "Q4_0", 3: "Q4_1", 8: "Q5_0", 9: "Q5_1",
    7: "Q8_0", 38: "MXFP4 MoE", 39: "NVFP4", 10: "Q2_K - Medium", 21: "Q2_K - Small", 11: "Q3_K - Small",
    12: "Q3_K - Medium", 13: "Q3_K - Large", 14: "Q4_K - Small", 15: "Q4_K - Medium", 16: "Q5_K - Small",
    17: "Q5_K - Medium", 18: "Q6_K", 36: "TQ1_0 - 1.69 bpw ternary", 37: "TQ2_0 - 2.06 bpw ternary",
    19: "IQ2_XXS - 2.0625 bpw", 20: "IQ2_XS - 2.3125 bpw", 28: "IQ2_S - 2.5 bpw", 29: "IQ2_M - 2.7 bpw",
    22: "IQ3_XS - 3.3 bpw", 23: "IQ3_XXS - 3.0625 bpw", 24: "IQ1_S - 1.5625 bpw", 31: "IQ1_M - 1.75 bpw",
    25: "IQ4_NL - 4.5 bpw", 30: "IQ4_XS - 4.25 bpw", 26: "IQ3_S - 3.4375 bpw", 27: "IQ3_S mix - 3.66 bpw",
}
_FTYPE_GUESSED = 1024
# ggml type id of the most common tensor type -> llama_ftype (src/llama-model-loader.cpp, "guessed" file type)
_FTYPE_FROM_TENSOR_TYPE: dict[int, int] = {
    0: 0, 1: 1, 30: 32, 2: 2, 3: 3, 6: 8, 7: 9, 8: 7, 10: 10, 11: 12, 12: 15, 13: 17, 14: 18, 34: 36, 35: 37,
    16: 19, 17: 20, 22: 28, 18: 23, 19: 24, 29: 31, 20: 25, 23: 30, 21: 26, 40: 39, 41: 40, 42: 41,
}
# fmt: on

_SPLIT_NAME = re.compile(r"^(?P<prefix>.*)-(?P<no>\d{5})-of-(?P<count>\d{5})\.gguf$")


def _split_siblings(path: Path, split_count: int) -> list[Path] | None:
    match = _SPLIT_NAME.match(path.name)
    if match is None:
        return None
    prefix = match.group("prefix")
    return [path.with_name(f"{prefix}-{i:05d}-of-{split_count:05d}.gguf") for i in range(1, split_count + 1)]


def _split_fields(path: Path | str, meta: Metadata) -> tuple[int, int]:
    """split.count and split.no, checked (llama_split_path names shards -%05d-of-%05d)."""
    count = meta.checked_int("split.count", path, 0, MAX_SPLITS)
    number = meta.checked_int("split.no", path, 0, MAX_SPLITS - 1)
    meta.checked_int("split.tensors.count", path, 0, MAX_COUNT)
    split_count = count or 1
    split_no = number or 0
    if split_no >= split_count:
        raise validation_error(path, f"split.no is {split_no} but split.count is {split_count}", HINT_CORRUPT)
    return split_count, split_no


def inspect_gguf(path: Path) -> GGUFInfo:
    """Validate and describe a GGUF model from its header(s); weights are never read.

    For a split model pass any shard: the first shard's metadata is used and the sizes and tensors of every
    shard found beside it are summed; missing shards are listed in ``split_missing``. Raises GGUFError (or its
    subclass GGUFValidationError) and nothing else, with a one-line message of at most 300 characters.
    """
    path = Path(path)
    return guarded(path, lambda: _inspect_gguf(path))


def _inspect_gguf(path: Path) -> GGUFInfo:
    head = read_header(path)
    meta = Metadata(head.kv, None)
    split_count, split_no = _split_fields(path, meta)
    warnings: list[str] = []
    headers = [head]
    split_paths = [str(path)]
    missing: list[str] = []
    if split_count > 1:
        match = _SPLIT_NAME.match(path.name)
        if match is not None and int(match.group("count")) != split_count:
            raise validation_error(
                path,
                f"split.count says {split_count} shards but the file name says {int(match.group('count'))} "
                "(llama.cpp refuses the name)",
                "re-download the shards, or restore their original names",
            )
        siblings = _split_siblings(path, split_count)
        if split_no != 0:
            if siblings is not None and siblings[0].name == path.name:
                raise validation_error(
                    path,
                    f"split.no says this is shard {split_no + 1} of {split_count}, but its name says it is the first",
                    "the file is corrupt, re-download it",
                )
            if siblings is not None and siblings[0].exists():
                return _inspect_gguf(siblings[0])  # its own split.no is checked against its name there
            raise gguf_error(
                path,
                f"is shard {split_no + 1} of {split_count} of a split model and the first shard "
                f"({siblings[0].name if siblings else '…-00001-of-….gguf'}) is not beside it",
                "download all shards and pass the -00001- file",
            )
        if siblings is None:
            warnings.append(
                f"split model with {split_count} shards, but the file name does not follow "
                "<name>-00001-of-0000N.gguf, so the other shards cannot be located"
            )
            missing = [f"shard {i}" for i in range(2, split_count + 1)]
        else:
            for index, sibling in enumerate(siblings[1:], start=1):
                if not sibling.exists():
                    missing.append(str(sibling))
                    continue
                shard = read_header(sibling)
                shard_no = Metadata(shard.kv, None).int_value("split.no")
                if shard_no is not None and shard_no != index:
                    warnings.append(f"{sibling.name} says it is shard {shard_no + 1}, expected {index + 1}")
                headers.append(shard)
                split_paths.append(str(sibling))
        if missing:
            warnings.append(f"{len(missing)} of {split_count} shards are missing: " + some_items(missing))
        expected_tensors = meta.int_value("split.tensors.count")
        found_tensors = sum(len(h.tensors) for h in headers)
        if not missing and expected_tensors is not None and expected_tensors != found_tensors:
            warnings.append(f"split.tensors.count is {expected_tensors} but the shards hold {found_tensors}")
    return _build_info(path, headers, split_count, tuple(split_paths), tuple(missing), warnings)


def _build_info(
    path: Path,
    headers: list[Header],
    split_count: int,
    split_paths: tuple[str, ...],
    missing: tuple[str, ...],
    warnings: list[str],
) -> GGUFInfo:
    head = headers[0]
    arch_value = head.kv.get("general.architecture")
    arch = arch_value.value if arch_value is not None and isinstance(arch_value.value, str) else None
    meta = Metadata(head.kv, arch)
    check_hparams(path, meta)
    tensors = [t for h in headers for t in h.tensors]
    names = {t.name for t in tensors}

    counts, type_bytes = _tensor_types(tensors)
    file_type, label, guessed = _file_type(meta, tensors)
    block_count = meta.arch_int("block_count")
    n_nextn = meta.arch_int("nextn_predict_layers") or 0
    n_trunk = None if block_count is None else max(block_count - n_nextn, 0)
    n_embd = meta.arch_int("embedding_length")
    head_count = meta.arch_int_or_layers("attention.head_count")
    head_count_kv = meta.arch_int_or_layers("attention.head_count_kv")
    if head_count_kv is None:
        head_count_kv = head_count
    key_length, value_length = _head_lengths(meta, n_embd, head_count)
    expert_used = meta.arch_int_or_layers("expert_used_count")
    expert_ff = meta.arch_int_or_layers("expert_feed_forward_length")
    feed_forward = meta.arch_int_or_layers("feed_forward_length")
    expert_count = meta.arch_int("expert_count")

    layer_kinds = classify_layers(meta, block_count, n_nextn, head_count_kv, feed_forward, expert_used, expert_ff)
    moe_variant = find_moe_variant(arch, expert_count, expert_used, expert_ff, n_trunk)
    if expert_count and block_count:
        used = per_layer_values(expert_used, block_count)
        if arch == "nemotron_h_moe" and n_nextn and used[0] == 0:
            warnings.append(
                "expert_used_count[0] is 0: llama.cpp's MTP and warm-up paths use layer 0's top-k and crash "
                "(SIGFPE); keep the first entry non-zero"
            )

    recurrent = any("recurrent" in kind for kind in layer_kinds)
    recurrent_type = RECURRENT_TYPE.get(arch or "", "recurrent") if recurrent else None
    sliding_window = meta.arch_int("attention.sliding_window")
    swa_layers = sliding_window_layers(meta, arch, sliding_window, block_count, n_trunk or 0)

    is_sidecar = n_nextn > 0 and "blk.0.attn_norm.weight" not in names
    draft = _draft_info(meta, arch, block_count, names)
    warnings.extend(_draft_warnings(draft))
    layer_bytes, output_bytes = _weights_by_layer(tensors, names, block_count or 0)

    return GGUFInfo(
        path=str(path),
        file_size=head.file_size,
        total_size=sum(h.file_size for h in headers),
        gguf_version=head.version,
        alignment=head.alignment,
        n_kv=len(head.kv),
        n_tensors=len(tensors),
        architecture=_shown_or_none(arch),
        name=_shown_or_none(meta.str_value("general.name")),
        file_type=file_type,
        file_type_label=label,
        file_type_guessed=guessed,
        n_params=sum(t.n_elements for t in tensors),
        weights_bytes=sum(t.n_bytes for t in tensors),
        tensor_types=dict(counts.most_common()),
        tensor_type_bytes=dict(type_bytes.most_common()),
        context_length=meta.arch_int("context_length"),
        embedding_length=n_embd,
        block_count=block_count,
        n_layer_nextn=n_nextn,
        n_layer_trunk=n_trunk,
        feed_forward_length=feed_forward,
        head_count=head_count,
        head_count_kv=head_count_kv,
        key_length=key_length,
        value_length=value_length,
        key_length_swa=meta.arch_int("attention.key_length_swa"),
        value_length_swa=meta.arch_int("attention.value_length_swa"),
        is_mla=bool(meta.arch_int("attention.key_length_mla")) and bool(meta.arch_int("attention.value_length_mla")),
        sliding_window=sliding_window,
        swa_layers=swa_layers,
        layer_kinds=layer_kinds,
        recurrent_type=recurrent_type,
        ssm=_ssm_params(meta),
        expert_count=expert_count,
        expert_used_count=expert_used,
        expert_feed_forward_length=expert_ff,
        expert_shared_count=meta.arch_int("expert_shared_count"),
        expert_shared_feed_forward_length=meta.arch_int("expert_shared_feed_forward_length"),
        moe_variant=moe_variant,
        is_mtp_sidecar=is_sidecar,
        draft=draft,
        vocab_size=_vocab_size(meta, head),
        tokenizer_model=_shown_or_none(meta.str_value("tokenizer.ggml.model")),
        tokenizer_pre=_shown_or_none(meta.str_value("tokenizer.ggml.pre")),
        bos_token_id=meta.int_value("tokenizer.ggml.bos_token_id"),
        eos_token_id=meta.int_value("tokenizer.ggml.eos_token_id"),
        has_chat_template="tokenizer.chat_template" in head.kv,
        chat_template_names=tuple(
            sorted(
                k.removeprefix("tokenizer.chat_template.") for k in head.kv if k.startswith("tokenizer.chat_template.")
            )
        ),
        sampling_defaults={
            k.removeprefix("general.sampling."): v.value
            for k, v in head.kv.items()
            if k.startswith("general.sampling.") and v.vtype != int(VT.ARRAY)
        },
        split_count=split_count,
        split_paths=split_paths,
        split_missing=missing,
        layer_weights_bytes=tuple(layer_bytes),
        output_weights_bytes=output_bytes,
        warnings=tuple(warnings),
    )


def _head_lengths(meta: Metadata, n_embd: int | None, head_count: IntOrLayers | None) -> tuple[int | None, int | None]:
    """The attention key and value lengths: as the file says, else the embedding split over the first layer's heads."""
    n_head0 = (head_count if isinstance(head_count, int) else (head_count[0] if head_count else 0)) or 0
    key_length = meta.arch_int("attention.key_length")
    value_length = meta.arch_int("attention.value_length")
    if n_embd and n_head0:
        key_length = key_length if key_length is not None else n_embd // n_head0
        value_length = value_length if value_length is not None else n_embd // n_head0
    return key_length, value_length


def _vocab_size(meta: Metadata, head: Header) -> int | None:
    """The vocabulary's size: as the file says, else the tokenizer's token count."""
    tokens = head.kv.get("tokenizer.ggml.tokens")
    vocab_size = meta.arch_int("vocab_size")
    if vocab_size is None and tokens is not None and tokens.vtype == int(VT.ARRAY):
        vocab_size = tokens.count
    return vocab_size


def _tensor_types(tensors: list[TensorInfo]) -> tuple[Counter[str], Counter[str]]:
    """How many tensors of each ggml type, and their bytes."""
    counts: Counter[str] = Counter()
    type_bytes: Counter[str] = Counter()
    for t in tensors:
        type_name = GGML_TYPES[t.type_id][0]
        counts[type_name] += 1
        type_bytes[type_name] += t.n_bytes
    return counts, type_bytes


def _draft_warnings(draft: DraftInfo) -> list[str]:
    """What a DFlash-family draft lacks that llama.cpp or drafting needs."""
    if draft.draft_type not in ("dflash", "dflash2", "dspark"):
        return []
    warnings = []
    if draft.target_layers is None:
        warnings.append("dflash draft without dflash.target_layers; llama.cpp refuses to load it")
    if draft.mask_token_id is None:
        warnings.append("dflash draft without tokenizer.ggml.mask_token_id; drafting needs a mask token")
    return warnings


def _weights_by_layer(tensors: list[TensorInfo], names: set[str], n_blocks: int) -> tuple[list[int], int]:
    """Each block's weight bytes, and the output head's."""
    layer_bytes = [0] * n_blocks
    output_bytes = 0
    for t in tensors:
        if t.name.startswith("blk."):
            index = t.name.split(".", 2)[1]
            if ascii_digits(index) and int(index) < n_blocks:
                layer_bytes[int(index)] += t.n_bytes
        elif t.name.startswith(("output.", "output_norm.")):
            output_bytes += t.n_bytes
    if "output.weight" not in names and "token_embd.weight" in names:
        # tied embeddings: llama.cpp loads a duplicate of token_embd as the output head, on the output's device
        output_bytes += next(t.n_bytes for t in tensors if t.name == "token_embd.weight")
    return layer_bytes, output_bytes


def _ssm_params(meta: Metadata) -> SSMParams:
    return SSMParams(
        conv_kernel=meta.arch_int("ssm.conv_kernel"),
        inner_size=meta.arch_int("ssm.inner_size"),
        state_size=meta.arch_int("ssm.state_size"),
        group_count=meta.arch_int("ssm.group_count"),
        time_step_rank=meta.arch_int("ssm.time_step_rank"),
        wkv_head_size=meta.arch_int("wkv.head_size"),
        token_shift_count=meta.arch_int("token_shift_count"),
        shortconv_l_cache=meta.arch_int("shortconv.l_cache"),
        kda_head_dim=meta.arch_int("kda.head_dim"),
    )


def _shown_or_none(text: str | None) -> str | None:
    """A string from the file as it may be shown (its control characters made visible), or None."""
    return None if text is None else shown(text)


def _file_type(meta: Metadata, tensors: Sequence[TensorInfo]) -> tuple[int | None, str, bool]:
    """general.file_type and its llama.cpp label, else llama.cpp's guess from the commonest tensor type."""
    stored = meta.int_value("general.file_type")
    if stored is not None:
        base = stored & ~_FTYPE_GUESSED
        label = _FTYPE_LABELS.get(base, "unknown, may not work")
        guessed = bool(stored & _FTYPE_GUESSED)
        return stored, ("(guessed) " + label if guessed else label), guessed
    if not tensors:
        return None, "unknown (no tensors)", True
    # llama.cpp walks tensors in name order and keeps the first type to reach the highest count
    counts: Counter[int] = Counter()
    best_type, best_count = 0, 0
    for t in sorted(tensors, key=lambda t: t.name):
        counts[t.type_id] += 1
        if counts[t.type_id] > best_count:
            best_type, best_count = t.type_id, counts[t.type_id]
    ftype = _FTYPE_FROM_TENSOR_TYPE.get(best_type, 0)
    return ftype, "(guessed) " + _FTYPE_LABELS.get(ftype, "unknown, may not work"), True


def _draft_info(meta: Metadata, arch: str | None, block_count: int | None, names: set[str]) -> DraftInfo:
    """As common_speculative_types_from_gguf(): dflash -> dspark/dflash(2); a last-block NextN -> MTP."""
    draft_type: str | None = None
    if arch == "dflash":
        if "markov_w1.weight" in names:
            draft_type = "dspark"
        elif "selector_hidden.weight" in names or (meta.arch_int("selector_top_k") or 0) > 0:
            draft_type = "dflash2"
        else:
            draft_type = "dflash"
    elif arch == "eagle3":
        draft_type = "eagle3"
    elif block_count and f"blk.{block_count - 1}.nextn.eh_proj.weight" in names:
        draft_type = "draft-mtp"
    target = meta.arch_value("target_layers")
    return DraftInfo(
        draft_type=draft_type,
        target_layers=tuple(int(v) for v in target) if isinstance(target, list) else None,
        target_hidden_size=meta.arch_int("target_hidden_size"),
        block_size=meta.arch_int("block_size") if arch in ("dflash", "eagle3") else None,
        mask_token_id=meta.int_value("tokenizer.ggml.mask_token_id"),
        sample_from_anchor=meta.bool_value(f"{arch}.sample_from_anchor") if arch else None,
        has_confidence_head=meta.bool_value(f"{arch}.has_confidence_head") if arch else None,
        causal_attention=meta.bool_value(f"{arch}.attention.causal") if arch == "dflash" else None,
        selector_top_k=meta.arch_int("selector_top_k") if arch == "dflash" else None,
    )


_MAX_TEMPLATE = 1 << 20  # bytes of a chat template read_chat_template reads; real templates are under 64 KiB


def read_chat_template(path: Path, name: str | None = None) -> str | None:
    """The file's ``tokenizer.chat_template`` (or the named ``tokenizer.chat_template.<name>``), if any.

    Only that string is read (the header's other strings are not kept); one longer than 1 MiB is refused with a
    GGUFValidationError rather than read.
    """
    path = Path(path)
    head = read_header(path)
    key = "tokenizer.chat_template" if name is None else f"tokenizer.chat_template.{name}"
    entry, span = head.kv.get(key), head.spans.get(key)
    if entry is None or entry.vtype != int(VT.STRING) or span is None:
        return None
    start, end = span
    if end - start > _MAX_TEMPLATE:
        raise validation_error(
            path,
            f"{key} is {end - start} bytes long (at most {_MAX_TEMPLATE >> 20} MiB is read)",
            "the chat template is not usable; re-download or re-convert the model",
        )
    try:
        with open_file_source(path) as src:
            return src.read(start, end - start).decode("utf-8", errors="replace")
    except OSError as exc:
        raise gguf_error(path, f"cannot be read ({exc.strerror or exc})", "check the file and the disk") from None


def read_pooling_type(path: Path) -> int:
    """The pooling the file names (``{arch}.pooling_type``: 1 mean, 2 cls, 3 last, 4 rank), 0 when it names none: a
    model with pooling embeds (or, rank, reranks) rather than chats."""
    head = read_header(Path(path))
    arch = head.kv.get("general.architecture")
    entry = head.kv.get(f"{arch.value}.pooling_type") if arch is not None and isinstance(arch.value, str) else None
    value = entry.value if entry is not None else 0
    return value if isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= 4 else 0


def inspect_gguf_reader(
    name: str,
    size: int,
    read_at: ReadAt,
    *,
    shards: Sequence[tuple[str, int, ReadAt]] = (),
    window: int = 1 << 20,
) -> GGUFInfo:
    """inspect_gguf() for a file known only through ``read_at(offset, n)``, e.g. a remote file.

    ``name`` stands for the path in messages and ``size`` is the whole file's size; ``shards`` are the other
    shards of a split model as ``(name, size, read_at)``. Only header bytes are read. Errors from
    ``read_at`` propagate unchanged; malformed headers raise GGUFValidationError.
    """
    headers = [read_header_through(name, size, read_at, window)]
    headers += [read_header_through(n, s, r, window) for n, s, r in shards]

    def build() -> GGUFInfo:
        split_count, _ = _split_fields(name, Metadata(headers[0].kv, None))
        names = (name, *(n for n, _, _ in shards))
        warnings: list[str] = []
        missing: tuple[str, ...] = ()
        if split_count > len(headers):
            missing = tuple(f"shard {i}" for i in range(len(headers) + 1, split_count + 1))
            warnings.append(f"{len(missing)} of {split_count} shards were not read")
        return _build_info(Path(name), headers, split_count, names, missing, warnings)

    return guarded(name, build)
