"""`specdash report TRACE`: one self-contained HTML file to share a recorded session.

Plots are matplotlib PNGs embedded as data URIs, so the file opens anywhere with no network
and no companion files: throughput over time, acceptance (histogram and by draft position),
DRAM bandwidth, the per-step time breakdown, then the divergences and the session settings;
with `--compare B`, how B (a quant, another engine) compares with this session (`compare`).
"""

from __future__ import annotations

import base64
import html
import io
import math
import re
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING

from specdash import metrics
from specdash.events import (
    Divergence,
    Event,
    SessionStart,
    Summary,
    TelemetrySample,
    VerifyStep,
)
from specdash.trace.compare import Agreement, Comparison, format_totals, totals
from specdash.trace.export import StepRow, step_row

if TYPE_CHECKING:
    from matplotlib.axes import Axes

WINDOW_S = 1.0
"""The throughput line averages over the last second, like the dashboard's "1 s" number."""
COLORS = {"spec": "tab:blue", "shadow": "tab:gray", "draft": "tab:orange",
          "verify": "tab:blue", "rollback": "tab:red"}  # fmt: skip


def windowed_tokens_per_s(rows: list[StepRow]) -> tuple[list[float], list[float]]:
    """Spec and shadow t/s over the steps that ended in the last `WINDOW_S` of each step."""
    spec, shadow = [], []
    start = 0
    for i, row in enumerate(rows):
        while rows[start].t_s <= row.t_s - WINDOW_S:
            start += 1
        window = rows[start : i + 1]
        tokens = sum(r.emitted for r in window)
        spec_s = sum(r.spec_s for r in window)
        shadow_s = sum(r.shadow_s for r in window)
        spec.append(metrics.tokens_per_s(tokens, spec_s) or 0.0)
        shadow.append(metrics.tokens_per_s(tokens, shadow_s) or 0.0)
    return spec, shadow


def broken_at_gaps(
    t: list[float], *series: list[float]
) -> tuple[list[float], list[list[float]], list[tuple[float, float]]]:
    """The series with a NaN (where matplotlib lifts the pen) in every stretch longer than
    `WINDOW_S` without a step, and those stretches: a root-cause replay, a long prefill or an
    idle wait ran no decode, so no rate is drawn across them."""
    xs: list[float] = []
    ys: list[list[float]] = [[] for _ in series]
    gaps = []
    for i, x in enumerate(t):
        if i and x - t[i - 1] > WINDOW_S:
            gaps.append((t[i - 1], x))
            xs.append((t[i - 1] + x) / 2)
            for y in ys:
                y.append(math.nan)
        xs.append(x)
        for y, values in zip(ys, series, strict=True):
            y.append(values[i])
    return xs, ys, gaps


def _no_data(ax: Axes, what: str) -> None:
    ax.text(0.5, 0.5, what, ha="center", va="center", transform=ax.transAxes, color="gray")
    ax.set_xticks([])
    ax.set_yticks([])


@dataclass(frozen=True, slots=True)
class ReportData:
    rows: list[StepRow]
    samples: list[TelemetrySample]
    t0_ns: int


def _plot_throughput(ax: Axes, data: ReportData) -> None:
    rows = data.rows
    if not rows:
        return _no_data(ax, "no verify steps recorded")
    spec, shadow = windowed_tokens_per_s(rows)
    t, (spec, shadow), gaps = broken_at_gaps([r.t_s for r in rows], spec, shadow)
    for i, (start, end) in enumerate(gaps):
        ax.axvspan(start, end, color="0.92", label=None if i else "no decode step (> 1 s)")
    ax.plot(t, spec, color=COLORS["spec"], label="speculative (1 s window)")
    if any(y > 0 for y in shadow):  # (NaN > 0 is False)
        ax.plot(t, shadow, color=COLORS["shadow"], label="shadow greedy (1 s window)")
    ax.set_xlabel("seconds since session start")
    ax.set_ylabel("tokens / s")
    ax.legend(loc="best")


def verify_rows(rows: list[StepRow]) -> list[StepRow]:
    """The verify steps: plain decode steps (speculation off) have no acceptance."""
    return [r for r in rows if not r.plain]


def _plot_histogram(ax: Axes, data: ReportData) -> None:
    rows = verify_rows(data.rows)
    if not rows:
        return _no_data(ax, "no verify steps recorded")
    counts = Counter(r.accepted for r in rows)
    xs = range(max(r.drafted for r in rows) + 1)
    ax.bar(xs, [counts[x] for x in xs], color=COLORS["spec"])
    ax.set_xticks(list(xs))
    ax.set_xlabel("drafts accepted in a verify step")
    ax.set_ylabel("verify steps")


def acceptance_by_position(rows: list[StepRow]) -> list[float]:
    """P(draft i accepted | the step proposed at least i+1 drafts), i = 0..most drafted - 1."""
    rows = verify_rows(rows)
    max_k = max((r.drafted for r in rows), default=0)
    tried = [sum(r.drafted > i for r in rows) for i in range(max_k)]
    kept = [sum(r.accepted > i for r in rows) for i in range(max_k)]
    return [a / n if n else 0.0 for a, n in zip(kept, tried, strict=True)]


def _plot_by_position(ax: Axes, data: ReportData) -> None:
    rates = acceptance_by_position(data.rows)
    if not rates:
        return _no_data(ax, "no verify steps recorded")
    xs = range(1, len(rates) + 1)
    ax.bar(xs, rates, color=COLORS["spec"])
    ax.set_xticks(list(xs))
    ax.set_ylim(0, 1)
    ax.set_xlabel("draft position")
    ax.set_ylabel("P(accepted)")


def _plot_bandwidth(ax: Axes, data: ReportData) -> None:
    """GB/s when GPM measured it; NVML's "memory busy" otherwise, labelled as not bandwidth."""
    gpm = [(s.t_ns, s.dram_gbps) for s in data.samples if s.dram_gbps is not None]
    busy = [(s.t_ns, s.mem_busy_pct) for s in data.samples if s.mem_busy_pct is not None]
    if gpm:
        points, label = gpm, "DRAM GB/s (derived from GPM DRAM BW %)"
    elif busy:
        points, label = busy, "mem busy % (NVML; not bandwidth)"
    elif data.samples and all(s.source == "none" for s in data.samples):
        return _no_data(ax, "not measured: this session ran without an NVIDIA GPU\n"
                        "(DRAM bandwidth comes from NVML on NVIDIA GPUs)")  # fmt: skip
    else:
        return _no_data(ax, "no GPU samples in this trace")
    seconds = [(t - data.t0_ns) / 1e9 for t, _ in points]
    ax.plot(seconds, [v for _, v in points], color=COLORS["spec"])
    ax.set_ylabel(label)
    ax.set_xlabel("seconds since session start")


def _plot_breakdown(ax: Axes, data: ReportData) -> None:
    rows = data.rows
    if not rows:
        return _no_data(ax, "no verify steps recorded")
    phases = ("draft", "verify", "rollback", "shadow")
    series = [[getattr(r, f"{p}_s") * 1e3 for r in rows] for p in phases]
    ax.stackplot(range(len(rows)), series, labels=phases, colors=[COLORS[p] for p in phases])
    ax.set_xlabel("verify step (session order)")
    ax.set_ylabel("ms per step")
    ax.legend(loc="upper right")


Plot = Callable[["Axes", ReportData], None]
PLOTS: dict[str, tuple[str, Plot]] = {
    "throughput": ("Tokens per second over time", _plot_throughput),
    "acceptance-histogram": ("Accepted drafts per verify step", _plot_histogram),
    "acceptance-by-position": ("Acceptance by draft position", _plot_by_position),
    "dram-bandwidth": ("DRAM bandwidth", _plot_bandwidth),
    "step-breakdown": ("Step time breakdown", _plot_breakdown),
}


def _png(plot: Plot, data: ReportData) -> str:
    from matplotlib.figure import Figure  # no pyplot: no global state, no GUI backend

    fig = Figure(figsize=(8, 3.2), dpi=100, layout="constrained")
    plot(fig.add_subplot(), data)
    buf = io.BytesIO()
    fig.savefig(buf, format="png")
    return base64.b64encode(buf.getvalue()).decode("ascii")


def _table(rows: list[tuple[str, object]]) -> str:
    body = "".join(
        f"<tr><th>{html.escape(str(k))}</th><td>{html.escape(str(v))}</td></tr>" for k, v in rows
    )
    return f"<table class='kv'>{body}</table>"


NUMBER = re.compile(r"(?<![\w.-])[-−]?\d+(?:[.,_]\d+)*(?:e[-+]?\d+)?(?!\w)")
"""A number in a table cell: ids, logprobs, 1e-07, 2,097,152, 1_000_000; not the 2 of top-2."""


def _cell(value: object) -> str:
    """A table cell's text, escaped, each number of more than one character in a span that
    never wraps: a narrow column (the context's breaks anywhere, so long identifiers fit)
    breaks between words or inside a word, never inside a number."""
    text, out, last = str(value), [], 0
    for m in NUMBER.finditer(text):
        if len(m[0]) > 1:
            out += [html.escape(text[last : m.start()]), f"<span class='n'>{m[0]}</span>"]
            last = m.end()
    out.append(html.escape(text[last:]))
    return "".join(out)


def _divergences(divs: list[Divergence]) -> str:
    if not divs:
        return "<p>None: every verified token matched the shadow decode bit for bit.</p>"
    head = ("prompt", "token", "step", "k", "mode", "backend", "what", "speculative",
            "shadow", "context", "shadow margin", "root cause")  # fmt: skip
    lines = []
    for d in divs:
        cause = d.root_cause
        cells = (
            d.prompt_index, d.position, d.step, d.k, d.verify_mode, d.gemm_backend, d.what,
            f"{d.spec_token} {d.spec_text!r} ({d.spec_logprob!r})",
            f"{d.shadow_token} {d.shadow_text!r} ({d.shadow_logprob!r})",
            d.context,
            "not reported" if d.shadow_margin is None
            else d.shadow_margin.text(flipped=d.what == "token"),
            "" if cause is None else
            f"layer {cause.layer} {cause.sub_op}: max |diff| {cause.max_abs_diff:g} {cause.detail}",
        )  # fmt: skip
        lines.append("<tr>" + "".join(f"<td>{_cell(c)}</td>" for c in cells) + "</tr>")
    header = "".join(f"<th>{h}</th>" for h in head)
    return f"<div class='wide'><table class='grid'><tr>{header}</tr>{''.join(lines)}</table></div>"


def _comparison(cmp: Comparison, label_a: str, label_b: str) -> str:
    """`compare`'s content: the determinism line first, a row per prompt, what is missing."""
    head = ("prompt", "tokens A / B", "agree", "flip", "A's margin at the flip", "mean |Δ logprob|",
            "max |Δ logprob|", "argmax = A", "mean KL", "max KL", "verdict")  # fmt: skip
    rows = []
    for c in cmp.prompts:
        g: Agreement | None = c.agreement
        scored = ("–",) * 5 if g is None else (
            f"{g.mean_abs_delta:.3g}", f"{g.max_abs_delta:.3g} (token {g.max_at[1]})",
            f"{g.argmax_agree}/{g.positions}", f"{g.mean_kl:.3g}", f"{g.max_kl:.3g}",
        )  # fmt: skip
        m = c.margin
        margin = "" if m is None else (
            f"{m.gap:.3g} nats ({m.ulps:,} fp32 ulps): {'near-tie' if m.near_tie else 'wide'}"
        )  # fmt: skip
        cells = (c.prompt_index, f"{c.tokens_a} / {c.tokens_b}", c.agree,
                 "–" if c.flip is None else c.flip, margin, *scored, c.verdict())  # fmt: skip
        rows.append("<tr>" + "".join(f"<td>{_cell(x)}</td>" for x in cells) + "</tr>")
    header = "".join(f"<th>{h}</th>" for h in head)
    det = cmp.determinism
    notes = [det.text(not cmp.teacher_forced.missing), *det.mismatches]
    notes += [f"missing: {m}" for m in cmp.missing]
    paragraphs = "".join(
        f"<p class='{'warning' if det.failed or not det.checked else 'note'}'>{html.escape(n)}</p>"
        for n in notes
    )
    who = _table([("A (reference)", label_a), ("B", label_b)])
    kl = "" if not cmp.teacher_forced.top_k else (
        f"<p>KL(A ‖ B) over A's top-{cmp.teacher_forced.top_k} tokens and one bucket for the "
        "rest: a lower bound of the full KL (the full KL where the top-k is the vocabulary).</p>"
    )  # fmt: skip
    return (
        f"{who}{paragraphs}{kl}<div class='wide'><table class='grid' id='compare-prompts'>"
        f"<tr>{header}</tr>{''.join(rows)}</table></div>"
        f"<p id='compare-totals'>{html.escape(format_totals(totals(cmp)))}</p>"
    )


def _summary(summary: Summary | None, rows: list[StepRow]) -> list[tuple[str, object]]:
    if summary is None:
        rows = verify_rows(rows)
        steps = len(rows)
        rate = metrics.acceptance_rate(sum(r.accepted for r in rows), sum(r.drafted for r in rows))
        length = metrics.mean_accepted_length(sum(r.emitted for r in rows), steps)
        return [
            ("status", "no summary: the session did not finish (or the trace was cut)"),
            ("verify steps", steps),
            ("acceptance rate", "-" if rate is None else f"{rate:.3f}"),
            ("mean accepted length", "-" if length is None else f"{length:.3f}"),
        ]
    s = summary
    timed = "requests, prefill included" if s.rate_includes_prefill else "decode steps"
    shadow = "– (no shadow ran)" if not s.checked else _fixed(s.shadow_tokens_per_s, ".2f")
    rows_out: list[tuple[str, object]] = [
        ("exact prompts", s.exact_text),
        ("new tokens", s.new_tokens),
        (f"speculative seconds ({timed})", f"{s.seconds:.3f}"),
        ("speculative tokens / s", f"{s.tokens_per_s:.2f}"),
        ("shadow (plain greedy) tokens / s", shadow),
        ("speedup (speculative / shadow)", _fixed(s.speedup, ".2f", "x")),
        ("session wall seconds (idle and paused excluded)", _fixed(s.wall_seconds, ".3f")),
    ]
    if s.verify_steps:  # nothing was speculated: no acceptance to speak of
        rows_out += [
            ("mean accepted length", f"{s.mean_accepted_length:.3f}"),
            ("acceptance rate", f"{s.acceptance_rate:.3f}"),
        ]
    return [*rows_out, ("verify steps", s.verify_steps), ("divergences", s.divergences)]


def _fixed(value: float | None, spec: str, unit: str = "") -> str:
    return "–" if value is None else f"{value:{spec}}{unit}"


def _settings(header: SessionStart) -> list[tuple[str, object]]:
    started = datetime.fromtimestamp(header.wall_time, tz=UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
    rows: list[tuple[str, object]] = [
        ("started", started),
        ("device", header.device),
        ("engine", header.engine),
        ("speculative algorithm", header.speculative_algorithm or "none"),
        ("quantization", header.quantization or "none"),
        ("GEMM backend", header.gemm_backend),
        ("GEMM backends", ", ".join(header.usable_gemm_backends)),
        ("shadow", "compared" if header.shadow else "none"),
        ("git revision", header.git_revision or "unknown"),
        ("trace schema", header.schema_version),
    ]
    rows += [(f"config.{k}", v) for k, v in sorted(header.config.items())]
    rows += [(f"version.{k}", v) for k, v in sorted(header.versions.items())]
    return rows


STYLE = """
body { font-family: system-ui, sans-serif; margin: 2em auto; max-width: 60em; color: #222; }
figure { margin: 1em 0; } figcaption { font-weight: bold; } img { max-width: 100%; }
table { border-collapse: collapse; font-size: 90%; margin: 0.5em 0 1.5em; }
th, td { border: 1px solid #ccc; padding: 0.2em 0.5em; text-align: left; vertical-align: top; }
td { overflow-wrap: anywhere; } .wide { overflow-x: auto; }
.grid td { overflow-wrap: break-word; } .grid td:nth-child(10) { overflow-wrap: anywhere; }
.grid td:nth-child(-n+7) { white-space: nowrap; } .n { white-space: nowrap; }
.kv th { background: #f4f4f4; } .grid th { background: #f4f4f4; }
.warning { color: #a60; }
"""


def render_report(
    header: SessionStart,
    events: Iterable[Event],
    warnings: list[str],
    title: str,
    comparison: tuple[Comparison, str, str] | None = None,
) -> str:
    """The page; `comparison`: `compare`'s result with A's and B's labels (A: this trace).
    `events` is read once and only what the page shows is kept (its steps' rows, telemetry,
    divergences): they may be a stream (`open_trace`), whose warnings are whole after it."""
    rows: list[StepRow] = []
    samples: list[TelemetrySample] = []
    divs: list[Divergence] = []
    summary: Summary | None = None
    for e in events:
        if isinstance(e, VerifyStep):
            rows.append(step_row(header, e))
        elif isinstance(e, TelemetrySample):
            samples.append(e)
        elif isinstance(e, Divergence):
            divs.append(e)
        elif isinstance(e, Summary):
            summary = e
    data = ReportData(rows, samples, header.t_ns)
    figures = "".join(
        f"<figure id='plot-{key}'><figcaption>{caption}</figcaption>"
        f"<img alt='{caption}' src='data:image/png;base64,{_png(plot, data)}'></figure>"
        for key, (caption, plot) in PLOTS.items()
    )
    notes = "".join(f"<p class='warning'>{html.escape(w)}</p>" for w in warnings)
    return (
        "<!DOCTYPE html><html><head><meta charset='utf-8'>"
        f"<title>specdash report: {html.escape(title)}</title><style>{STYLE}</style></head><body>"
        f"<h1>specdash session report</h1><p>{html.escape(title)}</p>{notes}"
        f"<h2>Summary</h2>{_table(_summary(summary, rows))}"
        f"<h2>Plots</h2>{figures}"
        f"<h2 id='divergences'>Divergences ({len(divs)})</h2>{_divergences(divs)}"
        + (
            ""
            if comparison is None
            else f"<h2 id='comparison'>Compared with B</h2>{_comparison(*comparison)}"
        )
        + f"<h2 id='settings'>Session settings</h2>{_table(_settings(header))}"
        "</body></html>\n"
    )
