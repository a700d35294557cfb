torchrun --standalone --nproc-per-node "$SLURM_GPUS_ON_NODE" "$GPUPOOL_PARAM_SCRIPT" \
    --data-dir "$GPUPOOL_PARAM_DATA_DIR" \
    --epochs "$GPUPOOL_PARAM_EPOCHS" \
    --learning-rate "$GPUPOOL_PARAM_LEARNING_RATE" \
    --output-dir "$GPUPOOL_OUTPUT_DIR"
