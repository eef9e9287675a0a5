"""`rankcollapse probe` against a plain transformers script: CPU seconds of whole processes.

The plain script loads the same model and tokenizer with transformers, cuts the same
windows (``rankcollapse.data.make_windows``, seed 0), runs one forward pass with
``output_hidden_states=True`` and computes the probe's default metrics (mu, mu_relative,
rank_fraction, sigma_min, avg |cos|) of every hidden state in plain torch, in the
states' float32. ``probe`` writes no files (no ``--out``: no figure). Each row is a fresh
interpreter (the files it reads are in the page cache after the first row); CPU time is user + system of the child (``getrusage``), the number that
predicts the time on an idle machine; the load average is printed with the table.

SmolLM2 rows: ``probe`` with the dequantised weights already in the GGUF cache (a first,
untimed run fills a temporary one) and with the cache off (``RANKCOLLAPSE_GGUF_CACHE=off``: every run
dequantises). Goal: probe at most 1.15x the plain script.

Usage: .venv/bin/python benchmarks/bench_probe.py [--models minilm,smollm2] [--repeats 1]
    [--n-samples 8] [--n-tokens 128] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time

GOAL = 1.15

PLAIN = r"""
import sys
import torch, transformers
from rankcollapse import assets
from rankcollapse.data import make_windows, wikipedia_texts

name, n_tokens, n_samples = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
if name == "smollm2":
    folder, gguf = assets.smollm2_gguf()
    kw = {"gguf_file": gguf}
else:
    folder, kw = assets.minilm_dir(), {}
tok = transformers.AutoTokenizer.from_pretrained(folder, **kw)
model = transformers.AutoModel.from_pretrained(folder, dtype=torch.float32, **kw).eval()
wins = make_windows(wikipedia_texts(), tok, n_tokens=n_tokens, n_samples=n_samples, seed=0)
with torch.no_grad():
    out = model(input_ids=wins.input_ids, attention_mask=wins.attention_mask, output_hidden_states=True)
    for X in out.hidden_states:  # (B, N, d); every window is full
        B, N, d = X.shape
        mu = torch.linalg.matrix_norm(X - X.mean(dim=1, keepdim=True))  # (B,)
        mu_relative = mu / torch.linalg.matrix_norm(X)
        s = torch.linalg.svdvals(X)  # (B, min(N, d))
        rank_fraction = (s > s[:, :1] * max(N, d) * torch.finfo(X.dtype).eps).sum(-1) / min(N, d)
        sigma_min = s[:, -1]
        U = X / X.norm(dim=-1, keepdim=True)
        C = (U @ U.mT).abs()  # (B, N, N)
        avg_abs_cos = (C.sum((-2, -1)) - C.diagonal(dim1=-2, dim2=-1).sum(-1)) / (N * (N - 1))
        print(float(mu.mean()), float(mu_relative.mean()), float(rank_fraction.mean()), float(sigma_min.mean()),
              float(avg_abs_cos.mean()))
"""


def run_once(argv: list[str], env: dict[str, str]) -> tuple[float, float]:
    """(wall seconds, CPU seconds) of one fresh process running ``argv``."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    subprocess.run([sys.executable, *argv], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, check=True, env=env)
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def cases(model: str, n_samples: int, n_tokens: int, cache: str) -> list[tuple[str, list[str], dict[str, str]]]:
    """(label, argv after the interpreter, extra environment) of one model's rows."""
    probe = ["-m", "rankcollapse.cli", "probe", "--model", model, "--n-samples", str(n_samples),
             "--n-tokens", str(n_tokens), "--format", "json"]
    rows = [(f"{model}: plain transformers script", ["-c", PLAIN, model, str(n_tokens), str(n_samples)], {})]
    if model == "smollm2":
        rows += [(f"{model}: probe, GGUF cache warm", probe, {"RANKCOLLAPSE_GGUF_CACHE": cache}),
                 (f"{model}: probe, GGUF cache off", probe, {"RANKCOLLAPSE_GGUF_CACHE": "off"})]
    else:
        rows.append((f"{model}: probe", probe, {}))
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="minilm,smollm2")
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--n-samples", type=int, default=8)
    parser.add_argument("--n-tokens", type=int, default=128)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    base = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
    load_before = os.getloadavg()
    rows = []
    with tempfile.TemporaryDirectory() as cache:
        for model in args.models.split(","):
            plain_cpu = None
            for label, argv, extra in cases(model.strip(), args.n_samples, args.n_tokens, cache):
                env = dict(base, **extra)
                if extra.get("RANKCOLLAPSE_GGUF_CACHE") == cache:
                    run_once(argv, env)  # fills the GGUF cache
                walls, cpus = zip(*(run_once(argv, env) for _ in range(args.repeats)))
                cpu = statistics.median(cpus)
                plain_cpu = cpu if plain_cpu is None else plain_cpu
                rows.append({"command": label, "wall_s": statistics.median(walls), "cpu_s": cpu,
                             "ratio": cpu / plain_cpu})
    load_after = os.getloadavg()
    threads = os.environ.get("OMP_NUM_THREADS")
    if args.json:
        print(json.dumps({"repeats": args.repeats, "load_before": load_before, "load_after": load_after,
                          "omp_num_threads": threads, "goal": GOAL, "rows": rows}, indent=1))
        return
    print(f"{args.n_samples} windows x {args.n_tokens} tokens, {args.repeats} timed run(s) per row, "
          f"medians; load average {load_before[0]:.2f} before, {load_after[0]:.2f} after ({os.cpu_count()} CPUs, "
          f"OMP_NUM_THREADS={threads}); goal: probe <= {GOAL}x the plain script (CPU s)")
    print(f"{'command':40} {'wall s':>7} {'CPU s':>7} {'ratio':>6}")
    for r in rows:
        print(f"{r['command']:40} {r['wall_s']:>7.2f} {r['cpu_s']:>7.2f} {r['ratio']:>6.2f}")


if __name__ == "__main__":
    main()
