"""The study's reference: recorded once on a GPU group before the first trial, then every
trial's probe is compared with it.

``prepare_reference`` reuses ``reference.json`` when it still fits the study (resume), else
runs the reference job (``TrialWorker.run_reference``) on an idle group of the study's
executor and keeps what it returned: ``reference_probe.json`` whatever the verdict (the
evidence), ``reference.json`` only for a trusted reference, so resume never reuses a bad
one. What the job needs of the study run is a ``tuner.engine.execution.JobHost``.
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tuner.adapters.artifacts import atomic_write_json
from tuner.engine.execution import Finished, JobHost, NoWorkersLeft
from tuner.errors import ArtifactWriteError, StudyError
from tuner.probe.client import load_probe_items
from tuner.probe.quality_items import QualityReference, quality_items
from tuner.probe.record import Reference
from tuner.probe.recording import load_reference_sources
from tuner.probe.spec import ProbeSpec, fit_to_study, mode_text, resolve_mode
from tuner.probe.verdict import with_reference_accuracy
from tuner.secrets import Redactor, api_key_ref, known_values
from tuner.study.command import ReferenceConfiguration, reference_configuration
from tuner.study.outcome import TrialOutcome, TrialRequest
from tuner.study.quality_plan import reference_plan
from tuner.study.weights import dummy_weights
from tuner.vllm.knobs import RenderedCommand, shell_line

__all__ = ["Prepared", "prepare_reference", "resolve_probe_files", "pinned", "study_probe", "REFERENCE_JOB",
           "WORKER_WAIT_S"]

REFERENCE_JOB = -1  # request number of the reference job (trial numbers start at 0)
WORKER_WAIT_S = 600.0  # no GPU group available for this long: stop (resumably)


def pinned(argv: list[str]) -> list[str]:
    """``argv`` with a relative interpreter path (e.g. .venv-vllm/bin/python, meaning
    "relative to where the tuner was started") made absolute: workers may run elsewhere."""

    if "/" in argv[0] and not os.path.isabs(argv[0]):
        return [os.path.abspath(argv[0]), *argv[1:]]
    return argv


def resolve_probe_files(probe: ProbeSpec, base_dir: Path) -> ProbeSpec:
    """``probe`` with its prompts files (known answers, reference) made absolute against
    ``base_dir`` (the study file's folder) and both read and checked now, so a bad file
    stops the study before any server starts and workers elsewhere find the same file.

    Raises:
        PromptsFileError, ReferencePromptsError: a file is missing or has bad lines.
    """

    update: dict[str, Any] = {}
    if probe.prompts_file:
        update["prompts_file"] = str((base_dir / probe.prompts_file).resolve())
    if probe.reference.prompts_file:
        update["reference"] = probe.reference.model_copy(
            update={"prompts_file": str((base_dir / probe.reference.prompts_file).resolve())})
    resolved = probe.model_copy(update=update)
    if resolved.enabled:
        items = load_probe_items(resolved)
        if resolved.reference.enabled:
            load_reference_sources(resolved, items=items)
    return resolved


def study_probe(spec: Any, probe: ProbeSpec) -> ProbeSpec:
    """``probe`` with its bank fitted to the study (tuner.probe.spec.fit_to_study): its top
    decode batch size is the load's top concurrency, its longest prompt fits the server's
    ``max_model_len``; and its mode resolved for the study's weights (``auto`` on dummy
    weights: reference-only, tuner.study.weights)."""

    levels = list(spec.load.concurrency or ())
    limit = spec.server.flags.get("max_model_len")
    max_len = int(limit) if isinstance(limit, int) or (isinstance(limit, str) and limit.isdigit()) else None
    fitted = fit_to_study(probe, top_concurrency=max(levels) if levels else None, max_model_len=max_len)
    return resolve_mode(fitted, dummy_weights=dummy_weights(spec))


@dataclass(frozen=True)
class Prepared:
    """What every trial's probe is judged with: the probe section (with the reference's
    known-answer accuracy once there is a reference), the reference as JSON (None: known
    answers only) and the reference's answers to the quality items (None: no quality budget)."""

    probe: ProbeSpec
    reference: Reference | None
    quality: QualityReference | None = None


def prepare_reference(host: JobHost, clock: Any) -> Prepared | None:
    """Have the study's reference before the first trial: the stored one when it still
    fits the study, else one recorded now. None when interrupted meanwhile.

    Every trial's probe is then compared with it, and its known-answer accuracy
    replaces the absolute ``min_accuracy`` bar for the trials (within a sample-size
    tolerance). Nothing to record when the probe or its reference layer is off.
    ``clock``: seconds (monotonic), for the wait for a free GPU group.

    Raises:
        SpecError: a prompts file or ``probe.reference.values`` is invalid.
        StudyError: the reference could not be recorded or cannot be trusted.
    """

    spec = host.spec
    if not spec.probe.enabled:
        return Prepared(spec.probe, None)
    # `tuner run` already made the files absolute against the study file; a relative
    # path left (a study created in code) means the current folder. Checked now either
    # way: a bad prompts file must stop the study before any server starts.
    probe = study_probe(spec, resolve_probe_files(spec.probe, Path.cwd()))
    if not probe.reference.enabled:
        return Prepared(probe, None)
    served = spec.server.served_model_name or spec.server.model
    sources = load_reference_sources(probe)
    reference = _stored_reference(host, probe, sources, served)
    quality = None if spec.quality is None else _stored_quality(host, probe)
    if reference is None or (spec.quality is not None and quality is None):
        recorded = _record_reference(host, probe, clock)
        if recorded is None:
            return None
        reference, quality = recorded
    if quality is not None:
        _check_quality(host, quality)
    return Prepared(with_reference_accuracy(probe, reference), reference, quality)


def _stored_reference(host: JobHost, probe: ProbeSpec, sources: list[Any], served: str) -> Reference | None:
    """reference.json when it exists and can judge this study's trials (resume)."""

    path = host.paths.reference_json
    try:
        stored = Reference.model_validate_json(path.read_text())
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        host.progress(f"[reference] {path} is unreadable ({type(exc).__name__}); recording a new reference")
        return None
    why = stored.mismatch(probe, sources, served)
    if why is not None:
        host.progress(f"[reference] the stored reference cannot be used ({why}); recording a new one")
        return None
    accuracy = stored.known_answers_accuracy
    host.progress(f"[reference] reusing {path} ({len(stored.prompts)} prompts"
                  + (f", known-answer accuracy {accuracy:.2f}" if accuracy is not None else "") + ")")
    return stored


def _stored_quality(host: JobHost, probe: ProbeSpec) -> QualityReference | None:
    """quality_reference.json when it holds this study's quality items (resume)."""

    path = host.paths.quality_reference_json
    try:
        stored = QualityReference.model_validate_json(path.read_text())
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        host.progress(f"[reference] {path} is unreadable ({type(exc).__name__}); recording the reference again")
        return None
    assert host.spec.quality is not None
    why = stored.mismatch(quality_items(probe, host.spec.quality.max_items))
    if why is not None:
        host.progress(f"[reference] the stored quality answers cannot be used ({why}); recording the reference again")
        return None
    return stored


def _check_quality(host: JobHost, quality: QualityReference) -> None:
    """Stop the study when the reference itself scores below ``quality.min_reference_accuracy``
    on the quality items: a budget of accuracy points on a model that gets most questions
    wrong measures nothing (a configuration cannot lose what the model never had)."""

    budget = host.spec.quality
    if budget is None:
        return
    accuracy, n = quality.accuracy, len(quality.answers)
    if accuracy < budget.min_reference_accuracy:
        raise StudyError(
            f"the reference configuration answered {accuracy:.2f} of the {n} quality items right, below "
            f"quality.min_reference_accuracy {budget.min_reference_accuracy:g}: an accuracy budget means "
            "nothing on questions the model mostly gets wrong. Lower quality.min_reference_accuracy if the "
            f"model is this weak, or use a stronger model. Its answers: {host.paths.quality_reference_json}")
    host.progress(f"[reference] quality items: {accuracy:.2f} of {n} answered right; lossy trials may lose "
                  f"at most {budget.max_accuracy_drop:g} of it (quality.max_accuracy_drop)")


def _record_reference(host: JobHost, probe: ProbeSpec,
                      clock: Any) -> tuple[Reference, QualityReference | None] | None:
    """Run the reference job on a GPU group and keep its result (the reference, and its
    answers to the quality items); None when interrupted."""

    spec, executor = host.spec, host.executor
    stop_grace = spec.server.stop_timeout
    waiting_since = clock()
    try:
        while not executor.idle_groups():
            if host.interrupted():
                return None
            if clock() - waiting_since > WORKER_WAIT_S:
                raise StudyError(
                    f"no GPU group became available in {WORKER_WAIT_S:.0f}s to record the reference; "
                    f"continue with `tuner resume {host.name}` when the cluster is back")
            executor.poll(0.5, stop_grace_s=stop_grace)
        group = executor.idle_groups()[0]
        port = spec.server.port + group
        config = reference_configuration(spec, port=port, compile_cache_dir=spec.execution.compile_cache_dir)
        config = dataclasses.replace(config, argv=pinned(config.argv))
        served = spec.server.served_model_name or spec.server.model
        # The reference server is judged by the absolute bar (min_accuracy): a
        # reference accuracy, even one set in the study file, is what it establishes.
        probe = probe.model_copy(update={"reference_accuracy": None})
        secrets = known_values(spec.server)
        request = TrialRequest(
            study=host.name, run=host.run, number=REFERENCE_JOB, kind="reference", values=config.values,
            asked=Redactor(secrets).data(config.asked), argv=config.argv, env=config.env,
            secret_env=list(spec.server.secret_env), secrets=secrets, api_key_ref=api_key_ref(spec.server),
            host=spec.server.host, port=port,
            served_model_name=served, trial_dir=str(host.paths.reference_dir.resolve()),
            startup_timeout_s=spec.server.startup_timeout, stop_timeout_s=stop_grace,
            gpu_free_timeout_s=spec.execution.gpu_free_timeout,
            deadline_s=spec.budget.trial_timeout, load=spec.load, probe=probe, ignore_eos=True,
            prestart=spec.execution.startup.prestart,
            searched_env=spec.searched_env, quality=reference_plan(spec),
        )
        host.progress(f"[reference] recording the study's reference on group {group}: {config.label}")
        executor.submit(group, request.model_dump(mode="json"), method="run_reference",
                        deadline_s=spec.budget.trial_timeout + stop_grace + 15)
        while True:
            if host.interrupted():
                executor.cancel_all(wait_s=stop_grace + 30)
                return None
            for item in executor.poll(0.5, stop_grace_s=stop_grace):
                return _keep_reference(host, item, config, probe)
    except NoWorkersLeft as exc:
        raise StudyError(str(exc)) from exc
    except KeyboardInterrupt:
        # Second Ctrl-C: the reference server goes now, not after its grace.
        host.kill_now()
        raise


def _keep_reference(host: JobHost, item: Finished, config: ReferenceConfiguration,
                    probe: ProbeSpec) -> tuple[Reference, QualityReference | None] | None:
    """Save what the reference job returned; the reference when it can be trusted, with its
    answers to the quality items (written whatever they score: the evidence)."""

    paths = host.paths
    log = paths.reference_dir / "server.log"
    if item.result is None:
        if item.error == "interrupted":
            return None
        raise StudyError(f"recording the reference failed ({item.error}): {item.message}. "
                         f"`tuner resume {host.name}` records it again")
    outcome = TrialOutcome.model_validate(item.result["outcome"])
    if outcome.status == "failed":
        if outcome.reason == "interrupted":
            return None
        raise StudyError(
            f"the reference configuration ({config.label}) failed in phase {outcome.phase} "
            f"({outcome.reason}): {outcome.message}. Its server log is {log}; "
            f"`tuner resume {host.name}` records it again")
    problem = item.result.get("problem")
    raw = item.result.get("reference")
    reference = None if raw is None else Reference.model_validate(raw).model_copy(
        update={"label": config.label})
    _write(host, paths.reference_probe_json, {
        "trusted": problem is None,
        "problem": problem,
        "label": config.label,
        "values": config.values,
        # Status and report say it: dummy weights, known answers not judged.
        "probe_mode": mode_text(probe, dummy_weights=dummy_weights(host.spec)),
        "command": shell_line(RenderedCommand(*Redactor(known_values(host.spec.server)).data(
            [config.argv, config.env]))),
        "startup_s": outcome.startup_s,
        "probe_s": outcome.probe_s,
        "record_seconds": None if reference is None else reference.record_seconds,
        "known_answers": item.result.get("known_answers"),
        "self_check": item.result.get("self_check"),
        "reference": None if problem is None else raw,  # kept only when refused
    })
    if problem is not None or reference is None:
        raise StudyError(
            f"{problem or 'the reference job returned no reference'}.\nComparing trials with a "
            f"broken reference proves nothing, so the study stops. Details: {paths.reference_probe_json}, "
            f"server log {log}")
    quality = _keep_quality(host, item.result.get("quality"), config)
    _write(host, paths.reference_json, reference.model_dump(mode="json"))
    accuracy = reference.known_answers_accuracy
    judged = (mode_text(probe, dummy_weights=dummy_weights(host.spec)) if probe.reference_only
              else f"known-answer accuracy {accuracy if accuracy is None else round(accuracy, 2)}")
    host.progress(
        f"[reference] recorded {len(reference.prompts)} prompts in {outcome.trial_s or 0:.1f}s "
        f"({judged}, agrees with itself); every trial is compared with it")
    return reference, quality


def _keep_quality(host: JobHost, raw: Any, config: ReferenceConfiguration) -> QualityReference | None:
    """quality_reference.json from the reference job's answers (a study with a quality budget)."""

    if host.spec.quality is None:
        return None
    if raw is None:
        raise StudyError("the reference job returned no answers to the quality items; "
                         f"`tuner resume {host.name}` records the reference again")
    quality = QualityReference.model_validate(raw).model_copy(update={"label": config.label})
    _write(host, host.paths.quality_reference_json, quality.model_dump(mode="json"))
    return quality


def _write(host: JobHost, path: Path, data: Any) -> None:
    try:
        atomic_write_json(path, data)
    except ArtifactWriteError as err:
        # Without its files the reference could not be reused or inspected: stop here,
        # resumably, rather than judge trials by a record that exists nowhere.
        raise StudyError(f"could not write {path} ({err.reason}): {err}; free space, then "
                         f"`tuner resume {host.name}` records the reference again") from err
