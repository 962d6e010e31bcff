"""The compatibility gate: install nothing unless the host is a line we know, seam by seam.

Runs when an aspect group's modules have loaded and before any of its wrappers is installed. A
refusal leaves the stock path untouched and says, in one warning, which check failed;
`ASCEND_GRAPH_PATCH_FORCE=1` installs anyway (with a warning), for trying a near-miss version.
"""

from __future__ import annotations

from dataclasses import dataclass

from ascend_graph_patch.lines import LINES, Line, installed_version


@dataclass(frozen=True)
class Verdict:
    ok: bool
    reason: str
    line: Line | None = None
    forced: bool = False

    @property
    def label(self) -> str:
        if self.forced:
            return "forced"
        return "supported" if self.ok else "refused"


def check(group: str, *, force: bool = False) -> Verdict:
    """Pick the line matching the installed versions, then run that line's checks for `group`."""
    ascend = installed_version("vllm_ascend") or installed_version("vllm-ascend")
    vllm = installed_version("vllm")
    line = next(
        (ln for ln in LINES if ascend in ln.vllm_ascend_versions and vllm in ln.vllm_versions),
        None,
    )
    if line is None:
        reason = f"unsupported versions: vllm-ascend {ascend}, vllm {vllm}"
        known = "; ".join(
            f"{ln.name}: vllm-ascend {'/'.join(sorted(ln.vllm_ascend_versions))} with vllm "
            f"{'/'.join(sorted(ln.vllm_versions))}"
            for ln in LINES
        )
        reason += f" (supported: {known})"
        if force:
            return Verdict(True, reason, LINES[-1], forced=True)
        return Verdict(False, reason)
    for item in line.checks.get(group, ()):
        failure = item.run()
        if failure is not None:
            reason = f"seam drift ({item.describe()}): {failure}"
            if force:
                return Verdict(True, reason, line, forced=True)
            return Verdict(False, reason, line)
    return Verdict(True, f"vllm-ascend {ascend} with vllm {vllm} (line {line.name})", line)
