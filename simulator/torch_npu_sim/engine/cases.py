"""The engine cases: a tiny model plus the engine settings one ``vllm.LLM`` is built with.

A case is plain data (it crosses a process boundary as JSON). Graph and eager are two engines
built from one case (``enforce_eager``), compared by their greedy tokens. ``stock`` records how
the release's own update path behaves on the case's graph arms, with the error it raises; the
tests hold stock to exactly that, so the note cannot go stale.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

#: Ascend compilation extras that need Huawei packages (npugraph_ex, torchair) or CANN fusion
#: kernels: off, so VLLM_COMPILE runs the release's own capture path with dynamo only.
ASCEND_COMPILATION = {
    "enable_npugraph_ex": False,
    "fuse_norm_quant": False,
    "fuse_qknorm_rope": False,
    "fuse_allreduce_rms": False,
    "fuse_muls_add": False,
}
NONE, VLLM_COMPILE = 0, 3

#: Compilation mode NONE with FULL graphs on vllm-ascend 0.23.0.post1: the runner's
#: ``_use_aclgraph()`` requires VLLM_COMPILE, so ``set_graph_params`` never runs while vLLM still
#: captures FULL graphs, and the first captured attention layer finds no graph parameters
#: (``full_graph_fia``); the runner wraps the AttributeError twice. Stock and overlay alike.
MODE_NONE_CRASH = (
    "crash: RuntimeError: NPUModelRunner init failed, error is NPUModelRunner failed, error is "
    "'NoneType' object has no attribute 'workspaces'"
)


@dataclass(frozen=True)
class Case:
    """One engine: model, graph settings, and what stock is known to do on it."""

    name: str
    model: str
    compilation_mode: int = VLLM_COMPILE
    cudagraph_mode: str = "FULL_DECODE_ONLY"
    capture_sizes: tuple[int, ...] = (1, 2, 4)
    #: The engine core in its own process (``VLLM_ENABLE_V1_MULTIPROCESSING=1``).
    multiprocess: bool = False
    #: Batch sizes served by paged attention (``additional_config.pa_shape_list``).
    pa_shape_list: tuple[int, ...] = ()
    #: Draft model name, its speculative method and number of speculative tokens, or none.
    draft: str | None = None
    draft_method: str = "eagle3"
    num_speculative_tokens: int = 0
    #: Extra ``vllm.LLM`` keyword arguments.
    engine: dict[str, Any] = field(default_factory=dict)
    #: ``ok``, ``crash: <Type>: <message>`` or ``wrong: <why>`` for the stock graph arm.
    stock: str = "ok"
    #: The overlay is expected to behave like stock here (same crash): a release limitation.
    overlay_same_as_stock: bool = False
    #: The release cannot start this engine at all: every arm, eager included, fails so.
    startup_error: str | None = None
    #: Environment the engine is built with (its worker processes inherit it): e.g. vLLM's
    #: worker start method, or a test-only switch of the simulator.
    environment: dict[str, str] = field(default_factory=dict)
    steps: int = 1
    seed: int = 0
    #: Release bugs the simulator repairs for this case (``repairs.py``), none by default.
    repairs: tuple[str, ...] = ()
    #: Chunked prefill beside running decodes: the scheduler's token budget per step
    #: (``max_num_batched_tokens``), and the workload's last requests get long prompts, admitted
    #: while the first ones decode and prefilled in chunks of at most this many tokens beside
    #: them (``workload.LONG_PROMPT_LEN``). 0: vLLM's budget, short prompts only.
    chunk_tokens: int = 0
    #: The error the overlay's graph arms (overlay, verify) must end with where the overlay
    #: refuses to run what stock runs wrongly (a stale graph); None: they must run.
    overlay_error: str | None = None
    #: The model's dtype. float32 unless the release's path needs what real checkpoints are:
    #: MLA's prefill context path casts the chunk to bfloat16 ("FIA with TND layout only supports
    #: bfloat16") but attends to context keys in the model's dtype beside bfloat16 rope keys,
    #: which the op refuses for a float32 model (``op_rules``' fia-rope).
    dtype: str = "float32"

    def to_json(self) -> dict[str, Any]:
        data = dataclasses.asdict(self)
        data["capture_sizes"] = list(self.capture_sizes)
        data["pa_shape_list"] = list(self.pa_shape_list)
        data["repairs"] = list(self.repairs)
        return data

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Case:
        data = dict(data)
        data["capture_sizes"] = tuple(data.get("capture_sizes", ()))
        data["pa_shape_list"] = tuple(data.get("pa_shape_list", ()))
        data["repairs"] = tuple(data.get("repairs", ()))
        return cls(**data)

    @property
    def reference(self) -> str:
        """The eager reference's name: cases differing only in graph settings share it."""
        parts = [self.model]
        if self.draft:
            parts.append(f"{self.draft}-k{self.num_speculative_tokens}")
        if self.chunk_tokens:  # other prompts, and chunks change the prefill's rounding
            parts.append(f"chunked{self.chunk_tokens}")
        if self.dtype != "float32":
            parts.append(self.dtype)
        if V2_REPAIR in self.repairs:  # another runner: its own eager reference
            parts.append("v2")
        return "+".join(parts)

    def eager(self) -> Case:
        """The eager reference case (graph settings do not apply to an eager engine)."""
        return dataclasses.replace(
            self,
            name=self.reference,
            multiprocess=False,
            pa_shape_list=(),
            stock="ok",
            overlay_error=None,
        )


def engine_kwargs(case: Case, model_dir: str, draft_dir: str | None, *, graph: bool) -> dict:
    """``vllm.LLM`` keyword arguments for ``case`` (graph or eager)."""
    additional: dict[str, Any] = {"ascend_compilation_config": dict(ASCEND_COMPILATION)}
    if case.pa_shape_list:
        additional["pa_shape_list"] = list(case.pa_shape_list)
    kwargs: dict[str, Any] = {
        "model": model_dir,
        "skip_tokenizer_init": True,
        "dtype": case.dtype,
        "seed": case.seed,
        "max_model_len": 256,
        "max_num_seqs": 4,
        "enable_prefix_caching": False,
        # Off unless a case turns it on (the TP fork case does: the simulator's runtime is
        # thread-safe for vLLM's async output-copy thread, which synchronises while it replays).
        "async_scheduling": False,
        "kv_cache_memory_bytes": 64 << 20,
        "disable_log_stats": False,
        "enforce_eager": not graph,
        "additional_config": additional,
        "compilation_config": {
            "mode": case.compilation_mode if graph else NONE,
            "cudagraph_mode": case.cudagraph_mode if graph else "NONE",
            "cudagraph_capture_sizes": list(case.capture_sizes),
        },
    }
    if case.chunk_tokens:
        kwargs["max_num_batched_tokens"] = case.chunk_tokens
    if case.draft:
        kwargs["speculative_config"] = {
            "method": case.draft_method,
            "model": draft_dir,
            "num_speculative_tokens": case.num_speculative_tokens,
        }
    kwargs.update(case.engine)
    return kwargs


#: Gemma4 MTP on this release stops at its draft's config: transformers 5.5.4 (the stack's pin)
#: has no ``gemma4_assistant`` model type, and vLLM 0.23.0 registers no config class for it.
GEMMA4_MTP_ERROR = (
    "The checkpoint you are trying to load has model type `gemma4_assistant` but Transformers "
    "does not recognize this architecture."
)


#: vllm-ascend 0.23.0.post1's Step3.5 MTP proposer calls ``_pad_query_start_loc_for_fia`` with the
#: runner's old signature: the first FULL-graph draft step fails, in every graph arm.
STEP3P5_PAD_CRASH = "crash: TypeError: unsupported operand type(s) for *: 'CUDAGraphMode' and 'int'"


def _qwen3(name: str, **kw: Any) -> Case:
    return Case(name=name, model="qwen3", **kw)


def _mtp(name: str, model: str, k: int, **kw: Any) -> Case:
    """``model`` drafting with its own MTP layer(s), ``k`` tokens a step: the batch sizes 1, 2, 4
    captured as ``k + 1`` tokens per request."""
    return Case(
        name=name,
        model=model,
        draft=model,
        draft_method="mtp",
        num_speculative_tokens=k,
        capture_sizes=tuple((k + 1) * n for n in (1, 2, 4)),
        **kw,
    )


# --- stale graphs: VLLM_USE_V2_MODEL_RUNNER on vLLM 0.23.0 (ascend_graph_patch/aspects/stale.py) --

#: The v2 variable, set in the case's process only (vLLM reads it at each access until an engine
#: core caches its environment, and each case's engine is built in its own forked child).
V2_FLAG = {"VLLM_USE_V2_MODEL_RUNNER": "1"}
#: The overlay's switch back to stock's behaviour (named, not imported).
STALE_GRAPH_VAR = "ASCEND_GRAPH_PATCH_STALE_GRAPH"
#: vllm-ascend 0.23.0.post1 falls back to the v1 runner, and its attention then reads the capture
#: flag where the v1 graph wrapper never sets it: no task group is captured, every replay reuses
#: the capture's sequence lengths. Stock runs to its end with other tokens than eager's.
V2_FLAG_STALE = (
    "wrong: VLLM_USE_V2_MODEL_RUNNER on the v1 fallback: attention never takes its graph path "
    "during capture, so every replay reuses the capture's sequence lengths"
)
#: What the overlay's start-up ends with there (the message, wrapped by the runner).
STALE_GRAPH_ERROR = "the target FULL graph of size 4 is stale"

STALE_CASE = _qwen3(
    "qwen3/compile/decode-only/v2-flag",
    environment=V2_FLAG,
    stock=V2_FLAG_STALE,
    overlay_error=STALE_GRAPH_ERROR,
)
#: The negative control of the stale-graph check: told to keep stock's behaviour, the overlay
#: lets the stale graphs replay and gives stock's wrong tokens (the control arm runs it alone).
STALE_REPLAY_CASE = _qwen3(
    "qwen3/compile/decode-only/v2-flag/stale-replay",
    environment={**V2_FLAG, STALE_GRAPH_VAR: "replay"},
    stock=V2_FLAG_STALE,
)
#: Cases only the negative control's arm runs.
CONTROL_ONLY_CASES: tuple[Case, ...] = (STALE_REPLAY_CASE,)

# --- end of stale graphs ----------------------------------------------------------------------

# --- model runner v2 on the real engine, by opt-in repairs (repairs.py: v2-model-runner) --------

#: The repair that runs the release's own v2 runner on vLLM 0.23.0 (which it does not support).
V2_REPAIR = "v2-model-runner"


def _v2(case: Case, **changes: Any) -> Case:
    """``case`` on model runner v2: the variable set in its process and the repair named."""
    return dataclasses.replace(
        case,
        name=f"{case.name}/v2",
        environment={**case.environment, **V2_FLAG},
        repairs=(*case.repairs, V2_REPAIR),
        **{"stock": "ok", **changes},
    )


#: Qwen3 (FIA) on v2, FULL_DECODE_ONLY sizes 1, 2, 4 (the seed's MRV2 FIA row): in the suite.
V2_QWEN3 = _v2(_qwen3("qwen3/compile/decode-only"))
#: The other v2 cases (``OPTIONAL_CASES``: run by name, results in docs/v2.md).
V2_OPTIONAL_CASES: tuple[Case, ...] = (
    # DeepSeek-V3 (MLA target graphs).
    _v2(Case("deepseek-v3/compile/decode-only", model="deepseek_v3")),
    # Gemma4 (sliding FIA layers and 512-dim global layers): on v1 the global layers capture PA
    # and stock's update crashes on them; on v2 every layer captures FIA (the release's dummy
    # capture batch loses its DecodeOnly state: docs/v2.md) and stock runs right.
    _v2(Case("gemma4/compile/decode-only", model="gemma4", engine={"language_model_only": True})),
    # Qwen3 with its EAGLE3 draft: draft prefill graphs owned; the draft decode graph (upstream's
    # manager, never updated) refused, its stale replays lowering the acceptance in every graph
    # arm (tokens equal: speculative decoding is lossless).
    _v2(
        _qwen3(
            "qwen3+eagle3/compile/decode-only",
            draft="qwen3_eagle3",
            num_speculative_tokens=2,
            capture_sizes=(3, 6, 12),
        )
    ),
)

# --- end of model runner v2 -------------------------------------------------------------------


#: The engine tests' graph cases (every graph arm runs all of them).
CASES: tuple[Case, ...] = (
    _qwen3("qwen3/compile/decode-only"),
    _qwen3("qwen3/compile/decode-only/mp", multiprocess=True),
    _qwen3("qwen3/compile/full", cudagraph_mode="FULL"),
    _qwen3(
        "qwen3+eagle3/compile/decode-only",
        draft="qwen3_eagle3",
        num_speculative_tokens=2,
        capture_sizes=(3, 6, 12),
    ),
    _qwen3("qwen3+pa/compile/decode-only", pa_shape_list=(1, 4)),
    _mtp(
        # Step3.5 with its two MTP layers: vllm-ascend's AscendStep3p5MTPProposer, each MTP layer
        # in a KV-cache group of its own (the one multi-group draft on this release). As
        # released, the proposer's first FULL-graph draft step fails (a stale call: repairs.py).
        "step3p5+mtp/compile/decode-only",
        "step3p5",
        2,
        stock=STEP3P5_PAD_CRASH,
        overlay_same_as_stock=True,
    ),
    _mtp(
        # The same engine with that one call repaired: the draft graphs replay.
        "step3p5+mtp/compile/decode-only/repaired",
        "step3p5",
        2,
        repairs=("step3p5-pad-call",),
    ),
    # DeepSeek-V3 (MLA, a dense and a MoE layer with grouped routing): AscendMLAImpl's graphs,
    # alone and with its MTP layer as the draft (vllm-ascend's MTP proposer), k = 2 (k = 1, the
    # tutorials' setting, is in ``make ab``'s default set and the optional cases).
    Case("deepseek-v3/compile/decode-only", model="deepseek_v3"),
    _mtp("deepseek-v3+mtp/k2/compile/decode-only", "deepseek_v3", 2),
    # DeepSeek-V3 with long prompts prefilled in chunks of 32 tokens beside running decodes
    # (issue 33, item 6): each later chunk attends to its prompt's earlier chunks through
    # AscendMLAImpl's context path (build_chunked_metadata, npu_paged_cache_load, FIA per
    # context chunk, npu_attention_update), and the decode graphs read what the chunks wrote.
    Case(
        "deepseek-v3/chunked-prefill/compile/decode-only",
        model="deepseek_v3",
        chunk_tokens=32,
        dtype="bfloat16",
    ),
    Case(
        "llama-sliding+pa/compile/decode-only",
        model="llama_sliding",
        pa_shape_list=(1, 2, 4),
        stock="crash: ValueError: too many values to unpack (expected 9)",
    ),
    Case(
        "gemma4/compile/decode-only",
        model="gemma4",
        engine={"language_model_only": True},
        stock="crash: ValueError: not enough values to unpack (expected 22, got 9)",
    ),
    Case(
        # Gemma4 with its MTP draft ("gemma4_assistant" checkpoints, vLLM's gemma4_mtp).
        "gemma4+mtp/compile/decode-only",
        model="gemma4",
        engine={"language_model_only": True},
        draft="gemma4_assistant",
        draft_method="mtp",
        num_speculative_tokens=1,
        startup_error=GEMMA4_MTP_ERROR,
    ),
    _qwen3(
        "qwen3/none/decode-only",
        compilation_mode=NONE,
        stock=MODE_NONE_CRASH,
        overlay_same_as_stock=True,
    ),
    # VLLM_USE_V2_MODEL_RUNNER set: stock's graphs are stale (wrong tokens), the overlay refuses
    # to start with them (the stale-graph block below)
    STALE_CASE,
    # The same variable with the v2-model-runner repair: the release's own v2 runner runs.
    V2_QWEN3,
)


#: Cases the negative control runs (relaunch skipped: tokens must differ from eager).
CONTROL_CASES: tuple[str, ...] = (
    "qwen3/compile/decode-only",
    "qwen3+eagle3/compile/decode-only",
    "gemma4/compile/decode-only",
    "step3p5+mtp/compile/decode-only/repaired",
    "deepseek-v3/compile/decode-only",
    "deepseek-v3+mtp/k2/compile/decode-only",
    "deepseek-v3/chunked-prefill/compile/decode-only",
    V2_QWEN3.name,
)


# --------------------------------------------------------------------------------------------
# Qwen3.5: Gated DeltaNet linear-attention layers between gated full-attention layers, with its
# MTP layer as the draft (vLLM's Qwen3_5MTP through vllm-ascend's Eagle proposer). The GDN layers
# capture no updatable task; their metadata keys sit after the attention keys in
# ``attn_metadata`` (model_runner_v1.py:4923). ``max_num_batched_tokens`` 20 chunks a long
# prompt beside running decodes (each decode step takes k + 1 = 2 tokens per request). With 16
# or 24, one prompt's last chunk is exactly k + 1 tokens, which the release folds into the
# speculative path from the wrong state slot (docs/engine.md): eager and graphs alike differ from
# transformers there, so those budgets would hide nothing the graph tests look at, but the
# whole-model oracle would fail on the release's fold rather than on the references.

QWEN35_ENGINE: dict[str, Any] = {"language_model_only": True, "max_num_batched_tokens": 20}

#: Stock's FIA update with ``method == "mtp"`` sorts every ``layers.N.self_attn.attn`` key, the
#: MTP layer's (``mtp.layers.0``, number 0) included, and zips them with the target's tasks by
#: position: every task reads the key before its own. Where the attention layers span two
#: KV-cache groups, layer 3 replays with layer 1's group's block table.
QWEN35_TWO_GROUPS_WRONG = (
    "wrong: layer 3's FIA task is updated with the MTP key's (the other KV group's) block table"
)

QWEN35_CASES: tuple[Case, ...] = (
    _mtp(
        "qwen3.5+mtp/k1/compile/decode-only",
        "qwen3_5",
        1,
        engine=QWEN35_ENGINE,
    ),
    _mtp(
        "qwen3.5-two-groups+mtp/k1/compile/decode-only",
        "qwen3_5_two_groups",
        1,
        engine=QWEN35_ENGINE,
        stock=QWEN35_TWO_GROUPS_WRONG,
    ),
)
CASES = CASES + QWEN35_CASES
CONTROL_CASES = (*CONTROL_CASES, "qwen3.5+mtp/k1/compile/decode-only")

#: Engine cases outside the engine tests' arms (they would cost the suite minutes), run by
#: ``ab --scenarios NAME`` and ``python -m torch_npu_sim.engine.arms --cases NAME``.
OPTIONAL_CASES: tuple[Case, ...] = (
    *V2_OPTIONAL_CASES,
    # DeepSeek-V3 with its MTP layer at k = 1 (the suite runs k = 2, which drafts twice a step;
    # ``make ab``'s default set runs this one on every arm).
    _mtp("deepseek-v3+mtp/k1/compile/decode-only", "deepseek_v3", 1),
    # Qwen3.5 with two speculative tokens: the one MTP layer drafts twice per step (the draft's
    # second step replays the drafter's own FULL graph with the first step's output).
    _mtp(
        "qwen3.5+mtp/k2/compile/decode-only",
        "qwen3_5",
        2,
        engine=QWEN35_ENGINE,
    ),
    # Qwen3.5-MoE (routed experts, softmax top 2 of 4, a gated shared expert in every layer),
    # 3:1, with its MTP layer (vLLM's Qwen3_5MoeMTP).
    _mtp(
        "qwen3.5-moe+mtp/k1/compile/decode-only",
        "qwen3_5_moe",
        1,
        engine=QWEN35_ENGINE,
    ),
)
ALL_CASES: tuple[Case, ...] = CASES + OPTIONAL_CASES
#: The optional cases the negative control runs when they are chosen (never in the tests' arms).
OPTIONAL_CONTROL_CASES: tuple[str, ...] = tuple(case.name for case in OPTIONAL_CASES)


def eager_cases(cases: tuple[Case, ...] = CASES) -> tuple[Case, ...]:
    """One eager reference per distinct model (and draft)."""
    seen: dict[str, Case] = {}
    for case in cases:
        seen.setdefault(case.reference, case.eager())
    return tuple(seen.values())


# --- async scheduling (issue 36): the race detector's cases ----------------------------------
#: vLLM's async scheduling: the host prepares step i+1 while step i's device work may still run
#: (the sampled tokens are copied on their own stream and read by an output thread). Stock's
#: replay barrier is what orders its task updates after the previous replay there; with the
#: barrier removed (``barrier``, arm ``nobarrier``) the race detector must count the updates.
ASYNC = {"async_scheduling": True}

ASYNC_CASES: tuple[Case, ...] = (
    _qwen3("qwen3/compile/decode-only/async", engine=ASYNC),
    _qwen3("qwen3+pa/compile/decode-only/async", pa_shape_list=(1, 4), engine=ASYNC),
    Case(
        "gemma4/compile/decode-only/async",
        model="gemma4",
        engine={"language_model_only": True, **ASYNC},
        stock="crash: ValueError: not enough values to unpack (expected 22, got 9)",
    ),
    _mtp("deepseek-v3+mtp/k1/compile/decode-only/async", "deepseek_v3", 1, engine=ASYNC),
    _qwen3(
        "qwen3+eagle3/compile/decode-only/async",
        draft="qwen3_eagle3",
        num_speculative_tokens=2,
        capture_sizes=(3, 6, 12),
        engine=ASYNC,
    ),
    # the hybrid: Gated DeltaNet layers (no task) among the attention layers, with its MTP draft
    _mtp(
        "qwen3.5+mtp/k1/compile/decode-only/async",
        "qwen3_5",
        1,
        engine={**QWEN35_ENGINE, **ASYNC},
    ),
)
ALL_CASES = ALL_CASES + ASYNC_CASES
#: The engine tests run the first (stock, overlay and verify: no race, tokens equal eager's) ...
CASES = (*CASES, ASYNC_CASES[0])
#: ... and, in the negative control's arm, the same engine without stock's replay barrier
#: (``barrier``; named, not imported): the detector must count the updates and records.
NO_BARRIER_CASE = dataclasses.replace(
    ASYNC_CASES[0],
    name="qwen3/compile/decode-only/async/no-barrier",
    environment={"TORCH_NPU_SIM_TEST_NO_REPLAY_BARRIER": "1"},
)
CONTROL_ONLY_CASES = (*CONTROL_ONLY_CASES, NO_BARRIER_CASE)
#: The overlay's opt-in stream-ordered replay on the same engine (its setting in the case's
#: process: the overlay reads it when vllm-ascend loads there): no race, tokens equal eager's ...
STREAM_ORDER_CASE = dataclasses.replace(
    ASYNC_CASES[0],
    name="qwen3/compile/decode-only/async/stream-order",
    environment={"ASCEND_GRAPH_PATCH_REPLAY_SYNC": "stream"},
)
#: ... and its negative control, with the overlay's wait dropped (``order_wait``): races counted.
STREAM_NO_WAIT_CASE = dataclasses.replace(
    STREAM_ORDER_CASE,
    name="qwen3/compile/decode-only/async/stream-order/no-wait",
    environment={**STREAM_ORDER_CASE.environment, "TORCH_NPU_SIM_TEST_NO_ORDER_WAIT": "1"},
)
#: Cases only the overlay's arm runs (a setting of the overlay's, on one engine it already runs).
OVERLAY_ONLY_CASES: tuple[Case, ...] = (STREAM_ORDER_CASE, STREAM_NO_WAIT_CASE)
ALL_CASES = (*ALL_CASES, *OVERLAY_ONLY_CASES)


# --- Qwen3-Next (optional cases) --------------------------------------------------------------
# Qwen3-Next (``Qwen3NextForCausalLM``, ``engine/qwen3_next_model.py``): Gated DeltaNet layers
# with the fused, interleaved ``in_proj_qkvz`` / ``in_proj_ba`` projections, gated full
# attention with partial plain RoPE, a sparse MoE block with a gated shared expert in every
# layer, alone and with its MTP layer as the draft (vLLM's ``Qwen3NextMTP``). Outside the engine
# tests' arms (their time budget): run by name. The prompts are chunked beside running decodes
# as Qwen3.5's are (``max_num_batched_tokens`` 20: no chunk is ``k + 1`` tokens). Besides the two
# asked for (without and with MTP, k = 1): k = 2, the L, F, L, F layout whose attention layers
# span two KV-cache groups (stock silently wrong there, as on Qwen3.5: ``QWEN35_TWO_GROUPS_WRONG``),
# async scheduling, bfloat16 weights (what the released checkpoints hold), other GDN shapes
# (``qwen3_next_model.QWEN3_NEXT_WIDE``) and tensor parallelism 2.

QWEN3_NEXT_ENGINE: dict[str, Any] = {"max_num_batched_tokens": 20}

QWEN3_NEXT_CASES: tuple[Case, ...] = (
    Case("qwen3-next/compile/decode-only", model="qwen3_next", engine=QWEN3_NEXT_ENGINE),
    _mtp("qwen3-next+mtp/k1/compile/decode-only", "qwen3_next", 1, engine=QWEN3_NEXT_ENGINE),
    _mtp("qwen3-next+mtp/k2/compile/decode-only", "qwen3_next", 2, engine=QWEN3_NEXT_ENGINE),
    _mtp(
        "qwen3-next-two-groups+mtp/k1/compile/decode-only",
        "qwen3_next_two_groups",
        1,
        engine=QWEN3_NEXT_ENGINE,
        stock=QWEN35_TWO_GROUPS_WRONG,
    ),
    _mtp(
        "qwen3-next+mtp/k1/compile/decode-only/async",
        "qwen3_next",
        1,
        engine={**QWEN3_NEXT_ENGINE, "async_scheduling": True},
    ),
    _mtp(
        "qwen3-next+mtp/k1/compile/decode-only/bf16",
        "qwen3_next",
        1,
        engine=QWEN3_NEXT_ENGINE,
        dtype="bfloat16",
    ),
    _mtp(
        "qwen3-next-wide+mtp/k1/compile/decode-only",
        "qwen3_next_wide",
        1,
        engine=QWEN3_NEXT_ENGINE,
    ),
    # Tensor parallelism 2 (spawned workers, engine core in the arm's process as ``tp.py``'s spawn
    # case): each rank holds one key and two value GDN heads, one KV head, half of each expert.
    # Its eager reference shares the k = 1 case's name: run alone, the eager arm runs it at TP=2;
    # beside that case, one eager engine serves both (measured: TP=2 eager gives TP=1's tokens).
    _mtp(
        "qwen3-next+mtp/k1/tp2/compile/decode-only",
        "qwen3_next",
        1,
        engine={**QWEN3_NEXT_ENGINE, "tensor_parallel_size": 2},
        environment={"VLLM_WORKER_MULTIPROC_METHOD": "spawn"},
    ),
)
OPTIONAL_CASES = (*OPTIONAL_CASES, *QWEN3_NEXT_CASES)
OPTIONAL_CONTROL_CASES = (*OPTIONAL_CONTROL_CASES, *(case.name for case in QWEN3_NEXT_CASES))
ALL_CASES = (*ALL_CASES, *QWEN3_NEXT_CASES)

# --- end of Qwen3-Next ------------------------------------------------------------------------


# --- MLA variants beside DeepSeek-V3 (engine/deepseek_v2_model.py; docs/engine.md) -----------
#: Optional cases (the suite is at its time budget): ``python -m torch_npu_sim.engine.arms
#: --cases NAME``. DeepSeek-V2-Lite: no query LoRA (``q_proj``), softmax greedy routing;
#: Moonlight: a ``DeepseekV3ForCausalLM`` without query LoRA, sigmoid routing in one group.
MLA_VARIANT_CASES: tuple[Case, ...] = (
    Case("deepseek-v2-lite/compile/decode-only", model="deepseek_v2_lite"),
    Case("moonlight/compile/decode-only", model="moonlight"),
    Case("kimi-k2/compile/decode-only", model="kimi_k2"),
    Case("glm-4.7-flash/compile/decode-only", model="glm47_flash"),
    # V2-Lite with the YaRN rope its real config ships (mscale 0.707 in the softmax scale).
    Case("deepseek-v2-lite-yarn/compile/decode-only", model="deepseek_v2_lite_yarn"),
    # DeepSeek-V2 (full): group-limited greedy softmax routing, no correction bias. The release's
    # fused router ranks groups by their top-2 sum, not their best score (docs/engine.md).
    Case("deepseek-v2/compile/decode-only", model="deepseek_v2"),
    # GLM-4.7-Flash with its MTP layer as the draft (a guesser), k = 1.
    _mtp("glm-4.7-flash+mtp/k1/compile/decode-only", "glm47_flash_mtp", 1),
    # V2-Lite's long prompts prefilled in chunks of 32 tokens beside running decodes (bfloat16,
    # as DeepSeek-V3's chunked case: the context path's FIA needs it): each later chunk's plain
    # q_proj query attends to the earlier chunks' latents through AscendMLAImpl's context path.
    Case(
        "deepseek-v2-lite/chunked-prefill/compile/decode-only",
        model="deepseek_v2_lite",
        chunk_tokens=32,
        dtype="bfloat16",
    ),
)
OPTIONAL_CASES = (*OPTIONAL_CASES, *MLA_VARIANT_CASES)
ALL_CASES = (*ALL_CASES, *MLA_VARIANT_CASES)
OPTIONAL_CONTROL_CASES = (*OPTIONAL_CONTROL_CASES, *(c.name for c in MLA_VARIANT_CASES))
# --- end of MLA variants ----------------------------------------------------------------------
