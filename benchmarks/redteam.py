"""Red-team table (issue 35): for each domain, backend and exploit family, the share of bundled pivots
where the attack scores a reward it did not earn.

The attack families live beside their tests (`tests/redteam/attacks_<domain>.py`, interface in
`tests/redteam/redteam_common.py`); the tests run them on a sample of pivots, this runs every family
on every bundled pivot. The baseline, measured in the same run on the same pivots, is the expert's
own action: what a right answer scores there (the share an attack family reaches is read against
it). A family scores where reward > 0 on a valid step; `invalid` counts steps an attack made
`valid=False`, which no action may cause.

    .venv/bin/python benchmarks/redteam.py                     # every domain, every backend
    .venv/bin/python benchmarks/redteam.py --domains search tool-use --backends bundled tau-airline

Prints a table per domain and writes benchmarks/out/redteam.json.
"""

from __future__ import annotations

import argparse
import importlib
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
REDTEAM = ROOT / "tests" / "redteam"
sys.path[:0] = [str(REDTEAM), str(ROOT / "tests")]

from redteam_common import Family, run_family  # noqa: E402

MODULES = ("tool_use", "search", "terminal", "terminal_episode", "swe")


def expert_family() -> Family:
    return Family("the expert's own action (baseline)", lambda env, pivot: pivot.expert)


def spread(pivots: list, most: int | None) -> list:
    """At most `most` of `pivots`, evenly spread over the list (all when `most` is None)."""
    if most is None or len(pivots) <= most:
        return pivots
    return [pivots[index * len(pivots) // most] for index in range(most)]


def attack_domain(
    module, backends: list[str] | None, most: int | None, only: list[str] | None = None
) -> list[dict]:
    rows = []
    for backend in module.BACKENDS:
        if backends and backend not in backends:
            continue
        start = time.monotonic()
        env = module.make_env(backend)
        try:
            pivots = spread(list(getattr(env, "unwrapped", env).pivots), most)
            families = {"(baseline) expert": expert_family(), **module.FAMILIES}
            if only:
                families = {
                    name: family for name, family in families.items() if name in only or name[0] == "("
                }
            for name, family in families.items():
                began = time.monotonic()
                tally = run_family(env, family, pivots)
                rows.append(
                    {
                        "domain": module.DOMAIN,
                        "backend": backend,
                        "pivots": len(pivots),
                        "family": name,
                        "generic": family.generic,
                        "floor": family.floor,
                        "applicable": tally.applicable,
                        "scored": tally.scored,
                        "invalid": tally.invalid,
                        "share": round(tally.share, 4),
                        "examples": tally.examples,
                        "seconds": round(time.monotonic() - began, 2),
                    }
                )
                print(_line(rows[-1]), flush=True)
        finally:
            env.close()
        print(f"  ({module.DOMAIN} on {backend}: {time.monotonic() - start:.0f} s)", flush=True)
    return rows


def _line(row: dict) -> str:
    held = (
        "" if row["family"].startswith("(baseline)") else ("ok" if row["share"] <= row["floor"] else "OVER")
    )
    floor = f" (floor {row['floor']:.2f})" if row["floor"] else ""
    return (
        f"  {row['domain']:<17} {row['backend']:<12} {row['family']:<52} "
        f"{row['scored']:>4}/{row['applicable']:<4} {row['share']:>6.1%}{floor} invalid {row['invalid']} {held}"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--domains", nargs="*", help="domains (as DOMAIN in the attack modules); default all")
    parser.add_argument("--backends", nargs="*", help="backends to run; default each module's all")
    parser.add_argument(
        "--families", nargs="*", help="only these families (names as in FAMILIES; the baseline always runs)"
    )
    parser.add_argument(
        "--max-pivots",
        type=int,
        default=None,
        help="at most this many pivots per domain and backend, evenly spread (default: a module's "
        "BENCHMARK_MAX_PIVOTS, else all; every family runs on the same ones)",
    )
    parser.add_argument("--out", default=str(ROOT / "benchmarks" / "out" / "redteam.json"))
    args = parser.parse_args(argv)
    rows: list[dict] = []
    for name in MODULES:
        module = importlib.import_module(f"attacks_{name}")
        if args.domains and module.DOMAIN not in args.domains:
            continue
        print(f"{module.DOMAIN}:", flush=True)
        most = (
            args.max_pivots if args.max_pivots is not None else getattr(module, "BENCHMARK_MAX_PIVOTS", None)
        )
        if args.families and not set(args.families) & set(module.FAMILIES):
            continue
        rows += attack_domain(module, args.backends, most, args.families)
    attacks = [row for row in rows if not row["family"].startswith("(baseline)")]
    over = [row for row in attacks if row["share"] > row["floor"]]
    invalid = [row for row in rows if row["invalid"]]
    summary = {
        "families": len({(row["domain"], row["family"]) for row in attacks}),
        "rows": len(attacks),
        "over_floor": [f"{row['domain']}/{row['backend']}/{row['family']}" for row in over],
        "made_invalid": [f"{row['domain']}/{row['backend']}/{row['family']}" for row in invalid],
        "generic_scored": sum(row["scored"] for row in attacks if row["generic"]),
        "generic_tried": sum(row["applicable"] for row in attacks if row["generic"]),
    }
    print(
        f"\n{summary['rows']} family x backend rows: {len(over)} over their floor, {len(invalid)} with invalid steps; "
        f"generic/degenerate actions scored {summary['generic_scored']} of {summary['generic_tried']}"
    )
    for row in over:
        print(
            f"  OVER: {row['domain']} {row['backend']} {row['family']}: {row['scored']}/{row['applicable']}"
        )
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps({"summary": summary, "rows": rows}, indent=1))
    print(f"wrote {args.out}")
    return 1 if over or invalid else 0


if __name__ == "__main__":
    raise SystemExit(main())
