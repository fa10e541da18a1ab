"""Write tiny zText SWORD modules, so the translation tests read them with the real code path.

The layout is SWORD's own (what pysword reads): per testament a verse index ``?t.bzv``
(block uint32, offset uint32, size uint16 per verse slot), a block index ``?t.bzs``
(offset, compressed size, raw size: uint32 each) and zlib blocks ``?t.bzz``; one block
per testament here. Verse slots follow the versification, as pysword computes them.
"""

import struct
import zlib
from pathlib import Path

from pysword.books import BibleStructure


def write_module(sword_dir: Path, name: str, verses: dict[tuple[str, int, int], str], versification="KJV"):
    """verses: {(book name, chapter, verse): OSIS text}."""
    structure = BibleStructure(versification.lower())
    data_path = Path("modules/texts/ztext") / name.lower()
    module_dir = sword_dir / data_path
    module_dir.mkdir(parents=True, exist_ok=True)
    by_testament: dict[str, dict[int, bytes]] = {"ot": {}, "nt": {}}
    for (book, chapter, verse), text in verses.items():
        indices = structure.ref_to_indicies(books=[book], chapters=[chapter], verses=[verse])
        ((testament, (index,)),) = indices.items()
        by_testament[testament][index] = text.encode()
    for testament, slots in by_testament.items():
        block, index = b"", bytearray(10 * (max(slots, default=0) + 1))
        for slot, text in sorted(slots.items()):
            struct.pack_into("<IIH", index, 10 * slot, 0, len(block), len(text))
            block += text
        compressed = zlib.compress(block)
        (module_dir / f"{testament}.bzv").write_bytes(bytes(index))
        (module_dir / f"{testament}.bzs").write_bytes(struct.pack("<III", 0, len(compressed), len(block)))
        (module_dir / f"{testament}.bzz").write_bytes(compressed)
    (sword_dir / "mods.d").mkdir(exist_ok=True)
    (sword_dir / "mods.d" / f"{name.lower()}.conf").write_text(
        f"[{name}]\nDataPath=./{data_path}/\nModDrv=zText\nSourceType=OSIS\nEncoding=UTF-8\n"
        f"CompressType=ZIP\nBlockType=BOOK\nVersification={versification}\n"
    )
