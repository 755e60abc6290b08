"""Exceptions raised by the tuner, classified where they are raised.

    TunerError
    ├── SpecError            the study file is invalid (nothing has started)
    ├── StudyError           the study cannot run or resume (locked, missing, mixed)
    │   └── StorageUnavailable   the Optuna storage kept failing; resume when it is back
    └── TrialError           one trial failed; the study goes on
        ├── ServerStartError     the server never became ready
        │   ├── ServerExited         the process exited before readiness
        │   ├── ServerFatalLog       a fatal line appeared in its log
        │   ├── ServerStartTimeout   readiness did not come within the timeout
        │   └── PortInUse            another process owns the port
        ├── ServerDied           the server died after readiness
        ├── GpusNotFree          the previous trial's processes still hold the GPUs
        ├── TrialTimeout         the trial deadline passed
        ├── TrialCancelled       the tuner cancelled the trial (Ctrl-C, deadline backstop)
        └── ArtifactWriteError   the trial's files could not be written (e.g. disk full)

Beside them, ``Terminated`` (a KeyboardInterrupt): SIGTERM, answered like Ctrl-C.

Every TrialError carries a stable ``reason`` id (what the optimizer and the report
show), optionally an excerpt of the server log and, for a failed start, the fatal line's
signature (``tuner.vllm.failure_signatures.FatalSignature`` as JSON).
"""

from __future__ import annotations


class TunerError(Exception):
    """Base of every error the tuner raises on purpose."""


class SpecError(TunerError):
    """The study file is invalid. The message names file, field, value and what is allowed."""


class StudyError(TunerError):
    """The study cannot be started or resumed."""


class StorageUnavailable(StudyError):
    """The Optuna storage failed on every retry. Finished trials are safe; resume later."""


class TrialError(TunerError):
    """A single trial failed. ``reason`` is a stable snake_case id."""

    reason = "trial_error"

    def __init__(self, message: str, *, reason: str | None = None, log_excerpt: str = "") -> None:
        super().__init__(message)
        if reason is not None:
            self.reason = reason
        self.log_excerpt = log_excerpt
        self.signature: dict[str, str] | None = None


class ServerStartError(TrialError):
    reason = "server_start_failed"


class ServerExited(ServerStartError):
    reason = "server_exited"


class ServerFatalLog(ServerStartError):
    reason = "server_fatal_log"


class ServerStartTimeout(ServerStartError):
    reason = "startup_timeout"


class PortInUse(ServerStartError):
    reason = "port_in_use"


class ServerRefusedKey(ServerStartError):
    """The server answers 401/403: it requires an API key the tuner did not send or sent wrong."""

    reason = "unauthorized"


class ServerDied(TrialError):
    reason = "server_died"


class GpusNotFree(TrialError):
    reason = "gpus_not_free"


class TrialTimeout(TrialError):
    reason = "trial_timeout"


class TrialCancelled(TrialError):
    reason = "interrupted"


class ArtifactWriteError(TrialError):
    reason = "artifact_write_failed"


class Terminated(KeyboardInterrupt):
    """SIGTERM arrived (`timeout`, systemd, Kubernetes stopping the run): answered as Ctrl-C
    is, with its own exit code (143). A KeyboardInterrupt, not a TunerError, so every path
    that stops servers on Ctrl-C stops them on it too."""
