echo "gpus on node: ${SLURM_GPUS_ON_NODE:-0}"
echo "visible devices: ${CUDA_VISIBLE_DEVICES:-unset}"
# On a real GPU node, name the cards too (emulated GPUs have no driver).
if command -v nvidia-smi >/dev/null; then nvidia-smi -L; fi
printf '%s\n' "$GPUPOOL_PARAM_MESSAGE"
sleep "$GPUPOOL_PARAM_SECONDS"
