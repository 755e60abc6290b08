"""The energy sources on stand-ins: RAPL on a temporary powercap tree, NVML through a fake
``pynvml`` module in sys.modules (counter and power-sampling paths), the reasons
detect_energy_source gives, and the sampler's thread (stopped, nothing left running)."""

from __future__ import annotations

import sys
import threading
import time
import types
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tuner.energy.detect import detect_energy_source, energy_unavailable
from tuner.energy.nvml import NvmlSource, open_nvml
from tuner.energy.rapl import RaplSource, open_rapl, package_zones
from tuner.energy.sampler import EnergySampler
from tuner.energy.source import EnergySource, NoEnergySource


def zone(root: Path, name: str, label: str, energy_uj: int, range_uj: int = 10**9) -> Path:
    path = root / name
    path.mkdir(parents=True)
    (path / "name").write_text(label + "\n")
    (path / "energy_uj").write_text(f"{energy_uj}\n")
    (path / "max_energy_range_uj").write_text(f"{range_uj}\n")
    return path


def set_uj(path: Path, value: int) -> None:
    (path / "energy_uj").write_text(f"{value}\n")


@pytest.fixture
def no_new_threads() -> Iterator[None]:
    before = set(threading.enumerate())
    yield
    left = [t for t in threading.enumerate() if t not in before and t.is_alive()]
    assert not left, f"threads left running: {left}"


# -- RAPL ------------------------------------------------------------------------------------

def test_rapl_sums_packages_only_and_undoes_the_wrap(tmp_path: Path) -> None:
    p0 = zone(tmp_path, "intel-rapl:0", "package-0", 1_000_000)
    zone(tmp_path, "intel-rapl:0:0", "core", 500_000)           # a part of package 0
    zone(tmp_path, "intel-rapl:0:1", "dram", 300_000)
    p1 = zone(tmp_path, "intel-rapl:1", "package-1", 9_000_000, range_uj=10_000_000)
    zone(tmp_path, "intel-rapl:2", "psys", 7_000_000)            # contains the packages
    (tmp_path / "intel-rapl").mkdir()                            # the control type itself
    assert package_zones(tmp_path) == [p0, p1]
    src = open_rapl(tmp_path)
    assert isinstance(src, RaplSource) and isinstance(src, EnergySource)
    assert src.read() == 0.0
    set_uj(p0, 3_000_000)                      # +2 J
    set_uj(p1, 500_000)                        # wrapped at 10 J: +1 J +0.5 J
    assert src.read() == pytest.approx(3.5)
    set_uj(p0, 3_250_000)
    assert src.read() == pytest.approx(3.75)
    assert src.resolution.quantum_j == 1e-6
    assert "intel-rapl:0, intel-rapl:1" in src.name


def test_a_many_package_host_is_named_in_one_short_phrase(tmp_path: Path) -> None:
    for i in range(8):
        zone(tmp_path, f"intel-rapl:{i}", f"package-{i}", 0)
    name = open_rapl(tmp_path).name
    assert f"intel-rapl:0 ... intel-rapl:7, 8 packages under {tmp_path}" in name
    assert "intel-rapl:3" not in name


def test_rapl_reasons(tmp_path: Path) -> None:
    missing = open_rapl(tmp_path / "nowhere")
    assert isinstance(missing, NoEnergySource) and "does not exist" in missing.reason
    zone(tmp_path, "intel-rapl:0:0", "core", 1)
    empty = open_rapl(tmp_path)
    assert isinstance(empty, NoEnergySource)
    assert empty.reason.startswith(f"no RAPL counters under {tmp_path}")
    bad = zone(tmp_path, "intel-rapl:0", "package-0", 1)
    (bad / "energy_uj").write_text("garbage\n")
    unreadable = open_rapl(tmp_path)
    assert isinstance(unreadable, NoEnergySource) and "cannot be read" in unreadable.reason


# -- NVML through a fake pynvml --------------------------------------------------------------

class FakeNVMLError(Exception):
    pass


def fake_pynvml(energy_mj: dict[int, int] | None, power_mw: dict[int, int],
                devices: int = 2, init_fails: bool = False) -> Any:
    """A pynvml stand-in: per GPU index an energy counter (absent: NOT_SUPPORTED) and power."""
    mod: Any = types.ModuleType("pynvml")
    mod.NVMLError = FakeNVMLError
    mod.calls = {"init": 0, "shutdown": 0}
    mod.energy = dict(energy_mj or {})
    mod.power = dict(power_mw)

    def init() -> None:
        if init_fails:
            raise FakeNVMLError("Driver Not Loaded")
        mod.calls["init"] += 1

    def by_index(i: int) -> int:
        if not 0 <= i < devices:
            raise FakeNVMLError("Invalid Argument")
        return i

    def energy(h: int) -> int:
        if h not in mod.energy:
            raise FakeNVMLError("Not Supported")
        return mod.energy[h]

    def power(h: int) -> int:
        if h not in mod.power:
            raise FakeNVMLError("Not Supported")
        return mod.power[h]

    mod.nvmlInit = init
    mod.nvmlShutdown = lambda: mod.calls.__setitem__("shutdown", mod.calls["shutdown"] + 1)
    mod.nvmlDeviceGetHandleByIndex = by_index
    mod.nvmlDeviceGetHandleByUUID = lambda u: {"GPU-aaa": 0, "GPU-bbb": 1}[u]
    mod.nvmlDeviceGetTotalEnergyConsumption = energy
    mod.nvmlDeviceGetPowerUsage = power
    return mod


@pytest.fixture
def pynvml_in_sys_modules(monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    mod = fake_pynvml({0: 1_000_000, 1: 5_000}, {0: 300_000, 1: 200_000})
    monkeypatch.setitem(sys.modules, "pynvml", mod)
    yield mod


def test_nvml_energy_counters_are_summed_in_joules(pynvml_in_sys_modules: Any, no_new_threads: None) -> None:
    mod = pynvml_in_sys_modules
    src = detect_energy_source([0, "GPU-bbb"])          # imports the fake pynvml lazily
    assert isinstance(src, NvmlSource)
    try:
        assert src.read() == 0.0
        mod.energy[0] += 2_500          # 2.5 J
        mod.energy[1] += 500            # 0.5 J
        assert src.read() == pytest.approx(3.0)
        assert src.resolution.quantum_j == 1e-3
        assert "GPU 0 energy counter" in src.name and "GPU GPU-bbb energy counter" in src.name
    finally:
        src.close()
    assert mod.calls == {"init": 1, "shutdown": 1}


def test_nvml_samples_power_where_there_is_no_counter(no_new_threads: None) -> None:
    # GPU 1 has no energy counter (pre-Volta): its 200 W is sampled and integrated.
    mod = fake_pynvml({0: 1_000}, {0: 300_000, 1: 200_000})
    before = time.monotonic()           # the integration starts inside open_nvml
    src = open_nvml([0, 1], period_s=0.01, nvml=mod)
    assert isinstance(src, NvmlSource)
    opened = time.monotonic()
    time.sleep(0.3)
    joules = src.read()
    ended = time.monotonic()
    src.close()
    assert "GPU 1 power sampled every 10 ms" in src.name
    # 200 W x the time integrated so far: at most since before the open, at least since it
    # returned less a few periods of lag (more on a busy box).
    assert 200 * (ended - opened - 0.25) <= joules <= 200 * (ended - before + 0.05)
    assert src.resolution.update_s >= 1.0


def test_nvml_power_integration_is_the_trapezoid_rule() -> None:
    mod = fake_pynvml({}, {0: 100_000})
    clock = iter([0.0, 1.0, 3.0])
    src = NvmlSource(mod, [0], [0], [False], period_s=3600, clock=lambda: next(clock))
    try:
        mod.power[0] = 300_000
        src._step()                     # (100 + 300) / 2 W x 1 s
        assert src.read() == pytest.approx(200.0)
        mod.power[0] = 100_000
        src._step()                     # + (300 + 100) / 2 W x 2 s
        assert src.read() == pytest.approx(600.0)
    finally:
        src.close()


def test_nvml_reasons(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", None)       # import fails as if not installed
    reason = energy_unavailable([0])
    assert reason is not None and reason.startswith("no NVML (pynvml not installed")
    assert "vllm-tuner[gpu]" in reason
    down = open_nvml([0], nvml=fake_pynvml({}, {}, init_fails=True))
    assert isinstance(down, NoEnergySource) and "nvmlInit failed: Driver Not Loaded" in down.reason
    mod = fake_pynvml({0: 1}, {0: 1})
    absent = open_nvml([0, 5], nvml=mod)
    assert isinstance(absent, NoEnergySource) and absent.reason.startswith("no NVML energy for GPU 5")
    assert mod.calls["shutdown"] == 1
    blind = open_nvml([1], nvml=fake_pynvml({}, {}))
    assert isinstance(blind, NoEnergySource) and "neither the energy counter nor power" in blind.reason


# -- detect_energy_source ---------------------------------------------------------------------

def test_detect_picks_the_explicit_root_then_nvml_then_rapl(tmp_path: Path,
                                                           pynvml_in_sys_modules: Any) -> None:
    zone(tmp_path, "intel-rapl:0", "package-0", 0)
    sim = detect_energy_source([0, 1], powercap_root=tmp_path)    # the simulator's stand-in
    assert isinstance(sim, RaplSource)
    gpu = detect_energy_source([0, 1])
    assert isinstance(gpu, NvmlSource)
    gpu.close()
    assert energy_unavailable([], powercap_root=tmp_path / "none") == (
        f"no RAPL counters: {tmp_path / 'none'} does not exist (not exposed on this machine)")
    assert energy_unavailable([0], powercap_root=tmp_path) is None


# -- the sampler ------------------------------------------------------------------------------

class Ramp:
    """A source whose counter reads 100 W x seconds since it was made; fails when told to."""

    def __init__(self) -> None:
        self.t0 = time.monotonic()
        self.fail = False

    name = "ramp"
    resolution = None

    def read(self) -> float:
        if self.fail:
            raise OSError("gone")
        return 100.0 * (time.monotonic() - self.t0)

    def close(self) -> None:
        return None


def test_the_sampler_samples_on_the_monotonic_clock_and_stops(no_new_threads: None) -> None:
    src = Ramp()
    with EnergySampler(src, period_s=0.01) as sampler:      # type: ignore[arg-type]
        time.sleep(0.2)
        src.fail = True
        time.sleep(0.05)
        src.fail = False
    series = sampler.series
    assert len(series) >= 8
    assert sampler.failed_reads >= 1 and sampler.last_error == "OSError: gone"
    times = [t for t, _ in series]
    assert times == sorted(times)
    # stamped at the middle of each read: joules = 100 W x (t - t0) to well under a ms
    assert all(abs(j - 100.0 * (t - src.t0)) < 0.1 for t, j in series)
    assert sampler.stop() == series                         # stopping twice is harmless
    with pytest.raises(ValueError):
        EnergySampler(src, period_s=0)                      # type: ignore[arg-type]


def test_without_pynvml_the_copy_vllm_ships_is_used_without_importing_vllm(tmp_path, monkeypatch) -> None:
    """vLLM ships pynvml as vllm/third_party/pynvml.py: a GPU box with vLLM needs no extra
    package, and loading the copy must not run vLLM's own __init__ (torch and the rest)."""
    import sys

    from tuner.energy.nvml import INSTALL_HINT, import_pynvml

    monkeypatch.setitem(sys.modules, "pynvml", None)          # "not installed"
    package = tmp_path / "vllm"
    (package / "third_party").mkdir(parents=True)
    (package / "__init__.py").write_text("raise RuntimeError('vllm/__init__ must not run')\n")
    (package / "third_party" / "pynvml.py").write_text(
        "import sys\nTHIS = sys.modules[__name__]\ndef nvmlInit():\n    return None\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "vllm", raising=False)
    found = import_pynvml()
    assert not isinstance(found, str) and found.THIS is found and callable(found.nvmlInit)
    assert "vllm" not in sys.modules
    (package / "third_party" / "pynvml.py").unlink()
    assert import_pynvml() == f"no NVML (pynvml not installed: {INSTALL_HINT})"
