"""ascend-graph-patch: graph-owned ACL graph task updates for vllm-ascend, as an opt-in overlay."""

__version__ = "0.1.0"
