# The customer's own command line: the script passes it to bash as one argument, from
# the environment, so nothing in it can change this script; it runs as the account's
# user, in the job's cgroup, as any code of theirs does. $GPUPOOL_OUTPUT_DIR is made
# before it runs (gpupool.render).
bash -c "$GPUPOOL_PARAM_COMMAND"
