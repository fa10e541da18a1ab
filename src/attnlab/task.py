"""The LightningModule: one training recipe for the encoder–decoder and the decoder-only LM.

Adam(W) with the inverse-square-root warm-up of Vaswani et al. §5.3 (or cosine, or a
constant), label smoothing (§5.4), gradient clipping by the Trainer. Logs train/loss,
lr, perf/tokens_per_s (perf/mfu on GPUs of known peak), and val/loss, val/ppl, val/acc (token accuracy), val/seq_acc
(whole target right) and, for translation, val/bleu on greedy decodes (sacrebleu).
"""

from __future__ import annotations

import time

import lightning as L
import torch
import torch.distributed as dist
from omegaconf import DictConfig, OmegaConf
from torchmetrics import MeanMetric

from attnlab.attention import AttentionConfig
from attnlab.data.module import IGNORE, Vocabulary
from attnlab.models import MODELS, DecoderLM, ModelConfig, Transformer, attention_layers, sequence_loss
from attnlab.optim import build_optimizer
from attnlab.perf import peak_flops, step_flops


def build_model(model: dict, attention: dict, vocab_size: int) -> Transformer | DecoderLM:
    fields = {key: value for key, value in model.items() if key != "kind"}
    cfg = ModelConfig(vocab_size=vocab_size, attention=AttentionConfig(**attention), **fields)
    return MODELS[model["kind"]](cfg)


class SequenceTask(L.LightningModule):
    def __init__(self, config: DictConfig | dict, vocab: Vocabulary):
        super().__init__()
        config = OmegaConf.to_container(config, resolve=True) if isinstance(config, DictConfig) else config
        # The whole run config, in every checkpoint; loggers get it flattened from train.py.
        self.save_hyperparameters({"config": config}, logger=False)
        self.config, self.vocab = config, vocab
        self.kind = config["model"]["kind"]
        self.model = build_model(config["model"], config["attention"], vocab.size)
        self.optim = config["optim"]
        # shared by validation and test; reset after each
        self.eval_loss, self.eval_acc, self.eval_seq_acc = MeanMetric(), MeanMetric(), MeanMetric()
        self.bleu_batches = config["data"].get("bleu_batches", 0) if vocab.decode else 0
        self.hypotheses: list[str] = []
        self.references: list[str] = []
        self.step_started: float | None = None
        self.step_ended: float | None = None
        self.peak_flops: float | None = None

    # --- forward and loss ----------------------------------------------------------

    def forward(self, batch: dict) -> tuple[torch.Tensor, torch.Tensor]:
        """Returns (logits, targets), targets = -100 where no prediction is scored."""
        if self.kind == "transformer":
            logits = self.model(batch["src"], batch["tgt_in"], batch["src_mask"], batch["tgt_mask"])
            return logits, batch["tgt_out"]
        return self.model(batch["tokens"], batch["mask"]), batch["targets"]

    def training_step(self, batch: dict, batch_idx: int) -> torch.Tensor:
        logits, targets = self(batch)
        loss = sequence_loss(logits, targets, IGNORE, self.optim["label_smoothing"])
        # Checked when Lightning logs (it reads the loss then anyway), not every step: a
        # host sync per step would stall a GPU, and a diverged loss stays non-finite.
        if (self.global_step + 1) % self.trainer.log_every_n_steps == 0 and not torch.isfinite(loss):
            raise FloatingPointError(
                f"train/loss is {loss.item()} at step {self.global_step}: the run diverged. "
                "Lower optim.lr, raise optim.warmup_steps or keep trainer.gradient_clip_val; "
                "checkpoints written so far are kept in the run dir."
            )
        self.log("train/loss", loss, prog_bar=True)
        self.log("lr", self.optimizers().param_groups[0]["lr"])
        return loss

    def on_train_batch_start(self, batch: dict, batch_idx: int) -> None:
        # Dropout draws from a stream that is a pure function of (seed, step, rank), so a
        # resumed run repeats exactly what an uninterrupted one would have done.
        seed = self.config["seed"]
        torch.manual_seed((seed * 1_000_003 + self.global_step) * 64 + self.global_rank)
        self.step_started = time.perf_counter()

    def on_train_epoch_start(self) -> None:
        self.step_ended = None  # the first step is timed from its own start

    def on_validation_start(self) -> None:
        self.step_ended = None  # the step after a validation: validation time is not its own

    def on_train_start(self) -> None:
        self.peak_flops = peak_flops(self.device, self.trainer.precision)  # None off known GPUs

    def on_train_batch_end(self, outputs, batch: dict, batch_idx: int) -> None:
        # From the previous step's end: data loading included, and on a GPU the host's
        # run-ahead evens out over steps without a sync here. n_tokens was counted on the CPU.
        now = time.perf_counter()
        elapsed = now - (self.step_ended if self.step_ended is not None else self.step_started)
        self.step_ended = now
        self.log("perf/tokens_per_s", batch["n_tokens"] * self.trainer.world_size / elapsed)
        if self.peak_flops:
            self.log("perf/mfu", self.step_flops(batch) / elapsed / self.peak_flops)

    def step_flops(self, batch: dict) -> float:
        """FLOPs of this step on the padded shapes (the work the device does)."""
        if self.kind == "transformer":
            (size, m), n = batch["src"].shape, batch["tgt_in"].shape[1]
            pairs = {"enc": size * m * m, "dec.self": size * n * n, "dec.cross": size * n * m}
            tokens = size * (m + n)
        else:
            size, n = batch["tokens"].shape
            pairs, tokens = {"": size * n * n}, size * n
        per_layer = {
            layer.name: pairs[layer.name.rsplit("L", 1)[0].rstrip(".")] for layer in attention_layers(self.model)
        }
        return step_flops(self.model, tokens, per_layer)

    # --- evaluation -----------------------------------------------------------------

    def evaluate(self, batch: dict, batch_idx: int, prefix: str) -> None:
        logits, targets = self(batch)
        scored = targets != IGNORE
        n_tokens = scored.sum()
        loss = sequence_loss(logits, targets, IGNORE)  # no smoothing: a true NLL / perplexity
        correct = (logits.argmax(-1) == targets) & scored
        self.eval_loss.update(loss, n_tokens)
        self.eval_acc.update(correct.sum() / n_tokens, n_tokens)
        self.eval_seq_acc.update((correct.sum(1) == scored.sum(1)).float().mean(), targets.shape[0])
        if prefix == "val" and batch_idx < self.bleu_batches and self.kind == "transformer":
            self.decode_for_bleu(batch)

    def log_evaluation(self, prefix: str) -> None:
        loss = self.eval_loss.compute()
        self.log_dict(
            {
                f"{prefix}/loss": loss,
                f"{prefix}/ppl": loss.exp(),
                f"{prefix}/acc": self.eval_acc.compute(),
                f"{prefix}/seq_acc": self.eval_seq_acc.compute(),
            },
            prog_bar=prefix == "val",
        )
        for metric in (self.eval_loss, self.eval_acc, self.eval_seq_acc):
            metric.reset()
        if self.hypotheses:
            self.log(f"{prefix}/bleu", self.corpus_bleu())

    def validation_step(self, batch: dict, batch_idx: int) -> None:
        self.evaluate(batch, batch_idx, "val")

    def on_validation_epoch_end(self) -> None:
        self.log_evaluation("val")

    def test_step(self, batch: dict, batch_idx: int) -> None:
        self.evaluate(batch, batch_idx, "test")

    def on_test_epoch_end(self) -> None:
        self.log_evaluation("test")

    def decode_for_bleu(self, batch: dict) -> None:
        max_len = int(batch["tgt_mask"].sum(1).max()) + 10
        decoded = self.model.greedy_decode(batch["src"], self.vocab.bos, self.vocab.eos, max_len, batch["src_mask"])
        for ids, target in zip(decoded.tolist(), batch["tgt_out"].tolist(), strict=True):
            self.hypotheses.append(self.vocab.decode(cut_at(ids, self.vocab.eos)))
            self.references.append(self.vocab.decode(cut_at(target, self.vocab.eos)))

    def corpus_bleu(self) -> float:
        import sacrebleu

        hypotheses, references = self.hypotheses, self.references
        self.hypotheses, self.references = [], []
        if dist.is_available() and dist.is_initialized():
            gathered = [None] * dist.get_world_size()
            dist.all_gather_object(gathered, (hypotheses, references))
            hypotheses = [h for part in gathered for h in part[0]]
            references = [r for part in gathered for r in part[1]]
        return sacrebleu.corpus_bleu(hypotheses, [references]).score

    # --- optimisation ---------------------------------------------------------------

    def configure_optimizers(self):
        total = self.trainer.max_steps if self.trainer.max_steps > 0 else 1
        optimizer, schedule = build_optimizer(self.model, self.optim, total)
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": schedule, "interval": "step"}}


def cut_at(ids: list[int], eos: int) -> list[int]:
    return ids[: ids.index(eos)] if eos in ids else ids
