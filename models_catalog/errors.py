"""Typed errors of the models package, each with a message a user can act on (what, where, what to do)."""

from __future__ import annotations

from engine_ext.untrusted_text import one_line


class ModelsError(Exception):
    """Base of every error the models package raises on purpose; its message is one line of at most 300 characters
    (sites that name a file build theirs with one_line_message, which keeps the hint; this is the net)."""

    def __init__(self, message: str = "") -> None:
        super().__init__(one_line(str(message)))


class OfflineError(ModelsError):
    """HF_HUB_OFFLINE=1 is set and the answer needs the network."""


class HubError(ModelsError):
    """The Hub (or the endpoint in HF_ENDPOINT) answered with an error or could not be reached."""


class RepoNotFound(HubError):
    """No such repository, or it is private and no valid token was sent."""


class GatedRepoError(HubError):
    """The repository is gated: the user must accept its terms on the Hub and set HF_TOKEN."""


class BadModelSpec(ModelsError):
    """A model reference (`org/repo[:QUANT]`, a catalog id) is malformed."""


class NoMatchingFile(ModelsError):
    """The repository has no GGUF file for the requested quant or sidecar."""


class DownloadError(ModelsError):
    """A download failed after its retries; the partial file is kept so the next pull resumes it."""


class NotEnoughDiskSpace(DownloadError):
    """The disk check before a download found less free space than the remaining bytes."""


class DiskFullError(DownloadError):
    """Writing a download failed because the disk filled up (ENOSPC); the partial file is kept."""


class ChecksumMismatch(DownloadError):
    """A downloaded file's sha256 (or git blob id) differs from the Hub's; the file was not installed."""


class DownloadCancelled(DownloadError):
    """The download was cancelled (or paused) by the user."""


class CatalogError(ModelsError):
    """The catalog data file is malformed."""
