"""`attnlab-report PATH [PATH ...]`: tables and figures that compare runs.

    attnlab-report multirun/scale_quick/2026-12-01_09-30-00          # a sweep
    attnlab-report outputs/default/run_a outputs/default/run_b        # runs side by side
    attnlab-report --wandb ENTITY/PROJECT --group scale_quick-2026-…  # the same from W&B (online)

It finds the runs, works out which config keys vary, aggregates over seeds (mean ± std,
n) and writes ``report.md`` plus PNG figures into ``--out`` (default: ``<first
PATH>/report``). Unfinished, diverged, failed and missing runs are listed, never dropped silently.
Python: ``load(paths)`` gives the runs and groups the notebooks plot.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path

from attnlab.report.claims import check_names, claims_table, evaluate, load_claims
from attnlab.report.coord import coord_figure, coord_table
from attnlab.report.figures import all_figures
from attnlab.report.lengths import lengths_figure, lengths_table
from attnlab.report.lr import lr_figure, lr_table
from attnlab.report.runs import (
    Group,
    ReportError,
    Run,
    cell,
    d_k_of,
    find_runs,
    group_runs,
    load_wandb_runs,
    save_data,
    varying_keys,
)
from attnlab.runs import MAPS_DIR

# Vaswani et al. 2017, Table 3 (newstest2013 dev, EN→DE, base model, 100K steps): (h, d_k, d_v) → (PPL, BLEU).
VASWANI_TABLE_3 = {
    (8, 64, 64): ("base", 4.92, 25.8),
    (1, 512, 512): ("(A)", 5.29, 24.9),
    (4, 128, 128): ("(A)", 5.00, 25.5),
    (16, 32, 32): ("(A)", 4.91, 25.8),
    (32, 16, 16): ("(A)", 5.01, 25.4),
    (8, 16, 64): ("(B)", 5.16, 25.1),
    (8, 32, 64): ("(B)", 5.01, 25.4),
}
COLUMNS = ["val/loss", "val/ppl", "val/acc", "val/seq_acc", "val/bleu", "test/loss", "test/bleu"]


@dataclass
class Report:
    runs: list[Run]
    axes: list[str]
    groups: list[Group]


def load(paths: list[str | Path]) -> Report:
    runs = find_runs(paths)
    axes = varying_keys(runs)
    return Report(runs, axes, group_runs(runs, axes))


def final_metrics_table(report: Report) -> list[str]:
    present = set().union(*(run.metric_names() for run in report.runs))
    columns = [key for key in COLUMNS if key in present]
    settings = [key for key in report.axes if key != "seed"]
    header = [*settings, "n", *columns, "steps", "wall (s)"]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for group in report.groups:
        steps = sorted({run.steps_trained for run in group.runs})
        walls = [run.wall_s for run in group.runs if run.wall_s is not None]
        wall = f"{sum(walls) / len(walls):.3g}" if walls else "–"
        values = [str(group.settings[key]) for key in settings]
        values += [str(len(group.runs)), *[cell(group.mean_std(key)) for key in columns]]
        values += ["/".join(map(str, steps)), wall]
        lines.append("| " + " | ".join(values) + " |")
    return lines


def paper_row(config: dict) -> tuple:
    """The row of Vaswani et al. Table 3 with this run's shape relative to d_model (the paper's is
    512: d_model = 128, h = 8, d_k = 16 is its base), for τ = √d_k; ("–", "–", "–") otherwise."""
    if config.get("attention.scale") != "sqrt_dk" or config.get("attention.variant", "dot") != "dot":
        return "–", "–", "–"
    heads, d_k = config["model.n_heads"], d_k_of(config)
    d_v = config.get("model.d_v") or d_k
    factor = 512 / config["model.d_model"]
    return VASWANI_TABLE_3.get((heads, d_k * factor, d_v * factor), ("–", "–", "–"))


def vaswani_table(report: Report) -> list[str]:
    """Our heads / d_k sweep in the layout of Vaswani et al. Table 3, the paper's numbers beside."""
    if not {"model.n_heads", "model.d_k", "model.d_v"} & set(report.axes):
        return []
    lines = [
        "## In the layout of Vaswani et al. 2017, Table 3",
        "",
        "**Different setting**: the paper trains the base model on WMT14 EN→DE for 100K steps and "
        "reports newstest2013 dev perplexity (per word piece) and BLEU; ours is the scaled-down "
        "configuration of these runs. A paper row is matched by shape relative to d_model (its d_model is "
        "512). Compare directions, not values.",
        "",
    ]
    others = [key for key in report.axes if key not in ("seed", "model.n_heads", "model.d_k", "model.d_v")]
    header = [*others, "h", "d_k", "d_v", "n", "our val/ppl", "our val/bleu", "our test/bleu", "paper row",
              "paper PPL", "paper BLEU"]  # fmt: skip
    lines += ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for group in report.groups:
        config = group.runs[0].config
        heads, d_k = config["model.n_heads"], d_k_of(config)
        d_v = config.get("model.d_v") or d_k
        row, ppl, bleu = paper_row(config)
        values = [*(str(group.settings[key]) for key in others), str(heads), str(d_k), str(d_v)]
        values += [str(len(group.runs)), cell(group.mean_std("val/ppl")), cell(group.mean_std("val/bleu"), 1)]
        values.append(cell(group.mean_std("test/bleu"), 1))
        lines.append("| " + " | ".join([*values, row, str(ppl), str(bleu)]) + " |")
    return [*lines, "", *bleu_signatures(report), ""]


def bleu_signatures(report: Report) -> list[str]:
    """How BLEU was computed (sacrebleu's signature, the decoder, the sentences), from each run's bleu.json."""
    seen = sorted({(split, record["signature"], record["decoder"], record["sentences"])
                   for run in report.runs for split, record in run.bleu.items()})  # fmt: skip
    return [f"- {split}/bleu: sacrebleu `{signature}`, {decoder}, {sentences} sentences"
            for split, signature, decoder, sentences in seen]  # fmt: skip


def claims_section(report: Report, claims_file: str | None, out: Path) -> list[str]:
    """The claims of ``claims_file`` with their verdicts on these runs; claims.json beside report.md."""
    if not claims_file:
        return []
    claims = load_claims(claims_file)
    for claim in claims:
        for warning in check_names(claim, report.runs):
            print(f"attnlab-report: {warning}", file=sys.stderr)
    outcomes = [evaluate(claim, report.runs) for claim in claims]
    (out / "claims.json").write_text(json.dumps([outcome.record() for outcome in outcomes], indent=1) + "\n")
    return ["## Claims", "", f"From `{claims_file}`.", "", *claims_table(outcomes), ""]


def attention_maps(report: Report, out: Path) -> list[str]:
    """The first and last attention map of one run per configuration, side by side (copied to out/maps/)."""
    rows = []
    for index, group in enumerate(report.groups):
        for run in group.runs:
            maps = sorted((Path(run.name) / MAPS_DIR).glob("step_*.png"))
            if len(maps) < 2:
                continue
            (out / "maps").mkdir(parents=True, exist_ok=True)
            cells = []
            for which, path in (("first", maps[0]), ("last", maps[-1])):
                copy = out / "maps" / f"{index:02d}_{which}.png"
                shutil.copyfile(path, copy)
                step = int(path.stem.removeprefix("step_"))
                cells.append(f"step {step}<br>![{group.label}, step {step}](maps/{copy.name})")
            rows.append(f"| {group.label}<br>`{Path(run.name).name}` | {cells[0]} | {cells[1]} |")
            break
    if not rows:
        return []
    return ["## Attention maps", "",
            "The weights of the first validation example, per layer and head, at the first and the last probe "
            "step of one run per configuration.", "",
            "| configuration | first probe step | last probe step |", "|---|---|---|", *rows, ""]  # fmt: skip


def write_report(report: Report, out: Path, sources: list[str], claims_file: str | None = None) -> Path:
    out.mkdir(parents=True, exist_ok=True)
    claims = claims_section(report, claims_file, out)
    figures = all_figures(report.groups, out) if report.groups else []
    extra = [coord_figure(report.runs, out), lr_figure(report.runs, report.axes, out)]
    extra.append(lengths_figure(report.groups, out))
    figures += [path for path in extra if path is not None]
    problems = [run for run in report.runs if run.status != "finished"]
    lines = [
        "# attnlab report",
        "",
        f"Runs from: {', '.join(sources)}",
        f"{len(report.runs)} runs, {len(report.runs) - len(problems)} finished; "
        f"varying: {', '.join(f'`{key}`' for key in report.axes) or 'nothing'}; "
        "values are the last logged, mean ± std over seeds (n = finished runs).",
        "",
        *claims,
        "## Final metrics",
        "",
        *final_metrics_table(report),
        "",
        *vaswani_table(report),
        *coord_table(report.runs),
        *lr_table(report.runs, report.axes),
        *lengths_table(report.groups),
        *attention_maps(report, out),
        "## Runs that did not finish (diverged, failed, unfinished, missing)",
        "",
        *([f"- **{run.status}**: `{run.name}` — {run.problem}" for run in problems] or ["None."]),
        "",
        "## Figures",
        "",
        *[f"![{path.stem}]({path.name})" for path in figures],
        "",
    ]
    path = out / "report.md"
    path.write_text("\n".join(lines))
    return path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="attnlab-report", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    parser.add_argument("paths", nargs="*", help="run dirs and/or sweep (multirun) dirs")
    parser.add_argument("--out", help="output dir (default: <first PATH>/report)")
    parser.add_argument("--wandb", metavar="ENTITY/PROJECT", help="read the runs from W&B instead (online)")
    parser.add_argument("--group", help="with --wandb: only runs of this W&B group (a sweep)")
    parser.add_argument("--save-data", metavar="DIR",
                        help="also copy what the report reads of each run (config, run.json, metrics CSV; "
                        "no checkpoints) into DIR: `attnlab-report DIR/<name>` rebuilds the report")  # fmt: skip
    parser.add_argument("--claims", metavar="FILE",
                        help="a claims.yaml: evaluate each published claim on the runs (effect, 95%% interval, "
                        "held / contradicted / inconclusive), in report.md and claims.json")  # fmt: skip
    args = parser.parse_args(argv)
    try:
        if args.wandb:
            runs = load_wandb_runs(args.wandb, args.group)
            axes = varying_keys(runs)
            report, sources = Report(runs, axes, group_runs(runs, axes)), [args.wandb]
            out = Path(args.out or f"report-{args.wandb.replace('/', '-')}")
        else:
            if not args.paths:
                parser.error("give at least one run or sweep dir (or --wandb ENTITY/PROJECT)")
            report, sources = load(args.paths), args.paths
            out = Path(args.out) if args.out else Path(args.paths[0]) / "report"
        if args.save_data and not args.wandb:
            copied = save_data(args.paths, Path(args.save_data))
            print(f"data of {copied} runs: {args.save_data}")
        path = write_report(report, out, sources, args.claims)
    except ReportError as error:
        print(f"attnlab-report: {error}", file=sys.stderr)
        return 2
    print(f"report: {path}")
    return 0


__all__ = ["VASWANI_TABLE_3", "Report", "cli", "load", "main", "write_report"]


def cli() -> None:
    sys.exit(main())
