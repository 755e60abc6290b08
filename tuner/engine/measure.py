"""``tuner measure``: a study file's measurement against a server that is already running.

No server is started, stopped or verified: this runs the study's load profile (and, when
asked, its correctness probe) against ``url`` exactly as a trial would, writes the same
files a trial writes, and returns a summary. Use it to measure a hand-started server, to
check a study file's load section before a long run, or to compare with other tools.

Files written into ``out_dir``:

* ``requests-c{C}.jsonl`` / ``requests-r{rate}.jsonl`` / ``requests-trace.jsonl``  raw
  per-request records of each closed-loop / open-loop rate level / the trace replay (JSON lines);
* ``metrics.json``          the sweep without records (levels, windows, server-side
  deltas, token agreement, warm-up, warnings), as a trial's ``metrics.json``;
* ``probe.json``            the probe result (with ``probe``);
* ``summary.json``          what :func:`measure` returns.

A measurement a trial could not be scored on (failed requests, token counts the server was
not believed on: :meth:`SweepResult.problems`) is still written, and listed in the
summary's ``problems``; ``tuner measure`` then exits 4 with one line per problem.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx

from tuner.adapters.artifacts import atomic_write_json, make_private_dir
from tuner.adapters.http_client import ReplyTooLarge, capped_request, server_client
from tuner.load.max_rate_text import max_rate_text
from tuner.load.protocol import server_root
from tuner.load.record_files import write_records_jsonl
from tuner.load.results import SweepResult, level_key
from tuner.load.server_calls import scrape_metrics
from tuner.load.sweep import run_sweep
from tuner.secrets import api_key, api_key_ref, bearer, known_values
from tuner.study.spec import StudySpec

__all__ = ["MeasureError", "discover_model", "files_in_the_way", "format_summary", "measure",
           "study_headers"]

_TIMEOUT_S = 30.0
# Flat metrics shown per level in the summary (all of flat() is in metrics.json).
_SHOWN = ("output_tok_s", "run_output_tok_s", "request_per_s", "ttft_ms.p50", "ttft_ms.p90",
          "tpot_ms.p50", "tpot_ms.mean", "itl_ms.p50", "e2el_ms.p50", "completed", "failed",
          "stability_ratio")


class MeasureError(Exception):
    """The server cannot be measured (unreachable, or no usable model); the message says why."""


async def discover_model(
    client: httpx.AsyncClient, base_url: str, wanted: list[str]
) -> tuple[str, list[str]]:
    """The model name to send: the first of ``wanted`` the server lists, else its only model.

    Returns (name, listed names).

    Raises:
        MeasureError: /v1/models unreachable or unusable, or several models and none wanted.
    """
    try:
        resp = await capped_request(client, "GET", server_root(base_url) + "/v1/models", timeout=_TIMEOUT_S)
    except (httpx.HTTPError, ReplyTooLarge) as exc:
        raise MeasureError(f"{base_url}: cannot reach /v1/models ({type(exc).__name__}: {exc})") from exc
    if resp.status_code in (401, 403):
        how = "refused the API key sent" if client.headers.get("Authorization") else "wants an API key, none was sent"
        raise MeasureError(f"{base_url}/v1/models answered HTTP {resp.status_code}: the server {how}; give its "
                           "key as the study's server.flags.api_key, e.g. '${VLLM_API_KEY}' set in this environment")
    if resp.status_code != 200:
        raise MeasureError(f"{base_url}/v1/models answered HTTP {resp.status_code}: {resp.text[:200]}")
    try:
        data = resp.json()
        listed = [str(m["id"]) for m in data["data"]]
    except (ValueError, KeyError, TypeError) as exc:
        raise MeasureError(f"{base_url}/v1/models is not an OpenAI model list: {resp.text[:200]}") from exc
    for name in wanted:
        if name in listed:
            return name, listed
    if len(listed) == 1:
        return listed[0], listed
    raise MeasureError(
        f"{base_url} serves {listed or 'no models'}; none is the study's "
        f"{' / '.join(repr(w) for w in wanted)}. Set server.served_model_name in the study file."
    )


def study_headers(spec: StudySpec, environ: Mapping[str, str]) -> dict[str, str]:
    """The Authorization header for the study's API key (server.flags.api_key or
    VLLM_API_KEY, a reference read from ``environ``), else for VLLM_API_KEY in ``environ``,
    as a server started with ``--api-key`` wants it; empty without a key."""

    return bearer(api_key(api_key_ref(spec.server), known_values(spec.server), environ))


async def _speculative(client: httpx.AsyncClient, base_url: str) -> bool | None:
    """Whether the server runs speculative decoding, from its /metrics; None if unknown."""
    snap = await scrape_metrics(client, base_url)
    if snap is None:
        return None
    return snap.has("vllm:spec_decode_num_drafts_total")


async def _measure(url: str, spec: StudySpec, probe: bool, out_dir: Path, deadline_s: float | None,
                   headers: dict[str, str] | None, speculative: bool | None) -> dict[str, Any]:
    began = time.monotonic()
    started_at = datetime.now(UTC).isoformat()
    notes: list[str] = []
    wanted = [n for n in (spec.server.served_model_name, spec.server.model) if n]
    async with server_client(headers=headers) as client:
        model, listed = await discover_model(client, url, wanted)
        if model not in wanted:
            notes.append(
                f"the server does not list {' / '.join(wanted)}; measured its only model {model!r}"
            )
        detected = await _speculative(client, url) if speculative is None else speculative
    # Created only once the server answered, so an unreachable server leaves no empty folder.
    make_private_dir(out_dir)
    if detected is None:
        notes.append("speculative decoding unknown (no /metrics): assumed off for ignore_eos")
    ignore_eos = spec.load.workload.resolve_ignore_eos(speculative=bool(detected))

    probe_summary: dict[str, Any] | None = None
    if probe:
        from tuner.probe.client import run_probe

        result = await run_probe(server_root(url), model, spec.probe, deadline_s=deadline_s,
                                 headers=headers)
        atomic_write_json(out_dir / "probe.json", result.model_dump(mode="json"))
        probe_summary = {
            "passed": result.passed,
            "reason": result.reason,
            "accuracy": result.accuracy,
            "correct": result.correct,
            "total": result.total,
            "seconds": result.probe_seconds,
        }
    remaining = None
    if deadline_s is not None:
        remaining = max(1.0, deadline_s - (time.monotonic() - began))
    sweep = await run_sweep(server_root(url), model, spec.load, ignore_eos=ignore_eos,
                            deadline_s=remaining, headers=headers, slo=spec.slo,
                            max_rate=spec.load.rate_search if spec.searches_max_rate else None)
    levels = _write_levels(out_dir, sweep)
    atomic_write_json(out_dir / "metrics.json", sweep.summary())
    summary: dict[str, Any] = {
        "url": url,
        "model": model,
        "models_listed": listed,
        "study": spec.name,
        "started_at": started_at,
        "duration_s": time.monotonic() - began,
        "speculative": detected,
        "ignore_eos": ignore_eos,
        "api": spec.load.api,
        "probe": probe_summary,
        "levels": levels,
        "slo": None if spec.slo is None else spec.slo.text(),
        "max_rate": None if sweep.max_rate is None else sweep.max_rate.model_dump(mode="json"),
        "skipped_levels": sweep.skipped_levels,
        "problems": sweep.problems(),
        "warnings": notes + sweep.warnings,
        "out_dir": str(out_dir),
    }
    atomic_write_json(out_dir / "summary.json", summary)
    return summary


# What a trial folder holds besides what measure writes: a folder with one of these is a
# trial's (tuner.adapters.artifacts), whose measurements must not be replaced.
_TRIAL_FILES = ("outcome.json", "command.json", "verification.json", "server.log")


def files_in_the_way(out_dir: Path) -> list[str]:
    """The files in ``out_dir`` a measurement would overwrite, or that make it a trial's
    folder (sorted names; empty when the folder is new or holds none of them)."""

    if not out_dir.is_dir():
        return []
    ours = {"summary.json", "metrics.json", "probe.json", *_TRIAL_FILES}
    return sorted(p.name for p in out_dir.iterdir()
                  if p.name in ours or (p.name.startswith("requests-") and p.name.endswith(".jsonl")))


def _write_levels(out_dir: Path, sweep: SweepResult) -> dict[str, Any]:
    """Write each level's records file; return the levels' entries of the summary, by name."""
    levels: dict[str, Any] = {}
    # Closed-loop levels are named by their concurrency, open-loop ones by their rate (r2.0)
    # or as the trace.
    named = [(level_key(lv), lv) for lv in (*sweep.levels, *sweep.rate_levels)]
    for name, lv in named:
        prefix = "" if lv.open_loop else "c"
        write_records_jsonl(out_dir / f"requests-{prefix}{name}.jsonl", lv.records)
        m = lv.metrics
        levels[name] = {
            "metrics": {k: (None if math.isnan(v) else v) for k, v in m.flat().items()},
            "window_s": m.window_s,
            "window_fallback_reason": m.window_fallback_reason,
            "unstable": m.unstable,
            "low_confidence_p99": m.ttft_ms.low_confidence_p99,
            "failure_reasons": m.failure_reasons,
            "token_agreement": lv.token_agreement.agree,
            "token_relative_diff": lv.token_agreement.relative_diff,
            "deadline_hit": lv.deadline_hit,
            "prompts_fitted": lv.prompts_fitted,
            "repeats": m.repeats.n if m.repeats else 1,
            # what the server's prefix cache served of the level's prompts (None without /metrics)
            "prefix_cache_hit_rate": (lv.server_side or {}).get("prefix_cache_hit_rate"),
        }
    return levels


def measure(
    url: str,
    spec: StudySpec,
    *,
    probe: bool,
    out_dir: Path,
    deadline_s: float | None = None,
    headers: dict[str, str] | None = None,
    speculative: bool | None = None,
) -> dict[str, Any]:
    """Run ``spec``'s load profile (and with ``probe`` its probe) against ``url``.

    Args:
        url: the running OpenAI-compatible server, ``http://host:port`` (``/v1`` accepted).
        spec: the study; its ``load`` and ``probe`` sections are used, and the model name
            is ``server.served_model_name`` or ``server.model`` if the server lists it,
            else the server's only model.
        probe: also run the correctness probe first.
        out_dir: folder for the files (created).
        deadline_s: time budget for probe + load; None = the load's own limits only.
        headers: extra HTTP headers (e.g. ``Authorization``).
        speculative: whether the server decodes speculatively (for ``ignore_eos: auto``);
            None = detect from its /metrics.

    Returns:
        The JSON-ready summary also written to ``out_dir/summary.json``.

    Raises:
        MeasureError: the server is unreachable or serves no usable model.
    """
    return asyncio.run(_measure(url, spec, probe, Path(out_dir), deadline_s, headers, speculative))


def _fmt(v: Any, digits: int = 1) -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        if math.isnan(v):
            return "-"
        return f"{v:,.{digits}f}"
    return str(v)


def _slo_cells(m: dict[str, Any]) -> list[str]:
    met = m.get("slo_met")
    attained = m.get("slo_attained")
    return [_fmt(m.get("goodput_req_s"), 2),
            "-" if attained is None else f"{attained:.0%}",
            "-" if met is None else ("met" if met else "MISSED")]


def format_summary(summary: dict[str, Any]) -> str:
    """Human-readable text of a :func:`measure` summary (what ``tuner measure`` prints)."""
    lines = [
        f"measured {summary['url']}  model {summary['model']}  api {summary['api']}  "
        f"ignore_eos {summary['ignore_eos']}  ({summary['duration_s']:.1f} s)",
    ]
    p = summary.get("probe")
    if p is not None:
        verdict = "passed" if p["passed"] else "FAILED"
        lines.append(f"probe {verdict}: {p['correct']}/{p['total']} correct "
                     f"({p['accuracy']:.0%}) - {p['reason']}")
    header = ["level", "out tok/s", "run tok/s", "req/s", "TTFT p50", "TTFT p90", "TPOT p50",
              "TPOT mean", "ITL p50", "E2EL p50", "ok", "failed", "stab.", "±tok/s", "notes"]
    slo = summary.get("slo")
    if slo:
        # Goodput columns before the notes: requests/s within the SLO, share within it.
        header[-1:-1] = ["good req/s", "in SLO", "SLO"]
    rows = [header]
    for c, lv in summary["levels"].items():
        m = lv["metrics"]
        notes = []
        if lv["unstable"]:
            notes.append("unstable")
        if m.get("client_bound") == 1.0:
            notes.append(f"client-bound (loop lag p99 {_fmt(m['client_lag_ms.p99'], 1)} ms)")
        if m.get("burst_requests"):
            notes.append(f"{int(m['burst_requests'])} burst replies (no TPOT)")
        if lv["window_fallback_reason"]:
            notes.append("no steady window")
        if lv["low_confidence_p99"]:
            notes.append("p99 low-conf")
        if m.get("token_mismatch"):
            notes.append(f"{int(m['token_mismatch'])} token counts not believed")
        if lv["token_agreement"] is False:
            notes.append(f"tokens differ {lv['token_relative_diff']:.1%} from server")
        if lv["deadline_hit"]:
            notes.append("cut by deadline")
        hit = lv.get("prefix_cache_hit_rate")
        if hit:   # the server's prefix cache served part of the prompts (shared prefixes, turns)
            notes.append(f"prefix cache {hit:.0%}")
        if lv["repeats"] > 1:
            cv = m.get("output_tok_s_cv")
            notes.append(f"median of {lv['repeats']}" + (f", cv {cv:.1%}" if cv is not None else ""))
        rows.append([
            c, _fmt(m["output_tok_s"]), _fmt(m["run_output_tok_s"]), _fmt(m["request_per_s"], 2),
            _fmt(m["ttft_ms.p50"]), _fmt(m["ttft_ms.p90"]), _fmt(m["tpot_ms.p50"], 2),
            _fmt(m["tpot_ms.mean"], 2), _fmt(m["itl_ms.p50"], 2), _fmt(m["e2el_ms.p50"]),
            _fmt(int(m["completed"])), _fmt(int(m["failed"])),
            "inf" if lv["unstable"] and m["stability_ratio"] is None
            else _fmt(m["stability_ratio"], 2),
            _fmt(m.get("output_tok_s.ci95")),
            *(_slo_cells(m) if slo else []),
            ", ".join(notes),
        ])
    widths = [max(len(r[i]) for r in rows) for i in range(len(header))]
    for i, r in enumerate(rows):
        cells = [r[j].rjust(widths[j]) if j < len(header) - 1 else r[j] for j in range(len(r))]
        lines.append("  ".join(cells).rstrip())
        if i == 0:
            lines.append("  ".join("-" * w for w in widths[:-1]) + "  " + "-" * 5)
    lines.append("times in ms; out tok/s = steady-state window (±tok/s: its 95 % interval), run"
                 " tok/s = vLLM-style whole run;"
                 " level = concurrency, rN = open loop at N requests/s, trace = the dataset's timestamps")
    if slo:
        lines.append(f"SLO {slo}: good = a request within every bound (vllm bench serve "
                     "--goodput); SLO = the level's statistics meet it")
    if summary.get("max_rate"):
        lines.append(max_rate_text(summary["max_rate"]))
    if summary["skipped_levels"]:
        lines.append(f"skipped levels (budget): {summary['skipped_levels']}")
    for w in summary["warnings"]:
        lines.append(f"warning: {w}")
    lines.append(f"files in {summary['out_dir']}")
    return "\n".join(lines)
