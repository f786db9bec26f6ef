"""Hostile input never takes the UI down (issue 21, items 3 and 6): Pilot tests that open each hostile thing in the
app and check that it is still running and said what went wrong in one line where the user was.

The hostile things: GGUF files (truncated, huge counts, bad string lengths, a draft sidecar opened as the model, not
a GGUF at all, empty, a folder, unreadable, seeded mutants of the fuzz suite) opened with `-m`, listed and judged in
F4's Local tab (model folders and the Hugging Face cache) and picked in the model switcher (ctrl+l); Hugging Face
repositories served by a local hub (a header bomb read through HTTP Range, a traversal name, 500 / 401, invalid or
wrongly shaped JSON, a connection dropped in the middle of a header); and remote engines (an endless stream line, an
endless or invalid /v1/models body).

An exception that reaches Textual's top level exits the app; `run_test` then re-raises it, so every test fails on
such an exit even before its own checks.
"""

from __future__ import annotations

import json
import os
import resource
import shutil
import struct
import threading
import time
import tracemalloc
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
from textual.pilot import Pilot
from textual.widgets import OptionList, Static

from app.core import paths
from app.core.config import Config, RemoteSettings, load_config, save_config
from app.tui.app import LlmtuiApp
from app.tui.modals.model_switcher import ModelSwitcherModal
from app.tui.screens.models_screen import ModelsScreen
from models_catalog import fit
from tests.hub_server import HubServer, _Handler
from tests.quiet_http import QuietHTTPServer
from tests.unit.test_gguf_fuzz import _I32, _STR, _U32, _U64, _Model, _str, _write_edited, mutants
from tests.waits import wait_until

pytestmark = pytest.mark.usefixtures("app_dirs")

WAIT_S = 20.0
MAX_LINE = 500  # a notification: one line, the GGUF reader's 300 characters plus the words around it
MAX_GROWTH = 200 << 20  # the UI process's memory growth while it reads a header bomb

# ----- hostile GGUF files ------------------------------------------------------------------------------------

_ARRAY, _STRING = 9, 8


def _raw(n_tensors: int, n_kv: int, body: bytes) -> bytes:
    return b"GGUF" + struct.pack("<IQQ", 3, n_tensors, n_kv) + body


def hostile_ggufs(models: dict[str, Path], folder: Path, *, n_mutants: int = 4) -> dict[str, Path]:
    """Hostile .gguf files (and things named like one) in `folder`, by kind: what a broken download, a hostile
    upload or an unlucky folder holds. Mutants come from the fuzz suite's generator (seeded)."""
    folder.mkdir(parents=True, exist_ok=True)
    llama = _Model(models["llama"])
    head = models["llama"].read_bytes()[: llama.header_end]
    out: dict[str, Path] = {}

    def write(kind: str, data: bytes, name: str | None = None) -> None:
        path = folder / (name or f"hostile-{kind}.gguf")
        path.write_bytes(data)
        out[kind] = path

    write("truncated", head[: llama.header_end // 2])
    write("huge-counts", _raw(2**63, 2**63, b""))
    write("huge-tensor-count", _raw(2**40, 0, b""))
    write("bad-key-length", _raw(0, 1, struct.pack("<Q", 2**62) + b"general.architecture"))
    write("bad-value-length", _raw(0, 1, _str("general.architecture") + struct.pack("<IQ", _STRING, 2**40) + b"x"))
    write("huge-array", _raw(0, 1, _str("tokenizer.ggml.tokens") + struct.pack("<IIQ", _ARRAY, _STRING, 2**40)))
    out["block-count"] = _write_edited(
        models["llama"], folder / "hostile-block-count.gguf", [("llama.block_count", _U64, -1, 2**63)]
    )
    out["negative-context"] = _write_edited(
        models["llama"], folder / "hostile-negative-context.gguf", [("llama.context_length", _I32, -1, -5)]
    )
    out["arch-string"] = _write_edited(
        models["llama"], folder / "hostile-arch-string.gguf", [("llama.embedding_length", _STR, -1, "64")]
    )
    out["split-count"] = _write_edited(
        models["llama"], folder / "hostile-split-count.gguf", [("split.count", _U32, -1, 2**32 - 1)]
    )
    write("not-gguf", b"this is not a model\n" * 50)
    write("empty", b"")
    directory = folder / "hostile-directory.gguf"
    directory.mkdir()
    (directory / "inside.txt").write_text("a folder named like a model")
    out["directory"] = directory
    write("unreadable", b"GGUF" + b"\xff" * 60)
    out["unreadable"].chmod(0)  # (root reads it anyway: then it is garbage)
    shutil.copyfile(models["qwen35_mtp_sidecar"], folder / "mtp-hostile.gguf")
    out["mtp-sidecar"] = folder / "mtp-hostile.gguf"
    for i, (_kind, _name, _what, data, tail) in enumerate(mutants({"llama": models["llama"]}, 2121, n_mutants)):
        path = folder / f"hostile-mutant-{i}.gguf"
        with open(path, "wb") as f:
            f.write(data)
            f.truncate(len(data) + tail)
        out[f"mutant-{i}"] = path
    return out


@pytest.fixture
def hostile_folder(tiny_models: dict[str, Path], tmp_path: Path) -> Iterator[dict[str, Path]]:
    files = hostile_ggufs(tiny_models, tmp_path / "hostile")
    yield files
    out = files["unreadable"]
    if out.exists():
        out.chmod(0o600)


# ----- helpers -------------------------------------------------------------------------------------------------


def messages(app: LlmtuiApp) -> list[str]:
    return [n.message for n in app._notifications]


def assert_up(app: LlmtuiApp) -> None:
    """The app runs on: not exiting, no exception caught at its top level."""
    assert app.is_running and app._exception is None and app.return_code is None, app._exception


def assert_one_line(text: str) -> None:
    assert "\n" not in text and 0 < len(text) <= MAX_LINE, text[:600]


async def said(pilot: Pilot[Any], app: LlmtuiApp, *words: str, timeout: float = WAIT_S) -> str:
    """Wait for a notification holding every one of `words`; it must be one line."""

    def found() -> str | None:
        return next((m for m in messages(app) if all(w in m for w in words)), None)

    await wait_until(pilot, found, f"a notification with {words}; got {messages(app)}", timeout)
    text = found()
    assert text is not None
    assert_one_line(text)
    return text


def use_folder(folder: Path) -> None:
    save_config(replace(load_config(), model_folders=(str(folder),)))


# ----- 1. llmtui -m hostile.gguf --------------------------------------------------------------------------------

# (every kind is also listed, judged and opened in F4's test; these go through the engine as well)
STARTUP_KINDS = (
    "truncated",
    "huge-counts",
    "huge-array",
    "block-count",
    "mtp-sidecar",
    "not-gguf",
    "empty",
    "directory",
    "mutant-1",
)


@pytest.mark.anyio
@pytest.mark.parametrize("kind", STARTUP_KINDS)
async def test_started_on_a_hostile_model_the_app_says_why_in_one_line(
    hostile_folder: dict[str, Path], kind: str
) -> None:
    app = LlmtuiApp(str(hostile_folder[kind]), start_engine=kind != "directory")  # (the starter would open)
    async with app.run_test(size=(100, 30)) as pilot:
        if kind == "directory":  # refused before the engine: said, then the starter model opens
            await said(pilot, app, "is a folder; give the path of a .gguf file inside it")
            assert_up(app)
            return
        await wait_until(pilot, lambda: app.engine_state in ("error", "ready", "crashed"), "the load to end")
        assert_up(app)
        if kind.startswith("mutant") and app.engine_state == "ready":
            return  # a mutant that changed nothing llama.cpp minds
        assert app.engine_state == "error"
        await said(pilot, app, f"Could not load {hostile_folder[kind].name}")
        chat = app.chat
        assert chat is not None and app.screen is chat
        chat.prompt.load_text("hello")
        await pilot.press("enter")  # nothing to answer with: refused, not a crash
        await pilot.pause()
        assert chat.generation is None
        assert_up(app)


# ----- 2. F4 with hostile files in the model folder and the Hugging Face cache -----------------------------------


def put_in_hf_cache(cache: Path, repo_id: str, files: dict[str, Path]) -> Path:
    """Files placed in the Hugging Face cache layout as a download leaves them (blobs, a snapshot, refs/main)."""
    commit = "c" * 40
    repo = cache / ("models--" + repo_id.replace("/", "--"))
    snapshot = repo / "snapshots" / commit
    snapshot.mkdir(parents=True)
    (repo / "blobs").mkdir()
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(commit)
    for index, (name, source) in enumerate(files.items()):
        blob = repo / "blobs" / f"{index:064x}"
        if source.is_file() and os.access(source, os.R_OK):
            shutil.copyfile(source, blob)
        else:
            blob.write_bytes(b"")
        (snapshot / name).symlink_to(Path("../..") / "blobs" / blob.name)
    return snapshot


async def open_local_tab(pilot: Pilot[Any], app: LlmtuiApp) -> ModelsScreen:
    await pilot.press("f4")
    await wait_until(pilot, lambda: isinstance(app.screen, ModelsScreen), "the models screen")
    screen = app.screen
    assert isinstance(screen, ModelsScreen)
    await wait_until(pilot, lambda: screen.memory is not None, "the machine's memory")
    await pilot.press("3")
    return screen


def local_labels(screen: ModelsScreen) -> list[str]:
    options = screen.query_one("#local-list", OptionList)
    return [str(options.get_option_at_index(i).prompt) for i in range(options.option_count)]


def detail(screen: ModelsScreen) -> str:
    return str(screen.query_one("#detail-info", Static).render())


@pytest.mark.anyio
async def test_f4_lists_and_judges_hostile_local_models_and_the_good_ones_still(
    hostile_folder: dict[str, Path], tiny_models: dict[str, Path], hf_env: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("LLMTUI_RAM_BYTES", str(8 << 30))
    monkeypatch.setenv("LLMTUI_VRAM_BYTES", "0")
    folder = hostile_folder["truncated"].parent
    shutil.copyfile(tiny_models["llama"], folder / "good-llama.gguf")
    use_folder(folder)
    cached = {f"Evil-{kind}.gguf": path for kind, path in hostile_folder.items() if kind != "directory"}
    cached["Good-Q8_0.gguf"] = tiny_models["qwen3"]
    put_in_hf_cache(hf_env, "evil/Hostile-GGUF", cached)
    app = LlmtuiApp(str(tiny_models["llama"]), start_engine=False)
    async with app.run_test(size=(120, 40)) as pilot:
        screen = await open_local_tab(pilot, app)
        await wait_until(pilot, lambda: len(screen.local_models) > 2, "the local models")
        listed = {m.path.name: m for m in screen.local_models}
        assert {"good-llama.gguf", "Good-Q8_0.gguf"} <= set(listed)
        assert listed["Good-Q8_0.gguf"].problem is None and listed["good-llama.gguf"].problem is None
        assert len(local_labels(screen)) == len(listed)
        local_list = screen.query_one("#local-list", OptionList)
        local_list.focus()
        for index, model in enumerate(screen.local_models):  # highlight each: its facts and fit are read
            local_list.highlighted = index
            await wait_until(
                pilot,
                lambda m=model: screen.local is not None and screen.local.path == m.path,
                f"{model.name} in the detail pane",
            )
            await wait_until(pilot, lambda m=model: m.name[:20] in detail(screen), f"{model.name}'s facts drawn")
            assert_up(app)
            text = detail(screen)
            assert model.name[:20] in text
            if model.problem:
                assert_one_line(model.problem)
                assert "Problem:" in text
        good = next(m for m in screen.local_models if m.name == "good-llama.gguf")
        local_list.highlighted = screen.local_models.index(good)
        await wait_until(pilot, lambda: screen.local_fit is not None, "the good model's fit")
        assert "fits" in detail(screen)
        assert_up(app)


# ----- 3. hostile Hugging Face repositories in F4 ---------------------------------------------------------------


@dataclass
class HostileHub(HubServer):
    """The local hub, where some API paths answer with a fixed status and body instead (a 500, a 401, JSON that is
    not JSON or not the shape the Hub sends)."""

    canned: dict[str, tuple[int, bytes]] = field(default_factory=dict)

    def start(self) -> HostileHub:
        server = self

        class Handler(_Handler):
            hub = server

            def _route(self) -> None:
                path = urlsplit(self.path).path
                for prefix, (status, body) in server.canned.items():
                    if path == prefix or path.startswith(prefix + "/"):
                        return self._send(status, body, {"Content-Type": "application/json"})
                return super()._route()

        self._httpd = QuietHTTPServer(("127.0.0.1", 0), Handler)
        self._httpd.daemon_threads = True
        self._thread = threading.Thread(target=self._httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
        self._thread.start()
        return self


@pytest.fixture
def hostile_hub(hf_env: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[HostileHub]:
    monkeypatch.setenv("LLMTUI_RAM_BYTES", str(8 << 30))
    monkeypatch.setenv("LLMTUI_VRAM_BYTES", "0")
    with HostileHub() as server:
        monkeypatch.setenv("HF_ENDPOINT", server.url)
        yield server


def token_bomb(n_tokens: int) -> bytes:
    """A GGUF header whose vocabulary is `n_tokens` empty strings: real bytes, read window by window."""
    body = _str("general.architecture") + struct.pack("<I", _STRING) + _str("llama")
    body += _str("tokenizer.ggml.tokens") + struct.pack("<IIQ", _ARRAY, _STRING, n_tokens)
    return _raw(0, 2, body) + b"\0" * (8 * n_tokens) + b"\0" * 64


HEADER_BOMBS = {
    "key-length": _raw(0, 1, struct.pack("<Q", 2**62) + b"general.architecture" + b"\0" * 4096),
    "value-length": _raw(0, 1, _str("general.architecture") + struct.pack("<IQ", _STRING, 2**40) + b"\0" * 4096),
    "array-count": _raw(
        0, 1, _str("tokenizer.ggml.tokens") + struct.pack("<IIQ", _ARRAY, _STRING, 2**40) + b"\0" * 4096
    ),
    "nested-arrays": _raw(0, 1, _str("x") + struct.pack("<IIQ", _ARRAY, _ARRAY, 2**32) + b"\0" * 4096),
    "tensor-count": _raw(2**40, 0, b"\0" * 4096),
    "tokens": token_bomb(200_000),
}


async def open_repo(pilot: Pilot[Any], app: LlmtuiApp, screen: ModelsScreen, repo_id: str) -> None:
    """Open the repository as Enter on a search result does, and wait until the screen has shown it or said why
    not (the search itself is tried apart, in test_f4_opens_hostile_repositories_and_says_why_in_one_line)."""
    screen._open_repo(repo_id, None)
    await wait_until(pilot, lambda: screen.inspecting is None, f"{repo_id} to be read")
    assert_up(app)


async def search(pilot: Pilot[Any], app: LlmtuiApp, screen: ModelsScreen, text: str) -> None:
    """Type a search (/ then the text, Enter) and wait until the results or an error came."""
    await pilot.press("slash")
    screen.query_one("#search-query").value = text  # type: ignore[attr-defined]
    await pilot.press("enter")
    await wait_until(pilot, lambda: bool(screen.search_results) or bool(messages(app)), f"the search for {text!r}")
    assert_up(app)


async def open_models_screen(pilot: Pilot[Any], app: LlmtuiApp) -> ModelsScreen:
    await pilot.press("f4")
    await wait_until(pilot, lambda: isinstance(app.screen, ModelsScreen), "the models screen")
    screen = app.screen
    assert isinstance(screen, ModelsScreen)
    await wait_until(pilot, lambda: screen.memory is not None, "the machine's memory")
    return screen


@pytest.mark.anyio
async def test_f4_reads_a_header_bomb_through_http_range_with_bounded_memory(
    hostile_hub: HostileHub, tiny_models: dict[str, Path]
) -> None:
    for kind, data in HEADER_BOMBS.items():
        hostile_hub.add_repo(f"evil/Bomb-{kind}-GGUF", {f"Bomb-{kind}-Q4_K_M.gguf": data})
    hostile_hub.add_repo("good/Tiny-GGUF", {"Tiny-Q8_0.gguf": tiny_models["qwen3"]})
    figures = {}
    app = LlmtuiApp(str(tiny_models["llama"]), start_engine=False)
    async with app.run_test(size=(120, 40)) as pilot:
        screen = await open_models_screen(pilot, app)
        for kind in HEADER_BOMBS:
            repo_id = f"evil/Bomb-{kind}-GGUF"
            before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss << 10
            tracemalloc.start()
            started = time.monotonic()
            try:
                await open_repo(pilot, app, screen, repo_id)
                traced = tracemalloc.get_traced_memory()[1]
            finally:
                tracemalloc.stop()
            grown = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss << 10) - before
            figures[kind] = (traced, grown, time.monotonic() - started)
            assert screen.listing is not None and screen.listing.repo_id == repo_id
            if kind == "tokens":  # a real (if absurd) vocabulary: judged, within the bounds
                assert screen.report is not None and screen.report.info.architecture == "llama"
            else:
                assert screen.report is None and screen.fit_error is not None, kind
                assert_one_line(screen.fit_error)
                assert "No fit:" in detail(screen)
            assert traced < MAX_GROWTH and grown < MAX_GROWTH, (kind, traced, grown)
            assert_up(app)
        await open_repo(pilot, app, screen, "good/Tiny-GGUF")  # the hub still works after the bombs
        assert screen.report is not None and screen.report.info.architecture == "qwen3"
    print(
        "header bombs (KiB traced peak, KiB max RSS growth, s):",
        {k: (t >> 10, g >> 10, round(s, 2)) for k, (t, g, s) in figures.items()},
    )


ESCAPES = "\x1b]0;PWNED\x07\x1b[2J\x9b31m\u202e"


@pytest.mark.anyio
async def test_f4_shows_a_hubs_ids_tags_and_a_files_names_without_their_escapes(
    hostile_hub: HostileHub, tiny_models: dict[str, Path], tmp_path: Path
) -> None:
    """Issue 32, class 3: what a hub or a model file names reaches the screen with its control characters visible
    (a search result's id with escapes is not shown at all: it names no repository llmtui could open)."""
    from tests.hub.test_hub_hostile import assert_no_raw_controls

    named = _write_edited(
        tiny_models["llama"],
        tmp_path / "named.gguf",
        [("general.name", _STR, -1, f"Name{ESCAPES}"), ("tokenizer.ggml.pre", _STR, -1, f"pre{ESCAPES}")],
    )
    hostile_hub.add_repo(f"evil/Esc{ESCAPES}-GGUF", {"m.gguf": b"GGUF"}, downloads=9)
    hostile_hub.add_repo(
        "good/Named-GGUF", {"Named-Q8_0.gguf": named}, tags=("gguf", f"tag{ESCAPES}"), last_modified=f"2026{ESCAPES}"
    )
    app = LlmtuiApp(str(tiny_models["llama"]), start_engine=False)
    async with app.run_test(size=(120, 40)) as pilot:
        screen = await open_models_screen(pilot, app)
        await search(pilot, app, screen, "GGUF")
        assert [r.repo_id for r in screen.search_results] == ["good/Named-GGUF"]
        results = screen.query_one("#search-results", OptionList)
        labels = [str(results.get_option_at_index(i).prompt) for i in range(results.option_count)]
        assert labels and all(assert_no_raw_controls(label) is None for label in labels)
        await open_repo(pilot, app, screen, "good/Named-GGUF")
        assert screen.report is not None, screen.fit_error
        assert_no_raw_controls(detail(screen))
        assert_no_raw_controls(str(screen.report.info.name) + str(screen.report.info.tokenizer_pre))
        assert "Name␛]0;PWNED␇" == str(screen.report.info.name)[: len("Name␛]0;PWNED␇")]
        assert_up(app)


def _json_bytes(value: object) -> bytes:
    return json.dumps(value).encode()


# repository -> (API path answered instead, status, body); None: the hub's own answer (see the test)
HOSTILE_REPOS: dict[str, tuple[int, bytes] | None] = {
    "evil/Error500-GGUF": (500, _json_bytes({"error": "Internal Server Error"})),
    "evil/Private-GGUF": (401, _json_bytes({"error": "Invalid credentials in Authorization header"})),
    "evil/NotJson-GGUF": (200, b"<html>this is not JSON"),
    "evil/Truncated-Json-GGUF": (200, b'{"id": "evil/Truncated-Json-GGUF", "sha": "'),
    "evil/List-Not-Object-GGUF": (200, _json_bytes([1, 2, 3])),
    "evil/Wrong-Types-GGUF": (
        200,
        _json_bytes(
            {
                "id": 5,
                "sha": ["x"],
                "siblings": "nope",
                "downloads": "many",
                "lastModified": 7,
                "gated": {"a": 1},
                "tags": 3,
            }
        ),
    ),
    "evil/Bad-Commit-GGUF": (200, _json_bytes({"id": "evil/Bad-Commit-GGUF", "sha": "../../../etc"})),
    "evil/Traversal-GGUF": None,
    "evil/Dropped-GGUF": None,
    "evil/Flaky-GGUF": None,
    "evil/Stalled-GGUF": None,
    "evil/Thousands-GGUF": None,
}
HOSTILE_SEARCHES = {
    "not-json": (200, b"[{"),
    "not-a-list": (200, _json_bytes({"models": []})),
    "wrong-entries": (200, _json_bytes([{"x": 1}, 5, None])),
    "wrong-types": (200, _json_bytes([{"id": 5, "downloads": "x", "likes": [], "lastModified": 3, "tags": 7}])),
    "error-500": (500, b"oops"),
}


@pytest.mark.anyio
async def test_f4_opens_hostile_repositories_and_says_why_in_one_line(
    hostile_hub: HostileHub, tiny_models: dict[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    for repo_id, canned in HOSTILE_REPOS.items():
        name = repo_id.split("/")[1].removesuffix("-GGUF")
        data = tiny_models["llama"].read_bytes() + repo_id.encode()  # its own bytes: the CDN finds files by sha256
        hostile_hub.add_repo(repo_id, {f"{name}-Q4_K_M.gguf": data})
        if canned is not None:
            hostile_hub.canned[f"/api/models/{repo_id}"] = canned
    hostile_hub.add_repo(
        "evil/Traversal-GGUF", {"../../../outside.gguf": tiny_models["llama"], "ok-Q4_K_M.gguf": tiny_models["llama"]}
    )
    hostile_hub.fault("evil/Dropped-GGUF", "Dropped-Q4_K_M.gguf", drop_at=100, drop_times=100)
    hostile_hub.fault("evil/Flaky-GGUF", "Flaky-Q4_K_M.gguf", errors_5xx=100)
    # 3,000 model files: grouping them into quants pairs each with its sidecars, time growing with the square
    hostile_hub.add_repo(
        "evil/Thousands-GGUF", {f"M{i:05d}-Q4_K_M.gguf": b"GGUF" + i.to_bytes(4, "little") for i in range(3000)}
    )
    hostile_hub.fault("evil/Stalled-GGUF", "Stalled-Q4_K_M.gguf", stall_at=100, stall_seconds=5.0, stall_times=100)
    # the header read's socket timeout, from 30 s to 1 s, so the stall trips it
    monkeypatch.setattr(fit.RangeReader.__init__, "__defaults__", (1.0,))
    outcomes = {}
    app = LlmtuiApp(str(tiny_models["llama"]), start_engine=False)
    async with app.run_test(size=(120, 40)) as pilot:
        screen = await open_models_screen(pilot, app)
        for repo_id in HOSTILE_REPOS:
            app.clear_notifications()
            await open_repo(pilot, app, screen, repo_id)
            assert_up(app)
            opened = screen.listing is not None and screen.listing.repo_id == repo_id
            if opened:  # listed; its header could not be read
                assert screen.report is None and screen.fit_error, repo_id
                assert_one_line(screen.fit_error)
                outcomes[repo_id] = f"no fit: {screen.fit_error}"
            else:
                text = await said(pilot, app, repo_id)
                outcomes[repo_id] = text
        assert "unsafe name" in outcomes["evil/Traversal-GGUF"]
        assert "lists 3,000 .gguf files" in outcomes["evil/Thousands-GGUF"]
        assert "500" in outcomes["evil/Error500-GGUF"]
        for kind, canned in HOSTILE_SEARCHES.items():  # the search itself answered by a hostile server
            app.clear_notifications()
            hostile_hub.canned["/api/models"] = canned
            screen.search_results = []
            await search(pilot, app, screen, "anything")
            outcomes[f"search {kind}"] = await said(pilot, app, "Search")
            assert_up(app)
    for repo_id, outcome in outcomes.items():
        print(f"{repo_id}: {outcome}")


# ----- 4. a hostile remote engine ---------------------------------------------------------------------------------

_GOOD_MODELS = _json_bytes({"object": "list", "data": [{"id": "m", "object": "model", "max_model_len": 2048}]})
_HOSTILE_TIMINGS = (
    b'data: {"choices": [{"delta": {"content": "Hi"}}]}\n\n'
    b'data: {"choices": [{"delta": {"content": 5}, "finish_reason": "stop"}], "usage": '
    b'{"completion_tokens": 1e308, "prompt_tokens": -7}, "timings": {"predicted_per_second": '
    b'Infinity, "draft_n": 1e300, "draft_n_accepted": -3, "prompt_ms": NaN, "predicted_n": 1e308}}'
    b"\n\ndata: [DONE]\n\n"
)


def _reply(content: str) -> bytes:
    """A stream answering `content` in one chunk, then stop."""
    chunk = {"choices": [{"delta": {"content": content}, "finish_reason": "stop"}]}
    return b"data: " + _json_bytes(chunk) + b"\n\ndata: [DONE]\n\n"


# behaviour -> (GET /v1/models body, POST /v1/chat/completions body); b"" after a stream body: written forever
REMOTE_BEHAVIOURS: dict[str, tuple[bytes, bytes]] = {
    "models-not-json": (b"<html>502 Bad Gateway</html>", b""),
    "models-not-a-list": (_json_bytes({"data": "everything"}), b""),
    "models-endless": (b'{"data": [' + b'{"id": "m"}, ' * 4096, b""),
    "stream-not-json": (_GOOD_MODELS, b"data: {this is not json\n\n"),
    "stream-endless-line": (_GOOD_MODELS, b"data: " + b"x" * 65536),
    "stream-hostile-numbers": (_GOOD_MODELS, _HOSTILE_TIMINGS),
    "stream-nested-quotes": (_GOOD_MODELS, _reply(">" * 20000 + " deep")),
    "stream-nested-lists": (_GOOD_MODELS, _reply("".join("  " * i + "- x\n" for i in range(400)))),
    "stream-brackets": (_GOOD_MODELS, _reply("[" * 5000 + "x" + "]" * 5000 + "*_" * 5000)),
    "stream-big-reply": (_GOOD_MODELS, _reply(("word " * 15 + "\n") * 6000)),  # 0.5 MB in one line
    "stream-control-chars": (_GOOD_MODELS, _reply("\x1b[2J\x1b]0;pwned\x07\x00\r\x08" * 500 + "```\n" * 500)),
}
_ENDLESS = {"models-endless": "GET", "stream-endless-line": "POST"}


class HostileRemote(QuietHTTPServer):
    """An OpenAI-compatible server that misbehaves as `behaviour` says (REMOTE_BEHAVIOURS)."""

    daemon_threads = True

    def __init__(self, behaviour: str) -> None:
        owner = self
        self.behaviour = behaviour
        self.stopping = threading.Event()
        self.sent = 0

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: object) -> None:
                pass

            def _answer(self, body: bytes, content_type: str) -> None:
                self.send_response(200)
                self.send_header("Content-Type", content_type)
                endless = _ENDLESS.get(owner.behaviour) == self.command
                if not endless:
                    self.send_header("Content-Length", str(len(body)))
                    self.send_header("Connection", "close")
                self.end_headers()
                try:
                    self.wfile.write(body)
                    owner.sent += len(body)
                    while endless and not owner.stopping.is_set():
                        self.wfile.write(body[-65536:])
                        owner.sent += min(len(body), 65536)
                except OSError:  # the client stopped reading: what is expected
                    pass
                self.close_connection = True

            def do_GET(self) -> None:  # noqa: N802 - http.server's name
                self._answer(REMOTE_BEHAVIOURS[owner.behaviour][0], "application/json")

            def do_POST(self) -> None:  # noqa: N802
                self.rfile.read(int(self.headers.get("Content-Length", "0")))
                self._answer(REMOTE_BEHAVIOURS[owner.behaviour][1], "text/event-stream")

        super().__init__(("127.0.0.1", 0), Handler)

    @property
    def remote(self) -> RemoteSettings:
        return RemoteSettings("hostile", f"http://127.0.0.1:{self.server_address[1]}/v1")


@pytest.fixture
def hostile_remote() -> Iterator[Callable[[str], HostileRemote]]:
    servers: list[HostileRemote] = []

    def start(behaviour: str) -> HostileRemote:
        server = HostileRemote(behaviour)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        servers.append(server)
        return server

    yield start
    for server in servers:
        server.stopping.set()
        server.shutdown()
        server.server_close()


@pytest.mark.anyio
@pytest.mark.parametrize("behaviour", list(REMOTE_BEHAVIOURS))
async def test_a_hostile_remote_engine_fails_in_one_line_and_the_app_stays(
    hostile_remote: Callable[[str], HostileRemote], tiny_models: dict[str, Path], behaviour: str
) -> None:
    server = hostile_remote(behaviour)
    save_config(Config(remotes=(server.remote,), last_model="remote:hostile/m"))
    app = LlmtuiApp()
    async with app.run_test(size=(120, 40)) as pilot:
        await wait_until(pilot, lambda: app.engine_state in ("ready", "error"), "the remote engine to answer")
        assert_up(app)
        chat = app.chat
        assert chat is not None
        if behaviour.startswith("models"):
            assert app.engine_state == "error"
            await said(pilot, app, "Could not load hostile/m")
            # the model switcher lists the server's models: its row says what went wrong instead
            await pilot.press("ctrl+l")
            switcher = app.screen
            assert isinstance(switcher, ModelSwitcherModal)
            await wait_until(pilot, lambda: "hostile" in switcher.remote_models, "the switcher's remote listing")
            listed = switcher.remote_models["hostile"]
            assert isinstance(listed, str)
            assert_one_line(listed)
            await pilot.press("escape")
        else:
            chat.prompt.load_text("hello")
            await pilot.press("enter")
            await wait_until(
                pilot, lambda: chat.replies.replies_started == 1 and chat.generation is None, "the reply to end"
            )
            assert chat.conversation_id is not None
            reply = app.store.tree.active_path(chat.conversation_id)[-1]
            if behaviour == "stream-hostile-numbers":  # absurd numbers from the server: a reply all the same
                assert reply.content == "Hi" and reply.state == "complete", (reply.state, reply.stats)
                await pilot.pause(0.1)  # time passes: the stats drawn, the app stays up
            elif behaviour.startswith("stream-") and behaviour != "stream-not-json" and "endless" not in behaviour:
                assert reply.state == "complete" and reply.content, (reply.state, reply.stats)  # shown as it came
                await pilot.pause(0.5)  # time passes: the app stays up
            else:
                assert reply.state == "error"
                assert_one_line(await said(pilot, app, "Generation failed"))
        assert server.sent < 64 << 20
        assert_up(app)


# ----- 5. switching to a hostile model: ctrl+l and the library (F4, u) ---------------------------------------------

SWITCH_KINDS = ("truncated", "not-gguf", "mutant-1")


@pytest.mark.anyio
async def test_switching_to_hostile_models_says_why_and_a_good_model_still_loads(
    hostile_folder: dict[str, Path], tiny_models: dict[str, Path]
) -> None:
    from app.tui.modals.pick import PickModal
    from app.tui.modals.speculative import SpeculativeModal
    from app.tui.screens.chat_screen import ChatScreen
    from app.tui.screens.steering_panel import SteeringPanel

    folder = hostile_folder["truncated"].parent
    good = folder / "good-llama.gguf"
    shutil.copyfile(tiny_models["llama"], good)
    use_folder(folder)
    steering = paths.data_dir() / "steering"
    steering.mkdir(parents=True)
    for kind in ("truncated", "huge-array", "not-gguf", "empty", "mutant-1", "block-count"):
        shutil.copyfile(hostile_folder[kind], steering / f"vector-{kind}.gguf")
    # a damaged catalog overlay: the draft search reads the catalog (a count that is not one keeps the catalog's)
    (paths.data_dir() / "catalog-refresh.json").write_text(json.dumps({"qwen3.5-2b": {"context_length": "x"}}))
    app = LlmtuiApp(str(good))
    async with app.run_test(size=(120, 40)) as pilot:
        await wait_until(pilot, lambda: app.engine_state == "ready", "the good model to load")
        for kind in SWITCH_KINDS:  # ctrl+l, filter to the file, Enter
            path = hostile_folder[kind]
            app.clear_notifications()
            await pilot.press("ctrl+l")
            switcher = app.screen
            assert isinstance(switcher, ModelSwitcherModal)
            await wait_until(pilot, lambda s=switcher: not s.scanning, "the model folders, scanned in a thread")
            assert path.stem in [m.name for m in switcher.models]
            await pilot.press(*path.stem, "enter")
            await wait_until(
                pilot,
                lambda p=path: app.model_path == str(p) and app.engine_state in ("error", "ready"),
                f"{kind} to be refused",
            )
            assert_up(app)
            if app.engine_state == "error":
                await said(pilot, app, f"Could not load {path.name}")
        # the library: F4, Local, highlight a hostile model, u
        screen = await open_local_tab(pilot, app)
        await wait_until(
            pilot,
            lambda: any(m.path == hostile_folder["not-gguf"] for m in screen.local_models),
            "the hostile models in the Local tab",
        )
        local_list = screen.query_one("#local-list", OptionList)
        local_list.focus()
        local_list.highlighted = [m.path for m in screen.local_models].index(hostile_folder["not-gguf"])
        await wait_until(
            pilot,
            lambda: screen.local is not None and screen.local.path == hostile_folder["not-gguf"],
            "the hostile model in the detail pane",
        )
        app.clear_notifications()
        await pilot.press("u")
        await wait_until(pilot, lambda: app.screen is app.chat and app.engine_state == "error", "the refusal")
        await said(pilot, app, "Could not load hostile-not-gguf.gguf")
        # a good model loads after all that, and the panels that read the model's header open
        app.open_model(good)
        await wait_until(pilot, lambda: app.engine_state == "ready" and app.model is not None, "the good model again")
        assert_up(app)
        # F9, ctrl+d: the drafts on this machine that fit the model (every model's header in the folder is read)
        await pilot.press("f9")
        await wait_until(pilot, lambda: isinstance(app.screen, SpeculativeModal), "the speculative panel")
        app.clear_notifications()
        await pilot.press("ctrl+d")
        await wait_until(pilot, lambda: isinstance(app.screen, PickModal) or bool(messages(app)), "the drafts found")
        assert_up(app)
        assert_one_line(await said(pilot, app, "No draft fits this model"))  # searched past the damaged overlay
        await pilot.press("escape")
        if not isinstance(app.screen, ChatScreen):
            await pilot.press("escape")
        # F6 lists the control vectors of the steering folder (hostile files there too); a: add one by its path
        await pilot.press("f6")
        await wait_until(pilot, lambda: app.screen.query_one(SteeringPanel).is_open, "the steering panel")
        await pilot.pause()
        assert_up(app)
        await pilot.press("a")
        await wait_until(pilot, lambda: bool(app.screen.query("#text-prompt-input")), "the add dialog")
        app.screen.query_one("#text-prompt-input").value = "~nosuchuser-llmtui/vector.gguf"  # type: ignore[attr-defined]
        await pilot.press("enter")
        await said(pilot, app, "cannot be a path to a control vector")
        await pilot.press("a")
        await wait_until(pilot, lambda: bool(app.screen.query("#text-prompt-input")), "the add dialog")
        app.screen.query_one("#text-prompt-input").value = str(hostile_folder["huge-array"])  # type: ignore[attr-defined]
        await pilot.press("enter")
        await said(pilot, app, "Cannot use", "huge-array")
        assert_up(app)


# ----- files the app reads about the library: config.toml's folders, the catalog's refreshed facts ---------------


@pytest.mark.anyio
async def test_hostile_folders_in_config_and_a_damaged_catalog_overlay_leave_f4_and_ctrl_l_working(
    app_dirs: tuple[Path, Path], tiny_models: dict[str, Path]
) -> None:
    config_dir, data_dir = app_dirs
    config_dir.mkdir(parents=True, exist_ok=True)
    data_dir.mkdir(parents=True, exist_ok=True)
    good_folder = tiny_models["llama"].parent
    # a NUL byte in a path (the OS refuses the name: ValueError), ~ of a user this machine does not have
    # (RuntimeError from expanduser); the settings screen takes any text as a folder
    (config_dir / "config.toml").write_text(
        f'[models]\nlast_model = "/tmp/a\\u0000b.gguf"\n'
        f'folders = ["/tmp/x\\u0000y", "~nosuchuser-llmtui/models", "{good_folder}"]\n'
    )
    (data_dir / "catalog-refresh.json").write_text(json.dumps({"qwen3.5-2b": {"context_length": "very long"}}))
    app = LlmtuiApp(start_engine=False)
    async with app.run_test(size=(120, 40)) as pilot:
        await pilot.pause()
        assert "/tmp/x\0y" in app.config.model_folders
        await pilot.press("ctrl+l")
        await wait_until(pilot, lambda: isinstance(app.screen, ModelSwitcherModal), "the model switcher")
        switcher = app.screen
        assert isinstance(switcher, ModelSwitcherModal)
        await wait_until(pilot, lambda: not switcher.scanning, "the model folders, scanned in a thread")
        assert tiny_models["llama"].stem in [m.name for m in switcher.models]  # the good folder still listed
        await pilot.press("escape")
        screen = await open_local_tab(pilot, app)
        await wait_until(
            pilot,
            lambda: any(m.path == tiny_models["llama"] for m in screen.local_models),
            "the good folder's models in F4",
        )
        # The damaged overlay's count is read past (the catalog's own stays): the catalog is there, nothing to say.
        from models_catalog.catalog import load_catalog

        entry = load_catalog(overlay_path=data_dir / "catalog-refresh.json").get("qwen3.5-2b")
        assert entry is not None and isinstance(entry.context_length, int) and entry.context_length > 0
        await pilot.pause(0.3)  # time passes: no notice comes
        assert not [m for m in messages(app) if "could not be read" in m], messages(app)
        assert_up(app)


@pytest.mark.anyio
async def test_paths_typed_that_cannot_be_paths_are_refused_in_one_line(tiny_models: dict[str, Path]) -> None:
    from app.tui.modals.speculative import SpeculativeModal
    from app.tui.modals.text_prompt import TextPromptModal

    bad = "~nosuchuser-llmtui/model.gguf"
    app = LlmtuiApp(bad, start_engine=False)  # llmtui -m ~nosuchuser/model.gguf
    async with app.run_test(size=(120, 40)) as pilot:
        await said(pilot, app, "cannot be a path")
        # the speculative panel's draft field (F9): typed, then applied
        app.model_path = str(tiny_models["llama"])
        await pilot.press("f9")
        await wait_until(pilot, lambda: isinstance(app.screen, SpeculativeModal), "the speculative panel")
        panel = app.screen
        await wait_until(pilot, lambda: not panel.reading, "the panel's types, read in a thread")  # type: ignore[attr-defined]
        panel.query_one("#spec-draft").value = bad  # type: ignore[attr-defined]
        await pilot.pause()
        await pilot.press("ctrl+s")
        await said(pilot, app, "draft model:", "cannot be a path")
        assert app.screen is panel
        await pilot.press("escape")
        # importing a conversation from a path
        app.action_import_conversation()
        await wait_until(
            pilot,
            lambda: isinstance(app.screen, TextPromptModal) and bool(app.screen.query("#text-prompt-input")),
            "the import dialog",
        )
        app.screen.query_one("#text-prompt-input").value = bad  # type: ignore[attr-defined]
        await pilot.press("enter")
        await said(pilot, app, repr(bad), "cannot be a path")
        assert_up(app)


@pytest.mark.anyio
async def test_a_server_listing_150000_models_and_symlink_loops_keep_the_switcher_and_f4_usable(
    hostile_remote: Callable[[str], HostileRemote],
    tiny_models: dict[str, Path],
    hf_env: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from app.tui.modals.model_switcher import MAX_ROWS

    # 150,000 model ids: 1.7 MB, within the 8 MiB a model list may have; one option each froze the app for a minute
    many = _json_bytes({"data": [{"id": f"model-{i}"} for i in range(150_000)]})
    monkeypatch.setitem(REMOTE_BEHAVIOURS, "many-models", (many, b""))
    server = hostile_remote("many-models")
    folder = tmp_path / "loops"  # a folder that contains itself, and a file that is a link to itself
    folder.mkdir()
    (folder / "loop").symlink_to(folder)
    (folder / "self.gguf").symlink_to(folder / "self.gguf")
    shutil.copyfile(tiny_models["llama"], folder / "good.gguf")
    snapshot = put_in_hf_cache(hf_env, "evil/Loops-GGUF", {"Good-Q8_0.gguf": tiny_models["qwen3"]})
    (snapshot / "loop").symlink_to(snapshot)
    (snapshot / "self-Q4_0.gguf").symlink_to(snapshot / "self-Q4_0.gguf")
    save_config(Config(remotes=(server.remote,), model_folders=(str(folder),)))
    app = LlmtuiApp(str(tiny_models["llama"]), start_engine=False)
    async with app.run_test(size=(120, 40)) as pilot:
        await pilot.press("ctrl+l")
        switcher = app.screen
        assert isinstance(switcher, ModelSwitcherModal)
        await wait_until(pilot, lambda: not switcher.scanning, "the model folders, scanned in a thread")
        assert "good" in [m.name for m in switcher.models]
        await wait_until(pilot, lambda: "hostile" in switcher.remote_models, "the 150,000 models")
        options = switcher.query_one(OptionList)
        assert options.option_count <= len(switcher.models) + MAX_ROWS + 1
        assert "149700 more models" in str(options.get_option_at_index(options.option_count - 1).prompt)
        await pilot.press(*"model-14999")  # narrows to model-14999 and model-149990…149999
        await wait_until(pilot, lambda: options.option_count == 11, "the filtered list")
        await pilot.press("enter")
        await wait_until(pilot, lambda: app.model_path == "remote:hostile/model-14999", "the remote model chosen")
        screen = await open_local_tab(pilot, app)
        await wait_until(pilot, lambda: any(m.path.name == "good.gguf" for m in screen.local_models), "F4's list")
        assert any(m.path.name == "Good-Q8_0.gguf" for m in screen.local_models)
        assert_up(app)


@pytest.mark.anyio
async def test_a_damaged_model_usage_file_is_said_in_one_line_in_f4(
    app_dirs: tuple[Path, Path], tiny_models: dict[str, Path]
) -> None:
    data_dir = app_dirs[1]
    data_dir.mkdir(parents=True, exist_ok=True)
    (data_dir / "model-usage.json").write_text(json.dumps({str(tiny_models["llama"]): None}))
    use_folder(tiny_models["llama"].parent)
    app = LlmtuiApp(str(tiny_models["llama"]), start_engine=False)
    async with app.run_test(size=(120, 40)) as pilot:
        screen = await open_local_tab(pilot, app)
        # (the library gives up on the whole list: a bug of models_catalog.library._usage, see the issue's notes)
        await wait_until(pilot, lambda: bool(screen.local_models) or bool(messages(app)), "the list or why not")
        if not screen.local_models:
            assert_one_line(await said(pilot, app, "Listing local models"))
        assert_up(app)
