"""The HTML report in a real browser (headless Chromium): nothing runs off the page at a
laptop width, every plot decodes, and a CPU trace's bandwidth plot says why it is empty.
Skipped only where no Chromium is installed (`apt-get install chromium`)."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest
from synthetic_trace import Plan, session

from specdash.cli import main
from specdash.errors import EXIT_OK
from specdash.events import Divergence, RootCause, TelemetrySample
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
