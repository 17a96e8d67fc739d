"""Typed configuration schema: YAML in ``conf/`` -> these dataclasses -> plain arguments.

Every field carries a one-line doc comment; ``__post_init__`` checks what a typo or a
bad sweep value would otherwise turn into a confusing failure deep inside training.
Hydra validates types and unknown keys against these classes (registered in
``register_configs``); model, data and init code receive plain values, never Hydra.
``ModelConfig`` is defined beside the model (``tfx.model.config``), which takes it whole; it is
named here too, as the run's ``model`` section.
"""

from __future__ import annotations

import dataclasses
import difflib
import importlib
import signal
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tfx.init import SCHEMES, check_fits
from tfx.model.config import ModelConfig
from tfx.optim.optimizers import OPTIMIZERS

DATA_SOURCES = ("toy", "local", "hub")
BATCHINGS = ("padded", "packed")  # tfx/data/batching.py, tfx/data/packing.py
UNCATCHABLE = ("SIGKILL", "SIGSTOP")
PRECISIONS = ("auto", "fp32", "bf16", "fp16")  # tfx/runtime/precision.py says what each does
STRATEGIES = ("ddp", "fsdp")  # tfx/runtime/sharding.py says what fsdp does
COMPILE_SCOPES = ("layers", "model")  # tfx/runtime/compilation.py says what each compiles
PATIENCE_METRICS = ("bleu", "loss")  # what train.patience waits on: higher valid BLEU | lower valid loss


def _require(ok: bool, message: str) -> None:
    if not ok:
        raise ValueError(message)


@dataclass
class DataConfig:
    """Where the parallel corpus comes from, how it is tokenized and batched."""

    source: str = "toy"  # toy | local | hub
    name: str = "toy"  # corpus name, used in run names and the cache file names
    src_lang: str = "de"  # source language code (file suffix / hub field)
    tgt_lang: str = "en"  # target language code
    # local folder of aligned text files: <prefix>.<lang>[.gz]
    local_dir: str | None = None  # folder with train.de/train.en/... (source=local), relative to the cwd
    # the files are already Moses-tokenized and lowercased (fairseq's prepare-iwslt14.sh output):
    # the model then writes tokenized text, and tokenized BLEU scores hypotheses and references as they are
    tokenized: bool = False
    train_prefix: str = "train"  # file prefix of the training split
    valid_prefix: str = "valid"  # file prefix of the validation split
    test_prefix: str = "test"  # file prefix of the test split
    # Hugging Face hub dataset (source=hub)
    hub_name: str | None = None  # e.g. IWSLT/iwslt2017
    hub_config: str | None = None  # e.g. iwslt2017-de-en
    hub_revision: str | None = None  # e.g. refs/convert/parquet
    hub_field: str | None = None  # rows nest languages under this key ("translation"); null = flat rows
    hub_splits: dict[str, str] = field(
        default_factory=lambda: {"train": "train", "valid": "validation", "test": "test"}
    )  # tfx split name -> hub split name
    # split -> local parquet file(s) in the hub's layout, bypassing the hub. The keys exist up front
    # so that the command-line override data.hub_data_files={train: a,valid: b,test: c} merges.
    hub_data_files: dict[str, Any] = field(default_factory=lambda: {"train": None, "valid": None, "test": None})
    hub_cache_dir: str | None = None  # datasets cache folder; null = HF default (~/.cache/huggingface)
    hub_timeout: float = 5.0  # seconds to wait for the hub before failing over to the offline cache
    # toy task (source=toy)
    toy_train_size: int = 20000  # synthetic training pairs
    toy_valid_size: int = 200  # synthetic validation pairs
    toy_test_size: int = 200  # synthetic test pairs
    toy_vocab: int = 40  # distinct source words (and as many target words)
    toy_min_len: int = 3  # shortest synthetic sentence (words)
    toy_max_len: int = 10  # longest synthetic sentence (words)
    # vocabulary
    vocab_size: int = 8000  # joint sentencepiece vocabulary size (an upper bound on tiny corpora)
    spm_model_type: str = "bpe"  # bpe | unigram
    spm_character_coverage: float = 1.0  # sentencepiece character_coverage
    cache_dir: str = "data/cache"  # sentencepiece models and encoded corpora, relative to the cwd
    # batching and filtering
    max_tokens: int = 4096  # token budget per batch (max(src,tgt) padded length x sentences)
    # padded: one sentence per row, padded to the batch's longest (hundreds of shapes per epoch) |
    # packed: pairs end to end in rows of pack_length tokens, one batch shape per run (tfx/data/packing.py)
    batching: str = "padded"
    pack_length: int = 0  # packed row length in tokens; 0 = the longest training sentence, rounded up to 8
    max_sentences: int | None = None  # optional cap on sentences per batch
    max_source_positions: int = 1024  # drop training pairs with longer sources (tokens incl. EOS)
    max_target_positions: int = 1024  # drop training pairs with longer targets (tokens incl. EOS)
    max_len_ratio: float = 9.0  # drop training pairs whose token-length ratio exceeds this
    # sentencepiece trains on at most this many training sentences (the same random lines of both sides;
    # 0 = all): 1M keeps a 4.5M-pair corpus' vocabulary to seconds and its memory under 1 GB (docs/data.md)
    spm_sample_sentences: int = 1_000_000
    # processes that encode a large corpus (threads for sentencepiece training and small splits); 0 = all cores
    num_workers: int = 0

    def __post_init__(self) -> None:
        if self.source == "hub" and self.local_dir:
            # the offline override of the hub experiments (+experiment=multi30k data.local_dir=DIR): decided
            # here, once, so training, resume, tfx.evaluate and the checkpoint's config agree on what was read
            self.source = "local"
        _require(self.source in DATA_SOURCES, f"data.source={self.source!r}: use one of {DATA_SOURCES}")
        _require(self.src_lang != self.tgt_lang, "data.src_lang and data.tgt_lang must differ")
        _require(self.vocab_size > 0, "data.vocab_size must be positive")
        _require(self.spm_model_type in ("bpe", "unigram"), "data.spm_model_type: use bpe or unigram")
        _require(self.spm_sample_sentences >= 0, "data.spm_sample_sentences: use 0 (every sentence) or a count")
        _require(0.0 < self.spm_character_coverage <= 1.0, "data.spm_character_coverage must be in (0, 1]")
        _require(self.max_tokens > 0, "data.max_tokens must be positive")
        _require(self.batching in BATCHINGS, f"data.batching={self.batching!r}: use one of {BATCHINGS}")
        _require(self.pack_length >= 0, "data.pack_length must be >= 0 (0 = the longest training sentence)")
        _require(self.max_sentences is None or self.max_sentences > 0, "data.max_sentences must be positive")
        _require(
            self.max_source_positions > 1 and self.max_target_positions > 1,
            "data.max_*_positions must be > 1 (they count the EOS token)",
        )
        _require(self.max_len_ratio > 0, "data.max_len_ratio must be positive")
        _require(self.num_workers >= 0, "data.num_workers must be >= 0 (0 = all cores)")
        _require(self.hub_timeout > 0, "data.hub_timeout must be positive")
        unknown = set(self.hub_splits) - {"train", "valid", "test"}
        _require(not unknown, f"data.hub_splits keys {sorted(unknown)}: use train, valid, test")
        _require(
            self.source != "hub" or bool(self.hub_name or any(self.hub_data_files.values())),
            "data.source=hub needs data.hub_name=NAME or data.hub_data_files={split: file.parquet}",
        )
        _require(2 <= self.toy_vocab <= 2000, "data.toy_vocab must be in [2, 2000]")
        _require(
            1 <= self.toy_min_len <= self.toy_max_len,
            "data.toy_min_len and data.toy_max_len: need 1 <= min <= max",
        )
        sizes = (self.toy_train_size, self.toy_valid_size, self.toy_test_size)
        _require(min(sizes) >= 0, "data.toy_*_size must be >= 0")


@dataclass
class InitConfig:
    """Which initialization scheme to apply after building the model."""

    name: str = "tfixup"  # a scheme of tfx/init/ (a key of tfx.init.SCHEMES), set by conf/init/

    def __post_init__(self) -> None:
        _require(self.name in SCHEMES, f"init.name={self.name!r}: use one of {tuple(SCHEMES)}")


@dataclass
class OptimConfig:
    """Adam or RAdam with decoupled weight decay and an inverse-sqrt schedule."""

    name: str = "adam"  # adam (AdamW) | radam (what the T-Fixup reference code ran; tfx/optim/optimizers.py)
    lr: float = 5e-4  # peak learning rate
    betas: tuple[float, float] = (0.9, 0.98)  # Adam betas
    eps: float = 1e-8  # Adam epsilon
    weight_decay: float = 1e-4  # decoupled weight decay: p -= lr * weight_decay * p
    warmup_updates: int = 0  # linear warmup length; 0 = T-Fixup's no-warmup schedule (conf/method/ sets it)
    # the warmup_updates of a method that warms up (postln, deepnorm, admin, dyt, fixup) at this budget; 0 where a study
    # chose none
    budget_warmup: int = 4000
    warmup_init_lr: float = 1e-7  # lr at update 0 when warming up
    decay_offset: int = 4000  # no-warmup inverse-sqrt: lr * sqrt(offset / (offset + t))
    offset_decay: bool = False  # after a warmup: lr * sqrt(offset / (offset + t)), not lr * sqrt(W / t)
    clip_norm: float = 0.0  # gradient-norm clipping; 0 = off
    label_smoothing: float = 0.1  # label-smoothed cross-entropy epsilon

    def __post_init__(self) -> None:
        _require(self.name in OPTIMIZERS, f"optim.name={self.name!r}: use one of {tuple(OPTIMIZERS)}")
        _require(self.lr > 0, "optim.lr must be positive")
        _require(self.warmup_updates >= 0, "optim.warmup_updates must be >= 0")
        _require(self.budget_warmup >= 0, "optim.budget_warmup must be >= 0")
        _require(0.0 <= self.label_smoothing < 1.0, "optim.label_smoothing must be in [0, 1)")
        _require(self.clip_norm >= 0, "optim.clip_norm must be >= 0 (0 = off)")


@dataclass
class TrainConfig:
    """The loop: budget, validation, checkpoints, devices."""

    seed: int = 1  # seeds data order, init and dropout
    # PyTorch's deterministic kernels (CUDA: e.g. the memory-efficient attention backward), so a GPU run repeats
    # bitwise. Off by default: slower, and CPU runs repeat without it (docs/training.md)
    deterministic: bool = False
    device: str = "auto"  # auto | cpu | cuda | cuda:N
    precision: str = "auto"  # auto (bf16 where native, else fp32) | fp32 | bf16 | fp16 (dynamic loss scaling)
    threads: int = 0  # torch CPU threads; 0 = torch default
    max_updates: int = 0  # stop after this many updates; 0 = no limit
    max_epochs: int = 0  # stop after this many epochs; 0 = no limit
    # stop after this many validations in a row without a better valid BLEU (fairseq's --patience; with
    # validation at epoch ends only, epochs); 0 = off
    patience: int = 0
    # what patience waits on: bleu (valid BLEU, higher is better) | loss (label-smoothed valid loss, lower is
    # better: fairseq's default --best-checkpoint-metric, so a fairseq recipe's --patience stops where it did)
    patience_metric: str = "bleu"
    max_minutes: float = 0.0  # stop after this much wall time; 0 = no limit
    update_freq: int = 1  # gradient accumulation steps per update
    compile: bool = False  # torch.compile the training forward (tfx/runtime/compilation.py)
    compile_scope: str = "layers"  # layers: one graph per layer kind, reused down the stack | model: one whole graph
    # several ranks: ddp = a full replica per rank; fsdp = weights, gradients and Adam state sharded
    # (tfx/runtime/sharding.py)
    strategy: str = "ddp"
    validate_every_updates: int = 0  # validate every N updates; 0 = once per epoch only
    validate_every_minutes: float = 0.0  # also validate every M minutes of wall time; 0 = off
    valid_beam: int = 1  # beam size for validation BLEU (1 = greedy, fastest)
    valid_max_sentences: int = 0  # translate at most this many valid sentences; 0 = all
    log_every_updates: int = 20  # TensorBoard scalar interval
    layer_stats_every_updates: int = 100  # per-layer activation RMS / grad-norm interval
    save_every_updates: int = 0  # numbered checkpoint every N updates; 0 = off
    save_every_epochs: int = 1  # numbered checkpoint every N epochs; 0 = off
    keep_last: int = 10  # numbered checkpoints to keep
    max_bad_steps: int = 10  # consecutive non-finite steps before stopping
    # auto: the run folder's checkpoint_last.pt, or (a command-line run in a new time-stamped folder) the newest
    # unfinished run of the same settings beside it (tfx/checkpoints/unfinished.py) | never: a new run, refused
    # where the folder already holds one | a checkpoint's path (None, in checkpoints before this setting: auto)
    resume: str | None = "auto"
    # strict: refuse a checkpoint whose settings differ | force: resume, log the changes | weights: the weights
    # and update count only, from any checkpoint of the run (a damaged checkpoint_last.pt's way on)
    resume_mode: str = "strict"
    # signals that stop the run cleanly (save the last completed update, exit): add SIGUSR1 for SLURM's
    # `--signal=USR1@90` pre-emption warning (tfx/runtime/stop.py, docs/training.md "Stopping and resuming")
    stop_signals: list[str] = field(default_factory=lambda: ["SIGTERM", "SIGINT"])
    progress: bool = True  # a tqdm bar on a terminal; a log line every log_every_updates otherwise
    # log probe/output_change (RMS change of the logits of a fixed batch, T-Fixup's Theta(eta) claim) after each
    # of the first N updates, to TensorBoard and metrics.jsonl (tfx.reporting.statistics.OutputChange); 0 = off
    probe_updates: int = 0
    probe_sentences: int = 8  # the fixed batch: the first this many valid pairs

    def __post_init__(self) -> None:
        _require(self.precision in PRECISIONS, f"train.precision={self.precision!r}: use {', '.join(PRECISIONS)}")
        _require(self.strategy in STRATEGIES, f"train.strategy={self.strategy!r}: use {' or '.join(STRATEGIES)}")
        _require(self.update_freq >= 1, "train.update_freq must be >= 1")
        _require(self.compile_scope in COMPILE_SCOPES, f"train.compile_scope: use {' or '.join(COMPILE_SCOPES)}")
        _require(self.valid_beam >= 1, "train.valid_beam must be >= 1")
        _require(self.keep_last >= 1, "train.keep_last must be >= 1")
        _require(self.patience >= 0, "train.patience must be >= 0 (0 = off)")
        _require(
            self.patience_metric in PATIENCE_METRICS,
            f"train.patience_metric={self.patience_metric!r}: use {' or '.join(PATIENCE_METRICS)}",
        )
        _require(self.resume_mode in ("strict", "force", "weights"), "train.resume_mode: use strict, force or weights")
        _require(self.probe_updates >= 0, "train.probe_updates must be >= 0 (0 = off)")
        _require(self.probe_sentences >= 1, "train.probe_sentences must be >= 1")
        for name in self.stop_signals:
            _require(
                name in signal.Signals.__members__ and name not in UNCATCHABLE,
                f"train.stop_signals: {name!r} is not a signal a process can catch (e.g. SIGTERM, SIGINT, SIGUSR1)",
            )


@dataclass
class TunedSetting:
    """One method's setting as a study chose it on valid (a row of an experiment's ``tuned`` table)."""

    lr: float  # peak learning rate (optim.lr)
    dropout: float  # model.dropout
    warmup: int  # warmup updates where the method warms up (optim.budget_warmup)


@dataclass
class Config:
    """The whole run."""

    experiment: str = "default"  # name shown in TensorBoard hparams and run folders
    method: str = "custom"  # the conf/method/ group that set norm, init and warmup; a label (TensorBoard HParams)
    # the method is defined by training without warmup (T-Fixup and its no-LayerNorm and Post-LN ablations): a
    # study tunes no warmup for it (tfx.studies.arms.warmup_free). A label set by conf/method/, as ``method`` is;
    # a method that merely starts at warmup 0 (Pre-LN, ReZero) leaves it false and lets a study's grid decide
    warmup_free: bool = False
    # modules imported before the config is checked: where an init scheme or residual kind from outside tfx
    # registers itself (docs/layout.md, "Adding a method"); its method's YAML names them
    plugins: list[str] = field(default_factory=list)
    # method -> {lr, dropout, warmup}: the setting a study chose on valid for this experiment; the experiment's
    # optim.lr, model.dropout and optim.budget_warmup read their row by ``${method}`` (conf/experiment/multi30k.yaml)
    tuned: dict[str, TunedSetting] = field(default_factory=dict)
    data: DataConfig = field(default_factory=DataConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    init: InitConfig = field(default_factory=InitConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    train: TrainConfig = field(default_factory=TrainConfig)

    def __post_init__(self) -> None:
        check_fits(self.init.name, self.model.norm)


def schema_keys(schema: type = Config, prefix: str = "") -> dict[str, bool]:
    """Every dotted key of ``schema`` (``train.max_updates``) -> whether it is a dict field, whose keys are free
    (``data.hub_splits.train``)."""
    hints = typing.get_type_hints(schema)
    keys = {}
    for f in dataclasses.fields(schema):
        key, hint = f"{prefix}{f.name}", hints[f.name]
        keys[key] = typing.get_origin(hint) is dict
        if dataclasses.is_dataclass(hint):
            keys |= schema_keys(hint, f"{key}.")
    return keys


SCHEMA_KEYS = schema_keys()


def unknown_key(key: str) -> str | None:
    """Why dotted ``key`` is not a config key, naming the closest known ones; None when it is one, lies under a
    dict field, or is Hydra's own (``hydra.*``)."""
    parts = key.split(".")
    prefixes = [".".join(parts[:i]) for i in range(1, len(parts))]
    if key in SCHEMA_KEYS or parts[0] == "hydra" or any(SCHEMA_KEYS.get(p) for p in prefixes):
        return None
    close = _closest(key)
    hint = f" (did you mean {' or '.join(close)}?)" if close else ""
    section = parts[0] if len(parts) > 1 and parts[0] in SCHEMA_KEYS else None
    where = f"; `python -m tfx.train --cfg job` lists the {section} keys" if section else ""
    return f"{key} is not a config key{hint}{where}"


def _closest(key: str) -> list[str]:
    """The known keys nearest ``key`` in spelling: the nearest, and any as near (``model.encoder_layers or
    model.decoder_layers`` for ``model.layers``)."""
    leaf = key.rsplit(".", 1)[-1]
    if elsewhere := sorted(k for k in SCHEMA_KEYS if k.rsplit(".", 1)[-1] == leaf):
        return elsewhere  # the right name in the wrong section: train.lr -> optim.lr
    sections = {k.split(".")[0] for k in SCHEMA_KEYS if "." in k}
    keys = [k for k in SCHEMA_KEYS if k not in sections]
    ratios = sorted(((difflib.SequenceMatcher(None, key, k).ratio(), k) for k in keys), reverse=True)
    best = ratios[0][0]
    return sorted(k for r, k in ratios if r >= max(0.6, best - 0.02))


def check_known_keys(node: Any, prefix: str = "") -> None:
    """Refuse a composed config holding a key the schema lacks (``+train.max_update=100`` lands there and would
    otherwise be ignored), naming the closest known key."""
    from omegaconf import DictConfig

    for name in node:
        key = f"{prefix}{name}"
        if (why := unknown_key(key)) is not None:
            raise ValueError(why)
        if isinstance(node._get_node(name), DictConfig) and SCHEMA_KEYS.get(key) is False:
            check_known_keys(node._get_node(name), f"{key}.")


def _conf_dir() -> Path:
    """``conf/`` at the top of a checkout (an editable install), or ``tfx/conf`` in an installed wheel."""
    here = Path(__file__).resolve().parent
    installed = here / "conf"
    return installed if installed.is_dir() else here.parent / "conf"


CONF_DIR = _conf_dir()  # what ``tfx.train`` reads


def import_plugins(modules: Any) -> None:
    """Import the config's ``plugins`` (a list of module names), so the schemes and residual kinds they register
    exist before ``init.name`` and ``model.norm`` are checked."""
    for module in modules or []:
        try:
            importlib.import_module(module)
        except ImportError as err:
            raise ValueError(f"plugins: cannot import {module!r} ({err}); is its folder on PYTHONPATH?") from None


def to_config(node: Any) -> Config:
    """The typed, checked ``Config`` of a composed node: unknown keys refused, its plugins imported first."""
    from omegaconf import OmegaConf

    check_known_keys(node)
    import_plugins(node.get("plugins"))
    return OmegaConf.to_object(node)


def compose_config(overrides: list[str]) -> Config:
    """The typed config ``python -m tfx.train OVERRIDES`` would run with, outside the Hydra app (scripts, tests)."""
    from hydra import compose, initialize_config_dir

    register_configs()
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        return to_config(compose("config", overrides=overrides))


def register_configs() -> None:
    """Register the schema so YAML in ``conf/`` is type-checked against it (``defaults: [schema, ...]``)."""
    from hydra.core.config_store import ConfigStore

    ConfigStore.instance().store(name="schema", node=Config)
