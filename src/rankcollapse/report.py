"""Run report; the implementation lives in :mod:`rankcollapse.experiments.report`."""

from .experiments.report import (CREDITS, _rules_yaml, badge, header_fields, plot_link, render_html,  # noqa: F401
                                 render_markdown, results_json, results_markdown, summary_html)

_plot_link = plot_link
