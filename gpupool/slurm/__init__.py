"""Everything gpupool asks of Slurm, and the Unix side of running as a tenant.

- ``client``: ``SlurmClient``, the one place that runs Slurm's commands (through
  ``gpupool.proc``): submit, the batched job-state queries, cancel, inventory,
  accounts and their limits.
- ``parse``: the header-keyed parsers and field lists of squeue, sacct and sinfo.
- ``detail``: ``scontrol show job -d``, which GPU indices each running job holds.
- ``report``: what the operator report reads (sacct runs, node events, sreport).
- ``runas``: the root run-as helper that submits as the account's own Unix user,
  and its client (a package: checks, engine, server, client, launch).
- ``tenants``: the accounts' Unix users and job folders.
"""
