"""The models screen (F4): catalog, Hugging Face search and local tabs, a detail pane with fit, and downloads."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

from rich.text import Text
from textual import work
from textual.app import App, ComposeResult
from textual.containers import Horizontal, Vertical, VerticalScroll
from textual.widgets import Footer, Input, Label, OptionList, Select, Static, TabbedContent, TabPane, Tabs
from textual.widgets.option_list import Option
from textual.worker import Worker, WorkerState

from app.core import paths
from app.core.config import ConfigError
from app.core.documents.retrieval_models import not_for_chat
from app.core.model_presets import ModelPreset, preset_of, with_preset
from app.tui.download_bridge import PullFinished
from app.tui.modals.model_actions import DeleteModelModal, PullModal
from app.tui.modals.model_preset import ModelPresetModal
from app.tui.screens import models_work
from app.tui.screens.models_detail import (
    catalog_label,
    entry_text,
    local_label,
    local_text,
    memory_text,
    quant_label,
    repo_text,
    search_result_text,
    why_kept,
)
from app.tui.screens.models_downloads import ModelsDownloads
from app.tui.screens.models_keys import MODELS_BINDINGS, SEARCH_BOXES, SearchBox
from app.tui.screens.models_local import NO_LOCAL_MODELS, PartialRow, words_tooltip
from app.tui.screens.models_messages import (
    HubSearched,
    LocalModelJudged,
    LocalModelsListed,
    MemoryDetected,
    ModelDeleted,
    ModelsWorkFailed,
    RepoInspected,
)
from app.tui.widgets.downloads import DownloadsPanel
from engine_ext.gguf import format_bytes
from engine_ext.untrusted_text import MAX_MESSAGE, one_line
from models_catalog import fit, hfcache, hub, pairing
from models_catalog.catalog import Catalog, CatalogEntry, load_catalog
from models_catalog.download import FINAL_STATES, installed_path
from models_catalog.errors import ModelsError
from models_catalog.hub import QuantGroup, RepoListing, RepoSummary
from models_catalog.library import LocalModel

if TYPE_CHECKING:
    from app.tui.shell import LlmtuiShell

SCREEN_NAME = "models"
SORTS = (("most downloaded", "downloads"), ("most liked", "likes"), ("recently updated", "updated"))
# What each worker group does, in the words of the one-line message when it fails unexpectedly.
WORK_NAMES = {
    "memory": "Detecting this machine's memory",
    "search": "Search",
    "inspect": "Opening the repository",
    "local": "Listing local models",
    "local-fit": "Judging the model",
    "pull": "Downloading",
    "delete": "Deleting the model",
    "delete-size": "Sizing the model's files",
    "resume-partial": "Resuming the partial download",
}


def with_tooltip(widget: OptionList, tooltip: str) -> OptionList:
    widget.tooltip = tooltip
    return widget


# ----- the screen ----------------------------------------------------------------------------------------


class ModelsScreen(ModelsDownloads):
    """Find, inspect, download, use and delete models. Installed on the app, so downloads go on in the background.
    Enter on a list opens the highlighted repo (quants, fit, sidecars), or downloads the highlighted quant."""

    BINDINGS = MODELS_BINDINGS

    CSS_PATH = str(paths.assets_dir() / "models.tcss")
    CSS = """
    ToastRack {
        dock: top;
        align: right top;
        margin-bottom: 0;
    }
    """
    """Toasts at the top right on this screen: at the bottom, Textual's place, they covered the downloads' progress
    numbers at 80×24 until they faded (scoped: other screens keep Textual's placement)."""

    app: LlmtuiShell

    def __init__(self) -> None:
        super().__init__(id="models-screen")
        self.catalog: Catalog = Catalog([])
        self.memory: fit.MachineMemory | None = None
        self.search_results: list[RepoSummary] = []
        self.local_models: list[LocalModel] = []
        self.entry: CatalogEntry | None = None
        """The catalog entry in the detail pane (alone, or with its repo inspected)."""
        self.listing: RepoListing | None = None
        self.groups: list[QuantGroup] = []
        """The listing's quants (grouped once, off the event loop: see MAX_REPO_MODEL_FILES)."""
        self.report: fit.FitReport | None = None
        self.fit_error: str | None = None
        self.local: LocalModel | None = None
        self.local_fit: fit.QuantFit | None = None
        self.inspecting: str | None = None
        """The repository being inspected now."""
        self.searched: tuple[str, str | None, str] | None = None
        """(query, author, sort) of the last search asked for."""

    # ----- layout -----

    def compose(self) -> ComposeResult:
        yield Label("Models", id="models-title")
        with Horizontal(id="models-main"):
            with TabbedContent(id="models-tabs", initial="catalog"):
                with TabPane("Catalog", id="catalog"):
                    yield with_tooltip(OptionList(id="catalog-list"), words_tooltip("unverified"))
                with TabPane("Search", id="search"):
                    yield SearchBox(placeholder="Search Hugging Face GGUF repos", id="search-query")
                    with Horizontal(id="search-options"):
                        yield SearchBox(placeholder="author", id="search-author", compact=True)
                        yield Select(SORTS, value="downloads", allow_blank=False, id="search-sort", compact=True)
                    yield with_tooltip(OptionList(id="search-results"), words_tooltip("gated"))
                with TabPane("Local", id="local"):
                    yield with_tooltip(
                        OptionList(id="local-list"),
                        words_tooltip("+mtp, +dflash…", "incomplete", "unusable", "partial", "needs, memory"),
                    )
            with Vertical(id="models-detail"):
                with VerticalScroll(id="detail-scroll"):
                    info = Static("", id="detail-info")
                    info.tooltip = words_tooltip(
                        "unverified", "gated", "fits", "tight", "too big", "needs, memory", "incomplete", "unusable"
                    )
                    yield info
                    yield with_tooltip(
                        OptionList(id="quant-list"),
                        words_tooltip("★", "✓", "fits", "tight", "too big", "needs, memory", "+mtp, +dflash…"),
                    )
                    yield Static("", id="detail-notes")
        panel = DownloadsPanel(id="downloads")
        panel.tooltip = words_tooltip(
            "queued", "waiting", "checking", "downloading", "verifying", "paused", "done", "failed", "cancelled"
        )
        yield panel
        yield Footer(compact=True)

    def on_mount(self) -> None:
        self.query_one("#quant-list").display = False
        try:
            self.catalog = load_catalog(overlay_path=paths.data_dir() / "catalog-refresh.json")
        except (ModelsError, ValueError, TypeError, OverflowError, RecursionError) as error:
            # ValueError…RecursionError: a damaged catalog-refresh.json whose facts are not the types written there
            self.notify(f"The model catalog could not be read: {one_line(str(error))}", severity="error", timeout=10)
        catalog_list = self.query_one("#catalog-list", OptionList)
        for index, entry in enumerate(self.catalog):
            catalog_list.add_option(Option(catalog_label(entry), id=str(index)))
        self._detect_memory()
        self._list_local()
        if catalog_list.option_count:
            catalog_list.highlighted = 0
        catalog_list.focus()

    async def on_unmount(self) -> None:
        if self.downloads is not None:
            self.downloads.close()

    def _set_title(self) -> None:
        title = "Models"
        if self.memory is not None:
            title += f"  ·  this machine: {memory_text(self.memory)}"
        if hfcache.is_offline():
            title += "  ·  offline (HF_HUB_OFFLINE=1)"
        self.query_one("#models-title", Label).update(title)

    # ----- workers (network and disk, off the UI thread; their work is in models_work.py) -----

    @work(thread=True, group="memory", exit_on_error=False)
    def _detect_memory(self) -> None:
        self.post_message(models_work.detect_memory())

    @work(thread=True, exclusive=True, group="search", exit_on_error=False)
    def _search(self, query: str, author: str | None, sort: hub.SortKey) -> None:
        self.post_message(models_work.search(query, author, sort))

    @work(thread=True, exclusive=True, group="inspect", exit_on_error=False)
    def _inspect(self, repo_id: str, entry: CatalogEntry | None, memory: fit.MachineMemory | None) -> None:
        self.post_message(models_work.inspect(repo_id, entry, memory))

    @work(thread=True, exclusive=True, group="local-fit", exit_on_error=False)
    def _judge_local(self, model: LocalModel, memory: fit.MachineMemory | None) -> None:
        self.post_message(models_work.judge_local(model, memory))

    @work(thread=True, group="delete", exit_on_error=False)
    def _delete(self, model: LocalModel) -> None:
        self.post_message(models_work.delete(self._library, model))

    def on_worker_state_changed(self, event: Worker.StateChanged) -> None:
        """The last line of defence of this screen's workers (they run with exit_on_error=False): each reads what
        others wrote (a repository, a server's answers, files in the library) through libraries whose parsing errors
        are not all typed, and any exception escaping a worker would exit the whole app. Each worker catches the
        errors it expects and says why; one it did not expect is said here, in one line, and the app goes on."""
        if event.state != WorkerState.ERROR or event.worker.node is not self:
            return
        error = event.worker.error
        what = WORK_NAMES.get(event.worker.group, "Background work")
        self.post_message(ModelsWorkFailed(what, one_line(f"{type(error).__name__}: {error}")))

    # ----- worker results -----

    def on_memory_detected(self, message: MemoryDetected) -> None:
        self.memory = message.memory
        self._set_title()
        if self.entry is not None and self.listing is None:
            self._show_entry(self.entry)

    def on_hub_searched(self, message: HubSearched) -> None:
        self.search_results = message.results
        results = self.query_one("#search-results", OptionList)
        results.clear_options()
        for index, repo in enumerate(message.results):
            label = Text(repo.repo_id, style="bold")
            label.append(f"  ↓{repo.downloads} ♥{repo.likes}", style="dim")
            if repo.last_modified:
                label.append(f" {repo.last_modified[:10]}", style="dim")
            if repo.gated:
                label.append("  gated", style="yellow")
            results.add_option(Option(label, id=str(index)))
        if not message.results:
            results.add_option(Option(Text("No GGUF repos match.", style="italic"), id="none", disabled=True))
        else:
            results.highlighted = 0
            results.focus()

    def on_repo_inspected(self, message: RepoInspected) -> None:
        if message.listing.repo_id != self.inspecting:
            return
        self.inspecting = None
        self.local = None
        self.entry = message.entry or self.catalog.for_repo(message.listing.repo_id)
        self.listing, self.report, self.fit_error = message.listing, message.report, message.fit_error
        self.groups = message.groups
        self._show_repo()
        quants = self.query_one("#quant-list", OptionList)
        if quants.option_count:
            quants.focus()

    def on_local_models_listed(self, message: LocalModelsListed) -> None:
        self.local_models, self.partials, self.partials_sized = message.models, message.partials, message.sized
        local_list = self.query_one("#local-list", OptionList)
        previous = self.local.path if self.local else None
        previous_id = (
            local_list.get_option_at_index(local_list.highlighted).id if local_list.highlighted is not None else None
        )
        local_list.clear_options()
        for index, model in enumerate(message.models):
            local_list.add_option(Option(local_label(model), id=str(index)))
        for row in message.partials:
            local_list.add_option(Option(row.label(), id=f"partial-{row.partial.path}"))
        if not message.models and not message.partials:
            local_list.add_option(Option(Text(NO_LOCAL_MODELS, style="italic"), id="none", disabled=True))
        else:
            paths_now = [m.path for m in message.models]
            ids_now = [local_list.get_option_at_index(i).id for i in range(local_list.option_count)]
            if previous in paths_now:
                local_list.highlighted = paths_now.index(previous)
            elif previous_id is not None and previous_id.startswith("partial-") and previous_id in ids_now:
                local_list.highlighted = ids_now.index(previous_id)
            else:
                local_list.highlighted = 0
        if self._active_tab() == "local":
            self._show_highlighted_local()
        self.refresh_bindings()

    def on_local_model_judged(self, message: LocalModelJudged) -> None:
        if self.local is None or message.model.path != self.local.path:
            return
        self.local_fit = message.verdict
        self._show_local(self.local, message.error)

    def on_model_deleted(self, message: ModelDeleted) -> None:
        self.notify(f"Deleted {message.name}: freed {format_bytes(message.freed)}.")
        self.local = None
        self._list_local()

    def on_models_work_failed(self, message: ModelsWorkFailed) -> None:
        if self.inspecting is not None:  # the "Reading …" note
            self.inspecting = None
            self.query_one("#detail-notes", Static).update("")
        self.notify(one_line(f"{message.what}: {message.error}", 2 * MAX_MESSAGE), severity="error", timeout=12)

    def on_descendant_focus(self) -> None:
        self.refresh_bindings()

    def on_pull_finished(self, message: PullFinished) -> None:
        self.notify(f"Downloaded {message.pull.label}. Press u to chat with it.")
        self._list_local()
        if self.listing is not None and self.listing.repo_id == message.pull.plan.repo_id:
            self._show_repo()

    # ----- lists -----

    def on_option_list_option_highlighted(self, event: OptionList.OptionHighlighted) -> None:
        list_id, tab = event.option_list.id, self._active_tab()
        if list_id == "catalog-list" and tab == "catalog" and (event.option.id or "").isdigit():
            self._show_entry(self.catalog.entries[int(event.option.id or "")])
        elif list_id == "local-list" and tab == "local":
            self._show_highlighted_local()
        elif list_id == "search-results" and tab == "search":
            self._show_highlighted_result()

    def on_option_list_option_selected(self, event: OptionList.OptionSelected) -> None:
        list_id, option_id = event.option_list.id, event.option.id or ""
        event.stop()
        if list_id == "catalog-list" and option_id.isdigit():
            entry = self.catalog.entries[int(option_id)]
            self._open_repo(entry.repo, entry)
        elif list_id == "search-results" and option_id.isdigit():
            self._open_repo(self.search_results[int(option_id)].repo_id, None)
        elif list_id == "quant-list":
            self.action_download()
        elif list_id == "local-list" and option_id.startswith("partial-"):
            self.action_resume_partial()
        elif list_id == "local-list":
            self.action_use()

    def on_tabbed_content_tab_activated(self, event: TabbedContent.TabActivated) -> None:
        self.refresh_bindings()
        if event.pane.id == "local":
            self._show_highlighted_local()
        elif event.pane.id == "search":
            self._show_highlighted_result()
        elif event.pane.id == "catalog" and self.listing is None:
            catalog_list = self.query_one("#catalog-list", OptionList)
            if catalog_list.highlighted is not None:
                self._show_entry(self.catalog.entries[catalog_list.highlighted])

    def on_input_submitted(self, event: Input.Submitted) -> None:
        if event.input.id not in ("search-query", "search-author"):
            return
        event.stop()
        query = self.query_one("#search-query", Input).value.strip()
        author = self.query_one("#search-author", Input).value.strip() or None
        sort = str(self.query_one("#search-sort", Select).value)
        results = self.query_one("#search-results", OptionList)
        if (query, author, sort) == self.searched and self.search_results and results.highlighted is not None:
            # The results of this very query are shown: Enter opens the highlighted one (it took a second Enter,
            # the first searching again and moving the focus to the results).
            results.focus()
            results.action_select()
            return
        self.searched = (query, author, sort)
        results.clear_options()
        results.add_option(Option(Text("Searching…", style="italic"), id="none", disabled=True))
        self._search(query, author, sort)  # type: ignore[arg-type]

    def _active_tab(self) -> str:
        return self.query_one(TabbedContent).active

    def _open_repo(self, repo_id: str, entry: CatalogEntry | None) -> None:
        self.inspecting = repo_id
        self.query_one("#detail-notes", Static).update(
            Text(f"Reading {repo_id}: files and model header…", style="italic")
        )
        self._inspect(repo_id, entry, self.memory)

    def _highlighted_partial(self) -> PartialRow | None:
        """The partial download highlighted in the Local tab (when the tab shows)."""
        if not self.is_mounted or self._active_tab() != "local":
            return None
        local_list = self.query_one("#local-list", OptionList)
        if local_list.highlighted is None:
            return None
        option_id = local_list.get_option_at_index(local_list.highlighted).id or ""
        return next((r for r in self.partials if option_id == f"partial-{r.partial.path}"), None)

    def _show_highlighted_local(self) -> None:
        local_list = self.query_one("#local-list", OptionList)
        index = local_list.highlighted
        if index is None:  # nothing on disk: not the Catalog's entry, whose keys would act on it
            self.entry, self.listing, self.report, self.local = None, None, None, None
            self._clear_detail()
            self.query_one("#detail-info", Static).update("")
            self.refresh_bindings()
            return
        option_id = local_list.get_option_at_index(index).id or ""
        partial = self._highlighted_partial()
        if partial is not None:
            self.local, self.local_fit = None, None
            self._clear_detail()
            self.entry, self.listing, self.report = None, None, None
            self.query_one("#detail-info", Static).update(partial.detail())
            self.refresh_bindings()
            return
        if not option_id.isdigit():
            return
        model = self.local_models[int(option_id)]
        if self.local is None or self.local.path != model.path:
            self.local, self.local_fit = model, None
            self._judge_local(model, self.memory)
        self._show_local(model, None)

    def _show_highlighted_result(self) -> None:
        """The highlighted search result's facts, as the search returned them (the pane showed the catalog's model
        until Enter); the repo it reads on Enter, or has read, stays when it is this one."""
        results = self.query_one("#search-results", OptionList)
        index = results.highlighted
        option_id = (results.get_option_at_index(index).id or "") if index is not None else ""
        if not option_id.isdigit() or int(option_id) >= len(self.search_results):
            return
        repo = self.search_results[int(option_id)]
        if repo.repo_id in (self.inspecting, self.listing.repo_id if self.listing else None):
            return
        self.inspecting = None  # a repo read for another result is not shown over this one
        self._clear_detail()
        self.entry, self.listing, self.report, self.local = None, None, None, None
        entry = self.catalog.for_repo(repo.repo_id)
        self.query_one("#detail-info", Static).update(search_result_text(repo, entry))
        self.refresh_bindings()

    # ----- the detail pane -----

    def _clear_detail(self) -> None:
        quants = self.query_one("#quant-list", OptionList)
        quants.clear_options()
        quants.display = False
        self.query_one("#detail-notes", Static).update("")

    def _show_entry(self, entry: CatalogEntry) -> None:
        """A catalog entry's facts (no network); Enter inspects its repo."""
        self.entry, self.listing, self.report, self.local = entry, None, None, None
        self._clear_detail()
        self.query_one("#detail-info", Static).update(entry_text(entry, self.memory))

    def _show_repo(self) -> None:
        listing = self.listing
        if listing is None:
            return
        previous = self._highlighted_group()
        self._clear_detail()
        report = self.report
        groups = self.groups
        self.query_one("#detail-info", Static).update(repo_text(listing, self.entry, report, self.fit_error, groups))
        quants = self.query_one("#quant-list", OptionList)
        fits = {q.primary: q for q in report.quants} if report else {}
        recommended = report.recommended if report else None
        highlight = 0
        for index, group in enumerate(groups):
            quants.add_option(Option(quant_label(group, fits.get(group.primary), recommended), id=group.primary))
            if recommended in (group.tag, group.primary) and previous is None:
                highlight = index
            if previous is not None and previous.primary == group.primary:
                highlight = index
        quants.display = bool(groups)
        if groups:
            quants.highlighted = highlight
        notes = Text(
            "★ recommended · ✓ downloaded · Enter or d: download the highlighted quant · u: use it", style="dim italic"
        )
        if report is not None and report.notes:
            notes.append("\n" + "\n".join(report.notes), style="dim")
        self.query_one("#detail-notes", Static).update(notes)

    def _show_local(self, model: LocalModel, error: str | None) -> None:
        self._clear_detail()
        self.entry, self.listing, self.report = None, None, None
        preset = preset_of(self.app.config.model_presets, model.source, model.name, model.path)
        self.query_one("#detail-info", Static).update(local_text(model, self.local_fit, error, preset))

    # ----- actions -----

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        """Keys act on what is selected on screen, wherever the focus is; those that have nothing to act on now
        are left out of the footer (False)."""
        if not self.is_mounted:
            return True
        if action in ("search", "tab"):  # in a search box holding text, / and digits are typed (org/name, qwen3)
            return not self._typing_in_a_box()
        if action == "to_results":
            focused = self.focused.id if self.focused is not None else None
            return focused in ("search-query", "search-author") and bool(self.search_results)
        if action in ("pause_download", "cancel_download"):
            progress = self.downloads_panel.highlighted
            unfinished = progress is not None and progress.state not in FINAL_STATES
            return unfinished and (action == "pause_download" or self._active_tab() != "local")
        if action == "pause_finished":
            progress = self.downloads_panel.highlighted
            return progress is not None and progress.state in FINAL_STATES
        if action == "delete":  # the bundled starter is part of the install: not deleted from here
            local = self.local if self._highlighted_partial() is None else None
            return self._active_tab() == "local" and (local is None or local.source != "starter")
        if action == "resume_partial":
            partial = self._highlighted_partial()
            return partial is not None and not partial.partial.active
        return True

    def _typing_in_a_box(self) -> bool:
        focused = self.focused
        return isinstance(focused, Input) and focused.id in SEARCH_BOXES and bool(focused.value)

    def action_back(self) -> None:
        """Esc: from a search box, to the results (or the tabs, before a search), so the next key is not typed
        and F4 stays; elsewhere back to the chat."""
        if self.focused is not None and self.focused.id in SEARCH_BOXES:
            if self.search_results:
                self.query_one("#search-results", OptionList).focus()
            else:
                self.query_one("#models-tabs", TabbedContent).query_one(Tabs).focus()
            self.refresh_bindings()
            return
        self.dismiss()

    def action_pause_finished(self) -> None:
        self.downloads_panel.action_pause_resume()

    def action_to_results(self) -> None:
        self.query_one("#search-results", OptionList).focus()

    def action_tab(self, tab: str) -> None:
        self.query_one(TabbedContent).active = tab
        target = {"catalog": "#catalog-list", "search": "#search-query", "local": "#local-list"}[tab]
        if tab == "search" and self.search_results:  # back to results shown: Enter opens the highlighted one
            target = "#search-results"
        self.query_one(target).focus()
        self.refresh_bindings()

    def action_search(self) -> None:
        self.query_one(TabbedContent).active = "search"
        self.query_one("#search-query", Input).focus()
        self.refresh_bindings()

    def action_reload_local(self) -> None:
        self._list_local()

    def _highlighted_group(self) -> QuantGroup | None:
        if self.listing is None:
            return None
        quants = self.query_one("#quant-list", OptionList)
        if quants.highlighted is None or not quants.display:
            return None
        primary = quants.get_option_at_index(quants.highlighted).id
        return next((g for g in self.groups if g.primary == primary), None)

    def action_download(self) -> None:
        group = self._highlighted_group()
        listing = self.listing
        if group is None or listing is None:
            if self.entry is not None and self.listing is None:
                self._open_repo(self.entry.repo, self.entry)
                self.notify("Opening the repo: pick a quant, then press d.")
            else:
                self.notify("Open a repo (Enter on a catalog entry or search result) and pick a quant first.")
            return
        repo_id = listing.repo_id
        sidecars = {
            kind: f"{pairing.basename(path)}  {format_bytes(listing.file(path).size)}"
            for kind, path in group.sidecars.items()
        }
        drafts = {
            kind: repo
            for kind, repo in (self.entry.drafts if self.entry else {}).items()
            if kind in pairing.SIDECAR_KEYWORDS and kind not in sidecars
        }
        sidecars.update({kind: f"from {repo}" for kind, repo in drafts.items()})
        chosen = next(({kind} for kind in pairing.DRAFT_KIND_ORDER if kind in sidecars), set())
        note = ""
        if listing.gated and not hfcache.token():
            note = hub.gated_message(repo_id)
        files = [(f.name, f.size) for f in group.files]
        spec = f"{repo_id}:{group.tag}" if group.tag else repo_id

        def start(kinds: list[str] | None) -> None:
            if kinds is not None:
                self.start_download(spec, kinds, drafts)

        self.app.push_screen(PullModal(f"Download {spec}", files, sidecars, chosen, note), start)

    def _use_target(self) -> Path | None:
        if self._active_tab() == "local" and self.local is not None:
            return self.local.path
        group = self._highlighted_group()
        return installed_path(group.files[0]) if group is not None else None

    def action_use(self) -> None:
        path = self._use_target()
        if path is None:
            self.notify("Pick a downloaded model in the Local tab (3), or download this quant first (d).")
            return
        refusal = not_for_chat(path)
        if refusal is not None:  # an embedding model or a reranker: it would load, then fail at the first reply
            self.notify(refusal, severity="warning", timeout=10)
            return
        if self.app.reply_in_progress():
            self.notify("A reply is being written; press Esc in the chat to stop it first.", severity="warning")
            return
        self.app.record_model_use(path)  # and again once it has loaded (app/tui/engine_events.py)
        self.dismiss()
        self.app.open_model(path)

    def action_edit_preset(self) -> None:
        """The highlighted local model's serve preset (config.toml [models."ID"]), in a dialog."""
        model = self.local
        if self._active_tab() != "local" or model is None:
            self.notify("Pick a model in the Local tab (3) to edit its serve preset.")
            return
        presets = self.app.config.model_presets

        def save(preset: ModelPreset | None) -> None:
            if preset is None:
                return
            try:
                self.app.save_settings(replace(self.app.config, model_presets=with_preset(presets, preset)))
            except ConfigError as error:
                self.notify(str(error), severity="error")
            self._show_local(model, None)

        self.app.push_screen(ModelPresetModal(preset_of(presets, model.source, model.name, model.path)), save)

    def action_resume_partial(self) -> None:
        row = self._highlighted_partial()
        if row is None:
            self.notify("Pick a partial download in the Local tab (3) to resume it.")
            return
        self.resume_partial_row(row)

    def action_delete(self) -> None:
        row = self._highlighted_partial()
        if row is not None:
            self.delete_partial_row(row)
            return
        model = self.local
        if self._active_tab() != "local" or model is None:
            self.notify("Pick a model in the Local tab (3) to delete it.")
            return
        refusal = why_kept(model, self.app.model_path)
        if refusal is not None:
            self.notify(refusal, severity="warning")
            return
        self._size_then_confirm(model)

    @work(thread=True, exclusive=True, group="delete-size", exit_on_error=False)
    def _size_then_confirm(self, model: LocalModel) -> None:
        """Which sidecars are there and how much deleting frees (file stats, off the event loop), then ask."""
        names, size = models_work.deletion_of(model)
        self.app.call_from_thread(self._confirm_delete, model, names, size)

    def _confirm_delete(self, model: LocalModel, names: list[str], size: int) -> None:
        def delete(yes: bool | None) -> None:
            if yes:
                self._delete(model)

        if self.is_current:
            self.app.push_screen(DeleteModelModal(model.name, names, size), delete)


def open_models_screen(app: App[None]) -> None:
    """Show the models screen (one instance per app, so its downloads outlive it); F4 on it goes back."""
    if isinstance(app.screen, ModelsScreen):
        app.screen.dismiss()
        return
    if any(isinstance(screen, ModelsScreen) for screen in app.screen_stack):
        return
    if not app.is_screen_installed(SCREEN_NAME):
        app.install_screen(ModelsScreen(), SCREEN_NAME)
    app.push_screen(SCREEN_NAME)
