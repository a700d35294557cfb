# gpupool: two commands for a newcomer on a fresh Debian 12 / Ubuntu 22.04+ machine
# (as root or with sudo):  make run   and   make test
VENV ?= .venv
PYTEST_ARGS ?=

include deploy/cluster.mk

.PHONY: venv services run test test-multinode test-unit lint bench clean

venv: $(VENV)/.installed
$(VENV)/.installed: pyproject.toml client/pyproject.toml
	deploy/local/bootstrap-venv.sh $(VENV)
	touch $@

# The playbook itself runs from the virtualenv's ansible-core.
cluster: venv

services:
	$(SUDO) deploy/local/ensure-services.sh

# Local cluster + API on 127.0.0.1:5000 with SQLite; prints a token and a curl.
run: venv cluster
	deploy/local/run-demo.sh

# The whole suite against the real local cluster, PostgreSQL and Redis.
test: venv services cluster
	$(VENV)/bin/pytest $(PYTEST_ARGS)

# The multinode suite (tests/multinode) on a fresh multinode cluster, removed
# afterwards whatever the result; leftovers of an interrupted run go first.
test-multinode: venv services cluster
	$(SUDO) deploy/multinode/netns.sh down
	$(CLUSTER_MULTINODE_PROVISION)
	status=0; $(VENV)/bin/pytest -m multinode tests/multinode $(PYTEST_ARGS) || status=$$?; \
		$(SUDO) deploy/multinode/netns.sh down; exit $$status

# Pure tests only: no cluster, no database.
test-unit: venv
	$(VENV)/bin/pytest tests/unit $(PYTEST_ARGS)

# Every function annotated, imports sorted, types checked.
lint: venv
	$(VENV)/bin/pip install -q -e '.[dev,lint]'
	$(VENV)/bin/ruff check gpupool gpupool_cli api billing tests bench
	$(VENV)/bin/mypy gpupool gpupool_cli api billing

bench: venv services cluster
	command -v wrk >/dev/null || $(SUDO) apt-get install -y -qq wrk
	test -x /usr/sbin/slurmrestd || $(SUDO) apt-get install -y -qq slurmrestd
	$(VENV)/bin/python bench/submit.py
	$(VENV)/bin/python bench/scale.py
	$(VENV)/bin/python bench/runas.py
	$(VENV)/bin/python bench/poll.py
	$(VENV)/bin/python bench/billing.py
	$(VENV)/bin/python bench/invoice.py

clean:
	rm -rf var build *.egg-info
