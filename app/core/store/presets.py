"""Named sets of sampling settings."""

from __future__ import annotations

from app.core.store.connection import Database
from app.core.store.records import JSONObject, Preset, PresetNotFound, StoreError, dump_settings, load_json_object


class Presets:
    """Saving, listing and deleting sampling presets: the presets table (`Store.presets`)."""

    def __init__(self, database: Database) -> None:
        self._database = database

    def save_preset(self, name: str, settings: JSONObject) -> None:
        """Create or replace the sampling preset called `name`."""
        if not name.strip():
            raise StoreError("a preset needs a name")
        settings_text = dump_settings(settings)
        with self._database.write() as connection:
            now = self._database.now()
            connection.execute(
                "INSERT INTO presets (name, settings, created_at, updated_at) VALUES (?, ?, ?, ?)"
                " ON CONFLICT (name) DO UPDATE SET settings = excluded.settings, updated_at = excluded.updated_at",
                (name, settings_text, now, now),
            )

    def list_presets(self) -> list[Preset]:
        """All presets by name; one with unreadable settings shows with empty settings, flagged damaged."""
        with self._database.lock:
            rows = self._database.connection.execute("SELECT name, settings FROM presets ORDER BY name").fetchall()
        presets = []
        for row in rows:
            settings, damaged = load_json_object(row["settings"])
            presets.append(Preset(row["name"], settings, damaged))
        return presets

    def delete_preset(self, name: str) -> None:
        """Remove a preset (PresetNotFound when there is none by that name)."""
        with self._database.write() as connection:
            if connection.execute("DELETE FROM presets WHERE name = ?", (name,)).rowcount == 0:
                raise PresetNotFound(f"there is no preset called {name!r}")
