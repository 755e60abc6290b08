"""NVML energy on a real GPU: the counter against sampled power, and how often each refreshes.

Run on a machine with an NVIDIA GPU, nvidia-ml-py and PyTorch:

    python benchmarks/energy_nvml.py [GPU_INDEX]

It opens two sources on the same GPU through tuner.energy (the total-energy counter that
detect_energy_source picks, and power sampling forced on, the fallback for GPUs without
the counter), samples both every 50 ms (tuner.energy.sampler) through 5 s idle, 10 s of
bf16 matrix products and 3 s idle again, and prints the idle draw, the mean power under
load from each source, and how often the raw counter and the power reading change (the
refresh periods tuner/energy/nvml.py assumes: ~100 ms for the counter, 1 s averages for
power on Ampere and newer).

Not yet run on a GPU (2026-12-07: the session that wrote it had no device time left); it
ran end to end against stub pynvml and torch modules only. The wheels it needs on the lent
machine (nvidia-ml-py, and pydantic v2 if missing) are carried as README.md's device notes say.
"""

from __future__ import annotations

import statistics
import sys
import time

import pynvml
import torch

from tuner.energy.detect import detect_energy_source
from tuner.energy.nvml import NvmlSource
from tuner.energy.per_token import idle_draw
from tuner.energy.sampler import EnergySampler
from tuner.energy.series import energy_between


def refresh_periods(handle: object, seconds: float = 2.0) -> tuple[float, float]:
    """Median seconds between changes of the raw energy counter and of the power reading,
    polled every millisecond."""
    changes: dict[str, list[float]] = {"energy": [], "power": []}
    last = {"energy": pynvml.nvmlDeviceGetTotalEnergyConsumption(handle),
            "power": pynvml.nvmlDeviceGetPowerUsage(handle)}
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        now = {"energy": pynvml.nvmlDeviceGetTotalEnergyConsumption(handle),
               "power": pynvml.nvmlDeviceGetPowerUsage(handle)}
        for k in now:
            if now[k] != last[k]:
                changes[k].append(time.monotonic())
                last[k] = now[k]
        time.sleep(0.001)

    def median_gap(ts: list[float]) -> float:
        gaps = [b - a for a, b in zip(ts, ts[1:])]
        return statistics.median(gaps) if gaps else float("nan")

    return median_gap(changes["energy"]), median_gap(changes["power"])


def busy(seconds: float) -> int:
    a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    n = 0
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        for _ in range(20):
            a @ b
        torch.cuda.synchronize()
        n += 20
    return n


def main() -> int:
    gpu = int(sys.argv[1]) if len(sys.argv) > 1 else 0
    counter = detect_energy_source([gpu])
    print("detected:", getattr(counter, "name", counter))
    if not isinstance(counter, NvmlSource):
        return 1
    pynvml.nvmlInit()    # the forced power source's own session (NVML counts init/shutdown)
    handle = pynvml.nvmlDeviceGetHandleByIndex(gpu)
    print("device:", pynvml.nvmlDeviceGetName(handle), "driver", pynvml.nvmlSystemGetDriverVersion())
    sampled = NvmlSource(pynvml, [gpu], [handle], [False])
    torch.zeros(1, device="cuda")        # a CUDA context before the idle interval
    with EnergySampler(counter) as s_counter, EnergySampler(sampled) as s_power:
        t0 = time.monotonic()
        time.sleep(5.0)
        t1 = time.monotonic()
        products = busy(10.0)
        t2 = time.monotonic()
        time.sleep(3.0)
    sampled.close()
    flops = 2 * 8192**3 * products / (t2 - t1)
    print(f"load: {products} bf16 8192^3 products in {t2 - t1:.2f} s ({flops / 1e12:.0f} TFLOP/s)")
    for label, sampler, src in (("counter", s_counter, counter), ("power sampled", s_power, sampled)):
        series = sampler.series
        idle = idle_draw(series, t0 + 0.5, t1, src.resolution)
        load_j = energy_between(series, t1, t2)
        # the load's energy counted until the tail of the next idle too: what a 1-s average smears past t2
        tail_j = energy_between(series, t1, t2 + 2.0) - idle.watts * 2.0
        print(f"{label:>14}: {len(series)} samples, idle {idle.watts:.1f} ± {idle.ci95 or float('nan'):.1f} W; "
              f"load window {load_j:.0f} J = {load_j / (t2 - t1):.1f} W; with 2 s of tail less idle "
              f"{tail_j:.0f} J; {load_j / products:.2f} J per product")
    counter.close()
    pynvml.nvmlInit()
    energy_s, power_s = refresh_periods(pynvml.nvmlDeviceGetHandleByIndex(gpu))
    print(f"refresh (median gap between changes, idle): energy counter {energy_s * 1000:.0f} ms, "
          f"power reading {power_s * 1000:.0f} ms")
    busy_handle = pynvml.nvmlDeviceGetHandleByIndex(gpu)
    a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    for _ in range(1000):
        a @ a          # queued: about 1.4 s of work while the counter is watched for 1 s
    energy_s, power_s = refresh_periods(busy_handle, 1.0)
    torch.cuda.synchronize()
    print(f"refresh (median gap between changes, busy): energy counter {energy_s * 1000:.0f} ms, "
          f"power reading {power_s * 1000:.0f} ms")
    pynvml.nvmlShutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
