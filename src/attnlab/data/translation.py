"""Translation data: an offline English–Spanish Bible corpus, local parallel files, hub datasets.

``data.source`` picks where sentence pairs come from:

* ``sword`` (default): the public-domain World English Bible and Reina-Valera 1909 that
  Debian ships as SWORD modules (packages sword-text-web, sword-text-sparv), read with
  ``pysword`` and aligned verse by verse: about 31,000 pairs. ``make corpus`` fetches
  them into the project cache; no account, no network at training time.
* ``files``: your own parallel data, JSON lines or CSV/TSV with ``src`` and ``tgt``
  columns, one file per split (``data.files.train`` …) or one file split here.
* ``hub``: a Hugging Face dataset by name, e.g. ``data.hub.name=wmt14 data.hub.subset=de-en``
  (needs the network; with HF_DATASETS_OFFLINE=1 it fails at once).

All sources take the same path from there: filter implausible pairs → fixed
train/validation/test splits → a joint BPE tokenizer (HF ``tokenizers``) trained on the
training split → token ids, cached under ``cache_dir/translation/<fingerprint>/``.
"""

from __future__ import annotations

import functools
import re
from pathlib import Path

from datasets import Dataset, DatasetDict
from omegaconf import DictConfig

from attnlab.data.cache import cached_splits, train_tokenizer
from attnlab.data.errors import MissingDataError
from attnlab.data.module import Vocabulary
from attnlab.data.sources import SPLITS, fixed_splits, from_source, load_files, load_hub

SWORD_HELP = (
    "the SWORD modules are not in {sword_dir}. Fetch them once with `make corpus`, or by hand:\n"
    "  apt-get download sword-text-web sword-text-sparv && "
    "for deb in sword-text-*.deb; do dpkg-deb -x $deb <dir>; done\n"
    "and point data.sword_dir at <dir>/usr/share/sword."
)


# --- reading pairs ---------------------------------------------------------------------

NOTE = re.compile(r"<note\b.*?</note>", re.DOTALL)
TAG = re.compile(r"<[^>]+>")
SPACE_BEFORE_PUNCT = re.compile(r"\s+([,.;:!?»”’)])")


def clean_osis(markup: str) -> str:
    """OSIS verse markup to plain text: footnotes dropped, tags removed, spaces tidied."""
    text = TAG.sub("", NOTE.sub(" ", markup))
    return SPACE_BEFORE_PUNCT.sub(r"\1", " ".join(text.split()))


def read_sword_pairs(sword_dir: Path, source_module: str, target_module: str) -> list[dict]:
    """Aligned verses of two SWORD Bibles: {ref, src, tgt}, by (book, chapter, verse).

    Where the two versifications differ a verse may be misaligned; the length-ratio
    filter downstream drops most such pairs.
    """
    from pysword.modules import SwordModules

    if not (Path(sword_dir) / "mods.d").is_dir():
        raise MissingDataError(SWORD_HELP.format(sword_dir=sword_dir))
    modules = SwordModules(str(sword_dir))
    found = modules.parse_modules()
    for name in (source_module, target_module):
        if name not in found:
            raise MissingDataError(
                f"module {name!r} not found ({sorted(found)}); " + SWORD_HELP.format(sword_dir=sword_dir)
            )
    source, target = (modules.get_bible_from_module(name) for name in (source_module, target_module))
    for bible in (source, target):
        # pysword decompresses a whole book for every verse; keep the last few books.
        bible._decompressed_text = functools.lru_cache(maxsize=8)(bible._decompressed_text)

    target_books = {book.osis_name: book for books in target.get_structure().get_books().values() for book in books}
    pairs = []
    for books in source.get_structure().get_books().values():
        for book in books:
            other = target_books.get(book.osis_name)
            if other is None:  # e.g. deuterocanonical books only one side has
                continue
            for chapter in range(1, min(book.num_chapters, other.num_chapters) + 1):
                src_verses = source.get_iter(books=[book.name], chapters=[chapter], clean=False)
                tgt_verses = target.get_iter(books=[other.name], chapters=[chapter], clean=False)
                for verse, (src, tgt) in enumerate(zip(src_verses, tgt_verses, strict=False), start=1):
                    pairs.append(
                        {
                            "ref": f"{book.osis_name}.{chapter}.{verse}",
                            "src": clean_osis(src),
                            "tgt": clean_osis(tgt),
                        }
                    )
    return pairs


def read_hub_pairs(hub: DictConfig) -> DatasetDict:
    """A hub translation dataset (rows {"translation": {lang: text}}), as src/tgt columns."""
    loaded = load_hub(hub, offline_instead="data.source=sword or data.source=files")
    loaded = DatasetDict({split: rows for split, rows in loaded.items() if split in SPLITS})
    return loaded.map(
        lambda row: {"src": row["translation"][hub.source_lang], "tgt": row["translation"][hub.target_lang]},
        remove_columns=loaded["train"].column_names,
    )


# --- the shared path: filter, split, tokenize --------------------------------------------


def plausible(row: dict, max_ratio: float) -> bool:
    src, tgt = row["src"].strip(), row["tgt"].strip()
    if not src or not tgt:
        return False
    ratio = len(src) / len(tgt)
    return 1 / max_ratio <= ratio <= max_ratio


def pairs_from_sword(cfg: DictConfig) -> Dataset:
    return Dataset.from_list(read_sword_pairs(Path(cfg.sword_dir), cfg.source_module, cfg.target_module))


def pairs_from_files(cfg: DictConfig) -> Dataset | DatasetDict:
    return load_files(cfg.files, needed="pairs.jsonl with src and tgt fields", columns=("src", "tgt"))


def pairs_from_hub(cfg: DictConfig) -> DatasetDict:
    return read_hub_pairs(cfg.hub)


SOURCES = {"sword": pairs_from_sword, "files": pairs_from_files, "hub": pairs_from_hub}


def prepare(cfg: DictConfig):
    pairs = from_source(cfg, SOURCES)
    keep = {"fn_kwargs": {"max_ratio": cfg.max_ratio}}
    if isinstance(pairs, DatasetDict):
        pairs = DatasetDict({split: rows.filter(plausible, **keep) for split, rows in pairs.items()})
    else:
        pairs = pairs.filter(plausible, **keep)
    splits = fixed_splits(pairs, cfg)
    texts = (text for row in splits["train"] for text in (row["src"], row["tgt"]))
    tokenizer = train_tokenizer(texts, cfg.vocab_size)  # joint source+target vocabulary, as in the paper

    def encode(batch):
        src = [encoding.ids[: cfg.max_length] for encoding in tokenizer.encode_batch(batch["src"])]
        tgt = [encoding.ids[: cfg.max_length] for encoding in tokenizer.encode_batch(batch["tgt"])]
        return {"src": src, "tgt": tgt, "src_text": batch["src"], "tgt_text": batch["tgt"]}

    return splits.map(encode, batched=True, remove_columns=splits["train"].column_names), tokenizer


def translation_splits(cfg: DictConfig, cache_dir: Path) -> tuple[DatasetDict, Vocabulary]:
    return cached_splits(cfg, cache_dir, "translation", prepare)
