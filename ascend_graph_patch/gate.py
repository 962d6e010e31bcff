"""The compatibility gate: install nothing unless the host is a line we know, seam by seam.

Runs when an aspect group's modules have loaded and before any of its wrappers is installed. The
checks are derived, not listed: every seam an aspect of the group names must resolve (with the
parameters the line records for it), then the line's fingerprints for the group must hold. A
refusal leaves the stock path untouched and says, in one warning, which check failed;
``ASCEND_GRAPH_PATCH_FORCE=1`` installs anyway (with a warning), for trying a near-miss version.
"""

from __future__ import annotations

from dataclasses import dataclass

from ascend_graph_patch.aspects import present
from ascend_graph_patch.lines import LINES, Line, installed_version
from ascend_graph_patch.lines.base import Check


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


def installed_versions() -> tuple[str | None, str | None]:
    """(vllm-ascend, vllm) as installed."""
    ascend = installed_version("vllm_ascend") or installed_version("vllm-ascend")
    return ascend, installed_version("vllm")


def select_line(lines: tuple[Line, ...] | None = None) -> Line | None:
    """The line matching the installed versions, or None."""
    lines = LINES if lines is None else lines
    ascend, vllm = installed_versions()
    return next(
        (ln for ln in lines if ascend in ln.vllm_ascend_versions and vllm in ln.vllm_versions),
        None,
    )


def candidate_line(lines: tuple[Line, ...] | None = None) -> Line:
    """The line whose seams the hooks wait for: the matching one, else the newest we know."""
    lines = LINES if lines is None else lines
    return select_line(lines) or lines[-1]


def checks(line: Line, group: str) -> list[Check]:
    """What must hold for ``group`` on ``line``: each aspect's seam (those the line has), then
    the fingerprints."""
    found: list[Check] = []
    for aspect in present(line):
        if aspect.group != group:
            continue
        seam = line.seams[aspect.seam]
        if seam.params is None:
            found.append(Check("resolves", seam.module, seam.qualname))
        else:
            found.append(Check("signature", seam.module, seam.qualname, seam.params))
    return found + list(line.fingerprints.get(group, ()))


def check(group: str, *, force: bool = False, lines: tuple[Line, ...] | None = None) -> Verdict:
    """Pick the line matching the installed versions, then run that line's checks for ``group``."""
    lines = LINES if lines is None else lines
    ascend, vllm = installed_versions()
    line = select_line(lines)
    if line is None:
        known = "; ".join(
            f"{ln.name}: vllm-ascend {'/'.join(sorted(ln.vllm_ascend_versions))} with vllm "
            f"{'/'.join(sorted(ln.vllm_versions))}"
            for ln in lines
        )
        reason = f"unsupported versions: vllm-ascend {ascend}, vllm {vllm} (supported: {known})"
        if force:
            return Verdict(True, reason, lines[-1], forced=True)
        return Verdict(False, reason)
    for item in checks(line, group):
        failure = item.run()
        if failure is not None:
            reason = f"seam drift ({item.describe()}): {failure}"
            if force:
                return Verdict(True, reason, line, forced=True)
            return Verdict(False, reason, line)
    return Verdict(True, f"vllm-ascend {ascend} with vllm {vllm} (line {line.name})", line)
