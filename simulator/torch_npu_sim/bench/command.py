"""``ascend-graph-patch bench``: host cost per replay step, stock vs overlay vs floor (simulator).

Prints microseconds per step and the ratios against the targets (overlay <= 0.5x stock and
<= 1.3x floor; capture <= 1.05x stock; start-up with the toggle off <= 1 ms). The targets are
reported, never asserted: timing belongs in a report, not in a test.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from dataclasses import asdict
from pathlib import Path
from typing import Any

from ascend_graph_patch import argtypes, supervisor

#: The JSON layout (docs/bench.md, "JSON"): 2 added the per-point targets, ``met``, ``all_met``,
#: ``schema`` and the optional ``projection``; every key of 1 is kept with its meaning.
SCHEMA = 2

HELP = "benchmark the host-side update cost per replay step (simulator, null-cost mode)"


def _ints(text: str) -> tuple[int, ...]:
    try:
        values = tuple(int(v) for v in text.split(",") if v.strip())
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers: {text!r}") from exc
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(f"expected positive integers: {text!r}")
    return values


def _kind(text: str) -> str:
    """A kind name as given, or the table's name it matches ignoring case and blanks ("mtp",
    "mtpk=3" -> "MTP k=3"): "MTP k=3" has a blank that shells make awkward."""
    from torch_npu_sim.bench import core

    text = text.strip()
    if text in core.KINDS:
        return text
    norm = text.replace(" ", "").lower()
    for name in core.KINDS:
        if norm in (name.replace(" ", "").lower(), name.split()[0].lower()):
            return name
    if norm == "hybrid":
        return core.HYBRID_KIND
    return text


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--quick", action="store_true", help="small sweep (layers 1,28 x batch 1,64), fewer rounds"
    )
    parser.add_argument(
        "--kinds",
        default=None,
        help="comma-separated kinds: FIA, FIA-v2, PA, MTP k=3 (or: mtp), MLA, MLA+MTP k=3 "
        "(or: mla+mtp), Hybrid+MTP (or: hybrid); default: all",
    )
    parser.add_argument("--layers", type=_ints, default=None, help="e.g. 1,28,64,94")
    parser.add_argument("--batches", type=_ints, default=None, help="e.g. 1,64,256")
    parser.add_argument(
        "--rounds",
        type=argtypes.int_at_least(1),
        default=None,
        help="interleaved rounds per point (median taken)",
    )
    parser.add_argument(
        "--inner", type=argtypes.int_at_least(1), default=None, help="calls per round"
    )
    parser.add_argument("--no-capture", action="store_true", help="skip the capture overhead")
    parser.add_argument("--no-startup", action="store_true", help="skip the loader start-up cost")
    parser.add_argument(
        "--json",
        dest="json_path",
        type=argtypes.output_file,
        default=None,
        metavar="FILE",
        help="also write the results as JSON",
    )
    parser.add_argument("--no-progress", action="store_true", help="no progress bar on stderr")
    parser.add_argument(
        "--instructions",
        action="store_true",
        help="also count each point's instructions (valgrind's callgrind, the same points in "
        "one more process): the instruction ratios decide the targets (overlay <= 1.15x floor, "
        "capture <= 1.02x); without valgrind one line says so and the wall-clock figures decide",
    )
    parser.add_argument(
        "--check",
        type=argtypes.input_file,
        default=None,
        metavar="BASELINE",
        help="with --instructions: exit 3 if any instruction ratio is more than 2%% worse than "
        "BASELINE's (the repository's: simulator/torch_npu_sim/bench/baseline.json)",
    )
    parser.add_argument(
        "--save-baseline",
        type=argtypes.output_file,
        default=None,
        metavar="FILE",
        help="with --instructions: write this run's instruction ratios as a baseline",
    )
    parser.add_argument(
        "--project",
        action="store_true",
        help="also print a PROJECTION (not a measurement) of the per-step host update time on an "
        "Ascend host for 28/64/94-layer shapes, +-PA, +-MTP k=3 (needs FIA, PA and MTP points)",
    )
    parser.add_argument(
        "--timeline",
        action="store_true",
        help="with --project: also print a MODELLED step timeline (step time, host and device "
        "idle, the limit max(host, device)) for stock, stock without its barrier (unsafe), the "
        "overlay and the overlay with stream-ordered replay, and its sensitivity to the constants",
    )
    parser.add_argument(
        "--cost",
        action="append",
        default=[],
        metavar="NAME=US",
        help="a per-call runtime cost for --project, in microseconds (repeatable): update_begin, "
        "update_end, event_record, relaunch_fia, relaunch_pa, pa_workspace_getter",
    )


def _fmt(value: float | None, fmt: str) -> str:
    return "-" if value is None else format(value, fmt)


def _mark(value: float | None, target: float | None) -> str:
    if value is None or target is None:
        return ""
    return " ok" if value <= target else " MISS"


def _ratio(value: float | None, target: float | None) -> str:
    if target is None:
        return _fmt(value, ".2f") + " (-)"
    return f"{_fmt(value, '.2f')} (<={target:g}){_mark(value, target)}"


def table(points: list[Any]) -> str:
    """The points; with instruction counts, their columns too, and the ratios that decide the
    targets are the instruction ratios (the wall-clock ones beside them)."""
    counted = any(p.overlay_ir is not None for p in points)
    cols = ["kind", "layers", "batch", "tasks", "stock us", "overlay us", "floor us"]
    if counted:
        cols += ["stock kIr", "overlay kIr", "floor kIr", "wall o/s", "wall o/f"]
    cols += ["overlay/stock", "overlay/floor"]
    body = []
    for p in points:
        if p.error:
            row = [p.kind, str(p.layers), str(p.batch), "-", "ERROR: " + p.error]
            body.append(row + [""] * (len(cols) - len(row)))
            continue
        row = [
            p.kind,
            str(p.layers),
            str(p.batch),
            str(p.tasks),
            _fmt(p.stock_us, ".1f"),
            _fmt(p.overlay_us, ".1f"),
            _fmt(p.floor_us, ".1f"),
        ]
        if counted:
            irs = (p.stock_ir, p.overlay_ir, p.floor_ir)
            row += [_fmt(None if v is None else v / 1000, ".1f") for v in irs]
            row += [_fmt(p.wall_vs_stock, ".2f"), _fmt(p.wall_vs_floor, ".2f")]
        row += [_ratio(p.vs_stock, p.target_vs_stock), _ratio(p.vs_floor, p.target_vs_floor)]
        body.append(row)
    widths = [max(len(r[i]) for r in [cols, *body]) for i in range(len(cols))]
    lines = [
        "  ".join(
            c.rjust(w) if i else c.ljust(w)
            for i, (c, w) in enumerate(zip(row, widths, strict=True))
        ).rstrip()
        for row in [cols, ["-" * w for w in widths], *body]
    ]
    return "\n".join(lines)


def summary_lines(result: Any) -> list[str]:
    from torch_npu_sim.bench.core import AMORTISED_FROM_LAYERS

    ok = [p for p in result.points if not p.error]
    out = []
    if ok:
        met = sum(p.met for p in result.points)
        figure = ok[0].decided_by
        floor = max((p.target_vs_floor or 0) for p in ok) or "-"
        out.append(
            f"targets ({figure}): met at {met}/{len(result.points)} points (overlay <= 1.0x "
            f"stock everywhere; from {AMORTISED_FROM_LAYERS} layers up <= 0.5x stock and <= "
            f"{floor}x floor)"
        )
        worst_s = max(ok, key=lambda p: p.vs_stock or 0)
        out.append(
            f"overlay/stock: worst {worst_s.vs_stock:.2f}x ({worst_s.kind}, {worst_s.layers} "
            f"layers, batch {worst_s.batch}, target <= {worst_s.target_vs_stock:g})"
        )
        amortised = [p for p in ok if p.target_vs_floor is not None]
        if amortised:
            worst_f = max(amortised, key=lambda p: p.vs_floor or 0)
            out.append(
                f"overlay/floor from {AMORTISED_FROM_LAYERS} layers: worst "
                f"{worst_f.vs_floor:.2f}x ({worst_f.kind}, {worst_f.layers} layers, batch "
                f"{worst_f.batch}, target <= {worst_f.target_vs_floor:g})"
            )
    cap = result.capture
    if cap:
        mark = _mark(cap["ratio"], cap["target"])
        out.append(
            f"capture ({cap['layers']} layers, sizes {','.join(map(str, cap['sizes']))}; CPU "
            f"time, median of {cap['repeats']} pairs): stock {cap['stock_ms']:.2f} ms, overlay "
            f"{cap['overlay_ms']:.2f} ms, ratio "
            f"{cap['ratio']:.3f} (target <= {cap['target']}){mark}"
        )
    counted = (cap or {}).get("instructions")
    if counted:
        out.append(
            f"capture by instructions (deciding): stock {counted['stock'] / 1e6:.2f}M, overlay "
            f"{counted['overlay'] / 1e6:.2f}M, ratio {counted['ratio']:.4f} (target <= "
            f"{counted['target']}){_mark(counted['ratio'], counted['target'])}"
        )
    st = result.startup
    if st:
        off, on = st.get("off_ms"), st.get("on_ms")
        out.append(
            f"loader start-up: off {_fmt(off, '.3f')} ms (target <= "
            f"{st['target_off_ms']} ms){_mark(off, st['target_off_ms'])}, on "
            f"{_fmt(on, '.2f')} ms" + (f" [{st.get('off_error')}]" if st.get("off_error") else "")
        )
    return out


def all_met(result: Any) -> bool:
    """Every point, the capture overhead and the start-up cost (where measured) on target."""
    if not result.points or not all(p.met for p in result.points):
        return False
    cap, st = result.capture, result.startup
    decided = (cap or {}).get("instructions") or cap  # instructions decide where counted
    if decided and (decided["ratio"] is None or decided["ratio"] > decided["target"]):
        return False
    off = st.get("off_ms") if st else None
    return not (off is not None and off > st["target_off_ms"])


def run(args: argparse.Namespace) -> int:
    from torch_npu_sim.bench import core

    kinds = [_kind(k) for k in (args.kinds or ",".join(core.KINDS)).split(",") if k.strip()]
    unknown = [k for k in kinds if k not in core.KINDS]
    if unknown:
        print(
            f"ascend-graph-patch bench: error: unknown kind(s) {', '.join(unknown)}; "
            f"available: {', '.join(core.KINDS)}",
            file=sys.stderr,
        )
        return 2
    from torch_npu_sim.bench import projection as projecting

    try:
        costs = projecting.CallCosts.parse(args.cost)
    except ValueError as exc:
        print(f"ascend-graph-patch bench: error: {exc}", file=sys.stderr)
        return 2
    if args.timeline and not args.project:
        print("ascend-graph-patch bench: error: --timeline needs --project", file=sys.stderr)
        return 2
    if args.cost and not args.project:
        print("ascend-graph-patch bench: error: --cost is used by --project", file=sys.stderr)
        return 2
    if args.project:
        needed = ("FIA", "PA", core.MTP_KIND)
        missing = [k for k in needed if k not in kinds]
        if missing:
            print(
                f"ascend-graph-patch bench: error: --project needs the kinds {', '.join(needed)}"
                f" (missing {', '.join(missing)})",
                file=sys.stderr,
            )
            return 2
    if (args.check or args.save_baseline) and not args.instructions:
        print(
            "ascend-graph-patch bench: error: --check and --save-baseline need --instructions",
            file=sys.stderr,
        )
        return 2
    counting = args.instructions
    if counting:
        from torch_npu_sim.bench import instructions

        reason = instructions.unavailable()
        if reason is not None:
            print(
                f"ascend-graph-patch bench: no instruction counts ({reason}); "
                "the wall-clock figures decide",
                file=sys.stderr,
            )
            if args.check or args.save_baseline:
                return 2
            counting = False
    os.environ.setdefault("TORCH_NPU_SIM", "1")
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")  # vLLM logs to stdout: keep the table
    layers = args.layers or (core.QUICK_LAYERS if args.quick else core.LAYERS)
    batches = args.batches or (core.QUICK_BATCHES if args.quick else core.BATCHES)
    rounds = args.rounds or (5 if args.quick else 9)
    inner = args.inner or (10 if args.quick else 30)
    bar = None
    if not args.no_progress:
        try:
            from tqdm import tqdm

            bar = tqdm(
                total=len(kinds) * len(layers) * len(batches),
                unit="point",
                file=sys.stderr,
                leave=False,
                desc="bench",
            )
        except ImportError:
            bar = None
    result = core.BenchResult()
    interrupted: BaseException | None = None
    signal_name = None
    try:
        core.sweep(kinds, layers, batches, rounds, inner, bar, points=result.points)
        if not args.no_capture:
            result.capture = core.capture_overhead(
                28 if not args.quick else 8, core.CAPTURE_SIZES, 7 if args.quick else 21
            )
        if not args.no_startup:
            result.startup = core.startup_cost(3 if args.quick else 7)
        if counting:
            _count(result, kinds, layers, batches, not args.no_capture, args.quick)
    except KeyboardInterrupt as exc:  # SIGINT, SIGTERM, SIGHUP: report what was measured
        interrupted = exc
        signal_name = supervisor.interruption(exc)[0]  # taken up here: not raised again
    finally:
        if bar is not None:
            bar.close()
    print(
        f"ascend-graph-patch bench: host update per replay step, simulator null-cost mode "
        f"({rounds} interleaved rounds x {inner} calls, median)"
    )
    print(table(result.points))
    for line in summary_lines(result):
        print(line)
    projection = None
    if args.project and interrupted is None:
        try:
            projection = projecting.project(result.points, costs)
        except ValueError as exc:
            print(f"projection: not computed: {exc}")
        else:
            print()
            print(projecting.render(projection))
            if args.timeline:
                from torch_npu_sim.bench import timeline as timelining

                projection["timeline"] = timelining.report(projection)
                print()
                print(timelining.render(projection["timeline"]))
    if signal_name is not None:
        print(f"INTERRUPTED ({signal_name}): {len(result.points)} point(s) measured")
    if args.json_path:
        data = {
            "schema": SCHEMA,
            "points": [
                dict(
                    asdict(p),
                    instructions=None
                    if p.overlay_ir is None
                    else {"stock": p.stock_ir, "overlay": p.overlay_ir, "floor": p.floor_ir},
                    vs_stock=p.vs_stock,
                    vs_floor=p.vs_floor,
                    wall_vs_stock=p.wall_vs_stock,
                    wall_vs_floor=p.wall_vs_floor,
                    decided_by=p.decided_by,
                    target_vs_stock=p.target_vs_stock,
                    target_vs_floor=p.target_vs_floor,
                    met=p.met,
                )
                for p in result.points
            ],
            "capture": result.capture,
            "startup": result.startup,
            "targets": {
                "overlay_vs_stock_any": core.TARGET_VS_STOCK_ANY,
                "amortised_from_layers": core.AMORTISED_FROM_LAYERS,
                "overlay_vs_stock": core.TARGET_VS_STOCK,
                "overlay_vs_floor": core.TARGET_VS_FLOOR,
                "overlay_vs_floor_instructions": core.TARGET_VS_FLOOR_INSTRUCTIONS,
                "capture": core.TARGET_CAPTURE,
                "capture_instructions": core.TARGET_CAPTURE_INSTRUCTIONS,
                "startup_off_ms": core.TARGET_STARTUP_OFF_MS,
            },
            "all_met": all_met(result) and signal_name is None,
            "interrupted": signal_name,
            "rounds": rounds,
            "inner": inner,
        }
        if projection is not None:
            data["projection"] = projection
        Path(args.json_path).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json_path).write_text(json.dumps(data, indent=1))
        print(f"json: {args.json_path}")
    if interrupted is not None:
        raise interrupted  # the CLI ends with 128 + the signal's number
    if counting and (args.save_baseline or args.check):
        code = _baseline(result, args.save_baseline, args.check)
        if code:
            return code
    return 1 if any(p.error for p in result.points) else 0


def _count(
    result: Any, kinds: list[str], layers: Any, batches: Any, capture: bool, quick: bool
) -> None:
    """Count the same points' instructions under callgrind; attach them to ``result``."""
    import shutil
    import tempfile

    from torch_npu_sim.bench import core, instructions

    spec: dict[str, Any] = {"kinds": kinds, "layers": list(layers), "batches": list(batches)}
    if capture:
        spec["capture"] = {"layers": 8 if quick else 28, "sizes": list(core.CAPTURE_SIZES)}
    print("bench: counting instructions under callgrind ...", file=sys.stderr)
    work = Path(tempfile.mkdtemp(prefix="bench-callgrind-"))
    try:
        counted = instructions.run_counted(spec, work)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    rows = {(r["kind"], r["layers"], r["batch"]): r for r in counted["points"]}
    for point in result.points:
        row = rows.get((point.kind, point.layers, point.batch)) or {}
        if "overlay" in row:
            point.stock_ir, point.overlay_ir, point.floor_ir = (
                row["stock"],
                row["overlay"],
                row["floor"],
            )
        elif row.get("error") and not point.error:
            point.error = "counted run: " + row["error"]
    if counted["capture"] and result.capture:
        result.capture["instructions"] = dict(
            counted["capture"], target=core.TARGET_CAPTURE_INSTRUCTIONS
        )


def _baseline(result: Any, save: str | None, check: str | None) -> int:
    """Write and/or check the instruction-ratio baseline: 3 on a regression, 2 on a bad file."""
    import json

    from torch_npu_sim.bench import baseline

    if save:
        Path(save).parent.mkdir(parents=True, exist_ok=True)
        Path(save).write_text(json.dumps(baseline.make(result.points, result.capture), indent=1))
        print(f"baseline: written to {save}")
    if check:
        try:
            base = baseline.load(check)
        except (OSError, ValueError) as exc:
            print(f"ascend-graph-patch bench: error: {exc}", file=sys.stderr)
            return 2
        worse, compared = baseline.check(result.points, result.capture, base)
        if not compared:
            print(f"check: no ratio of {check} was measured in this run", file=sys.stderr)
            return 2
        for line in worse:
            print(f"check: WORSE {line}")
        verdict = "FAILED" if worse else "ok"
        print(f"check against {check}: {compared} ratios compared, {len(worse)} worse: {verdict}")
        return 3 if worse else 0
    return 0
