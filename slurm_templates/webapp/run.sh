# The shim listens on the node's cluster address and lets only gpupool's proxy in;
# the app itself listens on 127.0.0.1:$GPUPOOL_APP_PORT, behind it.
gpupool_session -- bash -c "$GPUPOOL_PARAM_COMMAND"
