#!/usr/bin/env bash
# One prepared GPU run (issue 55), inside BUDGET seconds (default 530) on one H100 or H200, each benchmark capped so
# that a slow one leaves the next its time; the figures docs/benchmarks.md's "One GPU" section records:
#   1. BERT-base masked LM at 512, bf16: tpuplex jax (profiled), the plain Flax loop, tpuplex torch (profiled), HF's
#      Trainer compiled (benchmarks/gpu_side_by_side.py mlm; attention dropout 0 on every side); later, tpuplex
#      torch with train.fp8 (step mlm-tpuplex-torch-fp8), and with runtime.torch_random = "compiled"
#      (step mlm-tpuplex-torch-compiled-random)
#   2. ResNet-20 on CIFAR-10, 15 epochs, bf16, torch and jax (gpu_side_by_side.py cifar)
#   3. SmolLM2-135M (drawn from its config) with LoRA on SST-2's conversations, bf16: tpuplex torch (profiled) beside
#      transformers + peft + HF's Trainer compiled (gpu_side_by_side.py lora)
#   4. nanoGPT's GPU recipe (character-level Shakespeare, 5,000 iterations, compiled) beside
#      examples/shakespeare_char/gpu.toml on tpuplex torch, one seed (benchmarks/nanogpt_side_by_side.py --recipe gpu)
#   5. the speech example (fsdd, 5 epochs) on tpuplex torch beside the plain PyTorch CTC loop (gpu_side_by_side.py
#      speech)
#   6. nanoGPT's character model on tpuplex torch and jax, each without a mesh and over runtime.mesh = {data = 1,
#      fsdp = 1} (gpu_side_by_side.py mesh)
#   7. tpuplex jax's BERT-base under each of four XLA GPU options in turn (cuBLASLt epilogues, no Triton GEMMs, no
#      command buffers, the latency-hiding scheduler): step mlm-jax-xla-flags
#   8. if time is left, tpuplex jax at attention dropout 0.1 (the unfused path: what the fused kernel bought)
# All of it outlasts one call (at most 600 s of a 15-minute device session): pick the steps with STEPS, those whose
# figures are missing first (docs/benchmarks.md, "One GPU").
# STEPS names the steps to run, in order (default: all of them, in the order above); a step the budget cannot
# start any more is recorded as skipped. TORCH_MODE is the tpuplex torch sides' runtime.torch_mode (default
# cuda_graphs; a torch side that fails under it leaves the later ones "compile", so one failure costs one step).
# NANOGPT_ITERS shortens the nanoGPT recipe on both of its sides (default 5,000); CIFAR_SIDES picks cifar's sides
# (default: tpuplex-torch tpuplex-jax).
# Writes to $OUT: results.jsonl (one line per side), profiles.txt (each tpuplex side's device time by op), the raw
# traces of profiled steps (trace-*.json.gz), env.txt, log.txt (nanoGPT's own log appended).
#
#     NANOGPT=/path/to/nanoGPT bash benchmarks/gpu/prepare.sh     # here, first: builds .gpu/
#     OUT=... bash benchmarks/gpu/run.sh                    # on the device, .gpu carried
#     STEPS="nanogpt mlm-tpuplex-torch" OUT=... bash benchmarks/gpu/run.sh    # some steps only
#     DEVICE=cpu OUT=/tmp/dry PYTHON=.nox/tests-portable/bin/python bash benchmarks/gpu/run.sh   # the dry run
set -u
cd "$(dirname "$0")/../.."
OUT=${OUT:?set OUT to the folder for the results}
CARRY=${CARRY:-.gpu}
DEVICE=${DEVICE:-cuda}
BUDGET=${BUDGET:-530}
PYTHON=${PYTHON:-python3}
TORCH_MODE=${TORCH_MODE:-cuda_graphs}
NANOGPT_ITERS=${NANOGPT_ITERS:-5000}
WORK=$(mktemp -d)
# perf_hints: Inductor's fallback kernels; cudagraphs: why torch.compile runs a program without its CUDA graph
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TF_CPP_MIN_LOG_LEVEL=2 TORCH_LOGS=${TORCH_LOGS:-perf_hints,cudagraphs}
mkdir -p "$OUT"
if [ "$DEVICE" = cuda ]; then
    "$PYTHON" -m pip install -q --no-index --no-deps --no-compile --target /tmp/site "$CARRY"/whl/*.whl || exit 1
    export PYTHONPATH=/tmp/site
    nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv > "$OUT/env.txt"
    SIZE=(--length 512 --steps 40 --warmup 10)
    EPOCHS=(--epochs 15 --group 23)
    RECIPE=(--recipe gpu --iters "$NANOGPT_ITERS")
    LORA_SIZE=(--steps 60 --warmup 10 --batch 32)
    SPEECH_SIZE=(--epochs 5 --warmup 20)
    MESH_SIZE=(--steps 300 --warmup 50)
else  # the dry run: a 2-layer BERT, a few steps, one epoch of whatever CIFAR-shaped folders $CARRY holds
    SIZE=(--device cpu --quick --length 64 --steps 6 --warmup 2)
    LORA_SIZE=(--device cpu --quick --steps 6 --warmup 2)
    EPOCHS=(--device cpu --epochs 1 --group 2)
    RECIPE=(--recipe gpu --quick --iters 4)
    SPEECH_SIZE=(--device cpu --quick --train-rows 48 --epochs 1 --warmup 1)
    MESH_SIZE=(--device cpu --quick --steps 6 --warmup 2)
fi
"$PYTHON" - >> "$OUT/env.txt" <<'PY'
import importlib.metadata as m, platform
print(platform.python_version(), *(f"{p} {m.version(p)}" for p in ("torch", "jax", "flax", "optax", "transformers",
                                                                    "tpuplex-core")))
PY

side() {  # side NAME CAP SCRIPT ARGS...: one benchmark call of at most CAP seconds, never past the budget
    local name=$1 cap=$2 left=$((BUDGET - SECONDS))
    shift 2
    if [ "$left" -lt 45 ]; then
        echo "{\"side\": \"$name\", \"skipped\": \"the run's budget was spent\"}" | tee -a "$OUT/results.jsonl"
        return
    fi
    echo "== $name (cap $cap s, $left s left)" >> "$OUT/log.txt"
    timeout --kill-after=10 $((cap < left ? cap : left)) "$PYTHON" "$@" --out "$WORK/$name" >> "$OUT/log.txt" 2>&1
    local status=$?
    [ "$status" -eq 0 ] || echo "{\"side\": \"$name\", \"exit\": $status}" >> "$OUT/results.jsonl"
    if [[ " $* " == *" --torch-mode cuda_graphs "* ]] && { [ "$status" -ne 0 ] || grep -qs '"error"' "$WORK/$name/results.jsonl"; }; then
        echo "== $name failed under cuda_graphs: the later torch sides run as \"compile\"" >> "$OUT/log.txt"
        TORCH_MODE=compile
    fi
    cat "$WORK/$name/results.jsonl" >> "$OUT/results.jsonl" 2>/dev/null
    for profile in "$WORK/$name"/profile-*.txt; do
        [ -f "$profile" ] && { echo "== $(basename "$profile")"; cat "$profile"; } >> "$OUT/profiles.txt"
    done
    local trace  # the profiled sides' raw traces (the first of each step's) beside their summaries, gzipped, to be
    # read again here: the host's time as well as the device's (cifar waits on its host)
    trace=$(find "$WORK/$name" \( -name '*.pt.trace.json' -o -name '*.trace.json.gz' \) | head -1)
    if [ -n "$trace" ]; then
        case "$trace" in *.gz) cp "$trace" "$OUT/trace-$name.json.gz" ;; *) gzip -c "$trace" > "$OUT/trace-$name.json.gz" ;; esac
    fi
}

CIFAR=$CARRY/cifar10
[ -f "$CARRY/cifar10.tar.gz" ] && tar xzf "$CARRY/cifar10.tar.gz" -C "$WORK" && CIFAR=$WORK/cifar10
FSDD=$CARRY/fsdd
[ -f "$CARRY/fsdd.tar.gz" ] && tar xzf "$CARRY/fsdd.tar.gz" -C "$WORK" && FSDD=$WORK/fsdd
SIDES=benchmarks/gpu_side_by_side.py
MLM=("$SIDES" mlm "${SIZE[@]}" --text "$CARRY/tinyshakespeare.txt" --tokenizer "$CARRY/minilm")
LORA=("$SIDES" lora "${LORA_SIZE[@]}" --smollm2 "$CARRY/smollm2" --sst2 "$CARRY/sst2")
SPEECH=("$SIDES" speech "${SPEECH_SIZE[@]}" --fsdd "$FSDD")
MESH=("$SIDES" mesh "${MESH_SIZE[@]}" --text "$CARRY/tinyshakespeare.txt")
for step in ${STEPS:-mlm-tpuplex-jax mlm-flax-loop mlm-tpuplex-torch mlm-hf-trainer cifar lora-tpuplex-torch lora-peft-trainer nanogpt mlm-tpuplex-torch-fp8 mlm-tpuplex-torch-compiled-random speech-tpuplex-torch speech-plain-torch mesh-torch mesh-jax mlm-jax-xla-flags mlm-tpuplex-jax-dropout}; do
    case $step in
        mlm-tpuplex-jax) side "$step" 120 "${MLM[@]}" --sides tpuplex-jax --profile ;;
        mlm-flax-loop) side "$step" 90 "${MLM[@]}" --sides flax-loop ;;
        mlm-tpuplex-torch) side "$step" 150 "${MLM[@]}" --sides tpuplex-torch --profile --torch-mode "$TORCH_MODE" ;;
        mlm-hf-trainer) side "$step" 150 "${MLM[@]}" --sides hf-trainer ;;
        mlm-tpuplex-torch-fp8) side "$step" 150 "${MLM[@]}" --sides tpuplex-torch-fp8 --torch-mode "$TORCH_MODE" ;;
        mlm-tpuplex-torch-compiled-random) side "$step" 150 "${MLM[@]}" --sides tpuplex-torch-compiled-random \
            --profile --torch-mode "$TORCH_MODE" ;;
        cifar) side "$step" 240 "$SIDES" cifar "${EPOCHS[@]}" --data "$CIFAR" --profile --torch-mode "$TORCH_MODE" \
            ${CIFAR_SIDES:+--sides $CIFAR_SIDES} ;;
        lora-tpuplex-torch) side "$step" 150 "${LORA[@]}" --sides tpuplex-torch --profile --torch-mode "$TORCH_MODE" ;;
        lora-peft-trainer) side "$step" 150 "${LORA[@]}" --sides peft-trainer ;;
        nanogpt)  # its results.json becomes one line per side; nanoGPT's own log goes to log.txt
            side "$step" 330 benchmarks/nanogpt_side_by_side.py "${RECIPE[@]}" --nanogpt "$CARRY/nanogpt" --torch-mode "$TORCH_MODE" \
                --seeds 1337 --backends torch --text "$CARRY/tinyshakespeare.txt"
            "$PYTHON" -c 'import json, sys; [print(json.dumps({"side": f"nanogpt-{side}", **row}))
                for side, rows in json.load(open(sys.argv[1])).items() for row in rows]' \
                "$WORK/$step/results.json" >> "$OUT/results.jsonl" 2>/dev/null
            cat "$WORK/$step"/nanogpt/out-*.log >> "$OUT/log.txt" 2>/dev/null ;;
        speech-tpuplex-torch) side "$step" 120 "${SPEECH[@]}" --sides tpuplex-torch --torch-mode "$TORCH_MODE" ;;
        speech-plain-torch) side "$step" 120 "${SPEECH[@]}" --sides plain-torch ;;
        mesh-torch) side "$step" 120 "${MESH[@]}" --sides tpuplex-torch tpuplex-torch-mesh --torch-mode "$TORCH_MODE" ;;
        mesh-jax) side "$step" 120 "${MESH[@]}" --sides tpuplex-jax tpuplex-jax-mesh ;;
        mlm-jax-xla-flags)  # XLA's GPU options one at a time, each beside mlm-tpuplex-jax's default
            i=0
            for flags in --xla_gpu_enable_cublaslt=true --xla_gpu_enable_triton_gemm=false \
                         --xla_gpu_enable_command_buffer= --xla_gpu_enable_latency_hiding_scheduler=true; do
                i=$((i + 1))
                XLA_FLAGS="$flags" side "$step-$i" 90 "${MLM[@]}" --sides tpuplex-jax
            done ;;
        mlm-tpuplex-jax-dropout) side "$step" 90 "${MLM[@]}" --sides tpuplex-jax --attention-dropout 0.1 ;;
        *) echo "unknown step $step (see the list at the top of this file)" >&2; exit 2 ;;
    esac
done
echo "== done in $SECONDS s" >> "$OUT/log.txt"
cat "$OUT/results.jsonl"
