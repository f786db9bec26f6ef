"""The models screen's downloads: starting, pausing, resuming and cancelling them, and what they change on screen.

`ModelsDownloads` is the base of `ModelsScreen` (app/tui/screens/models_screen.py): the downloads panel's wiring and the
partial downloads of the Local tab, which the keys p, r and x act on.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from textual import work
from textual.screen import Screen

from app.core import paths
from app.core.model_paths import usable_folders
from app.tui.download_bridge import DownloadBridge, DownloadProgressed, PullFailed
from app.tui.modals.model_actions import DeleteModelModal
from app.tui.screens import models_work
from app.tui.screens.models_local import PartialRow
from app.tui.widgets.downloads import DownloadsPanel
from engine_ext.gguf import format_bytes
from models_catalog.download import FINAL_STATES, DownloadTask, State
from models_catalog.errors import ModelsError
from models_catalog.library import Library, PartialDownload

if TYPE_CHECKING:
    from app.tui.shell import LlmtuiShell


class ModelsDownloads(Screen[None]):
    """Downloads started from the models screen, shown in its downloads panel; p and x act on the highlighted one
    wherever the focus is (the panel highlights a download as it starts), x asks before deleting a partial file."""

    app: LlmtuiShell

    def __init__(self, *, id: str | None = None) -> None:
        super().__init__(id=id)
        self.downloads: DownloadBridge | None = None
        self.partials: list[PartialRow] = []
        """Partial downloads in the caches, listed in the Local tab after the models."""
        self.partials_sized = False
        """Whether the partials' totals were looked up (the Hub's listing) since the last listing."""

    @property
    def downloads_panel(self) -> DownloadsPanel:
        return self.query_one(DownloadsPanel)

    def _library(self) -> Library:
        # A folder that cannot name one (a NUL byte, ~ of an unknown user: the settings take any text) makes the
        # library's scan raise an error it does not expect, and nothing would be listed: such folders are left out.
        return paths.library(usable_folders(self.app.config.model_folders))

    def _bridge(self) -> DownloadBridge:
        if self.downloads is None:
            self.downloads = DownloadBridge(self)
        return self.downloads

    # ----- workers (network and disk, off the UI thread; their work is in models_work.py) -----

    @work(thread=True, exclusive=True, group="local", exit_on_error=False)
    def _list_local(self) -> None:
        for message in models_work.list_local(self._library):
            self.post_message(message)

    @work(thread=True, group="resume-partial", exit_on_error=False)
    def _resume_partial(self, row: PartialRow) -> None:
        if (failed := models_work.resume_partial(row, self.downloads)) is not None:
            self.post_message(failed)

    @work(thread=True, group="delete", exit_on_error=False)
    def _delete_partial(self, partial: PartialDownload, name: str) -> None:
        self.post_message(models_work.delete_partial(self._library, partial, name))

    @work(thread=True, group="pull", exit_on_error=False)
    def _pull(self, spec: str, sidecars: list[str], draft_repos: dict[str, str]) -> None:
        if (failed := models_work.pull(spec, sidecars, draft_repos, self.downloads)) is not None:
            self.post_message(failed)

    # ----- starting, resuming, deleting -----

    def start_download(self, spec: str, kinds: list[str], drafts: dict[str, str]) -> None:
        """Download `spec` with the sidecars `kinds`; its first file's row is highlighted as it appears, so p and x
        act on it (not on an earlier download)."""
        self._bridge()
        panel = self.downloads_panel
        panel.display = True
        panel.follow_next_download()
        self.notify(f"Downloading {spec}" + (f" with {', '.join(kinds)}" if kinds else "") + ".")
        self._pull(spec, kinds, drafts)

    def resume_partial_row(self, row: PartialRow) -> None:
        """r on a partial download: its own task when paused in this session, else a new one (highlighted)."""
        if row.partial.active:
            self.notify(f"{row.name} is being downloaded now (p pauses it).")
            return
        task = self._task_of(row)
        if task is not None:  # paused in this session: its own task resumes (one row in the panel)
            self._bridge().resume(task.task_id)
        else:
            self._bridge()
            self.downloads_panel.follow_next_download()
            self._resume_partial(row)
        self.notify(f"Resuming {row.name} from {format_bytes(row.partial.size)}.")

    def _task_of(self, row: PartialRow) -> DownloadTask | None:
        """The unfinished download of this session that writes the partial file (paused, queued), if any."""
        if self.downloads is None:
            return None
        return next(
            (
                t
                for t in self.downloads.queue.tasks()
                if t.file.oid == row.partial.oid
                and t.file.repo_id == row.partial.repo_id
                and t.state not in FINAL_STATES
            ),
            None,
        )

    def delete_partial_row(self, row: PartialRow) -> None:
        """x on a partial download in the Local tab: asks (y/n), then cancels its task or deletes its file."""
        if row.partial.active:
            self.notify(f"{row.name} is being downloaded now; pause it first (p).", severity="warning")
            return

        def delete_partial(yes: bool | None) -> None:
            task = self._task_of(row)
            if yes and task is not None and self.downloads is not None:
                self.downloads.cancel(task.task_id)  # cancelling deletes its partial file
                self.notify(f"Cancelled {row.name}: its {format_bytes(row.partial.size)} deleted.")
            elif yes:
                self._delete_partial(row.partial, f"partial {row.name}")

        self.app.push_screen(
            DeleteModelModal(f"partial download {row.name}", [row.partial.path.name], row.partial.size),
            delete_partial,
        )

    # ----- the panel's keys -----

    def action_pause_download(self) -> None:
        self.downloads_panel.action_pause_resume()

    def action_cancel_download(self) -> None:
        self.downloads_panel.action_cancel()

    def on_downloads_panel_action_requested(self, message: DownloadsPanel.ActionRequested) -> None:
        """Pause and resume at once; a cancel deletes the partial file, so it asks first (a y/n dialog)."""
        downloads = self.downloads
        if downloads is None:
            return
        row = self.downloads_panel.rows.get(message.task_id)
        if message.action == "cancel" and row is not None:
            progress = row.progress
            name = progress.path.rsplit("/", 1)[-1]

            def cancel(yes: bool | None) -> None:
                current = self.downloads_panel.rows[message.task_id].progress
                if yes and current.state not in FINAL_STATES:
                    self._act(downloads, message.task_id, "cancel")

            self.app.push_screen(
                DeleteModelModal(
                    f"the partial download of {name} (the download is cancelled)",
                    [f"{name}: {format_bytes(progress.downloaded)} of {format_bytes(progress.total)} downloaded"],
                    progress.downloaded,
                ),
                cancel,
            )
            return
        self._act(downloads, message.task_id, message.action)

    def _act(self, downloads: DownloadBridge, task_id: int, action: str) -> None:
        try:
            getattr(downloads, action)(task_id)
        except (ModelsError, KeyError) as error:
            self.notify(f"Could not {action} the download: {error}", severity="error")

    # ----- what downloads change on screen -----

    def on_download_progressed(self, message: DownloadProgressed) -> None:
        panel = self.downloads_panel
        row = panel.rows.get(message.progress.task_id)
        before = row.progress.state if row is not None else None
        panel.show_progress(message.progress)
        progress = message.progress
        stopped = (State.PAUSED, State.FAILED, State.CANCELLED)
        listed = any(
            r.file is not None and (r.file.repo_id, r.file.path) == (progress.repo_id, progress.path)
            for r in self.partials
        )
        if before != progress.state and (progress.state in stopped or listed):
            # its partial file shows in the Local tab (or is gone, when cancelled), or its row there changes state
            self._list_local()
        self.refresh_bindings()

    def on_pull_failed(self, message: PullFailed) -> None:
        self.notify(f"Download of {message.pull.label} stopped: {message.error}", severity="error", timeout=15)
