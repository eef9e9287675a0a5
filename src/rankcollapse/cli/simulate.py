"""`rankcollapse simulate`: run the self-attention dynamics and print μ per layer."""

from __future__ import annotations

import warnings
from pathlib import Path

import typer

from .. import dynamics, models  # lazy packages; `data` (torch) is imported where used
from .._figure import save_figure
from .._io import load_array, versions, write_json_atomic
from .._memory import check_simulate_tokens, parse_size
from .._outdir import check_out, writing
from .._validate import Spec
from ..errors import ConfigError, DataError
from ._boundary import n_tokens_from
from ._output import ALLOW_NONEMPTY, check_format, print_result


#: ``--n-tokens`` of a drawn or Wikipedia input when the flag is not given.
N_TOKENS = 128


def input_name(source: str) -> str | None:
    """The registry name of ``--input`` (a spec ``NAME[:key=value,...]``, checked), or None for a file path."""
    from ..dynamics.inputs import INPUTS, canonical_input

    return Spec.name_of(canonical_input(source)) if Spec.name_of(source) in INPUTS else None


def _initial_tokens(source: str, n_tokens: int | None, d_model: int | None, samples: int, seed: int, loaded=None):
    """X(0) ``(B, N, d)`` from ``--input``: drawn, Wikipedia embedded by ``loaded`` (default MiniLM), or a file."""
    from ..dynamics.inputs import INPUTS, make_tokens

    name = input_name(source)
    if name is not None and n_tokens is None:
        n_tokens = N_TOKENS
    if name == "wikipedia":
        width = None if loaded is None else loaded.model.config.hidden_size
        if d_model is not None and width is not None and d_model != width:
            raise ConfigError(f"--input wikipedia uses {loaded.name} embeddings of width {width}; "
                              "drop --d-model or set it to that")
        X = make_tokens(source, samples, n_tokens, None, seed=seed, **({} if loaded is None else {"model": loaded}))
        if d_model not in (None, X.shape[-1]):
            raise ConfigError(f"--input {source} uses embeddings of width {X.shape[-1]}; "
                              "drop --d-model or set it to that")
        return X
    if name is not None:
        return make_tokens(source, samples, n_tokens, 64 if d_model is None else d_model, seed=seed)
    import torch

    path = Path(source)
    if not path.is_file():
        raise DataError(f"--input {source!r} is neither one of {tuple(INPUTS)} nor a readable .npy/.pt file")
    X = torch.as_tensor(load_array(path, "--input", error=DataError))
    # (B, N, d), refused if a given --n-tokens or width contradicts it
    if X.ndim == 2:
        X = X.unsqueeze(0)
    if X.ndim != 3:
        raise ConfigError(f"--input {source}: expected shape (N, d) or (B, N, d), got {tuple(X.shape)}")
    if n_tokens is not None and X.shape[1] != n_tokens:
        raise ConfigError(f"--input {source} has N={X.shape[1]} tokens (shape {tuple(X.shape)}) but --n-tokens is "
                          f"{n_tokens}; drop --n-tokens to use the file's N")
    if d_model is not None and X.shape[2] != d_model:
        raise ConfigError(f"--input {source} has width d={X.shape[2]} (shape {tuple(X.shape)}) but the run's width is "
                          f"{d_model} (--d-model or the --model's); drop --d-model to use the file's d")
    return X


#: Marks a value at the floor of the compute dtype in the table output.
FLOOR_MARK = "*"

#: The files ``--out`` receives.
NAMES = ("result.json", "mu_loglog.png")


def simulate_command(
    mask: str = typer.Option("causal", "--mask", help="mask spec, e.g. causal_sliding_window:w=4"),
    n_tokens: int = typer.Option(None, "--n-tokens", help="tokens per sample N (default 128; a FILE input or a .npy "
                                 "mask file: its N)"),
    depth: int = typer.Option(None, "--depth", help="layers T (default 32; with --model its number of layers)"),
    variant: str = typer.Option("pure", "--variant", help="pure | sphere | layernorm | skip | post_ln"),
    norm: str = typer.Option(None, "--norm", help="override: none | sphere | layernorm | rmsnorm | dyt (tanh, "
                             "--dyt-alpha)"),
    placement: str = typer.Option(None, "--placement", help="override: none | post_ln | pre_ln | peri | mix "
                                  "(--mix-layers) | lns | ngpt (--alpha-ngpt, norm sphere); "
                                  "all but none keep a residual (alpha 1) unless --alpha 0"),
    mix_layers: int = typer.Option(None, "--mix-layers", help="placement mix: leading post-LN layers"),
    alpha_ngpt: float = typer.Option(None, "--alpha-ngpt", help="placement ngpt: step alpha (default 0.05)"),
    dyt_alpha: float = typer.Option(None, "--dyt-alpha", help="norm dyt: slope of tanh(alpha x) (default 0.5)"),
    qk_norm: bool = typer.Option(None, "--qk-norm/--no-qk-norm", help="unit queries and keys, scores g cos "
                                 "(--qk-norm-scale g, default log2(N^2 - N))"),
    qk_norm_scale: float = typer.Option(None, "--qk-norm-scale", help="with --qk-norm: the score scale g"),
    headwise_rmsnorm: bool = typer.Option(None, "--headwise-rmsnorm/--no-headwise-rmsnorm",
                                          help="RMSNorm of each head's output before W_O"),
    alpha: float = typer.Option(None, "--alpha", help="override the skip weight (0 = no skip)"),
    heads: int = typer.Option(None, "--heads", help="attention heads"),
    mlp: bool = typer.Option(None, "--mlp/--no-mlp", help="add the MLP sublayer (post_ln/pre_ln)"),
    uniform: bool = typer.Option(False, "--uniform", help="uniform attention over the mask (W_Q = W_K = 0); "
                                 "the same as --attention uniform"),
    attention: str = typer.Option(None, "--attention", help="softmax (default) | uniform | sink:b=B | offbyone | "
                                  "sigmoid[:bias=B] | diff:lambda=L (docs/dynamics.md; not row-stochastic: "
                                  "dense backend only; the output adds token_radius, max_token_share and the "
                                  "per-layer row-mass deficit)"),
    value: str = typer.Option("gaussian", "--value", help="W_V family, e.g. orthogonal, gaussian:std=0.02"),
    query_key: str = typer.Option("gaussian", "--query-key", help="W_Q/W_K family"),
    shared: bool = typer.Option(False, "--shared", help="one set of weights for all layers (ALBERT-style)"),
    pretrained: str = typer.Option(None, "--model", help="attention weights (and, with --input wikipedia, embeddings) "
                                   "of minilm | smollm2 | a model dir"),
    d_qk: float = typer.Option(1.0, "--d-qk", help="temperature d_QK > 0"),
    source: str = typer.Option("gaussian", "--input", help="gaussian | sphere | hemisphere | nonnegative | antipodal | simplex | "
                               "wikipedia, with keys as NAME:key=value (gaussian:std=2, simplex:rho=0.9) | FILE.npy/.pt. "
                               "gaussian (default) tokens are N(0, I), not on the unit sphere, so the first "
                               "layer's normalisation/averaging gives a large one-off drop of μ; use sphere "
                               "to start on the sphere"),
    d_model: int = typer.Option(None, "--d-model", help="width d (default 64; wikipedia: the model's width)"),
    samples: int = typer.Option(8, "--n-samples", help="samples B"),
    seed: int = typer.Option(0, "--seed"),
    metrics: str = typer.Option("mu,mu_relative", "--metrics", help="comma-separated metric names"),
    dtype: str = typer.Option("float32", "--dtype", help="float32 | float64. float32 runs floor μ/‖X‖_F "
                              "(mu_relative) at ~1e-7 (rounding); use float64 to follow collapse further"),
    device: str = typer.Option("cpu", "--device", help="torch device, e.g. cpu or cuda:0"),
    backend: str = typer.Option("auto", "--backend", help="attention backend: auto | dense | blocked (windowed "
                                "kernel for sparse masks) | flex (torch.compile FlexAttention; no epsilon column)"),
    fmt: str = typer.Option("table", "--format", help="stdout: table (tab-separated), json, csv or markdown"),
    out: Path = typer.Option(None, "--out", help="folder for result.json and mu_loglog.png"),
    allow_nonempty: bool = ALLOW_NONEMPTY,
    max_memory: str = typer.Option(None, "--max-memory", help="memory the run may use (tokens, weights, attention), e.g. "
                                   "64GiB (default half the RAM); checked before anything is allocated"),
) -> None:
    """Simulate masked self-attention dynamics (spec.md §2) and report metrics per layer."""
    check_format(fmt)
    asked = list(dict.fromkeys(m.strip() for m in metrics.split(",") if m.strip()))  # each once, as probe
    if not asked:  # else a table of no metric
        raise ConfigError(f"--metrics {metrics!r} names no metric; e.g. --metrics mu,mu_relative")
    if dtype not in ("float32", "float64"):
        raise ConfigError(f"--dtype must be float32 or float64, got {dtype!r}")
    if out is not None:
        check_out(out, NAMES, allow_nonempty=allow_nonempty, flags=True)
    if not d_qk > 0:
        raise ConfigError(f"--d-qk must be > 0, got {d_qk}")
    if pretrained is not None and depth is not None:  # the model's layers are the network
        raise ConfigError("--depth does not apply with --model: the model's attention layers set the depth; drop it")
    depth = 32 if depth is None else depth
    if uniform and attention not in (None, "uniform"):
        raise ConfigError(f"--uniform and --attention {attention} contradict each other: give one")
    cfg = dynamics.resolve_variant(variant, norm=norm, placement=placement, alpha=alpha, n_heads=heads, mlp=mlp,
                          attention="uniform" if uniform else attention, mix_layers=mix_layers,
                          alpha_ngpt=alpha_ngpt, dyt_alpha=dyt_alpha, qk_norm=qk_norm, qk_norm_scale=qk_norm_scale,
                          headwise_rmsnorm=headwise_rmsnorm)
    name = input_name(source)
    if n_tokens is None and name is not None:  # drawn or Wikipedia tokens: a .npy mask file fixes N
        from .. import masks

        n_tokens = masks.spec_n_tokens(mask)
    weights = loaded = None
    if pretrained is not None:
        loaded = models.load_model(pretrained)
        weights = dynamics.extract_attention_weights(loaded.model)
        depth = len(weights)
        if name != "wikipedia" and d_model is None:
            d_model = weights[0].d_model
    if name is not None and name != "wikipedia":  # drawn here: refuse a size that cannot fit before drawing it
        check_simulate_tokens(samples, N_TOKENS if n_tokens is None else n_tokens, 64 if d_model is None else d_model,
                              8 if dtype == "float64" else 4, depth=depth, mlp_ratio=cfg.mlp_ratio if cfg.mlp else 0,
                              pure=cfg == dynamics.VARIANTS["pure"], max_memory=parse_size(max_memory))
        if weights is None:  # the attention too: a complete mask over a million tokens must not wait for X(0)
            from ..dynamics.runner import check_attention_fits

            check_attention_fits(mask, samples, N_TOKENS if n_tokens is None else n_tokens, 8 if dtype == "float64" else 4,
                                 n_heads=cfg.n_heads, backend=backend, max_memory=parse_size(max_memory))
    X0 = _initial_tokens(source, n_tokens, d_model, samples, seed, loaded)
    import torch  # here, not at the top: `rankcollapse --help` must not import torch

    if X0.is_floating_point():  # in the run's dtype now (simulate's own cast): no float64 copy held beside the run
        X0 = X0.to(getattr(torch, dtype))
    from ..dynamics.runner import STATE_METRICS
    from ..metrics.floor import UNDERFLOW_METRICS

    with warnings.catch_warnings(record=True) as caught:  # a run stopped at a zero matrix: said below, once
        warnings.simplefilter("always", RuntimeWarning)
        run = dynamics.RunConfig(depth=depth, seed=seed, dtype=getattr(torch, dtype), device=device, backend=backend,
                                 record_epsilon=backend != "flex", max_memory=parse_size(max_memory))
        with n_tokens_from(f"the N of --input {source!r}" if n_tokens is None and name is None else None):
            res = dynamics.simulate(X0, mask, block=cfg, run=run, d_qk=d_qk, value=value, query_key=query_key, weights=weights,
                                    shared=shared, metrics=asked + [m for m in STATE_METRICS if m not in asked])
    for w in caught:
        if res.stopped is None or not str(w.message).startswith(f"after layer {res.stopped.after_layer}: X is the zero"):
            warnings.warn_explicit(w.message, w.category, w.filename, w.lineno)
    report = res.report(asked, float64="--dtype float64")
    names, layers, floor = report["metrics"], report["layers"], report["floor"]
    # "variant": the preset equal to the block that ran (or custom; "block" has every field);
    # "variant_option": the --variant the overrides started from; "model": the --model
    doc = {"settings": {**res.config, "metrics": names, "variant_option": variant, "input": source,
                        "model": pretrained}, **{k: report[k] for k in ("layers", "floor", "stopped", "notes")},
           "versions": versions()}
    if out is not None:
        with writing(out, "simulate\n", NAMES, allow_nonempty=allow_nonempty) as stage:
            write_json_atomic(stage / "result.json", doc)
            drawn = [k for k in ("mu", "mu_relative") if k in asked] or asked  # μ and μ/‖X‖_F when asked
            save_figure(res.plot(drawn, title=f"{mask}, {res.config['variant']}, d_qk={d_qk}"), stage / "mu_loglog.png",
                        dpi=120)
    for note in report["notes"]:
        typer.echo(f"note: {note}", err=True)
    if print_result(fmt, doc, [{**row, "at_floor": ";".join(row["at_floor"])} for row in layers]):
        return
    deficit = ["row_mass_deficit_q50"] if any("row_mass_deficit_q50" in row for row in layers) else []
    typer.echo("layer\t" + "\t".join(names + deficit) + "\tepsilon_measured")
    measured = depth + 1 if res.stopped is None else res.stopped.after_layer
    for row in layers:
        if row["layer"] >= measured:
            typer.echo(f"{row['layer']}\t" + "\t".join("-" for _ in names + deficit) + "\t-")
            continue
        eps = "-" if row["epsilon_measured"] is None else f"{row['epsilon_measured']:.3e}"
        cells = ["undefined" if row[k] is None else f"{row[k]:.4e}" + (FLOOR_MARK if k in row["at_floor"] else "")
                 for k in names]
        cells += ["-" if row.get(k) is None else f"{row[k]:.3e}" for k in deficit]
        typer.echo(f"{row['layer']}\t" + "\t".join(cells) + f"\t{eps}")
    if any(set(row["at_floor"]) - set(UNDERFLOW_METRICS) for row in layers):
        typer.echo(f"{FLOOR_MARK} at or below the {dtype} round-off floor 2 (N + d) ε = {floor['floor']:.3g} "
                   f"(N = {floor['n_tokens']}, d = {floor['d_model']}, ε = {floor['epsilon']:.3g}): collapsed, "
                   "the digits are rounding", err=True)
    if any(set(row["at_floor"]) & set(UNDERFLOW_METRICS) for row in layers):
        typer.echo(f"{FLOOR_MARK} on {', '.join(floor['underflow_metrics'])}: below the smallest normal {dtype} "
                   f"number {floor['smallest_normal']:.3g} (underflow: the tokens decay towards 0 and lose digits)",
                   err=True)
    if out is not None:
        typer.echo(f"wrote {out / 'result.json'} and {out / 'mu_loglog.png'}", err=True)

