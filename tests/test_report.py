"""attnlab-report on a real tiny sweep, and the notebooks executed on it."""

import json
import os
import shutil

import matplotlib.image
import nbformat
import pytest
from nbclient import NotebookClient

from attnlab.report import load, main
from helpers import FAST, ROOT, cli

RULES = ["none", "sqrt_dk", "dk", "learned"]


@pytest.fixture(scope="module")
def sweep(tmp_path_factory):
    """4 scale rules × 2 seeds, a few steps each, probes every 3 steps."""
    sweep_dir = tmp_path_factory.mktemp("sweep")
    result = cli(
        "attnlab-train", "-m", f"attention.scale={','.join(RULES)}", "seed=0,1", f"hydra.sweep.dir={sweep_dir}",
        "logger=csv", "callbacks.probes.every_n_steps=3", "name=tiny", *FAST, cwd=sweep_dir,
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


def test_bad_paths_fail_clearly(tmp_path, capsys):
    assert main([str(tmp_path / "nowhere")]) == 2
    assert "does not exist" in capsys.readouterr().err
    (tmp_path / "empty").mkdir()
    assert main([str(tmp_path / "empty")]) == 2
    assert "no runs under" in capsys.readouterr().err


def test_cli_entry_point(sweep, tmp_path):
    result = cli("attnlab-report", str(sweep), "--out", str(tmp_path))
    assert result.returncode == 0, result.stderr
    assert (tmp_path / "report.md").exists()


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
