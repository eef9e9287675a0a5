"""Recorder overhead: a forward pass recording every hidden_states point vs a plain
forward pass (output_hidden_states=False) of the same model on the same batch.

Both are timed alternately in one run (median of repeats) and reported as a ratio,
because absolute times on shared machines vary. Target: ratio <= 1.1.

    .venv/bin/python benchmarks/bench_recorder.py [--model minilm] [--batch 8] [--length 128] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402

from rankcollapse.data import make_windows, wikipedia_texts  # noqa: E402
from rankcollapse.models import Recorder, load_model, model_inputs  # noqa: E402


def _time(fn, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="minilm")
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--length", type=int, default=128)
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    loaded = load_model(args.model)
    wins = make_windows(wikipedia_texts(), loaded.tokenizer, n_tokens=args.length, n_samples=args.batch)
    inputs = model_inputs(loaded, wins.input_ids, wins.attention_mask)

    @torch.no_grad()
    def plain():
        loaded.model(**inputs, output_hidden_states=False)

    @torch.no_grad()
    def recorded():
        with Recorder(loaded):
            loaded.model(**inputs)

    plain(), recorded()  # warm-up
    t_plain, t_rec = [], []
    for _ in range(args.repeats):  # alternate so drift hits both equally
        t_plain.append(_time(plain, 1))
        t_rec.append(_time(recorded, 1))
    p, r = statistics.median(t_plain), statistics.median(t_rec)
    result = {"model": args.model, "batch": args.batch, "length": args.length, "plain_s": p, "recorder_s": r,
              "ratio": r / p, "threads": torch.get_num_threads()}
    if args.json:
        print(json.dumps(result))
    else:
        print(f"{'model':<10}{'batch x len':>12}{'plain s':>10}{'recorder s':>12}{'ratio':>8}")
        print(f"{args.model:<10}{f'{args.batch}x{args.length}':>12}{p:>10.3f}{r:>12.3f}{r / p:>8.3f}")


if __name__ == "__main__":
    main()
