# JupyterLab's token is the session's secret, handed over in the environment (never
# argv, which /proc shows every user): a direct connection without it gets no kernel.
# The shim in front adds it to each request the proxy sends. JupyterLab and its kernels
# start in the account's storage ($GPUPOOL_DATA) where the site has it, so notebooks and
# files outlive the session (the Files page and /files serve them); else in the job's folder.
gpupool_session --secret-env JUPYTER_TOKEN --upstream-header 'Authorization: token {secret}' -- \
  bash -c 'cd "${GPUPOOL_DATA:-$GPUPOOL_JOB_DIR}" && exec jupyter lab --no-browser --ip=127.0.0.1 --port="$GPUPOOL_APP_PORT" \
    --ServerApp.root_dir="$PWD" --ServerApp.allow_remote_access=True \
    --ServerApp.port_retries=0 --ServerApp.password=""'
