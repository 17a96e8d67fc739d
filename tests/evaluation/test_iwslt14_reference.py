"""``+experiment=iwslt14_reference`` end to end at toy sizes on the staged IWSLT'14 text (CPU stand-in).

The protocol of docs/reproducing-t-fixup.md: train with RAdam on fairseq's tokenized text, save a checkpoint per epoch,
average the window of consecutive epoch checkpoints that scores best on VALIDATION, then score the test
split with beam 4, lenpen 0.3 and compound-split tokenized BLEU. The staged data has no training split,
so a slice of the valid text stands in for it.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from tfx.checkpoints.load import load_checkpoint
from tfx.checkpoints.numbered import numbered_checkpoints
from tfx.config import Config, register_configs
from tfx.evaluation import average, evaluate
from tfx.train import train

CONF = Path(__file__).resolve().parents[2] / "conf"
DECODE = ["--beam", "4", "--lenpen", "0.3", "--device", "cpu", "--compound-split"]


def stand_in_corpus(fairseq_tok: Path, out: Path) -> Path:
    """train = valid lines 0-299, valid = 300-311, test = the first 12 test lines (all tokenized, lowercased)."""
    out.mkdir()
    for lang in ("de", "en"):
        valid = (fairseq_tok / f"valid.{lang}").read_text(encoding="utf-8").splitlines()
        test = (fairseq_tok / f"test.{lang}").read_text(encoding="utf-8").splitlines()
        for name, lines in (("train", valid[:300]), ("valid", valid[300:312]), ("test", test[:12])):
            (out / f"{name}.{lang}").write_text("\n".join(lines) + "\n", encoding="utf-8")
    return out


@pytest.mark.slow
def test_recipe_runs_end_to_end_on_staged_text(shared_data: Path, tmp_path: Path) -> None:
    corpus = stand_in_corpus(shared_data / "iwslt14_deen_fairseq_tok", tmp_path / "corpus")
    register_configs()
    small = [
        f"data.local_dir={corpus}", f"data.cache_dir={tmp_path / 'cache'}", "data.vocab_size=400",
        "data.max_tokens=1500", "model.encoder_layers=1", "model.decoder_layers=1", "model.d_model=32",
        "model.ffn_dim=64", "train.max_epochs=3", "train.device=cpu", "train.threads=1", "train.progress=false",
        "train.valid_max_sentences=8",
    ]  # fmt: skip
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        cfg: Config = OmegaConf.to_object(compose("config", overrides=["+experiment=iwslt14_reference", *small]))
    assert (cfg.optim.name, cfg.optim.clip_norm, cfg.model.dropout) == ("radam", 25.0, 0.5)
    run = tmp_path / "run"
    summary = train(cfg, run)
    assert summary["epoch"] == 4 and summary["step"] > 0
    epochs = numbered_checkpoints(run / "checkpoints")
    assert len(epochs) == 3  # one per epoch

    avg = tmp_path / "avg.pt"
    assert average.main(["--run-dir", str(run), "--best-window", "2", "--output", str(avg), *DECODE]) == 0
    chosen = load_checkpoint(avg)
    assert len(chosen["window_scores"]) == 2 and len(chosen["averaged_from"]) == 2
    best = max(chosen["window_scores"], key=lambda ws: ws[1])
    assert [Path(p).name for p in chosen["averaged_from"]] == best[0]

    assert evaluate.main([str(avg), "--quiet", *DECODE]) == 0
    report = json.loads((tmp_path / "avg.test.bleu.json").read_text())
    assert report["sentences"] == 12 and report["decoding"]["beam"] == 4 and report["decoding"]["lenpen"] == 0.3
    [score] = report["scores"]  # tokenized text: only the tokenized score
    assert "compound-split" in score["signature"] and "pretok:hyp+ref" in score["signature"]
    assert 0.0 <= score["score"] <= 100.0
