"""gpupool core: configuration, database, models, errors and the Slurm client.

Both faces of the product import from here: the HTTP API (``api``) and the
billing worker (``billing``). Nothing in this package imports Flask.
"""

__version__ = "0.1.0"
