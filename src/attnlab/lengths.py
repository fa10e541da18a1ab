"""Length generalisation: after training, accuracy and attention entropy on synthetic test
sets whose sequences are all of one length, for each length in ``data.eval_lengths``.

Train on lengths in [min_len, max_len] and list longer ones here (2×, 4×): what a rule
does beyond the lengths it was trained on shows in ``length/seq_acc/len<n>`` and in the
attention's normalised entropy H / log(keys) per layer, ``length/entropy_norm/<layer>/len<n>``
(the "attention fading" of Nakanishi 2025: a fixed logit gap buys less weight among more
keys, and the entropy climbs towards uniform). Metrics, each at the final step:

    length/loss/len<n>  length/acc/len<n>  length/seq_acc/len<n>
    length/entropy/<layer>/len<n>  length/entropy_norm/<layer>/len<n>  length/max_weight/<layer>/len<n>

The final weights are measured (not best.ckpt), on ``data.test_size`` examples per length
drawn from the test split's seed, in eval mode.
"""

from __future__ import annotations

import lightning as L
import torch
from torch.utils.data import DataLoader

from attnlab.data.module import IGNORE
from attnlab.data.synthetic import synthetic_splits
from attnlab.models import attention_layers, sequence_loss
from attnlab.probes.record import recording
from attnlab.probes.statistics import records_statistics


class LengthGeneralisation(L.Callback):
    def __init__(self, data_cfg, seed: int):
        self.task, self.vocab, self.lengths = data_cfg.name, data_cfg.vocab, list(data_cfg.eval_lengths)
        self.size, self.batch_size = data_cfg.test_size, data_cfg.get("eval_batch_size") or data_cfg.batch_size
        self.seed = seed if data_cfg.get("seed") is None else data_cfg.seed

    def on_train_end(self, trainer, pl_module) -> None:
        if not trainer.is_global_zero:
            return
        metrics = {}
        for length in self.lengths:
            metrics.update(self.measure(trainer, pl_module, length))
        for logger in trainer.loggers:
            logger.log_metrics(metrics, step=trainer.global_step)
            logger.save()

    @torch.no_grad()
    def measure(self, trainer, pl_module, length: int) -> dict[str, float]:
        split = synthetic_splits(self.task, self.vocab, length, length, {"test": self.size}, self.seed)["test"]
        loader = DataLoader(split, batch_size=self.batch_size, collate_fn=trainer.datamodule.collate)
        layers = attention_layers(pl_module.model)
        was_training = pl_module.training
        pl_module.eval()
        totals: dict[str, float] = {}
        tokens = sequences = 0
        try:
            for batch in loader:
                batch = {key: value.to(pl_module.device) if isinstance(value, torch.Tensor) else value
                         for key, value in batch.items()}  # fmt: skip
                with recording(*layers) as records:
                    logits, targets = pl_module(batch)
                scored = targets != IGNORE
                correct = (logits.argmax(-1) == targets) & scored
                count, rows = int(scored.sum()), targets.shape[0]
                add(totals, f"length/loss/len{length}", sequence_loss(logits, targets, IGNORE).item() * count)
                add(totals, f"length/acc/len{length}", float(correct.sum()))
                add(totals, f"length/seq_acc/len{length}", float((correct.sum(1) == scored.sum(1)).sum()))
                for layer, record, stats in zip(layers, records, records_statistics(records), strict=True):
                    for name in ("entropy", "entropy_norm"):
                        add(totals, f"length/{name}/{layer.name}/len{length}", float(stats[name]) * rows)
                    top = record.weights.amax(-1)  # (B, h, n): each row's largest weight
                    real = top > 0  # a row with no visible key has all-zero weights
                    add(totals, f"length/max_weight/{layer.name}/len{length}", float(top[real].mean()) * rows)
                tokens, sequences = tokens + count, sequences + rows
        finally:
            pl_module.train(was_training)
        per_token = {f"length/loss/len{length}", f"length/acc/len{length}"}
        return {key: value / (tokens if key in per_token else sequences) for key, value in totals.items()}


def add(totals: dict[str, float], key: str, value: float) -> None:
    totals[key] = totals.get(key, 0.0) + value
