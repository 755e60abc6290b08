"""The correctness probe: is this fast server also a correct one?

Pure modules (no I/O): ``spec`` (the study file's ``probe:`` section), ``items`` (the
known-answer questions), ``checks`` (answer rules), ``prompts_file`` (the study's own
prompt files, parsed), ``known_score`` (known-answer verdict), ``record`` (the reference
record), ``wire`` (request bodies, reply parsers), ``compare`` (one answer against the
reference), ``selection`` (which prompts are recorded and sent), ``reference_score``
(reference-agreement verdict), ``verdict`` (both layers combined; trusting the reference).

I/O modules: ``http`` (client, POST, timeouts), ``client`` (known answers against a
server), ``recording`` (recording the reference and its self-check), ``correctness`` (a
trial's whole probe).
"""
