"""The real vLLM engine as a :class:`torch_npu_sim.workload.Workload`.

A batch is a list of requests (token-id prompts of different lengths, each with its own
``max_tokens``); running it is one greedy ``LLM.generate`` call, in which vLLM's scheduler forms
changing decode batches (``max_num_seqs`` is small, requests finish at different lengths, graph
sizes get padded). Graph versus eager is a choice made when the engine is built, so
``run(batch, graph=...)`` raises if asked for the other kind; an arm compares the two engines'
tokens across processes instead of within one step. ``capture()`` builds the engine (vLLM captures
its graphs while it starts); a start-up crash is then the arm's recorded result.
"""

from __future__ import annotations

import gc
import os
import random
import time
from dataclasses import dataclass, field
from typing import Any

from ..workload import StepOutput
from . import models
from .cases import Case, engine_kwargs

#: Requests per batch, and the ranges their prompt lengths and ``max_tokens`` are drawn from.
REQUESTS = 6
PROMPT_LEN = (3, 40)
MAX_TOKENS = (4, 24)
#: With ``Case.chunk_tokens``: how many of the requests (the last ones) get long prompts, and the
#: range of their lengths (with ``MAX_TOKENS``, inside the engines' ``max_model_len`` of 256).
LONG_REQUESTS = 2
LONG_PROMPT_LEN = (120, 200)


@dataclass
class Request:
    prompt: list[int]
    max_tokens: int


@dataclass
class SpecStats:
    """Speculative decoding counters from vLLM's metrics (summed over the engine's life)."""

    drafts: int = 0
    draft_tokens: int = 0
    accepted_tokens: int = 0
    accepted_per_position: list[int] = field(default_factory=list)

    @property
    def acceptance_rate(self) -> float | None:
        return self.accepted_tokens / self.draft_tokens if self.draft_tokens else None


class VllmWorkload:
    """One ``vllm.LLM`` built from a :class:`Case`, graph or eager."""

    def __init__(self, case: Case, *, graph: bool, model_root: str | None = None) -> None:
        self.case = case
        self.graph = graph
        self.name = case.name
        self.stock = case.stock
        self.model_root = model_root
        self.llm: Any = None
        self.close_error: str | None = None
        #: Seconds spent building (and capturing), generating and shutting down.
        self.phases: dict[str, float] = {}

    # -- the protocol ---------------------------------------------------------------------

    def capture(self) -> None:
        """Build the engine: a graph engine captures its graphs while it starts."""
        self._engine()

    def next_batch(self, rng: random.Random) -> list[Request]:
        """``REQUESTS`` requests; with ``Case.chunk_tokens`` the last ``LONG_REQUESTS`` have long
        prompts: ``max_num_seqs`` admits them once earlier ones finish, so their chunks run
        beside the others' decodes."""
        vocab = models.VOCAB
        long = LONG_REQUESTS if self.case.chunk_tokens else 0
        lengths = [PROMPT_LEN] * (REQUESTS - long) + [LONG_PROMPT_LEN] * long
        return [
            Request(
                prompt=[rng.randrange(3, vocab) for _ in range(rng.randint(*span))],
                max_tokens=rng.randint(*MAX_TOKENS),
            )
            for span in lengths
        ]

    def run(self, batch: list[Request], *, graph: bool = True) -> StepOutput:
        if graph != self.graph:
            kind = "graph" if self.graph else "eager"
            raise ValueError(f"{self.name} was built as a {kind} engine (enforce_eager is fixed)")
        from vllm import SamplingParams

        llm = self._engine()
        prompts = [{"prompt_token_ids": r.prompt} for r in batch]
        params = [
            SamplingParams(temperature=0.0, max_tokens=r.max_tokens, ignore_eos=True) for r in batch
        ]
        started = time.monotonic()
        outputs = llm.generate(prompts, params, use_tqdm=False)
        self.phases["generate"] = round(time.monotonic() - started, 2)
        return StepOutput(values=None, tokens=[list(o.outputs[0].token_ids) for o in outputs])

    def close(self) -> None:
        """Shut the engine down. After a crash in a graph update the simulated device still
        holds the blocked replay (hardware would hang): the shutdown's synchronize reports and
        drops it; that report is kept in ``close_error``, the arm's result is the first error."""
        if self.llm is None:
            return
        llm, self.llm = self.llm, None
        started = time.monotonic()
        try:
            llm.llm_engine.engine_core.shutdown()
        except Exception as exc:  # noqa: BLE001 - the arm already holds what went wrong first
            self.close_error = f"{type(exc).__name__}: {exc}".splitlines()[0]
        finally:
            del llm
            gc.collect()
            self.phases["close"] = round(time.monotonic() - started, 2)

    # -- beyond the protocol --------------------------------------------------------------

    def spec_stats(self) -> SpecStats | None:
        """The engine's speculative-decoding counters (None without a draft or an engine)."""
        if not self.case.draft or self.llm is None:
            return None
        stats = SpecStats()
        for metric in self.llm.get_metrics():
            if metric.name == "vllm:spec_decode_num_drafts":
                stats.drafts += int(metric.value)
            elif metric.name == "vllm:spec_decode_num_draft_tokens":
                stats.draft_tokens += int(metric.value)
            elif metric.name == "vllm:spec_decode_num_accepted_tokens":
                stats.accepted_tokens += int(metric.value)
            elif metric.name == "vllm:spec_decode_num_accepted_tokens_per_pos":
                values = [int(v) for v in metric.values]
                if len(stats.accepted_per_position) < len(values):
                    stats.accepted_per_position += [0] * (
                        len(values) - len(stats.accepted_per_position)
                    )
                for i, v in enumerate(values):
                    stats.accepted_per_position[i] += v
        return stats

    def _engine(self) -> Any:
        if self.llm is None:
            from vllm import LLM

            os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "1" if self.case.multiprocess else "0"
            # The arm asks the engine core for its figures with a function (collective_rpc).
            os.environ["VLLM_ALLOW_INSECURE_SERIALIZATION"] = "1"
            os.environ.update(self.case.environment)
            model_dir = str(models.materialize(self.case.model, self.model_root))
            draft_dir = (
                str(models.materialize(self.case.draft, self.model_root))
                if self.case.draft
                else None
            )
            started = time.monotonic()
            self.llm = LLM(**engine_kwargs(self.case, model_dir, draft_dir, graph=self.graph))
            self.phases["build"] = round(time.monotonic() - started, 2)
        return self.llm
