"""Generate with llmfuse from a Hugging Face checkpoint directory, streaming the tokens.

    python examples/generate.py path/to/Llama-3.2-1B --prompt "The capital of France is" --new 32
    python examples/generate.py path/to/ckpt --ids 1,450,7483 --new 16 --looped --temperature 0.7 --seed 1

The directory holds ``config.json`` and ``model.safetensors`` (or a sharded index).  With
a tokenizer in the directory (and transformers installed) the prompt is text and the
output is streamed as text; otherwise give ``--ids`` and token ids are streamed.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

import llmfuse


def _tokenizer(directory: Path):
    if not any((directory / name).exists() for name in ("tokenizer.json", "tokenizer.model", "tokenizer_config.json")):
        return None
    try:
        from transformers import AutoTokenizer
    except ImportError:
        return None
    return AutoTokenizer.from_pretrained(directory)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("checkpoint", type=Path, help="checkpoint directory (config.json + safetensors)")
    parser.add_argument("--prompt", help="prompt text (needs a tokenizer in the directory)")
    parser.add_argument("--ids", help="prompt as comma-separated token ids")
    parser.add_argument("--new", type=int, default=32, help="tokens to generate")
    parser.add_argument("--temperature", type=float, default=0.0, help="0 = greedy")
    parser.add_argument("--top-k", type=int)
    parser.add_argument("--top-p", type=float)
    parser.add_argument("--seed", type=int)
    parser.add_argument("--looped", action="store_true", help="use the looped decode kernel (all layers in one launch)")
    parser.add_argument("--dtype", choices=["bfloat16", "float16", "float32"])
    args = parser.parse_args(argv)

    tokenizer = _tokenizer(args.checkpoint)
    if args.ids:
        try:
            ids = [int(tok) for tok in args.ids.split(",")]
        except ValueError:
            parser.error(f"--ids must be comma-separated integers, got {args.ids!r}")
    elif args.prompt is not None and tokenizer is not None:
        ids = tokenizer(args.prompt)["input_ids"]
    else:
        parser.error("give --ids, or --prompt with a tokenizer in the checkpoint directory")
    dtype = getattr(torch, args.dtype) if args.dtype else None
    try:
        model = llmfuse.from_pretrained(args.checkpoint, dtype=dtype, max_seq_len=len(ids) + max(args.new, 1),
                                        looped=args.looped)
    except (ValueError, TypeError, FileNotFoundError) as exc:  # a bad checkpoint: say what is wrong, no traceback
        print(f"cannot load {args.checkpoint}: {exc}", file=sys.stderr)
        return 2
    prompt = torch.tensor([ids], dtype=torch.int64, device=model.device)
    produced: list[int] = []
    try:  # stops at the checkpoint's end-of-sequence ids (generation_config.json, else config.json)
        tokens = model.stream(prompt, args.new, temperature=args.temperature, top_k=args.top_k, top_p=args.top_p,
                              seed=args.seed)
    except (ValueError, TypeError) as exc:  # a bad prompt or setting: say what is wrong, no traceback
        print(f"cannot generate: {exc}", file=sys.stderr)
        return 2
    for token in tokens:
        produced.append(int(token[0]))
        if tokenizer is not None:
            # decode the whole continuation each time so multi-token characters print correctly
            text = tokenizer.decode(produced, skip_special_tokens=True)
            previous = tokenizer.decode(produced[:-1], skip_special_tokens=True)
            sys.stdout.write(text[len(previous):])
        else:
            sys.stdout.write(f"{produced[-1]} ")
        sys.stdout.flush()
    sys.stdout.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
