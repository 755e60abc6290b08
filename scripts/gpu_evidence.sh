#!/usr/bin/env bash
# Reproduce the project's GPU evidence on a box where vLLM and the tuner already import
# (the offline kit of docs/gpu-box.md, or any install): a real study, its status, report and
# export checked by vLLM's own parser, a confirmation re-run, then the level-stability
# benchmark and the GPU failure scenarios. Every step's output lands in OUT; a step that
# fails is recorded and the next one still runs, so a run cut short keeps what it finished.
#
#   scripts/gpu_evidence.sh [STUDY.yaml] [OUT]
#       STUDY.yaml  default search_spaces/smollm2-h200.yaml;  OUT  default gpu-evidence/
#
# Time is set per step (seconds), so the whole run fits a lease of known length:
#   STUDY_TIMEOUT  (1500)  the study's wall-clock budget (`tuner run --timeout`): after it no
#                          trial starts and the running one finishes, so no trial is lost to
#                          an interrupt; a hard stop follows TRIAL_GRACE (300) s later
#   CONFIRM_LIMIT  (300)   `tuner confirm --candidates 1` (one fresh-server re-run)
#   LEVEL_STARTS   (5)     fresh starts for benchmarks/level_stability.py; LEVEL_LIMIT (700);
#   LEVEL_VALUES   ("enforce_eager=false cudagraph_mode=FULL_AND_PIECEWISE") the point it starts
#   SCENARIOS      (a,b,c,d) scripts/gpu_scenarios.py --only; SCENARIO_LIMIT (600)
#   STEPS          (study,confirm,levels,scenarios) which of them to run, in this order
# On SmolLM2-135M and one H200 (2026-12-02) a trial took 100-210 s, mostly the server's
# start, the reference 113 s, a confirmation re-run 84 s, a level-stability start ~90 s.
set -uo pipefail

STUDY=${1:-search_spaces/smollm2-h200.yaml}
OUT=${2:-gpu-evidence}
PY=${PYTHON:-python3}
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
NAME=$("$PY" -c 'import sys, yaml; print(yaml.safe_load(open(sys.argv[1]))["name"])' "$STUDY") || exit 2
STEPS=${STEPS:-study,confirm,levels,scenarios}

log() { echo "$(date -u +%H:%M:%S) $*" | tee -a "$OUT/steps.txt"; }
want() { [[ ",$STEPS," == *",$1,"* ]]; }
tuner() { "$PY" -m tuner "$@"; }

nvidia-smi --query-gpu=name,memory.used,memory.total,driver_version,clocks.current.sm,clocks.max.sm \
  --format=csv > "$OUT/gpu.txt" 2>&1 || log "nvidia-smi failed (no GPU?)"

if want study; then
  limit=${STUDY_TIMEOUT:-1500}
  log "study $NAME: tuner run --timeout ${limit}s"
  timeout -s INT $((limit + ${TRIAL_GRACE:-300})) "$PY" -m tuner run "$STUDY" --timeout "${limit}s" \
    > "$OUT/run.log" 2>&1
  log "study rc=$?"
  tuner status "$NAME" > "$OUT/status.txt" 2>&1; log "status rc=$?"
  tuner report "$NAME" > "$OUT/report.log" 2>&1; log "report rc=$?"
  { tuner export "$NAME" --pick best-throughput --check --vllm-python "$PY" -o "$OUT/export-best.sh"
    echo "rc=$?"
    tuner export "$NAME" --pick knee --format shell --check --vllm-python "$PY"
    echo "rc=$?"; } > "$OUT/export-check.txt" 2>&1
  log "export --check done"
fi

if want confirm; then
  log "confirm: one fresh-server re-run of the front's first point"
  timeout -s INT "${CONFIRM_LIMIT:-300}" "$PY" -m tuner confirm "$NAME" --candidates 1 > "$OUT/confirm.log" 2>&1
  log "confirm rc=$? (1: not reproduced)"
  tuner status "$NAME" > "$OUT/status.txt" 2>&1
fi
[ -d "results/$NAME" ] && tar --exclude=vllm-cache -czf "$OUT/study.tgz" -C results "$NAME" && log "study.tgz"

if want levels; then
  # The study's compile cache (execution.compile_cache_dir) makes every start a cache hit.
  cache=$("$PY" -c 'import sys, yaml; d = yaml.safe_load(open(sys.argv[1])); print((d.get("execution") or {}).get("compile_cache_dir") or "")' "$STUDY")
  values=${LEVEL_VALUES:-enforce_eager=false cudagraph_mode=FULL_AND_PIECEWISE}
  log "level stability: ${LEVEL_STARTS:-5} fresh starts of $values"
  VLLM_CACHE_ROOT=${cache:-${VLLM_CACHE_ROOT:-}} timeout -s INT "${LEVEL_LIMIT:-700}" "$PY" \
    benchmarks/level_stability.py --study "$STUDY" \
    --values $values \
    --starts "${LEVEL_STARTS:-5}" --out "$OUT/level_stability.json" > "$OUT/level_stability.log" 2>&1
  log "level stability rc=$?"
fi

if want scenarios; then
  log "GPU scenarios ${SCENARIOS:-a,b,c,d}"
  timeout -s INT "${SCENARIO_LIMIT:-600}" "$PY" scripts/gpu_scenarios.py "$STUDY" --out "$OUT/scenarios" \
    --only "${SCENARIOS:-a,b,c,d}" > "$OUT/scenarios.log" 2>&1
  log "scenarios rc=$?"
fi
log "DONE"
