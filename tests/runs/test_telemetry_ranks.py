"""Under tensor parallelism only the first scheduler rank sends telemetry: two real gloo ranks
on the CPU, each asked whether it reports, and a rank that must not send nothing."""

from __future__ import annotations

import multiprocessing as mp
import os
import socket


def _rank(rank: int, port: int, out: mp.Queue) -> None:
    import torch.distributed as dist

    from specdash.runs.sglang.patches import telemetry

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    try:
        os.environ[telemetry.ADDRESS_ENV] = "ipc:///tmp/specdash-test-ranks-nobody"
        telemetry._emit({"rid": "r", "k": 1})
        out.put((rank, telemetry.reports_here(), telemetry._sender is not None))
    finally:
        dist.destroy_process_group()


def test_only_rank_zero_reports() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    procs = [ctx.Process(target=_rank, args=(r, port, out)) for r in (0, 1)]
    for p in procs:
        p.start()
    results = sorted(out.get(timeout=120) for _ in procs)
    for p in procs:
        p.join(timeout=60)
    assert results == [(0, True, True), (1, False, False)]
    assert [p.exitcode for p in procs] == [0, 0]


def test_a_single_process_reports() -> None:
    from specdash.runs.sglang.patches import telemetry

    assert telemetry.reports_here()
