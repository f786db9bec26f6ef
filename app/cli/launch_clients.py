"""The coding agents `llmtui launch` runs, and how each is pointed at llmtui's API server for one run: its
environment and its command-line config overrides, never its own config files (`--save` writes those:
app/cli/launch_save.py, from the same provider settings).

- Claude Code speaks Anthropic's Messages API (`/v1/messages`): ANTHROPIC_BASE_URL, a token, and every model name it
  asks for (its opus, sonnet and haiku aliases, subagents) set to the served model.
- Codex speaks OpenAI's Responses API (`/v1/responses`): a model provider given as `-c` overrides, with the model and
  its context window.
- OpenCode speaks chat completions through the AI SDK's openai-compatible provider: a provider in
  OPENCODE_CONFIG_CONTENT (its inline config, merged over the user's), with the model's context limit.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field

PROVIDER = "llmtui"  # the provider's name in Codex's and OpenCode's config
NO_KEY = "llmtui"  # the token a client sends when the server wants none (Claude Code needs one to skip its login)
SLOW_MS = 3_600_000  # the agents' request and stream-silence limits: an hour (a long prompt on a CPU)


@dataclass(frozen=True)
class Endpoint:
    """The server a client is pointed at: its root URL (no /v1), the model it serves, that model's context (0 when
    the server does not say) and the API key it wants ('' for none)."""

    base: str
    model: str
    n_ctx: int = 0
    key: str = ""


@dataclass(frozen=True)
class Setup:
    """What a client is started with: variables set (over the user's), variables set only where the user has none,
    and arguments put before the user's."""

    env: dict[str, str]
    env_defaults: dict[str, str] = field(default_factory=dict)
    args: tuple[str, ...] = ()


@dataclass(frozen=True)
class Client:
    name: str  # as `llmtui launch` takes it
    title: str
    command: str  # the executable looked for on PATH
    install: str  # how to install it, said when it is missing
    route: str  # the API route it speaks
    min_ctx: int  # the context its first request needs: its system prompt and tools, and room for a reply
    setup: Callable[[Endpoint], Setup]


def claude_setup(end: Endpoint) -> Setup:
    model = end.model
    names = (
        "ANTHROPIC_MODEL",
        "ANTHROPIC_DEFAULT_OPUS_MODEL",
        "ANTHROPIC_DEFAULT_SONNET_MODEL",
        "ANTHROPIC_DEFAULT_HAIKU_MODEL",
        "ANTHROPIC_SMALL_FAST_MODEL",
        "CLAUDE_CODE_SUBAGENT_MODEL",
    )
    env = {
        "ANTHROPIC_BASE_URL": end.base,
        "ANTHROPIC_AUTH_TOKEN": end.key or NO_KEY,
        "ANTHROPIC_API_KEY": "",  # a real Anthropic key in the user's environment is not sent to this server
        **dict.fromkeys(names, model),
    }
    defaults = {
        # No telemetry, error reports or update checks to Anthropic while it talks to a local model.
        "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
        # A local model may read a long prompt for minutes before its first token, in silence: Claude Code's own
        # limits (10 minutes a request, 5 of silence) would cut it off and send it again.
        "API_TIMEOUT_MS": str(SLOW_MS),
        "CLAUDE_STREAM_IDLE_TIMEOUT_MS": str(SLOW_MS),
    }
    if end.n_ctx:  # its default asks for 32,000 tokens a reply: a quarter of the context at most here
        defaults["CLAUDE_CODE_MAX_OUTPUT_TOKENS"] = str(min(32000, end.n_ctx // 4))
    return Setup(env, env_defaults=defaults)  # the user's own values win


def codex_provider(end: Endpoint, env_key: str = "") -> dict[str, object]:
    """Codex's `model_providers.llmtui` table; `env_key`: the variable Codex reads the key from ('' for none)."""
    provider: dict[str, object] = {
        "name": PROVIDER,
        "base_url": f"{end.base}/v1",
        "wire_api": "responses",
        "stream_idle_timeout_ms": SLOW_MS,  # its default, 5 minutes of silence, is a long prompt on a CPU
    }
    if env_key:
        provider["env_key"] = env_key
    return provider


def codex_setup(end: Endpoint) -> Setup:
    provider = codex_provider(end, "LLMTUI_API_KEY" if end.key else "")
    env = {"LLMTUI_API_KEY": end.key} if end.key else {}
    # `-c key=value` takes TOML values; JSON strings are TOML basic strings.
    table = ", ".join(f"{k} = {json.dumps(v)}" for k, v in provider.items())
    args = [
        "-c",
        f"model_providers.{PROVIDER}={{ {table} }}",
        "-c",
        f"model_provider={json.dumps(PROVIDER)}",
        "-c",
        f"model={json.dumps(end.model)}",
    ]
    if end.n_ctx:
        args += ["-c", f"model_context_window={end.n_ctx}"]
    return Setup(env, args=tuple(args))


def opencode_provider(end: Endpoint, api_key: str = "") -> dict[str, object]:
    """OpenCode's `provider.llmtui` entry (openai-compatible) with the model; `api_key`: its `options.apiKey`."""
    model: dict[str, object] = {"name": end.model, "tool_call": True}
    if end.n_ctx:
        model["limit"] = {"context": end.n_ctx, "output": min(end.n_ctx // 4, 32768)}
    options: dict[str, object] = {"baseURL": f"{end.base}/v1", "timeout": SLOW_MS}  # its default: 5 minutes
    if api_key:
        options["apiKey"] = api_key
    return {"npm": "@ai-sdk/openai-compatible", "name": PROVIDER, "options": options, "models": {end.model: model}}


def opencode_setup(end: Endpoint) -> Setup:
    config = {
        "$schema": "https://opencode.ai/config.json",
        "provider": {PROVIDER: opencode_provider(end, end.key)},
        "model": f"{PROVIDER}/{end.model}",
        "small_model": f"{PROVIDER}/{end.model}",  # titles and summaries: the same model, not a hosted one
    }
    return Setup({"OPENCODE_CONFIG_CONTENT": json.dumps(config)})


CLIENTS: dict[str, Client] = {
    c.name: c
    for c in (
        Client(
            "claude",
            "Claude Code",
            "claude",
            "npm install -g @anthropic-ai/claude-code",
            "/v1/messages",
            32768,
            claude_setup,
        ),
        Client("codex", "Codex", "codex", "npm install -g @openai/codex", "/v1/responses", 16384, codex_setup),
        Client(
            "opencode",
            "OpenCode",
            "opencode",
            "npm install -g opencode-ai",
            "/v1/chat/completions",
            16384,
            opencode_setup,
        ),
    )
}
