"""A hostile repository cannot make llmtui write outside the Hugging Face cache: file names and ids from a listing
are checked before any path is built from them. Nor can its ids, tags, card or files' names (or a remote server's
error, or a model file's names) write escape codes to the terminal: engine_ext/untrusted_text.py shows them."""

from __future__ import annotations

import json
import os
import random
import re
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from app.core.config import RemoteSettings
from models_catalog import hub
from models_catalog.errors import HubError
from models_catalog.hfcache import RepoCache, is_oid, safe_repo_path
from tests.hub_server import HubServer

COMMIT = "a" * 40
SHA256 = "b" * 64


@pytest.mark.parametrize("path", ["model.gguf", "sub/dir/model-Q4_K_M.gguf", "mtp-model.gguf", "a..b.gguf"])
def test_ordinary_repository_paths_are_safe(path: str) -> None:
    assert safe_repo_path(path)


@pytest.mark.parametrize(
    "path",
    [
        "../evil.gguf",
        "a/../../evil.gguf",
        "/etc/passwd",
        "a//b.gguf",
        "./a.gguf",
        "a\\..\\b.gguf",
        "a\0b.gguf",
        "",
        "x" * 2000,
        "dir/",
    ],
)
def test_paths_that_leave_the_snapshot_are_refused(path: str, tmp_path: Path) -> None:
    assert not safe_repo_path(path)
    with pytest.raises(HubError, match="unsafe file path"):
        RepoCache(tmp_path, "org/repo").pointer(COMMIT, path)


@pytest.mark.parametrize("oid", ["../../x", "abc", SHA256.upper(), SHA256 + "0", ""])
def test_blob_ids_must_be_ids(oid: str, tmp_path: Path) -> None:
    assert not is_oid(oid)
    cache = RepoCache(tmp_path, "org/repo")
    for build in (cache.blob, cache.partial):
        with pytest.raises(HubError, match="unsafe blob id"):
            build(oid)
    with pytest.raises(HubError, match="unsafe commit"):
        cache.pointer("../" + COMMIT[3:], "model.gguf")
    assert is_oid(SHA256) and is_oid(COMMIT)


def test_a_listing_with_a_traversal_name_is_refused(hub_server: HubServer) -> None:
    hub_server.add_repo("evil/Traversal-GGUF", {"../../../outside.gguf": b"GGUF" + b"\0" * 60, "ok.gguf": b"GGUF"})
    with pytest.raises(HubError, match=r"unsafe name or id \('\.\./\.\./\.\./outside\.gguf'\)"):
        hub.list_repo("evil/Traversal-GGUF")
    hub_server.add_repo("good/Plain-GGUF", {"model-Q4_K_M.gguf": b"GGUF" + b"\0" * 60})
    assert [f.path for f in hub.list_repo("good/Plain-GGUF").files] == ["model-Q4_K_M.gguf"]


# ----- terminal escapes from untrusted text (issue 32, class 3) --------------------------------------------------

ESCAPES = "\x1b]0;PWNED\x07\x1b[2J\x9b31m\u202e\x00"
RAW_CONTROLS = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069\ud800-\udfff]")


def assert_no_raw_controls(text: str) -> None:
    found = RAW_CONTROLS.search(text)
    assert found is None, (
        f"{found.group()!r} at {found.start()}: {text[max(0, found.start() - 80) : found.start() + 80]!r}"
    )


def test_search_hides_ids_with_controls_and_shows_tags_and_dates_cleanly(hub_server: HubServer) -> None:
    hub_server.add_repo(f"evil/Name{ESCAPES}-GGUF", {"m.gguf": b"GGUF"}, downloads=9)
    hub_server.add_repo(
        "good/Plain-GGUF",
        {"m.gguf": b"GGUF"},
        tags=("gguf", f"tag{ESCAPES}"),
        last_modified=f"2026{ESCAPES}",
        downloads=1,
    )
    hits = hub.search("GGUF")
    assert [h.repo_id for h in hits] == ["good/Plain-GGUF"]
    assert_no_raw_controls(json.dumps(hits[0].to_dict(), ensure_ascii=False))
    assert "tag␛]0;PWNED␇␛[2J<U+009B>31m<U+202E>␀" in hits[0].tags


def test_a_listed_file_whose_name_holds_controls_is_refused(hub_server: HubServer) -> None:
    hub_server.add_repo("evil/Files-GGUF", {f"m{ESCAPES}.gguf": b"GGUF"})
    with pytest.raises(HubError, match="unsafe name or id") as refused:
        hub.list_repo("evil/Files-GGUF")
    assert_no_raw_controls(str(refused.value))


def test_a_card_keeps_its_lines_and_shows_its_controls(hub_server: HubServer) -> None:
    card = f"# Title{ESCAPES}\r\nsecond\tline\n\x1b[31mred\x1b[0m\n".encode() + b"\xed\xa0\x80 bad utf-8\n"
    hub_server.add_repo("good/Card-GGUF", {"README.md": card})
    text = hub.model_card("good/Card-GGUF")
    assert_no_raw_controls(text)
    assert text.splitlines() == [
        "# Title␛]0;PWNED␇␛[2J<U+009B>31m<U+202E>␀",
        "second\tline",
        "␛[31mred␛[0m",
        "��� bad utf-8",
    ]


def test_a_remote_servers_error_body_is_shown_without_its_escapes() -> None:
    from app.core.remote_http import http_error_message

    remote = RemoteSettings("srv", "http://127.0.0.1:9/v1")
    body = json.dumps({"error": {"message": f"bad{ESCAPES}" + "x\n" * 5000}}).encode()
    message = http_error_message(remote, 500, f"Oops{ESCAPES}", body)
    assert_no_raw_controls(message)
    assert "\n" not in message and len(message) <= 300 and "bad␛]0;PWNED␇" in message


def test_cli_search_info_and_card_print_no_escapes(
    hub_server: HubServer, hf_env: Path, tmp_path: Path, tiny_models: dict[str, Path]
) -> None:
    from tests.hub.test_cli_models import llmtui

    hub_server.add_repo(f"evil/Esc{ESCAPES}-GGUF", {"m.gguf": b"GGUF"}, downloads=5)
    hub_server.add_repo(
        "good/Tiny-GGUF",
        {"Tiny-Q8_0.gguf": tiny_models["llama"], "README.md": f"# Card{ESCAPES}\nbody\n".encode()},
        tags=("gguf", f"t{ESCAPES}"),
        downloads=1,
    )
    for args in (["search", "GGUF"], ["search", "GGUF", "--json"], ["info", "good/Tiny-GGUF", "--card"]):
        result = llmtui(*args, tmp=tmp_path)
        assert result.returncode == 0, result.stderr
        assert_no_raw_controls(result.stdout + result.stderr)
    assert "Card␛]0;PWNED␇" in result.stdout


def test_cli_info_shows_a_files_names_without_escapes(tiny_models: dict[str, Path], tmp_path: Path) -> None:
    from tests.hub.test_cli_models import ROOT
    from tests.unit.test_gguf_fuzz import _STR, _write_edited

    path = _write_edited(
        tiny_models["llama"],
        tmp_path / "named.gguf",
        [("general.name", _STR, -1, f"N{ESCAPES}"), ("tokenizer.ggml.pre", _STR, -1, f"P{ESCAPES}")],
    )
    env = dict(os.environ, LLMTUI_DATA_DIR=str(tmp_path / "data"), LLMTUI_CONFIG_DIR=str(tmp_path / "config"))
    for extra in ([], ["--json"]):
        result = subprocess.run(
            [sys.executable, "-m", "app", "info", str(path), *extra],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert result.returncode == 0, result.stderr
        assert_no_raw_controls(result.stdout + result.stderr)
        assert "N␛]0;PWNED␇" in result.stdout


def test_fuzzed_untrusted_text_never_shows_a_raw_control() -> None:
    """Seeded fuzz of the one function: random mixes of escapes, C1 and bidi controls, surrogates and text."""
    from engine_ext.untrusted_text import json_text, one_line, shown

    rng = random.Random(32)
    # one lone high surrogate (with a low one after it, JSON would read the two as one character)
    alphabet = [chr(c) for c in range(0x00, 0xA0)] + ["\u202e", "\u2066", "\ud800", "é", "中", "🙂", " "]
    for _ in range(2000):
        text = "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 400)))
        assert_no_raw_controls(shown(text))
        kept = shown(text, multiline=True)
        assert_no_raw_controls(kept)
        assert "\r" not in kept
        line = one_line(text)
        assert_no_raw_controls(line)
        assert "\n" not in line and "\t" not in line and len(line) <= 300
        assert json.loads(json_text({"k": text})) == {"k": text}
        assert_no_raw_controls(json_text({"k": text}, indent=2))
    assert shown("a\udfffb") == "a\ufffdb"


def test_a_hub_errors_reason_header_and_body_are_shown_without_escapes(
    hf_env: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from http.server import BaseHTTPRequestHandler

    from tests.quiet_http import QuietHTTPServer

    class Erring(BaseHTTPRequestHandler):
        def log_message(self, *args: object) -> None:  # quiet
            pass

        def do_GET(self) -> None:  # noqa: N802 - http.server's name
            body = f"body{ESCAPES}".encode()
            in_latin1 = ESCAPES.replace("\x00", "").replace("\u202e", "")  # what a status line and header carry
            self.send_response(418, f"Teapot{in_latin1}")
            self.send_header("X-Error-Message", f"header{in_latin1}")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

    server = QuietHTTPServer(("127.0.0.1", 0), Erring)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{server.server_address[1]}")
        with pytest.raises(HubError) as refused:
            hub.search("x")
    finally:
        server.shutdown()
        server.server_close()
    message = str(refused.value)
    assert_no_raw_controls(message)
    assert "Teapot␛]0;PWNED␇" in message and "\n" not in message and len(message) <= 300


def test_model_files_named_with_controls_are_listed_with_them_shown(
    tiny_models: dict[str, Path], tmp_path: Path, hf_env: Path
) -> None:
    """A file name is text from outside too (another tool may have saved a hostile repository's names)."""
    import shutil

    from app.core.model_list import local_models
    from tests.hub.test_cli_models import llmtui

    folder = tmp_path / "models"
    folder.mkdir()
    name = ESCAPES.replace("\x00", "").replace("/", "")
    shutil.copyfile(tiny_models["llama"], folder / f"m{name}.gguf")
    listed = [m.name for m in local_models([str(folder)])]
    assert "m␛]0;PWNED␇␛[2J<U+009B>31m<U+202E>" in listed
    for args in (["list", "--dir", str(folder)], ["list", "--dir", str(folder), "--json"]):
        result = llmtui(*args, tmp=tmp_path)
        assert result.returncode == 0, result.stderr
        assert_no_raw_controls(result.stdout + result.stderr)
