"""What one engine step and one engine configuration look like to the performance model.

Kept apart from ``perf_model`` (the cost of a step) so that ``scheduler`` (which builds the
steps) and ``perf_model`` (which drives the scheduler) do not import each other.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["PerfConfig", "StepShape"]


@dataclass(frozen=True)
class PerfConfig:
    """The slice of the effective configuration that decides speed (built by effective.py)."""

    tp: int = 1
    pp: int = 1
    compile_mode: int = 3                 # CompilationMode value; 0 = no torch.compile
    cudagraph_mode: str = "FULL_AND_PIECEWISE"   # final mode, after every downgrade
    max_capture_size: int = 512
    allreduce_backends: tuple[str, ...] = ("PYNCCL",)   # dispatch order actually in use
    nccl_protos: tuple[str, ...] | None = None  # None: NCCL default; else the enabled set
    nccl_algo: str = "Ring"
    nccl_p2p_disabled: bool = False
    nccl_max_channels: int | None = None
    spec_method: str | None = None
    num_spec_tokens: int = 0
    prompt_lookup_min: int = 5
    prompt_lookup_max: int = 5
    async_scheduling: bool = True
    kv_fp8: bool = False
    weights_factor: float = 1.0         # share of weight-streaming time left (fp8 weights: less)
    activation_bytes: int = 2
    max_num_seqs: int = 256
    max_num_batched_tokens: int = 8192
    kv_capacity_tokens: int = 1_000_000
    block_size: int = 16
    enable_prefix_caching: bool = True


@dataclass(frozen=True)
class StepShape:
    decode_seqs: int = 0
    draft_tokens: int = 0
    prefill_tokens: int = 0
    prefill_seqs: int = 0
    context_tokens: int = 0       # KV tokens read by the decode sequences
    uniform_decode: bool = True   # every decode sequence has the same query length, no prefill

    @property
    def tokens(self) -> int:
        return self.decode_seqs + self.draft_tokens + self.prefill_tokens
