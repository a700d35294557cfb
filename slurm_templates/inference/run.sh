printf '%s' "$GPUPOOL_PARAM_INPUT" > input.txt
infer --model "$GPUPOOL_PARAM_MODEL" --input-file input.txt \
      --max-tokens "$GPUPOOL_PARAM_MAX_TOKENS" --output-file "$GPUPOOL_OUTPUT_DIR/output.txt"
