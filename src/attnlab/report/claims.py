"""Published claims, checked against the runs: effect, mean ± std over seeds, a 95 % interval, a verdict.

An experiment folder's ``claims.yaml`` lists the claims it tests (``attnlab-report PATH
--claims claims.yaml``). Each compares the runs ``runs`` selects with those ``than``
selects (or, with ``than_best_of``, the best-scoring of several selections), on one
metric, and says by how much the first should be worse (``worse_by``) or better
(``better_by``); 0 means "worse" / "better" at all, and ``better_by: -0.5`` means "no
worse than 0.5":

    - id: single_head
      text: Single-head attention is worse than the best head count
      source: Vaswani et al. 2017, Table 3 (A)
      published: 0.9 BLEU worse (24.9 vs 25.8)
      metric: test/bleu
      higher_is_better: true
      runs: {model.n_heads: 1}
      than_best_of: [{model.n_heads: 4}, {model.n_heads: 8}]
      worse_by: 0.5

A selection is {config key: value}, matched against each finished run's resolved config
(flattened: ``model.n_heads``). The gain is (mean of runs − mean of comparison), signed so
that positive = better; its 95 % interval is Welch's t interval over the seeds. The claim
*held* when the whole interval lies on the claimed side of the threshold (−worse_by or
+better_by), *contradicted* when it lies wholly on the other side, and *inconclusive*
when it straddles the threshold or a side has fewer than 2 runs — never held on a mean alone.
"""

from __future__ import annotations

import difflib
import math
import statistics
from dataclasses import dataclass
from pathlib import Path

import yaml

from attnlab.report.runs import ReportError, Run

LEVEL = 0.95
KEYS = {"id", "text", "source", "published", "metric", "higher_is_better", "runs", "than", "than_best_of",
        "worse_by", "better_by"}  # fmt: skip


@dataclass
class Claim:
    id: str
    text: str
    metric: str
    runs: dict
    comparisons: list[dict]  # one selection (than), or several to take the best of (than_best_of)
    threshold: float  # on the gain (positive = runs better): −worse_by or +better_by
    direction: str  # "worse" or "better": the side of the threshold the claim puts the gain on
    higher_is_better: bool = True
    source: str = ""
    published: str = ""

    @property
    def wants_better(self) -> bool:
        return self.direction == "better"


@dataclass
class Outcome:
    claim: Claim
    ours: list[float]
    theirs: list[float]
    comparison: dict  # the selection compared against (the best one, for than_best_of)
    gain: float | None
    low: float | None
    high: float | None
    verdict: str

    def record(self) -> dict:
        return {
            "id": self.claim.id, "metric": self.claim.metric, "runs": self.claim.runs, "than": self.comparison,
            "ours": self.ours, "theirs": self.theirs, "gain": self.gain, "interval": [self.low, self.high],
            "level": LEVEL, "threshold": self.claim.threshold, "verdict": self.verdict,
        }  # fmt: skip


def load_claims(path: str | Path) -> list[Claim]:
    """The claims of a claims.yaml; a malformed entry is refused with its id and the fix."""
    path = Path(path)
    if not path.is_file():
        raise ReportError(f"--claims {path}: no such file")
    try:
        entries = yaml.safe_load(path.read_text()) or []
    except yaml.YAMLError as error:
        raise ReportError(f"{path} is not valid YAML: {' '.join(str(error).split())}") from None
    if not isinstance(entries, list):
        raise ReportError(f"{path}: give a list of claims (each `- id: …`), not a {type(entries).__name__}")
    claims = []
    for number, entry in enumerate(entries, start=1):
        where = f"{path}, claim {entry.get('id', number) if isinstance(entry, dict) else number}"
        if not isinstance(entry, dict):
            raise ReportError(f"{where}: each claim is a mapping (id, text, metric, runs, than, worse_by …)")
        unknown = set(entry) - KEYS
        if unknown:
            raise ReportError(f"{where}: unknown keys {sorted(unknown)}; accepted: {', '.join(sorted(KEYS))}")
        missing = [key for key in ("id", "text", "metric", "runs") if key not in entry]
        if missing or ("than" in entry) == ("than_best_of" in entry) or ("worse_by" in entry) == ("better_by" in entry):
            raise ReportError(
                f"{where}: give id, text, metric, runs, exactly one of than / than_best_of and exactly one of "
                f"worse_by / better_by" + (f" (missing: {', '.join(missing)})" if missing else "")
            )
        margin = entry.get("worse_by", entry.get("better_by"))
        if not isinstance(margin, int | float) or isinstance(margin, bool):
            raise ReportError(f"{where}: worse_by / better_by is a number in the metric's units; got {margin!r}")
        direction = "worse" if "worse_by" in entry else "better"
        claims.append(
            Claim(
                id=str(entry["id"]), text=entry["text"], metric=entry["metric"], runs=dict(entry["runs"]),
                comparisons=[dict(entry["than"])] if "than" in entry else [dict(s) for s in entry["than_best_of"]],
                threshold=-margin if direction == "worse" else margin, direction=direction,
                higher_is_better=bool(entry.get("higher_is_better", True)),
                source=entry.get("source", ""), published=str(entry.get("published", "")),
            )
        )  # fmt: skip
    return claims


def check_names(claim: Claim, runs: list[Run]) -> list[str]:
    """Refuse a claim naming a metric or config key that no run has (a typo, not a result);
    return a warning for each selected value no run has (a typo, or a row not run yet)."""
    logged = set().union(*(run.metric_names() for run in runs))
    if claim.metric not in logged:
        raise ReportError(f"claim {claim.id}: no run logs metric {claim.metric!r}{did_you_mean(claim.metric, logged)}")
    keys = set().union(*(run.config for run in runs))
    warnings = []
    for selection in (claim.runs, *claim.comparisons):
        for key, value in selection.items():
            if key not in keys:
                raise ReportError(f"claim {claim.id}: no run's config has {key!r}{did_you_mean(key, keys)}")
            if not any(matches(run, {key: value}) for run in runs):
                seen = sorted({str(run.config[key]) for run in runs if key in run.config}, key=lambda v: (len(v), v))
                warnings.append(f"claim {claim.id}: no run has {key}={value!r} (these runs have {', '.join(seen)})")
    return warnings


def did_you_mean(name: str, names: set[str]) -> str:
    close = difflib.get_close_matches(name, sorted(names), n=3)
    return f"; did you mean {' or '.join(map(repr, close))}?" if close else ""


def matches(run: Run, selection: dict) -> bool:
    return all(run.config.get(key) == value for key, value in selection.items())


def values(runs: list[Run], selection: dict, metric: str) -> list[float]:
    found = [run.last(metric) for run in runs if run.status == "finished" and matches(run, selection)]
    return [value for value in found if value is not None and not math.isnan(value)]


def welch_interval(ours: list[float], theirs: list[float], level: float = LEVEL) -> tuple[float, float, float]:
    """mean(ours) − mean(theirs) and Welch's t interval for it (unequal variances)."""
    from scipy import stats

    difference = statistics.mean(ours) - statistics.mean(theirs)
    var_ours, var_theirs = statistics.variance(ours) / len(ours), statistics.variance(theirs) / len(theirs)
    se = math.sqrt(var_ours + var_theirs)
    if se == 0:
        return difference, difference, difference
    dof = (var_ours + var_theirs) ** 2 / (var_ours**2 / (len(ours) - 1) + var_theirs**2 / (len(theirs) - 1))
    half = stats.t.ppf(0.5 + level / 2, dof) * se
    return difference, difference - half, difference + half


def verdict(low: float, high: float, threshold: float, wants_better: bool) -> str:
    """held / contradicted / inconclusive: where the interval of the gain lies against the threshold."""
    claimed_side = low > threshold if wants_better else high < threshold
    other_side = high < threshold if wants_better else low > threshold
    return "held" if claimed_side else "contradicted" if other_side else "inconclusive"


def evaluate(claim: Claim, runs: list[Run]) -> Outcome:
    sign = 1 if claim.higher_is_better else -1
    ours = values(runs, claim.runs, claim.metric)
    candidates = [(selection, values(runs, selection, claim.metric)) for selection in claim.comparisons]
    candidates = [(selection, found) for selection, found in candidates if found]
    if not candidates or not ours:
        return Outcome(claim, ours, [], claim.comparisons[0], None, None, None, "inconclusive")
    # the best comparison by its mean (for than_best_of; one candidate otherwise)
    comparison, theirs = max(candidates, key=lambda item: sign * statistics.mean(item[1]))
    gain = sign * (statistics.mean(ours) - statistics.mean(theirs))
    if len(ours) < 2 or len(theirs) < 2:
        return Outcome(claim, ours, theirs, comparison, gain, None, None, "inconclusive")
    _, low, high = welch_interval(ours, theirs)
    low, high = sorted((sign * low, sign * high))
    return Outcome(
        claim, ours, theirs, comparison, gain, low, high, verdict(low, high, claim.threshold, claim.wants_better)
    )


def describe(selection: dict) -> str:
    return ", ".join(f"{key.rsplit('.', 1)[-1]}={value}" for key, value in selection.items())


def spread(found: list[float]) -> str:
    if not found:
        return "no runs"
    std = f" ± {statistics.stdev(found):.3g}" if len(found) > 1 else ""
    return f"{statistics.mean(found):.3g}{std} (n={len(found)})"


def claims_table(outcomes: list[Outcome]) -> list[str]:
    header = ["claim", "published", "ours: runs", "ours: compared with", "gain (95% CI)", "threshold", "verdict"]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for outcome in outcomes:
        claim = outcome.claim
        gain = "–" if outcome.gain is None else f"{outcome.gain:+.3g}"
        if outcome.low is not None:
            gain += f" [{outcome.low:+.3g}, {outcome.high:+.3g}]"
        cells = [
            f"{claim.text} — {claim.source}" if claim.source else claim.text,
            claim.published or "–",
            f"{describe(claim.runs)}: {claim.metric} {spread(outcome.ours)}",
            f"{describe(outcome.comparison)}: {spread(outcome.theirs)}",
            gain,
            f"{claim.threshold:+g}" if claim.threshold else "0",
            f"**{outcome.verdict}**",
        ]
        lines.append("| " + " | ".join(cells) + " |")
    lines += [
        "",
        f"gain = mean of the runs − mean of the comparison, signed so that positive = better; its {LEVEL:.0%} "
        "interval is Welch's t over seeds. held: the interval is wholly on the claimed side of the threshold; "
        "contradicted: wholly on the other side; inconclusive: it straddles the threshold, or a side has < 2 runs.",
    ]
    return lines
