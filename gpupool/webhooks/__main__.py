"""``python -m gpupool.webhooks``: the webhook sender, as ``gpupool webhooks run`` runs it (gpupool.webhooks.run)."""

import sys

from gpupool.webhooks.run import main

if __name__ == "__main__":
    sys.exit(main())
