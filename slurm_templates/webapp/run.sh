# The shim listens on the node's cluster address and lets only gpupool's proxy in;
# the app itself listens on 127.0.0.1:$GPUPOOL_APP_PORT in a network namespace of
# its own, behind it, which no other job on the node can reach. An app with a
# password or token option of its own can take the session's secret from
# $GPUPOOL_SESSION_SECRET (the environment: no other user of the node can read it).
gpupool_session --secret-env GPUPOOL_SESSION_SECRET -- bash -c "$GPUPOOL_PARAM_COMMAND"
