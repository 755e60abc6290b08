"""Energy measurement: how many joules a level's steady window cost, per output token.

A *source* reads a monotonically increasing energy counter in joules (NVML on NVIDIA GPUs,
RAPL through Linux powercap on CPUs, the simulator's stand-in powercap directory), or says
why nothing can be read. A *sampler* reads it every ``period_s`` from a background thread
beside a level and keeps the ``(time.monotonic(), joules)`` series. The arithmetic on that
series (energy over a window, joules per output token with its 95 % interval, idle draw)
is pure, in :mod:`tuner.energy.series` and :mod:`tuner.energy.per_token`.

Modules:

* ``series``     pure: counter deltas across a wrap, energy over [t0, t1] by interpolation.
* ``per_token``  pure: joules per output token over the steady window, idle draw.
* ``source``     the source interface and the reason there is none.
* ``rapl``       RAPL package counters under /sys/class/powercap (or any root).
* ``nvml``       NVIDIA GPUs through nvidia-ml-py (``pynvml``, optional extra ``gpu``).
* ``sampler``    the background thread that samples a source during a level.
* ``detect``     which source this trial can use, or the one-line reason there is none.
* ``energy_text`` pure: the status line on a study's counter and idle draw.
"""
