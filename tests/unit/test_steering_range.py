"""The steering sliders' range: from a vector's per-layer norms against the model's hidden-state scale."""

from __future__ import annotations

import math

import pytest

from app.core.vectors import VectorInfo, hidden_state_norm, nice_ceiling, slider_range


def test_a_unit_direction_spans_a_quarter_of_the_hidden_state_norm() -> None:
    assert hidden_state_norm(64) == 8.0
    assert slider_range([1.0] * 3, 64) == 2.0  # the tiny models: ±2, the range every slider had
    # The 576-wide starter: ±6, so llama-cvector-generator's unit vectors, visible at about ±4, sit inside it.
    assert slider_range([1.0] * 29, 576) == 6.0
    assert slider_range([1.0], 4096) == 20.0  # 0.25 × 64 = 16, rounded up to a round number


def test_the_range_follows_the_vectors_norms() -> None:
    assert slider_range([0.75], 64) == 3.0  # 2 / 0.75 = 2.67 → 3
    assert slider_range([30.0], 64) == 0.08  # a strong vector: a short range (2 / 30 = 0.067 → 0.08)
    assert slider_range([0.1, 0.5, 100.0], 64) == 4.0  # the typical (median) layer, not an outlier
    assert slider_range([], 64) == slider_range([0.0, math.nan], 64) == 2.0  # unknown: a unit direction
    assert slider_range([1e-9], 64) == 1000.0  # never past the engine's ±1000
    assert slider_range([1e9], 64) == 0.01


@pytest.mark.parametrize(
    ("value", "nice"), [(1.0, 1.0), (1.01, 1.5), (2.67, 3.0), (6.0, 6.0), (7.0, 8.0), (8.5, 10.0), (0.067, 0.08)]
)
def test_nice_ceiling(value: float, nice: float) -> None:
    assert nice_ceiling(value) == nice


def test_vector_info_carries_its_range() -> None:
    info = VectorInfo("/v.gguf", "v", 576, (1, 2), "+", "-", "llama", (1.0, 1.0))
    assert info.slider_range == 6.0
    assert VectorInfo("/v.gguf", "v", 64, (1,), "+", "-", "llama").slider_range == 2.0
