"""`rankcollapse probe MODEL`: per-layer rank-collapse metrics of a pretrained model on
real text, optionally under interventions (mask, temperature, dropped components)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Optional

import typer

from .. import data, masks, models
from .._io import atomic_path, check_writable, write_json_atomic
from .._validate import check_device, check_float
from ..errors import ConfigError
from ..models.probe import check_positions
from ._output import check_format, print_json, print_records, print_table
from ._vocab import deprecated


PLOT_METRICS = (("mu", "μ(X)"), ("rank_fraction", "rank fraction"), ("sigma_min", "σ_min"), ("avg_abs_cos", "avg |cos|"))


def register(app: typer.Typer) -> None:
    """Attach ``probe`` to the main app."""
    app.command("probe")(probe_command)


def probe_command(
    model_arg: Optional[str] = typer.Argument(None, hidden=True, metavar="MODEL",
                                              help="deprecated: the model as a positional argument"),
    model: Optional[str] = typer.Option(None, "--model", help="minilm, smollm2, a hub name (offline cache) or a "
                                        "local folder (required)"),
    corpus: str = typer.Option("wiki", "--corpus", help="wiki: the shipped Wikipedia extracts"),
    text_file: Optional[Path] = typer.Option(None, "--text-file", help="UTF-8 file, one document per line (or .jsonl)"),
    windows: int = typer.Option(16, "--samples", help="number of token windows B"),
    length: int = typer.Option(128, "--n-tokens", help="tokens per window N"),
    mask: Optional[str] = typer.Option(None, "--mask", help="replacement self-attention mask spec"),
    d_qk: Optional[float] = typer.Option(None, "--d-qk", help="attention temperature d_QK > 0: scores "
                                         "q·k / sqrt(d_qk) as in simulate (default: the model's own, 1/scaling²)"),
    d_qk_scale: Optional[float] = typer.Option(None, "--d-qk-scale", hidden=True,
                                               help="deprecated: logits divided by sqrt(X); use --d-qk"),
    drop: str = typer.Option("", "--drop", help="components to remove: skip,mlp,norm[,final_norm]; 'mlp:0-3' for blocks"),
    points: str = typer.Option("hidden_states", "--points", help="hidden_states or all"),
    gguf_file: Optional[str] = typer.Option(None, "--gguf-file", help="GGUF weights file inside the --model folder"),
    tokenizer: Optional[str] = typer.Option(None, "--tokenizer", help="tokenizer folder or hub name (or minilm, "
                                            "smollm2) when the --model folder has none"),
    windows_file: Optional[Path] = typer.Option(None, "--windows-file", help="token ids instead of text: a windows.npz "
                                                "as --out writes (input_ids, attention_mask, special_tokens_mask)"),
    batch_size: int = typer.Option(8, "--batch-size"),
    seed: int = typer.Option(0, "--seed", help="seeds the document order"),
    device: str = typer.Option("cpu", "--device", help="torch device for the model and metrics, e.g. cpu or cuda:0"),
    attentions: bool = typer.Option(False, "--attentions", help="also write attention probabilities to OUT/attentions.npz"),
    fmt: str = typer.Option("table", "--format", help="stdout: table, json (one object), csv or markdown"),
    out: Optional[Path] = typer.Option(None, "--out", help="folder: probe.csv, probe.json, probe.png, windows.npz"),
) -> None:
    """Per-layer μ, rank fraction, σ_min, avg |cos| of a model's hidden states on real text."""
    check_format(fmt)
    model = _model_name(model, model_arg)
    d_qk_scale = _d_qk_scale(d_qk, d_qk_scale)
    # Before transformers is imported: a hub name must fail at once, not wait on the network.
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    if corpus != "wiki" and text_file is None:
        raise ConfigError(f"unknown corpus {corpus!r}; use --corpus wiki or --text-file FILE")
    if windows < 1 or length < 2 or batch_size < 1:
        raise ConfigError(f"--samples and --batch-size must be >= 1 and --n-tokens >= 2 "
                          f"(got {windows}, {batch_size}, {length})")
    _check_interventions(mask, *((d_qk_scale, "--d-qk-scale") if d_qk is None else (d_qk, "--d-qk")), drop, length)
    dev = check_device(device, "--device")
    if attentions and out is None:
        raise ConfigError("--attentions writes OUT/attentions.npz: give --out too")
    if out is not None:
        check_writable(out, folder=True)
    if windows_file is not None:  # before the (slow) model load
        wins, texts = _given_windows(windows_file, windows, length, tokenizer, text_file, corpus), None
    else:
        wins, texts = None, data.read_text_file(text_file) if text_file is not None else data.wikipedia_texts()
    loaded = models.load_model(model, gguf_file=gguf_file, device=dev, tokenizer=tokenizer)
    check_positions(loaded, length if wins is None else wins.length)  # before windows are built or anything is written
    if wins is None:
        wins = data.make_windows(texts, loaded.require_tokenizer(), length=length, n_windows=windows, seed=seed,
                                 allow_fewer=text_file is not None)
    for note in loaded.notes:
        typer.echo(f"note: {note}", err=True)
    table = models.probe(loaded, wins, mask=mask, d_qk_scale=d_qk_scale, d_qk=d_qk, drop=drop, batch_size=batch_size,
                         points=points)
    doc = to_json(table)
    if out is not None:
        write_outputs(out, table, wins, doc)
        typer.echo(f"wrote {out}/probe.csv, probe.png, windows.npz, probe.json", err=True)
    if attentions:
        maps = models.attention_maps(loaded, wins, mask=mask, d_qk_scale=d_qk_scale, d_qk=d_qk, drop=drop,
                                     batch_size=batch_size)
        write_attentions(out / "attentions.npz", maps)
        typer.echo(f"wrote {out}/attentions.npz ({len(maps)} maps, (windows, heads, N, N))", err=True)
    if fmt == "json":
        print_json(doc)
    elif fmt in ("csv", "markdown"):
        print_records(doc["layers"], fmt)
    else:
        _print_summary(table)
        note = models.embedding_rank_note(loaded, wins, table)
        if note is not None:
            typer.echo(note)


def _model_name(model: Optional[str], positional: Optional[str]) -> str:
    """``--model``, or the deprecated positional MODEL (with a note)."""
    if model is not None and positional is not None:
        raise ConfigError(f"give the model once: --model {model} (not also the positional {positional!r})")
    if positional is not None:
        deprecated("the positional MODEL", f"--model {positional}")
        return positional
    if model is None:
        raise ConfigError("missing --model: minilm, smollm2, a hub name (offline cache) or a local folder")
    return model


def _given_windows(path: Path, samples: int, length: int, tokenizer: Optional[str], text_file: Optional[Path],
                   corpus: str) -> Any:
    """``--windows-file``: the file's windows, whole. Options that would make other windows
    (text, tokenizer) are refused, and so are ``--samples``/``--n-tokens`` given with
    values the file does not have."""
    for flag, value in (("--text-file", text_file), ("--tokenizer", tokenizer), ("--corpus", None if corpus == "wiki" else corpus)):
        if value is not None:
            raise ConfigError(f"--windows-file gives the token ids; {flag} would cut other windows: give one of them")
    given = _explicit_options()
    if "seed" in given:
        raise ConfigError("--windows-file gives the token ids; --seed orders documents for other windows: give one of them")
    wins = data.Windows.load(path)
    for flag, name, value, have in (("--samples", "windows", samples, wins.n_windows), ("--n-tokens", "length", length, wins.length)):
        if name in given and value != have:
            raise ConfigError(f"{flag} {value} but {path} holds {wins.n_windows} windows of {wins.length} tokens; "
                              f"drop {flag} (the file fixes it)")
    return wins


def _explicit_options() -> set[str]:
    """Parameter names the user gave on the command line (empty outside a CLI call)."""
    from typer._click.core import ParameterSource  # typer vendors click
    from typer._click.globals import get_current_context

    ctx = get_current_context(silent=True)
    if ctx is None:
        return set()
    return {name for name in ctx.params if ctx.get_parameter_source(name) == ParameterSource.COMMANDLINE}


def _d_qk_scale(d_qk: Optional[float], d_qk_scale: Optional[float]) -> float:
    """The deprecated ``--d-qk-scale`` (with a note), or 1 when ``--d-qk`` is used."""
    if d_qk_scale is None:
        return 1.0
    if d_qk is not None:
        raise ConfigError("give --d-qk or the deprecated --d-qk-scale, not both")
    deprecated("--d-qk-scale S", "--d-qk D (D = S x the model's own d_qk, 1/scaling²)")
    return d_qk_scale


def _check_interventions(mask: Optional[str], temperature: float, flag: str, drop: str, length: int) -> None:
    """Fail on bad intervention options before the (slow) model load."""
    check_float(temperature, flag, low=0, strict_low=True)
    components = models.interventions.COMPONENTS
    for item in models.interventions.split_drop(drop):
        if item.partition(":")[0] not in components:
            raise ConfigError(f"unknown component to drop {item!r}; choose from {', '.join(components)}")
    if mask is not None:
        masks.parse_schedule(mask, length) if masks.is_schedule(mask) else masks.dense_mask(mask, length)


def to_json(table: Any) -> dict[str, Any]:
    """The ``--json`` document: settings plus one entry per recorded point with each
    metric's mean over windows."""
    wide = table.pivot_table(index=["layer", "point"], columns="metric", values="mean", sort=False)
    order = {p: i for i, p in enumerate(dict.fromkeys(table["point"]))}
    wide = wide.reset_index().sort_values(["layer", "point"], key=lambda s: s.map(order) if s.name == "point" else s)
    layers = []
    for row in wide.to_dict("records"):
        entry = {"layer": int(row.pop("layer")), "point": row.pop("point")}
        entry.update({k: (None if v != v else float(v)) for k, v in row.items()})
        layers.append(entry)
    attrs = table.attrs
    return {
        "model": attrs.get("model"), "family": attrs.get("family"), "n_windows": attrs.get("n_windows"),
        "length": attrs.get("length"), "mask": attrs.get("mask"), "d_qk_scale": attrs.get("d_qk_scale"),
        "d_qk": attrs.get("d_qk"),
        "drop": attrs.get("drop"), "notes": attrs.get("notes"), "layers": layers,
    }


def write_outputs(out: Path, table: Any, wins: Any, doc: dict[str, Any]) -> None:
    """Table (CSV), plot, exact inputs (``windows.npz``) and the JSON document."""
    out.mkdir(parents=True, exist_ok=True)
    wins.save(out / "windows.npz")
    with atomic_path(out / "probe.csv") as tmp:
        table.assign(model=doc["model"]).to_csv(tmp, index=False)
    write_json_atomic(out / "probe.json", doc)
    plot_layers({doc["model"]: table}, out / "probe.png")


def write_attentions(path: Path, maps: dict[str, Any]) -> None:
    """Attention probabilities, one float32 ``(B, H, N, N)`` array per
    ``layer.k.attention`` point, as a compressed ``.npz`` (written atomically)."""
    import numpy as np

    with atomic_path(path) as tmp, open(tmp, "wb") as fh:
        np.savez_compressed(fh, **{name: a.numpy() for name, a in maps.items()})


def plot_layers(tables: dict[str, Any], path: Path | None = None, *, ax: Any = None) -> Any:
    """Four panels (μ, rank fraction, σ_min, avg |cos|) against layer, one line per
    model through the embeddings and every block output (``layer.k.output``); where
    the model has a final norm, its output is a separate star marker at the last
    layer (it shares the ``hidden_states`` index with the raw last block output).
    The title gives the intervention settings (mask, d_qk_scale, drop). ``ax``: four
    axes to draw on (else a new pyplot-free figure); ``path``: also write a PNG there.
    Returns the figure; never changes matplotlib's backend."""
    from .._figure import new_figure, save_figure

    if ax is None:
        fig = new_figure((16, 3.9))
        axes = fig.subplots(1, 4)
    else:
        axes = list(ax)
        if len(axes) != 4:
            raise ConfigError(f"plot_layers draws four panels; ax= gave {len(axes)} axes")
        fig = axes[0].figure
    for name, table in tables.items():
        blocks, final = _layer_rows(table)
        for ax, (metric, label) in zip(axes, PLOT_METRICS):
            rows = blocks[blocks["metric"] == metric].sort_values("layer")
            if len(rows):
                line = ax.plot(rows["layer"], rows["mean"], marker="o", ms=3, label=f"{name} (block outputs)")[0]
                ax.fill_between(rows["layer"], rows["q05"], rows["q95"], alpha=0.15, color=line.get_color())
                fin = final[final["metric"] == metric]
                if len(fin):
                    ax.plot(fin["layer"], fin["mean"], linestyle="none", marker="*", ms=11, mfc="none",
                            color=line.get_color(), label=f"{name} final_norm")
            ax.set_xlabel("layer (hidden_states index)")
            ax.set_title(label)
    axes[0].set_yscale("log")
    axes[0].legend(fontsize=7)
    fig.suptitle(_settings_title(tables), fontsize=10)
    fig.tight_layout()
    if path is not None:
        save_figure(fig, path, dpi=110)
    return fig


def _settings_title(tables: dict[str, Any]) -> str:
    """``model: mask=..., d_qk_scale=..., drop=...`` per table, joined by ``; ``."""
    parts = []
    for name, table in tables.items():
        a = table.attrs
        drop = ",".join(a.get("drop") or []) or "none"
        parts.append(f"{name}: mask={a.get('mask') or 'model default'}, d_qk_scale={a.get('d_qk_scale', 1.0):g}, drop={drop}")
    return "; ".join(parts)


def _layer_rows(table: Any) -> tuple[Any, Any]:
    """``(blocks, final)``: rows of ``embeddings`` and ``layer.k.output`` (one per
    layer), and rows of ``final_norm`` (empty for families without one). T5: encoder."""
    pts = table["point"].str.replace(r"^(encoder|decoder)\.", "", regex=True)
    encoder_only = ~table["point"].str.startswith("decoder.")
    blocks = table[encoder_only & (pts.eq("embeddings") | pts.str.fullmatch(r"layer\.\d+\.output"))]
    return blocks, table[encoder_only & pts.eq("final_norm")]


def _print_summary(table: Any) -> None:
    from rich.table import Table

    wide = table.pivot_table(index=["layer", "point"], columns="metric", values="mean", sort=False).reset_index()
    t = Table(title=f"{table.attrs.get('model')} ({table.attrs.get('family')}), {table.attrs.get('n_windows')} windows")
    for col in wide.columns:
        t.add_column(str(col))
    for row in wide.itertuples(index=False):
        t.add_row(*[f"{v:.4g}" if isinstance(v, float) else str(v) for v in row])
    print_table(t)
