"""Job resources, a module per job: submit and quote, one job, the list, an array's tasks, logs.

The modules load in this order on purpose (hence the isort splits): each declares its
routes' OpenAPI entries as it loads (api.routing), and this is their order in the document.
"""

from api.jobs import submitting  # noqa: F401  (each module declares its routes on import)

# isort: split
from api.jobs import detail  # noqa: F401

# isort: split
from api.jobs import listing  # noqa: F401

# isort: split
from api.jobs import tasks  # noqa: F401

# isort: split
from api.jobs import logs  # noqa: F401

# isort: split
from api.jobs.lookup import jobs_bp
from api.jobs.submitting import submit_bp

__all__ = ["jobs_bp", "submit_bp"]
