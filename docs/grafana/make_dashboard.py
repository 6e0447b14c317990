"""Writes docs/grafana/dsdprof.json, the Grafana dashboard of dsdprof's metrics (docs/observability.md).

``PANELS`` (title, unit, [(PromQL, legend)]) is also what docs/grafana/render_png.py draws from
scraped ``/metrics``, so the PNG and the dashboard show the same queries."""

from __future__ import annotations

import json
from pathlib import Path

SEL = 'model_name=~"$model"'
R = "[$__rate_interval]"
PANELS = [
    ("K served per batch-size bucket (dashed: table)", "none", [
        (f"max by (batch_size_bucket) (dsdprof:num_speculative_tokens{{{SEL}}})", "K {{batch_size_bucket}}"),
        (f"max by (batch_size_bucket) (dsdprof:table_num_speculative_tokens{{{SEL}}})", "table {{batch_size_bucket}}")]),
    ("Steps per second by K (K=0: no drafts)", "ops", [
        (f"sum by (num_speculative_tokens) (rate(dsdprof:steps_total{{{SEL}}}{R}))", "K={{num_speculative_tokens}}")]),
    ("Acceptance rate per draft position", "percentunit", [
        (f"sum by (position) (rate(dsdprof:spec_decode_num_accepted_tokens_per_pos_total{{{SEL}}}{R}))"
         f" / sum by (position) (rate(dsdprof:spec_decode_num_draft_tokens_per_pos_total{{{SEL}}}{R}))",
         "position {{position}}")]),
    ("Acceptance length: dsdprof's counters and vLLM's", "none", [
        (f"1 + sum(rate(dsdprof:spec_decode_num_accepted_tokens_total{{{SEL}}}{R}))"
         f" / sum(rate(dsdprof:spec_decode_num_drafts_total{{{SEL}}}{R}))", "dsdprof"),
        (f"1 + sum(rate(vllm:spec_decode_num_accepted_tokens_total{{{SEL}}}{R}))"
         f" / sum(rate(vllm:spec_decode_num_drafts_total{{{SEL}}}{R}))", "vLLM")]),
    ("Live / table acceptance length at the K served (95 %)", "none", [
        (f'max by (batch_size, bound) (dsdprof:acceptance_length_ratio{{{SEL}}})', "BS {{batch_size}} {{bound}}")]),
    ("Live / table step time at the K served (95 %)", "none", [
        (f'max by (batch_size, bound) (dsdprof:step_time_ratio{{{SEL}}})', "BS {{batch_size}} {{bound}}")]),
    ("Switches, shift alarms, silent no-op steps, ignored requests (per minute)", "none", [
        (f"sum(increase(dsdprof:k_switches_total{{{SEL}}}[1m]))", "K switches"),
        (f"sum(increase(dsdprof:shift_alarms_total{{{SEL}}}[1m]))", "shift alarms"),
        (f"sum(increase(dsdprof:silent_noop_steps_total{{{SEL}}}[1m]))", "silent no-op steps"),
        (f"sum(increase(dsdprof:ignored_requests_total{{{SEL}}}[1m]))", "ignored requests")]),
    ("Share of steps at K=0", "percentunit", [
        (f'sum(rate(dsdprof:steps_total{{{SEL},num_speculative_tokens="0"}}{R}))'
         f" / sum(rate(dsdprof:steps_total{{{SEL}}}{R}))", "K=0")]),
]


def panel(i: int, title: str, unit: str, targets: list[tuple[str, str]]) -> dict:
    return {"id": i + 1, "type": "timeseries", "title": title,
            "datasource": {"type": "prometheus", "uid": "${datasource}"},
            "gridPos": {"h": 8, "w": 12, "x": 12 * (i % 2), "y": 8 * (i // 2)},
            "fieldConfig": {"defaults": {"unit": unit, "custom": {"lineWidth": 1, "fillOpacity": 0}},
                            "overrides": [{"matcher": {"id": "byRegexp", "options": "table.*|.*(lower|upper)"},
                                           "properties": [{"id": "custom.lineStyle",
                                                           "value": {"fill": "dash", "dash": [6, 4]}}]}]},
            "targets": [{"refId": chr(65 + j), "expr": e, "legendFormat": leg} for j, (e, leg) in enumerate(targets)]}


def dashboard() -> dict:
    alarm = {"id": len(PANELS) + 1, "type": "stat", "title": "Silent no-op steps (must stay 0)",
             "datasource": {"type": "prometheus", "uid": "${datasource}"},
             "gridPos": {"h": 4, "w": 12, "x": 0, "y": 8 * ((len(PANELS) + 1) // 2)},
             "fieldConfig": {"defaults": {"thresholds": {"mode": "absolute", "steps": [
                 {"color": "green", "value": None}, {"color": "red", "value": 1}]}}},
             "targets": [{"refId": "A", "expr": f"sum(dsdprof:silent_noop_steps_total{{{SEL}}})"}]}
    info = {"id": len(PANELS) + 2, "type": "table", "title": "Schedule in force",
            "datasource": {"type": "prometheus", "uid": "${datasource}"},
            "gridPos": {"h": 4, "w": 12, "x": 12, "y": 8 * ((len(PANELS) + 1) // 2)},
            "targets": [{"refId": "A", "expr": f"dsdprof:info{{{SEL}}}", "format": "table", "instant": True}]}
    return {
        "title": "dsdprof: speculative decoding schedule", "uid": "dsdprof-schedule", "schemaVersion": 39,
        "tags": ["vllm", "dsdprof", "speculative-decoding"], "time": {"from": "now-30m", "to": "now"},
        "refresh": "10s",
        "templating": {"list": [
            {"name": "datasource", "type": "datasource", "query": "prometheus", "label": "Prometheus"},
            {"name": "model", "type": "query", "label": "model_name", "includeAll": True, "multi": True,
             "datasource": {"type": "prometheus", "uid": "${datasource}"},
             "query": "label_values(dsdprof:info, model_name)", "refresh": 2}]},
        "panels": [panel(i, *p) for i, p in enumerate(PANELS)] + [alarm, info],
    }


if __name__ == "__main__":
    out = Path(__file__).with_name("dsdprof.json")
    out.write_text(json.dumps(dashboard(), indent=1) + "\n")
    print(out)
