"""Decoding for the encoder–decoder: greedy and batched beam search (Vaswani et al. §6.1).

The paper decodes with beam size 4 and length penalty α = 0.6, up to input length + 50
tokens. The length penalty is GNMT's (Wu et al. 2016, eq. 14):

    score(Y) = log P(Y | X) / lp(Y),    lp(Y) = ((5 + |Y|) / 6)^α

with |Y| counting the generated tokens, EOS included. Both decoders take
``next_log_probs(tokens, order) -> (N, V)``, the model's log-probabilities of the next token
after each row of ``tokens`` (N, t); ``order`` (N,) says which row of the previous call each
row continues (None: the same row), so a model can move its cached keys along. They can be
tested on hand-built distributions.

Beam search follows fairseq's bookkeeping: of the 2·beam best continuations, an EOS among
the first ``beam`` finishes a hypothesis, the best ``beam`` others stay alive, and a
sentence is done once it holds ``beam`` finished hypotheses (or reaches its length limit,
where EOS is forced). With beam = 1 this is exactly greedy decoding.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

NextLogProbs = Callable[[Tensor, Tensor | None], Tensor]


def length_penalty(length: Tensor | float, alpha: float) -> Tensor | float:
    """GNMT's lp(Y) = ((5 + |Y|) / 6)^α."""
    return ((5 + length) / 6) ** alpha


def greedy(next_log_probs: NextLogProbs, bos: int, eos: int, max_lengths: Tensor) -> Tensor:
    """The most likely next token at each step, until EOS or the sentence's ``max_lengths``
    (where EOS is forced). Returns (B, L) ids without BOS, EOS-padded after each sentence's end."""
    size = max_lengths.shape[0]
    tokens = torch.full((size, 1), bos, dtype=torch.long, device=max_lengths.device)
    done = torch.zeros(size, dtype=torch.bool, device=max_lengths.device)
    for step in range(1, int(max_lengths.max()) + 1):
        next_token = next_log_probs(tokens, None).argmax(-1)
        next_token = next_token.masked_fill(done | (step >= max_lengths), eos)
        tokens = torch.cat([tokens, next_token[:, None]], dim=1)
        done |= next_token == eos
        if done.all():
            break
    return tokens[:, 1:]


def beam_search(
    next_log_probs: NextLogProbs, bos: int, eos: int, max_lengths: Tensor, beam: int = 4, alpha: float = 0.6
) -> tuple[Tensor, Tensor]:
    """Batched beam search with GNMT's length penalty.

    ``next_log_probs`` sees (B·beam, t) rows, sentence-major (rows b·beam … b·beam + beam − 1
    are sentence b's hypotheses): expand the encoder memory to match before calling.
    Returns the best hypothesis per sentence, (B, L) ids without BOS and EOS-padded, and
    its score log P / lp.
    """
    size, device = max_lengths.shape[0], max_lengths.device
    longest = int(max_lengths.max())
    tokens = torch.full((size * beam, 1), bos, dtype=torch.long, device=device)
    # Cumulative log P of the alive hypotheses; all but one start at -inf so that the first
    # step expands a single BOS, not beam copies of it.
    alive = torch.full((size, beam), float("-inf"), device=device)
    alive[:, 0] = 0.0
    finished_scores = torch.full((size, beam), float("-inf"), device=device)
    finished_tokens = torch.full((size, beam, longest), eos, dtype=torch.long, device=device)
    n_finished = torch.zeros(size, dtype=torch.long, device=device)
    rows = torch.arange(size, device=device)
    order = None
    for step in range(1, longest + 1):
        log_probs = next_log_probs(tokens, order).float().view(size, beam, -1)
        vocab = log_probs.shape[-1]
        at_limit = step >= max_lengths
        if at_limit.any():  # only EOS may follow
            forced = torch.full_like(log_probs[0, 0], float("-inf"))
            forced[eos] = 0.0
            log_probs[at_limit] = forced
        candidates = (alive[:, :, None] + log_probs).view(size, beam * vocab)
        top_scores, top_index = candidates.topk(2 * beam, dim=1)
        parent, token = top_index // vocab, top_index % vocab
        parent_rows = (rows[:, None] * beam + parent).view(-1)
        sequences = torch.cat([tokens[parent_rows], token.view(-1, 1)], dim=1).view(size, 2 * beam, -1)

        # EOS among the first `beam` candidates finishes a hypothesis (not for sentences already done).
        done = n_finished >= beam
        ends = (token == eos) & torch.isfinite(top_scores)
        ends[:, beam:] = False
        ends &= ~done[:, None]
        new_scores = torch.where(ends, top_scores / length_penalty(step, alpha), float("-inf"))
        # Keep the first `beam - n_finished` of them, best first (fairseq's rule).
        rank_among_ends = ends.long().cumsum(1) - 1
        ends &= rank_among_ends < (beam - n_finished)[:, None]
        new_scores = new_scores.masked_fill(~ends, float("-inf"))
        merged = torch.cat([finished_scores, new_scores], dim=1)
        padded = torch.nn.functional.pad(sequences[:, :, 1:], (0, longest - step), value=eos)
        merged_tokens = torch.cat([finished_tokens, padded], dim=1)
        finished_scores, keep = merged.topk(beam, dim=1)
        finished_tokens = merged_tokens[rows[:, None], keep]
        n_finished = n_finished + ends.sum(1)

        # The best `beam` non-EOS continuations stay alive.
        open_scores = top_scores.masked_fill(token == eos, float("-inf"))
        alive, keep = open_scores.topk(beam, dim=1)
        tokens = sequences[rows[:, None], keep].view(size * beam, -1)
        order = parent_rows.view(size, 2 * beam)[rows[:, None], keep].view(-1)
        if (n_finished >= beam).all():
            break
    best = finished_scores.argmax(1)
    return finished_tokens[rows, best], finished_scores[rows, best]
