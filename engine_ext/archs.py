"""Facts about llama.cpp's architectures that decide what the engine may ask of a model."""

from __future__ import annotations

# Graphs that expose per-layer inputs (t_layer_inp); enabling their extraction on other architectures aborts
# (src/llama-graph.cpp GGML_ASSERT). Used by DFlash/EAGLE3 drafts and by control-vector making.
LAYER_INPUT_ARCHS = frozenset(
    {
        "llama",
        "qwen3",
        "qwen3moe",
        "qwen35",
        "qwen35moe",
        "qwen3next",
        "nemotron_h",
        "nemotron_h_moe",
        "gemma4",
        "gpt-oss",
        "lfm2",
        "minimax-m2",
        "mimo2",
        "deepseek4",
        "bailingmoe3",
        "hunyuan-vl",
        "nanbeige",
        "muse-glimmer",
        "qwen4exp",
    }
)
# Of those, the ones where a layer id may equal n_layer (the output of the last layer).
LAST_LAYER_INPUT_ARCHS = frozenset({"nemotron_h", "nemotron_h_moe", "deepseek4", "mimo2"})

# Recurrent state llama.cpp can roll back by a few tokens (n_rs_seq; llm_arch_supports_rs_rollback in
# src/llama-arch.cpp). Other recurrent/hybrid models verify drafts from a state checkpoint.
RS_ROLLBACK_ARCHS = frozenset(
    {
        "kimi-k3",
        "qwen35",
        "qwen35moe",
        "qwen4exp",
        "deepseek4",
        "glm5-next",
        "nemotron_h",
        "nemotron_h_moe",
        "lfm2",
        "lfm2moe",
        "bailingmoe3",
    }
)

# Main graphs without build_cvec: control vectors do nothing there (notes §4.2).
NO_CONTROL_VECTOR_ARCHS = frozenset(
    {
        "bert",
        "clip",
        "eagle3",
        "dflash",
        "gemma4-assistant",
        "granitemoe",
        "hunyuan-dense",
        "hy-v4",
        "lfm2moe",
        "mamba2",
        "minicpm",
        "mistral4",
        "phimoe",
        "plamo2",
        "qwen3tts",
        "rwkv6",
        "rwkv7",
        "t5encoder",
        "wavtokenizer",
    }
)
# Control vectors act only on FFN/MoE layers here (src/models/nemotron-h.cpp), not on Mamba or attention layers.
FFN_ONLY_CONTROL_VECTOR_ARCHS = frozenset({"nemotron_h", "nemotron_h_moe"})
