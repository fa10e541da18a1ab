"""Data: synthetic tasks, the translation corpus path (on a tiny SWORD fixture), text, batches."""

import pytest
import torch
from omegaconf import OmegaConf

from attnlab.data import build_data
from attnlab.data.errors import DataError
from attnlab.data.module import IGNORE, StreamBatchSampler, collate_lm, collate_seq2seq
from attnlab.data.synthetic import BOS, EOS, LOOKUP_VALUES, N_SPECIAL, SEP, synthetic_splits, vocab_size
from attnlab.data.translation import clean_osis, read_sword_pairs
from helpers import ROOT, cli
from sword_fixture import write_module

SIZES = {"train": 50, "validation": 10, "test": 10}


@pytest.mark.parametrize("task", ["copy", "reverse", "sort", "recall"])
def test_synthetic_tasks_follow_their_rule_and_are_deterministic(task):
    splits = synthetic_splits(task, vocab=16, min_len=3, max_len=6, sizes=SIZES, seed=7)
    again = synthetic_splits(task, vocab=16, min_len=3, max_len=6, sizes=SIZES, seed=7)
    assert splits["train"]["src"] == again["train"]["src"]
    assert splits["train"]["src"] != synthetic_splits(task, 16, 3, 6, SIZES, seed=8)["train"]["src"]
    assert splits["train"]["src"][:10] != splits["validation"]["src"]  # the splits are drawn apart
    for src, tgt in zip(splits["train"]["src"], splits["train"]["tgt"], strict=True):
        assert all(N_SPECIAL <= token < N_SPECIAL + 16 for token in src + tgt)
        if task == "copy":
            assert tgt == src
        elif task == "reverse":
            assert tgt == src[::-1]
        elif task == "sort":
            assert tgt == sorted(src)
        else:
            keys, values, query = src[0:-1:2], src[1:-1:2], src[-1]
            assert 3 <= len(keys) <= 6 and len(set(keys)) == len(keys)
            assert tgt == [values[keys.index(query)]]


def test_lookup_pairs_are_single_tokens_and_the_target_is_the_queried_value():
    vocab = 12
    splits = synthetic_splits("lookup", vocab=vocab, min_len=3, max_len=6, sizes=SIZES, seed=3)
    assert vocab_size("lookup", vocab) == N_SPECIAL + vocab * LOOKUP_VALUES + vocab
    for src, tgt in zip(splits["train"]["src"], splits["train"]["tgt"], strict=True):
        *pairs, query = src
        decoded = [divmod(token - N_SPECIAL, LOOKUP_VALUES) for token in pairs]  # (key, value)
        keys = [key for key, _ in decoded]
        assert 3 <= len(pairs) <= 6 and len(set(keys)) == len(keys) and max(keys) < vocab
        asked = query - N_SPECIAL - vocab * LOOKUP_VALUES
        assert 0 <= asked < vocab and asked in keys
        assert tgt == [N_SPECIAL + dict(decoded)[asked]]
    with pytest.raises(ValueError, match=r"data.max_len=16 pairs .* data.vocab to at least 16"):
        synthetic_splits("lookup", vocab=12, min_len=2, max_len=16, sizes=SIZES, seed=0)


def test_recall_refuses_too_few_keys():
    with pytest.raises(ValueError, match=r"data.vocab=8.*raise data.vocab to at least 12"):
        synthetic_splits("recall", vocab=8, min_len=2, max_len=6, sizes=SIZES, seed=0)


def test_batches_for_both_model_kinds():
    examples = [{"src": [5, 6, 7], "tgt": [8, 9]}, {"src": [5], "tgt": [4]}]
    seq2seq = collate_seq2seq(examples)
    assert seq2seq["src"].tolist() == [[5, 6, 7], [5, 0, 0]]
    assert seq2seq["src_mask"].tolist() == [[True] * 3, [True, False, False]]
    assert seq2seq["tgt_in"].tolist() == [[BOS, 8, 9], [BOS, 4, 0]]
    assert seq2seq["tgt_out"].tolist() == [[8, 9, EOS], [4, EOS, IGNORE]]
    assert seq2seq["n_tokens"] == (3 + 3) + (1 + 2)  # src + tgt + EOS, unpadded
    lm = collate_lm(examples)
    assert lm["tokens"].tolist() == [[5, 6, 7, SEP, 8, 9], [5, SEP, 4, 0, 0, 0]]
    assert lm["targets"].tolist() == [
        [IGNORE, IGNORE, IGNORE, 8, 9, EOS],
        [IGNORE, 4, EOS, IGNORE, IGNORE, IGNORE],
    ]
    assert lm["mask"].sum(1).tolist() == [6, 3]
    assert lm["n_tokens"] == 9


def test_stream_sampler_is_a_pure_function_of_seed_and_position():
    def take(sampler, count):
        stream = iter(sampler)
        return [next(stream) for _ in range(count)]

    full = take(StreamBatchSampler(20, 4, seed=3), 12)  # 5 batches a pass: crosses two passes
    assert take(StreamBatchSampler(20, 4, seed=3, start=7), 5) == full[7:]
    assert sorted(i for batch in full[:5] for i in batch) == list(range(20))  # each pass is a permutation
    assert full[:5] != full[5:10]  # and each pass a new one
    ranks = [take(StreamBatchSampler(20, 4, seed=3, rank=r, world_size=2), 3) for r in (0, 1)]
    assert [a + b for a, b in zip(ranks[0], ranks[1], strict=True)] != full[:3]
    assert [sorted(a + b) for a, b in zip(*ranks, strict=True)] == [sorted(batch) for batch in full[:3]]


# --- translation: the real SWORD path on a fixture ----------------------------------------

ENGLISH = {
    (
        "Genesis",
        1,
        1,
    ): '<w lemma="x">In</w> the beginning, God<note placement="foot">a note</note> created the heavens.',
    ("Genesis", 1, 2): "The earth was formless and empty.",
    ("Genesis", 1, 3): "God said, “Let there be light,” and there was light.",
    ("Genesis", 2, 1): "The heavens, the earth, and all their vast array were finished.",
    ("John", 1, 1): "In the beginning was the Word.",
    ("John", 11, 35): "Jesus wept, and this English verse is far far far far far far too long to pair.",
    ("Tobit", 1, 1): "A book only the English side has.",
}
SPANISH = {
    ("Genesis", 1, 1): "EN el principio crió Dios los cielos.",
    ("Genesis", 1, 2): "Y la tierra estaba desordenada y vacía.",
    ("Genesis", 1, 3): "Y dijo Dios: Sea la luz: y fué la luz.",
    ("Genesis", 2, 1): "Y FUERON acabados los cielos y la tierra, y todo su ornamento.",
    ("John", 1, 1): "EN el principio era el Verbo.",
    ("John", 11, 35): "Y lloró Jesús.",
}


@pytest.fixture
def sword_dir(tmp_path):
    write_module(tmp_path, "engTEST", ENGLISH, versification="NRSVA")
    write_module(tmp_path, "spaTEST", SPANISH, versification="KJV")
    return tmp_path


def test_osis_markup_becomes_plain_text():
    assert clean_osis(ENGLISH[("Genesis", 1, 1)]) == "In the beginning, God created the heavens."


def test_sword_verses_align_by_reference(sword_dir):
    pairs = {pair["ref"]: pair for pair in read_sword_pairs(sword_dir, "engTEST", "spaTEST") if pair["src"]}
    assert pairs["Gen.1.1"] == {"ref": "Gen.1.1", "src": "In the beginning, God created the heavens.",
                                "tgt": "EN el principio crió Dios los cielos."}  # fmt: skip
    assert pairs["John.1.1"]["tgt"] == "EN el principio era el Verbo."
    assert not any(ref.startswith("Tob") for ref in pairs)  # a book the Spanish side lacks


def test_missing_sword_modules_say_how_to_get_them(tmp_path):
    with pytest.raises(FileNotFoundError, match="make corpus"):
        read_sword_pairs(tmp_path / "nothing", "engWEB2015eb", "spaRV1909eb")


def test_cli_missing_corpus_is_one_clear_error_and_the_run_is_marked_failed(tmp_path):
    missing = tmp_path / "nothing"
    result = cli("attnlab-train", "data=translation", f"data.sword_dir={missing}", "logger=csv", "hydra.run.dir=run",
                 cwd=tmp_path, env={"ATTNLAB_CACHE": str(tmp_path / "cache")})  # fmt: skip
    assert result.returncode == 1
    assert "make corpus" in result.stderr and str(missing) in result.stderr, result.stderr[-2000:]
    assert "Traceback" not in result.stderr
    assert '"status": "failed"' in (tmp_path / "run" / "run.json").read_text()


def translation_cfg(sword_dir, **overrides):
    cfg = OmegaConf.load(ROOT / "conf/data/translation.yaml")
    cfg.sword_dir = str(sword_dir)
    cfg.source_module, cfg.target_module = "engTEST", "spaTEST"
    cfg.update({"vocab_size": 300, "val_size": 1, "test_size": 1, "batch_size": 2, **overrides})
    return cfg


def test_translation_datamodule_builds_splits_and_tokenizer_from_the_fixture(sword_dir, tmp_path):
    data = build_data(translation_cfg(sword_dir), "transformer", seed=0, cache_dir=tmp_path / "cache")
    splits = data.splits
    # 6 aligned verses; John 11:35's length ratio is implausible, so 5 remain: 3 / 1 / 1
    assert {name: len(rows) for name, rows in splits.items()} == {"train": 3, "validation": 1, "test": 1}
    everything = [row for rows in splits.values() for row in rows]
    assert "Y lloró Jesús." not in [row["tgt_text"] for row in everything]
    row = everything[0]
    assert data.vocab.decode(row["src"]) == row["src_text"]  # the BPE round-trips
    assert data.vocab.size <= 300
    (cached,) = (tmp_path / "cache" / "translation").iterdir()
    assert (cached / "tokenizer.json").exists()
    # a second build loads the cache: same splits, no preparation
    again = build_data(translation_cfg(sword_dir), "transformer", seed=0, cache_dir=tmp_path / "cache")
    assert again.splits["train"]["src"] == splits["train"]["src"]
    batch = next(iter(data.val_dataloader()))
    assert batch["src"].dtype == torch.long and batch["tgt_out"][0, -1] == EOS


def test_translation_from_local_files(tmp_path):
    import json

    path = tmp_path / "pairs.jsonl"
    rows = [{"src": f"sentence number {i}", "tgt": f"frase número {i}"} for i in range(20)]
    path.write_text("\n".join(json.dumps(row) for row in rows))
    cfg = translation_cfg(tmp_path, source="files", files={"train": str(path)}, val_size=2, test_size=2)
    data = build_data(cfg, "lm", seed=0, cache_dir=tmp_path / "cache")
    assert [len(data.splits[name]) for name in ("train", "validation", "test")] == [16, 2, 2]


def test_hub_dataset_offline_fails_at_once_with_the_fix(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    cfg = translation_cfg(tmp_path, source="hub")
    with pytest.raises(DataError, match=r"wmt14.*data.source=sword"):
        build_data(cfg, "transformer", seed=0, cache_dir=tmp_path / "cache")


def test_text_corpus_is_cut_into_blocks(tmp_path):
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("\n".join(f"line {i} of a small text corpus about attention." for i in range(200)))
    cfg = OmegaConf.load(ROOT / "conf/data/text.yaml")
    cfg.files.train, cfg.block_size, cfg.vocab_size = str(corpus), 16, 200
    data = build_data(cfg, "lm", seed=0, cache_dir=tmp_path / "cache")
    assert all(len(tgt) == 16 for tgt in data.splits["train"]["tgt"])
    assert len(data.splits["validation"]) > 0
    batch = next(iter(data.train_dataloader()))
    assert batch["tokens"].shape == (32, 17) and (batch["tokens"][:, 0] == BOS).all()


def test_given_splits_are_kept_and_only_missing_ones_are_carved(tmp_path):
    import json

    def write(name, count):
        path = tmp_path / name
        path.write_text("\n".join(json.dumps({"src": f"{name} sentence {i}", "tgt": f"frase {name} {i}"})
                                  for i in range(count)))  # fmt: skip
        return str(path)

    files = {"train": write("train.jsonl", 20), "validation": write("dev.jsonl", 3)}
    cfg = translation_cfg(tmp_path, source="files", files=files, val_size=5, test_size=2)
    splits = build_data(cfg, "transformer", seed=0, cache_dir=tmp_path / "cache").splits
    assert [len(splits[name]) for name in ("train", "validation", "test")] == [18, 3, 2]
    assert all(text.startswith("dev.jsonl") for text in splits["validation"]["src_text"])


# --- data errors: named, with the fix, before training -------------------------------------


def files_cfg(tmp_path, path):
    return translation_cfg(tmp_path, source="files", files={"train": str(path)}, val_size=2, test_size=2)


@pytest.mark.parametrize("content", [b"", b"\n  \n\n"], ids=["empty", "blank-lines"])
def test_an_empty_data_file_is_named(tmp_path, content):
    path = tmp_path / "pairs.jsonl"
    path.write_bytes(content)
    with pytest.raises(ValueError, match=rf"data.files.train='{path}' is empty; it should hold pairs.jsonl"):
        build_data(files_cfg(tmp_path, path), "transformer", seed=0, cache_dir=tmp_path / "cache")


def test_missing_columns_name_those_found_and_those_needed(tmp_path):
    import json

    path = tmp_path / "pairs.jsonl"
    path.write_text("\n".join(json.dumps({"en": f"line {i}", "es": f"línea {i}"}) for i in range(20)))
    expected = r"has columns \['en', 'es'\] but needs src, tgt \(missing: src, tgt\); rename its fields to src, tgt"
    with pytest.raises(ValueError, match=expected):
        build_data(files_cfg(tmp_path, path), "transformer", seed=0, cache_dir=tmp_path / "cache")


def test_a_file_that_is_not_utf8_is_named_with_the_byte_offset(tmp_path):
    path = tmp_path / "pairs.jsonl"
    good = b'{"src": "the house", "tgt": "la casa"}\n' * 10
    path.write_bytes(good + '{"src": "year", "tgt": "año"}\n'.encode("latin-1"))
    offset = len(good) + len('{"src": "year", "tgt": "a')
    with pytest.raises(ValueError, match=rf"'{path}' is not UTF-8 text: undecodable byte 0xf1 at byte offset {offset}"):
        build_data(files_cfg(tmp_path, path), "transformer", seed=0, cache_dir=tmp_path / "cache")


def test_too_few_examples_for_one_batch_is_said_before_training(tmp_path):
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("\n".join(f"line {i}" for i in range(120)))
    cfg = OmegaConf.load(ROOT / "conf/data/text.yaml")
    cfg.files.train, cfg.block_size, cfg.vocab_size, cfg.val_size, cfg.test_size = str(corpus), 8, 300, 50, 50
    with pytest.raises(ValueError, match=r"data.batch_size=32 exceeds the \d+ training examples of data=text"):
        build_data(cfg, "lm", seed=0, cache_dir=tmp_path / "cache")
    cfg.block_size, cfg.val_size, cfg.test_size = 64, 10, 10
    with pytest.raises(ValueError, match=r"the validation split \(10 rows\) has fewer than data.block_size=64 tokens"):
        build_data(cfg, "lm", seed=0, cache_dir=tmp_path / "cache")
