"""Number formatting shared by the panels: every number carries its window."""

from __future__ import annotations


def num(value: float | None, spec: str = ".1f") -> str:
    """A number, or an en dash while there is nothing to show yet."""
    return "–" if value is None else format(value, spec)


def pct(value: float | None) -> str:
    return "–" if value is None else f"{value:.0%}"


def bar(fraction: float | None, width: int) -> str:
    """A horizontal bar of eighth-blocks, `width` cells at 100%."""
    if fraction is None:
        return " " * width
    eighths = round(max(0.0, min(1.0, fraction)) * width * 8)
    full, rest = divmod(eighths, 8)
    partial = " ▏▎▍▌▋▊▉"[rest] if rest else ""
    return ("█" * full + partial).ljust(width)
