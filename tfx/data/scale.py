"""A corpus of any size from a small one: its sentence pairs joined 1-3 at a time, for measuring scale.

WMT-sized corpora are not on every machine; a generated one with real sentences, real length spread and a
real vocabulary measures what the data path costs at 4.5M pairs (``scripts/bench/bench_data.py``). The pairs are
drawn with a seeded generator, so the same arguments write the same files.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from tfx.data.sources import find_text_file, read_parallel_text

CHUNK_PAIRS = 200_000  # pairs written per chunk: the generator never holds the whole corpus


def write_joined_corpus(
    source_dir: str | Path,
    out_dir: str | Path,
    pairs: int,
    src_lang: str = "de",
    tgt_lang: str = "en",
    seed: int = 1,
    max_join: int = 3,
) -> Path:
    """``out_dir/train.<lang>`` with ``pairs`` lines, each 1..``max_join`` random training pairs of
    ``source_dir`` joined by a space; its valid and test files are copied as they are."""
    source_dir, out_dir = Path(source_dir), Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    src, tgt = read_parallel_text(
        find_text_file(source_dir, "train", src_lang), find_text_file(source_dir, "train", tgt_lang)
    )
    src_arr, tgt_arr = np.array(src, dtype=object), np.array(tgt, dtype=object)
    rng = np.random.default_rng(seed)
    with open(out_dir / f"train.{src_lang}", "w") as fs, open(out_dir / f"train.{tgt_lang}", "w") as ft:
        for start in range(0, pairs, CHUNK_PAIRS):
            n = min(CHUNK_PAIRS, pairs - start)
            joins = rng.integers(1, max_join + 1, size=n)
            picks = rng.integers(0, len(src), size=int(joins.sum()))
            cuts = np.cumsum(joins)[:-1]
            for side, out in ((src_arr, fs), (tgt_arr, ft)):
                out.write("".join(" ".join(group) + "\n" for group in np.split(side[picks], cuts)))
    for split in ("valid", "test"):
        for lang in (src_lang, tgt_lang):
            path = find_text_file(source_dir, split, lang)
            (out_dir / path.name).write_bytes(path.read_bytes())
    return out_dir


# --- memory, as /proc tells it (Linux) ----------------------------------------------------------


def memory_mb(pid: int | str = "self") -> dict[str, float]:
    """``rss``, ``pss`` (shared pages split between their mappers), ``uss`` (pages only this process maps) and
    ``anon`` (anonymous pages: the heap, what the process holds of its own; RSS minus it is mapped files).

    A memory-mapped corpus inflates RSS and even USS with page-cache pages (the kernel maps 64 KB around each
    touched page): those are the file's, shared by every process that maps it and reclaimable; ``anon`` is not."""
    fields = {}
    for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines()[1:]:
        name, value, *_ = line.split()
        fields[name.rstrip(":")] = int(value) / 1024
    return {
        "rss": fields["Rss"],
        "pss": fields["Pss"],
        "uss": fields["Private_Clean"] + fields["Private_Dirty"],
        "anon": fields["Anonymous"],
    }


def process_tree(pid: int) -> list[int]:
    """``pid`` and its live descendants."""
    parents: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            text = stat.read_text()
        except OSError:
            continue
        ppid = int(text.rsplit(")", 1)[1].split()[1])
        parents.setdefault(ppid, []).append(int(stat.parent.name))
    tree, todo = [], [pid]
    while todo:
        tree.append(todo.pop())
        todo.extend(parents.get(tree[-1], []))
    return tree


def tree_pss_mb(pid: int) -> float:
    """Memory of ``pid`` and its descendants together: their PSS summed (shared pages counted once)."""
    total = 0.0
    for member in process_tree(pid):
        try:
            total += memory_mb(member)["pss"]
        except (OSError, KeyError):
            continue  # ended while being read
    return total
