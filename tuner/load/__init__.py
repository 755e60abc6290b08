"""The load generator: what a trial is measured with.

Pure modules (data and arithmetic; no sockets, processes, clocks, environment or files):

* ``load_spec``   the study file's ``load:`` section (pydantic).
* ``workload``    deterministic synthetic prompts (open_ended, copy_heavy, shared_prefix),
                  token fitting, arrival schedules.
* ``dataset``     a user's own traffic file: the five format names, parsing, detection,
                  one-line errors, digest.
* ``dataset_draw`` a sweep's requests drawn from a dataset (conversations whole).
* ``trace_prompts`` mooncake lines (lengths and prefix-block hashes) made into prompt text.
* ``workload_profile`` what a workload is: length distributions, turns, the share of prompt
                  tokens repeating an earlier prefix, a trace's arrival rate (workload.json).
* ``trace_spec``  ``load.trace:``: which requests of a timed dataset the ``trace`` level
                  replays, and when.
* ``sse``         incremental Server-Sent Events parser (the client's hot path), lines capped.
* ``token_counts`` whether a server's usage counts are believed, against what arrived.
* ``protocol``    request bodies, URL paths, what a streamed response said (StreamState),
                  the record it makes.
* ``records``     one request's raw timings (RequestRecord) and its token timeline.
* ``stats``       latency sample summaries (percentiles).
* ``window``      the steady-state window of a level, its sub-windows and stability.
* ``steady``      levels sized by time: when a running level has measured enough.
* ``uncertainty`` 95 % intervals of a level's metrics.
* ``live_window`` the window of a level still running (early stop inside a level).
* ``metrics``     records → per-level metrics (vLLM's definitions), repeats.
* ``prometheus``  ``/metrics`` text → snapshots and server-side deltas.
* ``results``     what a sweep produced (LevelResult, SweepResult, token agreement), and
                  what in it a trial could not be scored on (``problems``).
* ``host_steadiness`` the host's own CPU spread (`tuner host-check`) and its verdict.

I/O modules:

* ``http_stream``  minimal asyncio HTTP/1.1 client for streamed POSTs.
* ``request``      one streamed request over a stream's keep-alive connection.
* ``streams``      closed-loop streams in one event loop (shared claim counter).
* ``shards``       the same streams sharded over client processes.
* ``closed_loop``  one closed-loop level (``run_level``).
* ``steady_loop``  one closed-loop level sized by time and steady state (``run_steady_level``).
* ``open_loop``    one open-loop rate level (``run_rate_level``).
* ``dataset_file`` reading a study's dataset file.
* ``server_calls`` ``/tokenize`` (prompt fitting, a trace's one-token words) and ``/metrics``
                   scrapes, through httpx;
                   every non-streamed reply read up to a cap (tuner.adapters.http_client).
* ``warmup``       the warm-up before a level.
* ``sweep_context`` what every level of a sweep shares; a level's plan; the server's view after it.
* ``open_levels``  a sweep's open-loop levels: rate levels, the trace level, the max-rate search's.
* ``sweep``        every level of a study's load section against one server (``run_sweep``).
* ``record_files`` records as JSON lines.

Dependencies point down that list's order: pure modules import only pure ones;
``closed_loop`` imports ``shards`` and ``streams``, neither of which imports it.
Nothing is re-exported here, so a client shard's start imports only what it runs.
"""
