"""The quick model switcher: the starter model, the .gguf files in the model folders, and remote engines' models."""

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

from app.config import RemoteSettings
from app.model_list import LocalModel, human_size, local_models
from app.remote import RemoteChoice, RemoteError, RemoteModel, list_models, remote_path

SwitcherResult = Path | RemoteChoice | None
# Rows shown per remote engine (and of local files) for one filter: a server may list hundreds of thousands of models
# within its size limit, and an option list that long froze the app for a minute on every key. The rest are said to be
# there; typing narrows them.
MAX_ROWS = 300
ModelLister = Callable[[RemoteSettings], list[RemoteModel]]


class ModelSwitcherModal(ModalScreen[SwitcherResult]):
    """Type to filter, Enter loads, Esc cancels; dismisses with the chosen model file or remote model.

    Each remote engine's models are fetched (GET /v1/models) in a thread when the dialog opens; until they arrive
    its row says so, and an error shows inline in its place. Given `folders` instead of `models`, the local files are
    looked for in a thread too (a scan of three levels of folders): until then a row says so.
    """

    BINDINGS = [
        Binding("escape", "cancel", "Cancel"),
        Binding("down", "move(1)", "Down", show=False),
        Binding("up", "move(-1)", "Up", show=False),
    ]

    def __init__(
        self,
        models: list[LocalModel] | None,
        current: str | None,
        remotes: Sequence[RemoteSettings] = (),
        lister: ModelLister = list_models,
        folders: Sequence[str] = (),
    ) -> None:
        super().__init__(classes="dialog-screen")
        self.models: list[LocalModel] = models if models is not None else []
        self.scanning = models is None
        """Whether the local model files are still being looked for (in `folders`, off the event loop)."""
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
            yield OptionList(id="model-options")
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
        """Look for the local model files (folder listings and stats: never on the event loop)."""
        found = local_models(self.folders)
        self.app.call_from_thread(self._scanned, found)

    def _scanned(self, found: list[LocalModel]) -> None:
        self.models, self.scanning = found, False
        if self.is_attached:
            self._fill(self.query_one("#model-filter", Input).value)

    def on_worker_state_changed(self, event: Worker.StateChanged) -> None:
        """A scan that failed in a way it did not expect (exit_on_error=False) is said in one line; the rest stays."""
        if event.state == WorkerState.ERROR and event.worker.node is self and event.worker.group == "local-models":
            self.scanning = False
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
        for index, model in enumerate(self.models):
            if needle and needle not in model.name.casefold() and needle not in str(model.path).casefold():
                continue
            shown += 1
            if shown > MAX_ROWS:
                continue
            label = Text()
            label.append("● " if str(model.path) == self.current else "  ", style="bold green")
            label.append(model.name, style="bold")
            label.append(f"  {human_size(model.size_bytes)}  ", style="dim")
            label.append(model.source if model.source == "starter" else str(model.path.parent), style="dim italic")
            options.add_option(Option(label, id=str(index)))
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
                    label.append(item.id, style="bold")
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
        if option_id.isdigit():
            self.dismiss(self.models[int(option_id)].path)
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
