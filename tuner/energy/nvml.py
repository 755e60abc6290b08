"""NVIDIA GPUs' energy through NVML (the ``nvidia-ml-py`` package, imported as ``pynvml``).

Optional: ``pip install 'vllm-tuner[gpu]'``; imported only when a GPU source is opened, so
CPU builds and the simulator never need it. Per GPU of the trial's group (an index as
nvidia-smi numbers them, which is NVML's order, or a UUID, as CUDA_VISIBLE_DEVICES allows):

* **Energy counter** (``nvmlDeviceGetTotalEnergyConsumption``, millijoules since the driver
  loaded; Volta and newer): read directly, exact to the millijoule, refreshed by the driver
  every ~100 ms.
* **Power sampling** otherwise (``nvmlDeviceGetPowerUsage``, milliwatts): a thread of this
  source reads it every ``POWER_PERIOD_S`` and integrates by the trapezoid rule. 50 ms
  because the driver refreshes the reading no faster than that on the GPUs that lack the
  counter (reading faster returns the same value) while a level's window of tens of
  seconds then holds hundreds of samples; each read costs well under a millisecond of one
  core, so the load generator does not notice it.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from tuner.energy.per_token import CounterResolution
from tuner.energy.series import counter_delta
from tuner.energy.source import NoEnergySource

__all__ = ["COUNTER_UPDATE_S", "INSTALL_HINT", "POWER_PERIOD_S", "POWER_UPDATE_S", "NvmlSource", "import_pynvml",
           "open_nvml"]

POWER_PERIOD_S = 0.05
# The energy counter's refresh period is not documented; ~100 ms is what is seen on recent
# data-centre GPUs, so a reading can be that stale.
COUNTER_UPDATE_S = 0.1
# nvmlDeviceGetPowerUsage is a 1-second average on Ampere and newer (NVML's documentation):
# a sampled power curve then lags the true one by up to a second at each end of a window.
POWER_UPDATE_S = 1.0
INSTALL_HINT = "pip install 'vllm-tuner[gpu]'"


def import_pynvml() -> Any | str:
    """The ``pynvml`` module, or why it cannot be had: the installed one, else the copy vLLM
    ships (``vllm/third_party/pynvml.py``), so a GPU box with vLLM needs no extra package."""
    try:
        return importlib.import_module("pynvml")
    except ModuleNotFoundError:
        shipped = _vllm_pynvml()
        return shipped if shipped is not None else f"no NVML (pynvml not installed: {INSTALL_HINT})"
    except ImportError as exc:
        return f"no NVML (pynvml cannot be imported: {exc})"


def _vllm_pynvml() -> Any | None:
    """vLLM's own copy of pynvml, loaded from its file: ``import vllm.third_party.pynvml``
    would run vLLM's package ``__init__`` (torch and the rest) in the tuner's worker."""
    try:
        found = importlib.util.find_spec("vllm")
    except (ImportError, ValueError):
        return None
    for folder in (found.submodule_search_locations or []) if found is not None else []:
        path = Path(folder) / "third_party" / "pynvml.py"
        spec = importlib.util.spec_from_file_location("_tuner_vllm_pynvml", path) if path.is_file() else None
        if spec is None or spec.loader is None:
            continue
        module = importlib.util.module_from_spec(spec)
        # pynvml looks itself up in sys.modules while it loads (to attach its error classes).
        sys.modules[spec.name] = module
        try:
            spec.loader.exec_module(module)
        except Exception:   # a copy that does not load is no copy; the reason stays "not installed"
            sys.modules.pop(spec.name, None)
            return None
        return module
    return None


def _label(gpu: int | str) -> str:
    return str(gpu)


class NvmlSource:
    """The summed energy of ``gpus``: counters where the GPU has one, sampled power else."""

    def __init__(self, nvml: Any, gpus: Sequence[int | str], handles: Sequence[Any], counter: Sequence[bool],
                 period_s: float = POWER_PERIOD_S, clock: Callable[[], float] = time.monotonic) -> None:
        self._nvml = nvml
        self.gpus = [_label(g) for g in gpus]
        self._handles = list(handles)
        self._counter = list(counter)
        self._period_s = period_s
        self._clock = clock
        self._last_mj = [nvml.nvmlDeviceGetTotalEnergyConsumption(h) if c else 0
                         for h, c in zip(self._handles, self._counter)]
        self._counter_mj = 0
        self._lock = threading.Lock()
        self._power_j = 0.0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._sampled = [h for h, c in zip(self._handles, self._counter) if not c]
        if self._sampled:
            self._prev = (self._clock(), self._watts())
            self._thread = threading.Thread(target=self._integrate, name="nvml-power", daemon=True)
            self._thread.start()

    def _watts(self) -> float:
        return sum(float(self._nvml.nvmlDeviceGetPowerUsage(h)) for h in self._sampled) / 1000.0

    def _integrate(self) -> None:
        while not self._stop.wait(self._period_s):
            self._step()

    def _step(self) -> None:
        try:
            watts = self._watts()
        except self._nvml.NVMLError:
            return      # one missed reading: the trapezoid spans the gap
        now = self._clock()
        t_prev, w_prev = self._prev
        with self._lock:
            self._power_j += (w_prev + watts) / 2 * (now - t_prev)
        self._prev = (now, watts)

    @property
    def name(self) -> str:
        kinds = ["energy counter" if c else f"power sampled every {self._period_s * 1000:.0f} ms"
                 for c in self._counter]
        return "NVML: " + ", ".join(f"GPU {g} {k}" for g, k in zip(self.gpus, kinds))

    @property
    def resolution(self) -> CounterResolution:
        if self._sampled:
            return CounterResolution(0.0, POWER_UPDATE_S + self._period_s)
        return CounterResolution(1e-3, COUNTER_UPDATE_S)

    def read(self) -> float:
        for i, (handle, counter) in enumerate(zip(self._handles, self._counter)):
            if counter:
                now = int(self._nvml.nvmlDeviceGetTotalEnergyConsumption(handle))
                self._counter_mj += int(counter_delta(self._last_mj[i], now, None))
                self._last_mj[i] = now
        with self._lock:
            return self._counter_mj / 1000.0 + self._power_j

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        try:
            self._nvml.nvmlShutdown()
        except self._nvml.NVMLError:
            pass


def _handle(nvml: Any, gpu: int | str) -> Any:
    if isinstance(gpu, int) or gpu.strip().isdigit():
        return nvml.nvmlDeviceGetHandleByIndex(int(gpu))
    return nvml.nvmlDeviceGetHandleByUUID(gpu.strip())


def open_nvml(gpus: Sequence[int | str], period_s: float = POWER_PERIOD_S,
              nvml: Any | None = None) -> NvmlSource | NoEnergySource:
    """An NVML source over ``gpus``, each read once to be sure it can be, or the reason
    there is none. ``nvml``: the module to use (default: import ``pynvml``)."""
    if not gpus:
        return NoEnergySource("no NVML energy: the trial's group has no GPU")
    module = import_pynvml() if nvml is None else nvml
    if isinstance(module, str):
        return NoEnergySource(module)
    try:
        module.nvmlInit()
    except module.NVMLError as exc:
        return NoEnergySource(f"no NVML (nvmlInit failed: {exc}; is the NVIDIA driver loaded?)")
    handles, counter = [], []
    try:
        for gpu in gpus:
            try:
                handle = _handle(module, gpu)
            except module.NVMLError as exc:
                raise _Refused(f"no NVML energy for GPU {gpu} (no such device: {exc})") from exc
            try:
                module.nvmlDeviceGetTotalEnergyConsumption(handle)
                has_counter = True
            except module.NVMLError:
                has_counter = False   # pre-Volta, or not exposed here: sample its power
                try:
                    module.nvmlDeviceGetPowerUsage(handle)
                except module.NVMLError as exc:
                    raise _Refused(f"no NVML energy for GPU {gpu} (neither the energy counter nor "
                                   f"power readings are supported: {exc})") from exc
            handles.append(handle)
            counter.append(has_counter)
        try:
            return NvmlSource(module, gpus, handles, counter, period_s)
        except module.NVMLError as exc:
            raise _Refused(f"no NVML energy (reading {', '.join(map(str, gpus))} failed: {exc})") from exc
    except _Refused as exc:
        try:
            module.nvmlShutdown()
        except module.NVMLError:
            pass
        return NoEnergySource(str(exc))


class _Refused(Exception):
    """A GPU of the group cannot be read (its message is the reason)."""
