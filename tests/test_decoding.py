"""Greedy and beam search (attnlab.decoding) on hand-built distributions and on a real model."""

import itertools
import math

import pytest
import torch

from attnlab.attention import AttentionConfig
from attnlab.decoding import beam_search, greedy, length_penalty
from attnlab.models import ModelConfig, Transformer

BOS, EOS = 1, 2


def table_model(table: dict, vocab: int):
    """next_log_probs from {prefix (without BOS): probabilities}; unlisted prefixes end (EOS)."""

    def next_log_probs(tokens, order):
        rows = []
        for row in tokens.tolist():
            probs = torch.full((vocab,), 1e-9)
            for token, p in table.get(tuple(row[1:]), {EOS: 1.0}).items():
                probs[token] = p
            rows.append((probs / probs.sum()).log())
        return torch.stack(rows)

    return next_log_probs


def test_length_penalty_is_gnmts_formula():
    assert length_penalty(1, 0.6) == pytest.approx((6 / 6) ** 0.6)
    assert length_penalty(10, 0.6) == pytest.approx((15 / 6) ** 0.6)
    assert length_penalty(torch.tensor(7.0), 0.0) == 1.0


def test_beam_finds_a_better_hypothesis_than_greedy():
    # Greedy takes 3 (p 0.6), then must end with 0.4·... ; the beam keeps 4 (p 0.4), after which EOS is sure.
    table = {(): {3: 0.6, 4: 0.4}, (3,): {5: 0.5, 6: 0.5}, (3, 5): {EOS: 0.5, 6: 0.5}, (3, 6): {EOS: 0.5, 5: 0.5},
             (4,): {EOS: 1.0}}  # fmt: skip
    step = table_model(table, vocab=8)
    limit = torch.tensor([5])
    greedy_out = greedy(step, BOS, EOS, limit)
    beam_out, beam_score = beam_search(step, BOS, EOS, limit, beam=2, alpha=0.0)
    assert greedy_out[0, :3].tolist() == [3, 5, EOS]  # ties go to the lower id
    assert beam_out[0, :2].tolist() == [4, EOS]
    greedy_log_p = math.log(0.6 * 0.5 * 0.5)
    assert beam_score.item() == pytest.approx(math.log(0.4), abs=1e-6) and beam_score.item() > greedy_log_p


def test_beam_returns_the_best_length_normalised_hypothesis_when_wide_enough():
    """With a beam as wide as the search space, beam search is exhaustive: its answer is the
    argmax of log P / lp over every sequence, found here by enumeration."""
    torch.manual_seed(0)
    vocab, limit, alpha = 5, 4, 0.6
    logits = torch.randn(vocab, vocab)  # next token depends on the last one (a bigram model)
    logits[:, 0] = -1e9  # id 0 (padding) never appears
    log_probs = logits.log_softmax(-1)

    def step(tokens, order):
        return log_probs[tokens[:, -1]]

    best, best_score = None, -math.inf
    for length in range(1, limit + 1):
        for body in itertools.product(range(1, vocab), repeat=length - 1):
            if EOS in body or BOS in body:
                continue
            sequence = [*body, EOS]
            previous = [BOS, *body]
            log_p = sum(log_probs[a, b].item() for a, b in zip(previous, sequence, strict=True))
            if length == limit:  # EOS is forced at the limit: its probability is 1
                log_p -= log_probs[previous[-1], EOS].item()
            score = log_p / length_penalty(length, alpha)
            if score > best_score:
                best, best_score = sequence, score
    out, score = beam_search(step, BOS, EOS, torch.tensor([limit]), beam=vocab**limit, alpha=alpha)
    assert out[0, : len(best)].tolist() == best
    assert score.item() == pytest.approx(best_score, abs=1e-5)


def tiny_transformer(scale="sqrt_dk"):
    torch.manual_seed(0)
    cfg = ModelConfig(vocab_size=12, d_model=32, n_heads=4, d_ff=64, n_layers=2, attention=AttentionConfig(scale=scale))
    return Transformer(cfg).eval()


def source_batch():
    src = torch.randint(4, 12, (5, 7))
    mask = torch.ones_like(src, dtype=torch.bool)
    mask[1, 4:], mask[3, 2:] = False, False
    return src.masked_fill(~mask, 0), mask


@pytest.mark.parametrize("scale", ["sqrt_dk", "log_n"])
def test_beam_of_one_is_greedy_on_a_model(scale):
    model = tiny_transformer(scale)
    src, mask = source_batch()
    greedy_out = model.generate(src, mask, BOS, EOS, beam=1, extra_length=6)
    step = model.next_token_scorer(model.encode(src, mask), mask)
    with torch.no_grad():
        beam_out, _ = beam_search(step, BOS, EOS, mask.sum(1) + 6, beam=1, alpha=0.6)
    width = max(greedy_out.shape[1], beam_out.shape[1])
    pad = torch.nn.functional.pad
    assert torch.equal(pad(greedy_out, (0, width - greedy_out.shape[1]), value=EOS),
                       pad(beam_out, (0, width - beam_out.shape[1]), value=EOS))  # fmt: skip


def test_decoding_one_token_at_a_time_matches_the_full_decoder():
    """The key/value cache: each step's log-probabilities equal the whole-prefix forward's."""
    model = tiny_transformer("log_n")
    src, mask = source_batch()
    tgt = torch.randint(3, 12, (5, 6))
    with torch.no_grad():
        memory = model.encode(src, mask)
        full = model.decode(tgt, memory, mask).log_softmax(-1)
        step = model.next_token_scorer(memory, mask)
        steps = [step(tgt[:, : t + 1], None) for t in range(tgt.shape[1])]
    torch.testing.assert_close(torch.stack(steps, 1), full, atol=1e-5, rtol=1e-5)


def test_translations_stop_at_input_length_plus_extra():
    model = tiny_transformer()
    src, mask = source_batch()
    out = model.generate(src, mask, BOS, EOS, beam=3, extra_length=2)
    for row, length in zip(out.tolist(), mask.sum(1).tolist(), strict=True):
        assert EOS in row[: length + 2]  # EOS is the (length + 2)-th token at the latest
