"""Aspects for model runner v2 (`VLLM_USE_V2_MODEL_RUNNER`): graph managers and the graph context.

Empty until the v2 work lands; listed separately so the v1 registry stays readable.
"""

from __future__ import annotations

from ascend_graph_patch.aspects.spec import Aspect

V2_ASPECTS: tuple[Aspect, ...] = ()
