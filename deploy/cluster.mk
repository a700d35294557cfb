# Local one-node Slurm cluster (deploy/ansible). Included from the root Makefile;
# run from the repository root, as root.
VENV ?= .venv
# Provisioning needs root; a user with sudo gets it for these steps only, and
# that user (SUDO_USER) becomes the service user gpupool runs as (else `gpupool`).
SUDO ?= $(shell [ "$$(id -u)" -eq 0 ] || echo sudo)
CLUSTER_ANSIBLE_DIR := deploy/ansible
# The Slurm daemons cluster-stop stops (munge and MariaDB are left running).
CLUSTER_SLURM_DAEMONS := slurmd slurmctld slurmdbd

.PHONY: cluster cluster-stop cluster-multinode cluster-multinode-down

# Idempotent: starts what is not running, restarts what a changed config affects.
cluster:
	$(SUDO) env ANSIBLE_CONFIG=$(CLUSTER_ANSIBLE_DIR)/ansible.cfg \
		$(VENV)/bin/ansible-playbook -i $(CLUSTER_ANSIBLE_DIR)/inventories/local $(CLUSTER_ANSIBLE_DIR)/site.yml

# Without systemd as PID 1 the playbook's gpupool-daemon script runs the daemons.
cluster-stop:
	@set -e; for daemon in $(CLUSTER_SLURM_DAEMONS); do \
		if [ "$$(cat /proc/1/comm)" = systemd ]; then \
			$(SUDO) systemctl stop $$daemon; \
		elif [ -x /usr/local/sbin/gpupool-daemon ]; then \
			printf '%s: ' $$daemon; $(SUDO) /usr/local/sbin/gpupool-daemon stop $$daemon; \
		fi; \
	done

# The multinode CI cluster beside it (deploy/multinode/netns.sh): a controller
# and two GPU nodes, each a network + UTS namespace on this machine, provisioned
# by the same playbook. It shares the local cluster's munged and slurmdbd.
define CLUSTER_MULTINODE_PROVISION
$(SUDO) deploy/multinode/netns.sh up
$(SUDO) env ANSIBLE_CONFIG=$(CLUSTER_ANSIBLE_DIR)/ansible.cfg \
	$(VENV)/bin/ansible-playbook -i $(CLUSTER_ANSIBLE_DIR)/inventories/multinode $(CLUSTER_ANSIBLE_DIR)/site.yml
endef

cluster-multinode: cluster
	$(CLUSTER_MULTINODE_PROVISION)

# Stops its daemons and jobs, removes its namespaces and bridge; its config and
# Slurm state stay for the next run (deploy/multinode/netns.sh purge removes them).
cluster-multinode-down:
	$(SUDO) deploy/multinode/netns.sh down
