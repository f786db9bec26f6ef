"""Controllers: plain classes that own a feature's state and its engine calls, and know no screen.

The App creates them and hands each the narrow host Protocol it needs (host.py); screens reach them through the App
(`app.speculation`, `app.steering`, `app.models`, `app.generation`, `app.conversations`), render their state and
forward keys to them.
"""

from app.controllers.conversations import ConversationsController, ConversationsHost
from app.controllers.generation import GenerationOwner, GenerationRouter
from app.controllers.host import Host, ModelsHost, SpeculationHost
from app.controllers.models import ModelsController
from app.controllers.speculation import SpeculationController
from app.controllers.steering import SteeringController

__all__ = [
    "ConversationsController",
    "ConversationsHost",
    "GenerationOwner",
    "GenerationRouter",
    "Host",
    "ModelsController",
    "ModelsHost",
    "SpeculationController",
    "SpeculationHost",
    "SteeringController",
]
