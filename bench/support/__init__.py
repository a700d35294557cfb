"""What the benches and the tests share: real databases, Slurm accounts, tenants, HTTP, metering.

Plain modules, not conftests: a bench imports them without pytest, and the tests'
conftests import the same helpers to build their fixtures. They live with the
benches so that a bench never imports from tests/ (the tests import bench code anyway:
``bench.synthetic_sacct``).

- ``bench.support.services``: throwaway PostgreSQL databases and Slurm accounts,
  ``slurm_cmd``, ``wait_for``;
- ``bench.support.tenancy``: the service user, a job root tenants can reach, the run-as helper;
- ``bench.support.http``: a stdlib HTTP client, a free port, Slurm wrappers that count calls;
- ``bench.support.storage``: a storage root tenants can reach, accounts' real volumes, a helper that serves them;
- ``bench.support.metering``: ``parse_runs`` and ``meter``, the pass's lazy reader and meter collected into lists.
"""
