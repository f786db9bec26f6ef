"""CPU weight repacking under the user's control (--no-repack), and recovery from a native crash in it.

AMX's repack path crashed a user's Xeon on the first message; the worker's test switch LLMTUI_TEST_FAULT makes it
crash natively (SIGSEGV) where that path would, while weights are repacked for one extra buffer type (this CPU's
first: `_fault`), so the tests hold with one extra buffer type (CPU_REPACK), two (AMX and CPU_REPACK) or none
(skipped). The phases a crash is blamed for are in the tests at the end.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from dataclasses import replace
from functools import partial
from pathlib import Path

import pytest

from app.core.config import EngineSettings, SamplingSettings, load_config, save_config
from app.tui.app import LlmtuiApp
from engine_ext.params import ContextParams, ModelParams
from engine_ext.recovery import (
    RepackMemory,
    fallbacks,
    machine_key,
    native_crash,
    next_skip,
    repack_retry,
    retry_notice,
)
from engine_ext.worker import FAULT_ENV
from tests.waits import wait_until

ROOT = Path(__file__).resolve().parents[2]
SHORT = SamplingSettings(temperature=0.0, max_tokens=12)
WAIT_S = 90.0  # a restart spawns a worker and loads the model again: generous on a busy machine
wait = partial(wait_until, timeout_s=WAIT_S)

pytestmark = pytest.mark.usefixtures("app_dirs")


def _extra_bufts() -> tuple[str, ...]:
    from engine_ext.bindings import cpu_extra_buffer_types

    return cpu_extra_buffer_types()


def _fault(stage: str) -> str:
    """The test fault of `stage` (load, decode) tied to this CPU's first extra buffer type: recovery leaves that one
    out and the others run."""
    return f"repack-{stage}:{_extra_bufts()[0]}"


needs_extra_bufts = pytest.mark.skipif(
    not _extra_bufts(),
    reason="this build on this CPU has no extra buffer types "
    "(nothing is repacked, so there is nothing to recover from)",
)


# ----- the policy -----------------------------------------------------------------------------------------


def test_only_native_faults_count() -> None:
    assert native_crash(-signal.SIGSEGV) and native_crash(-signal.SIGABRT) and native_crash(-signal.SIGILL)
    assert not native_crash(-signal.SIGKILL)  # the out-of-memory killer, or a user
    assert not native_crash(-signal.SIGTERM) and not native_crash(1) and not native_crash(0)
    assert not native_crash(None)


def test_repack_retry_turns_repacking_off_only_when_it_was_in_use() -> None:
    on = ModelParams()
    assert on.use_extra_bufts  # llama.cpp's default
    assert repack_retry(on, ("CPU_REPACK",)) == replace(on, use_extra_bufts=False)
    assert repack_retry(on, ()) is None  # no extra buffer types in this build: nothing was repacked
    assert repack_retry(replace(on, use_extra_bufts=False), ("AMX",)) is None
    notice = retry_notice("AMX", ("CPU_REPACK",), "Add --no-repack to turn repacking off altogether.")
    assert "repacked for AMX" in notice and "without AMX (CPU_REPACK kept)" in notice and "\n" not in notice
    assert "--no-repack" in notice and len(notice) <= 300
    assert "no repacking left" in retry_notice("CPU_REPACK", (), "")


def test_a_crash_drops_one_extra_buffer_type_at_a_time() -> None:
    on = ModelParams()
    # AMX first (llama.cpp lists it first, and its path is the one that crashed): CPU_REPACK stays.
    assert next_skip(on, (), ("AMX", "CPU_REPACK")) == ("AMX",)
    assert next_skip(on, ("AMX",), ("CPU_REPACK",)) == ("AMX", "CPU_REPACK")
    assert next_skip(on, ("AMX", "CPU_REPACK"), ()) is None  # nothing left: not the repacking's crash
    assert next_skip(replace(on, use_extra_bufts=False), (), ("AMX",)) is None


def test_the_memory_is_per_cpu_and_engine_build_and_survives_hostile_files(tmp_path: Path) -> None:
    path = tmp_path / "state" / "engine-recovery.json"
    here, other = RepackMemory(path, key="a" * 24), RepackMemory(path, key="b" * 24)
    assert here.skipped() == () and here.describe() == ""
    here.remember(("AMX",))
    assert here.skipped() == ("AMX",) and other.skipped() == ()
    assert "AMX" in here.describe() and "since" in here.describe()
    assert oct(path.stat().st_mode & 0o777) == "0o600"
    other.remember(("AMX", "CPU_REPACK"))
    assert here.skipped() == ("AMX",) and other.skipped() == ("AMX", "CPU_REPACK")
    assert here.forget() and here.skipped() == () and not here.forget()
    assert other.skipped() == ("AMX", "CPU_REPACK")
    # Whatever else is in the file reads as nothing remembered; names that are not buffer types are ignored.
    for bad in (b"{", b"[]", b'{"entries": 3}', b"x" * (70 * 1024), '{"entries": {"' + "a" * 24 + '": {"skip": 5}}}'):
        path.write_bytes(bad if isinstance(bad, bytes) else bad.encode())
        assert here.skipped() == ()
    path.write_text('{"entries": {"' + "a" * 24 + '": {"skip": ["AMX", "../x", "", 7, "' + "Z" * 40 + '"]}}}')
    assert here.skipped() == ("AMX",)
    # Keys: another CPU or another engine build is another key.
    cpu = tmp_path / "cpuinfo"
    cpu.write_text("processor : 0\nmodel name : Xeon\nflags : avx512f amx_tile\n\nprocessor : 1\n")
    engine = tmp_path / "llama_cpp"
    (engine / "lib").mkdir(parents=True)
    (engine / "lib" / "libggml-cpu.so").write_bytes(b"x")
    key = machine_key(cpu, engine)
    assert key == machine_key(cpu, engine)
    (engine / "lib" / "libggml-cpu.so").write_bytes(b"xy")  # a rebuilt engine
    assert machine_key(cpu, engine) != key
    cpu.write_text("processor : 0\nmodel name : Xeon\nflags : avx512f\n")
    assert machine_key(cpu, engine) not in (key, machine_key(cpu.with_name("missing"), engine))


def test_fallbacks_leave_out_what_is_already_safe() -> None:
    keys = [f.key for f in fallbacks(ModelParams(), ContextParams(n_ctx=4096), n_threads=4, gpu_devices=1)]
    assert keys == ["no-repack", "threads", "no-mmap", "cpu-only", "small-context"]
    # Without a device to offload to, -ngl 0 changes nothing; RPC servers are devices too.
    assert "cpu-only" not in [f.key for f in fallbacks(ModelParams(), ContextParams(), 4, gpu_devices=0)]
    assert "cpu-only" in [f.key for f in fallbacks(ModelParams(rpc_servers=("h:1",)), ContextParams(), 4, 0)]
    threads = next(f for f in fallbacks(ModelParams(), ContextParams(), 4, 0) if f.key == "threads")
    assert (threads.flag, threads.field, threads.value) == ("-t 2", "n_threads", 2)
    safe = fallbacks(
        ModelParams(use_extra_bufts=False, use_mmap=False, n_gpu_layers=0), ContextParams(n_ctx=2048), 1, gpu_devices=1
    )
    assert safe == ()
    # Every fallback names a real engine setting of the app, with a value of its type.
    for fallback in fallbacks(ModelParams(), ContextParams(n_ctx=0), 8, gpu_devices=1):
        default = getattr(EngineSettings(), fallback.field)
        assert type(default) is type(fallback.value)
        replace(EngineSettings(), **{fallback.field: fallback.value}).validate()


# ----- --no-repack reaches llama.cpp ------------------------------------------------------------------------


def test_no_repack_changes_themodel_params() -> None:
    from engine_ext.model import model_params_struct

    assert model_params_struct(ModelParams()).use_extra_bufts is True
    assert model_params_struct(ModelParams(use_extra_bufts=False)).use_extra_bufts is False
    assert EngineSettings(use_extra_bufts=False).model_params().use_extra_bufts is False

    from app.cli import build_parser
    from app.cli.engine_args import model_params

    for command in ("run", "chat", "bench"):
        extra = ["-p", "x"] if command == "run" else []
        args = build_parser().parse_args([command, "-m", "starter", *extra, "--no-repack"])
        assert model_params(args).use_extra_bufts is False
        args = build_parser().parse_args([command, "-m", "starter", *extra])
        assert model_params(args).use_extra_bufts is True


def test_repacking_off_is_saved_in_the_config(app_dirs: tuple[Path, Path]) -> None:
    from app.core.config import Config

    save_config(replace(Config(), engine=EngineSettings(use_extra_bufts=False)))
    assert load_config().engine.use_extra_bufts is False
    assert "use_extra_bufts = false" in (app_dirs[0] / "config.toml").read_text()
    # The commands honour it too: a crash fix made in the app holds for `llmtui run`.
    from app.cli import build_parser
    from app.cli.engine_args import model_params

    assert model_params(build_parser().parse_args(["run", "-m", "starter", "-p", "x"])).use_extra_bufts is False


def _run(*args: str, data_dir: Path, fault: str = "", timeout: float = 240) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, LLMTUI_DATA_DIR=str(data_dir), LLMTUI_CONFIG_DIR=str(data_dir / "config"))
    env.pop(FAULT_ENV, None)
    if fault:
        env[FAULT_ENV] = fault
    return subprocess.run(
        [sys.executable, "-m", "app", *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout
    )


def test_no_repack_keeps_greedy_output_identical(tmp_path: Path, tiny_models: dict[str, Path]) -> None:
    from app.core.model_paths import starter_model_path

    models = [tiny_models["llama"]] + ([starter_model_path()] if starter_model_path() is not None else [])
    for model in models:
        common = (
            "run",
            "-m",
            str(model),
            "-p",
            "Count from one to ten.",
            "--temp",
            "0",
            "-n",
            "24",
            "-t",
            "2",
            "--json",
        )
        with_repack = _run(*common, data_dir=tmp_path)
        without = _run(*common, "--no-repack", data_dir=tmp_path)
        assert with_repack.returncode == 0 and without.returncode == 0, with_repack.stderr + without.stderr
        assert json.loads(with_repack.stdout)["tokens"] == json.loads(without.stdout)["tokens"], model.name


def test_doctor_lists_the_cpu_extra_buffer_types(tmp_path: Path) -> None:
    report = json.loads(_run("doctor", "--json", data_dir=tmp_path).stdout)
    assert report["cpu_extra_bufts"] == list(_extra_bufts()) and report["repack"] is True
    text = _run("doctor", data_dir=tmp_path).stdout
    assert "CPU extra buffer types:" in text
    if report["cpu_extra_bufts"]:
        assert "in use" in text and "--no-repack" in text


# ----- recovery: the command line ---------------------------------------------------------------------------


@needs_extra_bufts
@pytest.mark.parametrize("stage", ["decode", "load"])
def test_run_restarts_without_repacking_after_a_native_crash(
    tmp_path: Path, tiny_models: dict[str, Path], stage: str
) -> None:
    fault = _fault(stage)
    common = ("run", "-m", str(tiny_models["llama"]), "-p", "hello", "--temp", "0", "-n", "8", "--json")
    result = _run(*common, data_dir=tmp_path, fault=fault)
    assert result.returncode == 0, result.stderr
    first = _extra_bufts()[0]
    assert f"crashed natively with CPU weights repacked for {first}" in result.stderr
    assert "--no-repack" in result.stderr and "Traceback" not in result.stderr
    reference = _run(*common, "--no-repack", data_dir=tmp_path / "reference")
    assert json.loads(result.stdout)["tokens"] == json.loads(reference.stdout)["tokens"]
    log = (tmp_path / "logs" / "engine.log").read_text()
    assert log.count(f"{FAULT_ENV}={fault}: crashing natively") == 1
    # Remembered for this CPU and engine build: the next start leaves that buffer type out and does not crash.
    again = _run(*common, data_dir=tmp_path, fault=fault)
    assert again.returncode == 0 and "crashed" not in again.stderr, again.stderr
    assert (tmp_path / "logs" / "engine.log").read_text().count("crashing natively") == 1
    assert f"left out after a native crash: {first}" in (tmp_path / "logs" / "engine.log").read_text()
    doctor = _run("doctor", data_dir=tmp_path).stdout
    assert "left out after a native crash since" in doctor and "--forget-crashes" in doctor
    assert first not in json.loads(_run("doctor", "--json", data_dir=tmp_path).stdout)["cpu_extra_bufts"]
    assert "forgot" in _run("doctor", "--forget-crashes", data_dir=tmp_path).stdout
    assert "left out" not in _run("doctor", data_dir=tmp_path).stdout


@needs_extra_bufts
@pytest.mark.parametrize(
    "command",
    [
        ("bench", "-p", "16", "-n", "4", "-r", "1"),
        ("bench", "-n", "8", "-r", "1", "--spec-type", "ngram-simple"),
        ("steer", "make", "--prompts", "happy-sad", "--method", "mean"),
    ],
    ids=["bench", "bench-spec", "steer-make"],
)
def test_bench_and_steer_make_recover_and_remember(
    tmp_path: Path, tiny_models: dict[str, Path], command: tuple[str, ...]
) -> None:
    extra = ("-o", str(tmp_path / "v.gguf")) if command[0] == "steer" else ()
    result = _run(*command, "-m", str(tiny_models["llama"]), *extra, data_dir=tmp_path, fault=_fault("load"))
    assert result.returncode == 0, result.stderr
    assert "crashed natively with CPU weights repacked for" in result.stderr and "Traceback" not in result.stderr
    assert RepackMemory(tmp_path / "engine-recovery.json").skipped() == _extra_bufts()[:1]


@needs_extra_bufts
def test_chat_recovers_and_asks_the_message_again(tmp_path: Path, tiny_models: dict[str, Path]) -> None:
    env = dict(os.environ, LLMTUI_DATA_DIR=str(tmp_path), LLMTUI_CONFIG_DIR=str(tmp_path / "config"))
    env[FAULT_ENV] = _fault("decode")
    result = subprocess.run(
        [sys.executable, "-m", "app", "chat", "-m", str(tiny_models["llama"]), "--temp", "0", "-n", "6"],
        cwd=ROOT,
        env=env,
        input="hello\nagain\n",
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert result.returncode == 0, result.stderr
    assert result.stderr.count("crashed natively") == 1 and "Traceback" not in result.stderr
    assert result.stderr.count("generated ") == 2  # both messages answered, the first after the restart


def test_run_names_the_flags_that_could_avoid_a_crash_that_persists(
    tmp_path: Path, tiny_models: dict[str, Path]
) -> None:
    result = _run(
        "run",
        "-m",
        str(tiny_models["llama"]),
        "-p",
        "hello",
        "--temp",
        "0",
        "-n",
        "8",
        "-t",
        "2",
        data_dir=tmp_path,
        fault="decode",
    )
    assert result.returncode == 2
    err = result.stderr
    assert "SIGSEGV" in err
    assert f"the whole engine log: {tmp_path / 'logs' / 'engine.log'}" in err
    advice = next(line for line in err.splitlines() if line.startswith("llmtui: to avoid it, try"))
    assert "-t 1" in advice and "--no-mmap" in advice and "-c 2048" in advice
    from engine_ext.bindings import offload_device_count

    assert ("-ngl 0" in advice) == (offload_device_count() > 0)  # offered only where there is something to offload to
    if _extra_bufts():  # retried without each extra buffer type in turn, so repacking is no longer offered
        assert f"restarted without {_extra_bufts()[-1]} (no repacking left)" in err and "--no-repack" not in advice
    assert "Traceback" not in err


# ----- recovery: the chat app --------------------------------------------------------------------------------


def _notices(app: LlmtuiApp) -> list[str]:
    return [str(n.message) for n in app._notifications]


@needs_extra_bufts
@pytest.mark.anyio
async def test_the_app_restarts_without_repacking_and_retries_the_message(
    tiny_models: dict[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(FAULT_ENV, _fault("decode"))
    app = LlmtuiApp(str(tiny_models["llama"]), default_sampling=SHORT)
    async with app.run_test(size=(100, 30)) as pilot:
        await wait(pilot, lambda: app.engine_state == "ready", "the model to load")
        chat = app.chat
        assert chat is not None
        pid = app.bridge.pid
        chat.prompt.focus()
        chat.prompt.load_text("hello after a crash")
        await pilot.press("enter")
        await wait(pilot, lambda: chat.replies.replies_started > 0, "the reply to start")
        await wait(
            pilot,
            lambda: chat.generation is None and app.engine_state == "ready",
            "the reply to finish after the automatic restart",
        )
        assert app.bridge.pid != pid  # a new worker
        assert app.engine_overrides == {}  # the settings are the user's: the engine client leaves the type out
        notice = next(n for n in _notices(app) if "crashed natively" in n)
        assert "F3" in notice and "--no-repack" in notice
        path = app.store.tree.active_path(chat.conversation_id or 0)
        assert [m.role for m in path] == ["user", "assistant"]
        assert path[-1].state == "complete" and path[-1].content
        assert app.model is not None and app.model.repack is (len(_extra_bufts()) > 1)  # the others kept
        # The next message goes to the same worker, still without repacking.
        chat.prompt.load_text("and again")
        await pilot.press("enter")
        await wait(pilot, lambda: chat.replies.replies_started > 1, "the second reply to start")
        await wait(pilot, lambda: chat.generation is None and app.engine_state == "ready", "the second reply")
        assert app.store.tree.active_path(chat.conversation_id or 0)[-1].state == "complete"


@pytest.mark.all_cpus
@pytest.mark.anyio
async def test_a_crash_that_persists_shows_the_log_and_the_fallbacks_to_try(
    tiny_models: dict[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    from textual.widgets import Static

    from app.tui.modals.crash import EngineCrashedModal

    monkeypatch.setenv(FAULT_ENV, "decode")
    save_config(replace(load_config(), engine=EngineSettings(n_threads=2)))
    app = LlmtuiApp(str(tiny_models["llama"]), default_sampling=SHORT)
    async with app.run_test(size=(100, 30)) as pilot:
        await wait(pilot, lambda: app.engine_state == "ready", "the model to load")
        chat = app.chat
        assert chat is not None
        chat.prompt.focus()
        chat.prompt.load_text("this crashes every time")
        await pilot.press("enter")
        await wait(
            pilot,
            lambda: isinstance(app.screen, EngineCrashedModal) and bool(app.screen.query("#crash-log-text")),
            "the crash dialog, drawn",
        )
        modal = app.screen
        assert isinstance(modal, EngineCrashedModal)
        assert "SIGSEGV" in modal.description
        log_text = str(modal.query_one("#crash-log-text", Static).render())
        log_path = log_text.splitlines()[-1].removeprefix("The whole log: ")
        assert log_path.endswith("engine.log") and Path(log_path).is_file() and log_path == modal.log_path
        assert "crashing natively" in modal.log_tail
        tries = str(modal.query_one("#crash-keys", Static).render())
        keys = [f.key for f in modal.fallbacks]
        assert "threads" in keys and "no-mmap" in keys and "-t 1" in tries
        # The conversation is kept; the reply that crashed is marked so.
        path = app.store.tree.active_path(chat.conversation_id or 0)
        assert path[0].content == "this crashes every time" and path[-1].state == "error"
        # Try a fallback from the dialog: fewer threads, for this session.
        await pilot.press(str(keys.index("threads") + 1))
        await wait(pilot, lambda: app.engine_state == "ready", "the restart with fewer threads")
        assert app.engine_overrides["n_threads"] == 1
        assert app.model is not None and app.model.n_threads == 1
        assert load_config().engine.n_threads == 2  # the saved settings are the user's


@pytest.mark.all_cpus
@pytest.mark.anyio
async def test_f5_applies_the_saved_engine_settings(tiny_models: dict[str, Path]) -> None:
    save_config(replace(load_config(), engine=EngineSettings(n_threads=2)))
    app = LlmtuiApp(str(tiny_models["llama"]), default_sampling=SHORT)
    async with app.run_test(size=(100, 30)) as pilot:
        await wait(pilot, lambda: app.engine_state == "ready", "the model to load")
        assert app.model is not None and app.model.n_threads == 2
        config = load_config()
        app.save_settings(replace(config, engine=replace(config.engine, n_threads=1, use_extra_bufts=False)))
        pid = app.bridge.pid
        await pilot.press("f5")
        await wait(pilot, lambda: app.engine_state == "ready" and app.bridge.pid != pid, "the restarted engine")
        assert app.model is not None and app.model.n_threads == 1 and app.model.repack is False


@pytest.mark.anyio
async def test_no_repack_on_the_app_command_line_is_for_this_session(tiny_models: dict[str, Path]) -> None:
    from app.tui.app import run_tui  # noqa: F401 - the entry point takes no_repack (checked by signature below)

    app = LlmtuiApp(str(tiny_models["llama"]), engine_overrides={"use_extra_bufts": False})
    async with app.run_test(size=(100, 30)) as pilot:
        await wait(pilot, lambda: app.engine_state == "ready", "the model to load")
        assert app.model is not None and app.model.repack is False
        assert app.config.engine.use_extra_bufts is True  # nothing saved
    import inspect

    assert "no_repack" in inspect.signature(run_tui).parameters


# ----- what a crash is blamed on -----------------------------------------------------------------------------


def test_a_crash_in_the_requests_grammar_is_not_blamed_on_repacking(
    tmp_path: Path, tiny_models: dict[str, Path]
) -> None:
    schema = '{"type": "string"}'
    common = ("run", "-m", str(tiny_models["llama"]), "-p", "hello", "-n", "8", "--json-schema", schema)
    result = _run(*common, data_dir=tmp_path, fault="crash-grammar")
    assert result.returncode == 2 and "Traceback" not in result.stderr
    first = result.stderr.splitlines()[0]
    assert first == "llmtui: error: the engine process was killed by SIGSEGV while building the request's grammar"
    assert "the request was refused; the speed settings are kept" in result.stderr
    assert "crashed natively with CPU weights" not in result.stderr and "--no-repack" not in result.stderr
    assert (tmp_path / "logs" / "engine.log").read_text().count("crashing natively at grammar") == 1  # no retry
    assert not (tmp_path / "engine-recovery.json").exists()
    assert "left out" not in _run("doctor", data_dir=tmp_path).stdout


@needs_extra_bufts
def test_a_crash_in_the_first_decode_after_a_load_is_still_blamed(tmp_path: Path, tiny_models: dict[str, Path]) -> None:
    # crash-decode: every decode crashes, whatever is repacked (the retries drop each type, then it persists)
    result = _run(
        "run", "-m", str(tiny_models["llama"]), "-p", "hi", "-n", "4", data_dir=tmp_path, fault="crash-decode"
    )
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert f"crashed natively with CPU weights repacked for {_extra_bufts()[0]}" in result.stderr
    assert "SIGSEGV while decoding" in result.stderr
    assert RepackMemory(tmp_path / "engine-recovery.json").skipped() == _extra_bufts()


@pytest.mark.anyio
async def test_the_app_refuses_a_reply_whose_grammar_crashed_and_keeps_its_speed_settings(
    tiny_models: dict[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    from app.core.output_format import ANY_JSON

    monkeypatch.setenv(FAULT_ENV, "crash-grammar")
    app = LlmtuiApp(str(tiny_models["llama"]), default_sampling=replace(SHORT, output_format=ANY_JSON))
    async with app.run_test(size=(100, 30)) as pilot:
        await wait(pilot, lambda: app.engine_state == "ready", "the model to load")
        chat = app.chat
        assert chat is not None
        pid = app.bridge.pid
        monkeypatch.delenv(FAULT_ENV)  # the restarted worker builds grammars
        chat.prompt.focus()
        chat.prompt.load_text("answer in JSON")
        await pilot.press("enter")
        await wait(pilot, lambda: chat.replies.replies_started > 0 and chat.generation is None, "the reply to end")
        await wait(pilot, lambda: app.engine_state == "ready" and app.bridge.pid != pid, "the restarted engine")
        path = app.store.tree.active_path(chat.conversation_id or 0)
        assert [m.role for m in path] == ["user", "assistant"] and path[-1].state == "error"
        assert not any("crashed natively" in n for n in _notices(app))
        assert app.model is not None and app.model.repack is bool(_extra_bufts())  # repacking as it was
        assert not (Path(os.environ["LLMTUI_DATA_DIR"]) / "engine-recovery.json").exists()
