"""The GPU health check Slurm runs on every compute node (``gpupool-gpu-check``).

``check`` decides (pure: text in, verdict out), ``probe`` gathers the facts
(nvidia-smi through gpupool.proc, device files, the kernel log), ``state``
keeps the kernel-log cursor and the run lock, ``main`` ties them together and
drains the node on a failing verdict.

Only the standard library, gpupool.proc and gpupool.errors are imported, so
the playbook can copy these files to a compute node that has no gpupool
virtualenv (deploy/ansible/roles/slurm_compute/tasks/gpu_check.yml).
"""
