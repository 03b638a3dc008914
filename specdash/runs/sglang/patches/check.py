"""`specdash patches check`: does the installed SGLang still have what each patch replaces?

The installed SGLang is checked against one release row of the patch table (0.5.17 or 0.5.23):
its own row when it is a supported release, else the row it matches best. Each target of that
row resolves to OK (same source hash), changed (it exists but its source differs: the patch
may no longer be right), or missing (renamed or removed: the patch cannot apply). Needs no
GPU and no torch: the targets are read from SGLang's installed files, not imported.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass

from specdash.errors import EXIT_ENVIRONMENT, EXIT_OK, EnvironmentProblem
from specdash.runs.sglang.patches import installed_source, patch_set, registry

INSTALL_HINT = "SGLang is not installed: pip install 'specdash[sglang]'"


@dataclass(frozen=True)
class TargetStatus:
    patch: str
    path: str
    role: str
    status: str
    """"OK", "changed" or "missing"."""
    detail: str = ""


def check_targets(row: str) -> list[TargetStatus]:
    """Find and hash every target of every patch's `row` variant in the installed SGLang."""
    root = installed_source.sglang_root()
    if root is None:
        raise EnvironmentProblem(INSTALL_HINT)
    statuses = []
    for patch in patch_set.all_patches():
        for t in patch.variant(row).targets:
            text = installed_source.target_source(t.path, root)
            if text is None:
                statuses.append(
                    TargetStatus(patch.name, t.path, t.role, "missing", f"not in {root}")
                )
                continue
            found = installed_source.source_hash(text)
            status = "OK" if found == t.sha256 else "changed"
            detail = "" if status == "OK" else f"sha256 {found[:12]}, expected {t.sha256[:12]}"
            statuses.append(TargetStatus(patch.name, t.path, t.role, status, detail))
    return statuses


def require_sglang() -> str:
    """The installed SGLang version; EnvironmentProblem with the install hint when absent."""
    version = registry.sglang_version()
    if version is None:
        raise EnvironmentProblem(INSTALL_HINT)
    return version


def matching_row(version: str) -> tuple[str, list[TargetStatus]]:
    """The release row to check (and apply) for `version`, with its target statuses: its own
    row when supported, else the row with the most OK targets (fewest missing on a tie)."""
    if version in registry.SUPPORTED_VERSIONS:
        return version, check_targets(version)
    rows = {row: check_targets(row) for row in registry.SUPPORTED_VERSIONS}

    def score(row: str) -> tuple[int, int]:
        statuses = rows[row]
        return sum(s.status == "OK" for s in statuses), -sum(
            s.status == "missing" for s in statuses
        )

    best = max(rows, key=score)
    return best, rows[best]


def format_report(version: str, row: str, statuses: list[TargetStatus]) -> str:
    supported = ", ".join(registry.SUPPORTED_VERSIONS)
    if version in registry.SUPPORTED_VERSIONS:
        head = f"sglang {version}: supported; checked against the {row} row"
    else:
        head = (
            f"sglang {version}: NOT a supported release ({supported}); "
            f"checked against the row it matches best, {row}"
        )
    lines = [head]
    width = max(len(s.path) for s in statuses)
    for s in statuses:
        line = f"  {s.status:<8}{s.path:<{width}}  [{s.patch}, {s.role}]"
        lines.append(f"{line}  {s.detail}" if s.detail else line)
    counts = {k: sum(s.status == k for s in statuses) for k in ("OK", "changed", "missing")}
    lines.append(", ".join(f"{n} {k}" for k, n in counts.items()))
    return "\n".join(lines)


def problems(version: str, row: str, statuses: list[TargetStatus]) -> str | None:
    """Why the patches should not be applied, or None when everything checks out."""
    bad = [s for s in statuses if s.status != "OK"]
    if version in registry.SUPPORTED_VERSIONS and not bad:
        return None
    missing = sum(s.status == "missing" for s in bad)
    return (
        f"sglang {version}: {missing} patch targets missing, {len(bad) - missing} changed "
        f"against the {row} row (supported: {', '.join(registry.SUPPORTED_VERSIONS)}); "
        "see `specdash patches check`"
    )


def ensure_patchable(force: bool) -> str:
    """The release row whose patches apply to the installed SGLang: its own, or, forced, the
    row it matches best. Refuse (EnvironmentProblem) an unchecked SGLang unless forced;
    missing targets always.

    On any problem the `patches check` table goes to stderr first, so the refusal is explained.
    A forced row reaches the scheduler processes through `process.session_environment`.
    """
    version = require_sglang()
    row, statuses = matching_row(version)
    reason = problems(version, row, statuses)
    if reason is None:
        return row
    print(format_report(version, row, statuses), file=sys.stderr)
    if any(s.status == "missing" for s in statuses) or not force:
        hint = "" if force else "; --force-patches to try anyway"
        raise EnvironmentProblem(reason + hint)
    return row


def run_check(args: argparse.Namespace) -> int:
    version = require_sglang()
    row, statuses = matching_row(version)
    print(format_report(version, row, statuses))
    return EXIT_ENVIRONMENT if any(s.status == "missing" for s in statuses) else EXIT_OK
