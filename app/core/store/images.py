"""Images of messages: each file kept once, named by its content hash, in the `images` folder beside the history
(owner-only: the folder 0700, the files 0600), and freed when no message refers to it any more."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path
from typing import Final

from app.core.owner_only_dirs import private_dir, write_private_bytes
from app.core.store.connection import Database
from app.core.store.records import StoredImage, load_images
from engine_ext.image_input import MAX_IMAGE_BYTES, CheckedImage

IMAGE_FOLDER_NAME: Final = "images"
FILE_SUFFIXES: Final = {"PNG": "png", "JPEG": "jpg", "GIF": "gif", "BMP": "bmp", "WebP": "webp"}


def is_image_file_name(name: str) -> bool:
    """Whether a name in the image folder is one of ours (64 lower-case hex digits), so freeing never touches
    anything else that was put there."""
    return len(name) == 64 and all(c in "0123456789abcdef" for c in name)


class Images:
    """Keeping, finding, checking and freeing the image files messages refer to (`Store.images`)."""

    def __init__(self, database: Database) -> None:
        self._database = database
        self._pending: set[str] = set()
        """Hashes kept by this process for a message not written yet (an attachment): never freed meanwhile."""

    @property
    def image_folder(self) -> Path:
        return self._database.path.parent / IMAGE_FOLDER_NAME

    def image_path(self, sha256: str) -> Path:
        """Where the image with this content hash is kept."""
        return self.image_folder / sha256

    def keep_image(self, image: CheckedImage, name: str) -> StoredImage:
        """Keep a checked image's bytes (once per content: the same picture attached twice is one file) for a message
        about to be written; what the message refers to it by. OSError when the file cannot be written."""
        stored = StoredImage(image.sha256, name, image.format, image.width, image.height, len(image.data))
        with self._database.lock:
            self._pending.add(image.sha256)
        path = self.image_path(image.sha256)
        if self.image_problem(stored) is not None:  # missing (or damaged): written again, atomically
            private_dir(self.image_folder)
            write_private_bytes(path, image.data)
        return stored

    def image_problem(self, image: StoredImage) -> str | None:
        """What is wrong with an image's file ("missing", "damaged"), None when it holds the image's bytes (read and
        hashed: call it off the UI thread)."""
        data = self.read_image(image)
        if data is None:
            return "missing" if not self.image_path(image.sha256).exists() else "damaged"
        return None

    def read_image(self, image: StoredImage) -> bytes | None:
        """The image's bytes, None when its file is missing, too large or not what was kept (its hash differs)."""
        path = self.image_path(image.sha256)
        try:
            with path.open("rb") as file:
                data = file.read(MAX_IMAGE_BYTES + 1)
        except OSError:
            return None
        if len(data) > MAX_IMAGE_BYTES or hashlib.sha256(data).hexdigest() != image.sha256:
            return None
        return data

    def referenced_images(self) -> set[str]:
        """The hashes of the images some message (in any conversation, deleted ones included) refers to."""
        with self._database.lock:
            rows = self._database.connection.execute("SELECT images FROM messages WHERE images != ''").fetchall()
        return {image.sha256 for row in rows for image in load_images(row[0])[0]}

    def free_unused_images(self) -> int:
        """Delete the image files no message refers to (and none is pending); how many were deleted."""
        with self._database.lock:
            keep = self.referenced_images() | self._pending
            try:
                names = [entry.name for entry in os.scandir(self.image_folder) if entry.is_file()]
            except FileNotFoundError:
                return 0
            freed = 0
            for name in names:
                if is_image_file_name(name) and name not in keep:
                    try:
                        (self.image_folder / name).unlink()
                    except FileNotFoundError:
                        continue
                    freed += 1
        return freed

    def written(self, images: tuple[StoredImage, ...]) -> None:
        """A message now refers to these: they are no longer pending."""
        with self._database.lock:
            self._pending.difference_update(image.sha256 for image in images)
