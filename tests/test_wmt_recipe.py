"""``+experiment=wmt14_en_de`` and its Post-LN baseline: fairseq's WMT Transformer-base recipe with the T-Fixup
reference's changes (docs/wmt.md), composed, printed by ``--cfg job``, and trained a few updates offline."""

from __future__ import annotations

import dataclasses
import subprocess
import sys
from pathlib import Path

import pytest

from tests.data.helpers import PAIRS, write_hub_parquet
from tests.test_config import load
from tfx.checkpoints.load import load_checkpoint
from tfx.optim.optimizers import lr_at

REPO = Path(__file__).resolve().parents[1]
# 2+2 layers, d 32 (8 heads of 4), a small vocabulary: the recipe's code path at a size that trains in seconds on CPU
TINY = [
    "model.encoder_layers=2", "model.decoder_layers=2", "model.d_model=32", "model.ffn_dim=64",
    "data.vocab_size=200", "data.max_tokens=512", "train.update_freq=2", "train.valid_max_sentences=8",
    "train.valid_beam=2", "train.progress=false", "train.threads=1", "train.precision=fp32", "train.device=cpu",
]  # fmt: skip


def test_wmt14_en_de_is_transformer_base_with_tfixup() -> None:
    cfg = load(["+experiment=wmt14_en_de"])
    m, o, d, t = cfg.model, cfg.optim, cfg.data, cfg.train
    # fairseq transformer_wmt_en_de = base_architecture: 6+6, 512/2048, 8 heads, dropout 0.1, no attn/act dropout
    assert (m.encoder_layers, m.decoder_layers, m.d_model, m.ffn_dim, m.heads) == (6, 6, 512, 2048, 8)
    assert (m.dropout, m.attention_dropout, m.activation_dropout) == (0.1, 0.0, 0.0)
    assert m.share_all_embeddings and m.share_decoder_embeddings  # --share-all-embeddings
    # the T-Fixup reference: no LayerNorm, its init, no warmup: lr * sqrt(4000 / (4000 + t)) from lr 5e-4
    assert (cfg.method, m.norm, cfg.init.name) == ("tfixup", "none", "tfixup")
    assert (o.warmup_updates, o.decay_offset) == (0, 4000)
    # scaling_nmt: Adam (0.9, 0.98), lr 5e-4, --clip-norm 0.0, --weight-decay 0.0, label smoothing 0.1
    assert (o.name, tuple(o.betas), o.lr, o.clip_norm, o.weight_decay, o.label_smoothing) == (
        "adam", (0.9, 0.98), 5e-4, 0.0, 0.0, 0.1,
    )  # fmt: skip
    assert [lr_at(s, o) for s in (0, 4000, 12000)] == pytest.approx([5e-4, 5e-4 / 2**0.5, 2.5e-4])
    # WMT'14 from the hub, En->De, one joint 40k sentencepiece BPE
    assert (d.source, d.hub_name, d.hub_config, d.hub_field) == ("hub", "wmt/wmt14", "de-en", "translation")
    assert d.hub_splits == {"train": "train", "valid": "validation", "test": "test"}
    assert (d.src_lang, d.tgt_lang, d.vocab_size) == ("en", "de", 40000)
    # clean-corpus-n.perl -ratio 1.5, 1..250 tokens (+ EOS)
    assert (d.max_source_positions, d.max_target_positions, d.max_len_ratio) == (251, 251, 1.5)
    # --max-tokens 3584 on each of 8 GPUs = 28,672 tokens per update; one device accumulates 8 batches
    assert (d.max_tokens, t.update_freq, d.max_tokens * t.update_freq) == (3584, 8, 28672)
    assert (t.max_updates, t.validate_every_updates, t.valid_beam) == (100000, 1000, 5)


def test_wmt14_en_de_postln_changes_only_norm_init_and_warmup() -> None:
    tfixup, post = load(["+experiment=wmt14_en_de"]), load(["+experiment=wmt14_en_de_postln"])
    assert post.experiment == "wmt14_en_de_postln"
    assert (post.method, post.model.norm, post.init.name) == ("postln", "post", "xavier")
    # scaling_nmt: --lr-scheduler inverse_sqrt --warmup-init-lr 1e-07 --warmup-updates 4000, then lr * sqrt(4000 / t)
    assert (post.optim.warmup_updates, post.optim.warmup_init_lr, post.optim.offset_decay) == (4000, 1e-7, False)
    assert [lr_at(s, post.optim) for s in (0, 4000, 16000)] == pytest.approx([1e-7, 5e-4, 2.5e-4])
    same = dataclasses.replace(
        tfixup,
        experiment=post.experiment,
        method=post.method,
        warmup_free=post.warmup_free,  # a label of T-Fixup's method YAML: no warmup defines it
        init=post.init,
        model=dataclasses.replace(tfixup.model, norm=post.model.norm),
        optim=dataclasses.replace(tfixup.optim, warmup_updates=post.optim.warmup_updates),
    )
    assert same == post


def test_wmt14_en_de_reads_local_files_with_data_local_dir() -> None:
    cfg = load(["+experiment=wmt14_en_de", "data.local_dir=/data/wmt14_en_de/tmp", "data.tokenized=true"])
    assert (cfg.data.source, cfg.data.local_dir, cfg.data.src_lang, cfg.data.tgt_lang) == (
        "local", "/data/wmt14_en_de/tmp", "en", "de",
    )  # fmt: skip


@pytest.mark.slow
@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("wmt14_en_de", {"experiment: wmt14_en_de", "norm: none", "warmup_updates: 0", "name: tfixup"}),
        (
            "wmt14_en_de_postln",
            {
                "experiment: wmt14_en_de_postln",
                "norm: post",
                "name: xavier",
                "budget_warmup: 4000",
                "warmup_updates: ${optim.budget_warmup}",
            },
        ),
    ],
)
def test_cfg_job_prints_the_recipe(name: str, expected: set[str]) -> None:
    out = subprocess.run(
        [sys.executable, "-m", "tfx.train", f"+experiment={name}", "--cfg", "job"],
        capture_output=True, text=True, cwd=REPO, check=True, timeout=120,
    ).stdout  # fmt: skip
    lines = {line.strip() for line in out.splitlines()}
    common = {"hub_name: wmt/wmt14", "hub_config: de-en", "src_lang: en", "tgt_lang: de", "vocab_size: 40000",
              "encoder_layers: 6", "d_model: 512", "ffn_dim: 2048", "heads: 8", "share_all_embeddings: true",
              "lr: 0.0005", "max_tokens: 3584", "update_freq: 8"}  # fmt: skip
    assert common | expected <= lines


@pytest.mark.slow
def test_wmt14_en_de_trains_offline_on_files_in_the_hub_layout(tmp_path: Path) -> None:
    """The real `+experiment=wmt14_en_de` path (parquet, nested `translation` rows, En->De, shared embeddings,
    the 1.5 length-ratio filter, gradient accumulation) at a tiny width, offline."""
    unbalanced = ("Ja, das ist eine viel zu lange deutsche Antwort auf eine sehr kurze Frage.", "Yes.")
    splits = {"train": PAIRS * 40 + [unbalanced], "valid": PAIRS * 2, "test": PAIRS * 2}
    files = {
        split: write_hub_parquet(tmp_path / f"{split}.parquet", pairs, nested=True) for split, pairs in splits.items()
    }
    data_files = "{" + ",".join(f"{split}:{path}" for split, path in files.items()) + "}"
    run_dir = tmp_path / "run"
    cmd = [sys.executable, "-m", "tfx.train", "+experiment=wmt14_en_de", f"data.hub_data_files={data_files}",
           f"hydra.run.dir={run_dir}", f"data.cache_dir={tmp_path / 'cache'}", "train.max_updates=3",
           *TINY]  # fmt: skip
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert "train filter dropped 1 of 161 pairs" in proc.stdout + proc.stderr  # the 1.5 length ratio
    ckpt = load_checkpoint(run_dir / "checkpoints" / "checkpoint_last.pt")
    cfg = ckpt["config"]
    assert ckpt["step"] == 3 and cfg["experiment"] == "wmt14_en_de"
    assert (cfg["data"]["src_lang"], cfg["data"]["tgt_lang"]) == ("en", "de")
    assert cfg["model"]["share_all_embeddings"]
    assert (cfg["model"]["norm"], cfg["init"]["name"], cfg["optim"]["warmup_updates"]) == ("none", "tfixup", 0)
