"""GGUF validation, inspection and memory estimates that read only the header, never the weights.

This module is the package's public surface: app/, models_catalog/, the rest of engine_ext/, scripts and tests import
from ``engine_ext.gguf`` only, never from its private modules (an import-linter contract in pyproject.toml holds the
code to it). The code lives in seven private modules, each importing only the ones above it:

- ``_reader``: the bounded header reader (GGUFError, GGUFValidationError, validate_gguf, read_header and the Header it
  returns); local files and files read through a ``read_at(offset, n)`` callback. The only module that imports gguf-py.
- ``_metadata``: typed, checked access to one header's metadata, and llama.cpp's limits on its values.
- ``_layers``: which kind each block is (attention, recurrent, MoE, NextN), sliding-window layers, layout_string.
- ``_validate``: metadata rules llama.cpp enforces by refusing or by aborting (validate_loadable for every file
  llama.cpp loads, validate_main_model for the model to chat with, refuse_draft_as_model).
- ``_facts``: GGUFInfo, DraftInfo, SSMParams; inspect_gguf, inspect_gguf_reader, read_chat_template.
- ``_memory``: MemoryEstimate, estimate_memory, kv_bytes_per_layer, recurrent_bytes_per_layer.
- ``_describe``: describe (``llmtui info``), format_bytes, format_count.
"""

from __future__ import annotations

from engine_ext.gguf._describe import describe, format_bytes, format_count
from engine_ext.gguf._facts import (
    DraftInfo,
    GGUFInfo,
    SSMParams,
    inspect_gguf,
    inspect_gguf_reader,
    read_chat_template,
    read_pooling_type,
)
from engine_ext.gguf._layers import LAYER_LETTERS, layout_string
from engine_ext.gguf._memory import MemoryEstimate, estimate_memory, kv_bytes_per_layer, recurrent_bytes_per_layer
from engine_ext.gguf._metadata import IntOrLayers
from engine_ext.gguf._reader import (
    MAX_READ_HEADER_BYTES,
    GGUFError,
    GGUFValidationError,
    Header,
    MetadataValue,
    ReadAt,
    TensorInfo,
    read_header,
    validate_gguf,
)
from engine_ext.gguf._validate import refuse_draft_as_model, validate_loadable, validate_main_model

__all__ = [
    "LAYER_LETTERS",
    "MAX_READ_HEADER_BYTES",
    "DraftInfo",
    "GGUFError",
    "GGUFInfo",
    "GGUFValidationError",
    "Header",
    "IntOrLayers",
    "MemoryEstimate",
    "MetadataValue",
    "ReadAt",
    "SSMParams",
    "TensorInfo",
    "describe",
    "estimate_memory",
    "format_bytes",
    "format_count",
    "inspect_gguf",
    "inspect_gguf_reader",
    "kv_bytes_per_layer",
    "layout_string",
    "read_chat_template",
    "read_pooling_type",
    "read_header",
    "recurrent_bytes_per_layer",
    "refuse_draft_as_model",
    "validate_gguf",
    "validate_loadable",
    "validate_main_model",
]
