"""Each drafter × tiny architecture, greedy, through the engine worker (as the app runs it): plain decoding on the CPU
(-ngl 0) and on the device (every layer offloaded), then speculative decoding on the device. A native crash ends
the worker, not the test: it is recorded as "crashed", which the tests fail on (no crash may reach the user).

`run_combo` returns one row for scripts/vulkan_lane.sh's table: the speculation outcome on the device (identical to
plain decoding on the device, diverged at a named token, refused with the engine's message, or crashed) and
whether the device's plain output equals the CPU's.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from engine_ext.client import EngineClient, EngineCrashedError, EngineFailure
from engine_ext.params import GREEDY, ContextParams, ModelParams, SpeculativeParams
from engine_ext.protocol import Crashed, Failed, Finished, Generate, TokenChunk
from engine_ext.spec_catalog import load_plan

PROMPTS = (
    "Once upon a time",
    "def add(a, b):\n    return a + b\n\ndef add(a, b):\n",
    "1 2 3 4 5 6 7 8 9 10 11 12",
)
N_TOKENS = 32
N_MAX = 4


@dataclass(frozen=True)
class Combo:
    drafter: str  # the speculative type
    arch: str  # the target's architecture, for the table
    target: str  # tiny model kind (tests/tiny_models.py) of the target
    draft: str | None = None  # tiny model kind of the draft file, if any

    @property
    def id(self) -> str:
        return f"{self.drafter}-{self.target}" + (f"-{self.draft}" if self.draft else "")


# Every model drafter on the tiny architectures it can draft for (tests/engine/test_speculative.py shows each is
# lossless on the CPU), plus an n-gram drafter (no draft model) on each architecture.
COMBOS: tuple[Combo, ...] = (
    Combo("draft-mtp", "qwen35", "qwen35_mtp"),
    Combo("draft-mtp", "qwen35", "qwen35", "qwen35_mtp_sidecar"),
    Combo("draft-mtp", "nemotron_h_moe", "nemotron_h_moe_mtp"),
    Combo("draft-simple", "llama", "llama", "qwen3"),
    Combo("draft-simple", "qwen35", "qwen35", "llama"),
    Combo("draft-simple", "qwen3next", "qwen3next", "llama"),
    Combo("draft-simple", "nemotron_h_moe", "nemotron_h_moe", "llama"),
    Combo("draft-dflash", "llama", "llama", "dflash"),
    Combo("draft-dflash", "qwen3next", "qwen3next", "dflash"),
    Combo("draft-dspark", "llama", "llama", "dspark"),
    Combo("draft-eagle3", "llama", "llama", "eagle3"),
    Combo("ngram-mod", "llama", "llama"),
    Combo("ngram-mod", "qwen35", "qwen35"),
    Combo("ngram-mod", "qwen3next", "qwen3next"),
    Combo("ngram-mod", "nemotron_h_moe", "nemotron_h_moe"),
)


@dataclass
class Row:
    drafter: str
    arch: str
    target: str
    draft: str | None
    outcome: str = ""  # identical | diverged | refused | crashed
    detail: str = ""  # where it diverged, the refusal, the crash
    plain_device_vs_cpu: str = ""  # identical | diverged at …
    drafted: int = 0
    accepted: int = 0
    notices: list[str] = field(default_factory=list)
    seconds: float = 0.0

    def as_dict(self) -> dict[str, object]:
        return asdict(self)


def first_difference(a: list[list[int]], b: list[list[int]]) -> str:
    """'' when equal, else where the first token differs: 'prompt 2, token 17 of 32'."""
    for p, (x, y) in enumerate(zip(a, b, strict=True)):
        if x != y:
            i = next((i for i, (s, t) in enumerate(zip(x, y, strict=False)) if s != t), min(len(x), len(y)))
            return f"prompt {p + 1}, token {i + 1} of {len(x)}"
    return ""


def _generate(client: EngineClient, prompt: str, *, speculative: bool) -> tuple[list[int], Finished]:
    request = Generate(
        request_id=client.new_request_id(),
        prompt=prompt,
        sampling=GREEDY,
        max_tokens=N_TOKENS,
        ignore_eos=True,
        speculative=speculative,
    )
    ids: list[int] = []
    for event in client.generate(request):
        if isinstance(event, TokenChunk):
            ids.extend(event.token_ids)
        elif isinstance(event, Crashed):
            raise EngineCrashedError(event)
        elif isinstance(event, Failed):
            raise EngineFailure(event)
        elif isinstance(event, Finished):
            return ids, event
    raise AssertionError("the generation ended without Finished")


def run_combo(combo: Combo, models: dict[str, Path], log_path: Path) -> Row:
    """Plain on the CPU, plain on the device, speculative on the device: one worker, reloaded between them."""
    from engine_ext.gguf import inspect_gguf

    row = Row(combo.drafter, combo.arch, combo.target, combo.draft)
    t0 = time.perf_counter()
    target = models[combo.target]
    draft = str(models[combo.draft]) if combo.draft else None
    info = inspect_gguf(target)
    plan = load_plan(
        (combo.drafter,),
        architecture=info.architecture or "",
        n_layer_nextn=info.n_layer_nextn or 0,
        draft_model=draft,
        n_max=N_MAX,
    )
    context = ContextParams(n_ctx=512, n_batch=256, n_threads=2, n_rs_seq=plan.n_rs_seq)
    spec = SpeculativeParams(types=(combo.drafter,), draft_model=draft, n_max=N_MAX)
    stage = "loading on the CPU"
    try:
        with EngineClient(log_path) as client:
            client.start()
            client.load(target, ModelParams(n_gpu_layers=0, load_mtp=plan.load_mtp), context)
            stage = "plain decoding on the CPU"
            cpu = [_generate(client, p, speculative=False)[0] for p in PROMPTS]
            stage = "loading on the device"
            client.load(target, ModelParams(n_gpu_layers=-1, load_mtp=plan.load_mtp), context)
            stage = "plain decoding on the device"
            device = [_generate(client, p, speculative=False)[0] for p in PROMPTS]
            where = first_difference(cpu, device)
            row.plain_device_vs_cpu = f"diverged at {where}" if where else "identical"
            stage = "setting up speculation on the device"
            try:
                configured = client.set_speculative(spec)
            except EngineFailure as e:
                row.outcome, row.detail = "refused", str(e)
                return row
            row.notices = list(configured.notices)
            stage = "speculative decoding on the device"
            spec_out = []
            for p in PROMPTS:
                ids, done = _generate(client, p, speculative=True)
                spec_out.append(ids)
                if done.speculative is not None:
                    row.drafted += done.speculative.drafted
                    row.accepted += done.speculative.accepted
            where = first_difference(device, spec_out)
            row.outcome = "diverged" if where else "identical"
            row.detail = f"from plain decoding on the device at {where}" if where else ""
    except EngineCrashedError as e:
        tail = [line for line in e.crashed.log_tail.splitlines() if line.strip()][-2:]
        row.outcome = "crashed"
        row.detail = f"while {stage}: {e.crashed.description}; log: " + " | ".join(tail)
    except EngineFailure as e:
        row.outcome, row.detail = "failed", f"while {stage}: {e}"
    finally:
        row.seconds = round(time.perf_counter() - t0, 1)
    return row
