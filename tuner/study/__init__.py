"""The study: its file (spec), its space, the ask/tell policy, scoring, Pareto front, early
stop, confirmation verdicts, and the readers of what a study stored.

Empty on purpose: ``tuner status`` imports some of these modules and must not pay for the
others (pydantic, Optuna)."""
