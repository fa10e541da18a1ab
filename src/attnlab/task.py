"""The LightningModule: forward, loss, and the step hooks of one training recipe for the
encoder–decoder and the decoder-only LM.

Label smoothing (Vaswani et al. §5.4) in training; the optimizer and schedule come from
``optim.py``, throughput from ``perf.Throughput``, BLEU from ``evaluation.py``, and the
batch layout and FLOP count from the model. Logs train/loss, lr, and val/loss, val/ppl,
val/acc (token accuracy), val/seq_acc (whole target right) and, for translation, val/bleu.
"""

from __future__ import annotations

from pathlib import Path

import lightning as L
import torch
from lightning.pytorch.loggers import WandbLogger
from omegaconf import DictConfig, OmegaConf
from torchmetrics import MeanMetric

from attnlab.attention import AttentionConfig
from attnlab.data.module import IGNORE, Vocabulary
from attnlab.evaluation import Bleu, save_bleu
from attnlab.models import MODELS, DecoderLM, ModelConfig, Transformer, sequence_loss
from attnlab.optim import build_optimizer
from attnlab.perf import logs_this_step


def build_model(model: dict, attention: dict, vocab_size: int) -> Transformer | DecoderLM:
    fields = {key: value for key, value in model.items() if key not in ("kind", "compile", "compile_mode")}
    cfg = ModelConfig(vocab_size=vocab_size, attention=AttentionConfig(**attention), **fields)
    network = MODELS[model["kind"]](cfg)
    if model.get("compile"):
        # In place: parameter names and checkpoints stay those of the eager model.
        network.compile(mode=model.get("compile_mode", "default"))
    return network


class SequenceTask(L.LightningModule):
    def __init__(self, config: DictConfig | dict, vocab: Vocabulary):
        super().__init__()
        config = OmegaConf.to_container(config, resolve=True) if isinstance(config, DictConfig) else config
        # The whole run config, in every checkpoint; loggers get it flattened from train.py.
        self.save_hyperparameters({"config": config}, logger=False)
        self.model = build_model(config["model"], config["attention"], vocab.size)
        self.optim = config["optim"]
        # shared by validation and test; reset after each
        self.eval_loss, self.eval_acc, self.eval_seq_acc = MeanMetric(), MeanMetric(), MeanMetric()
        bleu = config["data"].get("bleu")
        decodes = bleu and vocab.decode and hasattr(self.model, "generate")
        self.bleu = Bleu(vocab, bleu["beam"], bleu["alpha"], bleu["extra_length"]) if decodes else None
        self.bleu_decoder = {"val": bleu["val"], "test": bleu["test"]} if decodes else {}

    def forward(self, batch: dict) -> tuple[torch.Tensor, torch.Tensor]:
        """Returns (logits, targets), targets = -100 where no prediction is scored."""
        return self.model.forward_batch(batch)

    def training_step(self, batch: dict, batch_idx: int) -> torch.Tensor:
        logits, targets = self(batch)
        loss = sequence_loss(logits, targets, IGNORE, self.optim["label_smoothing"])
        if logs_this_step(self.trainer):
            # Checked when Lightning logs (it reads the loss then anyway), not every step: a
            # host sync per step would stall a GPU, and a diverged loss stays non-finite.
            if not torch.isfinite(loss):
                raise FloatingPointError(
                    f"train/loss is {loss.item()} at step {self.global_step}: the run diverged. "
                    "Lower optim.lr, raise optim.warmup_steps or keep trainer.gradient_clip_val; "
                    "checkpoints written so far are kept in the run dir."
                )
            self.log("train/loss", loss, prog_bar=True)
            self.log("lr", self.optimizers().param_groups[0]["lr"])
        return loss

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
        if self.bleu_decoder.get(prefix, "off") != "off":
            self.bleu.add(self.model, batch, self.bleu_decoder[prefix])

    def log_evaluation(self, prefix: str) -> None:
        loss = self.eval_loss.compute()
        metrics = {
            f"{prefix}/loss": loss,
            f"{prefix}/ppl": loss.exp(),
            f"{prefix}/acc": self.eval_acc.compute(),
            f"{prefix}/seq_acc": self.eval_seq_acc.compute(),
        }
        self.log_dict(metrics, prog_bar=prefix == "val")
        for metric in (self.eval_loss, self.eval_acc, self.eval_seq_acc):
            metric.reset()
        if self.bleu_decoder.get(prefix, "off") != "off":
            self.log_bleu(prefix)

    def log_bleu(self, prefix: str) -> None:
        """<prefix>/bleu; its signature and decoder in bleu.json and the W&B summary."""
        result = self.bleu.compute(self.bleu_decoder[prefix])
        if result is None:
            return
        self.log(f"{prefix}/bleu", result.score)
        if self.trainer.sanity_checking or not self.trainer.is_global_zero:
            return
        save_bleu(Path(self.trainer.default_root_dir), prefix, result)
        for logger in self.loggers:
            if isinstance(logger, WandbLogger):
                logger.experiment.summary[f"{prefix}/bleu_signature"] = result.signature
                logger.experiment.summary[f"{prefix}/bleu_decoder"] = result.decoder

    def validation_step(self, batch: dict, batch_idx: int) -> None:
        self.evaluate(batch, batch_idx, "val")

    def on_validation_epoch_end(self) -> None:
        self.log_evaluation("val")

    def test_step(self, batch: dict, batch_idx: int) -> None:
        self.evaluate(batch, batch_idx, "test")

    def on_test_epoch_end(self) -> None:
        self.log_evaluation("test")

    def configure_optimizers(self):
        total = self.trainer.max_steps if self.trainer.max_steps > 0 else 1
        optimizer, schedule = build_optimizer(self.model, self.optim, total)
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": schedule, "interval": "step"}}
