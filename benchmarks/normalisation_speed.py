"""Normalisations as speed regulators: one setting, every normalisation.

Setting: pure-SA weights (``W_Q, W_K, W_V`` i.i.d. ``N(0, 1/d)`` per layer, the default
Gaussian family), N = 32 tokens, d = 16, 64 layers, complete and causal masks, float64,
8 seeds (seed s draws the weights and the input ``X(0)``, i.i.d. ``N(0, 1)`` tokens).
For each block it prints μ/‖X‖_F (``mu_relative``) at layers 16, 32, 64 (median and range
over seeds) and the law of the cosine gap ``g(t) = 1 - avg_cos`` over layers 1..64
(``rankcollapse.metrics.rate.fit_decay_law``; floor 1e-12, about 100 times the float64
round-off of a cosine average over 32 tokens): the count of seeds per law, and the medians
of the exponent, the rate and both R².

Usage: ``python benchmarks/normalisation_speed.py [--markdown]``
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import torch

from rankcollapse.dynamics import BlockConfig, RunConfig, simulate
from rankcollapse.metrics.rate import fit_decay_law

N, D, DEPTH, SEEDS = 32, 16, 64, 8
LAYERS = (16, 32, 64)
GAP_FLOOR = 1e-12

BLOCKS = {
    "pure (none)": BlockConfig(),
    "sphere (SA-LN)": BlockConfig(norm="sphere"),
    "post_ln layernorm": BlockConfig(norm="layernorm", placement="post_ln"),
    "pre_ln layernorm": BlockConfig(norm="layernorm", placement="pre_ln"),
    "pre_ln rmsnorm": BlockConfig(norm="rmsnorm", placement="pre_ln"),
    "peri layernorm": BlockConfig(norm="layernorm", placement="peri"),
    "mix layernorm (16)": BlockConfig(norm="layernorm", placement="mix", mix_layers=DEPTH // 4),
    "lns layernorm": BlockConfig(norm="layernorm", placement="lns"),
    "ngpt (0.05)": BlockConfig(norm="sphere", placement="ngpt"),
    "pre_ln dyt (0.5)": BlockConfig(norm="dyt", placement="pre_ln"),
    "qk_norm (pure)": BlockConfig(qk_norm=True),
    "pre_ln layernorm + qk_norm": BlockConfig(norm="layernorm", placement="pre_ln", qk_norm=True),
}


def measure(cfg: BlockConfig, mask: str) -> dict:
    mu, gaps = [], []
    for seed in range(SEEDS):
        X0 = torch.randn(1, N, D, dtype=torch.float64, generator=torch.Generator().manual_seed(seed))
        res = simulate(X0, mask=mask, metrics=("mu_relative", "avg_cos"), block=cfg,
                       run=RunConfig(depth=DEPTH, seed=seed, dtype=torch.float64))
        mu.append(res.metrics["mu_relative"][:, 0].numpy())
        gaps.append(1.0 - res.metrics["avg_cos"][:, 0].numpy())
    mu, gaps = np.array(mu), np.array(gaps).T  # (seeds, T+1), (T+1, seeds)
    fit = fit_decay_law(gaps, floor=GAP_FLOOR)
    laws = {law: int((fit.law == law).sum()) for law in ("exponential", "power", "undecided")}
    return {"mu": {t: (np.median(mu[:, t]), mu[:, t].min(), mu[:, t].max()) for t in LAYERS}, "laws": laws,
            "exponent": np.nanmedian(fit.exponent), "rate": np.nanmedian(fit.rate),
            "r2_exp": np.nanmedian(fit.r2_exponential), "r2_pow": np.nanmedian(fit.r2_power),
            "n_layers": int(np.median(fit.n_layers))}


def main() -> None:
    argparse.ArgumentParser(description=__doc__.splitlines()[0]).parse_args()
    torch.set_num_threads(1)
    start = time.perf_counter()
    print("| mask | block | μ/‖X‖_F @16 | @32 | @64 | law of g (exp/pow/undec.) | exponent p | rate b | "
          "R² exp | R² pow | layers fitted |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for mask in ("complete", "causal"):
        for name, cfg in BLOCKS.items():
            r = measure(cfg, mask)
            mus = " | ".join(f"{m:.2e} [{lo:.1e}, {hi:.1e}]" for m, lo, hi in r["mu"].values())
            laws = "/".join(str(r["laws"][k]) for k in ("exponential", "power", "undecided"))
            print(f"| {mask} | {name} | {mus} | {laws} | {r['exponent']:.3g} | {r['rate']:.3g} | "
                  f"{r['r2_exp']:.3f} | {r['r2_pow']:.3f} | {r['n_layers']} |", flush=True)
    print(f"\nwall {time.perf_counter() - start:.0f} s", flush=True)


if __name__ == "__main__":
    main()
