"""``python -m gpupool.slurm.runas``: the run-as helper, as ``gpupool runas serve`` starts it (gpupool.slurm.runas.launch)."""

import sys

from gpupool.slurm.runas.launch import main

if __name__ == "__main__":
    sys.exit(main())
