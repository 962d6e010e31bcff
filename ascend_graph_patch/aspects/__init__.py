"""The aspect table: every wrapper the overlay installs, one entry each, as data.

Each entry names its seam by key (the release line says where that is), its group (installed only
when all the group's modules have loaded and the gate passed), the modes that need it, why it
exists, and when it can go: like vllm-ascend's own patch registry, what, why, how, and until
when. Every one of them goes once upstream's UpdatableGraph (RFC 13058) lands for the line; some
can go sooner, and say so.
"""

from __future__ import annotations

from dataclasses import dataclass

from ascend_graph_patch.lines.base import Line

ON, OBSERVE, VERIFY = "on", "observe", "verify"
ALL_MODES = frozenset({ON, OBSERVE, VERIFY})
UPSTREAM = "upstream's UpdatableGraph (RFC 13058: graphs own their tasks) lands for the line"


@dataclass(frozen=True)
class Aspect:
    name: str
    group: str
    seam: str  # key into the line's seams
    wrapper: str  # "ascend_graph_patch.aspects.<module>:<function>"
    why: str
    removable_when: str = UPSTREAM
    modes: frozenset[str] = ALL_MODES


_A = "ascend_graph_patch.aspects"

ASPECTS: tuple[Aspect, ...] = (
    # --- model runner v1 (target graphs and merged MTP / Eagle draft graphs) ---
    Aspect(
        "capture.v1",
        "v1",
        "acl_graph.call",
        f"{_A}.capture:acl_graph_call",
        "know which FULL graph (role, batch descriptor) is being captured; own it afterwards",
    ),
    Aspect(
        "attention.fia",
        "v1",
        "attention.full_graph_fia",
        f"{_A}.attention:fia_task",
        "register the FIA task group the stock capture just created",
    ),
    Aspect(
        "attention.fia_v2",
        "v1",
        "attention.full_graph_fia_v2",
        f"{_A}.attention:fia_v2_task",
        "register the FIA-v2 (sinks) task group the stock capture just created",
    ),
    Aspect(
        "attention.pa",
        "v1",
        "attention.full_graph_pa",
        f"{_A}.attention:pa_task",
        "register the PA task group the stock capture just created",
    ),
    Aspect(
        "attention.ran",
        "v1",
        "attention.forward",
        f"{_A}.stale:attention_ran",
        "note which attention impls ran in a FULL capture, so a graph whose attention ran "
        "outside its graph path (no task group: stale at every replay) never replays silently",
        "every attention path of the line captures its task group whenever a FULL graph is "
        "captured (the capture flag is one attribute both runners set and attention reads)",
    ),
    Aspect(
        "attention.ran_c8",
        "v1",
        "attention.forward_c8",
        f"{_A}.stale:attention_ran",
        "the same note for INT8-KV layers (AscendC8AttentionBackendImpl takes its graph path in "
        "a forward of its own, which never calls the base's)",
        "as attention.ran",
    ),
    Aspect(
        "replay.update",
        "v1",
        "attention.update_graph_params",
        f"{_A}.replay:update_graph_params",
        "update owned graphs from their own tasks; everything else goes to stock",
    ),
    # --- MLA (DeepSeek V3 / R1, Kimi K2, GLM-4.7-Flash and their MTP drafts): its own capture
    # and update seams; graph capture and replay are v1's wrappers, so the group adds two ---
    Aspect(
        "attention.mla",
        "mla",
        "mla.forward_decode",
        f"{_A}.attention:mla_task",
        "register the MLA task group the stock decode capture just created",
    ),
    Aspect(
        "replay.mla",
        "mla",
        "mla.update_graph_params",
        f"{_A}.replay:update_graph_params",
        "update owned MLA graphs from their own tasks; everything else goes to stock",
    ),
    # --- model runner v2 (VLLM_USE_V2_MODEL_RUNNER); attention and update seams are v1's ---
    Aspect(
        "capture.v2.graph",
        "v2",
        "v2.graph_context",
        f"{_A}.capture_v2:graph_context",
        "one capture scope per FULL graph (args[0]); must be wrapped before torch_cuda_wrapper "
        "copies it into torch.cuda.graph at runner init",
    ),
    Aspect(
        "capture.v2.model",
        "v2",
        "v2.model.capture",
        f"{_A}.capture_v2:manager_capture",
        "target capture session; graphs keyed by BatchExecutionDescriptor (manager.graphs)",
    ),
    Aspect(
        "replay.v2.model",
        "v2",
        "v2.model.run_fullgraph",
        f"{_A}.capture_v2:run_fullgraph",
        "v2 updates run with batch_descriptor=None: name (role, desc) for the update seam",
        "the v2 update passes the replayed descriptor to update_full_graph_params",
    ),
    Aspect(
        "capture.v2.draft_prefill",
        "v2",
        "v2.prefill.capture",
        f"{_A}.capture_v2:manager_capture",
        "draft prefill capture session",
    ),
    Aspect(
        "replay.v2.draft_prefill",
        "v2",
        "v2.prefill.run_fullgraph",
        f"{_A}.capture_v2:run_fullgraph",
        "name (draft_prefill, desc) for the update seam",
        "the v2 update passes the replayed descriptor to update_full_graph_params",
    ),
    Aspect(
        "capture.v2.draft_decode",
        "v2",
        "v2.decode.capture",
        f"{_A}.capture_v2:decode_capture",
        "upstream draft decode graphs: left to stock, refused per graph with the reason",
        "vllm-ascend replaces upstream's draft decode graph manager with one that updates",
    ),
)


# A group installs only over the groups it builds on, checked first: MLA and model runner v2 add
# seams to v1's capture, attention and update wrappers, so without v1 they would own nothing (and a
# refusal of v1, a drifted seam or an unsupported version, is one warning line, not one per group).
NEEDS: dict[str, tuple[str, ...]] = {"mla": ("v1",), "v2": ("v1",)}


def present(line: Line) -> tuple[Aspect, ...]:
    """The aspects whose seam ``line`` has (a release may declare a seam absent)."""
    return tuple(aspect for aspect in ASPECTS if line.has(aspect.seam))


def groups(line: Line) -> dict[str, tuple[str, ...]]:
    """Aspect group -> the modules (from ``line``'s seams) that must load before it installs."""
    out: dict[str, tuple[str, ...]] = {}
    for aspect in present(line):
        module = line.seams[aspect.seam].module
        mods = out.setdefault(aspect.group, ())
        if module not in mods:
            out[aspect.group] = (*mods, module)
    return out


__all__ = [
    "ALL_MODES",
    "ASPECTS",
    "OBSERVE",
    "ON",
    "UPSTREAM",
    "VERIFY",
    "Aspect",
    "NEEDS",
    "groups",
    "present",
]
