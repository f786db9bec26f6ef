"""The App's controllers: plain classes that own a feature's state and its engine calls, and know no screen (the
generation controller, which the CLI and an API server could drive too, is the core's: app/core/generation/).

The App creates them and hands each the narrow host Protocol it needs (host.py); screens reach them through the App
(`app.speculation`, `app.steering`, `app.models`, `app.generation`, `app.conversations`), render their state and
forward keys to them.

The names are imported when first used (PEP 562), so importing one controller does not import the others and what
they bring.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from app.tui.controllers.conversations import ConversationsController, ConversationsHost
    from app.tui.controllers.host import Host, ModelsHost, SpeculationHost
    from app.tui.controllers.model_in_use import ModelsController
    from app.tui.controllers.speculation import SpeculationController
    from app.tui.controllers.steering import SteeringController

_MODULES = {
    "ConversationsController": "conversations",
    "ConversationsHost": "conversations",
    "Host": "host",
    "ModelsController": "model_in_use",
    "ModelsHost": "host",
    "SpeculationController": "speculation",
    "SpeculationHost": "host",
    "SteeringController": "steering",
}

__all__ = [
    "ConversationsController",
    "ConversationsHost",
    "Host",
    "ModelsController",
    "ModelsHost",
    "SpeculationController",
    "SpeculationHost",
    "SteeringController",
]


def __getattr__(name: str) -> Any:
    module = _MODULES.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{module}"), name)
