"""Translate raw sentences with a checkpoint (its config and sentencepiece model travel inside it).

    python -m tfx.translate outputs/RUN/checkpoints/checkpoint_best.pt --input test.de --output test.hyp
    python -m tfx.translate outputs/RUN --input test.de      # a run folder: its checkpoint_best.pt, as tfx.evaluate
    echo "Ein Hund läuft." | python -m tfx.translate checkpoint_best.pt --beam 5

One sentence per line in, one detokenized translation per line out, in input order; UTF-8 both ways,
stdin and stdout included, whatever the locale. Errors are one line on stderr and a non-zero exit status.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

import torch

from tfx.checkpoints.load import CheckpointError, MissingPlugin, build_from_checkpoint, load_checkpoint
from tfx.checkpoints.numbered import best_checkpoint
from tfx.data import DataError
from tfx.data.sources import read_lines
from tfx.data.stream import chunk_lines
from tfx.evaluation import decode
from tfx.evaluation.decode import translate_sentences
from tfx.files.atomic import atomic_open
from tfx.files.environment import Remedy, environment_errors
from tfx.runtime.distributed import DeviceError, resolve_device


def load_model(path: str | Path, device: torch.device):
    """(model in eval mode, tokenizer, config dict); anything that does not fit is a one-line error."""
    ckpt = load_checkpoint(path, map_location="cpu")
    try:
        return build_from_checkpoint(ckpt, device)
    except MissingPlugin as err:  # written by tfx.train with a plugin: the way on is the Python path, not the file
        raise MissingPlugin(f"checkpoint {path}: {err}") from None
    except (CheckpointError, DataError):
        raise
    except (KeyError, TypeError, ValueError, RuntimeError) as err:
        first_line = str(err).strip().splitlines()[0] if str(err).strip() else ""
        raise CheckpointError(
            f"checkpoint {path} cannot be rebuilt ({type(err).__name__}: {first_line}): was it written by tfx.train?"
        ) from err


def read_text_lines(path: str | Path | None) -> list[str]:
    """Lines of a UTF-8 file (``.gz`` too), or of stdin when ``path`` is None: its bytes, decoded by the rule files
    follow, whatever the locale would have decoded them to."""
    if path is None:
        return chunk_lines(sys.stdin.buffer.read(), "<stdin>")
    if not Path(path).is_file():
        raise FileNotFoundError(f"input file {path} does not exist")
    return read_lines(path)


def write_text_atomic(path: str | Path, lines: Sequence[str]) -> None:
    """Write lines through ``atomic_open``: readers (and a crash) never see half a file."""
    with atomic_open(path, "w", encoding="utf-8") as f:
        f.writelines(line + "\n" for line in lines)


def write_lines(path: str | Path | None, lines: Sequence[str]) -> None:
    """To ``path`` atomically, or to stdout when ``path`` is None; UTF-8 either way, whatever the locale."""
    if path is None:
        sys.stdout.flush()
        sys.stdout.buffer.write("".join(line + "\n" for line in lines).encode("utf-8"))
        sys.stdout.buffer.flush()
    else:
        write_text_atomic(path, lines)


def add_decoding_args(parser: argparse.ArgumentParser) -> None:
    """Options shared by ``tfx.translate``, ``tfx.evaluate`` and ``tfx.average --best-window``."""
    d = " (default: %(default)s)"  # argparse fills it in: --help shows what a decode does unless told otherwise
    parser.add_argument("--beam", type=int, default=decode.BEAM, help="beam size, 1 = greedy" + d)
    parser.add_argument("--lenpen", type=float, default=decode.LENPEN, help="score = logprob / len**lenpen" + d)
    parser.add_argument("--max-tokens", type=int, default=decode.MAX_TOKENS, help="padded source tokens per batch" + d)
    parser.add_argument("--max-len-a", type=float, default=decode.MAX_LEN_A, help="max output length = a*src_len+b" + d)
    parser.add_argument("--max-len-b", type=int, default=decode.MAX_LEN_B, help="max output length = a*src_len+b" + d)
    parser.add_argument("--device", default="auto", help="auto | cpu | cuda | cuda:N" + d)
    parser.add_argument("--bf16", action="store_true", help="run the model under bf16 autocast (default: fp32)")
    parser.add_argument(
        "--threads", type=int, default=0, help="CPU threads (torch.set_num_threads), 0: torch's own" + d
    )


def translate_with_args(
    model, tokenizer, sentences: Sequence[str], args: argparse.Namespace, device: torch.device, progress: bool
) -> list[str]:
    """``translate_sentences`` with the options of ``add_decoding_args``."""
    return translate_sentences(
        model,
        tokenizer,
        sentences,
        beam=args.beam,
        lenpen=args.lenpen,
        max_tokens=args.max_tokens,
        device=device,
        progress=progress,
        autocast_dtype=torch.bfloat16 if args.bf16 else None,
        max_len_a=args.max_len_a,
        max_len_b=args.max_len_b,
    )


USER_ERRORS = (CheckpointError, DataError, DeviceError, OSError)  # bad input: one line on stderr, exit 1, no traceback


def run_reporting_errors(action: Callable[[], object], program: str, remedy: Remedy) -> int:
    """The command-line tools' exit status: 0, or 1 after printing a user error as one line. A failure of the
    machine (full disk, no permission, out of memory) is one line too, with ``remedy``, and exits 1 from inside
    (``tfx.files.environment``); OSErrors that are not (no errno: a message of tfx or a library) are user errors."""
    try:
        with environment_errors(program, remedy):
            action()
    except USER_ERRORS as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    return 0


def check_decoding_args(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """Refuse bad decoding options; apply ``--threads`` (before any model is built or any data is read)."""
    if args.beam < 1:
        parser.error("--beam must be >= 1")
    if args.max_tokens < 1:
        parser.error("--max-tokens must be >= 1")
    if args.threads < 0:
        parser.error("--threads must be >= 0 (0 = torch's default)")
    if args.threads:
        torch.set_num_threads(args.threads)  # e.g. 1 per process when several decode at once on a small CPU


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m tfx.translate", description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "checkpoint", type=Path, help="a .pt file of tfx.train or tfx.average, or a run folder: its checkpoint_best.pt"
    )
    parser.add_argument("--input", type=Path, help="raw source sentences, one per line (default: stdin)")
    parser.add_argument("--output", type=Path, help="where to write translations (default: stdout)")
    parser.add_argument("--quiet", action="store_true", help="no progress bar")
    add_decoding_args(parser)
    args = parser.parse_args(argv)
    check_decoding_args(parser, args)
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)

    def translate() -> None:
        device = resolve_device(args.device, setting="--device")
        model, tokenizer, _ = load_model(best_checkpoint(args.checkpoint), device)
        sentences = read_text_lines(args.input)
        progress = args.input is not None and not args.quiet
        write_lines(args.output, translate_with_args(model, tokenizer, sentences, args, device, progress))

    remedy = Remedy({"--output": args.output}, memory="lower --max-tokens or --beam")
    return run_reporting_errors(translate, "tfx.translate", remedy)


if __name__ == "__main__":
    sys.exit(main())
