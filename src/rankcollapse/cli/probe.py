"""`rankcollapse probe MODEL`: per-layer rank-collapse metrics of a pretrained model on
real text, optionally under interventions (mask, temperature, dropped components)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, List, Optional

import typer

from .. import models  # lazy package; `data` (torch) is imported by the command
from .._io import atomic_path, write_json_atomic, write_text_atomic
from .._memory import human, parse_size
from .._outdir import check_out, writing
from .._validate import check_device
from ..errors import ConfigError
from ..models.plot import PLOT_METRICS, drawn_metrics, plot_layers
from ._boundary import given_flags
from ._output import ALLOW_NONEMPTY, check_format, make_table, print_result, print_table, records_table


def probe_command(
    model: Optional[List[str]] = typer.Option(None, "--model", help="minilm, smollm2, a hub name (offline cache) "
                                              "or a local folder (required; repeat to compare models in one "
                                              "table and one figure)"),
    metrics: Optional[str] = typer.Option(None, "--metrics", help="comma-separated metrics: those of "
                                          "rankcollapse metrics, attention_entropy or participation_ratio (of each block's attention), "
                                          "sink_mass, sink_head_fraction, sink_value_ratio, sink_contribution (attention sinks, per block "
                                          "and head), or all (the token metrics); default mu,mu_relative,rank_fraction,"
                                          "sigma_min,avg_abs_cos"),
    corpus: str = typer.Option("wiki", "--corpus", help="wiki: the shipped Wikipedia extracts"),
    text_file: Optional[Path] = typer.Option(None, "--text-file", help="UTF-8 file, one document per line (or .jsonl)"),
    prompts: Optional[Path] = typer.Option(None, "--prompts", help="UTF-8 file, one prompt per line (or .jsonl): "
                                           "one window each, of its own length, right-padded to the longest "
                                           "(padding is left out of every metric)"),
    windows: int = typer.Option(16, "--n-samples", help="number of token windows B"),
    length: int = typer.Option(128, "--n-tokens", help="tokens per window N"),
    mask: Optional[str] = typer.Option(None, "--mask", help="replacement self-attention mask spec"),
    d_qk: Optional[float] = typer.Option(None, "--d-qk", help="attention temperature d_QK > 0: scores "
                                         "q·k / sqrt(d_qk) as in simulate (default: the model's own, 1/scaling²)"),
    drop: str = typer.Option("", "--drop", help="components to remove: skip,mlp,norm[,final_norm]; 'mlp:0-3' for blocks"),
    clip_massive: bool = typer.Option(False, "--clip-massive", help="scale each window's massive token (max/median "
                                      "token norm >= 10) to the median norm at the block where it appears; "
                                      "composes with --mask and --drop; stderr says where it clipped and whether "
                                      "a later block's token is massive again (JSON: massive_clips)"),
    ablate_heads: Optional[str] = typer.Option(None, "--ablate-heads", help="heads removed from their block's "
                                               "attention output, LAYER.HEAD items (0-based), e.g. 3.1,3.5 (T5: its encoder's; "
                                               "decoder:1.2 for its decoder, cross:1.2 for its cross-attention)"),
    ablation: Optional[str] = typer.Option(None, "--ablation", help="with --ablate-heads: zero (default; the heads "
                                           "output 0) or mean (their mean output over the windows, per position)"),
    patch_from: Optional[Path] = typer.Option(None, "--patch-from", help="activation patching: clean text (one "
                                              "document per line) or a windows.npz, cut like the probed windows; "
                                              "its --patch-point replaces theirs, and the table is the change "
                                              "patched - unpatched per window"),
    patch_point: Optional[str] = typer.Option(None, "--patch-point", help="with --patch-from: the point patched, "
                                              "e.g. layer.3.output, layer.3.heads or module:PATH"),
    patch_head: Optional[int] = typer.Option(None, "--patch-head", help="with --patch-point layer.k.heads: "
                                             "patch this head only (0-based)"),
    points: str = typer.Option("hidden_states", "--points", help="hidden_states or all, plus any "
                                "module:PATH items (the output of a named_modules() path, e.g. "
                                "hidden_states,module:model.layers.3.self_attn)"),
    gguf_file: Optional[str] = typer.Option(None, "--gguf-file", help="GGUF weights file inside the --model folder"),
    tokenizer: Optional[str] = typer.Option(None, "--tokenizer", help="tokenizer folder or hub name (or minilm, "
                                            "smollm2) when the --model folder has none"),
    windows_file: Optional[Path] = typer.Option(None, "--windows-file", help="token ids instead of text: a windows.npz "
                                                "as --out writes (input_ids, attention_mask, special_tokens_mask)"),
    batch_size: int = typer.Option(8, "--batch-size"),
    max_memory: Optional[str] = typer.Option(None, "--max-memory", help="memory the probe may use, weights included, "
                                             "e.g. 8GiB: windows run in the largest batches (up to --batch-size) "
                                             "that its predicted peak fits"),
    seed: int = typer.Option(0, "--seed", help="seeds the document order (and the --control weights)"),
    control: Optional[str] = typer.Option(None, "--control", help="random-init: also run each model's architecture "
                                          "freshly initialised (seeded with --seed) on the same windows, side by "
                                          "side (rows tagged model)"),
    device: str = typer.Option("cpu", "--device", help="torch device for the model and metrics, e.g. cpu or cuda:0"),
    attentions: bool = typer.Option(False, "--attentions", help="also write attention probabilities to "
                                    "OUT/attentions.npz, and with --save-states into the states"),
    fmt: str = typer.Option("table", "--format", help="stdout: table, json (one object), csv or markdown"),
    out: Optional[Path] = typer.Option(None, "--out", help="folder: probe.csv, probe.json, probe.png, windows.npz "
                                       "(windows_K.npz per model with several --model)"),
    influence: bool = typer.Option(False, "--influence", help="instead of the metrics: per layer, Spearman's rho "
                                   "between the mask-only influence prediction and each input's measured influence "
                                   "on the last token (gradient norms, attention rollout); --out writes "
                                   "influence.csv and influence.json"),
    save_states: Optional[Path] = typer.Option(None, "--save-states", help="folder: also write the recorded hidden "
                                               "states, states.safetensors ([window, point, token, d]) and states.json "
                                               "(points, window ids, model, dtype)"),
    hidden_states: Optional[Path] = typer.Option(None, "--hidden-states", help="instead of a model: the table of the "
                                                 "hidden states in this folder (probe --save-states, or a transformers "
                                                 "output_hidden_states dump; see docs/models.md)"),
    parity: bool = typer.Option(False, "--parity", help="instead of the metrics: per hidden_states entry, the "
                                "largest |Δ| between the recorded point and transformers' output_hidden_states, "
                                "against 8·eps(dtype)·max|x|; exit 2 above it"),
    allow_nonempty: bool = ALLOW_NONEMPTY,
) -> None:
    """Per-layer μ, rank fraction, σ_min, avg |cos| (or --metrics) of models' hidden states on real text."""
    check_format(fmt)
    if hidden_states is not None:
        probe_recorded(hidden_states, metrics, fmt, out, allow_nonempty, batch_size)
        return
    if parity:
        refuse_options(_PARITY_OPTIONS, "--parity compares the model's own forward pass with transformers', "
                       "without interventions or outputs")
    for flag, path in (("--text-file", text_file), ("--windows-file", windows_file), ("--patch-from", patch_from),
                       ("--prompts", prompts)):  # before anything heavy is imported: a FIFO would block the read
        if path is not None and path.exists() and not path.is_file():
            raise ConfigError(f"{flag} {str(path)!r} is not a regular file (a FIFO, device or folder); refused")
    if influence:
        _check_influence_options(metrics=metrics, d_qk=d_qk, drop=drop, points=points, attentions=attentions,
                                 clip_massive=clip_massive, control=control, ablate_heads=ablate_heads,
                                 patch_from=patch_from)
    if max_memory is not None:
        parse_size(max_memory)
        for flag, given in (("--influence", influence), ("--patch-from", patch_from)):
            if given:
                raise ConfigError(f"--max-memory plans the batches of the metrics run; {flag} does not apply it")
    names = _model_names(model)
    metric_names = _metric_names(metrics)
    # Before transformers is imported: a hub name must fail at once, not wait on the network.
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    if corpus != "wiki" and text_file is None:
        raise ConfigError(f"unknown corpus {corpus!r}; use --corpus wiki or --text-file FILE")
    if windows < 1 or length < 2 or batch_size < 1:
        raise ConfigError(f"--n-samples and --batch-size must be >= 1 and --n-tokens >= 2 "
                          f"(got {windows}, {batch_size}, {length})")
    if prompts is not None:
        _check_prompts(corpus)
    heads = _check_edits(ablate_heads, ablation, patch_from, patch_point, patch_head, n_models=len(names),
                         attentions=attentions, save_states=save_states, control=control, out=out,
                         others={"--mask": mask, "--d-qk": d_qk, "--drop": drop or None,
                                 "--clip-massive": clip_massive or None})
    dev = check_device(device, "--device")
    if control is not None:
        from ..models.controls import CONTROLS

        if control not in CONTROLS:
            raise ConfigError(f"unknown --control {control!r}; choose from {', '.join(CONTROLS)}")
    if control is not None and attentions:
        raise ConfigError("--attentions writes one model's maps: give it without --control")
    if attentions and out is None and save_states is None:
        raise ConfigError("--attentions writes OUT/attentions.npz (or, with --save-states, into the states): "
                          "give --out or --save-states too")
    if len(names) > 1 and (attentions or gguf_file is not None):
        raise ConfigError(f"{'--attentions' if attentions else '--gguf-file'} applies to one model: give one --model")
    if save_states is not None:
        _check_save_states(save_states, out, influence=influence, control=control, n_models=len(names),
                           points=points, allow_nonempty=allow_nonempty)
    if out is not None:
        check_out(out, _out_names(influence=influence, n_runs=len(names) * (1 if control is None else 2),
                                  attentions=attentions), allow_nonempty=allow_nonempty, flags=True)
    from .. import data
    from ..models.positions import check_positions, check_source_positions
    from ..models.probe import Intervention, as_intervention, check_points  # imports torch

    intervention = as_intervention(Intervention(mask=mask, d_qk=d_qk, drop=drop, clip_massive=clip_massive,
                                                ablate_heads=heads), None if prompts is not None else length)

    check_points(points)
    # every input is cut into windows before the first (slow) model load: refusals come first
    if windows_file is not None:
        given = _given_windows(windows_file, windows, length, corpus)
        for model in names:
            check_source_positions(model, given.n_tokens, gguf_file=gguf_file)
        prepared = [(model, None, given) for model in names]
    else:
        texts = data.read_text_file(text_file) if text_file is not None else [] if prompts is not None else \
            data.wikipedia_texts()
        prepared = []
        for model in names:
            tok = models.loading.load_tokenizer(model, gguf_file=gguf_file, tokenizer=tokenizer)
            if prompts is not None:  # one window per line, padded to the longest
                wins = data.prompt_windows(data.read_text_file(prompts), tok)
                as_intervention(intervention, wins.n_tokens)
                check_source_positions(model, wins.n_tokens, gguf_file=gguf_file)
            else:
                check_source_positions(model, length, gguf_file=gguf_file)  # before the windows are cut
                wins = data.make_windows(texts, tok, n_tokens=length, n_samples=windows, seed=seed,
                                         allow_fewer=text_file is not None)
            prepared.append((model, tok, wins))
    clean = None if patch_from is None else _patch_windows(patch_from, prepared[0], names[0], gguf_file, tokenizer,
                                                           seed, prompts=prompts is not None)
    runs = []  # (loaded, windows, table) per model; nothing is written until every model ran
    notes: list[str] = []  # printed once the command succeeded: a failure is one line
    for model, tok, wins in prepared:
        loaded = models.load_model(model, gguf_file=gguf_file, device=dev, tokenizer=tok)
        check_positions(loaded, wins.n_tokens)  # before anything is written
        notes += [f"note: {note}" for note in loaded.notes if f"note: {note}" not in notes]
        if parity:
            table = models.parity(loaded, wins, batch_size=batch_size)
        elif influence:
            from ..models.influence import measure_influence

            table = measure_influence(loaded, wins, mask=mask, batch_size=batch_size, seed=seed)
        elif clean is not None:
            table = models.patch(loaded, clean, wins, point=patch_point, head=patch_head, metrics=metric_names,
                                 points=points, batch_size=batch_size).drop(columns="values")
        else:
            table = models.probe(loaded, wins, intervention, metrics=metric_names, points=points, batch_size=batch_size,
                                 max_memory=max_memory)
        runs.append((loaded, wins, table))
        # --max-memory, --control and --clip-massive were refused above unless this is a metrics run
        if max_memory is not None:
            notes.append(f"{loaded.name}: --max-memory {max_memory}: batches of {table.attrs['batch_size']} windows, "
                         f"predicted peak {human(table.attrs['predicted_peak_bytes'])}")
        if control is not None:  # same windows, same options, fresh weights
            from ..models.controls import random_init

            fresh = random_init(loaded, seed=seed)
            runs.append((fresh, wins, models.probe(fresh, wins, intervention, metrics=metric_names, points=points,
                                                   batch_size=batch_size, max_memory=max_memory)))
        if clip_massive:  # where each run clipped, and whether the token came back
            from ..models.massive import clip_report

            many = len(names) > 1 or control is not None
            for run_loaded, _, run_table in runs[-(1 if control is None else 2):]:
                line = clip_report(run_table.attrs["massive_clips"], wins.n_samples)
                notes.append(f"{run_loaded.name}: {line}" if many else line)
    if parity:
        _report_parity([table for _, _, table in runs], fmt)
    elif influence:
        _report_influence([table for _, _, table in runs], out, fmt, allow_nonempty=allow_nonempty)
    elif len(runs) > 1:
        _several_models(runs, out, fmt, allow_nonempty)
    else:
        loaded, wins, table = runs[0]
        doc = to_json(table)
        # everything is computed before the first file is written: a failure leaves no partial folder
        maps = models.attention_maps(loaded, wins, intervention, batch_size=batch_size) if attentions else None
        if save_states is not None:
            states = models.capture_states(loaded, wins, intervention, batch_size=batch_size, points=points,
                                           attentions=attentions)
        if out is not None:
            write_outputs(out, _out_names(attentions=attentions), {doc["model"]: table}, [wins], doc,
                          allow_nonempty=allow_nonempty, maps=maps)
            typer.echo(f"wrote {out}/probe.csv, probe.png, windows.npz, probe.json", err=True)
        if maps is not None:
            typer.echo(f"wrote {out}/attentions.npz ({len(maps)} maps, (windows, heads, N, N))", err=True)
        if save_states is not None:
            models.save_states(save_states, states, allow_nonempty=allow_nonempty, flags="--save-states")
            typer.echo(f"wrote {save_states}/states.safetensors {tuple(states.hidden_states.shape)} "
                       "(window, point, token, d), states.json", err=True)
        if print_probe_table(table, fmt, doc):
            for note in (models.embedding_rank_note(loaded, wins, table), models.layernorm_rank_note(loaded, wins, table)):
                if note is not None:
                    typer.echo(note)
    for note in notes:
        typer.echo(note, err=True)


def print_probe_table(table: Any, fmt: str, doc: dict[str, Any] | None = None) -> bool:
    """Print one probe table in ``fmt`` (``doc``: its :func:`to_json`); True for the rich table."""
    doc = to_json(table) if doc is None else doc
    if print_result(fmt, doc, doc["layers"]):
        return False
    _print_summary(table)
    return True


#: The options ``--parity`` uses: which model, which windows, where it runs.
_PARITY_OPTIONS = ("model", "corpus", "text_file", "windows", "length", "gguf_file", "tokenizer",
                   "windows_file", "batch_size", "seed", "device", "fmt", "parity")


def _report_parity(tables: list[Any], fmt: str) -> None:
    """Print each model's parity table (:func:`rankcollapse.models.parity.parity`); fail above a bound."""
    rows = [{"model": t.attrs["model"], "dtype": t.attrs["dtype"], **r} for t in tables for r in t.to_dict("records")]
    doc = {"models": [{"model": t.attrs["model"], "family": t.attrs["family"], "dtype": t.attrs["dtype"],
                       "points": t.to_dict("records")} for t in tables]}
    if not print_result(fmt, doc, rows):
        print_table(records_table("parity with transformers' output_hidden_states (max over real tokens)", rows))
    for t in tables:
        models.check_parity(t)


def _check_influence_options(**given: Any) -> None:
    """Refuse the options ``--influence`` does not use (it measures the model as it is)."""
    defaults = {"points": "hidden_states", "drop": "", "attentions": False, "clip_massive": False}
    for name, value in given.items():
        if value is not None and value != defaults.get(name, None):
            flag = "--" + name.replace("_", "-")
            raise ConfigError(f"--influence measures the model as it is, on its own mask or --mask; {flag} does "
                              "not apply")


def _report_influence(tables: list, out: Optional[Path], fmt: str, *, allow_nonempty: bool = False) -> None:
    """Print the tables of ``measure_influence``; ``out`` gets ``influence.csv`` and ``influence.json``."""
    rows = [{"model": t.attrs["model"], **row} for t in tables for row in t.to_dict(orient="records")]
    doc = {"models": [{"model": t.attrs["model"], "family": t.attrs["family"], "mask": t.attrs["mask"],
                       "n_tokens": t.attrs["length"], "n_probes": t.attrs["n_probes"],
                       "layers": t.to_dict(orient="records"),
                       "profiles": {k: v.tolist() for k, v in t.attrs["profiles"].items()}} for t in tables]}
    if out is not None:
        import pandas as pd

        with writing(out, "probe --influence\n", _out_names(influence=True), allow_nonempty=allow_nonempty) as stage:
            with atomic_path(stage / "influence.csv") as tmp:
                pd.DataFrame(rows).to_csv(tmp, index=False)
            write_json_atomic(stage / "influence.json", doc)
    if not print_result(fmt, doc, rows):
        print_table(records_table("Spearman's rho between the mask-only influence prediction (uniform attention, "
                                  "fitted alpha) and the measured influence on the last token", rows))


#: The options ``--hidden-states`` uses; every other one needs a live model.
_RECORDED_OPTIONS = ("hidden_states", "metrics", "fmt", "out", "allow_nonempty", "batch_size")


def probe_recorded(folder: Path, metrics: Optional[str], fmt: str, out: Optional[Path] = None,
                   allow_nonempty: bool = False, batch_size: int = 8, *, allowed: tuple[str, ...] = _RECORDED_OPTIONS,
                   why: str = "--hidden-states measures recorded states, without a model") -> None:
    """``probe --hidden-states DIR`` (``metrics --states DIR``: other ``allowed`` options): the table of recorded
    states; ``--out`` gets probe.csv, .json, .png."""
    refuse_options(allowed, why)
    from ..models.states import read_states, state_metrics, states_table

    names = state_metrics(_metric_names(metrics))
    if batch_size < 1:
        raise ConfigError(f"--batch-size must be >= 1 (got {batch_size})")
    files = ("probe.csv", "probe.json", "probe.png")
    if out is not None:
        check_out(out, files, allow_nonempty=allow_nonempty, flags=True)
    table = states_table(read_states(folder), names, batch_size=batch_size)
    doc = to_json(table)
    if out is not None:
        write_outputs(out, files, {doc["model"]: table}, [], doc, allow_nonempty=allow_nonempty)
        typer.echo(f"wrote {out}/probe.csv, probe.png, probe.json", err=True)
    print_probe_table(table, fmt, doc)


def refuse_options(allowed: tuple[str, ...], why: str) -> None:
    """Refuse the first option given on the command line whose parameter is not in ``allowed``."""
    refused = given_flags(allowed)
    if refused:
        raise ConfigError(f"{refused[0]} cannot be applied: {why}")


def _check_save_states(folder: Path, out: Optional[Path], *, influence: bool, control: Optional[str], n_models: int,
                       points: str, allow_nonempty: bool) -> None:
    """``--save-states``: one model's metrics run, into a folder of its own."""
    if influence or control is not None or n_models > 1:
        what = "--influence" if influence else "--control" if control is not None else "several --model"
        raise ConfigError(f"--save-states writes one model's hidden states of a metrics run; drop {what}")
    module = next((p.strip() for p in points.split(",") if p.strip().startswith("module:")), None)
    if module is not None:
        raise ConfigError(f"--save-states holds the residual-stream points; {module} (a module's output) is not one "
                          "of them: drop it from --points")
    if out is not None and os.path.abspath(out) == os.path.abspath(folder):
        raise ConfigError("--save-states needs a folder of its own, not the --out folder")
    from ..models.states import STATE_NAMES

    check_out(folder, STATE_NAMES, allow_nonempty=allow_nonempty, flags="--save-states")


def _model_names(model: Optional[List[str]]) -> list[str]:
    """The ``--model`` values."""
    if not model:
        raise ConfigError("missing --model: minilm, smollm2, a hub name (offline cache) or a local folder")
    twice = sorted({m for m in model if model.count(m) > 1})
    if twice:
        raise ConfigError(f"--model {twice[0]} given twice")
    return list(model)


def _metric_names(text: Optional[str]) -> tuple[str, ...] | None:
    """``--metrics`` (comma-separated) as :func:`rankcollapse.models.probe.probe_metrics` reads them."""
    from ..models.probe import probe_metrics

    return None if text is None else probe_metrics([n.strip() for n in text.split(",") if n.strip()])


def _out_names(*, influence: bool = False, n_runs: int = 1, attentions: bool = False) -> tuple[str, ...]:
    """The files ``--out`` receives whatever the tables hold (not ``geometry.*``)."""
    if influence:
        return ("influence.csv", "influence.json")
    wins = [f"windows_{k}.npz" for k in range(n_runs)] if n_runs > 1 else ["windows.npz"]
    return ("probe.csv", "probe.json", "probe.png", *wins, *(["attentions.npz"] if attentions else []))


def _several_models(runs: list, out: Optional[Path], fmt: str, allow_nonempty: bool = False) -> None:
    """Outputs of several ``--model``: one table (rows tagged ``model``), one figure, ``windows_K.npz``."""
    from ..models.geometry_story import forced_control_notes

    tables = {t.attrs["model"]: t for _, _, t in runs}
    forced = forced_control_notes(tables)
    docs = [to_json(t) for t in tables.values()]
    for d in docs:
        if d["model"] in forced:
            d["notes"] = [*(d["notes"] or []), forced[d["model"]]]
    combined = {"models": docs}
    rows = [{"model": d["model"], **row} for d in docs for row in d["layers"]]
    if out is not None:
        write_outputs(out, _out_names(n_runs=len(runs)), tables, [wins for _, wins, _ in runs], combined,
                      allow_nonempty=allow_nonempty)
        typer.echo(f"wrote {out}/probe.csv, probe.png, probe.json, windows_0..{len(runs) - 1}.npz", err=True)
    if not print_result(fmt, combined, rows):
        _print_summary(*tables.values())
    for note in forced.values():
        typer.echo(f"note: {note}", err=True)


def _given_windows(path: Path, samples: int, length: int, corpus: str) -> Any:
    """``--windows-file``: the file's windows, whole; options that would make other windows are refused."""
    given = given_flags()
    for flag in ("--text-file", "--tokenizer", "--corpus"):
        if flag in given and (flag != "--corpus" or corpus != "wiki"):
            raise ConfigError(f"--windows-file gives the token ids; {flag} would cut other windows: give one of them")
    if "--seed" in given:
        raise ConfigError("--windows-file gives the token ids; --seed orders documents for other windows: give one of them")
    from .. import data

    wins = data.Windows.load(path)
    for flag, value, have in (("--n-samples", samples, wins.n_samples), ("--n-tokens", length, wins.n_tokens)):
        if flag in given and value != have:
            raise ConfigError(f"{flag} {value} but {path} holds {wins.n_samples} windows of {wins.n_tokens} tokens; "
                              f"drop {flag} (the file fixes it)")
    return wins


def _check_prompts(corpus: str) -> None:
    """``--prompts`` makes the windows: refuse the options that make or size other windows."""
    given = given_flags()
    for flag in ("--text-file", "--windows-file", "--corpus", "--n-samples", "--n-tokens", "--seed"):
        if flag in given and (flag != "--corpus" or corpus != "wiki"):
            raise ConfigError(f"--prompts makes one window per line, of its own length; {flag} does not apply")


def _check_edits(ablate_heads: Optional[str], ablation: Optional[str], patch_from: Optional[Path],
                 patch_point: Optional[str], patch_head: Optional[int], *, n_models: int, attentions: bool,
                 save_states: Optional[Path], control: Optional[str], out: Optional[Path],
                 others: dict[str, Any]) -> Any:
    """Check the head-ablation and patching options; the :class:`~rankcollapse.models.HeadAblation` or None."""
    edits = models.edits
    if ablation is not None and ablate_heads is None:
        raise ConfigError("--ablation says how --ablate-heads removes heads: give --ablate-heads too")
    if (patch_point is not None or patch_head is not None) and patch_from is None:
        raise ConfigError(f"{'--patch-point' if patch_point is not None else '--patch-head'} applies to "
                          "activation patching: give --patch-from too")
    if patch_from is not None and patch_point is None:
        raise ConfigError("--patch-from needs --patch-point, the point to patch (e.g. layer.3.output)")
    if patch_head is not None and patch_head < 0:
        raise ConfigError(f"--patch-head is 0-based, got {patch_head}")
    which = "--ablate-heads" if ablate_heads is not None else "--patch-from" if patch_from is not None else None
    if which is None:
        return None
    if patch_from is not None:
        shared = {"--attentions": attentions or None, "--save-states": save_states, "--ablate-heads": ablate_heads,
                  "--control": control, "--out": out, **others}
        given = next((flag for flag, value in shared.items() if value is not None), None)
        if given is not None:
            raise ConfigError(f"{given} cannot be applied with {which}: "
                              "patching compares the model with and without the patch alone")
    if n_models > 1:
        raise ConfigError(f"{which} applies to one model: give one --model")
    if ablate_heads is None:
        return None
    attention, _, items = ablate_heads.rpartition(":")  # "cross:1.2": T5's decoder cross-attention
    return edits.HeadAblation(edits.parse_heads(items), "zero" if ablation is None else ablation, attention or "self")


def _patch_windows(path: Path, prepared: tuple, model: str, gguf_file: Optional[str], tokenizer: Optional[str],
                   seed: int, prompts: bool = False) -> Any:
    """The clean windows of ``--patch-from``, refused unless their shape and padding match the probed ones."""
    from .. import data

    _, tok, wins = prepared
    if path.suffix == ".npz":
        clean = data.Windows.load(path)
    elif prompts:
        clean = data.prompt_windows(data.read_text_file(path), tok)
    else:
        tok = tok if tok is not None else models.loading.load_tokenizer(model, gguf_file=gguf_file, tokenizer=tokenizer)
        clean = data.make_windows(data.read_text_file(path), tok, n_tokens=wins.n_tokens, n_samples=wins.n_samples,
                                  seed=seed, allow_fewer=True)
    if tuple(clean.input_ids.shape) != tuple(wins.input_ids.shape) or \
            not bool((clean.attention_mask.bool() == wins.attention_mask.bool()).all()):
        raise ConfigError(f"--patch-from {path}: {clean.n_samples} windows of {clean.n_tokens} tokens with their "
                          f"padding, the probed ones {wins.n_samples} of {wins.n_tokens}; patching needs the same "
                          "windows and the same real tokens in both")
    return clean


def to_json(table: Any) -> dict[str, Any]:
    """The JSON document: settings and, per point, each metric's mean over windows."""
    wide = table.pivot_table(index=["layer", "point"], columns="metric", values="mean", sort=False)
    order = {p: i for i, p in enumerate(dict.fromkeys(table["point"]))}
    wide = wide.reset_index().sort_values(["layer", "point"], key=lambda s: s.map(order) if s.name == "point" else s)
    layers = [{"layer": int(r["layer"]), "point": r["point"],
               **{k: (None if v != v else float(v)) for k, v in r.items() if k not in ("layer", "point")}}
              for r in wide.to_dict("records")]
    attrs = table.attrs
    return {**{k: attrs.get(k) for k in ("model", "family", "n_samples", "n_tokens", "mask", "d_qk_scale", "d_qk", "drop")},
            **({"clip_massive": True, "massive_clips": attrs.get("massive_clips")} if attrs.get("clip_massive") else {}),
            **({"ablate_heads": attrs["ablate_heads"]} if attrs.get("ablate_heads") else {}),
            **({"batch_size": attrs["batch_size"], "predicted_peak_bytes": attrs["predicted_peak_bytes"]}
               if "predicted_peak_bytes" in attrs else {}),
            **({"patch": {"point": attrs["patch_point"], "head": attrs.get("patch_head"),
                          "layers": "change patched - unpatched per window, mean over windows"}}
               if attrs.get("patch_point") else {}),
            "notes": attrs.get("notes"), "layers": layers}


def write_outputs(out: Path, names: tuple[str, ...], tables: dict[str, Any], windows: list, doc: dict[str, Any], *,
                  allow_nonempty: bool = False, maps: dict[str, Any] | None = None) -> None:
    """Publish into ``out`` (files ``names``) the windows (``windows_K.npz`` for several), one CSV (rows tagged
    ``model``), ``doc``, probe.png, geometry.md and .png when the probe measured ``max_norm_ratio`` (massive
    tokens and sinks), and ``maps`` (attentions.npz: one float32 ``(B, H, N, N)`` per point)."""
    import numpy as np
    import pandas as pd

    from ..models.geometry_story import from_probe_tables, plot_geometry

    with writing(out, "probe\n", names, allow_nonempty=allow_nonempty) as stage:
        for k, wins in enumerate(windows):
            wins.save(stage / ("windows.npz" if len(windows) == 1 else f"windows_{k}.npz"))
        with atomic_path(stage / "probe.csv") as tmp:
            pd.concat([t.assign(model=name) for name, t in tables.items()], ignore_index=True).to_csv(tmp, index=False)
        write_json_atomic(stage / "probe.json", doc)
        held = drawn_metrics(tables)  # the default four panels, else the metrics with rows it can draw
        if held:
            plot_layers(tables, stage / "probe.png", metrics=None if {m for m, _ in PLOT_METRICS} <= set(held) else held)
        else:
            typer.echo("note: probe.png not drawn: no metric at the points it draws (embeddings, layer.k.output, "
                       "layer.k.attention, final_norm)", err=True)
        if any((t["metric"] == "max_norm_ratio").any() for t in tables.values()):
            lines, curves = from_probe_tables(tables)
            write_text_atomic(stage / "geometry.md", "# Massive tokens and attention sinks\n\n"
                              + "".join(f"- {line}\n" for line in lines))
            plot_geometry(curves, stage / "geometry.png")
        if maps is not None:
            with atomic_path(stage / "attentions.npz") as tmp, open(tmp, "wb") as fh:
                np.savez_compressed(fh, **{name: a.numpy() for name, a in maps.items()})


def _print_summary(*tables: Any) -> None:
    """One rich table of each metric's mean per layer and point (a ``model`` column for several)."""
    import pandas as pd

    wide = pd.concat([t.pivot_table(index=["layer", "point"], columns="metric", values="mean", sort=False)
                      .reset_index().assign(model=t.attrs.get("model")) for t in tables], ignore_index=True)
    wide = wide[["model", *[c for c in wide.columns if c != "model"]]] if len(tables) > 1 else wide.drop(columns="model")
    first = tables[0].attrs
    title = (", ".join(f"{t.attrs.get('model')} ({t.attrs.get('family')})" for t in tables)
             + f", {first.get('n_samples')} windows")
    if first.get("patch_point"):
        head = first.get("patch_head")
        title += (f": change when {first['patch_point']}{'' if head is None else f' head {head}'} is patched "
                  "from the clean windows (patched - unpatched)")
    t = make_table(title, [str(col) for col in wide.columns],
                   ([("" if v != v else f"{v:.4g}") if isinstance(v, float) else str(v) for v in row]
                    for row in wide.itertuples(index=False)))
    print_table(t)  # blank: a metric that does not apply at that point (attention_entropy at hidden states)
