"""Compare an engine run's eager tokens with transformers' own greedy generation.

For engine cases outside the engine tests' arms (``cases.OPTIONAL_CASES``), whose whole-model
oracle no test runs: after ``python -m torch_npu_sim.engine.arms --out DIR --cases ... --arms
eager,...``, ``python scripts/eager-oracle.py DIR CASE... [--model-class NAME]`` loads each case's
model with transformers (``NAME``: ``Qwen3NextForCausalLM`` by default), generates the same
requests greedily and prints, per case, whether each request's tokens equal the eager engine's.
Exit status 1 if any differs. float32 cases only (a bfloat16 engine rounds differently).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", help="the arms' --out directory")
    parser.add_argument("cases", nargs="+", help="engine case names")
    parser.add_argument("--model-class", default="Qwen3NextForCausalLM")
    parser.add_argument("--models", help="model cache (default: OUT/models)")
    args = parser.parse_args()

    import transformers

    from torch_npu_sim.engine import cases, models
    from torch_npu_sim.engine.transformers_oracle import greedy_tokens

    results = json.loads(Path(args.out, "results.json").read_text())
    model_class = getattr(transformers, args.model_class)
    failed = False
    for name in args.cases:
        case = next(c for c in cases.ALL_CASES if c.name == name)
        record = results["eager"]["cases"][case.reference]
        if record.get("error"):
            print(f"{name}: the eager engine failed: {record['error']}")
            failed = True
            continue
        directory = models.materialize(case.model, args.models or f"{args.out}/models")
        want = greedy_tokens(model_class, directory, case)
        equal = [got == exp for got, exp in zip(record["tokens"][0], want, strict=True)]
        failed |= not all(equal)
        print(f"{name}: equal to transformers per request {equal}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
