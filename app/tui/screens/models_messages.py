"""What the models screen's (F4) thread workers found, posted to the screen."""

from __future__ import annotations

from textual.message import Message

from app.tui.screens.models_local import PartialRow
from models_catalog import fit
from models_catalog.catalog import CatalogEntry
from models_catalog.hub import QuantGroup, RepoListing, RepoSummary
from models_catalog.library import LocalModel


class MemoryDetected(Message):
    """RAM and VRAM of this machine."""

    def __init__(self, memory: fit.MachineMemory) -> None:
        super().__init__()
        self.memory = memory


class HubSearched(Message):
    """Search results from the Hub."""

    def __init__(self, results: list[RepoSummary]) -> None:
        super().__init__()
        self.results = results


class RepoInspected(Message):
    """A repository's files grouped by quant and, when its header could be read, the fit of each quant."""

    def __init__(
        self,
        listing: RepoListing,
        groups: list[QuantGroup],
        report: fit.FitReport | None,
        fit_error: str | None,
        entry: CatalogEntry | None,
    ) -> None:
        super().__init__()
        self.listing = listing
        self.groups = groups
        self.report = report
        self.fit_error = fit_error
        self.entry = entry


class LocalModelsListed(Message):
    """The models on disk (the bundled starter last, when installed), and the partial downloads (sized against the
    Hub when `sized`)."""

    def __init__(self, models: list[LocalModel], partials: list[PartialRow], sized: bool = True) -> None:
        super().__init__()
        self.models = models
        self.partials = partials
        self.sized = sized


class LocalModelJudged(Message):
    """The fit of a model on disk."""

    def __init__(self, model: LocalModel, verdict: fit.QuantFit | None, error: str | None) -> None:
        super().__init__()
        self.model = model
        self.verdict = verdict
        self.error = error


class ModelDeleted(Message):
    """A local model was deleted; `freed` bytes."""

    def __init__(self, name: str, freed: int) -> None:
        super().__init__()
        self.name = name
        self.freed = freed


class ModelsWorkFailed(Message):
    """Background work failed; `error` says why in words a user understands."""

    def __init__(self, what: str, error: str) -> None:
        super().__init__()
        self.what = what
        self.error = error
