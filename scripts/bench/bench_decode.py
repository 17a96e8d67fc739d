"""Beam-search speed with and without the decoder's key/value cache (and BLEU when a reference exists).

    python scripts/bench/bench_decode.py outputs/RUN/checkpoints/checkpoint_best.pt            # Multi30k test.de
    python scripts/bench/bench_decode.py CKPT --src test.de --ref test.en --limit 500 --uncached-limit 50
    python scripts/bench/bench_decode.py --random --d-model 512 --layers 6 --vocab 10000     # no checkpoint needed
    python scripts/bench/bench_decode.py --random --peer --repeat 2     # against fairseq-generate on the same model

Both paths decode the same batches; the uncached one (the whole prefix recomputed every step) runs
on the first ``--uncached-limit`` sentences only, and the speed-up compares both on that subset.
Outputs on the subset must be identical. On a shared machine pass ``--threads 1`` for stable numbers.

``--peer`` decodes the same sentences with the same Post-LN model (converted by ``tfx.evaluation.fairseq_format``) in
fairseq 0.12.2's ``fairseq-generate`` and prints both sides' generated tokens/s, the ratio, the share of
identical best hypotheses and the teacher-forced log-prob difference; docs/benchmarks.md "Decoding against
fairseq-generate" says what is matched and why.

Needs tfx installed (``pip install -e .`` in the checkout): it imports tfx as a package.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import _require_tfx  # noqa: F401  (a one-line error, not a traceback, without `pip install -e .`)
import numpy as np
import torch

from tfx.config import compose_config
from tfx.data import BOS, EOS, PAD, prepare_data, read_parallel_text
from tfx.evaluation import decode
from tfx.evaluation.bleu import corpus_bleu
from tfx.evaluation.decode import beam_search, length_batches, pad_batch
from tfx.evaluation.fairseq_format import (
    FAIRSEQ_EOS,
    FAIRSEQ_PAD,
    dictionary_lines,
    fairseq_arch_args,
    fairseq_state_dict,
    fairseq_to_tfx,
    parse_hypothesis,
    source_line,
    strip_unk,
    tfx_to_fairseq,
)
from tfx.evaluation.translate import load_model, read_text_lines
from tfx.init import apply_init
from tfx.model import ModelConfig, Transformer, build_model
from tfx.reporting.init_report import random_tokens
from tfx.runtime.distributed import resolve_device

MULTI30K = Path(__file__).resolve().parents[3] / "shared" / "data" / "multi30k"
FAIRSEQ_VENV = Path(os.environ.get("FAIRSEQ_PEER_DIR", "/tmp/fairseq_peer")) / "venv"  # fairseq_peer.sh's
RANDOM_MAX_LEN_B = 25  # --peer --random: every output runs to this length (untrained models rarely emit EOS)


def decode_all(model: Transformer, src_ids: list[list[int]], args: argparse.Namespace, use_cache: bool):
    """(outputs in input order, seconds, output tokens incl. EOS: fairseq-generate's count)."""
    device = next(model.parameters()).device
    out: list[list[int]] = [[] for _ in src_ids]
    dtype = torch.bfloat16 if args.bf16 else None
    start = time.perf_counter()
    for batch in length_batches([len(x) for x in src_ids], args.max_tokens, None):
        hyps = beam_search(
            model,
            pad_batch([src_ids[i] for i in batch], device),
            beam=args.beam,
            lenpen=args.lenpen,
            max_len_a=args.max_len_a,
            max_len_b=args.max_len_b,
            use_cache=use_cache,
            autocast_dtype=dtype,
        )
        for i, h in zip(batch, hyps, strict=True):
            out[i] = h
    if device.type == "cuda":
        torch.cuda.synchronize()
    seconds = time.perf_counter() - start
    return out, seconds, sum(len(h) + 1 for h in out)


def random_setup(args: argparse.Namespace, device: torch.device):
    """An untrained model and random sources of 8-40 tokens: measures the decoder, not the translations."""
    torch.manual_seed(0)
    d, n_layers = args.d_model, args.layers
    cfg = ModelConfig(encoder_layers=n_layers, decoder_layers=n_layers, d_model=d, ffn_dim=2 * d, heads=4, dropout=0.0)
    model = Transformer(cfg, args.vocab, PAD)
    model = model.to(device).eval()
    g = torch.Generator().manual_seed(0)
    n = args.limit or 200
    tokens = random_tokens(n, 40, args.vocab, PAD, g, min_length=8)  # (n, 40), right-padded
    src = [row[row != PAD][:-1].tolist() + [EOS] for row in tokens]  # 8-40 tokens ending with EOS
    return model, None, src, None


def read_sources(tokenizer, args: argparse.Namespace):
    """(source ids ending with EOS, references or None) from ``--src``/``--ref`` (default Multi30k test)."""
    src_file = args.src or MULTI30K / "test.de"
    ref_file = args.ref or (MULTI30K / "test.en" if args.src is None else None)
    if ref_file is not None:
        sentences, refs = read_parallel_text(src_file, ref_file)
    else:
        sentences, refs = read_text_lines(src_file), None
    if args.limit:
        sentences = sentences[: args.limit]
        refs = refs[: args.limit] if refs is not None else None
    return [x + [EOS] for x in tokenizer.encode_batch(sentences)], refs


def checkpoint_setup(args: argparse.Namespace, device: torch.device):
    model, tokenizer, _ = load_model(args.checkpoint, device)
    return model, tokenizer, *read_sources(tokenizer, args)


def peer_random_setup(args: argparse.Namespace, device: torch.device):
    """``+experiment=iwslt_postln``'s model (transformer_iwslt_de_en sizes, Post-LN, Xavier init, untrained)
    and tfx.train's Multi30k vocabulary, on the real test sources."""
    cfg = compose_config(["+experiment=iwslt_postln", "data=multi30k", f"data.local_dir={MULTI30K}"])
    tokenizer = prepare_data(cfg.data, splits=("test",)).tokenizer
    model = build_model(cfg.model, tokenizer.vocab_size, PAD)
    apply_init(model, cfg.init.name, seed=cfg.train.seed)
    return model.to(device).eval(), tokenizer, *read_sources(tokenizer, args)


# --- the peer: the same model in fairseq-generate ----------------------------------------------------------

GENERATE_TIMING = re.compile(
    r"Translated ([\d,]+) sentences \(([\d,]+) tokens\) in ([\d.]+)s \(([\d.]+) sentences/s, ([\d.]+) tokens/s\)"
)


@dataclass
class Run:
    side: str
    sentences: int
    tokens: int
    tokens_per_s: float


def parse_generate_output(text: str) -> tuple[dict[int, list[int]], Run]:
    """fairseq-generate's best hypothesis per sentence id (tfx ids) and its own timing line: tokens/s over
    ``task.inference_step`` only (model loading, data loading and printing excluded), tokens = the best
    hypothesis' tokens including its EOS (``len(h[0]["tokens"])`` in generate.py)."""
    hyps = {}
    for line in text.splitlines():
        if line.startswith("H-"):
            head, _score, hyp = [*line.split("\t", 2), ""][:3]
            hyps[int(head[2:])] = parse_hypothesis(hyp)
    match = GENERATE_TIMING.search(text)
    if match is None:
        raise ValueError("no 'Translated N sentences (T tokens) in Xs' line in fairseq-generate's output")
    sentences, tokens = int(match[1].replace(",", "")), int(match[2].replace(",", ""))
    return hyps, Run("fairseq", sentences, tokens, float(match[5]))


def thread_env(threads: int) -> dict[str, str]:
    return {**os.environ, "OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads)}


def run_checked(cmd: list[str], threads: int, what: str) -> str:
    """Run ``cmd``; a failure is one line naming ``what`` and the end of its output."""
    done = subprocess.run(cmd, capture_output=True, text=True, env=thread_env(threads))
    out = done.stdout + done.stderr
    if done.returncode != 0:
        tail = " / ".join(out.strip().splitlines()[-3:])
        raise RuntimeError(f"{what} exited {done.returncode}: {tail}")
    return out


def teacher_forced_batch(model: Transformer, src: list[list[int]], prev: list[list[int]]):
    """tfx's log-probs (N, T, V) with the vocabulary in fairseq's order, the same batch in fairseq ids, and
    the mask of real target positions."""
    to_fs = tfx_to_fairseq(model.vocab_size)
    src_t, prev_t = pad_batch(src, torch.device("cpu")), pad_batch(prev, torch.device("cpu"))
    with torch.inference_mode():
        lprobs = model.cpu()(src_t, prev_t).float().log_softmax(-1)[:, :, fairseq_to_tfx(model.vocab_size)]
    fs_src = torch.where(src_t.eq(PAD), FAIRSEQ_PAD, to_fs[src_t])
    fs_prev = torch.where(prev_t.eq(PAD), FAIRSEQ_PAD, to_fs[prev_t])
    fs_prev[:, 0] = FAIRSEQ_EOS  # fairseq's decoder starts from </s>
    batch = {
        "src_tokens": fs_src.numpy(),
        "src_lengths": src_t.ne(PAD).sum(1).numpy(),
        "prev_output_tokens": fs_prev.numpy(),
    }
    return lprobs, batch, prev_t.ne(PAD)


def convert_for_fairseq(
    model: Transformer, src: list[list[int]], check_prev: list[list[int]], work: Path, venv: Path, threads: int
) -> float:
    """Write dict.txt, the sources (raw text) and fairseq's checkpoint ``work/model.pt``; return the largest
    |log p_tfx - log p_fairseq| over every vocabulary entry of a teacher-forced batch."""
    for lang in ("de", "en"):
        (work / f"dict.{lang}.txt").write_text("\n".join(dictionary_lines(model.vocab_size)) + "\n")
    (work / "test.de-en.de").write_text("".join(source_line(x) + "\n" for x in src))
    np.savez(work / "weights.npz", **{k: v.numpy() for k, v in fairseq_state_dict(model).items()})
    n = len(check_prev)
    lprobs, batch, mask = teacher_forced_batch(model, src[:n], check_prev)
    np.savez(work / "check_in.npz", **batch)
    cmd = [str(venv / "bin" / "python"), str(Path(__file__).with_name("fairseq_convert.py")), str(work)]
    cmd += [str(work / "weights.npz"), str(work / "model.pt"), "--check", str(work / "check_in.npz")]
    cmd += [str(work / "check_out.npz"), "--", *fairseq_arch_args(model)]
    run_checked(cmd, threads, "fairseq_convert.py")
    theirs = torch.from_numpy(np.load(work / "check_out.npz")["lprobs"])
    return float((lprobs - theirs).abs()[mask].max())


def generate_command(work: Path, venv: Path, args: argparse.Namespace) -> list[str]:
    """fairseq-generate with tfx's search settings; ``--unkpen inf`` blocks tfx's BOS (at fairseq's <unk>)."""
    return [
        str(venv / "bin" / "fairseq-generate"), str(work), "--path", str(work / "model.pt"),
        "--task", "translation", "-s", "de", "-t", "en", "--gen-subset", "test", "--dataset-impl", "raw",
        "--beam", str(args.beam), "--nbest", "1", "--lenpen", str(args.lenpen), "--unkpen", "inf",
        "--max-len-a", str(args.max_len_a), "--max-len-b", str(args.max_len_b),
        "--max-tokens", str(args.max_tokens), "--required-batch-size-multiple", "1",
        "--num-workers", "0", "--cpu", "--left-pad-source",
    ]  # fmt: skip


def run_fairseq(work: Path, venv: Path, args: argparse.Namespace) -> tuple[dict[int, list[int]], Run]:
    return parse_generate_output(run_checked(generate_command(work, venv, args), args.threads, "fairseq-generate"))


def run_tfx(model: Transformer, src: list[list[int]], args: argparse.Namespace) -> tuple[list[list[int]], Run]:
    out, seconds, n_tok = decode_all(model, src, args, use_cache=True)
    return out, Run("tfx", len(src), n_tok, n_tok / seconds)


def peer_comparison(model: Transformer, tokenizer, src: list[list[int]], refs, args: argparse.Namespace) -> int:
    venv = args.fairseq_venv
    if not (venv / "bin" / "fairseq-generate").is_file():
        raise FileNotFoundError(
            f"no fairseq-generate in {venv}: run ../shared/bench/fairseq_peer.sh once (it installs fairseq 0.12.2 "
            "there) or pass --fairseq-venv"
        )
    model = model.cpu().eval()
    check_prev = [[BOS, *x[:-1]] for x in (tokenizer.encode_batch(refs[:8]) if refs else src[:8])]
    with tempfile.TemporaryDirectory(prefix="tfx_peer_") as tmp:
        work = args.work_dir or Path(tmp)
        work.mkdir(parents=True, exist_ok=True)
        max_diff = convert_for_fairseq(model, src, check_prev, work, venv, args.threads)
        print(
            f"converted to fairseq: teacher-forced log-probs, max |tfx - fairseq| = {max_diff:.2e} (every vocab entry)"
        )
        runs: list[Run] = []
        for r in range(args.repeat):
            for side in ("tfx", "fairseq") if r % 2 == 0 else ("fairseq", "tfx"):  # alternate against drift
                if side == "tfx":
                    ours, run = run_tfx(model, src, args)
                else:
                    theirs, run = run_fairseq(work, venv, args)
                runs.append(run)
                load = os.getloadavg()[0]
                print(
                    f"  repeat {r + 1} {run.side:>8}: {run.sentences} sentences, {run.tokens} tokens, "
                    f"{run.tokens_per_s:8.1f} tokens/s   (load average {load:.2f})",
                    flush=True,
                )
    report_peer(runs, ours, theirs, len(src))
    return 0


def report_peer(runs: list[Run], ours: list[list[int]], theirs: dict[int, list[int]], n_sent: int) -> None:
    """Mean tokens/s per side, the ratio, and how many best hypotheses the two sides agree on."""
    mean = {side: sum(r.tokens_per_s for r in runs if r.side == side) / max(1, sum(r.side == side for r in runs))
            for side in ("tfx", "fairseq")}  # fmt: skip
    same = sum(strip_unk(ours[i]) == theirs.get(i) for i in range(n_sent))
    ratio = mean["tfx"] / mean["fairseq"]
    print(
        f"generated tokens/s (EOS counted, as fairseq-generate counts): tfx {mean['tfx']:.1f}, "
        f"fairseq-generate {mean['fairseq']:.1f}, ratio tfx/fairseq {ratio:.2f}x"
    )
    print(f"identical best hypotheses: {same}/{n_sent} ({100 * same / n_sent:.1f}%)")


def report(name: str, n_sent: int, seconds: float, n_tok: int) -> None:
    print(
        f"{name:>24}: {n_sent:5d} sentences in {seconds:7.2f} s = {n_sent / seconds:8.1f} sent/s, "
        f"{n_tok / seconds:9.1f} tok/s"
    )


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("checkpoint", type=Path, nargs="?", help="a tfx checkpoint (omit with --random)")
    parser.add_argument("--src", type=Path, help="raw source sentences (default: Multi30k test.de)")
    parser.add_argument("--ref", type=Path, help="references for BLEU (default: Multi30k test.en with the default src)")
    parser.add_argument("--beam", type=int, default=5)
    parser.add_argument("--lenpen", type=float, default=decode.LENPEN, help="score = logprob / len**lenpen")
    parser.add_argument(
        "--max-len-a", type=float, help="output length <= a*src_len+b (default tfx's; --peer --random 0)"
    )
    parser.add_argument("--max-len-b", type=int, help=f"(default tfx's; --peer --random {RANDOM_MAX_LEN_B})")
    parser.add_argument("--limit", type=int, default=0, help="decode only the first N sentences (0 = all)")
    parser.add_argument("--uncached-limit", type=int, default=100, help="sentences for the slow uncached path")
    parser.add_argument("--max-tokens", type=int, default=4096, help="padded source tokens per batch")
    parser.add_argument("--device", default="auto")
    parser.add_argument("--threads", type=int, default=0, help="torch CPU threads (0 = torch default; --peer: 1)")
    parser.add_argument("--bf16", action="store_true", help="bf16 autocast")
    parser.add_argument("--random", action="store_true", help="benchmark an untrained model")
    parser.add_argument("--d-model", type=int, default=256, help="--random model width (without --peer)")
    parser.add_argument("--layers", type=int, default=3, help="--random encoder and decoder depth (without --peer)")
    parser.add_argument("--vocab", type=int, default=8000, help="--random vocabulary size (without --peer)")
    parser.add_argument("--peer", action="store_true", help="the same model in fairseq-generate, same sentences")
    parser.add_argument("--repeat", type=int, default=1, help="--peer: runs per side, alternating")
    parser.add_argument("--work-dir", type=Path, help="--peer: keep fairseq's checkpoint and data here")
    parser.add_argument("--fairseq-venv", type=Path, default=FAIRSEQ_VENV, help="fairseq 0.12.2's environment")
    args = parser.parse_args()
    if (args.checkpoint is None) != args.random:
        parser.error("pass a CHECKPOINT or --random (not both)")
    if args.peer and (args.bf16 or args.device not in ("auto", "cpu")):
        parser.error("--peer compares fp32 on the CPU (fairseq-generate --cpu): drop --bf16/--device")
    if args.repeat < 1:
        parser.error("--repeat must be >= 1")
    random_peer = args.peer and args.random
    if args.max_len_a is None:
        args.max_len_a = 0.0 if random_peer else decode.MAX_LEN_A
    if args.max_len_b is None:
        args.max_len_b = RANDOM_MAX_LEN_B if random_peer else decode.MAX_LEN_B
    if args.peer:
        args.threads, args.device = args.threads or 1, "cpu"
    return args


def setup(args: argparse.Namespace, device: torch.device):
    if args.peer and args.random:
        return peer_random_setup(args, device)
    return random_setup(args, device) if args.random else checkpoint_setup(args, device)


def main() -> int:
    args = parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    device = resolve_device(args.device, setting="--device")
    model, tokenizer, src, refs = setup(args, device)
    print(
        f"{len(src)} sentences, {sum(map(len, src))} source tokens, beam {args.beam}, device {device}, "
        f"{torch.get_num_threads()} threads, max length {args.max_len_a:g} * src_len + {args.max_len_b}"
    )
    if args.peer:
        if args.max_len_a:
            print(
                "note: fairseq-generate applies max_len_a * src_len + b per batch (its widest source), tfx per "
                "sentence: hypotheses that reach the cap can differ; --max-len-a 0 makes the two rules one"
            )
        try:
            return peer_comparison(model, tokenizer, src, refs, args)
        except (FileNotFoundError, RuntimeError, ValueError) as err:
            print(f"bench_decode.py --peer: {err}", file=sys.stderr)
            return 1
    subset = src[: args.uncached_limit]
    cached, sec, n_tok = decode_all(model, src, args, use_cache=True)
    report("cached (all)", len(src), sec, n_tok)
    sub_cached, sec_c, tok_c = decode_all(model, subset, args, use_cache=True)
    report("cached (subset)", len(subset), sec_c, tok_c)
    sub_uncached, sec_u, tok_u = decode_all(model, subset, args, use_cache=False)
    report("uncached (subset)", len(subset), sec_u, tok_u)
    same = sum(a == b for a, b in zip(sub_cached, sub_uncached, strict=True))
    print(f"speed-up cached/uncached: {sec_u / sec_c:.1f}x   identical outputs: {same}/{len(subset)}")
    if refs is not None and tokenizer is not None:
        print(corpus_bleu([tokenizer.decode(h) for h in cached], refs))
    return 0


if __name__ == "__main__":
    sys.exit(main())
