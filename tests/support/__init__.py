"""What the tests and the benches share: real databases, Slurm accounts, tenants, HTTP.

Plain modules, not conftests: a bench imports them without pytest collecting
anything, and the conftests import the same helpers to build their fixtures.

- ``tests.support.services``: throwaway PostgreSQL databases and Slurm accounts,
  ``slurm_cmd``, ``wait_for``;
- ``tests.support.tenancy``: the service user, a job root tenants can reach, the run-as helper;
- ``tests.support.http``: a stdlib HTTP client, a free port, Slurm wrappers that count calls.
- ``tests.support.sacct_dumps``: sacct output in the billing pass's shape, for tests that replay it.
- ``tests.support.metering``: ``parse_runs`` and ``meter``, the pass's lazy reader and meter collected into lists.
"""
