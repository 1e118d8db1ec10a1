"""The generation engine: prefill, then one decode step per token over a static KV cache.

The model is any supported Hugging Face causal LM, dense or with svdmlp's low-rank MLPs: the engine
drives the model's own forward, so both run the very same code and their speeds compare fairly.

What makes decoding fast is that one decode step has fixed shapes and fixed buffers: the token
ids, positions and attention mask live in static tensors, the keys and values in a static cache
whose write position is a device tensor (transformers' ``StaticLayer``), and the next token is
selected on the device and written back into the input buffer. On CUDA that step is captured
once as a CUDA graph (per batch size, cache length and sampling mode) and replayed per token, so a
token costs one graph launch instead of hundreds of kernel launches. The host only syncs every
``sync_every`` tokens to stream them out and check stop tokens. Without graphs (on a CPU) the same
step runs eagerly over a growing cache, as Hugging Face ``generate`` does: there is no launch overhead
to remove, and a static cache only costs attention over (and copies into) slots not yet written.
"""

from __future__ import annotations

import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
from transformers.cache_utils import Cache, DynamicCache, StaticLayer

from svdmlp.cuda_graphs import capture_graph
from svdmlp.engine.batch import PromptBatch, left_pad
from svdmlp.engine.sampling import Sampling, select

MAX_BATCH = 64
# Cache lengths are rounded up to a multiple of this, so that calls of similar lengths share one
# session (cache and graphs) instead of capturing a graph per prompt length.
CACHE_QUANTUM = 128
CUDA_SYNC_EVERY = 8  # tokens between host syncs on CUDA (streaming, stop checks)
# The engine's compile modes, by the torch.compile mode each runs. "max-autotune" times inductor's
# own matmul kernels against the vendor library's for each of the step's shapes (minutes of compiling):
# the decode step's skinny GEMVs are where cuBLAS lost most on an H200 (attention projections at a
# quarter of the copy bandwidth, BENCHMARKS.md session 16). Never inductor's own CUDA graphs: the
# engine captures the step itself.
COMPILE_MODES = {"default": "default", "max-autotune": "max-autotune-no-cudagraphs"}


@dataclass
class GenerationResult:
    """New tokens per prompt (ending with the first stop token, if one came) and how long it took.

    ``decode_steps`` counts forward passes after the prefill; ``graph`` says whether they were
    CUDA-graph replays and ``compiled`` whether the step was compiled; ``note`` says why not when
    compiling or capturing was attempted and failed.
    """

    tokens: list[list[int]]
    prefill_s: float
    decode_s: float
    decode_steps: int
    prompt_tokens: int
    graph: bool
    compiled: bool = False
    note: str | None = None

    @property
    def decode_s_per_step(self) -> float | None:
        return self.decode_s / self.decode_steps if self.decode_steps else None


def static_cache(config, cache_len: int, batch: int, dtype: torch.dtype, device: torch.device) -> Cache:
    """A full-length ``StaticLayer`` per decoder layer, allocated now (graphs need fixed addresses).

    Sliding-window layers get a full-length layer too: the sliding-window mask works on absolute
    slots, so attention is unchanged, and the write position stays a device tensor (transformers'
    ``StaticSlidingWindowLayer`` tracks it as a Python int, which a replayed graph cannot see).
    """
    text = config.get_text_config(decoder=True)
    head_dim = getattr(text, "head_dim", None) or text.hidden_size // text.num_attention_heads
    cache = Cache(layers=[StaticLayer(max_cache_len=cache_len) for _ in range(text.num_hidden_layers)])
    cache.early_initialization(batch, text.num_key_value_heads, head_dim, dtype, device)
    return cache


@dataclass
class _Session:
    """Static state for one (batch size, cache length): cache, input buffers, noise, captured steps."""

    cache: Cache  # static with graphs; without them a growing one, replaced at every prefill
    ids: torch.Tensor  # (B, 1) the token fed to the next step; the step overwrites it with its output
    positions: torch.Tensor  # (B, 1) rotary position of that token (real tokens only)
    mask: torch.Tensor  # (B, cache_len) 0 on left-pad slots, 1 elsewhere (causality masks the future)
    noise: torch.Tensor  # (B, V) Exp(1) noise for sampling, refilled outside the graph per token
    steps: dict = field(default_factory=dict)  # sampling mode -> step callable (graph replay or eager)


class _Collector:
    """Tokens arriving in chunks: cut each row at its first stop token, pass new ones to a callback."""

    def __init__(self, batch: int, stop_tokens: frozenset[int], on_tokens: Callable | None):
        self.rows: list[list[int]] = [[] for _ in range(batch)]
        self.done = [False] * batch
        self.stop_tokens, self.on_tokens = stop_tokens, on_tokens

    def take(self, chunk: list[list[int]]) -> bool:
        """Add one chunk (B lists of equal length); True when every row has stopped."""
        fresh = []
        for row, tokens in enumerate(chunk):
            new = []
            for token in tokens:
                if self.done[row]:
                    break
                new.append(token)
                self.done[row] = token in self.stop_tokens
            self.rows[row] += new
            fresh.append(new)
        if self.on_tokens is not None:
            self.on_tokens(fresh)
        return all(self.done)


def context_length(model: torch.nn.Module) -> int:
    """The most positions the model was made for (its ``max_position_embeddings``): the longest prompt
    and new tokens it generates, the longest window it scores."""
    return model.config.get_text_config(decoder=True).max_position_embeddings


def check_room(width: int, max_new_tokens: int, limit: int, name: str, field: str) -> None:
    """Refuse, before any token is generated, a prompt of ``width`` tokens whose ``max_new_tokens``
    would run past ``limit`` positions (``name`` and ``field`` say which limit)."""
    if width + max_new_tokens > limit:
        raise ValueError(
            f"prompt of {width} tokens + {max_new_tokens} new tokens exceeds {name} of {limit} tokens ({field})"
        )


class Engine:
    """Generate with a causal LM over a static KV cache, graph-captured decode steps on CUDA.

    Args:
        model: a supported Hugging Face causal LM in eval mode, dense or compressed.
        max_batch: the largest batch accepted (1 to 64).
        max_seq_len: the longest prompt + new tokens accepted (default: the model's
            ``max_position_embeddings``).
        graphs: capture decode steps as CUDA graphs (default: on CUDA; refused elsewhere).
        compile: compile the decode step with ``torch.compile`` (full graph, static shapes) before it
            is captured: norms, rotary, cache writes and attention fused into fewer kernels, which a
            graph alone cannot do (it removes launch gaps, not launches). Implies the static cache.
        compile_mode: one of :data:`COMPILE_MODES`, for ``compile``.
        sync_every: tokens between host syncs (streaming, stop checks); default 8 on CUDA, 1 on CPU.
    """

    def __init__(
        self,
        model: torch.nn.Module,
        max_batch: int = MAX_BATCH,
        max_seq_len: int | None = None,
        graphs: bool | None = None,
        compile: bool = False,
        compile_mode: str = "default",
        sync_every: int | None = None,
    ):
        parameter = next(model.parameters())
        self.model, self.device, self.dtype = model, parameter.device, parameter.dtype
        text = model.config.get_text_config(decoder=True)
        self.vocab = text.vocab_size
        if not 1 <= max_batch <= MAX_BATCH:
            raise ValueError(f"max_batch must be in [1, {MAX_BATCH}], got {max_batch}")
        self.max_batch = max_batch
        self.max_seq_len = context_length(model) if max_seq_len is None else max_seq_len
        if self.max_seq_len < 2:
            raise ValueError(f"max_seq_len must be >= 2, got {self.max_seq_len}")
        self.graphs = self.device.type == "cuda" if graphs is None else graphs
        if self.graphs and self.device.type != "cuda":
            raise ValueError(f"graphs=True needs a model on CUDA; this one is on {self.device.type}")
        if compile_mode not in COMPILE_MODES:
            raise ValueError(f"compile_mode must be one of {sorted(COMPILE_MODES)}, got {compile_mode!r}")
        self.compile, self.compile_mode = compile, compile_mode
        # Fixed shapes for the decode step: graphs and compiled steps need the static cache.
        self.static = self.graphs or compile
        self.sync_every = (CUDA_SYNC_EVERY if self.graphs else 1) if sync_every is None else sync_every
        if self.sync_every < 1:
            raise ValueError(f"sync_every must be >= 1, got {self.sync_every}")
        self._session_key: tuple[int, int] | None = None
        self._session: _Session | None = None

    @torch.no_grad()
    def generate(
        self,
        prompts: list[list[int]],
        max_new_tokens: int,
        sampling: Sampling | dict | None = None,
        stop_tokens=(),
        on_tokens: Callable[[list[list[int]]], None] | None = None,
    ) -> GenerationResult:
        """Continue each prompt (a list of token ids) by up to ``max_new_tokens`` tokens.

        Rows stop at their first token in ``stop_tokens``; generation ends when every row has
        stopped. ``on_tokens`` receives, every ``sync_every`` tokens, the new tokens of each row.
        Every bad input is refused here, before any graph runs.
        """
        sampling = Sampling.parse(sampling)
        sampling.check_vocab(self.vocab)
        if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, int) or max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be an integer >= 1, got {max_new_tokens!r}")
        if len(prompts) > self.max_batch:
            raise ValueError(f"batch of {len(prompts)} prompts exceeds the limit of {self.max_batch}")
        bad = sorted({t for p in prompts for t in p if not 0 <= t < self.vocab})
        if bad:
            raise ValueError(f"token ids {bad[:5]} are outside the vocabulary [0, {self.vocab})")
        width = max((len(p) for p in prompts), default=0)
        check_room(width, max_new_tokens, self.max_seq_len, "the cache limit", "max_seq_len")
        batch = left_pad(prompts, self.device)
        cache_len = min(self.max_seq_len, -(-(width + max_new_tokens) // CACHE_QUANTUM) * CACHE_QUANTUM)
        session = self._session_for(batch.size, cache_len)
        step, note = self._step_for(session, sampling)
        collector = _Collector(batch.size, frozenset(stop_tokens), on_tokens)
        generator = torch.Generator(device=self.device).manual_seed(sampling.seed)

        started = time.perf_counter()
        first = self._prefill(session, batch, sampling, generator)
        tokens = torch.empty(batch.size, max_new_tokens, dtype=torch.long, device=self.device)
        tokens[:, 0] = first
        finished = collector.take(tokens[:, :1].tolist())
        prefilled = time.perf_counter()
        steps, synced = 0, 1
        while not finished and steps + 1 < max_new_tokens:
            if not sampling.greedy:
                session.noise.exponential_(generator=generator)
            step()
            steps += 1
            tokens[:, steps] = session.ids[:, 0]
            if steps + 1 - synced >= self.sync_every or steps + 1 == max_new_tokens:
                finished = collector.take(tokens[:, synced : steps + 1].tolist())
                synced = steps + 1
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        return GenerationResult(
            tokens=collector.rows,
            prefill_s=prefilled - started,
            decode_s=time.perf_counter() - prefilled,
            decode_steps=steps,
            prompt_tokens=sum(batch.lengths),
            graph=self.graphs and note is None,
            compiled=self.compile and note is None,
            note=note,
        )

    def _session_for(self, batch: int, cache_len: int) -> _Session:
        """The session of this shape, built anew when the shape changes (one cache in memory at once)."""
        if self._session_key != (batch, cache_len):
            self._session = None  # free the old cache before allocating the new one
            device = self.device
            self._session = _Session(
                cache=self._new_cache(cache_len, batch),
                ids=torch.zeros(batch, 1, dtype=torch.long, device=device),
                positions=torch.zeros(batch, 1, dtype=torch.long, device=device),
                mask=torch.ones(batch, cache_len, dtype=torch.long, device=device),
                noise=torch.ones(batch, self.vocab, dtype=torch.float32, device=device),
            )
            self._session_key = (batch, cache_len)
        return self._session

    def _new_cache(self, cache_len: int, batch: int) -> Cache:
        if self.static:
            return static_cache(self.model.config, cache_len, batch, self.dtype, self.device)
        return DynamicCache(config=self.model.config)

    def _forward_last(self, session: _Session, input_ids, position_ids) -> torch.Tensor:
        """Logits of the last position (B, V), writing this forward's keys and values to the cache."""
        mask = session.mask
        if not self.static:  # a growing cache wants the mask of the slots written so far
            mask = mask[:, : session.cache.get_seq_length() + input_ids.shape[1]]
        output = self.model(
            input_ids=input_ids,
            position_ids=position_ids,
            attention_mask=mask,
            past_key_values=session.cache,
            use_cache=True,
            logits_to_keep=1,
        )
        return output.logits[:, -1]

    def _step_for(self, session: _Session, sampling: Sampling) -> tuple[Callable[[], None], str | None]:
        """The decode step for this sampling mode: a graph replay on CUDA (captured on first use)."""
        mode = (sampling.greedy, sampling.temperature, sampling.top_k, sampling.top_p)
        if mode in session.steps:
            return session.steps[mode]

        def step() -> None:
            logits = self._forward_last(session, session.ids, session.positions)
            session.ids.copy_(select(logits, sampling, session.noise)[:, None])
            session.positions.add_(1)

        # Compiling (on the first call) and the graph's warm-up and capture write garbage into the
        # cache; every prefill resets it first. A step that cannot be compiled or captured still
        # decodes, eagerly, and says why.
        entry = (step, None)
        try:
            if self.compile:
                step()  # eagerly first: one-time work (the backend's measured choice) stays untraced
                mode = COMPILE_MODES[self.compile_mode]
                entry = (torch.compile(step, fullgraph=True, dynamic=False, mode=mode), None)
                if not self.graphs:
                    entry[0]()
            if self.graphs:
                entry = (capture_graph(entry[0]), None)
        except Exception as err:
            if self.device.type == "cuda":
                torch.cuda.synchronize(self.device)
            what = {
                (True, True): "compiling or capturing the decode step",
                (True, False): "compiling the decode step",
                (False, True): "CUDA graph capture",
            }[(self.compile, self.graphs)]
            note = f"{what} failed, decoding eagerly: {type(err).__name__}: {err}"
            warnings.warn(note, stacklevel=3)
            entry = (step, note)
        session.steps[mode] = entry
        return entry

    def _prefill(
        self, session: _Session, batch: PromptBatch, sampling: Sampling, generator: torch.Generator
    ) -> torch.Tensor:
        """Reset the session, run the prompts through the model, select and feed the first new token."""
        if self.static:
            session.cache.reset()
        else:
            session.cache = self._new_cache(session.mask.shape[1], batch.size)
        session.mask.fill_(1)
        session.mask[:, : batch.width] = batch.mask
        logits = self._forward_last(session, batch.input_ids, batch.positions)
        if not sampling.greedy:
            session.noise.exponential_(generator=generator)
        first = select(logits, sampling, session.noise)  # (B,)
        session.ids.copy_(first[:, None])
        session.positions.copy_(batch.positions[:, -1:] + 1)
        return first
