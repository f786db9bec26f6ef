"""Drive the real app in tmux through issue 22's Models items, against a local Hub of tiny models (no network).

    .venv/bin/python scripts/tmux_models.py [--size 100x24] [--keep]    # issue 37's walk: --size 80x24

A throwaway HOME, Hugging Face cache and config; the local Hub (tests/hub_server.py) serves a tiny Qwen3.5 repo
whose Q8_0 arrives slowly (100 KB/s). Steps, each printed as the screen shows it:

  1. F4, `/` (focuses the search box), "tiny", Enter, one Enter opens the result; Q8_0, Enter, Enter downloads it;
  2. p (the focus on the quants) pauses it; x asks before deleting it, n keeps it; 3: the Local tab lists the partial
     with its bytes / total and %;
  3. ctrl+q asks (a download is unfinished); Quit. The app again: F4, 3, the partial is there; Enter resumes it;
  4. ctrl+l lists the downloaded quants with quant, size, "needs …" (F4's memory figure) and +mtp.

Fails (exit 1) naming the step whose expected text is not on the screen. Needs tmux.
"""

from __future__ import annotations

import argparse
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.hub_server import HubServer  # noqa: E402
from tests.tiny_models import write_all  # noqa: E402

REPO = "org/Tiny-Qwen35-GGUF"
SESSION = "llmtui-models-demo"


def tmux(*args: str) -> str:
    return subprocess.run(["tmux", *args], check=True, capture_output=True, text=True).stdout


def screen() -> str:
    return tmux("capture-pane", "-t", SESSION, "-p")


def keys(*names: str, pause: float = 0.4) -> None:
    for name in names:
        tmux("send-keys", "-t", SESSION, name)
        time.sleep(pause)


def wait_screen(step: str, test: Callable[[str], bool], timeout: float = 30.0) -> str:
    deadline = time.monotonic() + timeout
    while True:
        text = screen()
        if test(text):
            print(f"--- {step}: ok\n{text}")
            return text
        if time.monotonic() > deadline:
            print(f"--- {step}: NOT SEEN within {timeout:g} s\n{text}")
            raise SystemExit(1)
        time.sleep(0.3)


def start_app(env: dict[str, str], model: Path, size: tuple[int, int]) -> None:
    exports = " ".join(f"{k}={shlex.quote(v)}" for k, v in env.items())
    command = f"cd {shlex.quote(str(ROOT))} && env {exports} {shlex.quote(sys.executable)} -m app -m {model}; sleep 5"
    tmux("new-session", "-d", "-s", SESSION, "-x", str(size[0]), "-y", str(size[1]), command)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--size", default="100x24", help="terminal size, COLSxROWS")
    parser.add_argument("--keep", action="store_true", help="keep the temporary folder (its path is printed)")
    args = parser.parse_args()
    size = tuple(int(n) for n in args.size.split("x"))
    if shutil.which("tmux") is None:
        print("tmux is not installed", file=sys.stderr)
        return 2
    work = Path(tempfile.mkdtemp(prefix="llmtui-models-demo-"))
    models = write_all(work / "tiny")
    hub = HubServer()
    hub.add_repo(
        REPO,
        {
            "Tiny-Q4_K_M.gguf": models["qwen35_mtp"],
            "Tiny-Q8_0.gguf": models["qwen35"],
            "mtp-Tiny-Q8_0.gguf": models["qwen35_mtp_sidecar"],
        },
        downloads=42,
    )
    hub.fault(REPO, "Tiny-Q8_0.gguf", throttle_bps=100_000)
    hub.start()
    home = work / "home"
    env = {
        "HOME": str(home),
        "HF_HOME": str(home / "hf"),
        "HF_ENDPOINT": hub.url,
        "LLMTUI_CONFIG_DIR": str(home / "config"),
        "LLMTUI_DATA_DIR": str(home / "data"),
        "XDG_CACHE_HOME": str(home / "cache"),
        "XDG_STATE_HOME": str(home / "state"),
        "TERM": os.environ.get("TERM", "xterm-256color"),
    }
    try:
        start_app(env, models["llama"], size)  # type: ignore[arg-type]
        wait_screen("the chat", lambda s: "ready" in s, 60)
        keys("F4")
        wait_screen("F4", lambda s: "Catalog" in s and "Search" in s)
        keys("/", "t", "i", "n", "y", "Enter")
        wait_screen("/ focused the search box; the results", lambda s: REPO in s)
        keys("Enter")
        wait_screen("one Enter opened the repo", lambda s: "Q8_0" in s and "fits" in s)
        keys("Up", "Enter")
        wait_screen("the download dialog", lambda s: "Download org/Tiny-Qwen35-GGUF:Q8_0" in s)
        keys("Enter", pause=1.5)
        keys("p")
        wait_screen("p paused it with the focus on the quants", lambda s: "paused" in s)
        keys("x")  # a cancel deletes the partial file: it asks first (issue 37 item 3)
        wait_screen("x asks before deleting the partial", lambda s: "y delete · n or Esc keep" in s)
        keys("n")
        wait_screen("n kept it", lambda s: "paused" in s and "y delete" not in s)
        keys("3")
        wait_screen("the Local tab lists the partial", lambda s: "partial" in s and "%" in s)
        keys("C-q")
        wait_screen("ctrl+q asks", lambda s: "download not finished" in s)
        keys("Enter", pause=3)  # Quit
        tmux("kill-session", "-t", SESSION)
        start_app(env, models["llama"], size)  # type: ignore[arg-type]
        wait_screen("the chat again", lambda s: "ready" in s, 60)
        keys("F4", "3", "Down")
        wait_screen("after a restart, the partial in Local", lambda s: "Partial download" in s and "%" in s)
        keys("Enter")
        wait_screen("Enter resumed it to the end", lambda s: f"{REPO}:Q8_0" in s and "Partial download" not in s)
        keys("Escape", "C-l")
        wait_screen("ctrl+l lists it", lambda s: f"{REPO}:Q8_0" in s and "needs" in s and "+mtp" in s)
        keys("Escape")
    finally:
        subprocess.run(["tmux", "kill-session", "-t", SESSION], capture_output=True)
        hub.stop()
        if args.keep:
            print(f"kept: {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
