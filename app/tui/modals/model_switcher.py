"""The quick model switcher: every model on this machine (the starter, the Hugging Face cache, the model folders) with
its size, quant, memory need and paired drafts, and remote engines' models."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.screen import ModalScreen
from textual.widgets import Input, Label, OptionList
from textual.widgets.option_list import Option
from textual.worker import Worker, WorkerState

from app.core.config import RemoteSettings
from app.core.model_list import LocalModel, describe_models, local_models
from app.core.model_presets import serve_id
from app.core.remote_engine import RemoteChoice, remote_path
from app.core.remote_http import RemoteError, RemoteModel, list_models
from engine_ext.gguf import format_bytes
from engine_ext.untrusted_text import one_line

SwitcherResult = Path | RemoteChoice | None
# Rows shown per remote engine (and of local files) for one filter: a server may list hundreds of thousands of models
# within its size limit, and an option list that long froze the app for a minute on every key. The rest are said to be
# there; typing narrows them.
MAX_ROWS = 300
ModelLister = Callable[[RemoteSettings], list[RemoteModel]]
ROW_WORDS = (
    "Each row: name · quant · file size · needs: memory to run it at its context (up to 8192), the figure F4 shows · "
    "+mtp, +dflash, +dspark, +eagle3: drafts that pair with it (sidecars beside it, or the catalog's draft repos "
    "downloaded) · +mmproj: a projector beside it, loaded with it (it sees images) · where it is (a folder: a model "
    "file used before, outside the model folders). unreadable: its GGUF header could not be read."
)
"""What the words in a row mean (the list's tooltip; F1 says the same)."""


def model_label(model: LocalModel, current: bool, served: bool = False) -> Text:
    """`● org/repo:Q8_0  8.01 MiB  needs 42.60 MiB  +mtp  Hugging Face cache`, `  model  Q4_K_M  1.2 GiB  …`;
    `served` when the app's router (F10, `[server] router = true`) has it loaded."""
    label = Text()
    label.append("● " if current else "  ", style="bold green")
    label.append(model.name, style="bold")
    if model.quant and not model.name.endswith(f":{model.quant}"):  # a cache model's name ends with it already
        label.append(f"  {model.quant}")
    label.append(f"  {format_bytes(model.size_bytes)}", style="dim")
    if model.need_bytes is not None:
        label.append(f"  needs {format_bytes(model.need_bytes)}")
    companions = (*model.draft_kinds, *(("mmproj",) if model.has_projector else ()))
    if companions:  # drafts that pair with it, and its projector (images), as F4 marks them
        label.append("  +" + ",".join(companions), style="cyan")
    if model.problem:
        label.append("  unreadable", style="red")
    if served:
        label.append("  served", style="bold magenta")
    where = model.where if model.source in ("starter", "hf-cache", "llama-cache") else str(model.path.parent)
    label.append(f"  {where}", style="dim italic")
    return label


class ModelSwitcherModal(ModalScreen[SwitcherResult]):
    """Type to filter, Enter loads, Esc cancels; dismisses with the chosen model file or remote model.

    Each remote engine's models are fetched (GET /v1/models) in a thread when the dialog opens; until they arrive
    its row says so, and an error shows inline in its place. Given `folders` instead of `models`, the local models are
    looked for in a thread too (the caches and three levels of folders): until then a row says so; then their headers
    are read there (memory need, paired drafts) and the rows fill in.

    Each local row: name, quant, file size, memory need ("needs …", the figure F4 shows), drafts that pair with it
    (+mtp, +dflash, …) and where it is.
    """

    BINDINGS = [
        Binding("escape", "cancel", "Cancel", tooltip="Cancel: the model in use stays"),
        Binding("down", "move(1)", "Down", show=False, tooltip="Next model: from the filter too"),
        Binding("up", "move(-1)", "Up", show=False, tooltip="Previous model"),
    ]

    def __init__(
        self,
        models: list[LocalModel] | None,
        current: str | None,
        remotes: Sequence[RemoteSettings] = (),
        lister: ModelLister = list_models,
        folders: Sequence[str] = (),
        served: frozenset[str] = frozenset(),
    ) -> None:
        """`served`: the models the app's router has loaded, by their serve ids (app.core.model_presets)."""
        super().__init__(classes="dialog-screen")
        self.served = served
        self.models: list[LocalModel] = models if models is not None else []
        self.scanning = models is None
        """Whether the local model files are still being looked for (in `folders`, off the event loop)."""
        self.describing = False
        """Whether the models' headers are still being read (memory need, drafts)."""
        self.folders = tuple(folders)
        self.current = current
        self.remotes = tuple(remotes)
        self.remote_models: dict[str, list[RemoteModel] | str] = {}
        """Per remote name: its models, or the error that stopped the listing (absent: still fetching)."""
        self._lister = lister

    def compose(self) -> ComposeResult:
        with Vertical(classes="dialog wide"):
            yield Label("Switch model", classes="dialog-title")
            yield Input(placeholder="Filter models", id="model-filter")
            options = OptionList(id="model-options")
            options.tooltip = ROW_WORDS
            yield options
            yield Label("Enter load · Esc cancel · folders and remote engines: Settings (F3)", classes="dialog-hint")

    def on_mount(self) -> None:
        self._fill("")
        if self.scanning:
            self.run_worker(self._scan, thread=True, group="local-models", exit_on_error=False)
        for remote in self.remotes:
            self.run_worker(
                lambda remote=remote: self._fetch(remote), thread=True, group="remote-models", exit_on_error=False
            )

    def _scan(self) -> None:
        """Look for the local models (folder listings, stats, then their headers: never on the event loop)."""
        found = local_models(self.folders, also=(self.current,) if self.current else ())
        self.app.call_from_thread(self._scanned, found, True)
        described = describe_models(found, self.folders, chat_only=True)  # no embedding model, no reranker
        self.app.call_from_thread(self._scanned, described, False)

    def _scanned(self, found: list[LocalModel], describing: bool = False) -> None:
        self.models, self.scanning, self.describing = found, False, describing
        if self.is_attached:
            self._fill(self.query_one("#model-filter", Input).value)

    def on_worker_state_changed(self, event: Worker.StateChanged) -> None:
        """A scan that failed in a way it did not expect (exit_on_error=False) is said in one line; the rest stays."""
        if event.state == WorkerState.ERROR and event.worker.node is self and event.worker.group == "local-models":
            self.scanning = self.describing = False
            error = event.worker.error
            text = " ".join(f"The model folders could not be read: {type(error).__name__}: {error}".split())
            self.notify(text[:300], severity="error", timeout=10)
            if self.is_attached:
                self._fill(self.query_one("#model-filter", Input).value)

    def _fetch(self, remote: RemoteSettings) -> None:
        try:
            result: list[RemoteModel] | str = self._lister(remote)
        except RemoteError as error:
            result = str(error)
        except Exception as error:  # shown inline like any other failure, never a silent "listing…"
            result = f"{type(error).__name__}: {error}"
        self.app.call_from_thread(self._fetched, remote.name, result)

    def _fetched(self, name: str, result: list[RemoteModel] | str) -> None:
        self.remote_models[name] = result
        if self.is_attached:
            self._fill(self.query_one("#model-filter", Input).value)

    def _fill(self, query: str) -> None:
        options = self.query_one(OptionList)
        highlighted = options.highlighted_option.id if options.highlighted_option is not None else None
        options.clear_options()
        needle = query.casefold().strip()
        shown = 0
        for model in self.models:
            if needle and needle not in model.name.casefold() and needle not in str(model.path).casefold():
                continue
            shown += 1
            if shown > MAX_ROWS:
                continue
            served = serve_id(model.source, model.name, model.path) in self.served
            label = model_label(model, str(model.path) == self.current, served)
            options.add_option(Option(label, id=f"local:{model.path}"))
        if shown > MAX_ROWS:
            options.add_option(
                Option(
                    Text(f"  … {shown - MAX_ROWS} more model files: type to narrow", style="dim"),
                    id="local-more",
                    disabled=True,
                )
            )
        if self.scanning:
            options.add_option(
                Option(Text("  looking in the model folders…", style="dim italic"), id="local-scanning", disabled=True)
            )
        elif self.describing:
            options.add_option(
                Option(
                    Text("  reading the models' headers (memory, drafts)…", style="dim italic"),
                    id="local-describing",
                    disabled=True,
                )
            )
        for r_index, remote in enumerate(self.remotes):
            where = f"remote: {remote.name}"
            result = self.remote_models.get(remote.name)
            if isinstance(result, list):
                shown = 0
                for m_index, item in enumerate(result):
                    if needle and needle not in item.id.casefold() and needle not in where.casefold():
                        continue
                    shown += 1
                    if shown > MAX_ROWS:
                        continue
                    label = Text()
                    label.append(
                        "● " if remote_path(remote.name, item.id) == self.current else "  ", style="bold green"
                    )
                    label.append(one_line(item.id, 120), style="bold")
                    if item.loaded:  # a router (llama-server's, llmtui's) has it loaded now
                        label.append("  loaded", style="magenta")
                    label.append(f"  {where}", style="cyan")
                    options.add_option(Option(label, id=f"remote-{r_index}-{m_index}"))
                if shown > MAX_ROWS:
                    options.add_option(
                        Option(
                            Text(f"  … {shown - MAX_ROWS} more models on {where}: type to narrow", style="dim"),
                            id=f"remote-{r_index}-more",
                            disabled=True,
                        )
                    )
                if not result and not needle:
                    options.add_option(
                        Option(
                            Text(f"  {where}: the server lists no models", style="italic"),
                            id=f"remote-{r_index}-empty",
                            disabled=True,
                        )
                    )
            elif not needle or needle in where.casefold():
                label = Text(f"  {where}  ", style="cyan")
                if result is None:
                    label.append("listing models…", style="dim italic")
                else:
                    label.append(result, style="red")
                options.add_option(Option(label, id=f"remote-{r_index}-status", disabled=True))
        if not any(not option.disabled for option in options.options) and not self.remotes and not self.scanning:
            options.add_option(
                Option(
                    Text("No models found. Add a folder with .gguf files in Settings (F3).", style="italic"),
                    id="none",
                    disabled=True,
                )
            )
        choosable = [i for i, option in enumerate(options.options) if not option.disabled]
        if choosable:
            previous = next((i for i in choosable if options.options[i].id == highlighted), choosable[0])
            options.highlighted = previous

    def on_input_changed(self, event: Input.Changed) -> None:
        self._fill(event.value)

    def on_input_submitted(self, event: Input.Submitted) -> None:
        event.stop()
        options = self.query_one(OptionList)
        if options.highlighted is not None:
            self._choose(options.get_option_at_index(options.highlighted).id)

    def on_option_list_option_selected(self, event: OptionList.OptionSelected) -> None:
        event.stop()
        self._choose(event.option.id)

    def _choose(self, option_id: str | None) -> None:
        if option_id is None:
            return
        if option_id.startswith("local:"):
            self.dismiss(Path(option_id.removeprefix("local:")))
            return
        parts = option_id.split("-")
        if len(parts) == 3 and parts[0] == "remote" and parts[1].isdigit() and parts[2].isdigit():
            remote = self.remotes[int(parts[1])]
            result = self.remote_models.get(remote.name)
            if isinstance(result, list):
                self.dismiss(RemoteChoice(remote, result[int(parts[2])].id))

    def action_move(self, step: int) -> None:
        options = self.query_one(OptionList)
        if step > 0:
            options.action_cursor_down()
        else:
            options.action_cursor_up()

    def action_cancel(self) -> None:
        self.dismiss(None)
