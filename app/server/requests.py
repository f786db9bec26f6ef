"""Request bodies from API clients → bounded, validated jobs (or one-line `ApiError`s, never an exception else).

Everything here is hostile until checked: the body's size is bounded before it is read (asgi.py), JSON that is not
an object, NaN/Infinity, numbers out of range, booleans where numbers belong, unknown fields, too many messages or
stop strings, and text past the server's limits are each a 400 naming the field. Fields OpenAI clients commonly send
with their default value (`user`, `logprobs: false`, `n: 1`, `null` anywhere) are accepted.
"""

from __future__ import annotations

import base64
import binascii
import json
import math
import re
import sys
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any, Literal

from app.server.api_errors import ApiError, bad_request
from app.server.tool_requests import parse_tools, tool_message
from engine_ext import settings_schema as schema
from engine_ext.image_input import MAX_IMAGE_BYTES, ImageRefused, check_image
from engine_ext.params import SamplingParams
from engine_ext.protocol import IMAGE_MARKER, ChatMessage, Embed, ImageRef
from engine_ext.setting import Setting
from engine_ext.spec_catalog import DRAFT_N_MAX, DRAFT_N_MIN, DRAFT_P_MIN
from engine_ext.untrusted_text import has_controls, one_line

# llama-server's samplers the engine lacks: a 400 naming the field, unless it asks for their "off".
_SAMPLERS_LACKED = {
    "dynatemp_range": 0,
    "dynatemp_exponent": 1,
    "adaptive_target": -1,
    "adaptive_decay": 0.9,
    "min_keep": 0,
}
# OpenAI's own fields we take (or accept at their default), llama-server's sampling extras, and llmtui's extras.
_COMMON = frozenset(
    {
        "model", "temperature", "top_p", "n", "stream", "stream_options", "stop", "max_tokens", "presence_penalty",
        "frequency_penalty", "logit_bias", "user", "seed", "logprobs", "top_logprobs", "metadata", "store",
        "service_tier", "top_k", "min_p", "repeat_penalty", "repeat_last_n", "cache_prompt", "speculative",
        "control_vectors", "return_provenance", "ignore_eos", "grammar", "json_schema", "n_predict",
        "dry_sequence_breakers", "samplers", *(setting.name for setting in schema.SAMPLING_MORE), *_SAMPLERS_LACKED,
    }
)  # fmt: skip
# OpenAI's chat fields that change nothing on a local server: taken and ignored (the README lists them). Each value is
# checked for its type; `modalities` only as ["text"] and `audio` only as null, since no audio is made here.
IGNORED_CHAT_FIELDS = (
    "prompt_cache_key", "safety_identifier", "verbosity", "modalities", "prediction", "web_search_options",
    "prompt_cache_retention", "audio", "store", "metadata", "service_tier", "user", "parallel_tool_calls",
)  # fmt: skip
_CHAT = _COMMON | set(IGNORED_CHAT_FIELDS) | {
    "messages", "max_completion_tokens", "response_format", "tools", "tool_choice", "functions", "function_call",
    "chat_template_kwargs", "reasoning_effort", "reasoning_budget", "reasoning_budget_tokens",
    "thinking_budget_tokens", "reasoning_budget_message",
}  # fmt: skip
_TEXT, _OBJECT, _FLAG = (str, "a string"), (dict, "an object"), (bool, "true or false")
_IGNORED_TYPES: dict[str, tuple[type, str]] = {
    "prompt_cache_key": _TEXT, "safety_identifier": _TEXT, "verbosity": _TEXT, "prediction": _OBJECT,
    "web_search_options": _OBJECT, "prompt_cache_retention": _TEXT, "metadata": _OBJECT, "service_tier": _TEXT,
    "user": _TEXT, "store": _FLAG,
}  # fmt: skip
_COMPLETION = _COMMON | {"prompt", "echo", "suffix", "best_of"}
MAX_PROMPTS = 16  # prompts in one /v1/completions request (each is a choice, run one after another)
_ROLES = {"system": "system", "developer": "system", "user": "user", "assistant": "assistant"}
_SPEC_FIELDS = frozenset({"type", "types", "n_max", "n_min", "p_min"})
_VECTOR_FIELDS = frozenset({"name", "strength", "layers"})
_INT_BOUND = 2**31 - 1
MAX_BUDGET_MESSAGE = 1000  # characters of a request's reasoning_budget_message


@dataclass(frozen=True)
class Limits:
    """What one request may ask of the server (`serve` flags set the first ones)."""

    max_body_bytes: int = 8 << 20
    max_messages: int = 1024
    max_text_chars: int = 4 << 20  # all message contents (or the prompt) together
    max_tokens: int = 0  # most tokens one reply may ask for (0: the model's context)
    max_stop: int = 16
    max_stop_chars: int = 256
    max_vectors: int = 8


@dataclass(frozen=True)
class SpecChoice:
    """A request's speculative decoding (llama-server's names); None fields take the server's settings."""

    types: tuple[str, ...]
    n_max: int | None = None
    n_min: int | None = None
    p_min: float | None = None


@dataclass(frozen=True)
class VectorChoice:
    """One control vector of a request's steering mix, by name: a vector the server knows, never a path."""

    name: str
    strength: float
    layers: tuple[int, int] | None = None


@dataclass(frozen=True)
class Job:
    """One validated request: what the backend runs and how the answer is shaped."""

    endpoint: Literal["chat", "completion"]
    model: str
    sampling: SamplingParams
    messages: tuple[ChatMessage, ...] = ()
    prompt: str | None = None
    max_tokens: int = -1  # -1: until the end of generation or the context is full
    stop: tuple[str, ...] = ()
    stream: bool = False
    include_usage: bool = False
    speculative: SpecChoice | None = None  # None: the server's settings
    control_vectors: tuple[VectorChoice, ...] | None = None  # None: the server's mix; (): no steering
    enable_thinking: bool | None = None
    return_provenance: bool = False
    grammar: str | None = None  # GBNF the reply follows (llama-server's `grammar`)
    json_schema: str | None = None  # or a JSON schema (response_format json_schema / json_object, `json_schema`)
    ignore_eos: bool = False  # llama-server's: generate max_tokens whatever the model says (benchmarks)
    tools: str | None = None  # the request's tool definitions, JSON text (engine_ext.tool_calls)
    tool_choice: str = "auto"  # auto | required | none
    reasoning_effort: str | None = None  # low | medium | high for templates that read it (None: the template's own)
    reasoning_budget: int = -1  # thinking tokens before the end of thinking is forced (-1: unlimited, 0: none)
    reasoning_budget_message: str = ""  # forced before the end of thinking when the budget is spent
    count_only: bool = False  # only count the rendered prompt's tokens (Anthropic's count_tokens)
    slot: tuple[Literal["save", "restore", "erase"], str, int] | None = None  # llama-server's slot action, file, id
    suffix: str | None = None  # completions: fill in the middle between `prompt` and this (the model's FIM tokens)
    echo: bool = False  # completions: the prompt comes back before the completion
    embed: Embed | None = None  # /v1/embeddings, /v1/rerank: pooled outputs, no generation (app.server.embeddings)
    prompts: tuple[str, ...] = ()  # completions: every prompt of the request, one choice each (`prompt`: the first)


MAX_SLOT_FILENAME = 255


def slot_filename(body: Mapping[str, object]) -> str:
    """The `filename` of a slot save or restore: a plain name in the server's --slot-save-path (as llama-server's
    fs_validate_filename: no folder, no `..`, no control character, at most 255 characters); ApiError 400 otherwise."""
    name = body.get("filename")
    if (
        not isinstance(name, str)
        or not 0 < len(name) <= MAX_SLOT_FILENAME
        or name in (".", "..")
        or any(c in name for c in "/\\:")
        or has_controls(name)
        or name != name.strip()
    ):
        raise ApiError(400, "invalid filename: a plain file name of at most 255 characters", "filename")
    return name


def slot_id(text: str, n_slots: int) -> int:
    """A slot action's `{id}`: a sequence of the server's (0 to n_slots - 1); ApiError 400 in one line otherwise."""
    if not (text.isascii() and text.isdigit() and len(text) <= 6 and int(text) < n_slots):
        have = "one slot, 0" if n_slots == 1 else f"slots 0 to {n_slots - 1}"
        raise ApiError(400, f"invalid slot id {text[:20]!r}: this server has {have}", "id_slot")
    return int(text)


class _OutOfRange(ValueError):
    """A JSON number past the float range: no field takes one, and float() of it raises OverflowError."""


def _bounded_int(text: str) -> int:
    if len(text) > 320 or abs(value := int(text)) > sys.float_info.max:  # float's range ends at 309 digits
        raise _OutOfRange(f"{text[:12]}… ({len(text.lstrip('-'))} digits)")
    return value


def _bounded_float(text: str) -> float:
    value = float(text)
    if math.isinf(value):
        raise _OutOfRange(text[:24])
    return value


_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F]")  # \uD800-\uDFFF: what a lone surrogate is written as


def parse_body(raw: bytes) -> dict[str, object]:
    """The JSON object in `raw` (already bounded in size), or a 400: every field of every endpoint goes through
    here, so numbers past the float range and text that is not Unicode (a lone surrogate) are refused here."""

    def no_constants(name: str) -> object:
        raise ValueError(f"{name} is not a JSON number")

    try:
        value = json.loads(
            raw.decode("utf-8"), parse_constant=no_constants, parse_int=_bounded_int, parse_float=_bounded_float
        )
    except UnicodeDecodeError:
        raise bad_request("the request body is not UTF-8") from None
    except RecursionError:
        raise bad_request("the request body nests too deeply") from None
    except _OutOfRange as e:
        raise bad_request(f"the request body holds a number past the float range: {e}") from None
    except ValueError as e:
        raise bad_request(f"the request body is not valid JSON: {str(e).splitlines()[0][:120]}") from None
    if not isinstance(value, dict):
        raise bad_request("the request body must be a JSON object")
    if _SURROGATE_ESCAPE.search(raw):
        where = _lone_surrogate(value)
        if where is not None:
            field = one_line(where, 80)
            message = f"{field} holds a lone surrogate (\\ud800-\\udfff): text must be valid Unicode"
            raise bad_request(message, one_line(re.split(r"[.\[]", where, maxsplit=1)[0], 60))
    return value


def _lone_surrogate(value: object) -> str | None:
    """Where the first string (a key or a value) that UTF-8 cannot encode is, as a field path; None if nowhere."""
    stack: list[tuple[object, str]] = [(value, "the request body")]
    while stack:
        item, where = stack.pop()
        if isinstance(item, str):
            try:
                item.encode("utf-8")
            except UnicodeEncodeError:
                return where
        elif isinstance(item, dict):
            for key, inner in reversed(item.items()):
                path = f"{where}.{key}" if item is not value else key
                stack += [(inner, path), (key, path)]  # the key is looked at first
        elif isinstance(item, list):
            stack += [(inner, f"{where}[{i}]") for i, inner in reversed(list(enumerate(item)))]
    return None


def _ignored(body: Mapping[str, object]) -> None:
    """The fields that change nothing here, each of its type (null is always taken)."""
    for name, (kind, what) in _IGNORED_TYPES.items():
        if body.get(name) is not None and not isinstance(body[name], kind):
            raise bad_request(f"{name} must be {what}", name)
    if body.get("modalities") not in (None, ["text"]):
        raise bad_request('modalities: this server answers in text only (["text"])', "modalities")
    if body.get("audio") is not None:
        raise bad_request("audio: this server makes no audio (audio must be null)", "audio")


def parse_chat(body: Mapping[str, object], defaults: SamplingParams, limits: Limits, model: str) -> Job:
    known_fields(body, _CHAT)
    _ignored(body)
    tools, tool_choice = parse_tools(body)
    messages = _messages(body.get("messages"), limits)
    template_kwargs = _object(body, "chat_template_kwargs")
    thinking = template_kwargs.get("enable_thinking")
    if thinking is not None and not isinstance(thinking, bool):
        raise bad_request("chat_template_kwargs.enable_thinking must be true or false", "chat_template_kwargs")
    return replace(
        _common(body, defaults, limits, model, "chat"),
        messages=messages,
        max_tokens=_max_tokens(body, ("max_completion_tokens", "max_tokens", "n_predict"), limits),
        enable_thinking=False if thinking is None and body.get("reasoning_effort") == "none" else thinking,
        tools=tools,
        tool_choice=tool_choice,
        **_reasoning(body),
    )


def parse_completion(body: Mapping[str, object], defaults: SamplingParams, limits: Limits, model: str) -> Job:
    known_fields(body, _COMPLETION)
    if body.get("best_of") not in (None, 1):
        raise bad_request("best_of is not supported by this server (1 only)", "best_of")
    prompt = body.get("prompt")
    prompts = [prompt] if isinstance(prompt, str) else prompt
    if not isinstance(prompts, list) or not prompts or not all(isinstance(p, str) for p in prompts):
        raise bad_request("prompt must be a string or a list of strings", "prompt")
    if len(prompts) > MAX_PROMPTS:
        raise bad_request(f"prompt has {len(prompts)} prompts; this server takes at most {MAX_PROMPTS}", "prompt")
    suffix = body.get("suffix")
    if suffix is not None and not isinstance(suffix, str):
        raise bad_request("suffix must be a string", "suffix")
    for i, text in enumerate([*prompts, suffix or ""]):
        _check_text(text, "suffix" if i == len(prompts) else "prompt")
    if sum(map(len, prompts)) + len(suffix or "") > limits.max_text_chars:
        raise ApiError(413, f"the prompt is longer than this server's limit of {limits.max_text_chars} characters")
    return replace(
        _common(body, defaults, limits, model, "completion"),
        prompt=prompts[0],
        prompts=tuple(prompts),
        suffix=suffix,
        echo=bool(_bool(body, "echo")),
        max_tokens=_max_tokens(body, ("max_tokens", "n_predict"), limits),
    )


def _common(
    body: Mapping[str, object],
    defaults: SamplingParams,
    limits: Limits,
    model: str,
    endpoint: Literal["chat", "completion"],
) -> Job:
    requested = body.get("model")
    if requested is not None and not isinstance(requested, str):
        raise bad_request("model must be a string", "model")
    n = _int(body, "n", 1, 2**31 - 1)
    if n not in (None, 1):  # (was "n must be between 1 and 1": issue 49, 19)
        raise bad_request(
            f"n = {n} is not supported: this server writes one choice per request (n = 1); send the request {n} "
            f"times for {n} choices",
            "n",
        )
    for field in ("logprobs", "top_logprobs"):
        if body.get(field) not in (None, False, 0):
            raise bad_request(f"{field} is not supported by this server", field)
    if body.get("logit_bias") not in (None, {}):
        raise bad_request("logit_bias is not supported by this server", "logit_bias")
    stream = _bool(body, "stream")
    options = _object(body, "stream_options")
    include_usage = options.get("include_usage", False)
    if not isinstance(include_usage, bool):
        raise bad_request("stream_options.include_usage must be true or false", "stream_options")
    sampling = _sampling(body, defaults)
    grammar, schema = _output_shape(body)
    return Job(
        endpoint=endpoint,
        model=model,
        sampling=sampling,
        stop=_stop(body.get("stop"), limits),
        stream=bool(stream),
        include_usage=include_usage and bool(stream),
        speculative=_speculative(body.get("speculative")),
        control_vectors=_vectors(body.get("control_vectors"), limits),
        return_provenance=bool(_bool(body, "return_provenance")),
        ignore_eos=bool(_bool(body, "ignore_eos")),
        grammar=grammar,
        json_schema=schema,
    )


def _output_shape(body: Mapping[str, object]) -> tuple[str | None, str | None]:
    """OpenAI's response_format (text, json_object, json_schema) and llama-server's `grammar` / `json_schema`: the
    grammar or schema text the engine constrains the reply with (its size and syntax are checked there)."""
    grammar = body.get("grammar")
    schema: object = body.get("json_schema")
    fmt = _object(body, "response_format")
    kind = fmt.get("type")
    if kind == "json_object":
        schema = fmt.get("schema", {"type": "object"})
    elif kind == "json_schema":
        inner = fmt.get("json_schema")
        schema = inner.get("schema") if isinstance(inner, dict) else None
        if schema is None:
            raise bad_request("response_format json_schema needs json_schema.schema", "response_format")
    elif kind not in (None, "text"):
        raise bad_request("response_format.type must be text, json_object or json_schema", "response_format")
    if grammar is not None and not isinstance(grammar, str):
        raise bad_request("grammar must be a string (GBNF)", "grammar")
    if grammar is not None and schema is not None:
        raise bad_request("give a grammar or a JSON schema, not both", "grammar")
    if schema is not None and not isinstance(schema, dict | bool):
        raise bad_request("a JSON schema is an object", "response_format")
    text = json.dumps(schema) if schema is not None else None
    if len(text or grammar or "") > 256 * 1024:
        raise ApiError(413, "the grammar or JSON schema is longer than 256 KiB")
    return grammar, text


def _sampling(body: Mapping[str, object], d: SamplingParams) -> SamplingParams:
    def pick(value: float | int | None, default: float | int) -> float | int:
        return default if value is None else value

    seed = _int(body, "seed", -1, 2**32 - 1)
    for name, off in _SAMPLERS_LACKED.items():
        if body.get(name) not in (None, off):
            raise bad_request(f"{name}: this server's engine has no such sampler (only {off} is taken)", name)
    more: dict[str, Any] = {}
    for setting in schema.SAMPLING_MORE:
        low = -math.inf if setting.minimum is None else setting.minimum
        high = math.inf if setting.maximum is None else setting.maximum
        if setting.kind is int:  # every int sampler setting declares both ends
            value: float | None = _int(body, setting.name, int(low), int(high))
        else:
            value = _number(body, setting.name, low, high)
        more[setting.name] = getattr(d, setting.name) if value is None else setting.kind(value)
    return SamplingParams(
        **more,
        dry_sequence_breakers=_breakers(body.get("dry_sequence_breakers"), d.dry_sequence_breakers),
        samplers=_sampler_order(body.get("samplers"), d.samplers),
        temperature=float(pick(_number(body, "temperature", 0.0, 100.0), d.temperature)),
        top_k=int(pick(_int(body, "top_k", 0, 1_000_000), d.top_k)),
        top_p=float(pick(_number(body, "top_p", 0.0, 1.0), d.top_p)),
        min_p=float(pick(_number(body, "min_p", 0.0, 1.0), d.min_p)),
        repeat_penalty=float(pick(_number(body, "repeat_penalty", 1e-3, 100.0), d.repeat_penalty)),
        repeat_last_n=int(pick(_int(body, "repeat_last_n", -1, 1 << 20), d.repeat_last_n)),
        presence_penalty=float(pick(_number(body, "presence_penalty", -2.0, 2.0), d.presence_penalty)),
        frequency_penalty=float(pick(_number(body, "frequency_penalty", -2.0, 2.0), d.frequency_penalty)),
        seed=d.seed if seed is None or seed == -1 else seed,
    )


def _breakers(value: object, default: tuple[str, ...]) -> tuple[str, ...]:
    """DRY's sequence breakers: a non-empty list of strings, as llama-server takes them."""
    if value is None:
        return default
    if (
        not isinstance(value, list)
        or not 0 < len(value) <= schema.MAX_DRY_BREAKERS
        or not all(isinstance(b, str) and 0 < len(b) <= schema.MAX_DRY_BREAKER_CHARS for b in value)
    ):
        raise bad_request(
            f"dry_sequence_breakers must be 1 to {schema.MAX_DRY_BREAKERS} strings of 1 to "
            f"{schema.MAX_DRY_BREAKER_CHARS} characters",
            "dry_sequence_breakers",
        )
    for text in value:
        _check_text(text, "dry_sequence_breakers")
    return tuple(value)


def _sampler_order(value: object, default: tuple[str, ...]) -> tuple[str, ...]:
    """The samplers' order: llama.cpp's names (a list) or its letters (a string), as llama-server reads them."""
    if value is None:
        return default
    if isinstance(value, str) and len(value) <= 32:
        names = [schema.SAMPLER_CHARS.get(char, char) for char in value]
    elif isinstance(value, list) and len(value) <= 32 and all(isinstance(n, str) for n in value):
        names = [schema.SAMPLER_ALIASES.get(n.lower().replace("-", "_"), n.lower().replace("-", "_")) for n in value]
    else:
        raise bad_request("samplers must be a list of sampler names or a string of their letters", "samplers")
    unknown = [n for n in names if n not in schema.SAMPLER_NAMES]
    if unknown:
        known = ", ".join(schema.SAMPLER_NAMES)
        raise bad_request(f"samplers: no sampler {one_line(unknown[0], 40)!r} here (known: {known})", "samplers")
    return tuple(names)


def _messages(value: object, limits: Limits) -> tuple[ChatMessage, ...]:
    if not isinstance(value, list) or not value:
        raise bad_request("messages must be a non-empty list", "messages")
    if len(value) > limits.max_messages:
        raise ApiError(413, f"{len(value)} messages: this server takes at most {limits.max_messages}", "messages")
    out: list[ChatMessage] = []
    total = 0
    for i, item in enumerate(value):
        where = f"messages[{i}]"
        if not isinstance(item, dict):
            raise bad_request(f"{where} must be an object", "messages")
        role = item.get("role")
        if not isinstance(role, str) or (role not in _ROLES and role != "tool"):
            raise bad_request(f"{where}.role must be one of system, developer, user, assistant, tool", "messages")
        text, images = _content(item.get("content"), where)
        total += len(text)
        if total > limits.max_text_chars:
            raise ApiError(
                413, f"the messages are longer than this server's limit of {limits.max_text_chars} characters"
            )
        if role == "tool" or (role == "assistant" and item.get("tool_calls")):
            if images:
                raise bad_request(
                    f"{where}: images go in user messages, not in tool calls or their results", "messages"
                )
            out.append(tool_message(item, role, text, where))
        else:
            out.append(ChatMessage(_ROLES[str(role)], text, images=images))
    return tuple(out)


def _content(value: object, where: str) -> tuple[str, tuple[ImageRef, ...]]:
    """A message's text, each image part as IMAGE_MARKER where it was, and its images (data: URLs, checked)."""
    if isinstance(value, str):
        _check_text(value, f"{where}.content")
        return value, ()
    if value is None:
        return "", ()
    if not isinstance(value, list):
        raise bad_request(f"{where}.content must be a string or a list of parts", "messages")
    parts: list[str] = []
    images: list[ImageRef] = []
    after_image = False
    for j, part in enumerate(value):
        if not isinstance(part, dict):
            raise bad_request(f"{where}.content[{j}] must be an object", "messages")
        kind = part.get("type")
        if kind == "image_url":
            images.append(_image_part(part.get("image_url"), f"{where}.content[{j}]"))
            parts.append(IMAGE_MARKER)
            after_image = True
            continue
        if kind in ("input_image", "image", "input_audio"):
            raise bad_request(f"{where}.content[{j}]: {kind} parts are not supported by this server yet", "messages")
        text = part.get("text")
        if kind != "text" or not isinstance(text, str):
            raise bad_request(f"{where}.content[{j}] must be a text part", "messages")
        _check_text(text, f"{where}.content[{j}]")
        # Text parts joined by a newline, none beside an image (upstream's concat_content_parts).
        parts.append(("\n" if parts and not after_image else "") + text.replace(IMAGE_MARKER, ""))
        after_image = False  # only image parts place images
    return "".join(parts), tuple(images)


_DATA_URL = re.compile(r"data:image/[A-Za-z0-9.+-]{1,32};base64,", re.ASCII)


def _image_part(value: object, where: str) -> ImageRef:
    """An image_url part: a base64 `data:` URL, its image checked before the engine sees it. Remote URLs are not
    fetched (the server would fetch what any client names)."""
    url = value.get("url") if isinstance(value, dict) else value
    if not isinstance(url, str) or not url:
        raise bad_request(f"{where}.image_url.url must be a data: URL", "messages")
    head = _DATA_URL.match(url)
    if head is None:
        what = "remote image URLs are not fetched" if url.startswith(("http:", "https:")) else "not a data: URL"
        raise bad_request(f"{where}: {what}; send the image as data:image/...;base64,...", "messages")
    encoded = url[head.end() :]
    if len(encoded) > (MAX_IMAGE_BYTES * 4) // 3 + 4:
        raise ApiError(413, f"{where}: the image is larger than {MAX_IMAGE_BYTES >> 20} MiB", "messages")
    try:
        data = base64.b64decode(encoded, validate=True)
    except (binascii.Error, ValueError):
        raise bad_request(f"{where}: the data: URL is not valid base64", "messages") from None
    try:
        image = check_image(data, f"{where} image")
    except ImageRefused as exc:
        raise bad_request(str(exc), "messages") from None
    return ImageRef(image.sha256, data=image.data, name=f"image.{image.format.lower()}")


def _check_text(text: str, where: str) -> None:
    """Text with lone surrogates cannot be encoded for the tokenizer: say so here rather than fail in the engine."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        raise bad_request(f"{where} holds text that is not valid Unicode", "messages") from None


def _stop(value: object, limits: Limits) -> tuple[str, ...]:
    if value is None:
        return ()
    items = [value] if isinstance(value, str) else value
    if not isinstance(items, list) or not all(isinstance(s, str) for s in items):
        raise bad_request("stop must be a string or a list of strings", "stop")
    if len(items) > limits.max_stop:
        raise bad_request(f"stop has {len(items)} strings; at most {limits.max_stop}", "stop")
    for s in items:
        if not s or len(s) > limits.max_stop_chars:
            raise bad_request(f"each stop string must have 1 to {limits.max_stop_chars} characters", "stop")
        _check_text(s, "stop")
    return tuple(items)


def _max_tokens(body: Mapping[str, object], names: tuple[str, ...], limits: Limits) -> int:
    """The reply's token limit from the first of `names` given (n_predict is llama-server's; -1: no limit)."""
    name = next((n for n in names if body.get(n) is not None), names[0])
    value = body.get(name)
    if value is None or value == -1:
        return limits.max_tokens or -1
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise bad_request(f"{name} must be a positive integer", name)
    if limits.max_tokens and value > limits.max_tokens:
        raise bad_request(f"{name} is {value}; this server gives at most {limits.max_tokens} tokens a reply", name)
    return min(value, _INT_BOUND)


def _speculative(value: object) -> SpecChoice | None:
    if value is None:
        return None
    if not isinstance(value, dict):
        raise bad_request("speculative must be an object", "speculative")
    unknown = sorted(set(value) - _SPEC_FIELDS)
    if unknown:
        raise bad_request(f"speculative: unknown field {unknown[0][:40]!r}", "speculative")
    kinds = value.get("types", value.get("type"))
    if isinstance(kinds, str):
        kinds = [kinds] if kinds not in ("", "none") else []
    if kinds is None:
        kinds = []
    if not isinstance(kinds, list) or len(kinds) > 8 or not all(isinstance(k, str) and len(k) < 40 for k in kinds):
        raise bad_request("speculative.type must be a type name or a list of them", "speculative")
    return SpecChoice(
        types=tuple(kinds),
        n_max=_int(value, "n_max", *_range(DRAFT_N_MAX), "speculative"),
        n_min=_int(value, "n_min", *_range(DRAFT_N_MIN), "speculative"),
        p_min=_number(value, "p_min", *_range(DRAFT_P_MIN), "speculative"),
    )


def _vectors(value: object, limits: Limits) -> tuple[VectorChoice, ...] | None:
    if value is None:
        return None
    if not isinstance(value, list):
        raise bad_request("control_vectors must be a list", "control_vectors")
    if len(value) > limits.max_vectors:
        raise bad_request(f"control_vectors has {len(value)} entries; at most {limits.max_vectors}", "control_vectors")
    out: list[VectorChoice] = []
    for item in value:
        if not isinstance(item, dict):
            raise bad_request("each control vector must be an object with a name", "control_vectors")
        unknown = sorted(set(item) - _VECTOR_FIELDS)
        if unknown:
            raise bad_request(f"control_vectors: unknown field {unknown[0][:40]!r}", "control_vectors")
        name = item.get("name")
        if not isinstance(name, str) or not name or len(name) > 200:
            raise bad_request("each control vector needs a name (a vector this server knows)", "control_vectors")
        strength = _number(item, "strength", -1000.0, 1000.0, "control_vectors")
        layers = item.get("layers")
        span: tuple[int, int] | None = None
        if layers is not None:
            if (
                not isinstance(layers, list)
                or len(layers) != 2
                or not all(isinstance(v, int) and not isinstance(v, bool) and 0 <= v <= 4096 for v in layers)
                or layers[1] < layers[0]
            ):
                raise bad_request("layers must be [first, last] with 0 ≤ first ≤ last", "control_vectors")
            span = (layers[0], layers[1])
        out.append(VectorChoice(name, 1.0 if strength is None else strength, span))
    return tuple(out)


# The budget's names: llama.cpp's flag, llama-server's field and its alias (the same thing; one value if several).
_BUDGET_FIELDS = ("reasoning_budget", "reasoning_budget_tokens", "thinking_budget_tokens")
_EFFORTS = ("none", *(e for e in schema.REASONING_EFFORTS if e != schema.REASONING_EFFORT.default))


def _reasoning(body: Mapping[str, object]) -> dict[str, Any]:
    """A chat request's reasoning fields (as llama-server reads them): reasoning_effort ("none": no thinking), the
    budget under any of its names, and the message forced before the end of thinking."""
    effort = body.get("reasoning_effort")
    if effort is not None and effort not in _EFFORTS:
        raise bad_request(f"reasoning_effort must be one of {', '.join(_EFFORTS)}", "reasoning_effort")
    lo, hi = _range(schema.REASONING_BUDGET)
    budgets = {name: value for name in _BUDGET_FIELDS if (value := _int(body, name, lo, hi)) is not None}
    if len(set(budgets.values())) > 1:
        raise bad_request(f"{' and '.join(budgets)} differ: send one reasoning budget", next(iter(budgets)))
    message = body.get("reasoning_budget_message", "")
    if not isinstance(message, str) or len(message) > MAX_BUDGET_MESSAGE:
        raise bad_request(
            f"reasoning_budget_message must be text of at most {MAX_BUDGET_MESSAGE} characters",
            "reasoning_budget_message",
        )
    _check_text(message, "reasoning_budget_message")
    return {
        "reasoning_effort": None if effort in (None, "none") else effort,
        "reasoning_budget": next(iter(budgets.values()), schema.REASONING_BUDGET.default),
        "reasoning_budget_message": message,
    }


def known_fields(body: Mapping[str, object], fields: frozenset[str]) -> None:
    if not isinstance(body, dict):
        raise bad_request("the request body must be a JSON object")
    unknown = sorted(k for k in body if k not in fields)
    if unknown:
        raise bad_request(f"unknown field {unknown[0][:60]!r}", unknown[0][:60])


def _object(body: Mapping[str, object], key: str) -> dict[str, object]:
    value = body.get(key)
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise bad_request(f"{key} must be an object", key)
    return value


def _bool(body: Mapping[str, object], key: str) -> bool | None:
    value = body.get(key)
    if value is not None and not isinstance(value, bool):
        raise bad_request(f"{key} must be true or false", key)
    return value


def _number(body: Mapping[str, object], key: str, lo: float, hi: float, param: str | None = None) -> float | None:
    value = body.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise bad_request(f"{key} must be a number", param or key)
    if not lo <= value <= hi:
        raise bad_request(f"{key} must be between {lo:g} and {hi:g}, not {value:g}", param or key)
    return float(value)


def _range(setting: Setting[Any]) -> tuple[Any, Any]:
    """A declared setting's range (engine_ext.spec_catalog): what a request may ask of it, as the F9 panel and the
    CLI allow."""
    assert setting.minimum is not None and setting.maximum is not None, setting.name
    return setting.minimum, setting.maximum


def _int(body: Mapping[str, object], key: str, lo: int, hi: int, param: str | None = None) -> int | None:
    value = body.get(key)
    if value is None:
        return None
    if isinstance(value, float) and value.is_integer() and abs(value) < 2**53:
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int):
        raise bad_request(f"{key} must be an integer", param or key)
    if not lo <= value <= hi:
        raise bad_request(f"{key} must be between {lo} and {hi}", param or key)
    return value
