"""The embedded engine: llama.cpp in-process, with our own sampling and continuous batching.

A `Batcher` thread owns a llama.cpp context of `parallel` sequences and decodes every running
request in one batch per step (`oars/engines/batching.py`); each request's `SequenceDecoder`
(`oars/engines/sequence.py`) samples its next token from its own logits, with its own stops,
logprobs and grammar. Each job streams `EngineChunk`s back to its event loop. Prompts sharing a
prefix with what a slot holds evaluate only the rest, and that prefix is reported as
`cached_tokens`. llama.cpp's context and log are `oars/engines/llama_context.py`.
"""

from __future__ import annotations

import asyncio
import functools
import hashlib
import logging
import os
import threading
import weakref
from collections.abc import AsyncIterator
from dataclasses import replace
from pathlib import Path

import numpy as np

from oars.chat_template import ChatTemplate
from oars.engines.base import ModelInfo, Opened
from oars.engines.batching import Batcher, Capacity
from oars.engines.grammar import BigStackPool, Grammars, big_stack_thread
from oars.engines.handover import Handover, Inbox
from oars.engines.llama_context import LlamaContext, LlamaLog
from oars.engines.prefix_store import PrefixStore
from oars.engines.sequence import Prepared, SequenceDecoder
from oars.engines.speculation import MAX_DRAFT, Indents, PassCost
from oars.errors import ContextLengthExceeded, EngineError, InvalidRequest
from oars.families import Constraint, family_of
from oars.families.detect import parameters
from oars.families.hermes import BARE_CALL_OPENINGS
from oars.generation import EngineChunk, EngineRequest
from oars.settings import EngineSettings

log = logging.getLogger("oars.engine")

N_BATCH = 512  # tokens per forward pass


def default_parallel(n_ctx: int) -> int:
    """Sequences decoded at once: 4, fewer when each needs a long context (64k tokens of KV
    memory in all, 0.75 GiB for the default model)."""
    return max(1, min(4, 65536 // max(1, n_ctx)))


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
        # (only some of its tensors can be repacked). `bench.lab.kernels` measures both.
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
        self.info = ModelInfo(
            model_id or path.stem,
            context_length=n_ctx,
            reasoning=self.family.reasons,
            reasoning_efforts=self.family.efforts,
        )
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
        # `bench.lab.attention` on 2 cores with AVX-512, the default model: after 2,000 tokens,
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
        self.speculation: PassCost | None = None  # set on the engine's thread, before it serves
        self.indents = Indents(self._pieces)  # for drafts of a copy indented otherwise
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
        # First-use costs (the grammar tokenizer, about a second; a vocabulary scan) are paid
        # before the server takes requests. Paid beside the first one, they slowed its passes
        # fourfold on 2 cores (measured: 13 tokens after 8,000 in 1.3 s, 0.34 s after). They
        # are paid before the pass cost is measured, too: beside it they made a pass of 2
        # rows cost 2.02-2.43 × one row over six starts, 1.83-2.15 after (3 rows: 2.91-3.56,
        # then 2.67-3.17), and drafts came out shorter than what pays.
        big_stack_thread(self._warm, "oars-warm").join()
        measured = threading.Event()
        run = functools.partial(self._run, context, settings.speculation, measured)
        big_stack_thread(run, "oars-engine")
        measured.wait()

    def _fingerprint(self, path: Path, n_ctx: int, flash_attn: bool | None) -> str:
        """A saved sequence state loads only into a context like the one that saved it (the
        layout of its memory follows the attention kernel)."""
        stat = path.stat()
        key = f"{path.name}|{stat.st_size}|{self._llama_cpp.__version__}|{n_ctx}|fa={flash_attn}"
        return hashlib.sha256(key.encode()).hexdigest()[:16]

    def _run(self, context: LlamaContext, mode: bool | None, measured: threading.Event) -> None:
        """The engine's thread: the pass-cost curve is measured on it, as every pass is run
        (llama.cpp's CPU threads are a team of the thread that decodes), then the batcher."""
        try:
            if mode is not False:
                self.speculation = self._pass_cost(context, mode)
        except Exception:
            log.exception("speculation: off (a pass's cost could not be measured)")
        finally:
            measured.set()
        self.batcher.run()

    def _pass_cost(self, context: LlamaContext, free: bool | None) -> PassCost | None:
        """The curve drafts are sized by: measured on this machine, or with `free` (on) flat;
        None (no drafts) for a model whose memory cannot drop a rejected draft."""
        api, model = self._llama_cpp, self._model
        if api.llama_model_is_recurrent(model) or api.llama_model_is_hybrid(model):
            log.info("speculation: off (a recurrent model's memory cannot drop a draft)")
            return None
        cost = PassCost.flat() if free else PassCost.measure(context, 0)
        if cost is None:
            log.info("speculation: off (this model's memory cannot drop a draft)")
        elif not cost.steady:
            log.warning("speculation: off (a pass's cost was unsteady at startup: a busy machine)")
            return None
        else:
            shown = ", ".join(f"{c:.2f}" for c in cost.relative)
            log.info("speculation: a pass of 1-%d rows costs %s × one row", MAX_DRAFT + 1, shown)
        return cost

    @property
    def drafts(self) -> tuple[int, int]:
        """Draft tokens verified so far, and accepted."""
        return self.batcher.drafted, self.batcher.accepted

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
        work = SequenceDecoder(self, prepared, lambda item: post(box, inbox.put, item))
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
