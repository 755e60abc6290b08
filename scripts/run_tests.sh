#!/usr/bin/env bash
# The whole test suite as CI runs it, in two lanes side by side:
#  - the real-vLLM lane: the tests that start a real vLLM CPU server (`-m realvllm`), one at a
#    time (each server's threads spin on both cores), then the tests marked quiethost, which
#    judge the simulator's timing and must not share the host with a vLLM server: they run
#    after the last one, two at a time (they mostly wait on simulated time);
#  - all the others (`-m "not realvllm and not quiethost"`): simulator, Ray and CLI processes
#    that mostly wait (0.6 of one core busy on average, measured), so they run in
#    $TEST_WORKERS pytest-xdist workers (default 2), a test file per worker at a time.
# One lane after the other took 80-88 min; side by side, with one worker each, 50 min.
# Extra arguments go to every pytest process (paths, -x, -k ...; not -m, not -n).
#
#   scripts/run_tests.sh [PYTEST ARGS...]
#
# The real-vLLM lane writes to $TEST_LOG_DIR/realvllm.log (default .test-logs/), printed
# when both lanes are done. Exit status: non-zero if any part failed ("no tests collected"
# in one part is not a failure when another part ran tests).
set -uo pipefail
cd "$(dirname "$0")/.."
py=${PYTHON:-python}
logs=${TEST_LOG_DIR:-.test-logs}
workers=${TEST_WORKERS:-2}
mkdir -p "$logs"

real_lane() {
    "$py" -m pytest -m "realvllm" "$@"
    local real=$?
    "$py" -m pytest -m "quiethost and not realvllm" -n "$workers" --dist loadfile "$@"
    local quiet=$?
    echo "real-vLLM tests: exit $real; quiet-host tests: exit $quiet"
    # 5 twice is "nothing collected"; otherwise the first failure counts.
    if (( real == 5 && quiet == 5 )); then return 5; fi
    (( real != 5 && real != 0 )) && return "$real"
    (( quiet != 5 && quiet != 0 )) && return "$quiet"
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
echo "==================== real-vLLM lane (realvllm, then quiethost): $logs/realvllm.log ===================="
cat "$logs/realvllm.log"
echo "==================== exit: real-vLLM lane $realrc, other tests $rest ===================="
if (( realrc == 5 && rest == 5 )); then exit 5; fi
(( realrc == 5 )) && realrc=0
(( rest == 5 )) && rest=0
(( realrc != 0 )) && exit "$realrc"
exit "$rest"
