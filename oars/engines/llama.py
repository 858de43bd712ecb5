"""The embedded engine: llama.cpp in-process, with our own decode loop.

One worker thread owns the llama context and runs one sequence at a time, taking jobs from a FIFO
queue (fair: first come, first served). Each job streams `EngineChunk`s back to its event loop.
The KV cache keeps the previous sequence, so a request sharing a prefix with the last one only
evaluates the new suffix; that prefix is reported as `cached_tokens`.
"""

from __future__ import annotations

import asyncio
import codecs
import functools
import logging
import os
import queue
import re
import threading
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np

from oars.chat_template import ChatTemplate
from oars.engines.base import ModelInfo, Opened
from oars.engines.grammar import BigStackPool, Grammars, TokenMask, big_stack_thread
from oars.engines.sampler import log_softmax, penalize, sample, top_indices
from oars.errors import ContextLengthExceeded, EngineError, InvalidRequest
from oars.family import Constraint, Plan, family_of
from oars.generation import (
    EngineChunk,
    EngineRequest,
    FinishReason,
    TokenLogprob,
    TopLogprob,
    Usage,
)
from oars.parsing.holdback import split_holdback

log = logging.getLogger("oars.engine")

_PENALTY_WINDOW = 64
_TRIGGER_REACH = 64  # characters a call trigger can span


@dataclass(frozen=True)
class Prepared(Opened):
    """A request rendered, tokenized and known to fit the context, with its family's plan."""

    prompt: str = ""
    prompt_tokens: tuple[int, ...] = ()
    plan: Plan | None = None
    grammar: str | None = None  # the plan's constraint, compiled


@dataclass
class _Job:
    prepared: Prepared
    emit: Callable[[EngineChunk | BaseException], object]
    cancel: threading.Event = field(default_factory=threading.Event)


class LlamaEngine:
    """A GGUF model served by llama-cpp-python."""

    def __init__(
        self, path: Path, *, model_id: str | None = None, n_ctx: int = 16384,
        n_threads: int | None = None, tool_format: str | None = None, n_gpu_layers: int = 0,
    ) -> None:  # fmt: skip
        import llama_cpp  # imported here so that the fast test tier never needs it

        self._llama_cpp = llama_cpp
        self.llm = llama_cpp.Llama(
            model_path=str(path), n_ctx=n_ctx, n_batch=512, logits_all=False, verbose=False,
            n_threads=n_threads or max(1, os.cpu_count() or 1), n_gpu_layers=n_gpu_layers,
        )  # fmt: skip
        self._vocab = llama_cpp.llama_model_get_vocab(self.llm.model)
        self.n_vocab = self.llm.n_vocab()
        meta = self.llm.metadata
        source = meta.get("tokenizer.chat_template")
        if not source:
            raise EngineError(f"{path.name} has no tokenizer.chat_template; cannot chat with it")
        bos, eos = self._piece(self.llm.token_bos()), self._piece(self.llm.token_eos())
        self.template = ChatTemplate(source, bos_token=bos, eos_token=eos)
        self._add_bos = meta.get("tokenizer.ggml.add_bos_token", "false") == "true"
        self.family = family_of(source, tool_format)
        self.n_ctx = n_ctx
        self.info = ModelInfo(model_id or path.stem, context_length=n_ctx)
        self.grammars = Grammars(self._vocab, self.n_vocab)
        self._markers = self._single_tokens(self.family.markers)
        self._longest_token = max(len(self.token_bytes(t)) for t in range(self.n_vocab))
        self._message_tokens = self._tokens_per_message()
        self.busy = False
        self._opening_bans: dict[tuple[str, ...], np.ndarray] = {}
        self._jobs: queue.Queue[_Job] = queue.Queue()
        self._prepare_pool = BigStackPool(max_workers=2, thread_name_prefix="oars-prepare")
        self._worker = big_stack_thread(self._serve, "oars-engine")

    def _single_tokens(self, texts: frozenset[str]) -> frozenset[int]:
        ids = (self.llm.tokenize(t.encode(), add_bos=False, special=True) for t in texts)
        return frozenset(tokens[0] for tokens in ids if len(tokens) == 1)

    def _piece(self, token: int) -> str:
        return self.llm.detokenize([token], special=True).decode("utf-8", errors="replace")

    # ---- Engine protocol ----------------------------------------------------------------

    async def open(self, request: EngineRequest) -> Opened:
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._prepare_pool, self.prepare, request)

    async def count_tokens(self, request: EngineRequest) -> int:
        loop = asyncio.get_running_loop()
        prepared = await loop.run_in_executor(
            self._prepare_pool, functools.partial(self.prepare, request, compile=False)
        )
        return len(prepared.prompt_tokens)

    def prepare(self, request: EngineRequest, *, compile: bool = True) -> Prepared:
        self._surely_fits(request)
        plan = self.family.plan(request)
        messages = [m.to_template() for m in request.messages]
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
            costs = [count(empty("user", role, *extra)) - count(empty("user", *extra))
                     for role in ("user", "assistant", "system", "tool")
                     for extra in ((), (role,))]  # fmt: skip
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
        loop = asyncio.get_running_loop()
        chunks: asyncio.Queue[EngineChunk | BaseException] = asyncio.Queue()
        job = _Job(prepared, lambda item: loop.call_soon_threadsafe(chunks.put_nowait, item))
        self._jobs.put(job)
        try:
            while True:
                item = await chunks.get()
                if isinstance(item, BaseException):
                    raise item
                yield item
                if item.finish is not None:
                    return
        finally:
            job.cancel.set()  # a client that went away stops its generation at the next token

    # ---- the worker ---------------------------------------------------------------------

    def _serve(self) -> None:
        while True:
            job = self._jobs.get()
            if job.cancel.is_set():
                continue
            self.busy = True
            try:
                _Decode(self, job).run()
            except Exception as exc:  # the worker must survive any one job
                log.exception("decode failed")
                job.emit(EngineError(f"generation failed: {exc}"))
            finally:
                self.busy = False

    def reuse_prefix(self, tokens: tuple[int, ...]) -> int:
        """Keep the KV cache for the longest common prefix; return its length."""
        cached = self.llm._input_ids[: self.llm.n_tokens]
        limit = max(0, min(len(cached), len(tokens) - 1))  # the last prompt token is always new
        common = 0
        while common < limit and cached[common] == tokens[common]:
            common += 1
        self.llm.n_tokens = common  # eval() drops the KV cache past n_tokens
        return common

    def banned_openings(self, prefixes: tuple[str, ...]) -> np.ndarray:
        """Ids of tokens that are whitespace or start (after whitespace) with one of `prefixes`."""
        if prefixes not in self._opening_bans:
            ids = [
                t for t in range(self.llm.n_vocab())
                if not self.is_end(t)
                and (not (text := self.token_bytes(t).decode("utf-8", "replace").lstrip())
                     or text.startswith(prefixes))
            ]  # fmt: skip
            self._opening_bans[prefixes] = np.asarray(ids, dtype=np.intp)
        return self._opening_bans[prefixes]

    def is_end(self, token: int) -> bool:
        return bool(self._llama_cpp.llama_vocab_is_eog(self._vocab, token))

    def marker_text(self, token: int) -> str:
        """An end-of-generation token's text if the family's parser reads it (harmony ends a
        call with `<|call|>`, which gpt-oss GGUFs make an end token), else nothing."""
        return self._piece(token) if token in self._markers else ""

    def visible_bytes(self, token: int) -> bytes:
        """What a token adds to the output: a control token adds nothing, unless the family's
        parser reads it (harmony's channel markers, reasoning and call tags)."""
        control = self._llama_cpp.llama_vocab_is_control(self._vocab, token)
        return b"" if control and token not in self._markers else self.token_bytes(token)

    def token_bytes(self, token: int) -> bytes:
        return bytes(self.llm.detokenize([token], special=True))

    def logits(self) -> np.ndarray:
        ptr = self.llm._ctx.get_logits_ith(-1)
        return np.ctypeslib.as_array(ptr, shape=(self.n_vocab,)).copy()


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


class _Decode:
    """One sequence's decode loop, run on the worker thread."""

    def __init__(self, engine: LlamaEngine, job: _Job) -> None:
        self.engine, self.job = engine, job
        request = job.prepared.request
        self.params = request.sampling
        self.top_logprobs = request.top_logprobs
        plan = job.prepared.plan
        self.opening_ban = plan.opening_ban if plan is not None else ()
        self.rng = np.random.default_rng(self.params.seed)
        self.decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self.held = ""  # text held back because it may start a stop sequence
        self.stopped_by_sequence = False
        self.produced = 0
        self.text = ""  # the output so far, for lazy constraints' triggers
        grammar = job.prepared.grammar
        constraint = plan.constraint if plan is not None else None
        lazy = grammar is not None and constraint is not None and bool(constraint.triggers)
        self.lazy = _Lazy(engine, job.prepared) if lazy else None
        eager = grammar is not None and not lazy
        self.mask: TokenMask | None = engine.grammars.mask(grammar) if eager and grammar else None

    def run(self) -> None:
        engine, prompt = self.engine, self.job.prepared.prompt_tokens
        # A reused prefix and a fresh prefill differ in float rounding, and sampling amplifies
        # that: a seeded run evaluates its whole prompt so that the same seed gives the same text.
        cached = engine.reuse_prefix(prompt if self.params.seed is None else ())
        engine.llm.eval(prompt[cached:])
        room = engine.n_ctx - len(prompt)
        budget = min(room, self.params.max_output_tokens or room)
        reason, end_marker = FinishReason.LENGTH, ""
        history = list(prompt[-_PENALTY_WINDOW:])
        while self.produced < budget and not self.job.cancel.is_set():
            logits = engine.logits()
            lps = log_softmax(logits) if self.top_logprobs is not None else None
            penalize(logits, history[-_PENALTY_WINDOW:], self.params.repetition_penalty)
            if self.mask is not None:
                self.mask.apply(logits)
            if self.produced == 0 and self.opening_ban:
                logits[engine.banned_openings(self.opening_ban)] = -np.inf
            token = sample(logits, self.params, self.rng)
            self.produced += 1
            history.append(token)
            if engine.is_end(token):
                reason, end_marker = FinishReason.STOP, engine.marker_text(token)
                break
            if self.mask is not None:
                self.mask.consume([token])
            if self._emit_token(token, lps) or self._grammar_finished():
                reason = FinishReason.STOP
                break
            engine.llm.eval([token])
        if self.job.cancel.is_set():
            return
        usage = Usage(input_tokens=len(prompt), cached_tokens=cached, output_tokens=self.produced)
        # Text held back as a possible stop sequence is output unless a stop sequence matched.
        tail = "" if self.stopped_by_sequence else self.held + self.decoder.decode(b"", final=True)
        self.job.emit(EngineChunk(tail + end_marker, 0, finish=reason, usage=usage))

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
            self.job.emit(EngineChunk(self.held + text, 1, logprobs))
            self.held = ""
            return False
        buffer = self.held + text
        cut = min((p for p in (buffer.find(s) for s in stops) if p >= 0), default=-1)
        if cut >= 0:
            self.job.emit(EngineChunk(buffer[:cut], 1, logprobs))
            self.stopped_by_sequence = True
            return True
        safe, self.held = split_holdback(buffer, stops)
        self.job.emit(EngineChunk(safe, 1, logprobs))
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
