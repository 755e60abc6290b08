"""The commands a user types: argument parsing, printing and exit codes live here and only
here (``main`` builds the parser and maps errors to exit codes; ``run`` starts, resumes and
confirms studies; ``dry_run`` runs a study file on the simulator).

Empty on purpose: each command imports what it needs inside its function, so ``tuner
status`` answers without paying for Ray, Optuna or pydantic."""
