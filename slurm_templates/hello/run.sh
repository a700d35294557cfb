echo "gpus on node: ${SLURM_GPUS_ON_NODE:-0}"
echo "visible devices: ${CUDA_VISIBLE_DEVICES:-unset}"
printf '%s\n' "$GPUPOOL_PARAM_MESSAGE"
sleep "$GPUPOOL_PARAM_SECONDS"
