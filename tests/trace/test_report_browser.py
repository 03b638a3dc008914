"""The HTML report in a real browser (headless Chromium): nothing runs off the page at a
laptop width, every plot decodes, a CPU trace's bandwidth plot says why it is empty, and no
number in the divergence table is broken across lines. Skipped only where no Chromium is
installed (`apt-get install chromium`; CI's image has none, so CI skips these)."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest
from synthetic_trace import Plan, session

from specdash.cli import main
from specdash.errors import EXIT_OK
from specdash.events import Divergence, Margin, RootCause, TelemetrySample
from specdash.trace.jsonl import TraceWriter

CHROMIUM = next(
    (p for p in map(shutil.which, ("chromium", "chromium-browser", "google-chrome")) if p), None
)
pytestmark = pytest.mark.skipif(CHROMIUM is None, reason="no Chromium installed")

MEASURE = """<script>
document.title = [document.documentElement.scrollWidth, window.innerWidth,
  [...document.images].every(i => i.complete && i.naturalWidth > 0)].join(' ');
</script></body>"""


def chromium(tmp_path: Path, *args: str) -> str:
    profile = tmp_path / "profile"  # a new, empty profile: no state from earlier runs
    command = [
        CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
        "--no-first-run", "--disable-background-networking", "--disable-component-update",
        "--disable-sync", f"--user-data-dir={profile}", "--hide-scrollbars", *args,
    ]  # fmt: skip
    done = subprocess.run(command, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout


def cpu_trace_with_long_divergences(path: Path) -> str:
    events = session(Plan(divergence_at=(1, 9)))
    div = next(e for e in events if isinstance(e, Divergence))
    long = div.model_copy(
        update={
            "context": "def very_long_identifier_without_spaces_" * 12,
            "spec_text": "x" * 80,
            "root_cause": RootCause(
                layer=0, sub_op="in_proj", max_abs_diff=1e-7, detail="GEMM rows differ " * 10
            ),
        }
    )
    no_gpu = TelemetrySample(t_ns=div.t_ns, window_s=0.25, source="none", note="no NVIDIA GPU")
    events = [e for e in events if not isinstance(e, TelemetrySample)]
    events[events.index(div) :] = [long, no_gpu, long, *events[events.index(div) + 1 :]]
    with TraceWriter(path) as w:
        for e in events:
            w(e)
    return str(path)


def test_report_fits_the_page_in_chromium(tmp_path) -> None:
    trace = cpu_trace_with_long_divergences(tmp_path / "cpu.jsonl")
    out = tmp_path / "cpu.html"
    assert main(["report", trace, "-o", str(out)]) == EXIT_OK
    page = out.read_text()
    assert "this session ran without an NVIDIA GPU" not in page  # it is in the PNG, not text
    measured = tmp_path / "measured.html"
    measured.write_text(page.replace("</body>", MEASURE))
    for width in (1024, 1400):
        dom = chromium(tmp_path, "--dump-dom", f"--window-size={width},900", measured.as_uri())
        title = re.search(r"<title>(\d+) (\d+) (\w+)</title>", dom)
        assert title is not None, dom[:500]
        scroll_width, inner_width, images_ok = int(title[1]), int(title[2]), title[3]
        assert scroll_width <= inner_width, f"page is {scroll_width} px wide at {inner_width}"
        assert images_ok == "true"
    shot = tmp_path / "report.png"
    chromium(tmp_path, f"--screenshot={shot}", "--window-size=1024,3000", out.as_uri())
    assert shot.read_bytes().startswith(b"\x89PNG") and shot.stat().st_size > 20_000


# Every number in the divergence table's cells, located as the browser laid it out: a number
# whose characters lie on more than one line (distinct tops of its client rects) is broken.
NUMBERS_ON_ONE_LINE = r"""<script>
const broken = [];
let numbers = 0;
for (const cell of document.querySelectorAll('#divergences + .wide td')) {
  const walk = document.createTreeWalker(cell, NodeFilter.SHOW_TEXT);
  for (let node = walk.nextNode(); node; node = walk.nextNode()) {
    for (const m of node.data.matchAll(/(?<![\w.-])[-−]?\d+(?:[.,_]\d+)*(?:e[-+]?\d+)?(?!\w)/g)) {
      const range = document.createRange();
      range.setStart(node, m.index);
      range.setEnd(node, m.index + m[0].length);
      const tops = new Set([...range.getClientRects()].map(r => Math.round(r.top)));
      numbers += 1;
      if (tops.size > 1) broken.push(m[0]);
    }
  }
}
document.title = `${numbers} ${broken.length} ${broken.join('|')}`;
</script></body>"""


def trace_with_long_numbers(path: Path) -> str:
    """Divergences as a real model reports them: large token ids, full-precision logprobs, a
    margin of millions of ulps, a root cause with a small max |diff| and a long detail."""
    events = session(Plan(divergence_at=(1, 9)))
    div = next(e for e in events if isinstance(e, Divergence))
    margin = Margin(top1_token=151_643, top2_token=102_345, gap=0.000123, ulps=12_345_678,
                    near_tie=True)  # fmt: skip
    rows = [
        div.model_copy(
            update={
                "step": 123_456 + i,
                "position": 4_096 + i,
                "spec_token": 151_643,
                "shadow_token": 102_345,
                "spec_logprob": -0.000123456789012345 * (i + 1),
                "shadow_logprob": -12.345678901234567,
                "spec_text": " parse_configuration_from_environment",
                "context": "for index in range(1_000_000): total += weights[index] * 0.125 " * 3,
                "shadow_margin": margin,
                "root_cause": RootCause(
                    layer=47,
                    sub_op="mlp.down_proj",
                    max_abs_diff=1.1920928955078125e-07,
                    detail="rows 3 and 17 of the verify GEMM differ from the decode GEMM's " * 3,
                    origin_position=4_093,
                ),  # fmt: skip
            }
        )
        for i in range(3)
    ]
    events[events.index(div) : events.index(div) + 1] = rows
    with TraceWriter(path) as w:
        for e in events:
            w(e)
    return str(path)


@pytest.mark.parametrize("width", [1024, 1400])
def test_no_number_in_the_divergence_table_is_broken_across_lines(tmp_path, width) -> None:
    out = tmp_path / "report.html"
    assert main(["report", trace_with_long_numbers(tmp_path / "s.jsonl"), "-o", str(out)]) == 0
    measured = tmp_path / "measured.html"
    measured.write_text(out.read_text().replace("</body>", NUMBERS_ON_ONE_LINE))
    dom = chromium(tmp_path, "--dump-dom", f"--window-size={width},900", measured.as_uri())
    title = re.search(r"<title>(\d+) (\d+) ?([^<]*)</title>", dom)
    assert title is not None, dom[:500]
    numbers, broken = int(title[1]), int(title[2])
    assert numbers > 30  # every row's ids, logprobs, margins and root causes were measured
    assert broken == 0, f"{broken} numbers broken across lines at {width} px: {title[3]}"
