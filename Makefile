# gpupool: two commands for a newcomer on a fresh Debian 12 / Ubuntu 22.04+ machine
# (as root or with sudo):  make run   and   make test
VENV ?= .venv
PYTEST_ARGS ?=

include deploy/cluster.mk

.PHONY: test-realhosts-ha venv venv-test preflight services run test check test-calendar test-freshhost test-multinode test-realhosts test-gpu test-unit test-app docs lint bench clean

# What running gpupool needs (gpupool, ansible-core); venv-test adds the test
# tools (dev extras, the client, chromium and its driver).
venv: $(VENV)/.installed
$(VENV)/.installed: pyproject.toml client/pyproject.toml
	deploy/local/bootstrap-venv.sh $(VENV) run
	touch $@
venv-test: $(VENV)/.installed-test
$(VENV)/.installed-test: $(VENV)/.installed
	deploy/local/bootstrap-venv.sh $(VENV) test
	touch $@

# The playbook itself runs from the virtualenv's ansible-core.
cluster: venv

services:
	$(SUDO) deploy/local/ensure-services.sh

# Before anything is installed: host name, ports, disk (one message each).
preflight:
	deploy/local/preflight.sh

# Local cluster + API on 127.0.0.1:5000 with SQLite; prints a token and a curl.
run: preflight
	$(MAKE) --no-print-directory venv cluster
	deploy/local/run-demo.sh

# The whole suite against the real local cluster, PostgreSQL and Redis, in two runs:
# first the suites that wait on Slurm and share its one node (one test at a time),
# then the CPU-bound ones (the playbook rendered ~80 times and run on this machine, billing
# replays, the unit and app tiers) on both cores with pytest-xdist; each worker makes its
# own databases and Slurm accounts, and a module's tests share one worker unless the
# module says which of its fixtures are shared (--dist loadgroup; tests/conftest.py).
# JUNIT_DIR: where each run writes its JUnit XML (.ci/run names the slowest tests from it).
TEST_SERIAL := tests/api tests/billing/test_billing_cluster.py tests/billing/test_report_cluster.py tests/client \
	tests/live tests/local tests/multinode tests/freshhost tests/realhosts
TEST_PARALLEL := tests/billing tests/cluster tests/unit tests/app
TEST_WORKERS ?= 2
JUNIT_DIR ?=
junit = $(if $(JUNIT_DIR),--junitxml=$(JUNIT_DIR)/$(1).xml)
test: venv-test services cluster
	status=0; \
	$(VENV)/bin/pytest $(TEST_SERIAL) $(call junit,test-serial) $(PYTEST_ARGS) || status=$$?; \
	$(VENV)/bin/pytest -n $(TEST_WORKERS) --dist loadgroup $(TEST_PARALLEL) \
		$(addprefix --ignore=,$(filter tests/billing/% tests/cluster/%,$(TEST_SERIAL))) \
		$(call junit,test-parallel) $(PYTEST_ARGS) || status=$$?; \
	exit $$status

# The tests marked `calendar` again, with the clock of every app they build frozen
# (GPUPOOL_TEST_NOW, tests/conftest.py) at a year's last second, the next year's
# first, and the last second of a leap day: no test may depend on today's date.
CALENDAR_INSTANTS ?= 2026-12-31T23:59:59Z 2027-01-01T00:00:00Z 2028-02-29T23:59:59Z
# What the tiers below provision first: the local cluster. .ci/run, which runs them
# beside `make test` once that has provisioned it, empties this.
CLUSTER_PREREQ ?= cluster
test-calendar: venv-test services $(CLUSTER_PREREQ)
	set -e; for instant in $(CALENDAR_INSTANTS); do \
		echo "test-calendar: the clock at $$instant"; \
		GPUPOOL_TEST_NOW=$$instant $(VENV)/bin/pytest -q -m calendar $(PYTEST_ARGS); \
	done

# The multinode suite (tests/multinode) on a fresh multinode cluster, removed
# afterwards whatever the result; leftovers of an interrupted run go first.
test-multinode: venv-test services $(CLUSTER_PREREQ)
	$(SUDO) deploy/multinode/netns.sh down
	$(CLUSTER_MULTINODE_PROVISION)
	status=0; $(VENV)/bin/pytest -m multinode tests/multinode $(PYTEST_ARGS) || status=$$?; \
		$(SUDO) deploy/multinode/netns.sh down; exit $$status

# The README's first command on a fresh minimal Debian 12 host (deploy/freshhost:
# a debootstrap image, cached under /var/cache/gpupool-freshhost, booted with
# systemd as PID 1 in namespaces), then its curl submit; the host goes afterwards.
test-freshhost: venv-test
	command -v debootstrap >/dev/null && command -v zstd >/dev/null || \
		$(SUDO) env DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends debootstrap zstd
	$(SUDO) deploy/freshhost/host.sh clean
	$(SUDO) $(VENV)/bin/pytest -m freshhost tests/freshhost -s $(PYTEST_ARGS)

# The production site.yml on three fresh Debian 12 servers (deploy/realhosts:
# systemd containers on a private link, their image cached under
# /var/cache/gpupool-realhosts), from this machine over SSH; servers, link and
# NAT go afterwards whatever the result, and first whatever an interrupted run left.
test-realhosts: venv-test
	command -v debootstrap >/dev/null && command -v nft >/dev/null || \
		$(SUDO) env DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends debootstrap nftables curl
	$(SUDO) deploy/realhosts/hosts.sh clean
	status=0; $(SUDO) $(VENV)/bin/pytest -m realhosts tests/realhosts -s $(PYTEST_ARGS) || status=$$?; \
		$(SUDO) deploy/realhosts/hosts.sh clean; exit $$status

# The same tier in issue 36's several-hosts shape (inventories/realhosts-ha: a second
# head node, PostgreSQL under Patroni with etcd, HAProxy, Slurm's backup controller),
# then tests/realhosts/test_site_without_one_host.py on the same boot: a host's API,
# the database leader and the primary slurmctld taken away under a submitting client.
# About 26 minutes alone; .ci/run runs it beside make test in place of test-realhosts.
test-realhosts-ha:
	REALHOSTS_HA=1 $(MAKE) test-realhosts

# Real NVIDIA GPUs (tests/gpu; docs/testing.md, "Real GPUs"), run by hand as root on
# a machine with a GPU and its driver: the local cluster reprovisioned from
# inventories/local-gpu (the real GPUs discovered into gres.conf, ConstrainDevices=yes),
# then discovery, the health check and two jobs against the real devices. It leaves
# the cluster on the real GPUs; `make cluster` (which `make test` runs first) puts
# the emulated node back. Without a GPU it says so in one line and succeeds.
GPU_PRESENT := nvidia-smi -L 2>/dev/null | grep -q '^GPU [0-9]'
test-gpu:
	@if ! { $(GPU_PRESENT); }; then \
		echo "test-gpu: skipped: no NVIDIA GPU/driver found (nvidia-smi -L lists no GPU)"; exit 0; fi; \
	set -e; $(MAKE) --no-print-directory venv-test; \
	$(SUDO) env ANSIBLE_CONFIG=$(CLUSTER_ANSIBLE_DIR)/ansible.cfg \
		$(VENV)/bin/ansible-playbook -i $(CLUSTER_ANSIBLE_DIR)/inventories/local-gpu $(CLUSTER_ANSIBLE_DIR)/site.yml; \
	$(SUDO) $(VENV)/bin/pytest -m gpu tests/gpu -s -p no:cacheprovider $(PYTEST_ARGS)

# The documentation site (mkdocs.yml, docs/) into site/; a warning is an error.
docs: venv-test
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict

# Pure tests only: no cluster, no database.
test-unit: venv-test
	$(VENV)/bin/pytest tests/unit $(PYTEST_ARGS)

# The app in-process on SQLite, Slurm from recorded outputs: no service at all.
test-app: venv-test
	$(VENV)/bin/pytest tests/app $(PYTEST_ARGS)

# The inner loop, about a minute on 2 cores (docs/testing.md): lint, then the unit
# and app tiers with every warning an error. Needs no cluster, database or Redis.
check: venv-test
	$(VENV)/bin/ruff check gpupool gpupool_cli api billing tests bench
	$(VENV)/bin/mypy gpupool gpupool_cli api billing
	$(VENV)/bin/pytest -q -W error -p no:cacheprovider tests/unit tests/app $(PYTEST_ARGS)

# Every function annotated, imports sorted, types checked.
lint: venv
	$(VENV)/bin/pip install -q -e ".[dev,lint]"
	$(VENV)/bin/ruff check gpupool gpupool_cli api billing tests bench
	$(VENV)/bin/mypy gpupool gpupool_cli api billing

bench: venv-test services cluster
	command -v wrk >/dev/null || $(SUDO) apt-get install -y -qq wrk
	test -x /usr/sbin/slurmrestd || $(SUDO) apt-get install -y -qq slurmrestd
	$(VENV)/bin/pip install -q -e '.[bench]'
	$(VENV)/bin/python -m bench.submit --profile
	$(VENV)/bin/python -m bench.scale
	$(VENV)/bin/python -m bench.runas
	$(VENV)/bin/python -m bench.poll
	$(VENV)/bin/python -m bench.billing
	$(VENV)/bin/python -m bench.invoice
	$(VENV)/bin/python -m bench.budget
	$(VENV)/bin/python -m bench.files

clean:
	rm -rf var build *.egg-info
