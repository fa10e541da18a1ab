"""attnlab-report on a real tiny sweep, and the notebooks executed on it."""

import json
import os
import shutil
from pathlib import Path

import matplotlib.image
import nbformat
import numpy as np
import pytest
from nbclient import NotebookClient

from attnlab.report import load, main
from attnlab.report.coord import coord_figure, coord_table
from attnlab.report.figures import bleu_scores
from attnlab.report.lengths import lengths_figure, lengths_table
from attnlab.report.lr import lr_figure, lr_table
from attnlab.report.runs import Run, expected_jobs, group_runs
from helpers import FAST, ROOT, cli

RULES = ["none", "sqrt_dk", "dk", "learned"]


@pytest.fixture(scope="module")
def sweep(tmp_path_factory):
    """4 scale rules × 2 seeds, a few steps each, probes every 3 steps."""
    sweep_dir = tmp_path_factory.mktemp("sweep")
    result = cli(
        "attnlab-train", "-m", f"attention.scale={','.join(RULES)}", "seed=0,1", f"hydra.sweep.dir={sweep_dir}",
        "logger=csv", "callbacks.probes.every_n_steps=3", "callbacks.probes.maps_every_n_steps=3", "name=tiny",
        *FAST, cwd=sweep_dir,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    return sweep_dir


def final_table(report_md):
    lines = report_md.split("## Final metrics")[1].split("##")[0].strip().splitlines()
    header = [cell.strip() for cell in lines[0].strip("|").split("|")]
    return [dict(zip(header, (c.strip() for c in line.strip("|").split("|")), strict=True)) for line in lines[2:]]


def is_png(path):
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", path
    image = matplotlib.image.imread(path)
    assert image.shape[0] > 100 and image.shape[1] > 100 and image.std() > 0, path  # not blank


def test_report_of_a_four_rule_sweep(sweep, tmp_path, capsys):
    assert main([str(sweep), "--out", str(tmp_path)]) == 0
    assert str(tmp_path / "report.md") in capsys.readouterr().out
    text = (tmp_path / "report.md").read_text()
    rows = final_table(text)
    assert sorted(row["attention.scale"] for row in rows) == sorted(RULES)
    assert all(row["n"] == "2" for row in rows)
    assert all("±" in row["val/loss"] for row in rows)
    assert "`attention.scale`, `seed`" in text and "None." in text.split("## Runs that did not finish")[1]
    figures = {"loss", "attn_entropy", "grad_logits", "grad_softmax_jac", "tau", "init_vs_dk"}
    assert {path.stem for path in tmp_path.glob("*.png")} == figures
    for name in figures:
        is_png(tmp_path / f"{name}.png")
        assert f"]({name}.png)" in text
    # One run per rule: its attention maps at the first and last probe step (0 and 3), side by side.
    maps = text.split("## Attention maps")[1].split("##")[0]
    assert maps.count("step 0<br>![") == 4 and maps.count("step 3<br>![") == 4
    for index in range(4):
        for which in ("first", "last"):
            is_png(tmp_path / "maps" / f"{index:02d}_{which}.png")


def test_runs_lost_midway_are_listed_not_dropped(sweep, tmp_path):
    copy = tmp_path / "sweep"
    shutil.copytree(sweep, copy)
    shutil.rmtree(copy / "5")  # a job whose run dir was deleted
    shutil.rmtree(copy / "2" / "csv")  # a job whose metrics were deleted
    shutil.copytree(copy / "0" / ".hydra", copy / "0" / ".hydra-resume")  # as a resume leaves it: not a run
    report = load([copy])
    assert len(report.runs) == 8
    status = {run.name.rsplit("/", 1)[-1]: run.status for run in report.runs}
    assert status["5"] == "missing" and status["2"] == "failed"
    assert sum(s == "finished" for s in status.values()) == 6
    main([str(copy), "--out", str(tmp_path / "report")])
    text = (tmp_path / "report" / "report.md").read_text()
    failed_section = text.split("## Runs that did not finish")[1]
    assert f"**missing**: `{copy / '5'}`" in failed_section and f"**failed**: `{copy / '2'}`" in failed_section
    counts = {row["attention.scale"]: row["n"] for row in final_table(text)}
    assert sorted(counts.values()) == ["1", "1", "2", "2"]


def test_a_sweep_narrowed_on_the_command_line_counts_the_jobs_hydra_ran(tmp_path):
    """experiment=scale_quick sweeps attention.scale over 4 rules in its sweeper.params; the command
    line's attention.scale=none,dk replaces that (as in Hydra), so 2 jobs ran, none is missing."""
    result = cli("attnlab-train", "-m", "experiment=scale_quick", "attention.scale=none,dk", "seed=0",
                 f"hydra.sweep.dir={tmp_path / 'sweep'}", "logger=csv", *FAST, cwd=tmp_path)  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    ran = [path for path in (tmp_path / "sweep").iterdir() if (path / "config.yaml").exists()]
    assert expected_jobs(tmp_path / "sweep") == len(ran) == 2
    assert [run.status for run in load([tmp_path / "sweep"]).runs] == ["finished", "finished"]


def test_bleu_figure_has_one_row_per_configuration_and_only_with_bleu(tmp_path):
    runs = [Run(name=f"{heads}-{seed}", config={"model.n_heads": heads, "seed": seed},
                rows=[{"step": 9, "val/bleu": 3.0 + seed, "test/bleu": heads + seed}])
            for heads in (1, 8) for seed in (0, 1)]  # fmt: skip
    groups = group_runs(runs, ["model.n_heads", "seed"])
    is_png(bleu_scores(groups, tmp_path))
    without = [Run(name=run.name, config=run.config, rows=[{"step": 9, "val/loss": 1.0}]) for run in runs]
    assert bleu_scores(group_runs(without, ["model.n_heads", "seed"]), tmp_path / "none") is None


def test_saved_data_rebuilds_the_same_report_byte_for_byte(sweep, tmp_path):
    """--save-data keeps config, run.json and metrics only; a report of the copy equals the original.
    (The first report goes through the installed console script.)"""
    result = cli("attnlab-report", str(sweep), "--out", str(tmp_path / "first"), "--save-data", str(tmp_path / "data"))
    assert result.returncode == 0, result.stderr
    assert f"report: {tmp_path / 'first' / 'report.md'}" in result.stdout
    saved = tmp_path / "data" / sweep.name
    assert not list(saved.rglob("*.ckpt")) and not list(saved.rglob("*.wandb"))
    assert (saved / "multirun.yaml").exists() and len(list(saved.glob("*/csv/version_0/metrics.csv"))) == 8
    assert len(list(saved.glob("*/attention_maps/step_*.png"))) == 16  # the first and the last of each run
    assert main([str(saved), "--out", str(tmp_path / "again")]) == 0
    first = (tmp_path / "first" / "report.md").read_text().replace(str(sweep), str(saved))
    assert (tmp_path / "again" / "report.md").read_text() == first
    for path in (tmp_path / "again").rglob("*.png"):  # figures and maps, byte for byte
        twin = tmp_path / "first" / path.relative_to(tmp_path / "again")
        assert path.read_bytes() == twin.read_bytes(), path.name


def synthetic_width_sweep(exponent_at_end: float) -> list:
    """Runs of a coordinate check whose logit std is d_k^-0.5 at t=0 and d_k^exponent at t=20."""
    runs = []
    for rule in ("dk", "sqrt_dk"):
        for d_k in (16, 32, 64, 128):
            for seed in (0, 1):
                jitter = 1 + 0.01 * seed
                logits = "attn/logit_std/enc.L0"
                rows = [{"step": 0.0, logits: d_k**-0.5 * jitter, "act/enc.self_attn": 1.0},
                        {"step": 20.0, logits: 3 * d_k**exponent_at_end, "act/enc.self_attn": 2.0}]  # fmt: skip
                config = {"attention.scale": rule, "model.d_k": d_k, "model.n_heads": 2, "seed": seed}
                runs.append(Run(name=f"{rule}-{d_k}-{seed}", config=config, rows=rows))
    return runs


def test_coordinate_check_fits_the_growth_exponent_of_constructed_sizes(tmp_path):
    runs = synthetic_width_sweep(exponent_at_end=0.75)
    table = "\n".join(coord_table(runs))
    row = next(line for line in table.splitlines() if line.startswith("| dk | `attn/logit_std/enc.L0`"))
    cells = [cell.strip() for cell in row.strip("|").split("|")]
    assert cells[2] == f"{np.mean([16**-0.5, 16**-0.5 * 1.01]):.3g} → {3 * 16**0.75:.3g}"
    assert cells[4] == "-0.50 ± 0.00" and cells[5] == "+0.75 ± 0.00"
    flat = next(line for line in table.splitlines() if "`act/enc.self_attn`" in line)
    assert flat.endswith("| +0.00 ± 0.00 | +0.00 ± 0.00 |")
    figure = coord_figure(runs, tmp_path)
    is_png(figure)
    assert coord_table(synthetic_width_sweep(0.75)[:4]) == []  # fewer than 3 widths: no coordinate check


def lr_run(rule, seed, lr, final, start=3.0):
    """A run of an LR sweep: ℓ₀ = start at step 0; final None = it diverged."""
    rows = [{"step": 0.0, "train/loss": start}]
    if final is not None:
        rows.append({"step": 299.0, "val/loss": final})
    config = {"attention.scale": rule, "optim.lr": lr, "seed": seed}
    return Run(name=f"{rule}-{lr}-{seed}", config=config, rows=rows, status="finished" if final else "diverged")


def test_lr_sensitivity_is_wortsmans_formula_on_constructed_runs(tmp_path):
    grid = [1e-3, 1e-2, 1e-1]
    # Rule A, seed 0: losses 1.0, 0.5, diverged → capped 1.0, 0.5, ℓ₀=3 → minus ℓ*=0.5 → mean (0.5+0+2.5)/3 = 1.0
    # Rule A, seed 1: 1.5, 0.5, 4.0 (worse than ℓ₀: capped at 3) → (1+0+2.5)/3 = 7/6
    # Rule B: 1.2, 0.6, 0.9 for both seeds → (0.6+0+0.3)/3 = 0.3
    runs = [lr_run("a", 0, lr, final) for lr, final in zip(grid, (1.0, 0.5, None), strict=True)]
    runs += [lr_run("a", 1, lr, final) for lr, final in zip(grid, (1.5, 0.5, 4.0), strict=True)]
    runs += [lr_run("b", seed, lr, final) for seed in (0, 1) for lr, final in zip(grid, (1.2, 0.6, 0.9), strict=True)]
    axes = ["attention.scale", "optim.lr", "seed"]
    rows = {line.split("|")[1].strip(): [c.strip() for c in line.strip("|").split("|")]
            for line in lr_table(runs, axes) if line.startswith("| scale=")}  # fmt: skip
    a, b = rows["scale=a"], rows["scale=b"]
    assert a[3] == "1" and a[4] == "0.01" and a[5] == "0.500" and a[6] == "3.000"
    assert a[7] == f"{np.mean([1.0, 7 / 6]):.3f} ± {np.std([1.0, 7 / 6], ddof=1):.3f}"
    assert b[3] == "0" and b[7] == "0.300 ± 0.000"
    is_png(lr_figure(runs, axes, tmp_path))
    assert lr_table(runs, ["attention.scale", "seed"]) == []  # no LR axis: no section


def test_length_table_averages_seeds_and_the_layers_that_see_the_sequence(tmp_path):
    def run(rule, seed, accuracy):
        row = {"step": 99.0, "length/seq_acc/len8": accuracy, "length/seq_acc/len16": accuracy / 2,
               "length/entropy_norm/enc.L0/len8": 0.2, "length/entropy_norm/dec.cross.L0/len8": 0.4,
               "length/entropy_norm/dec.self.L0/len8": 0.0}  # fmt: skip
        return Run(name=f"{rule}-{seed}", config={"attention.scale": rule, "seed": seed}, rows=[row])

    runs = [run("log_n", 0, 0.9), run("log_n", 1, 0.7), run("sqrt_dk", 0, 0.5)]
    groups = group_runs(runs, ["attention.scale", "seed"])
    text = "\n".join(lengths_table(groups))
    assert "| scale=log_n | 2 | 0.800 ± 0.141 | 0.400 ± 0.071 |" in text
    assert "| scale=sqrt_dk | 1 | 0.500 | 0.250 |" in text
    assert "| scale=log_n | 2 | 0.300 ± 0.000 | – |" in text  # (0.2 + 0.4) / 2: dec.self is left out
    is_png(lengths_figure(groups, tmp_path))


def test_bad_paths_fail_clearly(tmp_path, capsys):
    assert main([str(tmp_path / "nowhere")]) == 2
    assert "does not exist" in capsys.readouterr().err
    (tmp_path / "empty").mkdir()
    assert main([str(tmp_path / "empty")]) == 2
    assert "no runs under" in capsys.readouterr().err


@pytest.mark.parametrize("name", ["scaling_math", "compare_sweep"])
def test_notebooks_are_stored_clean_and_run(name, sweep, monkeypatch):
    path = ROOT / "notebooks" / f"{name}.ipynb"
    stored = json.loads(path.read_text())
    assert all(not cell.get("outputs") and not cell.get("execution_count") for cell in stored["cells"]
               if cell["cell_type"] == "code"), "store notebooks without outputs"  # fmt: skip
    monkeypatch.setenv("ATTNLAB_SWEEP", str(sweep))
    monkeypatch.setenv("MPLBACKEND", "Agg")
    notebook = nbformat.read(path, as_version=4)
    NotebookClient(notebook, timeout=300, kernel_name="python3", resources={"metadata": {"path": str(path.parent)}},
                   env=dict(os.environ)).execute()  # fmt: skip
    errors = [out for cell in notebook.cells for out in cell.get("outputs", []) if out.output_type == "error"]
    assert not errors


COMMITTED = sorted(path.name for path in (ROOT / "experiments").iterdir() if (path / "data" / path.name).is_dir())


@pytest.mark.parametrize("name", COMMITTED)
def test_committed_experiment_reports_rebuild_from_their_data(name, tmp_path, monkeypatch, capsys):
    """Each experiments/<name>/report.md (and claims.json) is what attnlab-report makes of the
    committed data/<name>/ (with claims.yaml where there is one): byte for byte."""
    folder = Path("experiments") / name
    monkeypatch.chdir(ROOT)  # the report names its source as given, relative to the repository
    claims = ["--claims", str(folder / "claims.yaml")] if (ROOT / folder / "claims.yaml").exists() else []
    assert main([str(folder / "data" / name), "--out", str(tmp_path), *claims]) == 0
    for made in ("report.md", "claims.json"):
        if (tmp_path / made).exists() or (ROOT / folder / made).exists():
            assert (tmp_path / made).read_text() == (ROOT / folder / made).read_text(), f"{folder / made} is stale"
