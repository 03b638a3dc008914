"""GPU telemetry: an NVML sampler thread that turns readings into `TelemetrySample` events.

NVML calls block and GPM needs more than 100 ms between two samples, so sampling runs on its
own thread at <= 10 Hz and only ever calls `sink`; the engine and the UI never wait on it.
DRAM bandwidth comes from GPM `DRAM_BW_UTIL` x peak bandwidth. Where GPM is absent or not
permitted, the legacy "memory busy %" is reported under its own label and never turned into
GB/s; with no NVIDIA GPU the sampler says so once and stops.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable
from typing import Literal, TypedDict

import pynvml

from specdash.events import TelemetrySample

MIN_WINDOW_S = 0.1
"""NVML GPM needs > 100 ms between samples; shorter windows read 0 or N/A."""
DEFAULT_WINDOW_S = 0.25

NO_GPU_NOTE = "no NVIDIA GPU"
_GPM_METRICS = (pynvml.NVML_GPM_METRIC_DRAM_BW_UTIL, pynvml.NVML_GPM_METRIC_SM_UTIL)
Source = Literal["gpm", "mem_busy", "none"]
"""What a sample's bandwidth number is (TelemetrySample.source)."""


class Readings(TypedDict, total=False):
    """One window's counters, as TelemetrySample fields."""

    dram_bw_util_pct: float | None
    dram_gbps: float | None
    sm_util_pct: float | None
    mem_busy_pct: float | None


def peak_dram_gbps(handle: object) -> float:
    """Theoretical DRAM bandwidth: bus width x max memory clock x 2 (double data rate)."""
    bus_bits = pynvml.nvmlDeviceGetMemoryBusWidth(handle)
    mem_mhz = pynvml.nvmlDeviceGetMaxClockInfo(handle, pynvml.NVML_CLOCK_MEM)
    return bus_bits / 8 * mem_mhz * 1e6 * 2 / 1e9


def device_index(device: str) -> int | None:
    """NVML index for a torch-style device string; None for a CPU session."""
    if not device.startswith("cuda"):
        return None
    _, _, index = device.partition(":")
    return int(index) if index.isdigit() else 0


class NvmlReader:
    """One NVML device, read one window at a time.

    `source` says what the bandwidth number means: "gpm" (DRAM_BW_UTIL, with GB/s derived
    from the peak), "mem_busy" (utilization.memory, a busy-time share, labelled as such) or
    "none" (no NVIDIA GPU: every read is the same one-line state). `note` says why.
    """

    def __init__(self, index: int = 0, peak_gbps: float | None = None) -> None:
        self.source: Source = "none"
        self.note = NO_GPU_NOTE
        self._handle: object = None
        self._samples: list[object] = []
        self.peak_gbps = peak_gbps
        try:
            pynvml.nvmlInit()
        except pynvml.NVMLError:
            return
        try:
            if pynvml.nvmlDeviceGetCount() <= index:
                pynvml.nvmlShutdown()
                return
            self._handle = pynvml.nvmlDeviceGetHandleByIndex(index)
        except pynvml.NVMLError as e:
            pynvml.nvmlShutdown()
            self.note = f"{NO_GPU_NOTE} ({e})"
            return
        self.source, self.note = self._open_gpm()
        if self.source == "gpm" and self.peak_gbps is None:
            self.peak_gbps = peak_dram_gbps(self._handle)

    def _open_gpm(self) -> tuple[Source, str]:
        """GPM if the device supports it and we may read it; else the labelled fallback.

        `NVMLError_NoPermission` surfaces on the first sample, not in the support query,
        so taking that sample is part of the check.
        """
        try:
            if not pynvml.nvmlGpmQueryDeviceSupport(self._handle).isSupportedDevice:
                return "mem_busy", "GPM not supported on this GPU: showing mem busy %"
            self._samples = [pynvml.nvmlGpmSampleAlloc(), pynvml.nvmlGpmSampleAlloc()]
            pynvml.nvmlGpmSampleGet(self._handle, self._samples[0])
        except pynvml.NVMLError_NoPermission:
            self._free_samples()
            return "mem_busy", "GPM needs admin (RmProfilingAdminOnly): showing mem busy %"
        except pynvml.NVMLError as e:
            self._free_samples()
            return "mem_busy", f"GPM unavailable ({e}): showing mem busy %"
        return "gpm", "DRAM BW % (GPM), GB/s derived from peak"

    def read(self, window_s: float) -> TelemetrySample:
        """The window that ends now (started at the previous read)."""
        if self.source == "none":
            return TelemetrySample(window_s=window_s, source="none", note=self.note)
        try:
            fields = self._read_gpm() if self.source == "gpm" else self._read_mem_busy()
            power_w = pynvml.nvmlDeviceGetPowerUsage(self._handle) / 1000
            mem_used_gb = pynvml.nvmlDeviceGetMemoryInfo(self._handle).used / 1e9
        except pynvml.NVMLError as e:
            return TelemetrySample(
                window_s=window_s, source=self.source, note=f"NVML read failed: {e}"
            )
        return TelemetrySample(
            window_s=window_s,
            source=self.source,
            power_w=power_w,
            mem_used_gb=mem_used_gb,
            note=self.note,
            **fields,
        )

    def _read_gpm(self) -> Readings:
        first, second = self._samples
        pynvml.nvmlGpmSampleGet(self._handle, second)
        request = pynvml.c_nvmlGpmMetricsGet_t()
        request.version = pynvml.NVML_GPM_METRICS_GET_VERSION
        request.numMetrics = len(_GPM_METRICS)
        request.sample1 = first
        request.sample2 = second
        for i, metric_id in enumerate(_GPM_METRICS):
            request.metrics[i].metricId = metric_id
        pynvml.nvmlGpmMetricsGet(request)
        self._samples.reverse()  # the next window starts where this one ended
        dram, sm = (
            m.value if m.nvmlReturn == pynvml.NVML_SUCCESS else None
            for m in request.metrics[: len(_GPM_METRICS)]
        )
        gbps = None if dram is None or self.peak_gbps is None else dram / 100 * self.peak_gbps
        return {"dram_bw_util_pct": dram, "dram_gbps": gbps, "sm_util_pct": sm}

    def _read_mem_busy(self) -> Readings:
        rates = pynvml.nvmlDeviceGetUtilizationRates(self._handle)
        return {"mem_busy_pct": float(rates.memory)}

    def _free_samples(self) -> None:
        for sample in self._samples:
            with contextlib.suppress(pynvml.NVMLError):  # shutting down; nothing to report
                pynvml.nvmlGpmSampleFree(sample)
        self._samples = []

    def close(self) -> None:
        if self._handle is None:
            return
        self._free_samples()
        self._handle = None
        pynvml.nvmlShutdown()


class GpuSampler:
    """Samples one GPU every `window_s` (>= 100 ms) on a daemon thread, calling `sink`.

    With no NVIDIA GPU it emits one "none" sample and the thread ends.
    """

    def __init__(
        self,
        sink: Callable[[TelemetrySample], None],
        window_s: float = DEFAULT_WINDOW_S,
        index: int = 0,
        peak_gbps: float | None = None,
    ) -> None:
        self._sink = sink
        self.window_s = max(window_s, MIN_WINDOW_S)
        self._index = index
        self._peak_gbps = peak_gbps
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="specdash-gpu-sampler", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=2)

    def _run(self) -> None:
        reader = NvmlReader(self._index, self._peak_gbps)
        try:
            if reader.source == "none":
                self._sink(reader.read(0.0))
                return
            start = time.monotonic()
            while not self._stop.wait(self.window_s):
                now = time.monotonic()
                self._sink(reader.read(now - start))
                start = now
        finally:
            reader.close()
