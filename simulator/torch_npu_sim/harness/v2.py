"""Model runner v2 graph managers on the simulator: the v2 target and draft-prefill graphs.

What is real: vllm-ascend's ``ModelAclGraphManager.capture`` / ``run_fullgraph``
(``ModelWithContext``, ``communicator_switch``, replay then update with
``model_state.attn_metadata`` and ``batch_descriptor=None``); ``PrefillEagleAclGraphManager``
whole (``__init__``, ``capture`` with ``model_capture_wrapper``, ``run_fullgraph`` with the real
``AscendEagleSpeculator.build_draft_attn_metadatas``); vLLM's ``CudaGraphManager`` descriptor
set-up, capture loop (``torch.cuda.CUDAGraph()``, ``with torch.cuda.graph(graph, pool)``,
``self.graphs[desc] = graph``) and replay; ``torch_cuda_wrapper`` (installs
``torch_npu_graph_wrapper`` as ``torch.cuda.graph``; this harness restores the ``torch.cuda``
attributes at close, the release never does); the real attention impl and metadata builder.

Shim (documented deviation): the release's ``ModelAclGraphManager`` was written against a newer
vLLM. On vLLM 0.23.0 its ``__init__`` passes ``lora_capture_cases=`` and its ``capture`` passes
``lora_capture_hook=`` to ``ModelCudaGraphManager``, which takes neither: stock cannot construct
it (``TypeError``, asserted by ``tests/test_v2.py``). ``CompatModelAclGraphManager`` slots
``_Compat`` between the release class and ``ModelCudaGraphManager`` in the MRO: it accepts those
keywords and, instead of ``prepare_inputs_to_capture`` (which needs the whole v2 runner state),
builds the toy model's inputs and attention metadata itself, then runs the real
``CudaGraphManager.capture`` loop. The release's own ``capture`` and ``run_fullgraph`` bodies run
unchanged on top of it. The model runner and the speculator are ``SimpleNamespace`` stand-ins with
only the attributes the managers read.
"""

from __future__ import annotations

import os
import random
from dataclasses import dataclass
from types import MethodType, SimpleNamespace
from typing import Any

import torch

from torch_npu_sim.harness.process import Lease
from torch_npu_sim.harness.spec import V2Scenario
from torch_npu_sim.harness.stack import Stack
from torch_npu_sim.harness.toy import D_MODEL, ToyDecoder, random_ids
from torch_npu_sim.workload import StepOutput

__all__ = ["V2Batch", "V2Engine", "stock_model_manager_error"]

RUNNER_IMPORTS = (
    "vllm_ascend.worker.v2.aclgraph_utils",
    "vllm_ascend.worker.v2.spec_decode.eagle.speculator",
    "vllm_ascend.worker.v2.utils",
)
_CUDA_ATTRS = (
    "Event",
    "Stream",
    "stream",
    "default_stream",
    "current_stream",
    "graph_pool_handle",
    "CUDAGraph",
    "graph",
    "synchronize",
    "set_stream",
    "current_device",
    "mem_get_info",
)


def _compat_classes() -> tuple[type, type]:
    from vllm.v1.worker.gpu.cudagraph_utils import (
        AttentionState,
        CudaGraphManager,
        ModelCudaGraphManager,
    )
    from vllm_ascend.worker.v2.aclgraph_utils import ModelAclGraphManager

    class _Compat(ModelCudaGraphManager):
        """vLLM-0.23.0 adapter under the release's manager (see the module docstring)."""

        def __init__(
            self,
            vllm_config: Any,
            device: Any,
            cudagraph_mode: Any,
            decode_query_len: int,
            lora_capture_cases: Any = None,
        ) -> None:
            super().__init__(vllm_config, device, cudagraph_mode, decode_query_len)

        def capture(
            self,
            model: Any,
            model_state: Any,
            input_buffers: Any,
            intermediate_tensors: Any,
            block_tables: Any,
            attn_groups: Any,
            kv_cache_config: Any,
            has_lora: bool = False,
            use_aux_hidden_state_outputs: bool = False,
            lora_capture_hook: Any = None,
            progress_bar_desc: str = "Capturing CUDA graphs",
        ) -> Any:
            from vllm.forward_context import set_forward_context

            engine: V2Engine = self.engine  # type: ignore[attr-defined]

            def create_forward_fn(desc: Any, warmup: bool) -> Any:
                num_tokens = desc.num_tokens
                md = engine.capture_metadata(desc)

                def forward_fn(cg_mode: Any) -> None:
                    with set_forward_context(
                        md,
                        self.vllm_config,
                        num_tokens=num_tokens,
                        cudagraph_runtime_mode=cg_mode,
                        slot_mapping=None,
                    ):
                        out = model(*engine.inputs(num_tokens))
                    if self.hidden_states is None:
                        self.hidden_states = torch.empty(
                            engine.stack.max_tokens, out.shape[-1], dtype=out.dtype
                        )
                    self.hidden_states[:num_tokens] = out

                return forward_fn, AttentionState(md, {})

            return CudaGraphManager.capture(self, create_forward_fn, progress_bar_desc)

    class CompatModelAclGraphManager(ModelAclGraphManager, _Compat):
        """The release ``ModelAclGraphManager`` over the 0.23.0 adapter."""

    return _Compat, CompatModelAclGraphManager


def stock_model_manager_error(vllm_config: Any, runner: Any) -> BaseException | None:
    """Construct the release ``ModelAclGraphManager`` as the v2 runner would; the error, if any."""
    from vllm.config import CUDAGraphMode
    from vllm_ascend.worker.v2.aclgraph_utils import ModelAclGraphManager

    try:
        ModelAclGraphManager(
            vllm_config, torch.device("cpu"), CUDAGraphMode.FULL_DECODE_ONLY, 1, runner
        )
    except BaseException as exc:  # noqa: BLE001 - reported as evidence
        return exc
    return None


@dataclass
class V2Batch:
    step: int
    seq_lens: list[int]  # kv length per request including this step's query tokens
    positions: list[int]  # first query position per request
    slots: list[int]
    input_ids: torch.Tensor  # (num_reqs * qlen,)

    @property
    def num_reqs(self) -> int:
        return len(self.seq_lens)


_UNSET = object()


class V2Engine:
    """A v2 graph manager (see ``V2Scenario``) over the toy model of its base scenario.

    Comparability: the eager run puts back the KV slots of this step's tokens, so it leaves the
    caches as it found them and the graph run of the same batch, before or after, sees them too.
    """

    def __init__(self, v2: V2Scenario, *, num_threads: int | None = 1) -> None:
        self.name, self.stock, self.scenario = v2.name, v2.stock, v2.base
        self.role, self.qlen = v2.role, v2.query_len
        self._saved_cuda: dict[str, Any] = {}
        self._saved_env: Any = _UNSET
        self.lease = Lease(v2.name, num_threads)
        try:
            from vllm.config import set_current_vllm_config

            # v2 captures with seq_len = num_tokens // num_reqs (vLLM ``InputBatch.make_dummy``),
            # not v1's PA max-workspace length (6144): size the model and block tables for the
            # workload only (PA scenarios: 4 block-table columns instead of 48, ~5x cheaper).
            self.stack = Stack(v2.base, v1_pa_capture=False)
            self.vllm_config = self.stack.vllm_config
            self.model = ToyDecoder(self.stack.layers, self.stack.gen)
            with set_current_vllm_config(self.vllm_config):
                self._build_manager()
        except BaseException:
            self.close()  # a half-built engine must not block the next one
            raise
        self._step = 0
        rng = random.Random(v2.base.seed)
        self._computed = [
            rng.randrange(0, self.scenario.max_kv_len - 2 * self.qlen)
            for _ in range(self.stack.max_num_reqs)
        ]

    def _build_manager(self) -> None:
        import importlib

        from vllm.config import CUDAGraphMode

        backend = self.stack.attn_backend  # the model's (FIA / PA, or MLA): its impl updates
        # What importing the v2 runner (worker/v2/model_runner.py) loads before its
        # torch_cuda_wrapper runs: the managers' modules (speculator.py imports eagle.aclgraph).
        for module in RUNNER_IMPORTS:
            importlib.import_module(module)
        v2_utils = importlib.import_module("vllm_ascend.worker.v2.utils")

        self._saved_env = os.environ.get("VLLM_USE_V2_MODEL_RUNNER")
        os.environ["VLLM_USE_V2_MODEL_RUNNER"] = "1"  # _EXTRA_CTX reads v2's additional_kwargs
        self._saved_cuda = {
            a: getattr(torch.cuda, a) for a in _CUDA_ATTRS if hasattr(torch.cuda, a)
        }
        with v2_utils.torch_cuda_wrapper():  # as NPUModelRunner.__init__ (v2) does
            pass
        self.update_stream = torch.npu.Stream()
        self.model_state = SimpleNamespace(attn_metadata=None)
        self.hidden_out = torch.zeros(self.stack.max_tokens, D_MODEL)
        mode = CUDAGraphMode.FULL_DECODE_ONLY
        positions = SimpleNamespace(positions=self.stack.positions)
        if self.role == "target":
            runner = SimpleNamespace(
                input_buffers=positions,
                dp_size=1,
                model_state=self.model_state,
                update_stream=self.update_stream,
                attn_groups=[[SimpleNamespace(backend=backend)]],
                speculative_config=None,
            )
            self.runner = runner
            _, manager_cls = _compat_classes()
            self.manager = manager_cls.__new__(manager_cls)
            self.manager.engine = self
            manager_cls.__init__(
                self.manager, self.vllm_config, torch.device("cpu"), mode, 1, runner
            )
        else:
            from vllm_ascend.worker.v2.spec_decode.eagle.aclgraph import (
                PrefillEagleAclGraphManager,
            )
            from vllm_ascend.worker.v2.spec_decode.eagle.speculator import AscendEagleSpeculator

            spec = SimpleNamespace(
                model=self.model,
                input_buffers=positions,
                dp_size=1,
                model_state=self.model_state,
                update_stream=self.update_stream,
                attn_backends={"draft": backend},
                speculative_config=None,
                draft_attn_layer_names={s.name for s in self.scenario.layers},
                input_batch=None,
            )
            spec.build_draft_attn_metadatas = MethodType(
                AscendEagleSpeculator.build_draft_attn_metadatas, spec
            )
            self.speculator = spec
            self.manager = PrefillEagleAclGraphManager(
                self.vllm_config, torch.device("cpu"), mode, self.qlen, spec
            )

    def inputs(self, num_tokens: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The model's persistent input buffers, for ``num_tokens`` tokens."""
        return self.stack.input_ids[:num_tokens], self.stack.positions[:num_tokens]

    def close(self) -> None:
        """Drop the graphs, put back ``torch.cuda`` and the environment, reset the process."""
        self.lease.release(self._drop_graphs)

    def _drop_graphs(self) -> None:
        self.manager = self.runner = self.speculator = self.model = self.stack = None
        for name, value in self._saved_cuda.items():
            setattr(torch.cuda, name, value)
        if self._saved_env is None:
            os.environ.pop("VLLM_USE_V2_MODEL_RUNNER", None)
        elif self._saved_env is not _UNSET:
            os.environ["VLLM_USE_V2_MODEL_RUNNER"] = self._saved_env

    # ---- descriptors and metadata ----------------------------------------------------------

    def descriptors(self) -> list[Any]:
        from vllm.config import CUDAGraphMode

        return sorted(
            self.manager._capture_descs.get(CUDAGraphMode.FULL, []), key=lambda d: d.num_tokens
        )

    def desc_for(self, num_reqs: int) -> Any:
        return next(d for d in self.descriptors() if d.num_reqs >= num_reqs)

    def metadata(
        self, num_reqs: int, num_reqs_padded: int, seq_lens: list[int], capturing: bool
    ) -> dict[str, Any]:
        """Metadata as the v2 runner builds it: ``qlen`` tokens per request, padded requests."""
        stack, q, n, nr = self.stack, self.qlen, num_reqs, num_reqs_padded
        seq = stack.seq
        seq.set_queries(nr, q)
        # padded requests see q (stale) tokens of block 0
        seq.set_seq_lens(seq_lens, num_reqs_padded=nr, pad=q)
        out: dict[str, Any] = {}
        for group in stack.groups:
            group.block_table[n:nr].fill_(0)
            group.slot_mapping[n * q : nr * q].fill_(-1)
            common = seq.common(
                num_reqs=nr,
                num_actual_tokens=n * q,
                num_input_tokens=nr * q,
                max_seq_len=stack.max_model_len if capturing else int(seq.seq_lens_cpu.max()),
                block_table=group.block_table,
                slot_mapping=group.slot_mapping[: nr * q],
                positions=stack.positions,
                query_len=q,
            )
            md = group.build(common, capturing)
            for name in group.layer_names:
                out[name] = md
        if not self.scenario.has_linear:
            return out
        return stack.with_linear_keys(out, stack.linear_metadata(nr, n * q))

    def capture_metadata(self, desc: Any) -> dict[str, Any]:
        nr = desc.num_reqs
        self.stack.input_ids[: desc.num_tokens].zero_()
        self.stack.positions[: desc.num_tokens].zero_()
        for group in self.stack.groups:
            group.block_table[:nr].zero_()
            group.slot_mapping[: desc.num_tokens].fill_(-1)
        return self.metadata(nr, nr, [self.qlen] * nr, capturing=True)

    # ---- capture ---------------------------------------------------------------------------

    def capture(self) -> None:
        """The runner's capture: every FULL descriptor of the manager."""
        from vllm.config import set_current_vllm_config
        from vllm.forward_context import set_forward_context
        from vllm.v1.worker.gpu.cudagraph_utils import AttentionState, AttentionStatePair

        self._ensure_graph_params()
        with set_current_vllm_config(self.vllm_config):
            if self.role == "target":
                self.manager.capture(self.model, self.model_state, None, None, None, None, None)
            else:
                states = {
                    d: AttentionStatePair(
                        AttentionState(self.capture_metadata(d), {}),
                        AttentionState(self.capture_metadata(d), {}),
                    )
                    for d in self.descriptors()
                }
                spec = self.speculator

                def forward_fn(
                    num_reqs: int,
                    num_tokens: int,
                    attn_metadata: Any,
                    slot_mappings: Any,
                    num_tokens_across_dp: Any,
                    cg_mode: Any,
                ) -> None:
                    with set_forward_context(
                        attn_metadata,
                        self.vllm_config,
                        num_tokens=num_tokens,
                        cudagraph_runtime_mode=cg_mode,
                        slot_mapping=None,
                    ):
                        out = spec.model(*self.inputs(num_tokens))
                    self.hidden_out[:num_tokens] = out

                self.manager.capture(forward_fn, states)
            torch.npu.synchronize()

    def _ensure_graph_params(self) -> None:
        import vllm_ascend.compilation.acl_graph as acl_graph

        sizes = list(self.scenario.capture_sizes)
        for get, put in (
            (acl_graph.get_graph_params, acl_graph.set_graph_params),
            (acl_graph.get_draft_graph_params, acl_graph.set_draft_graph_params),
            (acl_graph.get_draft_graph_prefill_params, acl_graph.set_draft_graph_prefill_params),
        ):
            if get() is None:
                put(sizes)

    # ---- workload --------------------------------------------------------------------------

    def next_batch(self, rng: random.Random) -> V2Batch:
        q = self.qlen
        max_reqs = max(d.num_reqs for d in self.descriptors())
        n = rng.randint(1, max_reqs)
        slots = rng.sample(range(self.stack.max_num_reqs), n)
        positions, seq_lens = [], []
        for s in slots:
            if self._computed[s] + q > self.scenario.max_kv_len:
                self._computed[s] = rng.randrange(0, self.scenario.max_kv_len // 2)
            positions.append(self._computed[s])
            seq_lens.append(self._computed[s] + q)
            self._computed[s] += q
        self._step += 1
        return V2Batch(self._step, seq_lens, positions, slots, random_ids(rng, n * q))

    def run(self, batch: V2Batch, *, graph: bool = True) -> StepOutput:
        """Through the manager's ``run_fullgraph`` (replay, then the stock update seam), or
        eagerly (the KV slots it writes put back afterwards)."""
        if graph:
            return self._output(batch, self._run_graph(batch))
        slots = self._token_slots(batch)
        with self.stack.kv_restored([slots] * len(self.stack.groups)):
            return self._output(batch, self._run_eager(batch))

    def _output(self, batch: V2Batch, hidden: torch.Tensor) -> StepOutput:
        logits = self.model.logits(hidden).view(batch.num_reqs, self.qlen, -1)
        return StepOutput(values=hidden, tokens=logits.argmax(-1).tolist(), logits=logits)

    def _token_positions(self, batch: V2Batch) -> torch.Tensor:
        q = self.qlen
        return torch.tensor([p + j for p in batch.positions for j in range(q)], dtype=torch.int64)

    def _block_rows(self, batch: V2Batch) -> torch.Tensor:
        return torch.tensor([self.stack.block_row(s) for s in batch.slots], dtype=torch.int32)

    def _token_slots(self, batch: V2Batch) -> torch.Tensor:
        """The flat KV slot each of this step's query tokens is written to."""
        tok_rows = self._block_rows(batch).repeat_interleave(self.qlen, dim=0)
        return self.stack.token_slots(tok_rows, self._token_positions(batch))

    def _load(self, batch: V2Batch, num_tokens: int) -> None:
        stack, t = self.stack, batch.num_reqs * self.qlen
        stack.input_ids[:num_tokens].zero_()
        stack.positions[:num_tokens].zero_()
        stack.input_ids[:t] = batch.input_ids
        stack.positions[:t] = self._token_positions(batch)
        rows = self._block_rows(batch)
        slots = self._token_slots(batch)
        for group in stack.groups:
            group.block_table[: batch.num_reqs] = rows
            group.slot_mapping[:t] = slots

    def _run_graph(self, batch: V2Batch) -> torch.Tensor:
        from vllm.config import set_current_vllm_config

        desc = self.desc_for(batch.num_reqs)
        t = batch.num_reqs * self.qlen
        with set_current_vllm_config(self.vllm_config):
            self._load(batch, desc.num_tokens)
            self.model_state.attn_metadata = self.metadata(
                batch.num_reqs, desc.num_reqs, batch.seq_lens, capturing=False
            )
            ret = self.manager.run_fullgraph(desc)
            torch.npu.synchronize()
        out = ret if self.role == "target" else self.hidden_out
        return out[:t].clone()

    def _run_eager(self, batch: V2Batch) -> torch.Tensor:
        from vllm.config import CUDAGraphMode, set_current_vllm_config
        from vllm.forward_context import set_forward_context

        n, t = batch.num_reqs, batch.num_reqs * self.qlen
        with set_current_vllm_config(self.vllm_config):
            self._load(batch, t)
            md = self.metadata(n, n, batch.seq_lens, capturing=False)
            with set_forward_context(
                md, self.vllm_config, num_tokens=t, cudagraph_runtime_mode=CUDAGraphMode.NONE
            ):
                out = self.model(*self.inputs(t))
            torch.npu.synchronize()
        return out[:t].clone()
