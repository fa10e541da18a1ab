"""The Vaswani recipe: BLEU over whole splits, the paper's schedule, token batches, checkpoint averaging."""

import json
import math

import pytest
import sacrebleu
import torch
from omegaconf import OmegaConf

from attnlab import wandb_records
from attnlab.averaging import average_state_dicts, write_average
from attnlab.data.module import StreamBatchSampler, TokenBatchSampler
from attnlab.evaluation import Bleu
from attnlab.optim import build_optimizer
from attnlab.runs import read_metrics, series
from helpers import ROOT, run_train, wandb_run_files
from test_train import tiny_translation

# --- BLEU ------------------------------------------------------------------------------

HYPOTHESES = ["the cat sat on the mat", "there is a dog in the house", "he said unto them , go"]
REFERENCES = ["the cat sat on the mat .", "a dog is in the house", "and he said unto them, Go."]


class FixedTranslator:
    """A 'model' whose decodes are 10 + the index of the hypothesis above (one id per sentence)."""

    def generate(self, src, src_mask, bos, eos, beam, alpha, extra_length):
        self.beam = beam
        return torch.stack([torch.tensor([10 + int(i), eos]) for i in src[:, 0]])


def test_bleu_is_sacrebleus_corpus_bleu_with_its_signature():
    from attnlab.data.module import Vocabulary

    bleu = Bleu(Vocabulary(size=8, decode=lambda ids: HYPOTHESES[ids[0] - 10]), 4, 0.6, 50)
    model = FixedTranslator()
    # two batches: the corpus is scored as a whole, not batch by batch
    bleu.add(model, {"src": torch.tensor([[0], [1]]), "src_mask": None, "tgt_text": REFERENCES[:2]}, "beam")
    assert model.beam == 4
    bleu.add(model, {"src": torch.tensor([[2]]), "src_mask": None, "tgt_text": REFERENCES[2:]}, "beam")
    result = bleu.compute("beam")
    expected = sacrebleu.corpus_bleu(HYPOTHESES, [REFERENCES])
    assert result.score == pytest.approx(expected.score) and 0 < result.score < 100
    assert result.signature.startswith("nrefs:1|case:mixed|eff:no|tok:13a|smooth:exp|version:")
    assert result.sentences == 3 and result.decoder == "beam 4, alpha 0.6"
    assert bleu.compute("beam") is None  # started afresh


def test_a_translation_run_scores_whole_splits_against_raw_references(tmp_path, capsys):
    run = tmp_path / "run"
    run_train(run, "data=translation", *tiny_translation(tmp_path), "logger=wandb", "data.max_tokens=40",
              "callbacks.average.last_k=2", "callbacks.average.every_n_steps=2", fast_data=False)  # fmt: skip
    records = json.loads((run / "bleu.json").read_text())
    (run_file,) = wandb_run_files(run)  # the signature and decoder also in the W&B summary
    logged = wandb_records.summary(run_file)
    for split in ("val", "test"):
        assert logged[f"{split}/bleu_signature"] == records[split]["signature"]
        assert logged[f"{split}/bleu_decoder"] == records[split]["decoder"]
    assert records["val"]["decoder"] == "greedy" and records["test"]["decoder"] == "beam 4, alpha 0.6"
    from datasets import load_from_disk

    (prepared,) = (tmp_path / "cache" / "translation").iterdir()
    references = load_from_disk(str(prepared / "dataset"))["test"]["tgt_text"]
    hypotheses = (run / "translations" / "test.txt").read_text().splitlines()
    metric = sacrebleu.metrics.BLEU()
    expected = metric.corpus_score(hypotheses, [references])
    assert records["test"]["score"] == pytest.approx(expected.score)
    assert records["test"]["signature"] == str(metric.get_signature())
    _, test_bleu = series(read_metrics(run), "test/bleu")
    assert test_bleu == [pytest.approx(expected.score)]
    # checkpoint averaging: the last 2 snapshots (steps 4 and 6) averaged into what the test evaluated
    snapshots = sorted((run / "checkpoints" / "average").glob("step_*.ckpt"))
    assert [path.name for path in snapshots] == ["step_00000004.ckpt", "step_00000006.ckpt"]
    averaged = torch.load(run / "checkpoints" / "averaged.ckpt", weights_only=False)
    assert averaged["averaged_from"] == [path.name for path in snapshots]
    assert f"tested: {run / 'checkpoints' / 'averaged.ckpt'}" in capsys.readouterr().err  # the summary says so


@pytest.mark.slow  # ≈40 s: a 2-process DDP run
def test_ddp_bleu_is_one_process_decoding_the_same_checkpoint(tmp_path):
    """trainer=ddp_cpu: each rank decodes its shard of the test split (5 sentences: 3 and 2); the
    gathered hypotheses, in split order, and their BLEU are those of one process on the whole split."""
    from pathlib import Path

    from attnlab.data import build_data
    from attnlab.task import SequenceTask
    from helpers import cli

    pairs = tmp_path / "pairs.jsonl"
    words = ["one", "two", "three", "four", "five", "six", "seven", "eight"]
    rows = [{"src": f"the {a} and the {b}", "tgt": f"el {b} y el {a}"} for a in words for b in words]
    pairs.write_text("".join(json.dumps(row) + "\n" for row in rows))
    run = tmp_path / "run"
    overrides = ["trainer=ddp_cpu", "data=translation", "data.source=files", f"data.files.train={pairs}",
                 "data.vocab_size=120", "data.val_size=4", "data.test_size=5", "data.batch_size=8",
                 "data.eval_batch_size=2", "data.bleu.val=off", "model.d_model=32", "model.d_ff=64",
                 "model.n_heads=2", "trainer.max_steps=30", "trainer.val_check_interval=30",
                 "trainer.enable_progress_bar=false", "logger=csv", f"paths.cache_dir={tmp_path / 'cache'}",
                 f"hydra.run.dir={run}"]  # fmt: skip
    result = cli("attnlab-train", *overrides, cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    record = json.loads((run / "bleu.json").read_text())["test"]
    cfg = OmegaConf.load(run / "config.yaml")
    data = build_data(cfg.data, cfg.model.kind, cfg.seed, Path(cfg.paths.cache_dir))
    task = SequenceTask(OmegaConf.to_container(cfg, resolve=True), data.vocab)
    task.load_state_dict(torch.load(run / "checkpoints" / "best.ckpt", weights_only=False)["state_dict"])
    task.eval()
    bleu = Bleu(data.vocab, cfg.data.bleu.beam, cfg.data.bleu.alpha, cfg.data.bleu.extra_length)
    with torch.no_grad():
        for batch in data.test_dataloader():  # no trainer: the whole split
            bleu.add(task.model, batch, "beam")
    alone = bleu.compute("beam")
    assert len(set(alone.hypotheses)) > 1  # sentences the shards could mix up
    assert (run / "translations" / "test.txt").read_text().splitlines() == alone.hypotheses
    assert record["sentences"] == alone.sentences == 5
    assert record["score"] == pytest.approx(alone.score)


# --- checkpoint averaging ------------------------------------------------------------------


def test_averaging_k_checkpoints_is_the_mean_of_their_tensors(tmp_path):
    torch.manual_seed(0)
    states = [{"w": torch.randn(3, 4), "b": torch.randn(4), "count": torch.tensor(i)} for i in range(4)]
    for step, state in enumerate(states):
        torch.save({"state_dict": state, "global_step": step}, tmp_path / f"step_{step:08d}.ckpt")
    names = write_average(tmp_path, 3, tmp_path / "averaged.ckpt")
    assert names == ["step_00000001.ckpt", "step_00000002.ckpt", "step_00000003.ckpt"]
    averaged = torch.load(tmp_path / "averaged.ckpt", weights_only=False)
    for key in ("w", "b"):
        torch.testing.assert_close(averaged["state_dict"][key], (states[1][key] + states[2][key] + states[3][key]) / 3)
    assert averaged["state_dict"]["count"] == 3 and averaged["global_step"] == 3  # the rest from the last
    assert average_state_dicts(states[:1])["w"].equal(states[0]["w"])
    with pytest.raises(FileNotFoundError, match="no checkpoints"):
        write_average(tmp_path / "none", 5, tmp_path / "x.ckpt")


# --- optim=vaswani ---------------------------------------------------------------------------


def test_vaswani_schedule_is_the_papers_formula():
    optim = OmegaConf.to_container(OmegaConf.load(ROOT / "conf/optim/vaswani.yaml"))
    model = torch.nn.Linear(2, 2)
    model.cfg = type("Cfg", (), {"d_model": 512})()
    optimizer, schedule = build_optimizer(model, optim, total_steps=20_000)
    assert optimizer.defaults["betas"] == (0.9, 0.98) and optimizer.defaults["eps"] == 1e-9

    def paper(step):
        return 512**-0.5 * min(step**-0.5, step * 4000**-1.5)

    seen = {}
    for step in range(1, 16_001):  # optimizer step `step` uses the lr set before it
        seen[step] = optimizer.param_groups[0]["lr"]
        optimizer.step()  # no gradients: nothing moves, the schedule advances as in training
        schedule.step()
    for step in (1, 4000, 16_000):
        assert seen[step] == pytest.approx(paper(step), rel=1e-12)
    assert seen[4000] == pytest.approx(512**-0.5 * 4000**-0.5) == max(seen.values())
    assert math.isclose(seen[16_000], seen[4000] / 2)


# --- token batches -----------------------------------------------------------------------------


def test_token_batches_hold_at_most_max_tokens_and_cover_a_pass():
    generator = torch.Generator().manual_seed(0)
    lengths = torch.randint(3, 40, (500,), generator=generator).tolist()
    sampler = TokenBatchSampler(lengths, max_tokens=200, seed=1)
    batches = sampler.batches_of_pass(0)
    assert all(len(batch) * max(lengths[i] for i in batch.tolist()) <= 200 for batch in batches)
    seen = sorted(i for batch in batches for i in batch.tolist())
    assert seen == list(range(500))  # every example once per pass
    # near-equal lengths per batch: far less padding than random batches of the same count
    padding = sum(len(b) * max(lengths[i] for i in b.tolist()) - sum(lengths[i] for i in b.tolist()) for b in batches)
    assert padding < 0.1 * sum(lengths)
    # the stream is a pure function of (seed, batch number): starting at batch k = skipping k
    stream = iter(TokenBatchSampler(lengths, 200, seed=1))
    first = [next(stream) for _ in range(len(batches) + 5)]  # into the second pass
    resumed = iter(TokenBatchSampler(lengths, 200, seed=1, start=len(batches) + 2))
    assert [next(resumed) for _ in range(3)] == first[-3:]
    # DDP: the ranks split each global batch
    ranks = [next(iter(TokenBatchSampler(lengths, 200, seed=1, rank=r, world_size=2))) for r in (0, 1)]
    assert sorted(ranks[0] + ranks[1]) == sorted(first[0])
    assert isinstance(sampler, StreamBatchSampler)


def test_a_max_tokens_too_small_for_the_longest_example_is_refused():
    with pytest.raises(ValueError, match=r"data.max_tokens=10 .* longest training example \(12 tokens\)"):
        TokenBatchSampler([5, 12, 3], max_tokens=10, seed=0)


@pytest.mark.parametrize(
    ("override", "expected"),
    [("data.bleu.val=sometimes", r"data.bleu.val='sometimes' is not valid; accepted values: greedy, beam, off"),
     ("data.bleu.beam=0", r"data.bleu.beam=0 is not valid")],
)  # fmt: skip
def test_bad_bleu_settings_are_refused_before_anything_is_written(tmp_path, override, expected):
    from attnlab.config import ConfigError

    with pytest.raises(ConfigError, match=expected):
        run_train(tmp_path / "run", "data=translation", override, fast_data=False)
    assert not (tmp_path / "run").exists()


def test_a_translation_run_saved_before_data_bleu_resumes(tmp_path):
    """A run dir whose config.yaml predates data.bleu, data.max_length (then data.max_tokens)
    and callbacks.average resumes, and its test now scores whole splits."""
    import yaml

    from attnlab.rundir import read_run_file
    from helpers import cli

    run = tmp_path / "run"
    overrides = [*tiny_translation(tmp_path), "logger=csv", "trainer.max_steps=4", "trainer.val_check_interval=2",
                 "trainer.enable_progress_bar=false", "callbacks.checkpoint_every_n_steps=2"]  # fmt: skip
    result = cli("attnlab-train", f"hydra.run.dir={run}", "data=translation", *overrides, cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    config = yaml.safe_load((run / "config.yaml").read_text())
    data = config["data"]
    data["max_tokens"] = data.pop("max_length")  # the old names and keys
    data.pop("bleu")
    data["bleu_batches"] = 2
    config["callbacks"].pop("average")
    (run / "config.yaml").write_text(yaml.safe_dump(config))
    (run / "bleu.json").unlink()
    result = cli("attnlab-train", f"resume={run}", "trainer.max_steps=6", cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    assert read_run_file(run)["status"] == "finished"
    assert set(json.loads((run / "bleu.json").read_text())) == {"val", "test"}
