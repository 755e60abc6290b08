"""The pure performance model and effective-config resolution, checked against the field
notes (computed directly, no server)."""

import pytest

from tuner.sim import effective_config, estimate, load_profile
from tuner.sim.effective import ConfigError
from tuner.sim.perf_model import CostModel, StepShape, Workload

GLM = load_profile("glm5-8xpcie")
TINY = load_profile("tiny-cpu")
BASE = ["--model", "/models/glm5", "-tp", "8"]
NGRAM4 = ["--speculative-config", '{"method": "ngram", "num_speculative_tokens": 4, '
          '"prompt_lookup_min": 2, "prompt_lookup_max": 4}']


def eff(argv=(), env=None, profile=GLM, base=BASE):
    return effective_config([*base, *argv], env or {}, profile)


def c1(argv=(), env=None, profile=GLM, base=BASE, wl=None):
    e = eff(argv, env, profile, base)
    return estimate(profile, e.perf, wl or Workload(requests_per_stream=10),
                    concurrencies=(1,))["output_tok_s"][1]


def near(value, target, tol=0.10):
    return abs(value - target) <= tol * target


def test_single_stream_calibration():
    eager, graphs, ll = c1(["--enforce-eager"]), c1(), c1(env={"NCCL_PROTO": "LL"})
    assert near(eager, 20.0) and near(graphs, 42.7) and near(ll, 57.0)
    assert graphs / eager == pytest.approx(2.14, rel=0.1)
    step = CostModel(GLM, eff(["--enforce-eager"]).perf).step_ms(StepShape(decode_seqs=1))
    assert step == pytest.approx(50.5, rel=0.03)   # 29 ms compute + 157 x 135 us all-reduce


def test_concurrency_table_calibration():
    e = eff()
    table = {1: (10, 42.7, 3.00), 2: (5, 71.5, 3.58), 10: (3, 128.7, 9.93), 64: (3, 303.7, 26.96)}
    for c, (per_stream, tok_s, latency) in table.items():
        lv = estimate(GLM, e.perf, Workload(requests_per_stream=per_stream),
                      concurrencies=(c,))["levels"][c]
        assert near(lv.output_tok_s, tok_s), (c, lv)
        assert near(lv.mean_latency_s, latency, 0.12), (c, lv)
    wl = Workload(requests_per_stream=4, output_jitter=0.1)
    sat = estimate(GLM, e.perf, wl, concurrencies=(256, 1024))["levels"]
    for c in (256, 1024):
        assert near(sat[c].steady_output_tok_s, 1065), (c, sat[c])


def test_graph_modes_rank_like_the_field_notes():
    fp = c1()
    assert c1(["-cc.cudagraph_mode=PIECEWISE"]) < 0.92 * fp          # attention outside graphs
    assert near(c1(["-cc.cudagraph_mode=FULL_DECODE_ONLY"]), fp, 0.02)
    assert c1(["-cc.cudagraph_mode=NONE"]) < 0.6 * fp                  # compiled, no graphs
    assert abs(c1(env={"NCCL_ALGO": "Tree"}) - fp) < 0.1 * fp          # small difference
    e_fdo = eff(["-cc.cudagraph_mode=FULL_DECODE_ONLY"])
    cost, cost_fp = CostModel(GLM, e_fdo.perf), CostModel(GLM, eff().perf)
    prefill = StepShape(prefill_tokens=300, prefill_seqs=1, uniform_decode=False)
    assert cost.step_ms(prefill) > cost_fp.step_ms(prefill)          # slower prefill


def test_ngram_content_dependence_and_concurrency():
    copy = Workload(requests_per_stream=3, ngram_hit_rate=0.9, ngram_accept_prob=0.8)
    open_ = Workload(requests_per_stream=3, ngram_hit_rate=0.1, ngram_accept_prob=0.2)
    base = c1(wl=open_)
    assert c1(NGRAM4, wl=copy) > 1.5 * base
    assert c1(NGRAM4, wl=open_) < base
    e, e0 = eff(NGRAM4), eff()
    assert estimate(GLM, e.perf, open_, (64,))["output_tok_s"][64] < \
        estimate(GLM, e0.perf, open_, (64,))["output_tok_s"][64]
    # verifying drafts costs little at batch 1 and much more at batch 256
    cost = CostModel(GLM, e.perf)
    extra1 = cost.step_ms(StepShape(1, 4, uniform_decode=True)) - cost.step_ms(StepShape(1))
    extra256 = cost.step_ms(StepShape(256, 1024)) - cost.step_ms(StepShape(256))
    assert extra256 > 5 * extra1


def test_tiny_cpu_profile():
    base = ["--model", "/models/smol"]
    assert near(c1(["--enforce-eager"], profile=TINY, base=base), 20.0)
    e = eff(["-cc.cudagraph_mode=FULL"], profile=TINY, base=base)
    assert e.cudagraph_mode == "NONE" and e.cudagraph_mode_config == "NONE"
    assert not [n for n in e.notices if "udagraph" in n.text]          # silent on CPU
    assert e.disable_custom_all_reduce and e.compile_mode == 2
    st = TINY.startup
    eager_s = st.api_init_s + st.engine_init_s + st.weight_load_s + st.profile_run_s + \
        st.kv_init_s + st.server_start_s
    assert eager_s == pytest.approx(30) and eager_s + st.dynamo_s + st.inductor_s == pytest.approx(85)


def test_effective_downgrades_and_allreduce():
    e = eff()
    assert e.allreduce_backends == ("PYNCCL",) and not e.disable_custom_all_reduce
    assert any("more than two PCIe-only GPUs" in n.text for n in e.notices_for("comm"))
    assert len(e.capture_sizes) == 51 and e.max_capture_size == 512
    full = eff(["-cc.cudagraph_mode=FULL"])
    assert full.cudagraph_mode_config == "FULL" and full.cudagraph_mode == "FULL_AND_PIECEWISE"
    assert any(n.text.startswith("CUDAGraphMode.FULL is not supported with TritonMLABackend "
                                 "backend (support: AttentionCGSupport.UNIFORM_BATCH); setting "
                                 "cudagraph_mode=FULL_AND_PIECEWISE") for n in full.notices)
    o0 = eff(["-O0", "-cc.cudagraph_mode=FULL_AND_PIECEWISE"])
    assert o0.cudagraph_mode == "FULL_DECODE_ONLY"
    assert any("not compatible with compilation mode 0" in n.text for n in o0.notices)
    spec = eff(NGRAM4)
    assert not spec.async_scheduling and len(spec.capture_sizes) == 48
    assert max(spec.capture_sizes) == 500


def test_nccl_env_effects_and_failures():
    assert eff(env={"NCCL_PROTO": "LL128"}).corruption
    assert eff(env={"NCCL_PROTO": "^LL128"}).corruption is None
    assert eff(["--disable-custom-all-reduce"], {"NCCL_PROTO": "LL128"}).corruption
    bad = eff(env={"NCCL_ALGO": "NVLS"}).failure
    assert bad is not None and "ncclInvalidUsage" in bad.message
    assert eff(env={"NCCL_ALGO": "ring,tree;allreduce:tree"}).nccl.algo == "Tree"


def test_config_time_failures():
    with pytest.raises(ConfigError, match="without speculative model"):
        eff(["--speculative-config", '{"method": "eagle3", "num_speculative_tokens": 3}'])
    with pytest.raises(ConfigError, match="Unsupported speculative method: 'mtp'"):
        eff(["-sc.method=mtp"], profile=TINY, base=["--model", "m"])
    with pytest.raises(ConfigError) as exc:
        eff(["--spec-method", "suffix"])
    assert exc.value.failure.exc_type == "ImportError"
    assert eff(["-sc.method=mtp", "-sc.num_speculative_tokens=1"]).spec.method == "mtp"
    assert eff(base=["--model", "m"]).failure.exc_type == "torch.OutOfMemoryError"  # TP 1
    assert "less than desired GPU memory" in eff(["--gpu-memory-utilization", "0.999"]).failure.message


def test_silent_downgrade_fault_changes_effective_value_without_notice():
    env = {"TUNER_SIM_FAULTS": '[{"fault": "silent_downgrade", "when": {"enforce_eager": false},'
                               ' "target": "compilation_config.cudagraph_mode", "value": "PIECEWISE"}]'}
    e = eff(env=env)
    assert e.cudagraph_mode_config == "PIECEWISE" and e.cudagraph_mode == "PIECEWISE"
    assert not any("PIECEWISE" in n.text for n in e.notices)
    assert eff(["--enforce-eager"], env=env).cudagraph_mode == "NONE"


def test_the_package_exports_are_listed_and_resolve() -> None:
    import tuner.sim

    assert tuner.sim.__all__ == sorted(tuner.sim._EXPORTS)
    for name in tuner.sim.__all__:
        assert getattr(tuner.sim, name) is not None, name
