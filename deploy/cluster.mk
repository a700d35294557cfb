# Local one-node Slurm cluster (deploy/ansible). Included from the root Makefile;
# run from the repository root, as root.
VENV ?= .venv
# Provisioning needs root; a user with sudo gets it for these steps only, and
# the playbook makes that user (SUDO_USER) the Slurm operator gpupool runs as.
SUDO ?= $(shell [ "$$(id -u)" -eq 0 ] || echo sudo)
CLUSTER_ANSIBLE_DIR := deploy/ansible
# The Slurm daemons cluster-stop stops (munge and MariaDB are left running).
CLUSTER_SLURM_DAEMONS := slurmd slurmctld slurmdbd

.PHONY: cluster cluster-stop

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
