"""The downloads panel: one row per file with a progress bar, bytes, rate and ETA; pause, resume and cancel."""

from __future__ import annotations

from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, VerticalScroll
from textual.message import Message
from textual.reactive import reactive
from textual.widgets import Label, ProgressBar

from engine_ext.gguf import format_bytes
from models_catalog.download import FINAL_STATES, Progress, State


def format_eta(seconds: float | None) -> str:
    """`25 s`, `4 min`, `1 h 05 min`; empty when unknown."""
    if seconds is None:
        return ""
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 3600:
        return f"{seconds / 60:.0f} min"
    hours, rest = divmod(int(seconds), 3600)
    return f"{hours} h {rest // 60:02d} min"


def progress_text(progress: Progress) -> str:
    """`42%  1.19 MiB/s  ETA 4 s  3.34 MiB / 8.01 MiB` while downloading, else the state first."""
    pct = f"{100 * progress.fraction:.0f}%"
    sizes = f"{format_bytes(progress.downloaded)} / {format_bytes(progress.total)}"
    if progress.state == State.DOWNLOADING:
        parts = [pct]
        if progress.rate:
            parts.append(f"{format_bytes(progress.rate)}/s")
        if progress.eta is not None:
            parts.append(f"ETA {format_eta(progress.eta)}")
        return "  ".join([*parts, sizes])
    if progress.state == State.DONE:
        return f"done  {format_bytes(progress.total)}"
    if progress.state in (State.FAILED, State.WAITING) and progress.message:
        return f"{progress.state}: {progress.message}"
    return f"{progress.state} {pct}  {sizes}"


class DownloadRow(Horizontal):
    """One file being downloaded."""

    DEFAULT_CSS = """
    DownloadRow { height: 1; }
    DownloadRow .download-name { width: 1fr; min-width: 12; max-width: 28; text-overflow: ellipsis; text-wrap: nowrap; }
    DownloadRow ProgressBar { width: auto; padding: 0 1; }
    DownloadRow ProgressBar Bar { width: 12; }
    DownloadRow .download-stats { width: auto; max-width: 52; text-wrap: nowrap; text-overflow: ellipsis; }
    """

    def __init__(self, progress: Progress) -> None:
        super().__init__(classes="download-row")
        self.progress = progress
        self.show(progress)

    def compose(self) -> ComposeResult:
        progress = self.progress
        yield Label(progress.path.rsplit("/", 1)[-1], classes="download-name")
        bar = ProgressBar(total=max(1, progress.total), show_eta=False, show_percentage=False)
        bar.progress = progress.downloaded
        yield bar
        yield Label(progress_text(progress), classes="download-stats")

    def show(self, progress: Progress) -> None:
        self.progress = progress
        self.set_class(progress.state == State.PAUSED, "-paused")
        self.set_class(progress.state in (State.FAILED, State.CANCELLED), "-failed")
        self.set_class(progress.state == State.DONE, "-done")
        if not self.children:  # not composed yet: compose() shows it
            return
        self.query_one(ProgressBar).update(total=max(1, progress.total), progress=progress.downloaded)
        self.query_one(".download-stats", Label).update(progress_text(progress))


class DownloadsPanel(VerticalScroll, can_focus=True):
    """The downloads of this session, newest last; the highlighted row is the one the keys act on.

    The models screen binds p and x too, so they act on the highlighted download wherever the focus is; a download
    is highlighted as it starts (`follow_next_download`), or when the highlighted one has finished.
    """

    BINDINGS = [
        Binding("up", "move(-1)", "Previous", show=False, tooltip="Previous download"),
        Binding("down", "move(1)", "Next", show=False, tooltip="Next download"),
        Binding(
            "p", "pause_resume", "Pause", tooltip="Pause or resume the highlighted download: on a finished one, says so"
        ),
        Binding(
            "x,c",
            "cancel",
            "Cancel",
            tooltip="Cancel the highlighted download: asks first (its partial file is deleted)",
        ),
    ]

    cursor: reactive[int] = reactive(0)
    """Index of the highlighted row."""

    class ActionRequested(Message):
        """The user asked to pause, resume or cancel a download (`action`: pause, resume or cancel)."""

        def __init__(self, panel: DownloadsPanel, task_id: int, action: str) -> None:
            super().__init__()
            self.panel = panel
            self.task_id = task_id
            self.action = action

        @property
        def control(self) -> DownloadsPanel:
            return self.panel

    def __init__(self, *, id: str | None = None) -> None:
        super().__init__(id=id)
        self.rows: dict[int, DownloadRow] = {}
        self._follow_next = False
        """Whether the next new row takes the highlight (the user just started a download)."""

    def follow_next_download(self) -> None:
        """Highlight the next download that appears: the one the user just started, which p and x then act on."""
        self._follow_next = True

    def on_mount(self) -> None:
        self.border_title = "Downloads"
        self.display = False

    def show_progress(self, progress: Progress) -> None:
        """Add or update the row of `progress.task_id`."""
        row = self.rows.get(progress.task_id)
        if row is None:
            highlighted = self.highlighted
            row = DownloadRow(progress)
            self.rows[progress.task_id] = row
            self.mount(row)
            self.display = True
            if self._follow_next or highlighted is None or highlighted.state in FINAL_STATES:
                self._follow_next = False
                self.cursor = len(self.rows) - 1
            self._highlight()
        else:
            row.show(progress)
        self.border_subtitle = self._summary()
        self.screen.refresh_bindings()  # p and x show in the footer while a download is unfinished

    def _summary(self) -> str:
        active = [r for r in self.rows.values() if r.progress.state not in FINAL_STATES]
        return f"{len(active)} active" if active else "all finished"

    @property
    def highlighted(self) -> Progress | None:
        rows = list(self.rows.values())
        return rows[self.cursor].progress if 0 <= self.cursor < len(rows) else None

    def watch_cursor(self) -> None:
        self._highlight()

    def _highlight(self) -> None:
        for index, row in enumerate(self.rows.values()):
            row.set_class(index == self.cursor, "-highlight")
            if index == self.cursor and row.is_mounted:
                self.scroll_to_widget(row, animate=False)

    def action_move(self, step: int) -> None:
        if self.rows:
            self.cursor = max(0, min(len(self.rows) - 1, self.cursor + step))

    def action_pause_resume(self) -> None:
        progress = self.highlighted
        if progress is None:
            return
        if progress.state in FINAL_STATES:
            name = progress.path.rsplit("/", 1)[-1]
            self.notify(f"{name} is {progress.state}: p has nothing to pause (it acts on an unfinished download).")
            return
        action = "resume" if progress.state == State.PAUSED else "pause"
        self.post_message(self.ActionRequested(self, progress.task_id, action))

    def action_cancel(self) -> None:
        progress = self.highlighted
        if progress is not None and progress.state not in FINAL_STATES:
            self.post_message(self.ActionRequested(self, progress.task_id, "cancel"))
