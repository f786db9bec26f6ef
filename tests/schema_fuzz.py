"""Seeded JSON schemas for the bounds fuzz (issue 42): large and small counts, minItems/maxItems, minLength/maxLength,
patterns with counted and nested quantifiers, nesting, $ref, anyOf, enums, required and optional properties."""

from __future__ import annotations

import random
from typing import Any

COUNTS = (0, 1, 2, 5, 50, 1999, 2000, 2001, 5000, 30_000, 100_000, 100_001, 10**9)


def count(rng: random.Random) -> int:
    return rng.choice(COUNTS) if rng.random() < 0.6 else rng.randint(0, 300)


def pattern(rng: random.Random) -> str:
    atoms = ["a", "[a-z]", "\\d", ".", "(ab|c)", "[^x]"]
    parts: list[str] = []
    for _ in range(rng.randint(1, 3)):
        atom = rng.choice(atoms)
        for _ in range(rng.randint(0, 3)):  # nested quantifiers
            low = rng.choice((0, 1, count(rng) % 60))
            atom = f"({atom}){{{low},{low + rng.choice((1, 3, 50, count(rng)))}}}"
        parts.append(atom + rng.choice(("", "*", "+", "?")))
    return "^" + "".join(parts) + "$"


def schema(rng: random.Random, depth: int = 0) -> dict[str, Any]:
    kinds = ["string", "pattern", "integer", "number", "boolean", "enum", "null", "ref", "anyof"]
    if depth < 3:
        kinds += ["object", "array", "array"]
    kind = rng.choice(kinds)
    if kind == "string":
        found: dict[str, Any] = {"type": "string"}
        for key in ("minLength", "maxLength"):
            if rng.random() < 0.6:
                found[key] = count(rng)
        return found
    if kind == "pattern":
        return {"type": "string", "pattern": pattern(rng)}
    if kind == "enum":
        return {"enum": rng.sample(["red", "green", 1, 2.5, True, None, 'a"b'], rng.randint(1, 4))}
    if kind == "ref":
        return {"$ref": "#/$defs/shared"}
    if kind == "anyof":
        return {"anyOf": [schema(rng, depth + 1) for _ in range(rng.randint(1, 3))]}
    if kind == "object":
        names = rng.sample(["a", "name", "size", "tags", "ok", "id"], rng.randint(1, 4))
        properties = {name: schema(rng, depth + 1) for name in names}
        required = [name for name in names if rng.random() < 0.6]
        return {"type": "object", "properties": properties, "required": required, "additionalProperties": False}
    if kind == "array":
        found = {"type": "array", "items": schema(rng, depth + 1)}
        for key in ("minItems", "maxItems"):
            if rng.random() < 0.5:
                found[key] = count(rng)
        return found
    return {"type": kind}


def seeded_schema(seed: int) -> dict[str, Any]:
    rng = random.Random(seed)
    found = schema(rng)
    found["$defs"] = {"shared": schema(rng, 2)}
    return found
