"""diagnose's confusion table over its corpus: every case's expected verdict against the one it gets.

    python -m experiments.diagnose_cases                      # every case: planted, architectures, realistic
    python -m experiments.diagnose_cases --only realistic     # one group (planted | architectures | realistic)
    python -m experiments.diagnose_cases --write-docs         # and put the table into docs/diagnose.md
    python -m experiments.diagnose_cases --preset case_slow_fp32   # one case (repeatable), merged into the results
    python -m experiments.diagnose_cases --table --write-docs # the table from the results so far, running nothing
    python -m experiments.diagnose_cases --rules              # the rules' and interventions' tables, from the code

The cases and their expected verdicts are `ampgan_corpus/cases.py`, the same the tests read; each
runs as the tests run it (tracking off; the planted ones with the corpus test's short replay). A
line per case as it ends; the results go to outputs/diagnose_cases.json as they come (a stopped
run keeps what it finished), and the table to stdout (and, asked, between the markers in
docs/diagnose.md). Takes long: about 1-5 minutes a case on 2 cores.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "diagnose.md"
BEGIN, END = "<!-- confusion table: python -m experiments.diagnose_cases --write-docs -->", "<!-- end of confusion table -->"
PLANTED_OVERRIDES = ("diagnose.steps=2", "diagnose.mode=synced", "diagnose.max_fixes=1", "diagnose.horizon=50")


def corpus(groups: list[str]) -> list[tuple[str, str, str, tuple[str, ...]]]:
    """(group, preset, expected verdict, overrides) of every case in `groups`."""
    from ampgan_corpus.cases import ARCHITECTURES, PLANTED, PLANTED_HORIZON, REALISTIC

    out = []
    if "planted" in groups:
        out += [("planted", preset, verdict, PLANTED_OVERRIDES + PLANTED_HORIZON.get(preset, ()))
                for preset, verdict, *_ in PLANTED]
    if "architectures" in groups:
        out += [("architectures", c.preset, c.verdict, ("diagnose.max_fixes=2",)) for c in ARCHITECTURES]
    if "realistic" in groups:
        out += [("realistic", c.preset, c.verdict, ("diagnose.mode=synced", *c.overrides)) for c in REALISTIC]
    return out


def diagnose_one(preset: str, overrides: tuple[str, ...]) -> tuple[str, str, float]:
    """(verdict, headline, seconds) of one case; a case that raises gets verdict "error"."""
    from hydra import compose, initialize_config_dir

    from ampgan import AmpganError
    from ampgan.config.schema import CONF_DIR
    from ampgan.diagnose.command import diagnose

    started = time.perf_counter()
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        cfg = compose(config_name="diagnose_main", overrides=[f"+experiment={preset}", "tracking=none",
                                                               "diagnose.progress=false", *overrides])
    try:
        with tempfile.TemporaryDirectory(prefix="ampgan-cases-") as folder:
            v = diagnose(cfg, Path(folder), echo=lambda *a, **k: None).verdict
        return v.name, v.headline, time.perf_counter() - started
    except AmpganError as err:
        return "error", str(err), time.perf_counter() - started


def confusion(rows: list[dict]) -> str:
    """The markdown table: expected verdicts down, verdicts got across, then every case's line."""
    names = sorted({r["expected"] for r in rows} | {r["got"] for r in rows})
    right = sum(r["expected"] == r["got"] for r in rows)
    out = [f"{right} of {len(rows)} cases get their expected verdict.", "",
           "| expected \\ got | " + " | ".join(f"`{n}`" for n in names) + " |", "|---|" + "---|" * len(names)]
    for e in names:
        counts = [sum(r["expected"] == e and r["got"] == g for r in rows) for g in names]
        if any(counts):
            out.append(f"| `{e}` | " + " | ".join(str(c) if c else "." for c in counts) + " |")
    out += ["", "| case | group | expected | got | seconds |", "|---|---|---|---|---|"]
    out += [f"| `{r['preset']}`{' ' + ' '.join(r['extra']) if r['extra'] else ''} | {r['group']} | `{r['expected']}` | "
            f"{'' if r['got'] == r['expected'] else '**'}`{r['got']}`{'' if r['got'] == r['expected'] else '**'} | "
            f"{r['seconds']:.0f} |" for r in rows]
    return "\n".join(out)


def write_docs(table: str, doc: Path = DOC, begin: str = BEGIN, end: str = END) -> None:
    """Replace what stands between the markers in `doc` with `table` (the markers must be there)."""
    text = doc.read_text()
    if begin not in text or end not in text:
        raise SystemExit(f"experiments.diagnose_cases: error: {doc} has no {begin} ... {end} markers")
    head, rest = text.split(begin, 1)
    doc.write_text(head + begin + "\n" + table + "\n" + end + rest.split(end, 1)[1])


def write_rules(doc: Path = DOC) -> None:
    """The rules' and the interventions' tables in `doc`, from the modules' docstrings."""
    from ampgan.diagnose.verdict_report import docs_blocks

    for (begin, end), text in docs_blocks().items():
        write_docs(text, doc, begin, end)


def key(row: dict) -> tuple:
    """A result's case: its preset and its extra overrides (one preset can be two cases)."""
    return row["preset"], tuple(row["extra"])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m experiments.diagnose_cases", description=__doc__.splitlines()[0])
    parser.add_argument("--only", choices=("planted", "architectures", "realistic"), action="append")
    parser.add_argument("--write-docs", action="store_true", help="put the table into docs/diagnose.md")
    parser.add_argument("--rules", action="store_true",
                        help="run nothing: put the rules' and interventions' tables (from the code) into docs/diagnose.md")
    parser.add_argument("--preset", action="append", help="only this case (repeatable); results merged")
    parser.add_argument("--table", action="store_true", help="run nothing: the table of the results so far")
    parser.add_argument("--fresh", action="store_true", help="forget earlier results (default: keep and merge)")
    parser.add_argument("--out", type=Path, default=ROOT / "outputs" / "diagnose_cases.json")
    args = parser.parse_args(argv)
    if args.rules:
        write_rules()
        print(f"the rules and interventions tables written to {DOC}")
        return 0
    cases = [c for c in corpus(args.only or ["planted", "architectures", "realistic"])
             if not args.preset or c[1] in args.preset]
    if args.preset and not cases:
        raise SystemExit(f"experiments.diagnose_cases: error: no case named {', '.join(args.preset)} in ampgan_corpus/cases.py")
    done = {} if args.fresh or not args.out.exists() else {key(r): r for r in json.loads(args.out.read_text())}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    for i, (group, preset, expected, overrides) in enumerate([] if args.table else cases, 1):
        got, headline, seconds = diagnose_one(preset, overrides)
        extra = [o for o in overrides if o not in PLANTED_OVERRIDES and not o.startswith("diagnose.m")]
        row = {"group": group, "preset": preset, "extra": extra, "expected": expected, "got": got,
               "headline": headline, "seconds": seconds}
        done[key(row)] = row
        args.out.write_text(json.dumps(list(done.values()), indent=1))
        mark = "ok" if got == expected else "WRONG"
        print(f"[{i}/{len(cases)}] {preset} {' '.join(extra)}: expected {expected}, got {got} ({mark}, {seconds:.0f}s)",
              file=sys.stderr, flush=True)
    order = {(p, tuple(o for o in ov if o not in PLANTED_OVERRIDES and not o.startswith("diagnose.m"))): n
             for n, (_, p, _, ov) in enumerate(corpus(["planted", "architectures", "realistic"]))}
    rows = sorted(done.values(), key=lambda r: order.get(key(r), len(order)))
    if not rows:
        raise SystemExit(f"experiments.diagnose_cases: error: no results in {args.out} yet")
    table = confusion(rows)
    print(table)
    if args.write_docs:
        write_docs(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
