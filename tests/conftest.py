"""Shared pytest fixtures."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.tiny_models import write_all


@pytest.fixture(scope="session")
def tiny_models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Every tiny GGUF model kind (see tests/tiny_models.py), written once per test session."""
    return write_all(tmp_path_factory.mktemp("tiny-models"))
