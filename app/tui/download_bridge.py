"""The one way model downloads reach the UI: a DownloadQueue whose progress events become coalesced messages."""

from __future__ import annotations

import itertools
import threading
from dataclasses import dataclass, field
from pathlib import Path

from textual.message import Message

from app.tui.messages import MessageTarget
from models_catalog import pairing
from models_catalog.download import FINAL_STATES, Progress, RemoteFile, State, TransferOptions
from models_catalog.download_queue import DownloadQueue
from models_catalog.pull import PullPlan, check_disk_space


class DownloadProgressed(Message, bubble=False):
    """A download's latest bytes, rate, ETA and state; a newer one replaces an unprocessed older one of its task."""

    def __init__(self, progress: Progress) -> None:
        super().__init__()
        self.progress = progress

    def can_replace(self, message: Message) -> bool:
        return isinstance(message, DownloadProgressed) and message.progress.task_id == self.progress.task_id


class PullFinished(Message):
    """Every file of a pull is installed; `model_path` is the model's snapshot path (first shard)."""

    def __init__(self, pull: PullJob, model_path: Path | None) -> None:
        super().__init__()
        self.pull = pull
        self.model_path = model_path


class PullFailed(Message):
    """A file of a pull failed or was cancelled; `error` says why in words a user understands."""

    def __init__(self, pull: PullJob, error: str) -> None:
        super().__init__()
        self.pull = pull
        self.error = error


@dataclass
class PullJob:
    """The downloads of one pull (model shards and sidecars), by task id."""

    pull_id: int
    plan: PullPlan
    task_ids: tuple[int, ...]
    primary_task: int | None
    ended: bool = False
    names: dict[int, str] = field(default_factory=dict)

    @property
    def label(self) -> str:
        return f"{self.plan.repo_id}:{self.plan.tag}" if self.plan.tag else self.plan.repo_id


class DownloadBridge:
    """Owns the download queue (its worker thread) and posts DownloadProgressed / PullFinished / PullFailed.

    Thread-safe: pull() may be called from a worker thread; the queue calls back from its own thread.
    """

    def __init__(self, target: MessageTarget, options: TransferOptions | None = None) -> None:
        self.target = target
        self.queue = DownloadQueue(options=options)
        self._lock = threading.Lock()
        self._pulls: dict[int, PullJob] = {}
        self._ids = itertools.count(1)
        self._unsubscribe = self.queue.subscribe(self._on_progress)

    def pull(self, plan: PullPlan) -> PullJob:
        """Queue every file of the plan after a disk-space check (NotEnoughDiskSpace); the job.

        The job is registered under the lock before any of its files can end, so none of its ends is missed.
        """
        check_disk_space(plan, self.queue.cache_root)
        with self._lock:
            tasks = self.queue.add_all(plan.files)
            primary = None
            if plan.primary is not None:
                primary = next(t.task_id for t in tasks if t.file == plan.primary)
            job = PullJob(
                next(self._ids),
                plan,
                tuple(t.task_id for t in tasks),
                primary,
                names={t.task_id: t.file.name for t in tasks},
            )
            self._pulls[job.pull_id] = job
        return job

    def resume_file(self, file: RemoteFile) -> PullJob:
        """Finish one file whose partial download is on disk (the Local tab's resume): a pull of that file alone,
        which continues from the partial's bytes."""
        primary = file if pairing.is_model_file(file.path) else None
        return self.pull(PullPlan(file.repo_id, pairing.quant_tag(file.path), file.commit, primary, (file,)))

    def pause(self, task_id: int) -> None:
        self.queue.pause(task_id)

    def resume(self, task_id: int) -> None:
        self.queue.resume(task_id)

    def cancel(self, task_id: int) -> None:
        self.queue.cancel(task_id)

    def close(self) -> None:
        """Stop the worker; a running download is paused, its partial file kept for the next pull."""
        self._unsubscribe()
        self.queue.close()

    def _on_progress(self, progress: Progress) -> None:
        self.target.post_message(DownloadProgressed(progress))
        if progress.state not in FINAL_STATES:
            return
        with self._lock:
            job = next((j for j in self._pulls.values() if progress.task_id in j.task_ids and not j.ended), None)
            if job is None:
                return
            states = {t.task_id: t for t in self.queue.tasks() if t.task_id in job.task_ids}
            failed = [t for t in states.values() if t.state in (State.FAILED, State.CANCELLED)]
            if failed:
                job.ended = True
                task = failed[0]
                why = str(task.error) if task.error else str(task.state)
                message: Message = PullFailed(job, f"{task.file.name}: {why}")
            elif all(t.state == State.DONE for t in states.values()):
                job.ended = True
                primary = states.get(job.primary_task) if job.primary_task is not None else None
                where = primary.progress.local_path if primary is not None and primary.progress else None
                message = PullFinished(job, Path(where) if where else None)
            else:
                return
        self.target.post_message(message)
