"""GGUF validation, inspection and memory estimates that read only the header, never the weights.

The stable import surface for app/, scripts and tests; the code lives in five modules, each importing only the ones
above it:

- ``gguf_reader``: the bounded header reader (GGUFError, GGUFValidationError, validate_gguf); local files and files
  read through a ``read_at(offset, n)`` callback.
- ``gguf_metadata``: typed, checked access to one header's metadata, and llama.cpp's limits on its values.
- ``gguf_layers``: which kind each block is (attention, recurrent, MoE, NextN), sliding-window layers, layout_string.
- ``gguf_validate``: metadata rules llama.cpp enforces by refusing or by aborting (validate_loadable for every file
  llama.cpp loads, validate_main_model for the model to chat with).
- ``gguf_facts``: GGUFInfo, DraftInfo, SSMParams; inspect_gguf, inspect_gguf_reader, read_chat_template.
- ``gguf_memory``: MemoryEstimate, estimate_memory, kv_bytes_per_layer, recurrent_bytes_per_layer.
- ``gguf_describe``: describe (``llmtui info``), format_bytes, format_count.

Code inside engine_ext/ and models_catalog/ imports from those modules directly.
"""

from __future__ import annotations

from engine_ext.gguf_describe import describe, format_bytes, format_count
from engine_ext.gguf_facts import DraftInfo, GGUFInfo, SSMParams, inspect_gguf, inspect_gguf_reader, read_chat_template
from engine_ext.gguf_layers import LAYER_LETTERS, layout_string
from engine_ext.gguf_memory import MemoryEstimate, estimate_memory, kv_bytes_per_layer, recurrent_bytes_per_layer
from engine_ext.gguf_metadata import IntOrLayers
from engine_ext.gguf_reader import GGUFError, GGUFValidationError, ReadAt, validate_gguf
from engine_ext.gguf_validate import validate_loadable, validate_main_model

__all__ = [
    "LAYER_LETTERS",
    "DraftInfo",
    "GGUFError",
    "GGUFInfo",
    "GGUFValidationError",
    "IntOrLayers",
    "MemoryEstimate",
    "ReadAt",
    "SSMParams",
    "describe",
    "estimate_memory",
    "format_bytes",
    "format_count",
    "inspect_gguf",
    "inspect_gguf_reader",
    "kv_bytes_per_layer",
    "layout_string",
    "read_chat_template",
    "recurrent_bytes_per_layer",
    "validate_gguf",
    "validate_loadable",
    "validate_main_model",
]
