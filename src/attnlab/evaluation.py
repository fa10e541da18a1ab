"""BLEU on greedy decodes of the first ``data.bleu_batches`` validation batches (sacrebleu)."""

from __future__ import annotations

import torch.distributed as dist

from attnlab.data.module import Vocabulary


def cut_at(ids: list[int], eos: int) -> list[int]:
    return ids[: ids.index(eos)] if eos in ids else ids


class Bleu:
    """Collects decoded hypotheses and references over an evaluation; ``compute`` scores them
    as one corpus (all DDP ranks together) and starts afresh."""

    def __init__(self, vocab: Vocabulary, batches: int):
        self.vocab, self.batches = vocab, batches
        self.hypotheses: list[str] = []
        self.references: list[str] = []

    def add(self, model, batch: dict) -> None:
        max_len = int(batch["tgt_mask"].sum(1).max()) + 10
        decoded = model.greedy_decode(batch["src"], self.vocab.bos, self.vocab.eos, max_len, batch["src_mask"])
        for ids, target in zip(decoded.tolist(), batch["tgt_out"].tolist(), strict=True):
            self.hypotheses.append(self.vocab.decode(cut_at(ids, self.vocab.eos)))
            self.references.append(self.vocab.decode(cut_at(target, self.vocab.eos)))

    def compute(self) -> float | None:
        import sacrebleu

        hypotheses, references = self.hypotheses, self.references
        self.hypotheses, self.references = [], []
        if dist.is_available() and dist.is_initialized():
            gathered = [None] * dist.get_world_size()
            dist.all_gather_object(gathered, (hypotheses, references))
            hypotheses = [h for part in gathered for h in part[0]]
            references = [r for part in gathered for r in part[1]]
        return sacrebleu.corpus_bleu(hypotheses, [references]).score if hypotheses else None
