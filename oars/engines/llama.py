"""The embedded engine: llama.cpp in-process, with our own sampling and continuous batching.

A `Batcher` thread owns a llama.cpp context of `parallel` sequences and decodes every running
request in one batch per step (`oars/engines/batching.py`); each request's `_Sequence` samples
its next token from its own logits, with its own stops, logprobs and grammar. Each job streams
`EngineChunk`s back to its event loop. Prompts sharing a prefix with what a slot holds evaluate
only the rest, and that prefix is reported as `cached_tokens`.
"""

from __future__ import annotations

import asyncio
import atexit
import codecs
import ctypes
import functools
import hashlib
import logging
import os
import re
import threading
import weakref
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, ClassVar

import numpy as np

from oars.chat_template import ChatTemplate
from oars.engines.base import ModelInfo, Opened
from oars.engines.batching import Batcher, Capacity, Feed, Place
from oars.engines.grammar import BigStackPool, Grammars, TokenMask, big_stack_thread
from oars.engines.handover import Handover, Inbox
from oars.engines.prefix_store import PrefixStore
from oars.engines.sampler import log_softmax, penalize, sample, top_indices
from oars.errors import ContextLengthExceeded, EngineError, InvalidRequest
from oars.families import Constraint, Plan, family_of
from oars.families.detect import parameters
from oars.families.hermes import BARE_CALL_OPENINGS
from oars.generation import (
    EngineChunk,
    EngineRequest,
    FinishReason,
    TokenLogprob,
    TopLogprob,
    Usage,
)
from oars.parsing.holdback import split_holdback
from oars.settings import EngineSettings

log = logging.getLogger("oars.engine")

_PENALTY_WINDOW = 64
_TRIGGER_REACH = 64  # characters a call trigger can span
N_BATCH = 512  # tokens per forward pass


class LlamaLog:
    """llama.cpp's own log, as lines of the `oars.llama` logger (so `--log-format json` holds
    for them too): its errors as errors, the rest at debug level, seen with `--log-level
    debug` (its warnings are mostly about metadata a model of the default family is known to
    have). llama.cpp writes a line in pieces; they are joined up to the newline."""

    # ggml's log levels: 1 debug, 2 info, 3 warn, 4 error, 5 the line goes on
    _LEVELS = {4: logging.ERROR}
    _installed: ClassVar[LlamaLog | None] = None

    @classmethod
    def install(cls, llama_cpp: Any) -> None:
        """Route llama.cpp's log here from now on (once a process)."""
        if cls._installed is None:
            cls._installed = cls(llama_cpp)

    def __init__(self, llama_cpp: Any) -> None:
        self._log = logging.getLogger("oars.llama")
        self._pending: list[bytes] = []
        self._level = logging.DEBUG
        self._lock = threading.Lock()
        # kept on the instance while llama.cpp may call it; at exit, before this module's
        # objects go, llama.cpp is given back llama-cpp-python's own
        self.callback = llama_cpp.llama_log_callback(self._line)
        llama_cpp.llama_log_set(self.callback, ctypes.c_void_p(0))
        atexit.register(self._restore, llama_cpp)

    @staticmethod
    def _restore(llama_cpp: Any) -> None:
        own = getattr(getattr(llama_cpp, "_logger", None), "llama_log_callback", None)
        if own is not None:
            llama_cpp.llama_log_set(own, ctypes.c_void_p(0))

    def _line(self, level: int, text: bytes | None, _user_data: ctypes.c_void_p) -> None:
        done: list[tuple[int, bytes]] = []
        with self._lock:
            if level != 5:  # a new line: what is pending of the last one goes as it is
                if self._pending:
                    done.append((self._level, b"".join(self._pending)))
                    self._pending = []
                self._level = self._LEVELS.get(level, logging.DEBUG)
            self._pending.append(text or b"")
            if self._pending[-1].endswith(b"\n"):
                done.append((self._level, b"".join(self._pending)))
                self._pending = []
        for at, line in done:
            if message := line.decode("utf-8", errors="replace").rstrip():
                self._log.log(at, "%s", message)


def default_parallel(n_ctx: int) -> int:
    """Sequences decoded at once: 4, fewer when each needs a long context (64k tokens of KV
    memory in all, 0.75 GiB for the default model)."""
    return max(1, min(4, 65536 // max(1, n_ctx)))


@dataclass(frozen=True)
class Prepared(Opened):
    """A request rendered, tokenized and known to fit the context, with its family's plan."""

    prompt: str = ""
    prompt_tokens: tuple[int, ...] = ()
    plan: Plan | None = None
    grammar: str | None = None  # the plan's constraint, compiled
    place: Place | None = None  # its place among the accepted requests


class LlamaEngine:
    """A GGUF model served by llama-cpp-python."""

    def __init__(
        self,
        path: Path,
        settings: EngineSettings,
        *,
        gpu_layers: int,
        prefix_folder: Path | None,
    ) -> None:
        """`gpu_layers`: as resolved for this build (`devices.gpu_layers`); `prefix_folder`:
        where long prompts are kept (None: nowhere)."""
        model_id, n_ctx, n_threads = settings.model_id, settings.context, settings.threads
        tool_format, guards = settings.tool_format, settings.small_model_guards
        n_gpu_layers, flash_attn, parallel = gpu_layers, settings.flash_attn, settings.parallel
        queue_depth, prefill_chunk = settings.queue_depth, settings.prefill_chunk
        prefix_bytes = settings.prefix_cache_bytes
        prefix_min_tokens = settings.prefix_cache_min_tokens
        import llama_cpp  # imported here so that the fast test tier never needs it

        LlamaLog.install(llama_cpp)
        self._llama_cpp = llama_cpp
        threads = n_threads or max(1, os.cpu_count() or 1)
        # This object gives the vocabulary, tokenizer and metadata; the weights are loaded below.
        self.llm = llama_cpp.Llama(model_path=str(path), vocab_only=True, verbose=False)
        params = llama_cpp.llama_model_default_params()
        params.n_gpu_layers = n_gpu_layers
        # Not llama.cpp's repacked CPU weights (its "extra" buffer types): with them the rows
        # of a batch go through other kernels than a lone row (their activations quantized by
        # another routine), so a sequence's logits, and a greedy request's text, would depend
        # on what runs beside it (up to 0.17 apart), and on this model they are no faster
        # (only some of its tensors can be repacked). `bench.kernels` measures both.
        params.use_extra_bufts = False
        self._model = llama_cpp.llama_model_load_from_file(str(path).encode(), params)
        if not self._model:
            raise EngineError(f"could not load {path.name}")
        self._vocab = llama_cpp.llama_model_get_vocab(self.llm.model)
        self.n_vocab = self.llm.n_vocab()
        meta = self.llm.metadata
        source = meta.get("tokenizer.chat_template")
        if not source:
            raise EngineError(f"{path.name} has no tokenizer.chat_template; cannot chat with it")
        bos, eos = self._piece(self.llm.token_bos()), self._piece(self.llm.token_eos())
        self.template = ChatTemplate(source, bos_token=bos, eos_token=eos)
        self._add_bos = meta.get("tokenizer.ggml.add_bos_token", "false") == "true"
        size = parameters(meta.get("general.size_label", "")) or float(
            llama_cpp.llama_model_n_params(self._model)
        )
        self.family = family_of(source, tool_format, guards=guards, size=size)
        self.n_ctx = n_ctx  # per sequence
        self.parallel = parallel or default_parallel(n_ctx)
        self.queue_depth = queue_depth
        self.info = ModelInfo(model_id or path.stem, context_length=n_ctx)
        self.grammars = Grammars(self._vocab, self.n_vocab)
        self._markers = self._single_tokens(self.family.markers)
        # What each token spells and is, asked of llama.cpp once (about a second of calls):
        # every sampled token needs them, and the vocabulary scans read them all.
        vocab, tokens = self._vocab, range(self.n_vocab)
        self._pieces = [bytes(self.llm.detokenize([t], special=True)) for t in tokens]
        self._ends = frozenset(t for t in tokens if llama_cpp.llama_vocab_is_eog(vocab, t))
        self._hidden = frozenset(
            t
            for t in tokens
            if llama_cpp.llama_vocab_is_control(vocab, t) and t not in self._markers
        )
        self._longest_token = max(map(len, self._pieces))
        self._message_tokens = self._tokens_per_message()
        self._opening_bans: dict[tuple[str, ...], np.ndarray] = {}
        self._bans_lock = threading.Lock()
        self.capacity = Capacity(self.parallel, queue_depth)
        self._prepare_pool = BigStackPool(max_workers=2, thread_name_prefix="oars-prepare")
        n_batch = max(N_BATCH, self.parallel, prefill_chunk)
        # Flash attention, unless asked, is off on the CPU: with it a row's logits depend on
        # its pass (llama.cpp takes another kernel for a sequence's lone token row over 512
        # cells or more, and for 64 rows or more, than for the rest), so a request's text would
        # depend on what runs beside it, and a short turn after a long context is slower.
        # `bench.attention` on 2 cores with AVX-512, the default model: after 2,000 tokens,
        # 13 new tokens 140 ms without it against 177 ms with it, one token 27.7 against 26.3,
        # the prefill 11.5 s against 10.0 s; a sequence's logits in a pass of 4 differ from
        # its lone pass by up to 0.32 with it, 0.0 without. On an earlier, slower box, after
        # 8,000 tokens: 13 tokens 285 against 588 ms. Without it a pass holds its attention
        # scores (up to 0.5 GiB at 16k tokens). On a GPU llama.cpp decides.
        if flash_attn is None:
            flash_attn = None if n_gpu_layers else False
        context = LlamaContext(
            llama_cpp,
            self._model,
            n_seq=self.parallel,
            n_ctx_seq=n_ctx,
            n_batch=n_batch,
            n_threads=threads,
            n_vocab=self.n_vocab,
            flash_attn=flash_attn,
        )
        store = None
        if prefix_folder is not None and prefix_bytes > 0:
            key = self._fingerprint(path, n_ctx, flash_attn)
            store = PrefixStore(
                prefix_folder, key, max_bytes=prefix_bytes, min_tokens=prefix_min_tokens
            )
        self._handover = Handover()
        self.batcher = Batcher(
            context,
            self.parallel,
            prefill_chunk=prefill_chunk,
            prefix_store=store,
            overlap=BigStackPool(max_workers=2, thread_name_prefix="oars-mask"),
            flush=self._handover.flush,
        )
        big_stack_thread(self.batcher.run, "oars-engine")
        # First-use costs (the grammar tokenizer, about a second; a vocabulary scan) are paid
        # before the server takes requests. Paid beside the first one, they slowed its passes
        # fourfold on 2 cores (measured: 13 tokens after 8,000 in 1.3 s, 0.34 s after).
        big_stack_thread(self._warm, "oars-warm").join()

    def _fingerprint(self, path: Path, n_ctx: int, flash_attn: bool | None) -> str:
        """A saved sequence state loads only into a context like the one that saved it (the
        layout of its memory follows the attention kernel)."""
        stat = path.stat()
        key = f"{path.name}|{stat.st_size}|{self._llama_cpp.__version__}|{n_ctx}|fa={flash_attn}"
        return hashlib.sha256(key.encode()).hexdigest()[:16]

    def _warm(self) -> None:
        _ = self.grammars.tokenizer
        self.banned_openings(BARE_CALL_OPENINGS)

    @property
    def busy(self) -> bool:
        return self.batcher.running > 0

    async def start(self) -> None:
        """Nothing to start: the engine's threads run from its construction."""

    async def aclose(self) -> None:
        """Nothing to close: the engine lives as long as the process."""

    def _single_tokens(self, texts: frozenset[str]) -> frozenset[int]:
        ids = (self.llm.tokenize(t.encode(), add_bos=False, special=True) for t in texts)
        return frozenset(tokens[0] for tokens in ids if len(tokens) == 1)

    def _piece(self, token: int) -> str:
        return self.llm.detokenize([token], special=True).decode("utf-8", errors="replace")

    # ---- Engine protocol ----------------------------------------------------------------

    async def open(self, request: EngineRequest) -> Opened:
        place = self.capacity.take()
        loop = asyncio.get_running_loop()
        try:
            prepared = await loop.run_in_executor(self._prepare_pool, self.prepare, request)
        except BaseException:
            place.release()
            raise
        prepared = replace(prepared, place=place)
        weakref.finalize(prepared, place.release)  # a request dropped before it generated
        return prepared

    async def count_tokens(self, request: EngineRequest) -> int:
        loop = asyncio.get_running_loop()
        prepared = await loop.run_in_executor(
            self._prepare_pool, functools.partial(self.prepare, request, compile=False)
        )
        return len(prepared.prompt_tokens)

    def prepare(self, request: EngineRequest, *, compile: bool = True) -> Prepared:
        self._surely_fits(request)
        plan = self.family.plan(request)
        messages = [m.to_template() for m in plan.messages]
        offered = plan.tools.offered if plan.tools.mode != "none" else ()
        tools = [t.to_template() for t in offered]
        prompt = self.template.render(messages, tools, **(plan.template_kwargs or {}))
        add_bos = self._add_bos and not prompt.startswith(
            self.template._tokens["bos_token"] or "\0"
        )
        tokens = tuple(self.llm.tokenize(prompt.encode(), add_bos=add_bos, special=True))
        limit = self.n_ctx
        if len(tokens) >= limit:
            raise ContextLengthExceeded(
                f"The input is {len(tokens)} tokens, which leaves no room in this model's "
                f"context window of {limit} tokens. Shorten the input."
            )
        store = self.batcher.prefix_store
        if store is not None and compile:  # its kept prefix on the way while this one waits
            store.prefetch(tokens)
        grammar = self._grammar(plan.constraint) if plan.constraint and compile else None
        in_reasoning = self.family.starts_in_reasoning(prompt)
        parser = self.family.parser(plan.tools, in_reasoning=in_reasoning)
        return Prepared(request, parser, prompt, tokens, plan, grammar)

    def _tokens_per_message(self) -> int:
        """The fewest tokens the template spends on one more (empty) message, of any role: its
        markers. 0 when the template may drop a message."""

        def count(messages: list[dict[str, str]]) -> int:
            prompt = self.template.render(messages, [])
            return len(self.llm.tokenize(prompt.encode(), add_bos=False, special=True))

        def empty(*roles: str) -> list[dict[str, str]]:
            return [{"role": role, "content": ""} for role in roles]

        try:  # one more message after a user's, and after one of its own role (templates
            # merge runs of tool outputs into one turn)
            costs = [
                count(empty("user", role, *extra)) - count(empty("user", *extra))
                for role in ("user", "assistant", "system", "tool")
                for extra in ((), (role,))
            ]
        except Exception:  # a template that refuses these shapes: assume nothing
            return 0
        # less one: a marker's last token may merge with the first characters of the content
        return max(0, min(costs) - 1)

    def _surely_fits(self, request: EngineRequest) -> None:
        """Refuse at once what cannot fit, before rendering and tokenizing it (which takes
        seconds for 15,000 messages, minutes for 50 MB of text): each message costs at least
        the template's markers, and no token spells more than `_longest_token` bytes."""
        count = len(request.messages)
        size = sum(len(m.content) for m in request.messages)  # characters: each ≥ 1 byte
        at_least = count * self._message_tokens + size // self._longest_token
        if at_least >= self.n_ctx:
            raise ContextLengthExceeded(
                f"The input is at least {at_least} tokens ({count} messages, {size} characters), "
                f"which leaves no room in this model's context window of {self.n_ctx} tokens. "
                "Shorten the input."
            )

    def _grammar(self, constraint: Constraint) -> str:
        try:
            return self.grammars.compile(constraint)
        except InvalidRequest:
            if constraint.fallback is None:
                raise
            log.warning("tool schemas not supported by the grammar compiler; using any object")
            return self.grammars.compile(replace(constraint, source=constraint.fallback))

    async def generate(self, prepared: Opened) -> AsyncIterator[EngineChunk]:
        assert isinstance(prepared, Prepared)
        inbox = Inbox()
        box, post = self._handover.mailbox(asyncio.get_running_loop()), self._handover.post
        work = _Sequence(self, prepared, lambda item: post(box, inbox.put, item))
        self.batcher.submit(work)
        try:
            while True:
                for item in await inbox.take():
                    if isinstance(item, BaseException):
                        raise item
                    yield item
                    if item.finish is not None:
                        return
        finally:
            work.cancel.set()  # a client that went away stops its generation at the next step
            if prepared.place is not None:
                prepared.place.release()

    def banned_openings(self, prefixes: tuple[str, ...]) -> np.ndarray:
        """Ids of tokens that are whitespace or start (after whitespace) with one of `prefixes`."""
        with self._bans_lock:  # one scan, even when two requests ask at once
            if prefixes not in self._opening_bans:
                self._opening_bans[prefixes] = self._scan_openings(prefixes)
            return self._opening_bans[prefixes]

    def _scan_openings(self, prefixes: tuple[str, ...]) -> np.ndarray:
        ids = [
            t
            for t in range(self.n_vocab)
            if not self.is_end(t)
            and (
                not (text := self.token_bytes(t).decode("utf-8", "replace").lstrip())
                or text.startswith(prefixes)
            )
        ]
        return np.asarray(ids, dtype=np.intp)

    def is_end(self, token: int) -> bool:
        return token in self._ends

    def marker_text(self, token: int) -> str:
        """An end-of-generation token's text if the family's parser reads it (harmony ends a
        call with `<|call|>`, which gpt-oss GGUFs make an end token), else nothing."""
        return self._piece(token) if token in self._markers else ""

    def visible_bytes(self, token: int) -> bytes:
        """What a token adds to the output: a control token adds nothing, unless the family's
        parser reads it (harmony's channel markers, reasoning and call tags)."""
        return b"" if token in self._hidden else self._pieces[token]

    def token_bytes(self, token: int) -> bytes:
        return self._pieces[token]


class _Lazy:
    """A constraint that starts when one of its triggers matches the output (see `Constraint`)."""

    def __init__(self, engine: LlamaEngine, prepared: Prepared) -> None:
        assert prepared.plan is not None and prepared.plan.constraint is not None
        constraint = prepared.plan.constraint
        self.engine, self.grammar = engine, prepared.grammar or ""
        self.triggers = [re.compile(t) for t in constraint.triggers]
        self._may_rearm = constraint.rearm
        self._scan_from = 0
        self._anchored = False

    def check(self, text: str) -> TokenMask | None:
        """A mask already fed the triggering text, if a trigger matches now."""
        for trigger in self.triggers:
            found = trigger.search(text, self._scan_from)
            if found is None:
                continue
            mask = self.engine.grammars.mask(self.grammar)
            tail = text[found.start(1) :].encode()
            try:
                mask.consume(self.engine.llm.tokenize(tail, add_bos=False, special=False))
            except RuntimeError:
                self._scan_from = len(text)  # not the start of a valid call after all
                return None
            self._anchored = trigger.pattern.startswith("^")
            return mask
        # Triggers are short: only the tail can still start one, so each check stays O(1) in
        # the output's length (the anchored trigger has had its chance by then).
        self._scan_from = max(self._scan_from, len(text) - _TRIGGER_REACH)
        return None

    def rearm(self, text_len: int = 0) -> bool:
        """After a completed grammar: keep generating (watching for triggers) or stop."""
        self._scan_from = text_len
        return self._may_rearm and not self._anchored


class _Sequence:
    """One request's decoding state: the batcher hands it logits, it picks and sends tokens."""

    def __init__(
        self,
        engine: LlamaEngine,
        prepared: Prepared,
        emit: Callable[[EngineChunk | BaseException], object],
    ) -> None:
        self.engine, self.prepared, self.emit = engine, prepared, emit
        self.cancel = threading.Event()
        request = prepared.request
        self.prompt = prepared.prompt_tokens
        self.params = request.sampling
        # A reused prefix and a fresh prefill differ in float rounding, and sampling amplifies
        # that: a seeded run evaluates its whole prompt so that the same seed gives the same text.
        self.reuse = self.params.seed is None
        self.top_logprobs = request.top_logprobs
        plan = prepared.plan
        self.opening_ban = plan.opening_ban if plan is not None else ()
        self.rng = np.random.default_rng(self.params.seed)
        self.decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self.held = ""  # text held back because it may start a stop sequence
        self.stopped_by_sequence = False
        self.produced = 0
        self.cached = 0
        self.budget = 0
        self.history: list[int] = []
        self.text = ""  # the output so far, for lazy constraints' triggers
        self.lazy: _Lazy | None = None
        self.mask: TokenMask | None = None

    @property
    def cancelled(self) -> bool:
        return self.cancel.is_set()

    def start(self, cached: int) -> None:
        """On the batcher's thread (grammars need its deep stack)."""
        self.cached = cached
        room = self.engine.n_ctx - len(self.prompt)
        self.budget = min(room, self.params.max_output_tokens or room)
        self.history = list(self.prompt[-_PENALTY_WINDOW:])
        grammar, plan = self.prepared.grammar, self.prepared.plan
        constraint = plan.constraint if plan is not None else None
        if grammar is not None and constraint is not None and constraint.triggers:
            self.lazy = _Lazy(self.engine, self.prepared)
        elif grammar is not None:
            self.mask = self.engine.grammars.mask(grammar)

    def before_step(self) -> Callable[[], object] | None:
        return self.mask.fill if self.mask is not None else None

    def fail(self, error: BaseException) -> None:
        self.emit(error)

    def step(self, logits: np.ndarray) -> int | None:
        engine = self.engine
        lps = log_softmax(logits) if self.top_logprobs is not None else None
        penalize(logits, self.history[-_PENALTY_WINDOW:], self.params.repetition_penalty)
        if self.mask is not None:
            self.mask.apply(logits)
        if self.produced == 0 and self.opening_ban:
            logits[engine.banned_openings(self.opening_ban)] = -np.inf
        token = sample(logits, self.params, self.rng)
        self.produced += 1
        self.history.append(token)
        if engine.is_end(token):
            self._finish(FinishReason.STOP, engine.marker_text(token))
            return None
        if self.mask is not None:
            self.mask.consume([token])
        if self._emit_token(token, lps) or self._grammar_finished():
            self._finish(FinishReason.STOP)
            return None
        if self.produced >= self.budget:
            self._finish(FinishReason.LENGTH)
            return None
        return token

    def _finish(self, reason: FinishReason, end_marker: str = "") -> None:
        usage = Usage(
            input_tokens=len(self.prompt), cached_tokens=self.cached, output_tokens=self.produced
        )
        # Text held back as a possible stop sequence is output unless a stop sequence matched.
        tail = "" if self.stopped_by_sequence else self.held + self.decoder.decode(b"", final=True)
        self.emit(EngineChunk(tail + end_marker, 0, finish=reason, usage=usage))

    def _grammar_finished(self) -> bool:
        """True when a completed grammar ends the output; arms or disarms lazy constraints."""
        if self.lazy is None:
            return self.mask is not None and self.mask.done
        if self.mask is None:
            self.mask = self.lazy.check(self.text)
            return False
        if not self.mask.done:
            return False
        self.mask = None
        return not self.lazy.rearm(len(self.text))

    def _emit_token(self, token: int, lps: np.ndarray | None) -> bool:
        """Decode one token and send its text; True when a stop sequence ended the output."""
        raw = self.engine.visible_bytes(token)
        text = self.decoder.decode(raw)
        self.text += text
        logprobs = self._logprobs(token, raw, text, lps)
        # Stop sequences end free text; inside a constrained call they would only break it.
        stops = self.params.stop if self.mask is None else ()
        if not stops:
            self.emit(EngineChunk(self.held + text, 1, logprobs))
            self.held = ""
            return False
        buffer = self.held + text
        cut = min((p for p in (buffer.find(s) for s in stops) if p >= 0), default=-1)
        if cut >= 0:
            self.emit(EngineChunk(buffer[:cut], 1, logprobs))
            self.stopped_by_sequence = True
            return True
        safe, self.held = split_holdback(buffer, stops)
        self.emit(EngineChunk(safe, 1, logprobs))
        return False

    def _logprobs(
        self, token: int, raw: bytes, text: str, lps: np.ndarray | None
    ) -> tuple[TokenLogprob, ...]:
        """The model's own distribution (before penalties and grammar masks)."""
        if lps is None or self.top_logprobs is None:
            return ()
        top = tuple(
            TopLogprob(self._show(b := self.engine.token_bytes(int(t))), tuple(b), float(lps[t]))
            for t in top_indices(lps, self.top_logprobs)
        )
        # `token` is the text this token added (a token ending mid-character adds none yet), so
        # the tokens of a delta always concatenate to its text; `bytes` are the token's own bytes.
        return (TokenLogprob(text, tuple(raw), float(lps[token]), top),)

    @staticmethod
    def _show(raw: bytes) -> str:
        return raw.decode("utf-8", errors="replace")


class LlamaContext:
    """A llama.cpp context of `n_seq` sequences of up to `n_ctx_seq` tokens each, driven
    through the batch API (one KV memory per sequence)."""

    def __init__(
        self,
        llama_cpp: Any,
        model: Any,
        *,
        n_seq: int,
        n_ctx_seq: int,
        n_batch: int,
        n_threads: int,
        n_vocab: int,
        flash_attn: bool | None = None,
    ) -> None:
        self._api, self.n_batch, self._n_vocab = llama_cpp, n_batch, n_vocab
        params = llama_cpp.llama_context_default_params()
        if flash_attn is not None:  # else llama.cpp chooses
            params.flash_attn_type = (
                llama_cpp.LLAMA_FLASH_ATTN_TYPE_ENABLED
                if flash_attn
                else llama_cpp.LLAMA_FLASH_ATTN_TYPE_DISABLED
            )
        params.n_ctx = n_seq * n_ctx_seq
        params.n_batch = params.n_ubatch = n_batch
        params.n_seq_max = n_seq
        params.n_threads = params.n_threads_batch = n_threads
        params.kv_unified = False  # each sequence its own memory of n_ctx_seq
        self._ctx = llama_cpp.llama_init_from_model(model, params)
        if not self._ctx:
            raise EngineError(f"could not make a context of {n_seq} × {n_ctx_seq} tokens")
        self._memory = llama_cpp.llama_get_memory(self._ctx)
        self._batch = llama_cpp.llama_batch_init(n_batch, 0, 1)
        self._rows: np.ndarray | None = None  # the logits of the last pass's outputs

    def decode(self, feeds: Sequence[Feed]) -> None:
        batch, i, outputs = self._batch, 0, 0
        for feed in feeds:
            for offset, token in enumerate(feed.tokens):
                batch.token[i], batch.pos[i] = token, feed.start + offset
                batch.n_seq_id[i], batch.seq_id[i][0], batch.logits[i] = 1, feed.seq, 0
                i += 1
            if feed.output:
                batch.logits[i - 1] = 1
                outputs += 1
        batch.n_tokens = i
        self._rows = None
        status = self._api.llama_decode(self._ctx, batch)
        if status != 0:
            raise EngineError(f"the model could not evaluate a batch (llama_decode: {status})")
        if outputs:  # llama.cpp keeps the outputs' logits in a row each, in batch order
            first = self._api.llama_get_logits(self._ctx)
            size = outputs * self._n_vocab
            rows = (ctypes.c_float * size).from_address(ctypes.addressof(first.contents))
            self._rows = np.frombuffer(memoryview(rows), dtype=np.float32).reshape(
                -1, self._n_vocab
            )

    def logits(self, index: int) -> np.ndarray:
        # llama.cpp's own buffer, not a copy: copying it was a tenth of a millisecond a token
        # (the rows are cold in this core's cache), and the next pass is what overwrites it.
        assert self._rows is not None
        row: np.ndarray = self._rows[index]
        return row

    def forget(self, seq: int, start: int) -> bool:
        return bool(self._api.llama_memory_seq_rm(self._memory, seq, start, -1))

    def save(self, seq: int) -> bytes:
        size = self._api.llama_state_seq_get_size(self._ctx, seq)
        buffer = (ctypes.c_uint8 * size)()
        written = self._api.llama_state_seq_get_data(self._ctx, buffer, size, seq)
        return bytes(memoryview(buffer)[:written])

    def load(self, seq: int, state: memoryview) -> bool:
        source = (ctypes.c_uint8 * len(state)).from_buffer(state)  # no copy of a mapped file
        try:
            return bool(self._api.llama_state_seq_set_data(self._ctx, source, len(state), seq))
        finally:
            del source  # the buffer is released for its owner to close
