"""Claims with verdicts (attnlab.report.claims) on synthetic runs, and through attnlab-report."""

import json

import pytest
from scipy import stats

from attnlab.report import main as report_main
from attnlab.report.claims import check_names, evaluate, load_claims, welch_interval
from attnlab.report.runs import ReportError, Run


def runs_with(bleu: dict[int, list[float]]) -> list[Run]:
    """Finished runs per head count, with these test/bleu values (one run per seed)."""
    return [
        Run(
            name=f"h{heads}-s{seed}",
            config={"model.n_heads": heads, "seed": seed},
            rows=[{"step": 9, "test/bleu": value}],
        )
        for heads, values in bleu.items()
        for seed, value in enumerate(values)
    ]


def claim_file(tmp_path, **fields):
    entry = {"id": "single_head", "text": "h=1 is worse than the best h", "metric": "test/bleu",
             "runs": {"model.n_heads": 1}, "than_best_of": [{"model.n_heads": 4}, {"model.n_heads": 8}],
             "worse_by": 0.5, **fields}  # fmt: skip
    path = tmp_path / "claims.yaml"
    path.write_text(json.dumps([entry]))  # JSON is YAML
    return path


def test_welch_interval_matches_a_hand_computed_one():
    ours, theirs = [10.0, 12.0, 11.0], [14.0, 15.0]
    difference, low, high = welch_interval(ours, theirs)
    var_a, var_b = 1.0 / 3, 0.5 / 2  # sample variances over n
    dof = (var_a + var_b) ** 2 / (var_a**2 / 2 + var_b**2 / 1)
    half = stats.t.ppf(0.975, dof) * (var_a + var_b) ** 0.5
    assert difference == pytest.approx(-3.5)
    assert (low, high) == (pytest.approx(-3.5 - half), pytest.approx(-3.5 + half))


@pytest.mark.parametrize(
    ("bleu", "verdict"),
    [
        ({1: [20.0, 20.2, 19.9], 4: [22.0, 22.1, 21.9], 8: [22.5, 22.7, 22.6]}, "held"),  # 2.6 worse, tight
        ({1: [22.6, 22.8, 22.7], 4: [22.0, 22.1, 21.9], 8: [22.5, 22.7, 22.6]}, "contradicted"),  # h=1 better
        ({1: [20.0, 23.0], 4: [22.0, 22.1], 8: [22.5, 22.7]}, "inconclusive"),  # mean 1.1 worse, interval wide
        ({1: [22.3, 22.2, 22.2], 4: [22.0, 22.1, 21.9], 8: [22.5, 22.7, 22.6]}, "inconclusive"),  # ≈0.37 worse
    ],
)
def test_a_claims_verdict(tmp_path, bleu, verdict):
    (claim,) = load_claims(claim_file(tmp_path))
    outcome = evaluate(claim, runs_with(bleu))
    assert outcome.verdict == verdict
    assert outcome.comparison == {"model.n_heads": 8}  # the best of the comparisons
    assert outcome.gain == pytest.approx(sum(bleu[1]) / len(bleu[1]) - sum(bleu[8]) / len(bleu[8]))
    if verdict == "inconclusive" and len(bleu[1]) == 2:  # the mean says "worse by > 0.5", the interval does not
        assert outcome.gain < -0.5 < outcome.high


def test_lower_is_better_metrics_and_one_seed(tmp_path):
    runs = [Run(name=str(i), config={"model.n_heads": h}, rows=[{"step": 1, "val/ppl": p}])
            for i, (h, p) in enumerate([(1, 9.0), (1, 9.2), (8, 7.0), (8, 7.1)])]  # fmt: skip
    path = claim_file(tmp_path, metric="val/ppl", higher_is_better=False, than_best_of=None,
                      than={"model.n_heads": 8}, worse_by=1.0)  # fmt: skip
    data = json.loads(path.read_text())
    del data[0]["than_best_of"]
    path.write_text(json.dumps(data))
    (claim,) = load_claims(path)
    outcome = evaluate(claim, runs)
    assert outcome.gain == pytest.approx(-(9.1 - 7.05))  # higher perplexity = worse
    assert outcome.verdict in ("held", "inconclusive") and outcome.high < 0
    # one run on a side: never held, however large the gap
    assert evaluate(claim, runs[1:]).verdict == "inconclusive"


def test_malformed_claims_are_refused_with_the_fix(tmp_path):
    with pytest.raises(ReportError, match="exactly one of than / than_best_of"):
        load_claims(claim_file(tmp_path, than={"model.n_heads": 4}))
    with pytest.raises(ReportError, match="unknown keys \\['worse'\\]"):
        load_claims(claim_file(tmp_path, worse=1))
    with pytest.raises(ReportError, match="no such file"):
        load_claims(tmp_path / "missing.yaml")
    (tmp_path / "broken.yaml").write_text("- id: [\n")
    with pytest.raises(ReportError, match=r"broken\.yaml is not valid YAML"):
        load_claims(tmp_path / "broken.yaml")


def test_claims_naming_what_no_run_has_are_refused_or_warned(tmp_path):
    runs = runs_with({1: [20.0, 20.2], 4: [22.0, 22.1], 8: [22.5, 22.7]})
    (typo,) = load_claims(claim_file(tmp_path, metric="test/bleuu"))
    with pytest.raises(ReportError, match="no run logs metric 'test/bleuu'; did you mean 'test/bleu'"):
        check_names(typo, runs)
    (typo,) = load_claims(claim_file(tmp_path, runs={"model.n_head": 1}))
    with pytest.raises(ReportError, match=r"no run.s config has .model\.n_head.; did you mean .model\.n_heads."):
        check_names(typo, runs)
    (missing_row,) = load_claims(claim_file(tmp_path, runs={"model.n_heads": 3}))
    assert check_names(missing_row, runs) == ["claim single_head: no run has model.n_heads=3 (these runs have 1, 4, 8)"]
    assert evaluate(missing_row, runs).verdict == "inconclusive"


def test_the_report_writes_the_claims_table_and_json(tmp_path, capsys):
    from attnlab.report import Report, write_report

    runs = runs_with({1: [20.0, 20.2, 19.9], 4: [22.0, 22.1, 21.9], 8: [22.5, 22.7, 22.6]})
    report = Report(runs, ["model.n_heads", "seed"], [])
    path = write_report(report, tmp_path / "out", ["synthetic"], str(claim_file(tmp_path)))
    text = path.read_text()
    assert "## Claims" in text and "| h=1 is worse than the best h |" in text and "**held**" in text
    (record,) = json.loads((tmp_path / "out" / "claims.json").read_text())
    assert record["verdict"] == "held" and record["ours"] == [20.0, 20.2, 19.9]
    assert report_main([str(tmp_path / "nothing"), "--claims", "x.yaml"]) == 2  # a bad path: an error, no traceback
