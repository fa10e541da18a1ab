"""BLEU of decoded translations over a whole evaluation split, with sacrebleu.

Hypotheses are decoded (greedy or beam search, ``data.bleu``) and detokenized by the BPE
decoder; references are the split's raw target sentences (``tgt_text``), never rebuilt
from truncated ids. The score is sacrebleu's corpus BLEU with its default 13a
tokenization, reported with its signature so that numbers can be compared across papers.
Under DDP each rank decodes its own contiguous shard; the shards are gathered in rank
order before scoring, so the corpus is the whole split.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import torch.distributed as dist

from attnlab.data.module import Vocabulary

DECODERS = ("greedy", "beam", "off")  # accepted values of data.bleu.val / data.bleu.test


@dataclass
class BleuResult:
    score: float
    signature: str
    sentences: int
    decoder: str  # "greedy" or "beam 4, alpha 0.6"
    hypotheses: list[str]

    def record(self) -> dict:
        return {"score": self.score, "signature": self.signature, "sentences": self.sentences, "decoder": self.decoder}


def cut_at(ids: list[int], eos: int) -> list[int]:
    return ids[: ids.index(eos)] if eos in ids else ids


def corpus_bleu(hypotheses: list[str], references: list[str]):
    """sacrebleu's corpus BLEU (13a tokenization, exp smoothing) and the metric object, for its signature."""
    from sacrebleu.metrics import BLEU

    metric = BLEU()
    return metric.corpus_score(hypotheses, [references]), metric


class Bleu:
    """Collects decoded hypotheses and raw references over an evaluation; ``compute`` scores
    them as one corpus (all DDP ranks together) and starts afresh."""

    def __init__(self, vocab: Vocabulary, beam: int, alpha: float, extra_length: int):
        self.vocab, self.beam, self.alpha, self.extra_length = vocab, beam, alpha, extra_length
        self.hypotheses: list[str] = []
        self.references: list[str] = []

    def decoder(self, kind: str) -> str:
        return "greedy" if kind == "greedy" else f"beam {self.beam}, alpha {self.alpha}"

    def add(self, model, batch: dict, kind: str) -> None:
        beam = self.beam if kind == "beam" else 1
        decoded = model.generate(
            batch["src"], batch["src_mask"], self.vocab.bos, self.vocab.eos, beam, self.alpha, self.extra_length
        )
        self.hypotheses += [self.vocab.decode(cut_at(ids, self.vocab.eos)) for ids in decoded.tolist()]
        self.references += batch["tgt_text"]

    def compute(self, kind: str) -> BleuResult | None:
        hypotheses, references = self.hypotheses, self.references
        self.hypotheses, self.references = [], []
        if dist.is_available() and dist.is_initialized():
            gathered = [None] * dist.get_world_size()
            dist.all_gather_object(gathered, (hypotheses, references))
            hypotheses = [h for part in gathered for h in part[0]]
            references = [r for part in gathered for r in part[1]]
        if not hypotheses:
            return None
        score, metric = corpus_bleu(hypotheses, references)
        return BleuResult(score.score, str(metric.get_signature()), len(hypotheses), self.decoder(kind), hypotheses)


def save_bleu(run_dir: Path, split: str, result: BleuResult) -> None:
    """``bleu.json`` (score, signature, decoder per split) and ``translations/<split>.txt`` in the run dir."""
    path = run_dir / "bleu.json"
    records = json.loads(path.read_text()) if path.is_file() else {}
    records[split] = result.record()
    path.write_text(json.dumps(records, indent=1) + "\n")
    translations = run_dir / "translations"
    translations.mkdir(exist_ok=True)
    (translations / f"{split}.txt").write_text("".join(line + "\n" for line in result.hypotheses))
