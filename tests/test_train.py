"""attnlab-train end to end: every config runs, logs, checkpoints, resumes and fails clearly."""

import re
from pathlib import Path

import pytest
import torch
from omegaconf import OmegaConf

from attnlab import wandb_records
from attnlab.config import ConfigError
from attnlab.data.module import Vocabulary, collate_seq2seq
from attnlab.data.synthetic import synthetic_splits, vocab_size
from attnlab.runs import read_config, read_metrics, series
from attnlab.task import SequenceTask
from attnlab.train import train
from helpers import FAST, ROOT, cli, compose_run, run_train, wandb_run_files
from sword_fixture import write_module

CONF = ROOT / "conf"
FAST_CLI = [override for override in FAST if "checkpoint" not in override]


def names(group):
    return sorted(path.stem for path in (CONF / group).glob("*.yaml"))


def read_yaml(name: str) -> dict:
    return OmegaConf.to_container(OmegaConf.load(CONF / f"{name}.yaml"))


def last_checkpoint(run_dir: Path) -> dict:
    return torch.load(run_dir / "checkpoints" / "last.ckpt", weights_only=False, map_location="cpu")


# --- smoke runs of every config ----------------------------------------------------------


@pytest.mark.parametrize("data", [name for name in names("data") if name not in ("translation", "text")])
@pytest.mark.parametrize("model", ["transformer", "lm"])
def test_every_synthetic_task_with_both_models(tmp_path, data, model):
    loss = run_train(tmp_path, f"data={data}", f"model={model}", "logger=csv")
    assert loss == loss  # not NaN: val/loss was computed
    assert (tmp_path / "checkpoints" / "last.ckpt").exists()


def tiny_translation(tmp_path):
    """Overrides that point data=translation at a SWORD fixture, through the real reader."""
    from test_data import ENGLISH, SPANISH

    sword = tmp_path / "sword"
    write_module(sword, "engTEST", ENGLISH, versification="NRSVA")
    write_module(sword, "spaTEST", SPANISH, versification="KJV")
    return [
        f"data.sword_dir={sword}", "data.source_module=engTEST", "data.target_module=spaTEST",
        "data.vocab_size=300", "data.val_size=1", "data.test_size=1", "data.batch_size=2",
        "data.eval_batch_size=2", f"paths.cache_dir={tmp_path / 'cache'}",
    ]  # fmt: skip


def test_translation_config_trains_and_logs_bleu(tmp_path):
    run_train(tmp_path / "run", "data=translation", *tiny_translation(tmp_path), "logger=csv", fast_data=False)
    _, bleu = series(read_metrics(tmp_path / "run"), "val/bleu")
    assert len(bleu) == 2 and all(0 <= value <= 100 for value in bleu)


def test_text_config_trains_the_lm(tmp_path):
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("\n".join(f"line {i} of a small corpus about attention." for i in range(300)))
    run_train(
        tmp_path / "run", "model=lm", "data=text", f"data.files.train={corpus}", "data.vocab_size=200",
        "data.block_size=16", f"paths.cache_dir={tmp_path / 'cache'}", "logger=csv", fast_data=False,
    )  # fmt: skip
    assert series(read_metrics(tmp_path / "run"), "val/ppl")[1]


@pytest.mark.parametrize("attention", names("attention"))
@pytest.mark.parametrize("scale", ["none", "dk", "learned", "0.5"])
def test_every_attention_config_and_scale(tmp_path, attention, scale):
    loss = run_train(tmp_path, f"attention={attention}", f"attention.scale={scale}", "logger=none", "test=false")
    written = last_checkpoint(tmp_path)
    assert loss == loss and written["global_step"] == 6
    assert str(written["hyper_parameters"]["config"]["attention"]["scale"]) == scale
    learned = [key for key in written["state_dict"] if key.endswith("temperature.log_tau")]
    assert bool(learned) == (scale == "learned")  # a learned τ is a parameter, in the checkpoint


@pytest.mark.parametrize("optim", names("optim"))
def test_every_optimiser_config(tmp_path, optim):
    loss = run_train(tmp_path, f"optim={optim}", "logger=none", "test=false")
    written = last_checkpoint(tmp_path)
    assert loss == loss
    assert written["hyper_parameters"]["config"]["optim"]["name"] == read_yaml(f"optim/{optim}")["name"]
    assert written["optimizer_states"][0]["state"]  # the optimizer stepped and its moments were saved


def test_base_model_config_builds_and_steps(tmp_path):
    run_train(
        tmp_path, "model=transformer_base", "logger=none", "test=false",
        "trainer.max_steps=1", "trainer.val_check_interval=1", "data.val_size=8", "data.batch_size=4",
    )  # fmt: skip
    state = last_checkpoint(tmp_path)["state_dict"]
    assert {key.split(".")[3] for key in state if key.startswith("model.encoder.layers.")} == {str(i) for i in range(6)}
    assert state["model.encoder.layers.0.ffn.0.weight"].shape == (2048, 512)


@pytest.mark.parametrize("experiment", names("experiment"))
def test_every_experiment_runs_one_job(tmp_path, experiment):
    composed = compose_run(tmp_path / "run", [f"experiment={experiment}"], fast=False)  # its own or inherited groups
    if composed.data.name == "translation":
        overrides, fast_data = [*tiny_translation(tmp_path), "data.source=sword"], False
    else:
        overrides, fast_data = [], True
    if composed.model.d_model >= 512:  # transformer_base's 63M parameters step in test_base_model_config_builds…
        overrides += ["model.d_model=64", "model.d_ff=128", "model.n_layers=1"]
    cfg = compose_run(tmp_path / "run", [f"experiment={experiment}", "logger=csv", *overrides], fast_data=fast_data)
    assert cfg.name == experiment
    train(cfg)
    assert series(read_metrics(tmp_path / "run"), "val/loss")[1]


@pytest.mark.parametrize("trainer", ["gpu", "ddp"])
def test_gpu_trainer_configs_compose(tmp_path, trainer):
    cfg = compose_run(tmp_path, [f"trainer={trainer}"])
    assert cfg.trainer.accelerator == "gpu" and cfg.trainer.precision == "bf16-mixed"


# --- the main job leaves a complete run dir, with a readable W&B offline run ---------------


def test_cli_main_job_writes_config_checkpoints_metrics_and_wandb(tmp_path):
    result = cli("attnlab-train", f"hydra.run.dir={tmp_path}", "trainer.max_steps=40",
                 "trainer.val_check_interval=20")  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    # The console: a bar counted in steps, the model's size, one summary at the end, no W&B history.
    console = result.stdout + result.stderr
    assert "Epoch 0/-2" not in console and "40/40" in console
    assert re.search(r"attnlab: Transformer with \d{3},\d{3} parameters\n", console)
    (offline,) = (tmp_path / "wandb").glob("offline-run-*")
    assert "attnlab: finished at step 40 in " in console and f"W&B (offline): wandb sync {offline}" in console
    assert f"best checkpoint: {tmp_path / 'checkpoints' / 'best.ckpt'}" in console
    assert "Run history" not in console and "LeafSpec" not in console and "weights_only" not in console
    for name in (
        "config.yaml",
        "csv/version_0/metrics.csv",
        "checkpoints/last.ckpt",
        "checkpoints/best.ckpt",
    ):
        assert (tmp_path / name).exists(), name
    header = (tmp_path / "csv/version_0/metrics.csv").read_text().splitlines()[0].split(",")
    assert {"train/loss", "val/loss", "val/ppl", "val/acc", "lr", "perf/tokens_per_s"} <= set(header)

    (run_file,) = wandb_run_files(tmp_path)
    rows = wandb_records.history(run_file)
    train_losses = [row["train/loss"] for row in rows if "train/loss" in row]
    val_losses = [row["val/loss"] for row in rows if "val/loss" in row]
    assert len(train_losses) >= 4 and len(val_losses) == 2
    assert train_losses[-1] < train_losses[0]
    config = wandb_records.config(run_file)
    assert config["attention.scale"] == "sqrt_dk" and config["model.n_heads"] == 4
    step_metrics = {(r.metric.glob_name or r.metric.name, r.metric.step_metric) for r in wandb_records.records(run_file)
                    if r.WhichOneof("record_type") == "metric"}  # fmt: skip
    assert ("*", "trainer/global_step") in step_metrics  # define_metric: panels share the step axis
    info = wandb_records.run_info(run_file)
    assert info["group"] == "default" and "default" in info["tags"] and info["job_type"] == "train"


# --- resume ------------------------------------------------------------------------------


def test_resume_continues_to_the_same_weights_as_an_uninterrupted_run(tmp_path):
    from lightning.pytorch.callbacks import Callback

    class Crash(Callback):
        def on_train_batch_start(self, trainer, *args):
            if trainer.global_step == 8:
                raise RuntimeError("simulated crash")

    common = ["trainer.max_steps=12", "callbacks.checkpoint_every_n_steps=6", "trainer.val_check_interval=6",
              "model.dropout=0.1", "logger=wandb", "test=false"]  # fmt: skip
    run_train(tmp_path / "straight", *common)
    with pytest.raises(RuntimeError, match="simulated crash"):
        run_train(tmp_path / "resumed", *common, extra_callbacks=(Crash(),))
    assert torch.load(tmp_path / "resumed/checkpoints/last.ckpt", weights_only=False)["global_step"] == 6
    run_train(tmp_path / "ignored", f"resume={tmp_path / 'resumed'}", fast=False)  # its own max_steps=12

    straight = torch.load(tmp_path / "straight/checkpoints/last.ckpt", weights_only=False)
    resumed = torch.load(tmp_path / "resumed/checkpoints/last.ckpt", weights_only=False)
    assert resumed["global_step"] == straight["global_step"] == 12
    for name, tensor in straight["state_dict"].items():
        torch.testing.assert_close(resumed["state_dict"][name], tensor, msg=name)
    # the same W&B run continued: one run id, steps 6..12 appended to it
    ids = {wandb_records.run_info(path)["id"] for path in wandb_run_files(tmp_path / "resumed")}
    assert len(ids) == 1
    # a max_steps given when resuming extends the run
    run_train(tmp_path / "ignored", f"resume={tmp_path / 'resumed'}", "trainer.max_steps=14", fast=False)
    assert torch.load(tmp_path / "resumed/checkpoints/last.ckpt", weights_only=False)["global_step"] == 14


def test_resume_of_a_missing_run_says_what_is_missing(tmp_path):
    with pytest.raises(ConfigError, match=r"last\.ckpt|config\.yaml"):
        run_train(tmp_path, f"resume={tmp_path / 'nowhere'}")


# --- bad configuration fails before training, naming key, value and choices ---------------


@pytest.mark.parametrize(
    "overrides,expected",
    [
        (["attention.scale=sqrt"], r"attention.scale='sqrt'.*none.*sqrt_dk.*dk.*learned"),
        (["attention.scale=-2"], r"attention.scale=-2.*finite number > 0"),
        (["attention.variant=bilinear"], r"attention.variant='bilinear'.*additive.*cosine.*dot"),
        (["model.d_model=50", "model.n_heads=4"], r"model.d_model=50 .*model.n_heads=4.*model.d_k"),
        (["model.kind=rnn"], r"model.kind='rnn'.*transformer.*lm"),
        (["data.name=mnist"], r"data.name='mnist'.*copy.*recall"),
        (["optim.schedule=linear"], r"optim.schedule='linear'.*inverse_sqrt"),
        (["data=text", "model=transformer"], r"data=text.*model=lm"),
        (["trainer.max_steps=0"], r"trainer.max_steps=0.*positive"),
        (["data=lookup", "data.vocab=16", "data.eval_lengths=[8,32]"], r"data.eval_lengths=\[8, 32\].*at least 32"),
        (["model.positions=learned"], r"model.positions='learned'.*sinusoidal, none"),
        (["attention.scale=ssmax", "attention.scale_options.ssmax.init=-1"], r"attention.scale_options.ssmax.init=-1"),
    ],
)
def test_bad_config_fails_before_training(tmp_path, overrides, expected):
    with pytest.raises(ConfigError, match=expected):
        run_train(tmp_path, *overrides, fast_data=False)
    assert not (tmp_path / "checkpoints").exists()


def test_cli_reports_a_bad_config_and_a_bad_group_choice(tmp_path):
    result = cli("attnlab-train", f"hydra.run.dir={tmp_path}", "attention.scale=sqrtdk")
    assert result.returncode != 0
    assert "attention.scale='sqrtdk' is not valid" in result.stderr
    result = cli("attnlab-train", f"hydra.run.dir={tmp_path}", "data=imagenet")
    assert result.returncode != 0 and "data/imagenet" in result.stderr and "copy" in result.stderr


def test_a_rule_from_the_users_own_module_runs_from_the_cli(tmp_path):
    """tests/user_rule.py registers `sqrt_length`; `imports=` is all the CLI needs to run it."""
    tests_dir = {"PYTHONPATH": str(ROOT / "tests")}
    result = cli("attnlab-train", f"hydra.run.dir={tmp_path / 'run'}", "imports=[user_rule]",
                 "attention.scale=sqrt_length", "+attention.scale_options.sqrt_length.base=16",
                 *FAST, "callbacks.probes.every_n_steps=3", "logger.wandb=false", env=tests_dir)  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    config = OmegaConf.load(tmp_path / "run" / "config.yaml")
    assert config.attention.scale == "sqrt_length" and config.attention.scale_options.sqrt_length.base == 16
    header = (tmp_path / "run" / "csv/version_0/metrics.csv").read_text().splitlines()[0].split(",")
    assert "attn/gain/enc.L0.H0" in header and "attn/entropy/dec.cross.L0" in header

    with pytest.raises(ConfigError, match=r"imports: module 'no_such_rules' cannot be imported"):
        run_train(tmp_path / "bad", "imports=[no_such_rules]")
    with pytest.raises(ConfigError, match=r"scale='no_such_rule' .*register your own rule with @register_temperature"):
        run_train(tmp_path / "bad", "attention.scale=no_such_rule")
    assert not (tmp_path / "bad").exists()


def test_length_generalisation_metrics_equal_the_final_model_on_fresh_test_sets(tmp_path):
    run_train(tmp_path, "data=lookup", "data.vocab=16", "data.max_len=4", "data.eval_lengths=[4,12]",
              "model.positions=none", "attention.scale=log_n", "test=false", "logger=csv")  # fmt: skip
    logged = {key: value for row in read_metrics(tmp_path) for key, value in row.items() if key.startswith("length/")}
    assert {f"length/seq_acc/len{n}" for n in (4, 12)} <= set(logged)
    assert "length/entropy_norm/enc.L1/len12" in logged and "length/max_weight/dec.cross.L0/len4" in logged
    # Reference: the final weights (last.ckpt) on the test split of each length, scored here.
    cfg = read_config(tmp_path)
    model = SequenceTask(cfg, Vocabulary(size=vocab_size("lookup", 16))).model.eval()
    state = torch.load(tmp_path / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=False)["state_dict"]
    model.load_state_dict({key.removeprefix("model."): value for key, value in state.items()})
    for length in (4, 12):
        split = synthetic_splits("lookup", 16, length, length, {"test": cfg["data"]["test_size"]}, cfg["seed"])["test"]
        batch = collate_seq2seq(list(split))
        with torch.no_grad():
            logits, targets = model.forward_batch(batch)
        scored = targets != -100
        exact = ((logits.argmax(-1) == targets) | ~scored).all(1).float().mean().item()
        assert logged[f"length/seq_acc/len{length}"] == pytest.approx(exact, abs=1e-6)


# --- sweeps: DDP inside a multirun, and the joblib launcher ------------------------------


def sweep_jobs(sweep_dir):
    return sorted(path for path in Path(sweep_dir).iterdir() if path.is_dir())


def test_ddp_inside_a_multirun_gives_one_dir_and_one_wandb_run_per_job(tmp_path):
    result = cli(
        "attnlab-train", "-m", "trainer=ddp_cpu", "attention.scale=none,learned",
        f"hydra.sweep.dir={tmp_path}",
        "trainer.max_steps=6", "trainer.val_check_interval=3", "trainer.enable_progress_bar=false",
        "data.train_size=256", "data.val_size=64", "data.test_size=64", "data.batch_size=16",
        cwd=tmp_path,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    jobs = sweep_jobs(tmp_path)
    assert [job.name for job in jobs] == ["0", "1"]  # no rank ran a sweep of its own
    assert not (tmp_path / "multirun").exists() and not (tmp_path / "outputs").exists()
    scales = []
    for job in jobs:
        (run_file,) = wandb_run_files(job)
        scales.append(wandb_records.config(run_file)["attention.scale"])
        probed = [row for row in wandb_records.history(run_file) if "attn/entropy/dec.cross.L1" in row]
        assert [row["trainer/global_step"] for row in probed] == [0]  # reduced over ranks, logged once
        assert (job / "checkpoints/last.ckpt").exists() and (job / "rank1.log").exists()
        assert len(list((job / "csv").iterdir())) == 1
        assert "WORLD_SIZE: 2" in result.stderr or "MEMBER: 2/2" in result.stderr
    assert scales == ["none", "learned"]


def test_joblib_launcher_runs_jobs_in_parallel_processes(tmp_path):
    result = cli(
        "attnlab-train", "-m", "hydra/launcher=joblib", "hydra.launcher.n_jobs=2", "attention.scale=none,dk",
        f"hydra.sweep.dir={tmp_path}", "logger=csv", *FAST_CLI, cwd=tmp_path,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    jobs = sweep_jobs(tmp_path)
    assert [job.name for job in jobs] == ["0", "1"]
    assert [read_config(job)["attention"]["scale"] for job in jobs] == ["none", "dk"]
    assert all(read_metrics(job) for job in jobs)
    assert "joblib" in (tmp_path / "multirun.yaml").read_text()


def test_a_diverging_run_stops_with_the_cause_and_keeps_what_it_wrote(tmp_path):
    with pytest.raises(FloatingPointError, match=r"diverged.*optim.lr"):
        run_train(tmp_path, "optim.lr=1e30", "optim.warmup_steps=1", "trainer.gradient_clip_val=null",
                  "trainer.max_steps=30", "logger=wandb")  # fmt: skip
    assert (tmp_path / "config.yaml").exists() and read_metrics(tmp_path)
    (run_file,) = wandb_run_files(tmp_path)
    assert [row["train/loss"] for row in wandb_records.history(run_file) if "train/loss" in row]
