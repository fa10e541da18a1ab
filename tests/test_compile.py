"""model.compile=true: torch.compile changes the speed, not the run (slow: compiling takes a minute)."""

import pytest
import torch

from attnlab.runs import read_metrics
from helpers import run_train

pytestmark = pytest.mark.slow

COMMON = [
    "model=lm",
    "data=reverse",
    "model.dropout=0.0",  # dropout draws differ between compiled and eager kernels
    "callbacks.probes.every_n_steps=2",
    "trainer.max_steps=4",
    "logger=csv",
    "test=false",
]


def logged(run_dir) -> dict[tuple[float, str], float]:
    return {(row["step"], key): value for row in read_metrics(run_dir) for key, value in row.items() if key != "step"}


def test_a_compiled_run_logs_what_the_eager_run_logs_probe_steps_included(tmp_path):
    run_train(tmp_path / "eager", *COMMON)
    try:
        run_train(tmp_path / "compiled", *COMMON, "model.compile=true")
    finally:
        torch._dynamo.reset()  # no compiled code left behind for later tests in this process
    eager, compiled = logged(tmp_path / "eager"), logged(tmp_path / "compiled")
    compared = [key for key in eager if not key[1].startswith(("perf/", "time/"))]
    assert {name for _, name in compared} >= {"train/loss", "val/loss", "attn/entropy/L0", "grad/logits/L1"}
    assert {step for step, name in compared if name == "attn/entropy/L0"} == {0, 2}  # probe steps ran, compiled
    for key in compared:
        assert compiled[key] == pytest.approx(eager[key], rel=2e-4, abs=1e-6), key
    # compiled in place: the checkpoint's parameter names are the eager model's
    states = [torch.load(path / "checkpoints/last.ckpt", weights_only=False)["state_dict"] for path in
              (tmp_path / "eager", tmp_path / "compiled")]  # fmt: skip
    assert list(states[0]) == list(states[1])
