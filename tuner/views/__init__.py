"""Read-only views of a study: ``status`` (progress, front, per-trial lines), ``report``
(HTML and Markdown) with ``plots``, ``export`` (the chosen configuration as a command) with
``export_formats`` (shell, env, json, yaml, systemd; pure) and ``export_check`` (vLLM's own
parser run on an export). They read what the engine stored; they start nothing."""
