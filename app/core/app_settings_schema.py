"""The app's own settings (theme, UI switches, speculation on/off), declared with the engine's declaration type
(engine_ext.settings_schema, whose docstring says how to add a setting), and the groups config.toml and the
screens read."""

from __future__ import annotations

from typing import Any, Final

from engine_ext import settings_schema as s
from engine_ext.settings_schema import Setting

THEMES: tuple[str, ...] = ("dark", "light")

THEME = Setting("theme", str, "dark", "the colour theme", label="theme", saved_in="ui", choices=THEMES)
SHOW_SIDEBAR = Setting("show_sidebar", bool, True, "the conversation list beside the chat", saved_in="ui")
DRAFT_COLOURING = Setting(
    "draft_colouring", bool, False, "colour text from accepted draft tokens in the transcript (F7)", saved_in="ui"
)
SPEC_DETAILS = Setting(
    "spec_details", bool, False, "the speculative meter expanded into its details (ctrl+o)", saved_in="ui"
)
SPEC_ENABLED = Setting(
    "enabled",
    bool,
    False,
    "speculative decoding on (F8 toggles it, F9 picks the type)",
    label="speculative decoding",
    saved_in="speculative",
)
SAMPLING_SEED = Setting(
    "seed",
    int,
    -1,  # a preset keeps -1 for "random"; the engine's SamplingParams says it with LLAMA_DEFAULT_SEED
    s.SEED.help,
    label=s.SEED.label,
    minimum=-1,
    maximum=s.UINT32_MAX,
    meaning=s.SEED.meaning,
    wanted=s.SEED.wanted,
)

CHAT_REPLY_LIMIT: Final = 4096
"""The chat's reply limit unless a conversation sets another (a small model's loop ends there, not minutes later)."""
REPLY_LIMIT = Setting(
    "max_tokens",
    int,
    CHAT_REPLY_LIMIT,
    f"most tokens in a reply (-1: no limit; {CHAT_REPLY_LIMIT} unless set: ctrl+g continues a reply cut there)",
    label=s.N_PREDICT.label,
    minimum=-1,
    maximum=s.INT32_MAX,
    excluded=(0,),
    meaning=s.N_PREDICT.meaning,
    wanted=s.N_PREDICT.wanted,
)

SERVER_ENABLED = Setting(
    "enabled",
    bool,
    False,
    "serve the loaded model when the app starts (F10 turns it on or off)",
    label="start with the app",
    saved_in="server",
)
SERVER_ROUTER = Setting(
    "router",
    bool,
    False,
    "F10 serves every local model (`llmtui serve` without -m: each loaded on demand in its own worker) instead of "
    "the app's own model",
    label="serve every local model",
    saved_in="server",
)
SERVER_HOST = Setting(
    "host", str, "127.0.0.1", "the address the API server listens on (127.0.0.1: this machine only)", saved_in="server"
)
SERVER_PORT = Setting("port", int, 8080, "the API server's port", saved_in="server", minimum=1, maximum=65535)
SERVER_KEY_ENV = Setting(
    "api_key_env",
    str,
    "",
    "the environment variable holding the API key clients must send ('': none, fine on 127.0.0.1 only)",
    label="API key variable",
    saved_in="server",
)
SERVER_ALLOWED_HOSTS = Setting(
    "allowed_hosts",
    str,
    "",
    "more Host names the API server answers to, separated by spaces or commas (* for any); "
    "localhost, loopback addresses and its own address always",
    label="allowed host names",
    saved_in="server",
)
SERVER_CORS = Setting(
    "cors_origins",
    str,
    "",
    "web pages (origins such as http://localhost:3000) allowed to call the API server from a browser, separated by "
    "spaces or commas (* for any; '': none)",
    label="CORS origins",
    saved_in="server",
)

# config.toml's [documents] table: the models the documents' search (F12, `run/chat --doc`) runs, each in an engine of
# its own. '' : the catalog's embedding model (or reranker) once it is downloaded; "none": none.
DOCS_EMBED_MODEL = Setting(
    "embed_model",
    str,
    "",
    "the embedding model searching attached documents with BM25 (a .gguf path, catalog id or org/repo; empty: the "
    "catalog's, once downloaded; none: BM25 alone)",
    label="embedding model",
    saved_in="documents",
)
DOCS_RERANK_MODEL = Setting(
    "rerank_model",
    str,
    "",
    "the reranker ordering the passages found (a .gguf path, catalog id or org/repo; empty: the catalog's, once "
    "downloaded; none: no reranking)",
    label="reranker",
    saved_in="documents",
)
DOCUMENTS: tuple[Setting[Any], ...] = (DOCS_EMBED_MODEL, DOCS_RERANK_MODEL)

OUTPUT_FORMAT = Setting(
    "output_format",
    str,
    "text",
    "the reply's shape: free text, any JSON object, JSON that follows the schema file, or the GBNF grammar file",
    label="output format",
    choices=("text", "json", "json_schema", "grammar"),
)
OUTPUT_FILE = Setting(
    "output_file",
    str,
    "",
    "the JSON schema or GBNF grammar file (output formats json_schema, grammar)",
    label="output file",
)
# A model's preset: config.toml's [models."ID"] table (ID: its id in `llmtui serve`, or its file's name), shown and
# edited in F4's model detail; `llmtui serve` without -m loads the model with it. Unset keys: serve's flags.
PRESET_ALIAS = Setting(
    "alias", str, "", "another name requests may give the model (llmtui serve)", label="alias", saved_in="models"
)
PRESET_VECTORS = Setting(
    "control_vectors",
    str,
    "",
    "control vectors steering its replies: names from the steering folder or .gguf files, each NAME or NAME:STRENGTH, "
    "separated by commas",
    label="control vectors",
    saved_in="models",
)
PRESET_PROJECTOR = Setting(
    "mmproj", str, "", "its multimodal projector file (images)", label="projector", saved_in="models"
)
PRESET_PIN = Setting(
    "pin",
    bool,
    False,
    "once loaded, llmtui serve keeps it loaded: never unloaded for another model or for being idle",
    label="pinned",
    saved_in="models",
)
MODEL_PRESET: tuple[Setting[Any], ...] = (
    PRESET_ALIAS,
    s.N_CTX,
    s.N_THREADS,
    s.N_GPU_LAYERS,
    s.SPEC_TYPE,
    s.DRAFT_MODEL,
    s.TEMPERATURE,
    s.TOP_K,
    s.TOP_P,
    s.MIN_P,
    s.REPEAT_PENALTY,
    s.REASONING_BUDGET,
    s.REASONING_EFFORT,
    PRESET_VECTORS,
    PRESET_PROJECTOR,
    PRESET_PIN,
)
UI: tuple[Setting[Any], ...] = (THEME, SHOW_SIDEBAR, DRAFT_COLOURING, SPEC_DETAILS)
# config.toml's [server] table: the app's API server (`llmtui serve` takes the same defaults as flags).
SERVER: tuple[Setting[Any], ...] = (
    SERVER_ENABLED,
    SERVER_ROUTER,
    SERVER_HOST,
    SERVER_PORT,
    SERVER_KEY_ENV,
    SERVER_ALLOWED_HOSTS,
    SERVER_CORS,
)
# config.toml's [speculative] table, in the order it is written.
SPECULATIVE: tuple[Setting[Any], ...] = (SPEC_ENABLED, s.SPEC_TYPE, s.DRAFT_MODEL, *s.DRAFT_NUMBERS)
# A sampling preset (per conversation, named presets) as the conversation settings show it: the sampling values in
# one grid, the reasoning and the reply's shape (longer labels, fields with choices) in another below it.
PRESET_SAMPLING_FIELDS: tuple[Setting[Any], ...] = (
    s.TEMPERATURE,
    s.TOP_K,
    s.TOP_P,
    s.MIN_P,
    s.REPEAT_PENALTY,
    REPLY_LIMIT,
    SAMPLING_SEED,
)
PRESET_REPLY_FIELDS: tuple[Setting[Any], ...] = (s.REASONING_BUDGET, s.REASONING_EFFORT, OUTPUT_FORMAT, OUTPUT_FILE)
PRESET: tuple[Setting[Any], ...] = (*PRESET_SAMPLING_FIELDS, *PRESET_REPLY_FIELDS)
# The preset's values SamplingParams takes as they are (max tokens goes with the request, the seed is mapped).
PRESET_SAMPLING: tuple[Setting[Any], ...] = (s.TEMPERATURE, s.TOP_K, s.TOP_P, s.MIN_P, s.REPEAT_PENALTY)
