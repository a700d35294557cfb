"""Each account's own storage: a filesystem of its own, reached only as the account's Unix user.

Layout, from the top (``storage_root``, beside the job root on the shared storage):

    storage_root/                 root:root            0711  tenants pass through, list nothing
    storage_root/.volumes/        root:root            0700  each account's filesystem image (volumes.py)
    storage_root/<account>/       the mount point: root:root 0700 while nothing is mounted, so nothing lands
                                  on the host's disk; once mounted, the account's filesystem's own root,
                                  tenant:tenant group 0770 (the group is the account's: its members' users
                                  share it through it once they have their own)
    storage_root/<account>/.gpupool-uploads/   uploads in progress (paths.UPLOADS_DIR)

The quota is the size of the account's filesystem: an ext4 filesystem in a
preallocated image file, loop-mounted (``volumes``). The kernel refuses a write
past it (ENOSPC) whatever path it takes, and nothing a tenant does moves bytes
out of it (docs/security.md says why not project quotas or btrfs qgroups).

The API reads and writes only through the run-as helper, which opens each file
as the tenant, in a child process (``agent``, started with setpriv) that never
follows a symbolic link, and hands the open descriptor over its socket
(``broker``, ``client``): the kernel decides what the account can reach.
"""
