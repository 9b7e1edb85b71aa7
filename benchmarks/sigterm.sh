#!/usr/bin/env bash
# SIGTERM a short MiniLM run on real MRPC and time its exit, resume it, run it again uninterrupted, and compare.
#   benchmarks/sigterm.sh BACKEND ENV      e.g. benchmarks/sigterm.sh jax .nox/glue-jax   (from the repository root)
# ENV is a virtual environment with tpuplex and the backend (the glue-<backend> nox session makes one).
set -u
backend=$1; env=$2
export HF_HUB_OFFLINE=1 TF_CPP_MIN_LOG_LEVEL=2
run=(examples/glue/configs/mrpc.toml --backend "$backend" --data-dir ../shared/glue/MRPC
     --set train.max_steps=12 --set runtime.checkpoint_every=5)
stopped=runs/sigterm/$backend whole=runs/sigterm/$backend-whole
rm -rf "$stopped" "$whole"
"$env/bin/tpuplex" train "${run[@]}" --set "runtime.output_dir=\"$stopped\"" 2> "$stopped.log" > /dev/null &
pid=$!
until [ -d "$stopped/checkpoints/step-00000005" ] || ! kill -0 $pid 2> /dev/null; do sleep 0.2; done
sleep 3
sent=$(date +%s.%N); kill -TERM $pid; wait $pid; status=$?; ended=$(date +%s.%N)
echo "$backend: exit status $status, $(python3 -c "print(f'{$ended - $sent:.1f}')") s after SIGTERM"
tail -1 "$stopped.log"
"$env/bin/tpuplex" train "${run[@]}" --set "runtime.output_dir=\"$stopped\"" > /dev/null 2>&1
"$env/bin/tpuplex" train "${run[@]}" --set "runtime.output_dir=\"$whole\"" > /dev/null 2>&1
"$env/bin/python" - "$stopped" "$whole" <<'PY'
import json, sys
import numpy as np
from safetensors.numpy import load_file
runs = [json.load(open(f"{folder}/results.json")) for folder in sys.argv[1:]]
params = [load_file(f"{run['checkpoint']}/model.safetensors") for run in runs]
same = params[0].keys() == params[1].keys() and all(np.array_equal(params[0][k], params[1][k]) for k in params[0])
print(f"resumed from {runs[0]['resumed_from']}; final parameters equal to the uninterrupted run's, bit for bit: "
      f"{same}; dev {runs[0]['metrics']['dev']} vs {runs[1]['metrics']['dev']}")
PY
