"""Tests are grouped by area (engine/, kernels/, ui/, trace/, runs/, sglang/, project/); the
helpers they share (tiny models, fake event streams, engine stand-ins, synthetic traces) sit
here, importable by name from every area and from the engine processes tests spawn."""

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))


@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, Path]:
    """A tiny trained-shape target, its draft and a prompt file (`tiny_models.write_pair`),
    built once per test module."""
    from tiny_models import write_pair

    return write_pair(tmp_path_factory.mktemp("tiny"))
