"""Every numeric flag is checked against the range llama.cpp accepts, and bad text gets one clear line (issue 21, 5b).

The parser runs in-process (fast); a few checks run `llmtui` as a user does (a subprocess), chat included."""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

import pytest

from app.cli import build_parser, main
from app.cli.types import finite_float, int_range, read_text_file, utf8_error
from engine_ext.params import DEFAULT_SEED

ROOT = Path(__file__).resolve().parents[2]

# (command, flag as argparse names it, arguments): each must exit 2 with "argument FLAG:" in one line.
BAD = [
    ("run", "-c/--ctx-size", ["-c", "4294967297"]),  # wrapped to 256 before
    ("run", "-c/--ctx-size", ["-c", "-1"]),
    ("run", "-c/--ctx-size", ["-c", str((1 << 24) + 1)]),
    ("run", "-c/--ctx-size", ["-c", "4k"]),
    ("run", "-t/--threads", ["-t", "-1"]),
    ("run", "-t/--threads", ["-t", "1025"]),
    ("run", "-b/--batch-size", ["-b", "0"]),
    ("run", "-ub/--ubatch-size", ["-ub", "-512"]),
    ("run", "-ngl/--n-gpu-layers", ["-ngl", "-2"]),
    ("run", "-ngl/--n-gpu-layers", ["-ngl", "4294967296"]),
    ("run", "--fit-target", ["--fit-target", "-1"]),
    ("run", "-mg/--main-gpu", ["-mg", "-1"]),
    ("run", "-ts/--tensor-split", ["-ts", "nan,1"]),
    ("run", "-ts/--tensor-split", ["-ts", "0,0"]),
    ("run", "-ts/--tensor-split", ["-ts", "1,-1"]),
    ("run", "--n-cpu-moe", ["--n-cpu-moe", "-3"]),
    ("run", "--temp", ["--temp", "nan"]),
    ("run", "--temp", ["--temp", "inf"]),
    ("run", "--temp", ["--temp", "-0.5"]),
    ("run", "--top-k", ["--top-k", "-1"]),
    ("run", "--top-p", ["--top-p", "1.5"]),
    ("run", "--top-p", ["--top-p", "NaN"]),
    ("run", "--min-p", ["--min-p", "-0.1"]),
    ("run", "--repeat-penalty", ["--repeat-penalty", "0"]),
    ("run", "--repeat-penalty", ["--repeat-penalty", "inf"]),
    ("run", "--repeat-last-n", ["--repeat-last-n", "-2"]),
    ("run", "--presence-penalty", ["--presence-penalty", "nan"]),
    ("run", "--frequency-penalty", ["--frequency-penalty", "-inf"]),
    ("run", "-s/--seed", ["-s", "-2"]),
    ("run", "-s/--seed", ["-s", "4294967296"]),
    ("run", "-n/--n-predict", ["-n", "-5"]),
    ("run", "-n/--n-predict", ["-n", "0"]),
    ("run", "--spec-draft-n-max", ["--spec-draft-n-max", "0"]),
    ("run", "--spec-draft-n-min", ["--spec-draft-n-min", "-1"]),
    ("run", "--spec-draft-p-min", ["--spec-draft-p-min", "2"]),
    ("run", "--spec-draft-p-min", ["--spec-draft-p-min", "nan"]),
    ("run", "--control-vector-scaled", ["--control-vector-scaled", "v.gguf:nan"]),
    ("run", "--control-vector-scaled", ["--control-vector-scaled", "v.gguf:inf"]),
    ("run", "--control-vector-scaled", ["--control-vector-scaled", "v.gguf:1001"]),
    ("run", "--control-vector-scaled", ["--control-vector-scaled", "v.gguf", "strong"]),  # llama.cpp's form
    ("run", "--control-vector-scaled", ["--control-vector-scaled", "v.gguf", "1001"]),
    ("run", "--control-vector-scaled", ["--control-vector-scaled", "a.gguf", "1", "2"]),
    ("run", "--control-vector-scaled", ["--control-vector-scaled", "v.gguf"]),
    ("run", "--control-vector-layer-range", ["--control-vector-layer-range", "-1", "4"]),
    ("chat", "-n/--n-predict", ["-n", "-5"]),
    ("chat", "--temp", ["--temp", "nan"]),
    ("chat", "-c/--ctx-size", ["-c", "4294967297"]),
    ("bench", "-p/--n-prompt", ["-p", "-5"]),
    ("bench", "-n/--n-gen", ["-n", "-1"]),
    ("bench", "-r/--repetitions", ["-r", "0"]),
    ("bench", "-p/--n-prompt", ["-p", "0", "-n", "0"]),  # nothing to measure
    ("info", "-c/--ctx-size", ["starter", "-c", "-1"]),
    ("rpc-server", "--port", ["--port", "0"]),
    ("rpc-server", "--port", ["--port", "65536"]),
    ("rpc-server", "-t/--threads", ["-t", "-1"]),
    ("steer make", "-t/--threads", ["--prompts", "happy", "-t", "-1"]),
    ("models info", "-c/--ctx-size", ["x/y", "-c", "4294967297"]),
    ("models search", "--limit", ["--limit", "0"]),
]


def _one_error_line(err: str, command: str, flag: str) -> str:
    """The refusal's one line (no usage block: it ends by pointing at --help), without that pointer."""
    lines = err.strip().splitlines()
    assert len(lines) == 1 and len(lines[0]) <= 300, err
    line, see = lines[0], f" (see llmtui {command} --help)"
    assert line.startswith(f"llmtui {command}: error: argument {flag}: ") and line.endswith(see), err
    return line.removesuffix(see)


@pytest.mark.parametrize(("command", "flag", "arguments"), BAD, ids=[" ".join([c, *a]) for c, _, a in BAD])
def test_bad_value_exits_2_naming_the_flag(
    command: str, flag: str, arguments: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    prompt = ["-p", "hi"] if command == "run" else []
    with pytest.raises(SystemExit) as exit_info:
        main([*command.split(), *prompt, *arguments])
    assert exit_info.value.code == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    _one_error_line(captured.err, command, flag)


def test_good_values_still_parse(tmp_path: Path) -> None:
    parser = build_parser()
    args = parser.parse_args(
        [
            "run",
            "-p",
            "hi",
            "-c",
            "0",
            "-t",
            "1024",
            "-b",
            "1",
            "-ub",
            "1",
            "-ngl",
            "auto",
            "--fit-target",
            "0",
            "-mg",
            "0",
            "--n-cpu-moe",
            "0",
            "--temp",
            "0",
            "--top-k",
            "0",
            "--top-p",
            "1",
            "--min-p",
            "0",
            "--repeat-penalty",
            "1.1",
            "--repeat-last-n",
            "-1",
            "--presence-penalty",
            "-0.5",
            "--frequency-penalty",
            "1e-3",
            "-s",
            "-1",
            "-n",
            "-1",
            "--spec-draft-n-max",
            "1",
            "--spec-draft-p-min",
            "1",
            "--control-vector-scaled",
            "v.gguf:-2",
            "--control-vector-layer-range",
            "1",
            "4",
            "-ts",
            "3/1",
        ]
    )
    assert (args.ctx_size, args.threads, args.batch_size, args.temp, args.top_p) == (0, 1024, 1, 0.0, 1.0)
    assert args.seed == DEFAULT_SEED  # -1: llama.cpp's random seed
    assert args.repeat_last_n == -1 and args.n_predict == -1 and args.presence_penalty == -0.5
    assert args.tensor_split == "3/1"
    assert args.control_vector_scaled == ["v.gguf:-2"] and args.control_vector_layer_range == [1, 4]
    assert parser.parse_args(["run", "-p", "hi", "-c", str(1 << 24), "-s", "4294967295"]).ctx_size == 1 << 24
    assert parser.parse_args(["bench", "-p", "0", "-n", "8", "-r", "1"]).n_prompt == 0
    assert parser.parse_args(["rpc-server", "--port", "65535"]).port == 65535
    prompt = tmp_path / "prompt.txt"
    prompt.write_text("héllo wörld\n", encoding="utf-8")
    assert parser.parse_args(["run", "-f", str(prompt)]).prompt == "héllo wörld\n"


def test_control_vector_scaled_takes_llama_cpp_two_argument_form_too() -> None:
    """Issue 37: `--control-vector-scaled FILE STRENGTH` (llama.cpp's form) and `FILE:STRENGTH` both parse, in order,
    and steering_entries reads both the same way."""
    from app.cli.steer import steering_entries

    parser = build_parser()
    args = parser.parse_args(
        [
            "run",
            "--control-vector-scaled",
            "a.gguf",
            "0.8",
            "--control-vector-scaled",
            "b.gguf:-2",
            "--control-vector-scaled",
            "c.gguf",
            "-1.5",
            "-p",
            "hi",
        ]
    )
    assert args.control_vector_scaled == ["a.gguf:0.8", "b.gguf:-2", "c.gguf:-1.5"] and args.prompt == "hi"
    entries = steering_entries(args)
    assert [(Path(e.path).name, e.strength) for e in entries] == [("a.gguf", 0.8), ("b.gguf", -2.0), ("c.gguf", -1.5)]
    assert parser.parse_args(["run", "-p", "hi"]).control_vector_scaled == []


def test_prompt_and_file_are_exclusive_and_one_is_needed(capsys: pytest.CaptureFixture[str]) -> None:
    for arguments in (["run"], ["run", "-p", "a", "-f", "b"]):
        with pytest.raises(SystemExit) as exit_info:
            main(arguments)
        assert exit_info.value.code == 2
    assert "error:" in capsys.readouterr().err


def test_prompt_file_not_utf8_or_too_large(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "bad.txt"
    bad.write_bytes("ok é".encode() + b"\xff rest")
    with pytest.raises(SystemExit):
        main(["run", "-f", str(bad)])
    line = _one_error_line(capsys.readouterr().err, "run", "-f/--file")
    assert line.endswith(f"{bad} is not valid UTF-8 (byte 0xff at offset 5)")
    big = tmp_path / "big.txt"
    big.write_bytes(b"a" * 2048)
    with pytest.raises(ValueError, match="larger than"):
        read_text_file(big, limit=1024)
    assert read_text_file(big, limit=2048) == "a" * 2048
    with pytest.raises(SystemExit):
        main(["run", "-f", str(tmp_path / "missing.txt")])
    assert "cannot read" in _one_error_line(capsys.readouterr().err, "run", "-f/--file")


def test_a_prompt_file_that_is_not_a_file_is_read_within_bounds_or_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Issue 32: `run -f FIFO` with no writer blocked. A FIFO nobody writes to, an empty device, an endless one and
    a folder are refused at once; a pipe is read to its end, and one that sends nothing is given up on."""
    fifo = tmp_path / "prompt.fifo"
    os.mkfifo(fifo)
    for path, words in (
        (fifo, "is a FIFO with nothing to read (no writer)"),
        (Path("/dev/null"), "is a device with nothing to read"),
        (Path("/dev/zero"), "is larger than 8 MiB"),
        (tmp_path, "is a folder, not a text file"),
    ):
        with pytest.raises(SystemExit) as exit_info:
            main(["run", "-f", str(path)])
        assert exit_info.value.code == 2
        assert f"{path} {words}" in _one_error_line(capsys.readouterr().err, "run", "-f/--file")
    read_end, write_end = os.pipe()
    try:
        pipe = Path(f"/proc/self/fd/{read_end}")  # as `-f /dev/stdin` with a pipe
        with pytest.raises(ValueError, match="sent nothing for 0.2 s"):
            read_text_file(pipe, idle_s=0.2)
        os.write(write_end, "héllo\n".encode())
        os.close(write_end)
        write_end = -1
        assert read_text_file(pipe) == "héllo\n"
    finally:
        os.close(read_end)
        if write_end >= 0:
            os.close(write_end)


# Refusals whose text comes from the user: long, multi-line, with escape codes; each must stay one short line.
HOSTILE_ARGUMENTS = [
    ["models", "x" * 100_000],
    ["models", "line1\nline2\n" * 200],
    ["run", "-p", "hi", "--" + "y" * 5000],
    ["run", "-p", "hi", "-n", "\x1b[2J\x1b]0;PWN\x07" * 50],
    ["run", "-p", "hi", "--spec-type", "z" * 20_000],
    ["steer"],
    ["run"],
    ["bench", "-p", "0", "-n", "0"],
    ["--bogus", "\n" * 30],
]


@pytest.mark.parametrize("arguments", HOSTILE_ARGUMENTS, ids=range(len(HOSTILE_ARGUMENTS)))
def test_argparse_refusals_are_one_short_line(arguments: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    """Issue 32: argparse printed a 22-line usage block before its error; now one line that points at --help."""
    try:
        code = main(arguments)  # refused after parsing (a CliError): exit 1
    except SystemExit as exit_info:
        code = exit_info.code  # refused by the parser: exit 2, pointing at --help
    captured = capsys.readouterr()
    lines = captured.err.splitlines()
    assert code in (1, 2) and captured.out == "" and len(lines) == 1, captured.err[:2000]
    assert len(lines[0]) <= 300 and lines[0].isprintable(), lines[0]
    assert lines[0].endswith("--help)") == (code == 2), lines[0]


def test_steering_prompt_set_not_utf8_is_one_line(
    tmp_path: Path, tiny_models: dict[str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    bad = tmp_path / "set.json"
    bad.write_bytes(b'{"pairs": [["a", "b\xfe"]]}')
    assert main(["steer", "make", "-m", str(tiny_models["llama"]), "--prompts", str(bad)]) == 1
    err = capsys.readouterr().err.strip()
    assert err == f"llmtui: error: {bad} is not valid UTF-8 (byte 0xfe at offset 19)"


def test_type_functions() -> None:
    assert utf8_error("plain é") is None
    assert utf8_error(b"\xc3\xa9a\xff".decode("utf-8", "surrogateescape")) == "byte 0xff at offset 3"
    with pytest.raises(argparse.ArgumentTypeError, match="from 1 to 3"):
        int_range(1, 3)("4")
    with pytest.raises(argparse.ArgumentTypeError, match="finite"):
        finite_float()("inf")
    assert finite_float(0.0, 1.0)("0.5") == 0.5


def _llmtui(
    *args: str | bytes, tmp_path: Path, stdin: bytes | None = None, timeout: float = 120
) -> subprocess.CompletedProcess[bytes]:
    env = dict(os.environ, LLMTUI_DATA_DIR=str(tmp_path), LLMTUI_CONFIG_DIR=str(tmp_path / "config"))
    return subprocess.run(
        [sys.executable, "-m", "app", *args], cwd=ROOT, env=env, input=stdin, capture_output=True, timeout=timeout
    )


def test_subprocess_errors_are_one_line(tmp_path: Path) -> None:
    for args, flag in (
        (("run", "-p", "hi", "-c", "4294967297"), "-c/--ctx-size"),
        (("run", "-p", "hi", "--temp", "nan"), "--temp"),
        (("run", "-p", b"caf\xc3\xa9 \xff"), "-p/--prompt"),
    ):
        result = _llmtui(*args, tmp_path=tmp_path, timeout=60)
        assert result.returncode == 2
        _one_error_line(result.stderr.decode(), "run", flag)
    assert result.stderr.decode().strip().endswith("not valid UTF-8 (byte 0xff at offset 6) (see llmtui run --help)")
    bench = _llmtui("bench", "-p", "-5", tmp_path=tmp_path, timeout=60)
    assert bench.returncode == 2
    _one_error_line(bench.stderr.decode(), "bench", "-p/--n-prompt")


def test_chat_goes_on_after_a_bad_byte_and_an_over_long_line(tmp_path: Path, tiny_models: dict[str, Path]) -> None:
    lines = b"hi \xff there\n" + b"word " * 200_000 + b"\n" + b"hello\n"  # a 1 MB paste: far over the context
    result = _llmtui(
        "chat",
        "-m",
        str(tiny_models["llama"]),
        "-c",
        "200",
        "-n",
        "4",
        "-t",
        "1",
        "--temp",
        "0",
        tmp_path=tmp_path,
        stdin=lines,
    )
    err = result.stderr.decode("utf-8", "replace")
    assert result.returncode == 0, err
    assert "Traceback" not in err
    assert "context 256 (-c 200 rounded up by llama.cpp)" in err  # said, not silent
    assert "that line is not valid UTF-8 (byte 0xff at offset 3); it was not sent" in err
    assert "but the context holds 256" in err  # the engine's one line: the paste is longer than the context
    assert err.count("| generated ") == 1  # and "hello" after it was answered


def test_bench_names_the_parameter_count_not_only_llama_cpp_size_class() -> None:
    """Issue 37: bench called the 135M starter "llama 256M" (llama.cpp's size class); its header says the count."""
    from app.cli.bench import model_line, parameters_text

    assert parameters_text(134_515_008) == "134.5M parameters"
    assert parameters_text(7_615_616_512) == "7.62B parameters"
    assert parameters_text(56_000) == "56.0K parameters" and parameters_text(12) == "12 parameters"
    line = model_line("llama 256M Q4_1", 134_515_008, "CPU", 4)
    assert line == "model: 134.5M parameters (llama.cpp: llama 256M Q4_1; CPU, 4 threads)"
    assert model_line("llama 256M Q4_1", 134_515_008, "CPU", 1).endswith("CPU, 1 thread)")  # seen in the walk
