"""GPU sampler: GPM when supported, the labelled mem-busy fallback when GPM is unsupported or
not permitted, and a one-line "no NVIDIA GPU" state without NVML. NVML is mocked at the
pynvml function level and fails with pynvml's own error classes."""

from __future__ import annotations

import threading
from types import SimpleNamespace

import pynvml
import pytest

from specdash.runs import nvml_sampler
from specdash.runs.nvml_sampler import GpuSampler, NvmlReader, device_index, peak_dram_gbps

H200_BUS_BITS, H200_MEM_MHZ = 6016, 3201


def nvml_error(code: int) -> pynvml.NVMLError:
    return pynvml.NVMLError(code)  # pynvml returns the matching subclass


@pytest.fixture
def fake_gpu(monkeypatch):
    """An NVML with one H200-like device; tests switch GPM behaviour via `gpu.gpm`."""
    gpu = SimpleNamespace(
        gpm="ok", dram_pct=[50.0, 75.0], sm_pct=99.0, samples_got=[], freed=0, shutdown=0
    )

    def gpm_support(handle):
        if gpu.gpm == "unsupported":
            return SimpleNamespace(isSupportedDevice=0)
        return SimpleNamespace(isSupportedDevice=1)

    def sample_get(handle, sample):
        if gpu.gpm == "no_permission":
            raise nvml_error(pynvml.NVML_ERROR_NO_PERMISSION)
        gpu.samples_got.append(sample)
        return sample

    def metrics_get(request):
        assert request.version == pynvml.NVML_GPM_METRICS_GET_VERSION
        assert request.numMetrics == 2
        assert request.metrics[0].metricId == pynvml.NVML_GPM_METRIC_DRAM_BW_UTIL
        assert request.metrics[1].metricId == pynvml.NVML_GPM_METRIC_SM_UTIL
        request.metrics[0].value = gpu.dram_pct.pop(0)
        request.metrics[0].nvmlReturn = pynvml.NVML_SUCCESS
        request.metrics[1].value = gpu.sm_pct
        request.metrics[1].nvmlReturn = pynvml.NVML_ERROR_NOT_SUPPORTED
        return request

    def free(sample):
        gpu.freed += 1

    def shutdown():
        gpu.shutdown += 1

    patches = {
        "nvmlInit": lambda: None,
        "nvmlShutdown": shutdown,
        "nvmlDeviceGetCount": lambda: 1,
        "nvmlDeviceGetHandleByIndex": lambda i: "h0",
        "nvmlGpmQueryDeviceSupport": gpm_support,
        "nvmlGpmSampleAlloc": lambda: pynvml.c_nvmlGpmSample_t(pynvml.struct_c_nvmlGpmSample_t()),
        "nvmlGpmSampleGet": sample_get,
        "nvmlGpmMetricsGet": metrics_get,
        "nvmlGpmSampleFree": free,
        "nvmlDeviceGetMemoryBusWidth": lambda h: H200_BUS_BITS,
        "nvmlDeviceGetMaxClockInfo": lambda h, clock: H200_MEM_MHZ,
        "nvmlDeviceGetPowerUsage": lambda h: 512_000,
        "nvmlDeviceGetMemoryInfo": lambda h: SimpleNamespace(used=42e9),
        "nvmlDeviceGetUtilizationRates": lambda h: SimpleNamespace(gpu=97, memory=61),
    }
    for name, fn in patches.items():
        monkeypatch.setattr(pynvml, name, fn)
    return gpu


def test_peak_bandwidth_is_bus_width_times_clock_times_two(fake_gpu):
    assert peak_dram_gbps("h0") == pytest.approx(6016 / 8 * 3201e6 * 2 / 1e9)  # 4.81 TB/s


def test_gpm_reads_dram_percent_and_derives_gbps(fake_gpu):
    reader = NvmlReader()
    assert reader.source == "gpm"
    first = reader.read(0.25)
    second = reader.read(0.25)
    peak = peak_dram_gbps("h0")
    assert first.source == "gpm" and first.window_s == 0.25
    assert first.dram_bw_util_pct == 50.0
    assert first.dram_gbps == pytest.approx(0.5 * peak)
    assert second.dram_gbps == pytest.approx(0.75 * peak)
    assert first.sm_util_pct is None  # its metric reported NOT_SUPPORTED
    assert first.power_w == 512.0 and first.mem_used_gb == 42.0
    assert first.mem_busy_pct is None
    # windows are contiguous: each read's end sample is the next read's start sample
    opened, end1, end2 = fake_gpu.samples_got
    assert end1 is not opened and end2 is opened
    reader.close()
    assert fake_gpu.freed == 2 and fake_gpu.shutdown == 1


def test_per_sku_peak_override(fake_gpu):
    reader = NvmlReader(peak_gbps=1000.0)
    assert reader.read(0.25).dram_gbps == pytest.approx(500.0)


@pytest.mark.parametrize(
    ("gpm", "why"),
    [("unsupported", "GPM not supported"), ("no_permission", "GPM needs admin")],
)
def test_gpm_unavailable_falls_back_to_labelled_mem_busy(fake_gpu, gpm, why):
    fake_gpu.gpm = gpm
    reader = NvmlReader()
    sample = reader.read(0.25)
    assert sample.source == "mem_busy"
    assert sample.mem_busy_pct == 61.0
    assert sample.dram_gbps is None and sample.dram_bw_util_pct is None  # never derived
    assert why in sample.note and "mem busy %" in sample.note
    assert sample.power_w == 512.0
    reader.close()


def test_nvml_absent_is_one_no_gpu_sample(monkeypatch):
    def no_library():
        raise nvml_error(pynvml.NVML_ERROR_LIBRARY_NOT_FOUND)

    monkeypatch.setattr(pynvml, "nvmlInit", no_library)
    samples = []
    sampler = GpuSampler(samples.append, window_s=0.1)
    sampler.start()
    sampler._thread.join(timeout=5)
    assert not sampler._thread.is_alive()
    assert len(samples) == 1
    assert samples[0].source == "none" and samples[0].note == nvml_sampler.NO_GPU_NOTE


def test_sampler_emits_windows_of_at_least_100_ms(fake_gpu):
    fake_gpu.dram_pct = [10.0] * 100
    samples = []
    got_two = threading.Event()

    def sink(sample):
        samples.append(sample)
        if len(samples) >= 2:
            got_two.set()

    sampler = GpuSampler(sink, window_s=0.01)  # asks for 100 Hz, gets 10 Hz
    assert sampler.window_s == nvml_sampler.MIN_WINDOW_S
    sampler.start()
    assert got_two.wait(timeout=5)
    sampler.stop()
    assert all(s.window_s >= 0.1 for s in samples)
    assert fake_gpu.shutdown == 1


def test_read_failure_is_reported_not_raised(fake_gpu, monkeypatch):
    reader = NvmlReader()

    def gpu_lost(h):
        raise nvml_error(pynvml.NVML_ERROR_GPU_IS_LOST)

    monkeypatch.setattr(pynvml, "nvmlDeviceGetPowerUsage", gpu_lost)
    sample = reader.read(0.25)
    assert sample.source == "gpm" and "NVML read failed" in sample.note


def test_device_index():
    assert device_index("cpu") is None
    assert device_index("cuda") == 0
    assert device_index("cuda:3") == 3
