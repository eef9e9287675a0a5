"""`rankcollapse reproduce [NAME]`: run an experiment of the paper end to end."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import List, Optional

import typer

from .._io import check_writable, read_as, read_regular
from .._outdir import OUTPUT_NAMES, check_out
from .._validate import check_int
from ..errors import ConfigError
from ._boundary import given_flags
from ._output import ALLOW_NONEMPTY, check_format, dumps, make_table, print_json, print_table

#: The options each sub-command that runs no experiment takes; any other option given
#: to it would be ignored, so it is refused.
SUBCOMMAND_OPTIONS = {"summary": {"fmt"}, "audit": {"fmt"}, "schedules": {"out", "scale", "seed", "allow_nonempty"}}

HELP = """Run experiment NAME (main by default, fig2, fig3, fig4, theory, geometry, influence, laws, power, energy, all, or schedules:
collapse rate of mask schedules at equal attention budget) on real
Wikipedia windows and write the tidy table, plots, claims.json, config.json and a
self-contained report.html to --out (default runs/<UTC time>). Results are cached by
unit next to the output folder (or --cache-dir, which a cluster may share), so a rerun
only computes what changed and an interrupted run resumes. Units run in this process,
in worker processes (--executor processes --workers N) or on a Ray cluster
(--executor ray --address auto); the numbers are the same. --shard I/K computes only
shard I of K of the units into the cache, so a run can be spread over machines or
sessions; the run without --shard on that cache then writes the result (shards are
balanced by estimated cost). Before computing, a run prints the cost model's estimate of
its CPU-seconds; --dry-run prints it and computes nothing. One run at a time owns --out:
a second exits 2 naming the first (or waits, --wait).

`rankcollapse reproduce summary DIR [--format markdown|json]` prints the results table
of a finished run (its claims.json) without running anything; `rankcollapse reproduce
audit DIR [--format markdown|json]` prints what each of its verdicts rests on (factor
contrast, threshold bands and flip points, bounds and sides near their floors)."""


def reproduce_command(
    ctx: typer.Context,
    name: Optional[str] = typer.Argument(None, help="main (default), fig2, fig3, fig4, theory, geometry, influence, laws, power, energy, all, a comma-separated list (fig3,fig4), summary or audit."),
    target: Optional[Path] = typer.Argument(None, help="With `summary` or `audit`: the run folder."),
    fmt: Optional[str] = typer.Option(None, "--format", help="stdout: table (default) or json (the claims); "
                                      "with `summary`: markdown (default, the table of docs/results.md) or json."),
    scale: str = typer.Option("quick", "--scale", help="quick (minutes on 2 cores), large (256 windows x 4 seeds), paper (3000 windows) or smoke."),
    out: Optional[Path] = typer.Option(None, "--out", help="Output folder (default runs/<UTC time>)."),
    seed: int = typer.Option(0, "--seed", help="Seeds window order and weights (weight seed k = seed + k)."),
    text: Optional[Path] = typer.Option(None, "--text-file", help="UTF-8 text file (one document per line) or JSONL instead of Wikipedia."),
    n_tokens: Optional[int] = typer.Option(None, "--n-tokens", help="Tokens per window N (default 128); "
                                           "refused where no unit reads the run's windows at its N."),
    masks: Optional[List[str]] = typer.Option(None, "--mask", help="Replace the simulated masks (repeatable), e.g. sliding_window:w=5."),
    depth: Optional[int] = typer.Option(None, "--depth", help="Replace the simulated depth."),
    n_samples: Optional[int] = typer.Option(None, "--n-samples", help="Replace the number of windows."),
    models: Optional[List[str]] = typer.Option(None, "--model", help="Extra pretrained model to probe (hub id or local folder; repeatable)."),
    cache_dir: Optional[Path] = typer.Option(None, "--cache-dir", help="Cache folder (default <out>/../.rankcollapse-cache)."),
    device: str = typer.Option("cpu", "--device", help="torch device for simulations."),
    progress: bool = typer.Option(True, "--progress/--no-progress", help="Progress bar on stderr."),
    nearby: bool = typer.Option(True, "--nearby/--no-nearby", help="Run the nearby settings of claims not reproduced."),
    executor: str = typer.Option("serial", "--executor", help="Where units run: serial, processes (local worker processes) or ray (a Ray cluster). Numbers do not depend on it."),
    workers: Optional[int] = typer.Option(None, "--workers", help="Worker processes (processes; default every core) or CPUs of a private Ray instance (ray without --address)."),
    address: Optional[str] = typer.Option(None, "--address", help="Ray cluster address (host:port, or auto for the cluster started on this machine)."),
    shard: Optional[str] = typer.Option(None, "--shard", help="I/K: compute only shard I of K of the run's units into the "
                                        "cache (--cache-dir) and write no result; a run without --shard on the same "
                                        "cache then writes the result, computing nothing the shards computed."),
    recompute: bool = typer.Option(False, "--recompute", help="Recompute every unit and overwrite its cache entry."),
    dry_run: bool = typer.Option(False, "--dry-run", help="Print the planned units per experiment, how many are "
                                 "cached and the cost model's estimate of the CPU-seconds to compute the rest "
                                 "(and the wall time on the executor's cores); compute and write nothing."),
    wait: bool = typer.Option(False, "--wait", help="If another run holds --out, wait for it instead of failing."),
    allow_nonempty: bool = ALLOW_NONEMPTY,
) -> None:
    if name in SUBCOMMAND_OPTIONS:
        refuse_ignored(ctx, name)
    if name in ("summary", "audit") and target is None:
        raise ConfigError(f"reproduce {name} needs a run folder: rankcollapse reproduce {name} DIR")
    if name == "summary":
        print_results(target, fmt or "markdown")
        return
    if name == "audit":
        print_audit(target, fmt or "markdown")
        return
    as_json = check_format(fmt or "table", ("table", "json")) == "json"
    if target is not None:
        raise typer.BadParameter(f"unexpected argument {target}; only `summary` and `audit` take a folder")
    if name == "schedules":  # the schedule study has its own small runner (docs/schedules.md)
        from ..experiments.schedules import NAMES as SCHEDULE_NAMES, run_schedule_study

        dest = out or Path("runs") / "schedules"
        check_out(dest, SCHEDULE_NAMES, allow_nonempty=allow_nonempty, flags=True)  # named by its flags
        table = run_schedule_study(dest, scale, seed, allow_nonempty=allow_nonempty)
        typer.echo(table.to_string(index=False))
        typer.echo(f"wrote {dest}/schedules.csv, schedules.png, schedules.json", err=True)
        return
    from ..models.source import check_model_source

    for model in models or ():  # the run's refusal of a missing model folder, before the experiments load torch
        check_model_source(model)
    from ..experiments.runner import StorageConfig, estimate_run, run_experiment
    from ..sweep.executors import ExecutionConfig

    # the options by their flags (run_experiment's own messages name its arguments)
    for flag, value, low in (("--seed", seed, 0), ("--n-tokens", n_tokens, 2), ("--depth", depth, 1),
                             ("--n-samples", n_samples, 1)):
        if value is not None:
            check_int(value, flag, low=low)
    execution = ExecutionConfig(executor, workers=workers, address=address, device=device,
                                progress=progress and not as_json, shard=shard)
    storage = StorageConfig(cache_dir=cache_dir, recompute=recompute, wait=wait, allow_nonempty=allow_nonempty)
    if cache_dir is not None:  # named by its flag here; the API names its argument
        check_writable(cache_dir, folder=True, option="--cache-dir")
    overrides = {"masks": masks or None, "depth": depth, "n_samples": n_samples, "extra_models": models or None}
    overrides = {k: v for k, v in overrides.items() if v is not None}
    # named by its flags here, before the experiments load; a dry run refuses an --out no run could use
    # (a file, a link), and leaves a non-empty folder to the run (--allow-nonempty is not its option)
    if out is not None and shard is None:
        check_out(out, OUTPUT_NAMES, allow_nonempty=allow_nonempty or dry_run, flags=True)
    if dry_run:  # it runs nothing (the estimate refuses --wait and --allow-nonempty)
        if "--progress" in given_flags():
            raise ConfigError("--progress/--no-progress does not apply to --dry-run, which runs nothing")
        est = estimate_run(name, scale, out, seed, text=text, n_tokens=n_tokens, overrides=overrides,
                           nearby=nearby, execution=execution, storage=storage)
        print_estimate(est, as_json)
        return
    result = run_experiment(name, scale, out, seed, text=text, n_tokens=n_tokens, overrides=overrides,
                            nearby=nearby, execution=execution, storage=storage)
    if shard is not None:
        print_shard(result, as_json)
        return
    if as_json:
        print_json({"out": str(result.out), "config_hash": result.config["config_hash"], "claims": result.claims},
                   indent=2)
        return
    print_summary(result)


def print_shard(result, as_json: bool) -> None:
    """What a shard computed (units computed and cached) and where, with the run's config hash."""
    cost, config = result.config["cost"], result.config
    if as_json:
        print_json({"shard": config["shard"], "config_hash": config["config_hash"], "cache": config["execution"]["cache"],
                    **{k: cost[k] for k in ("units", "units_computed", "units_cached")}}, indent=2)
        return
    typer.echo(f"shard {config['shard']} of {', '.join(config['experiments'])} ({config['scale']}, hash "
               f"{config['config_hash']}): {cost['units']} units, {cost['units_computed']} computed, "
               f"{cost['units_cached']} from the cache, in {result.seconds:.0f} s")
    typer.echo(f"cache: {config['execution']['cache']}; once every shard is done, the same command without --shard "
               "on this cache writes the result")


def print_estimate(est: dict, as_json: bool) -> None:
    """The cost model's estimate of a run (stdout): one line per experiment and the total."""
    from ..experiments.cost import estimate_lines

    if as_json:
        print_json(est, indent=2)
        return
    shard = f" shard {est['shard']}" if "shard" in est else ""
    typer.echo(f"estimate ({est['scale']}{shard}, hash {est['config_hash']}; CPU-seconds of one torch thread per unit):")
    for line in estimate_lines(est, est["workers"]):
        typer.echo(f"  {line}")


def refuse_ignored(ctx: typer.Context, command: str) -> None:
    """Refuse the options given that ``reproduce COMMAND`` does not take (:data:`SUBCOMMAND_OPTIONS`)."""
    given = given_flags(SUBCOMMAND_OPTIONS[command] | {"name", "target"})
    if given:
        takes = ", ".join(sorted(o for p in ctx.command.params if p.name in SUBCOMMAND_OPTIONS[command]
                                 for o in p.opts[:1]))
        raise ConfigError(f"reproduce {command} does not take {', '.join(given)} (it takes {takes})")


def print_results(folder: Path, fmt: str) -> None:
    """The results table of the finished run in ``folder`` on stdout."""
    from ..experiments.report import results_json, results_markdown

    check_format(fmt, ("markdown", "table", "json"))  # table: an alias of markdown
    claims = finished_claims(folder)
    with read_as(Path(folder) / "claims.json", "claims file"):  # rendered whole before anything is printed
        text = dumps(results_json(claims), indent=2) + "\n" if fmt == "json" else results_markdown(claims)
    sys.stdout.write(text)


def finished_claims(folder: Path) -> list[dict]:
    """The claims of the finished run in ``folder``, read as untrusted input (a link, FIFO, an
    unfinished run or not a claims list is refused)."""
    path = Path(folder) / "claims.json"
    if not path.exists() and not path.is_symlink():
        raise ConfigError(f"{folder}: no claims.json (not a finished run folder)")
    raw = read_regular(path, "claims file")  # a planted link or FIFO is refused before anything else
    if not (Path(folder) / "COMPLETE").is_file():
        raise ConfigError(f"{folder}: the run did not finish (no COMPLETE marker); its claims are not a result")
    try:
        claims = json.loads(raw.decode("utf-8"))
    except RecursionError:
        raise ConfigError(f"{path} is nested too deeply to be a claims file") from None
    except ValueError as exc:  # not UTF-8, not JSON
        raise ConfigError(f"{path} is not a claims file ({str(exc).splitlines()[0][:120]})") from None
    ok = isinstance(claims, list) and claims and all(
        isinstance(c, dict) and all(isinstance(c.get(k), str) for k in ("id", "effect", "verdict")) for c in claims)
    if not ok:
        raise ConfigError(f"{path} is not a claims file: expected a non-empty list of claims with id, effect and verdict")
    return claims


def print_audit(folder: Path, fmt: str) -> None:
    """The robustness audit of the finished run in ``folder`` on stdout."""
    from ..experiments.audit import audit_markdown, audit_run

    check_format(fmt, ("markdown", "json"))
    finished_claims(folder)  # the checks `summary` makes on an untrusted folder
    entries = audit_run(folder)
    if not any((folder / n).is_file() for n in ("table.parquet", "table.csv")):
        typer.echo(f"note: {folder} keeps no table: the audit reads the checks stored in its claims.json "
                   "(no quantity is read again from rows)", err=True)
    sys.stdout.write(dumps(entries, indent=2) + "\n" if fmt == "json" else audit_markdown(entries))


def print_summary(result) -> None:
    """The short claims table and where the outputs are."""
    from rich.text import Text

    from ..experiments.report import controls_text, cost_text, number

    colours = {"reproduced": "green", "not reproduced": "red", "not reproduced where decidable": "red", "mixed": "yellow",
               "mixed (depth-sensitive)": "yellow", "threshold-sensitive": "yellow"}
    rows = []
    for c in result.claims:
        scored = [k for k in c.get("checks", []) if not k.get("informational")]
        held = f"{sum(k['outcome'] == 'holds' for k in scored)}/{len(scored)} hold"
        near = "; ".join(f"{n['setting']}: {n['verdict']}" for n in c.get("nearby", [])) or "-"
        rows.append((c["id"], c["effect"], c.get("paper_effect", ""),
                     Text(c["verdict"], style=colours.get(c["verdict"], "white")), number(c), held, controls_text(c),
                     near))
    print_table(make_table(f"rankcollapse {', '.join(result.config['experiments'])} "
                           f"({result.config['scale']}, hash {result.config['config_hash']}, {result.seconds:.0f} s)",
                           ("id", "effect", "paper", "verdict", "decisive [95% interval]", "checks", "controls (+/−)",
                            "nearby settings"), rows, overflow="fold"))
    typer.echo(f"report: {result.out / 'report.html'}   table: {result.out / 'table.parquet'}   claims: {result.out / 'claims.json'}")
    typer.echo(f"cost: {cost_text(result.config.get('cost'), result.seconds)}")
