"""Tests are grouped by area (engine/, kernels/, ui/, trace/, runs/, sglang/, project/); the
helpers they share (tiny models, fake event streams, engine stand-ins, synthetic traces) sit
here, importable by name from every area and from the engine processes tests spawn."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
