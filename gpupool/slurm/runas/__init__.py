"""Run ``sbatch`` and ``scancel`` as an account's tenant user, and nothing else.

The API runs as an unprivileged service user under ``NoNewPrivileges``, which
rules out sudo and every setuid helper. So a small root process,
``gpupool runas serve``, listens on a Unix socket that only the service group
can open, checks each caller's uid with ``SO_PEERCRED``, and acts as a tenant
only through the three operations below. Requests carry data, never command
lines: the helper builds every argv itself, checks each sbatch option against
the renderer's fixed list (and each option the script's own ``#SBATCH`` lines
carry, read as sbatch reads them), hands sbatch the very bytes it checked on
its standard input, creates the job folder without following links, and runs
the command as the tenant with a minimal environment. There is no shell
anywhere. The helper itself holds only the settings it uses: it starts
itself again with an environment of those alone, so no JWT secret or database
password is ever in it.

    submit   write the job's script and its empty logs (each array task's; a session's port file and secret; a sweep's values, one file per task) into its new folder, run sbatch as the tenant on the script's bytes
    test     the same checks, then ``sbatch --test-only`` as the tenant: no folder, no file, no job; Slurm's start estimate
    cancel   scancel the given jobs or array tasks (or all of the account's, as each of its users) as the tenant
    discard  remove a job folder whose sbatch Slurm refused
    budget   set the account's Slurm budget (GrpTRESMins=gres/gpu), the billing pass's one write
    member_limits  set a member user's GPUs at once and budget (GrpTRES, GrpTRESMins) on its own association
    files.*  open, list, move or delete in the account's storage, as the tenant (gpupool.storage.broker);
             an opened file's descriptor comes back with the answer (SCM_RIGHTS)

``submit``, ``test`` and ``cancel`` act as the account's own user, or, given
``user``, as that member user of the account: the helper checks for itself
that the user is one (``gpupool.slurm.tenants.lookup_member``: uid range,
tenants group, the account's group as its primary group), whatever the caller says.

The modules, one job each:

    checks      what a request may contain: names, sbatch options, the script, sweep values (pure)
    directives  what sbatch itself reads from a script's ``#SBATCH`` lines
    engine      ``DirectTenantActions``: what runs as root; the helper runs it, and an operator's root shell
    server      the socket: peer credentials, framing, dispatch, the connection limit
    client      ``RunasClient``: the same operations over the socket, for the API and the billing worker
    actions     ``TenantActions``, the interface both offer, and ``tenant_actions``, which picks one
    launch      the helper's command line and lean environment (``python -m gpupool.slurm.runas``)
"""
