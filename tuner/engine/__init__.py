"""The engine that runs a study: ``orchestrator`` (the ask → run → tell loop and the study
run around it) over an ``execution`` protocol, ``ray_executor`` (one Ray actor per GPU group),
``worker`` (one trial end to end), ``referencing`` (the study's reference), ``confirming`` and
``tie_runs`` (re-runs on fresh servers), ``recovery`` and ``runfile`` (what a killed run
left), ``samplers`` (the Optuna samplers) and ``measure`` (a running server measured with a
study's load). The decisions it applies are tuner.study's, pure."""
