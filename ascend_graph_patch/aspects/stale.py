"""No silently stale graph: a FULL capture in which attention ran outside its graph path fails.

Why. An attention impl that captures task groups (FIA, FIA v2, PA, MLA decode) takes its graph
path only when the capture flag it reads says so; otherwise it launches its op as in eager mode,
with the host-side sequence lengths of the capture's dummy batch frozen into the launch, and
records no task group. Nothing can update such a launch: every replay reuses those lengths and the
tokens are wrong, silently, with stock and with the overlay alike (which would own the graph with
no task, or refuse it to stock). vllm-ascend 0.23.0.post1 does exactly that when
``VLLM_USE_V2_MODEL_RUNNER`` is set on vLLM 0.23.0: it falls back to the v1 runner, whose graph
wrapper sets the flag where attention, with the variable set, never reads it.

How. The attention forward of the impls that capture (``AscendAttentionBackendImpl.forward``)
notes its impl in the capture scope (one context-variable read outside a capture); MLA's decode
calls are noted by the attention aspect already, taken or not. As the capture ends, every impl
noted must have appended a task group in this capture; one that did not makes the graph stale.
The engine's start-up then fails with one error naming the layers, the cause where the release
line knows it, and the way out. ``ASCEND_GRAPH_PATCH_STALE_GRAPH=replay`` keeps stock's behaviour
instead: the graph is refused with the reason (``status``) and replays as stock's would. The error
is raised on every rank alike (each captures the same graphs), and the executor reads every
worker's reply while the engine starts, so it reaches the user as the exception itself.

It never fires where attention legitimately leaves no task: PIECEWISE graphs (no capture scope),
a graph holding an impl the line leaves to stock (refused before this check), graphs whose layers
are all linear attention (GDN: no impl of ours ran), impls that ran in the capture and captured
their group; nor when the capture's notes are incomplete (the scope failed while capturing).
"""

from __future__ import annotations

from typing import Any

from vllm.forward_context import get_forward_context

from ascend_graph_patch import fail_fast, settings, state
from ascend_graph_patch.aspects import scope as shared
from ascend_graph_patch.aspects.attention import layer_names

#: Layers a message names before it says how many more there are.
NAMED = 3


class StaleGraph(RuntimeError):
    """A FULL graph ran attention outside its graph path while captured: replays would be wrong.

    Raised past the aspects' containment, out of the capture, so the engine does not start."""


def attention_ran(wrapped: Any, instance: Any, args: tuple, kwargs: dict) -> Any:
    """``AscendAttentionBackendImpl.forward``: inside a FULL capture, note that this impl ran."""
    scope = shared.CURRENT_SCOPE.get()
    if scope is not None:
        scope.ran[id(instance)] = instance
    return wrapped(*args, **kwargs)


def _grown(scope: shared.CaptureScope) -> dict[Any, int]:
    """Size -> the task groups this capture appended under it (to any ``GraphParams``)."""
    grown: dict[Any, int] = {}
    for params, before in zip(scope.graph_params, scope.lengths_before, strict=False):
        if params is None:
            continue
        for num_tokens, groups in params.handles.items():
            added = len(groups) - before.get(num_tokens, 0)
            if added:
                grown[num_tokens] = grown.get(num_tokens, 0) + added
    return grown


def stale_impls(scope: shared.CaptureScope) -> list[Any]:
    """The impls that ran attention in this capture without appending a task group of it.

    An FIA / PA capture call is made on the graph path only; an MLA decode call is noted either
    way, and took the graph path where its size's lists grew, one group a call. The rule judges
    only a capture its notes account for: where the groups appended under a size are neither none
    nor one per noted call, or appear under a size no call was noted for (an op the overlay does
    not register, an aspect disabled), an impl without a note may own one of them, and the
    ownership rules leave the graph to stock with their reason. Consumes the notes of impls that
    ran (a v2 graph's scope is closed twice)."""
    ran, scope.ran = scope.ran, {}
    if not ran and not scope.calls:
        return []
    noted: dict[Any, int] = {}
    for call in scope.calls:
        noted[call[2]] = noted.get(call[2], 0) + 1
        ran.setdefault(id(call[1]), call[1])
    grown = _grown(scope)
    if any(grown.get(n, 0) not in (0, calls) for n, calls in noted.items()) or any(
        n not in noted for n in grown
    ):
        return []
    captured = {id(impl) for _, impl, size, _ in scope.calls if grown.get(size)}
    return [impl for key, impl in ran.items() if key not in captured]


def _layers(scope: shared.CaptureScope, impls: list[Any]) -> list[str]:
    layers = scope.layers
    if layers is None:
        try:
            layers = get_forward_context().no_compile_layers
        except Exception:  # no forward context (a harness): name the impls' classes instead
            layers = {}
    names = layer_names(layers)
    return [names.get(id(impl)) or f"a {type(impl).__name__}" for impl in impls]


def describe(scope: shared.CaptureScope, impls: list[Any], runner: str) -> str:
    """One line: which graph, which layers, what a replay would do, the cause, the way out."""
    assert shared.ACTIVE is not None
    graph = scope.graph
    size = getattr(graph.descriptor, "num_tokens", None)
    which = f"the {graph.role} FULL graph" + (f" of size {size}" if size is not None else "")
    layers = _layers(scope, impls)
    named = ", ".join(layers[:NAMED]) + (
        f" and {len(layers) - NAMED} more" if len(layers) > NAMED else ""
    )
    cause = shared.ACTIVE.line.stale_cause(runner) or (
        "the attention read the capture flag as false while the graph was being captured"
    )
    return (
        f"{which} is stale: {len(impls)} attention layer(s) ({named}) ran during its capture "
        "without taking their graph path (no task group captured), so every replay would reuse "
        f"the capture's sequence lengths and give wrong tokens; cause: {cause}"
    )


def check(scope: shared.CaptureScope, runner: str) -> None:
    """As the capture ends: raise :class:`StaleGraph` if an impl that ran captured no task group
    (told ``replay``: refuse the graph with the reason instead, as stock would replay it)."""
    impls = stale_impls(scope)
    if not impls:
        return
    state.count("graphs.stale")
    reason = describe(scope, impls, runner)
    if settings.stale_graph() == settings.STALE_REPLAY:
        scope.fail(reason)
        state.warn_once(
            f"stale-replay:{scope.graph.role}",
            f"{reason}; {settings.ENV_STALE_GRAPH}=replay: it replays as stock's would",
        )
        return
    message = (
        f"{reason}. Not starting the engine with it ({settings.ENV_STALE_GRAPH}=replay keeps "
        "stock's behaviour: the graph replays, with those lengths)"
    )
    error = StaleGraph(message)
    fail_fast.record(error, scope.graph.role, scope.graph.descriptor, "capture: stale graph")
    state.warn_once(f"stale:{scope.graph.role}", message)
    raise error
