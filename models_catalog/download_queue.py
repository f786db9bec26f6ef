"""A queue of model downloads run by worker threads: pause, resume and cancel by task id, progress to subscribers."""

from __future__ import annotations

import collections
import itertools
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import replace
from pathlib import Path

from engine_ext.untrusted_text import one_line_message
from models_catalog.download import (
    FINAL_STATES,
    DownloadTask,
    Progress,
    ProgressCallback,
    RemoteFile,
    State,
    TransferOptions,
    discard_partial,
    fetch,
    partial_size,
)
from models_catalog.errors import DownloadCancelled, DownloadError, ModelsError


class DownloadQueue:
    """Downloads run by worker threads in order; pause, resume and cancel by task id; events to subscribers.

    Subscribers are called from worker threads; a UI must hand events over to its own thread.
    """

    def __init__(
        self,
        *,
        workers: int = 1,
        options: TransferOptions | None = None,
        cache_root: Path | None = None,
    ) -> None:
        self.options = options or TransferOptions()
        self.cache_root = cache_root
        self._tasks: dict[int, DownloadTask] = {}
        self._order: collections.deque[int] = collections.deque()
        self._cond = threading.Condition()
        self._subscribers: list[ProgressCallback] = []
        self._ids = itertools.count(1)
        self._closed = False
        self._threads = [
            threading.Thread(target=self._worker, name=f"llmtui-download-{i}", daemon=True) for i in range(workers)
        ]
        for t in self._threads:
            t.start()

    # -- public API ----------------------------------------------------------------------------------

    def subscribe(self, callback: ProgressCallback) -> Callable[[], None]:
        """Call `callback` with every Progress event; returns a function that unsubscribes."""
        with self._cond:
            self._subscribers.append(callback)

        def unsubscribe() -> None:
            with self._cond:
                if callback in self._subscribers:
                    self._subscribers.remove(callback)

        return unsubscribe

    def add(self, file: RemoteFile) -> DownloadTask:
        with self._cond:
            if self._closed:
                raise DownloadError("the download queue is closed")
            task = DownloadTask(next(self._ids), file)
            self._tasks[task.task_id] = task
            self._order.append(task.task_id)
            self._cond.notify_all()
        self._emit(task, State.QUEUED)
        return task

    def add_all(self, files: Iterable[RemoteFile]) -> list[DownloadTask]:
        return [self.add(f) for f in files]

    def tasks(self) -> list[DownloadTask]:
        with self._cond:
            return [self._tasks[i] for i in sorted(self._tasks)]

    def pause(self, task_id: int) -> None:
        """Stop a task and keep its partial file; resume() continues from it."""
        self._stop(task_id, "pause")

    def cancel(self, task_id: int) -> None:
        """Stop a task and delete its partial file."""
        self._stop(task_id, "cancel")

    def resume(self, task_id: int) -> None:
        with self._cond:
            task = self._tasks[task_id]
            if task.state != State.PAUSED:
                return
            task.control.reset()
            task.state = State.QUEUED
            task.done.clear()
            self._order.append(task_id)
            self._cond.notify_all()
        self._emit(task, State.QUEUED, "resumed")

    def wait(self, tasks: Iterable[DownloadTask] | None = None, timeout: float | None = None) -> bool:
        """Wait until the tasks (all when None) are done, failed, cancelled or paused."""
        deadline = None if timeout is None else time.monotonic() + timeout
        for task in list(tasks) if tasks is not None else self.tasks():
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            if not task.done.wait(left):
                return False
        return True

    def close(self, *, cancel: bool = False) -> None:
        """Stop the workers (pausing running tasks, or cancelling them) and join them."""
        with self._cond:
            self._closed = True
            running = [t for t in self._tasks.values() if t.state not in FINAL_STATES]
            self._cond.notify_all()
        for task in running:
            task.control.request_stop("cancel" if cancel else "pause")
        for t in self._threads:
            t.join(timeout=10)

    def __enter__(self) -> DownloadQueue:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- internals -----------------------------------------------------------------------------------

    def _stop(self, task_id: int, reason: str) -> None:
        with self._cond:
            task = self._tasks[task_id]
            if task.state in FINAL_STATES:
                return
            queued = task.state in (State.QUEUED, State.PAUSED)
            if queued:
                if task_id in self._order:
                    self._order.remove(task_id)
                if reason == "cancel":
                    discard_partial(task.file, self.cache_root)
                task.state = State.PAUSED if reason == "pause" else State.CANCELLED
                task.done.set()
            task.control.request_stop(reason)
        if queued:
            self._emit(task, task.state)

    def _emit(self, task: DownloadTask, state: State, message: str = "", progress: Progress | None = None) -> None:
        if progress is None:
            last = task.progress
            progress = Progress(
                task.task_id,
                task.file.repo_id,
                task.file.path,
                state,
                last.downloaded if last else 0,
                task.file.size,
                message=message,
                local_path=str(task.path) if task.path else None,
            )
        task.progress = progress
        with self._cond:
            subscribers = list(self._subscribers)
        for callback in subscribers:
            try:
                callback(progress)
            except Exception:  # a broken subscriber must not kill a download
                pass

    def _next(self) -> DownloadTask | None:
        with self._cond:
            while not self._closed and not self._order:
                self._cond.wait()
            if self._closed:
                return None
            task = self._tasks[self._order.popleft()]
            task.state = State.DOWNLOADING
            return task

    def _worker(self) -> None:
        while True:
            task = self._next()
            if task is None:
                return
            self._run(task)

    def _run(self, task: DownloadTask) -> None:
        def on_progress(p: Progress) -> None:
            with self._cond:
                task.state = p.state
            self._emit(task, p.state, progress=replace(p, task_id=task.task_id))

        try:
            task.path = fetch(
                task.file,
                cache_root=self.cache_root,
                options=self.options,
                on_progress=on_progress,
                control=task.control,
                task_id=task.task_id,
                discard_on_cancel=True,
            )
            final, message = State.DONE, ""
        except DownloadCancelled:
            final = State.PAUSED if task.control.reason == "pause" else State.CANCELLED
            message = ""
            if final == State.PAUSED and task.progress is not None:
                # Progress is reported at most every progress_interval: the bytes kept are the partial file's, the
                # figure the Local tab shows for it too.
                kept = partial_size(task.file, self.cache_root)
                if kept is not None:
                    task.progress = replace(task.progress, downloaded=kept)
        except ModelsError as exc:
            task.error = exc
            final, message = State.FAILED, str(exc)
        except Exception as exc:  # never let a worker thread die silently
            task.error = DownloadError(
                one_line_message(f"{task.file.repo_id}/{task.file.path}", f"unexpected error: {exc!r}")
            )
            final, message = State.FAILED, str(task.error)
        with self._cond:
            task.state = final
        if final != State.DONE or task.progress is None or task.progress.state != State.DONE:
            self._emit(task, final, message)
        task.done.set()
