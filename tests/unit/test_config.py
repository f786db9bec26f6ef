"""Settings: config.toml round trip, validation with messages a user can act on, sampling settings."""

from __future__ import annotations

import tomllib
from dataclasses import fields, replace
from pathlib import Path

import pytest

from app.core.config import (
    GPU_LAYERS_AUTO,
    Config,
    ConfigError,
    EngineSettings,
    RemoteSettings,
    SamplingSettings,
    config_path,
    config_to_toml,
    gpu_layers_text,
    load_config,
    parse_gpu_layers,
    save_config,
)
from engine_ext.params import DEFAULT_SEED, ContextParams, ModelParams


def test_missing_file_gives_defaults(app_dirs: tuple[Path, Path]) -> None:
    assert load_config() == Config()
    assert config_path() == app_dirs[0] / "config.toml"


def test_save_then_load_round_trip(app_dirs: tuple[Path, Path]) -> None:
    config = Config(
        engine=EngineSettings(
            n_ctx=8192, n_threads=4, n_gpu_layers=20, flash_attn="on", type_k="q8_0", type_v="q8_0", n_batch=512
        ),
        model_folders=("~/models", '/data/odd "quoted" \\ folder'),
        last_model="/models/x.gguf",
        theme="light",
        show_sidebar=False,
    )
    save_config(config)
    assert load_config() == config
    assert tomllib.loads(config_path().read_text())["engine"]["n_ctx"] == 8192


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        ("[engine]\nn_ctx = -5\n", "context size"),
        ("[engine]\nn_ctx = 'big'\n", "engine.n_ctx should be int"),
        ("[engine]\nflash_attn = 'maybe'\n", "flash attention"),
        ("[engine]\ntype_k = 'q9'\n", "KV cache type K"),
        ("[engine]\ntype_v = 'q8_0'\nflash_attn = 'off'\n", "flash attention"),
        ("[ui]\ntheme = 'pink'\n", "theme"),
        ("[models]\nfolders = 'not a list'\n", "models.folders"),
        ("this is = = not toml", "not valid TOML"),
    ],
)
def test_bad_files_are_refused_with_a_clear_message(app_dirs: tuple[Path, Path], text: str, fragment: str) -> None:
    config_path().parent.mkdir(parents=True, exist_ok=True)
    config_path().write_text(text)
    with pytest.raises(ConfigError, match=fragment):
        load_config()


def test_invalid_settings_are_not_saved(app_dirs: tuple[Path, Path]) -> None:
    with pytest.raises(ConfigError):
        save_config(Config(engine=EngineSettings(n_batch=0)))
    assert not config_path().exists()


def test_unknown_keys_are_ignored_and_the_writer_escapes_control_characters() -> None:
    text = config_to_toml(Config(last_model="a\tb\x01c"))
    assert tomllib.loads(text)["models"]["last_model"] == "a\tb\x01c"


USERS_FILE = """\
# my settings: written by hand, before llmtui changed any
[ui]
show_sidebar = false  # more room for the chat
theme = "dark"

[engine]
# 4 threads: the fan stays quiet
n_threads = 4
n_ctx = 8_192
my_own_note = "kept"

[[remote]]
# the box under the desk
name = "gpu-box"
base_url = "http://192.168.1.20:8080/v1"
api_key = "sk-old"
"""


def test_a_settings_change_keeps_the_users_comments_order_and_other_keys(app_dirs: tuple[Path, Path]) -> None:
    path = config_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(USERS_FILE, encoding="utf-8")
    config = load_config()
    assert (config.engine.n_threads, config.engine.n_ctx, config.show_sidebar) == (4, 8192, False)
    remote = replace(config.remotes[0], api_key="", model="qwen3")
    save_config(replace(config, theme="light", engine=replace(config.engine, n_threads=8), remotes=(remote,)))
    text = path.read_text(encoding="utf-8")
    for kept in (
        "# my settings: written by hand, before llmtui changed any\n",
        "show_sidebar = false  # more room for the chat\n",
        "# 4 threads: the fan stays quiet\nn_threads = 8\n",
        "n_ctx = 8_192\n",  # unchanged: as the user wrote it
        'my_own_note = "kept"\n',
        '# the box under the desk\nname = "gpu-box"\n',
    ):
        assert kept in text, (kept, text)
    assert text.index("[ui]") < text.index("[engine]") < text.index("[[remote]]")  # the user's order
    assert "sk-old" not in text and 'theme = "light"' in text
    saved = load_config()
    assert (saved.theme, saved.engine.n_threads, saved.remotes) == ("light", 8, (remote,))
    # Without a file, or over one that is not TOML, a new file is written.
    path.write_text("not = = toml", encoding="utf-8")
    save_config(saved)
    assert load_config() == saved and "not = = toml" not in path.read_text(encoding="utf-8")


def test_a_speculative_settings_change_keeps_the_comments_of_its_table(app_dirs: tuple[Path, Path]) -> None:
    """What F9 saves ([speculative], written from the declarations) changes its values in place."""
    path = config_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(
        '[speculative]\n# n-grams: no room for a draft\nspec_type = "ngram-mod"  # repeats\nn_max = 8\n',
        encoding="utf-8",
    )
    config = load_config()
    assert (config.speculative.spec_type, config.speculative.n_max, config.speculative.n_min) == ("ngram-mod", 8, 0)
    save_config(replace(config, speculative=replace(config.speculative, enabled=True, n_max=24)))
    text = path.read_text(encoding="utf-8")
    assert '# n-grams: no room for a draft\nspec_type = "ngram-mod"  # repeats\nn_max = 24\n' in text
    assert load_config().speculative == replace(config.speculative, enabled=True, n_max=24)


def test_sampling_settings_to_engine_params_and_back() -> None:
    sampling = SamplingSettings(temperature=0.2, top_k=10, seed=-1, max_tokens=64)
    params = sampling.sampling_params()
    assert (params.temperature, params.top_k, params.seed) == (0.2, 10, DEFAULT_SEED)
    assert SamplingSettings(seed=7).sampling_params().seed == 7
    assert SamplingSettings.from_json(sampling.to_json()) == sampling
    assert SamplingSettings.from_json({"temperature": "hot", "top_k": 5, "extra": 1}) == SamplingSettings(top_k=5)
    for bad in (
        SamplingSettings(temperature=-1),
        SamplingSettings(top_p=2),
        SamplingSettings(max_tokens=0),
        SamplingSettings(seed=-2),
        SamplingSettings(temperature=float("nan")),
    ):
        with pytest.raises(ConfigError):
            bad.validate()


# ----- every engine setting: config.toml round trip and the engine parameters it becomes --------------------

EVERY_ENGINE_SETTING = EngineSettings(
    n_ctx=8192,
    n_threads=6,
    n_gpu_layers=GPU_LAYERS_AUTO,
    flash_attn="on",
    type_k="q8_0",
    type_v="q4_0",
    n_batch=1024,
    n_ubatch=256,
    split_mode="row",
    tensor_split=(3.0, 1.0),
    main_gpu=1,
    n_cpu_moe=12,
    use_mmap=False,
    use_mlock=True,
    rpc_servers=("192.168.1.20:50052", "gpu-box:50053"),
    fit_target_mib=2048,
    use_extra_bufts=False,
)


def test_every_engine_setting_round_trips_and_maps_onto_the_engine_params(app_dirs: tuple[Path, Path]) -> None:
    defaults = EngineSettings()
    assert all(getattr(EVERY_ENGINE_SETTING, f.name) != getattr(defaults, f.name) for f in fields(EngineSettings))
    save_config(Config(engine=EVERY_ENGINE_SETTING))
    raw = tomllib.loads(config_path().read_text())["engine"]
    assert raw["n_gpu_layers"] == "auto" and raw["tensor_split"] == [3.0, 1.0] and raw["use_mmap"] is False
    assert load_config().engine == EVERY_ENGINE_SETTING
    model, context = EVERY_ENGINE_SETTING.model_params(), EVERY_ENGINE_SETTING.context_params()
    assert model == ModelParams(
        n_gpu_layers=GPU_LAYERS_AUTO,
        use_mmap=False,
        use_mlock=True,
        use_extra_bufts=False,
        main_gpu=1,
        rpc_servers=("192.168.1.20:50052", "gpu-box:50053"),
        split_mode="row",
        tensor_split=(3.0, 1.0),
        n_cpu_moe=12,
        fit_target_mib=2048,
    )
    assert context == ContextParams(
        n_ctx=8192, n_batch=1024, n_ubatch=256, n_threads=6, flash_attn="on", type_k="q8_0", type_v="q4_0"
    )
    # Numbers of layers are written as numbers; -ub is clamped to -b as llama.cpp does.
    save_config(Config(engine=EngineSettings(n_gpu_layers=12, n_batch=128)))
    assert tomllib.loads(config_path().read_text())["engine"]["n_gpu_layers"] == 12
    assert load_config().engine.context_params().n_ubatch == 128


def test_gpu_layers_text() -> None:
    assert parse_gpu_layers(" Auto ") == GPU_LAYERS_AUTO and gpu_layers_text(GPU_LAYERS_AUTO) == "auto"
    assert parse_gpu_layers("-1") == -1 and parse_gpu_layers("33") == 33 and gpu_layers_text(33) == "33"
    for bad in ("-3", "many", ""):
        with pytest.raises(ConfigError, match="GPU layers"):
            parse_gpu_layers(bad)


@pytest.mark.parametrize(
    ("engine", "fragment"),
    [
        (EngineSettings(split_mode="none", tensor_split=(1.0, 1.0)), "needs a split mode other than none"),
        (EngineSettings(tensor_split=(0.0, 0.0)), "add up to more than 0"),
        (EngineSettings(split_mode="diagonal"), "split mode must be one of"),
        (EngineSettings(n_ubatch=0), "micro-batch size"),
        (EngineSettings(main_gpu=-1), "must not be negative"),
        (EngineSettings(n_cpu_moe=-2), "must not be negative"),
        (EngineSettings(rpc_servers=("gpu-box",)), "HOST:PORT"),
        (EngineSettings(rpc_servers=("gpu-box:99999",)), "HOST:PORT"),
        (EngineSettings(n_gpu_layers=-3), "GPU layers"),
        (EngineSettings(n_gpu_layers=GPU_LAYERS_AUTO, split_mode="tensor"), "-ngl auto cannot plan -sm tensor"),
        (EngineSettings(fit_target_mib=-1), "must not be negative"),
        (EngineSettings(type_v="q8_0", flash_attn="off"), "flash attention"),
    ],
)
def test_combinations_llama_cpp_refuses_are_refused(engine: EngineSettings, fragment: str) -> None:
    with pytest.raises(ConfigError, match=fragment):
        engine.validate()


# ----- remote engines -----------------------------------------------------------------------------------------


def test_remote_engines_round_trip_and_keys_stay_hidden(
    app_dirs: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("LLMTUI_TEST_KEY", raising=False)
    remotes = (
        RemoteSettings("gpu-box", "http://192.168.1.20:8080/v1", api_key_env="LLMTUI_TEST_KEY", model="qwen3"),
        RemoteSettings("cloud", "https://api.example.com/v1", api_key="sk-very-secret"),
        RemoteSettings("plain", "http://localhost:8000"),
    )
    save_config(Config(remotes=remotes))
    text = config_path().read_text()
    assert tomllib.loads(text)["remote"][0] == {
        "name": "gpu-box",
        "base_url": "http://192.168.1.20:8080/v1",
        "api_key_env": "LLMTUI_TEST_KEY",
        "model": "qwen3",
    }
    assert load_config().remotes == remotes
    gpu, cloud, plain = remotes
    assert "sk-very-secret" not in repr(cloud) and "sk-very-secret" not in cloud.masked_key()
    assert (gpu.masked_key(), gpu.resolved_key()) == ("$LLMTUI_TEST_KEY (not set)", "")
    monkeypatch.setenv("LLMTUI_TEST_KEY", "from-env")
    assert (gpu.masked_key(), gpu.resolved_key()) == ("$LLMTUI_TEST_KEY (set)", "from-env")
    assert (cloud.resolved_key(), plain.masked_key()) == ("sk-very-secret", "no key")


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        ('[[remote]]\nname = "x"\nbase_url = "ftp://host/v1"\n', "should start with http:// or https://"),
        ('[[remote]]\nname = "x"\nbase_url = "http:///v1"\n', "name a host"),
        ('[[remote]]\nname = "x"\nbase_url = "http://h:99999/v1"\n', "bad port"),
        ('[[remote]]\nname = "bad name"\nbase_url = "http://h/v1"\n', "remote engine name"),
        ('[[remote]]\nbase_url = "http://h/v1"\n', "needs a name and a base_url"),
        ('[[remote]]\nname = "x"\nbase_url = "http://h/v1"\napi_key_env = "NOT-A-VAR"\n', "environment variable"),
        (
            '[[remote]]\nname = "x"\nbase_url = "http://a/v1"\n[[remote]]\nname = "X"\nbase_url = "http://b/v1"\n',
            "two remote engines",
        ),
        ('remote = "http://h"\n', r"\[\[remote\]\] tables"),
        ('[engine]\ntensor_split = ["a"]\n', "engine.tensor_split"),
        ('[engine]\nrpc_servers = "h:1"\n', "engine.rpc_servers"),
        ('[engine]\nn_gpu_layers = "most"\n', "GPU layers"),
        ('[server]\nallowed_hosts = "llm.lan, evil/x"\n', r"server.allowed_hosts: 'evil/x' is not a host name"),
        ('[server]\ncors_origins = "ftp://page.example"\n', r"server.cors_origins: 'ftp://page.example' is not an"),
    ],
)
def test_bad_remote_and_engine_tables_are_refused(app_dirs: tuple[Path, Path], text: str, fragment: str) -> None:
    config_path().parent.mkdir(parents=True, exist_ok=True)
    config_path().write_text(text)
    with pytest.raises(ConfigError, match=fragment):
        load_config()


def test_the_servers_allowed_hosts_and_origins_load(app_dirs: tuple[Path, Path]) -> None:
    config_path().parent.mkdir(parents=True, exist_ok=True)
    config_path().write_text('[server]\nallowed_hosts = "llm.lan 10.0.0.2,*"\ncors_origins = "http://localhost:3000"\n')
    server = load_config().server
    assert server.allowed_hosts == "llm.lan 10.0.0.2,*" and server.cors_origins == "http://localhost:3000"


# ----- the settings screen (Pilot) ----------------------------------------------------------------------------


@pytest.mark.anyio
async def test_settings_screen_refuses_a_bad_combination_and_keeps_a_good_one(app_dirs: tuple[Path, Path]) -> None:
    from textual.widgets import Input, Select, Static

    from app.tui.app import LlmtuiApp
    from app.tui.screens.settings_screen import SettingsScreen

    app = LlmtuiApp("starter", start_engine=False)
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.pause()
        await pilot.press("f3")
        await pilot.pause()
        screen = app.screen
        assert isinstance(screen, SettingsScreen)
        assert screen.query_one("#setting-n_gpu_layers", Input).value == "-1"
        screen.query_one("#setting-split_mode", Select).value = "none"
        screen.query_one("#setting-tensor_split", Input).value = "3, 1"
        await pilot.press("ctrl+s")
        await pilot.pause()
        assert app.screen is screen  # refused, with the reason on screen
        error = screen.query_one("#settings-error", Static)
        assert error.display and "--tensor-split needs a split mode other than none" in str(error.render())
        assert not config_path().exists()
        screen.query_one("#setting-tensor_split", Input).value = "3,x"
        await pilot.press("ctrl+s")
        await pilot.pause()
        assert "tensor split: '3,x' should be numbers" in str(error.render())
        screen.query_one("#setting-split_mode", Select).value = "layer"
        screen.query_one("#setting-tensor_split", Input).value = "3, 1"
        screen.query_one("#setting-n_gpu_layers", Input).value = "auto"
        screen.query_one("#setting-n_ubatch", Input).value = "256"
        screen.query_one("#setting-n_cpu_moe", Input).value = "4"
        screen.query_one("#setting-main_gpu", Input).value = "1"
        screen.query_one("#setting-use_mlock", Select).value = True
        screen.query_one("#setting-use_mmap", Select).value = False
        screen.query_one("#setting-rpc_servers", Input).value = "10.0.0.2:50052, 10.0.0.3:50052"
        await pilot.press("ctrl+s")
        await pilot.pause()
        assert not isinstance(app.screen, SettingsScreen)
    expected = EngineSettings(
        n_gpu_layers=GPU_LAYERS_AUTO,
        tensor_split=(3.0, 1.0),
        n_ubatch=256,
        n_cpu_moe=4,
        main_gpu=1,
        use_mlock=True,
        use_mmap=False,
        rpc_servers=("10.0.0.2:50052", "10.0.0.3:50052"),
    )
    assert load_config().engine == expected
    # A new app shows what was saved.
    second = LlmtuiApp("starter", start_engine=False)
    async with second.run_test(size=(80, 24)) as pilot:
        await pilot.pause()
        assert second.config.engine == expected
        await pilot.press("f3")
        await pilot.pause()
        screen = second.screen
        assert isinstance(screen, SettingsScreen)
        assert screen.query_one("#setting-n_gpu_layers", Input).value == "auto"
        assert screen.query_one("#setting-tensor_split", Input).value == "3,1"
        assert screen.query_one("#setting-rpc_servers", Input).value == "10.0.0.2:50052, 10.0.0.3:50052"
        assert screen.query_one("#setting-use_mmap", Select).value is False
        assert screen.read_config().engine == expected


@pytest.mark.anyio
async def test_settings_screen_adds_edits_and_removes_a_remote_engine(app_dirs: tuple[Path, Path]) -> None:
    from textual.widgets import Input, Label

    from app.tui.app import LlmtuiApp
    from app.tui.modals.remote_endpoint import RemoteEndpointModal
    from app.tui.screens.settings_screen import SettingsScreen

    app = LlmtuiApp("starter", start_engine=False)
    async with app.run_test(size=(120, 40)) as pilot:
        await pilot.pause()
        await pilot.press("f3")
        await pilot.pause()
        screen = app.screen
        assert isinstance(screen, SettingsScreen)
        screen.edit_remote(None)
        await pilot.pause()
        adding = app.screen
        assert isinstance(adding, RemoteEndpointModal)
        dialog = adding
        dialog.query_one("#remote-name", Input).value = "gpu-box"
        dialog.query_one("#remote-base-url", Input).value = "192.168.1.20:8080"
        await pilot.press("ctrl+s")
        await pilot.pause()
        assert app.screen is dialog and "should start with http:// or https://" in str(
            dialog.query_one("#remote-status", Label).render()
        )
        dialog.query_one("#remote-base-url", Input).value = "http://192.168.1.20:8080/v1"
        dialog.query_one("#remote-key", Input).value = "sk-typed-secret"
        await pilot.press("ctrl+s")
        await pilot.pause()
        assert app.screen is screen and screen.remotes == [
            RemoteSettings("gpu-box", "http://192.168.1.20:8080/v1", api_key="sk-typed-secret")
        ]
        assert "key in config.toml (hidden)" in str(screen.query_one(".remote-line", Label).render())
        screen.edit_remote(0)
        await pilot.pause()
        editing = app.screen
        assert isinstance(editing, RemoteEndpointModal)
        dialog = editing
        dialog.query_one("#remote-key", Input).value = ""
        dialog.query_one("#remote-key-env", Input).value = "GPU_BOX_KEY"
        await pilot.press("ctrl+s")
        await pilot.pause()
        await pilot.press("ctrl+s")
        await pilot.pause()
        assert not isinstance(app.screen, SettingsScreen)
        assert load_config().remotes == (
            RemoteSettings("gpu-box", "http://192.168.1.20:8080/v1", api_key_env="GPU_BOX_KEY"),
        )
        await pilot.press("f3")
        await pilot.pause()
        reopened = app.screen
        assert isinstance(reopened, SettingsScreen)
        await pilot.click("#remote-remove-0")
        await pilot.pause()
        assert reopened.remotes == []
        await pilot.press("ctrl+s")
        await pilot.pause()
    assert load_config().remotes == ()


DEEP = 100_000
DEEPLY_NESTED = {  # each about 200 KB: tomllib overflows its recursion, or (dotted keys) takes gigabytes
    "arrays": "[engine]\nx = " + "[" * DEEP + "]" * DEEP + "\n",
    "inline tables": "x = " + "{a=" * DEEP + "1" + "}" * DEEP + "\n",
    "a table header": "[" + ".".join(["a"] * DEEP) + "]\n",
    "a dotted key": ".".join(["a"] * DEEP) + " = 1\n",
    "an array of tables": "[[" + ".".join(["a"] * DEEP) + "]]\n",
}


@pytest.mark.parametrize("text", DEEPLY_NESTED.values(), ids=DEEPLY_NESTED.keys())
def test_a_deeply_nested_config_is_one_line_for_every_reader(
    app_dirs: tuple[Path, Path], text: str, capsys: pytest.CaptureFixture[str]
) -> None:
    from app.cli import main
    from app.core.tools.box import ToolError
    from app.core.tools.tool_config import read_tool_settings, remember_always_allow

    config = config_path()
    config.parent.mkdir(parents=True, exist_ok=True)
    config.write_text(text)
    refusals: list[str] = []
    with pytest.raises(ConfigError) as refused:
        load_config()
    refusals.append(str(refused.value))
    for reader in (read_tool_settings, lambda: remember_always_allow("get_weather")):
        with pytest.raises(ToolError) as tool_refused:
            reader()
        refusals.append(str(tool_refused.value))
    assert main(["models", "list", "--json"]) == 0
    refusals.append(capsys.readouterr().err.strip())
    for refusal in refusals:
        assert "\n" not in refusal and len(refusal) <= 300 and str(config) in refusal, refusal
    assert "nested more than 100 levels deep (arrays, tables or dotted keys)" in refusals[0]
    assert config.read_text() == text  # nothing was written over it


def test_nesting_up_to_the_limit_is_read_and_kept_by_a_save(app_dirs: tuple[Path, Path]) -> None:
    from app.core.config import MAX_TOML_NESTING, toml_nesting

    deep = "[" * MAX_TOML_NESTING + "]" * MAX_TOML_NESTING
    key = ".".join(["k"] * MAX_TOML_NESTING)
    text = f'# mine\n[extra]\nx = {deep}\n{key} = "a.b.c [[ {{ # not nesting"\ny = 1.5\n'
    assert toml_nesting(text) == MAX_TOML_NESTING and toml_nesting(text, 10) == 11
    config_path().parent.mkdir(parents=True, exist_ok=True)
    config_path().write_text(text)
    assert load_config() == Config()
    save_config(Config(theme="light"))
    saved = config_path().read_text()
    assert saved.startswith("# mine") and f"x = {deep}" in saved and key in saved
    assert load_config().theme == "light"
    with pytest.raises(ConfigError, match="nested more than 100 levels deep"):
        config_path().write_text(f"x = [{deep}]\n")
        load_config()
