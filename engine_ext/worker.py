"""The engine worker process: owns llama.cpp state and serves requests from the client over a pipe."""

from __future__ import annotations

import os
import sys
import time
import traceback
from collections import deque
from multiprocessing.connection import Connection
from pathlib import Path
from typing import TYPE_CHECKING, Any

from engine_ext.engine_status import FAULT_ENV, EngineStatus, attach, entered, phase, request_read
from engine_ext.grammar import NATIVE_LOG_ENV
from engine_ext.private_files import private_dir, private_file
from engine_ext.protocol import (
    PROTOCOL_VERSION,
    Cancel,
    Embed,
    EndThinking,
    Event,
    Failed,
    Generate,
    Hello,
    Inspect,
    Inspected,
    Loaded,
    LoadModel,
    LoadProgress,
    MakeControlVector,
    ModelInfo,
    Request,
    SetQueueLimit,
    SetSpeculative,
    SetSteering,
    Shutdown,
    SlotAction,
    SpeculativeSet,
    SteeringSet,
    Submit,
    ThreadsChanged,
    Unloaded,
    UnloadModel,
    VectorMade,
)
from engine_ext.threads import thread_governor

if TYPE_CHECKING:
    from engine_ext.params import SteeringEntry

LOAD_PROGRESS_INTERVAL_S = 0.1
# Tests only: the worker crashes natively (SIGSEGV) where a CPU's weight-repack path crashed a user's machine (AMX,
# on the first decode), so recovery can be tested on machines where repacking works. Values: repack-load and
# repack-decode (only while weights are repacked: use_extra_bufts, and an extra buffer type left to repack for),
# repack-load:TYPE and repack-decode:TYPE (only while weights are repacked for that extra buffer type: a fault of
# one type's kernels, which recovery leaves out while the others stay), decode (always, on every generation).
# engine_ext.engine_status reads the same switch for faults in a phase (crash-grammar, hang-sample…).
# Written to the engine log each time the worker replaces the target context (the device tests count it).
FRESH_CONTEXT_LOG = "a fresh target context"


def steering_replaces_context(model: Any) -> bool:
    """Whether a steering change gets a fresh target context: with layers on Mesa's lavapipe, where a control vector
    set in a context that had decoded crashed the engine (Mesa 22.3; Mesa 25 ran it, issue 24). On a GPU a change
    acts at the next token, also while a reply streams."""
    from engine_ext.speculative.factory import target_on_lavapipe

    return target_on_lavapipe(model)


def _inject_fault(stage: str, repacked_for: tuple[str, ...]) -> None:
    """The test fault of `stage` (load, decode) when FAULT_ENV asks for it; `repacked_for`: the extra buffer types
    the weights are repacked for now."""
    fault = os.environ.get(FAULT_ENV, "")
    kind, _, buft = fault.partition(":")
    if fault == stage or (kind == f"repack-{stage}" and (buft in repacked_for if buft else bool(repacked_for))):
        import ctypes

        print(f"--- {FAULT_ENV}={fault}: crashing natively at {stage}", flush=True)
        ctypes.string_at(0)  # a read of address 0: SIGSEGV, as a native fault in llama.cpp would


def _redirect_native_output(log_path: Path) -> None:
    """Send fds 1 and 2 (llama.cpp's logging, GGML_ABORT messages) to the log file, never the terminal."""
    private_file(private_dir(log_path.parent) / log_path.name)  # owner-only, like the app's files (an older log too)
    fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)
    os.environ[NATIVE_LOG_ENV] = str(log_path)  # where llama.cpp's own messages are (native_log_tail)
    sys.stdout = open(1, "w", buffering=1, closefd=False)  # noqa: SIM115 - lives as long as the process
    sys.stderr = open(2, "w", buffering=1, closefd=False)  # noqa: SIM115


class Worker:
    """Serves one client: dispatches requests, streams events, polls for cancel between decode steps."""

    def __init__(self, conn: Connection, skip_bufts: tuple[str, ...] = ()) -> None:
        self.conn = conn
        self.session: Any = None  # engine_ext.generate.Session once a model is loaded
        self.model: Any = None
        self.ctx: Any = None
        self.mixer: Any = None  # engine_ext.steering.mixer.SteeringMixer once steering is used
        self.spec_params: Any = None  # the SpeculativeParams speculation was turned on with (None: off)
        self.device_backends: tuple[str, ...] = ()  # the GPU backends the target's layers are on (none: the CPU)
        self.fresh_steering = False  # steering changes get a fresh context (steering_replaces_context)
        self.backlog: deque[Request] = deque()
        self.shutting_down = False
        self.skip_bufts = skip_bufts
        self.no_repack = False  # an engine without patch 0004 kept a buffer type it was to leave out: none at all
        self.extra_bufts: tuple[str, ...] = ()  # the CPU extra buffer types weights are repacked for
        self.scheduler: Any = None  # engine_ext.parallel.ParallelScheduler once a Submit came for the loaded model
        self.max_waiting: int | None = None  # SetQueueLimit's bound (None: the scheduler's default)
        self.disk_parts: dict[str, object] = {}  # the loaded model's key for saved states (engine_ext.disk_cache)
        self.slot_waits: list[
            SlotAction
        ] = []  # slot actions waiting for their parallel sequence (engine_ext.seq_slots)

    def send(self, event: Event) -> None:
        self.conn.send(event)

    def serve(self) -> None:
        from engine_ext.bindings import C, cpu_extra_buffer_types, log_llama_to_stderr, offload_device_count

        log_llama_to_stderr()  # INFO and up in the log file
        C.llama_backend_init()
        info = C.llama_print_system_info().decode("utf-8", errors="replace")
        try:
            extra_bufts, gpu_devices = cpu_extra_buffer_types(), offload_device_count()
        except (OSError, AttributeError):  # a build without the registry functions: none to report
            extra_bufts, gpu_devices = (), 0
        if set(self.skip_bufts) & set(extra_bufts):  # the engine lacks patch 0004: no repacking is all it can do
            self.no_repack, extra_bufts = True, ()
        self.extra_bufts = extra_bufts
        self.send(Hello(PROTOCOL_VERSION, os.getpid(), _llama_cpp_version(), info, extra_bufts, gpu_devices))
        while not self.shutting_down:
            scheduler = self.scheduler
            if scheduler is not None:
                # Parallel requests take turns with the rest: anything else waits until the running ones are done
                # (no new ones join meanwhile), then runs on the context on its own.
                scheduler.admitting = not self.backlog
                if scheduler.busy:
                    self._parallel_step(scheduler)
                    continue
                scheduler.release()
            request = self.backlog.popleft() if self.backlog else self._recv()
            if request is None:
                break
            self.handle(request)
        self.unload()

    def _recv(self) -> Request | None:
        entered("idle")
        try:
            request = self.conn.recv()
        except (EOFError, OSError):
            return None  # the client went away
        request_read()
        return request  # type: ignore[no-any-return]

    def _parallel_step(self, scheduler: Any) -> None:
        """One step of the parallel sequences, after the pipe is drained: a Cancel stops its request at this step."""
        if not scheduler.active:
            mixer = self.mixer
            scheduler.activate(mixer.active.entries if mixer is not None and mixer.active is not None else ())
        conn = self.conn
        while conn.poll(0):
            try:
                incoming = conn.recv()
            except (EOFError, OSError):
                incoming = Shutdown()
            request_read()
            if isinstance(incoming, Submit | SetQueueLimit | Cancel | EndThinking | Inspect) or (
                isinstance(incoming, SlotAction) and incoming.request_id is not None
            ):
                self.handle(incoming)
            elif isinstance(incoming, Shutdown):
                self.shutting_down = True
            else:
                self.backlog.append(incoming)
        if self.shutting_down:
            return
        try:
            with phase("reply"):
                scheduler.step()
        except Exception as exc:  # a bug: its requests fail, the worker keeps serving
            traceback.print_exc()
            scheduler.fail_all(exc)
        if self.slot_waits:  # a slot action waited for this sequence's reply to end
            from engine_ext.seq_slots import run_waiting

            run_waiting(self, scheduler)

    def handle(self, request: Request) -> None:
        request_id = request.request_id if isinstance(request, Generate | SlotAction) else None
        if isinstance(request, Submit):
            request_id = request.request.request_id
        try:
            entered(_PHASE_OF.get(type(request), "other"))
            if isinstance(request, LoadModel):
                self.load(request)
            elif isinstance(request, UnloadModel):
                self.unload()
                self.send(Unloaded())
            elif isinstance(request, Generate):
                self.generate(request)
            elif isinstance(request, Submit):
                self.submit(request)
            elif isinstance(request, SetQueueLimit):
                self.max_waiting = max(0, request.max_waiting)
                if self.scheduler is not None:
                    self.scheduler.max_waiting = self.max_waiting
            elif isinstance(request, SetSpeculative):
                self.set_speculative(request)
            elif isinstance(request, SetSteering):
                self.set_steering(request)
            elif isinstance(request, MakeControlVector):
                self.make_vector(request)
            elif isinstance(request, Inspect):
                from engine_ext.gguf import inspect_gguf

                self.send(Inspected(request.path, inspect_gguf(Path(request.path)).to_dict()))
            elif isinstance(request, SlotAction):
                self.slot(request)
            elif isinstance(request, Embed):
                from engine_ext.embedding import embed

                self.send(embed(self.model, request))
            elif isinstance(request, Shutdown):
                self.shutting_down = True
            elif isinstance(request, Cancel):
                if self.scheduler is not None and not self.scheduler.cancel(request.request_id):  # a slot action?
                    from engine_ext.seq_slots import drop_waiting

                    drop_waiting(self, "the client went away", request.request_id)
            elif isinstance(request, EndThinking):
                if self.scheduler is not None:  # else its generation finished
                    self.scheduler.end_thinking(request.request_id)
            else:
                self.send(Failed(None, "ProtocolError", f"unknown request {type(request).__name__}"))
        except Exception as exc:  # every error becomes an event; the worker keeps serving
            from engine_ext.params import EngineError

            if not isinstance(exc, EngineError):
                traceback.print_exc()  # to the log file
            self.send(Failed.of(request_id, exc))

    # ----- requests ---------------------------------------------------------------------------------

    def submit(self, request: Submit) -> None:
        from engine_ext.params import EngineError

        if self.session is None:
            raise EngineError("no model is loaded")
        if request.request.count_only:  # nothing to decode: answered now, between the sequences' steps
            self.send(self.session.count_prompt(request.request))
            return
        if self.scheduler is None:
            self._new_scheduler()
        self.scheduler.submit(request)

    def _new_scheduler(self) -> None:
        """A scheduler for the session's context; requests waiting in the one it replaces wait in it."""
        from engine_ext.parallel import ParallelScheduler

        old = self.scheduler
        scheduler = ParallelScheduler(self.session, self.send, fixed_steering=self.fresh_steering)
        if self.max_waiting is not None:
            scheduler.max_waiting = self.max_waiting
        if old is not None:
            scheduler.take_waiting(old)
            old.close()
        self.scheduler = scheduler

    def _drop_scheduler(self, why: str) -> None:
        from engine_ext.params import EngineError

        if self.scheduler is not None:
            if self.scheduler.active and self.scheduler.disk is not None:  # the model goes: the sequences saved
                self.scheduler.disk.save_all(self.scheduler.slots)
            self.scheduler.fail_all(EngineError(why))
            if self.slot_waits:
                from engine_ext.seq_slots import drop_waiting

                drop_waiting(self, why)
            self.scheduler.close()
            self.scheduler = None

    def load(self, request: LoadModel) -> None:
        from engine_ext.bindings import C
        from engine_ext.chat_prompt import template_thinking_controls
        from engine_ext.cpu import capped_threads, default_threads
        from engine_ext.generate import Session
        from engine_ext.gguf import refuse_draft_as_model
        from engine_ext.model import Context, Model
        from engine_ext.tool_turn import tool_format

        self.unload()
        path = Path(request.path)
        if not path.is_file():
            from engine_ext.params import ModelLoadError

            raise ModelLoadError(f"model file not found: {path}")
        request.context.validate()
        refuse_draft_as_model(path)  # a message, not an abort; Model refuses what else would abort llama.cpp
        if request.model.rpc_servers:
            from engine_ext.rpc import add_rpc_servers

            add_rpc_servers(request.model.rpc_servers)
        t0 = time.perf_counter()
        last = [0.0]

        def progress(fraction: float) -> None:
            now = time.perf_counter()
            if now - last[0] >= LOAD_PROGRESS_INTERVAL_S or fraction >= 1.0:
                last[0] = now
                self.send(LoadProgress(fraction))

        from engine_ext.placement import resolve_gpu_layers

        model_params, placement = resolve_gpu_layers(path, request.model, request.context)
        if self.no_repack:
            from dataclasses import replace

            model_params = replace(model_params, use_extra_bufts=False)
        model = Model(path, model_params, progress)
        _inject_fault("load", self.extra_bufts if model_params.use_extra_bufts else ())
        try:
            ctx = Context(model, request.context)
        except Exception:
            model.close()
            raise
        self.model, self.ctx = model, ctx
        self.session = Session(model, ctx)
        if request.model.mmproj:
            from engine_ext.vision import Vision

            try:
                self.session.vision = Vision(
                    Path(request.model.mmproj),
                    model,
                    n_threads=ctx.n_threads,
                    use_gpu=model_params.n_gpu_layers != 0 and bool(C.llama_supports_gpu_offload()),
                )
            except Exception:
                self.unload()
                raise
        self.session.governor = thread_governor(request.context.n_threads)
        try:
            self.disk_parts = _disk_parts(request)
            self.session.disk = _disk_cache(request, self.disk_parts)
        except OSError as error:  # the model file read by llama.cpp but not here: states are not saved
            print(f"--- prompt cache off: {error}", flush=True)
            self.disk_parts = {"unreadable": time.time()}  # a key no saved state has
        from engine_ext.speculative.factory import target_backends

        self.device_backends = target_backends(model)
        self.fresh_steering = bool(self.device_backends) and steering_replaces_context(model)
        system = C.llama_print_system_info().decode("utf-8", errors="replace")
        backend = "CPU"
        if request.model.rpc_servers:
            backend = "RPC"
        elif C.llama_supports_gpu_offload():
            for name in ("CUDA", "Metal", "Vulkan", "ROCm", "SYCL"):
                if name.upper() in system.upper():
                    backend = name
                    break
            else:  # Vulkan lists no features in the system info: the devices the layers went to say it
                backend = next(iter(self.device_backends), backend)
        info = ModelInfo(
            path=str(path),
            architecture=model.architecture,
            description=model.description,
            n_params=model.n_params,
            size_bytes=model.size_bytes,
            n_ctx=ctx.n_ctx,
            n_ctx_train=model.n_ctx_train,
            n_embd=model.n_embd,
            n_layer=model.n_layer,
            n_layer_nextn=model.n_layer_nextn,
            n_vocab=model.n_vocab,
            is_recurrent=model.is_recurrent,
            is_hybrid=model.is_hybrid,
            has_chat_template=model.chat_template is not None,
            n_threads=capped_threads(request.context.n_threads) if request.context.n_threads else default_threads(),
            backend=backend,
            load_ms=(time.perf_counter() - t0) * 1000.0,
            n_gpu_layers=model_params.n_gpu_layers,
            placement=placement,
            thinking_controls=template_thinking_controls(model.chat_template),
            mmproj=request.model.mmproj or "",
            tool_format=tool_format(model.chat_template),
        )
        self.send(Loaded(info))

    def set_speculative(self, request: SetSpeculative) -> None:
        from engine_ext.params import EngineError
        from engine_ext.spec_catalog import needs_fresh_context
        from engine_ext.speculative.factory import build_driver

        if self.session is None:
            raise EngineError("load a model before turning on speculative decoding")
        before = self.spec_params.types if self.spec_params is not None else ()
        if self.session.spec is not None:
            self.session.spec.close()  # a layer-input drafter turns the target's layer inputs off
            self.session.spec = None
        self.spec_params = None
        types = request.params.types if request.params.enabled else ()
        if self.device_backends and needs_fresh_context(types):
            self._fresh_context("before the layer inputs go on")
        elif self.device_backends and needs_fresh_context(before):
            self._fresh_context("after the layer inputs went off")
        if not request.params.enabled:
            self.send(SpeculativeSet(()))
            return
        driver = build_driver(request.params, self.model, self.ctx)
        self.session.spec, self.spec_params = driver, request.params
        # Model drafters must see every row the target holds: evaluate the next prompt in full.
        self.session.reset_cache()
        self.send(SpeculativeSet(driver.names))

    def _fresh_context(self, why: str, steering: tuple[SteeringEntry, ...] | None = None) -> None:
        """Replace the target context by a new one that has never decoded, with `steering` applied (None: the
        steering applied now) and the drafters built again on it.

        Issue 24: whatever makes llama.cpp re-reserve its compute graph (llama_set_adapter_cvec,
        llama_set_embeddings_layer_inp: `sched_need_reserve`) after the context's first decode crashed the engine
        on a Vulkan device (lavapipe: heap corruption or SIGSEGV, 4 of 4 runs turning layer inputs on, 3 of 3
        turning them off, 7 of 9 applying a control vector); before the first decode it did not (0 of 4, 0 of 8).
        The old context is closed first, so device memory holds one KV cache at a time; the next prompt is evaluated
        in full."""
        from engine_ext.model import Context
        from engine_ext.speculative.factory import build_driver

        assert self.session is not None and self.ctx is not None
        spec = self.session.spec
        if spec is not None:  # its drafters hold the old context
            spec.close()
            self.session.spec = None
        params = self.ctx.params
        self.ctx.close()
        try:
            self.ctx = Context(self.model, params)
        except Exception:
            self.unload()
            raise
        self.session.ctx = self.ctx
        if self.session.governor is not None:  # the new context starts at the default count
            from engine_ext.model import set_threads

            set_threads(self.session.governor.current)
        self.session.reset_cache()
        if self.scheduler is not None:
            self._new_scheduler()
        print(f"--- {FRESH_CONTEXT_LOG} {why} (the target is on {', '.join(self.device_backends)})", flush=True)
        try:
            if self.mixer is not None:
                self.mixer.ctx = self.ctx
                entries = steering if steering is not None else self.mixer.active.entries if self.mixer.active else ()
                self.mixer.active = None
                if entries:
                    self.mixer.apply(entries)
        finally:  # speculation stays on when llama.cpp refuses the vector
            if spec is not None and self.spec_params is not None:
                self.session.spec = build_driver(self.spec_params, self.model, self.ctx)

    def set_steering(self, request: SetSteering) -> None:
        from engine_ext.params import EngineError
        from engine_ext.steering.mixer import SteeringMixer, steered_layers

        if self.session is None:
            raise EngineError("load a model before steering it")
        if self.mixer is None:
            self.mixer = SteeringMixer(self.model, self.ctx)
        layers = tuple(steered_layers(self.model))
        notices: tuple[str, ...] = ()
        if request.entries and not layers:
            notices = (f"llama.cpp's {self.model.architecture} graph ignores control vectors",)
        self.disk_parts["steering"] = [repr(entry) for entry in request.entries]
        if self.session.disk is not None:  # states saved under another mix are not restored under this one
            self.session.disk.set_part("steering", self.disk_parts["steering"])
        if not self.fresh_steering:
            active = self.mixer.apply(request.entries)
            if request.reset_cache:  # asked for when the cache may hold rows read under another mix
                self.session.reset_cache()
        elif self.mixer.active is not None and tuple(request.entries) == self.mixer.active.entries:
            active = self.mixer.active  # applied already: the context stays
        elif request.entries or self.mixer.active is not None:
            self.mixer.compose(request.entries)  # a bad vector fails here, before the context is replaced
            self._fresh_context("for the new steering", request.entries)
            active = self.mixer.active
        else:
            active = None  # nothing applied, nothing to clear: llama.cpp is not touched
        if active is None:
            self.send(SteeringSet(False, 0, 0, (), layers, notices))
        else:
            self.send(SteeringSet(True, active.layer_start, active.layer_end, active.layer_norms, layers, notices))

    def slot(self, request: SlotAction) -> None:
        """llama-server's slot save / restore / erase (engine_ext.seq_slots): the single sequence's, or (with a request
        id) a parallel sequence's, after the reply it is answering."""
        from engine_ext.seq_slots import single_slot, take

        if request.request_id is not None:
            take(self, request)
        else:
            single_slot(self, request)

    def make_vector(self, request: MakeControlVector) -> None:
        from engine_ext.params import EngineError
        from engine_ext.steering.cvec_file import write_control_vector
        from engine_ext.steering.extract import PromptSet, make_control_vector
        from engine_ext.steering.progress import PhaseProgress

        if self.model is None:
            raise EngineError("load a model before making a control vector for it")
        if request.method not in ("pca", "mean"):
            raise EngineError(f"unknown method {request.method!r}: use pca or mean")
        prompt_set = PromptSet.load(Path(request.prompt_set_path))
        t0 = time.perf_counter()
        progress = PhaseProgress(self.send, pairs=len(prompt_set.pairs), layers=max(0, self.model.n_layer - 1))
        vector = make_control_vector(
            self.model,
            prompt_set,
            method="pca" if request.method == "pca" else "mean",
            n_threads=self.ctx.params.n_threads if self.ctx is not None else 0,
            progress=progress,
        )
        progress("writing", 0, 1)
        path = write_control_vector(vector, Path(request.output_path))
        progress("writing", 1, 1)
        self.send(VectorMade(str(path), len(vector.directions), len(prompt_set.pairs), time.perf_counter() - t0))

    def unload(self) -> None:
        self._drop_scheduler("the model was unloaded before this request ran")
        self.mixer = None
        self.spec_params = None
        self.device_backends = ()
        self.fresh_steering = False
        if self.session is not None and self.session.spec is not None:
            self.session.spec.close()
        if self.session is not None and self.session.vision is not None:
            self.session.vision.close()
        if self.session is not None and self.session.disk is not None:
            try:  # the save in flight finishes, then what it left out is saved (the model's context is still open)
                self.session.disk.wait()
                self.session.save_to_disk(final=True)
            except Exception:  # a bug or a full disk: the model goes all the same, the log says why
                traceback.print_exc()
            self.session.disk.close()
        self.session = None
        if self.ctx is not None:
            self.ctx.close()
            self.ctx = None
        if self.model is not None:
            self.model.close()
            self.model = None

    def generate(self, request: Generate) -> None:
        if self.session is None:
            from engine_ext.params import EngineError

            raise EngineError("no model is loaded")
        if request.count_only:
            self.send(self.session.count_prompt(request))
            return
        cancelled = [False]
        conn = self.conn
        governor = self.session.governor
        if governor is not None:
            governor.tick()  # others' use while the engine waited (if SAMPLE_S passed): the prompt's threads follow it

        def poll_cancel() -> bool:
            # Between decode steps: the thread count follows the machine's load (at most every SAMPLE_S) ...
            if governor is not None and governor.tick() and governor.last_load is not None:
                load = governor.last_load
                self.send(ThreadsChanged(request.request_id, governor.current, load.others, load.cpus))
            # ... and the pipe is drained: a Cancel stops this generation, the rest waits.
            while conn.poll(0):
                try:
                    incoming = conn.recv()
                except (EOFError, OSError):
                    self.shutting_down = True
                    return True
                request_read()
                if isinstance(incoming, Cancel):
                    if incoming.request_id == request.request_id:
                        cancelled[0] = True
                    elif self.scheduler is not None:
                        self.scheduler.cancel(incoming.request_id)
                elif isinstance(incoming, EndThinking):
                    if incoming.request_id == request.request_id:
                        self.session.end_thinking()  # forced from the next token on
                    elif self.scheduler is not None:  # a parallel request waiting for this one
                        self.scheduler.end_thinking(incoming.request_id)
                elif isinstance(incoming, Submit | SetQueueLimit):
                    self.handle(incoming)  # queued (or refused) now; parallel requests run after this one
                elif isinstance(incoming, Shutdown):
                    self.shutting_down = True
                    cancelled[0] = True
                elif isinstance(incoming, SetSteering) and not self.fresh_steering:
                    self.handle(incoming)  # a slider move acts on the very next token
                else:  # on lavapipe a steering change replaces the context (_fresh_context): after this generation
                    self.backlog.append(incoming)
            return cancelled[0]

        with phase("decode"):  # where a repacked type's kernels first run after a load
            _inject_fault("decode", self.extra_bufts if self.model.params.use_extra_bufts else ())
        finished = self.session.generate(request, self.send, poll_cancel)
        self.send(finished)
        try:  # after the reply is sent: llama.cpp copies the state out, a thread writes it
            self.session.save_to_disk()
        except Exception:  # a bug or a full disk: the reply stands, the log says why
            traceback.print_exc()


def _disk_parts(request: LoadModel) -> dict[str, object]:
    """What decides a loaded model's saved states (engine_ext.disk_cache's key): the model file, the engine build, the
    KV cache's types and layout, the steering mix (none yet)."""
    from engine_ext.disk_cache import model_identity
    from engine_ext.recovery import machine_key

    context = request.context
    return {
        "model": model_identity(Path(request.path)),
        "build": machine_key(),
        "kv": [context.type_k, context.type_v, context.flash_attn, context.n_seq_max, context.kv_unified],
        "n_rs_seq": context.n_rs_seq,
        "steering": [],
    }


def _disk_cache(request: LoadModel, parts: dict[str, object]) -> Any:
    """The prompt cache on disk for a loaded model (engine_ext.disk_cache) under the key `parts`; None when it is off
    or its folder cannot be made (said in the log: replies are evaluated as without it)."""
    params = request.disk_cache
    if not params.enabled:
        return None
    from engine_ext.disk_cache import DiskCache

    single = Path(params.file) if params.file else None
    folder = single.parent if single is not None else Path(params.folder)
    try:
        return DiskCache(
            folder,
            parts,
            budget=params.budget_mib << 20,
            single_file=single,
            read_only=params.read_only,
            model=Path(request.path).name,
        )
    except OSError as error:
        print(f"--- prompt cache off: {folder}: {error.strerror}", flush=True)
        return None


# The phase a request's handling starts in (engine_ext.engine_status; native calls mark their own within it).
_PHASE_OF: dict[type, str] = {LoadModel: "load", Generate: "reply", Submit: "reply", Inspect: "idle", Embed: "decode"}


def _llama_cpp_version() -> str:
    try:
        from importlib.metadata import version

        return version("llama-cpp-python")
    except Exception:
        return "unknown"


def worker_main(conn: Connection, log_path: str, skip_bufts: tuple[str, ...] = (), status: Any = None) -> None:
    """Entry point of the worker process (multiprocessing spawn target); `skip_bufts`: CPU extra buffer types to
    leave out (a crash in their repack path is remembered for this CPU and engine build: engine_ext.recovery);
    `status`: the shared words it marks its phase in (engine_ext.engine_status)."""
    _redirect_native_output(Path(log_path))
    if status is not None:
        attach(EngineStatus(status))
    print(f"--- llmtui engine worker pid {os.getpid()} started {time.strftime('%Y-%m-%d %H:%M:%S')}")
    if skip_bufts:
        from engine_ext.recovery import SKIP_ENV

        os.environ[SKIP_ENV] = ",".join(skip_bufts)  # read when ggml's CPU backend first lists them (patch 0004)
        print(f"--- CPU extra buffer types left out after a native crash: {', '.join(skip_bufts)}")
    try:
        Worker(conn, skip_bufts).serve()
    finally:
        conn.close()
