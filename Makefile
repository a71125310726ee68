# forkpoint — every target installs what it needs and is safe to re-run.
SHELL := /bin/bash
VENV ?= .venv
PY := $(VENV)/bin/python
FP := $(VENV)/bin/forkpoint
# libnss-myhostname: its postinst adds `myhostname` to the hosts line of /etc/nsswitch.conf,
# so Python clients resolve E2B's <port>-<id>.localhost hosts to 127.0.0.1 and ::1.
# docker-registry: `forkpoint image mirror` runs it on 127.0.0.1; the package's own unit
# (all interfaces) is stopped and disabled where systemd runs it.
APT_PACKAGES := qemu-system-x86 qemu-utils busybox-static mmdebstrap chromium passt \
	e2fsprogs xz-utils zstd curl iproute2 python3-venv fonts-dejavu-core \
	libnss-myhostname nftables podman skopeo umoci docker-registry xfsprogs
DEMO_OUT ?= demo-out
PYTEST_ARGS ?=

.PHONY: setup apt storage venv vendor bytecode image test cluster-test cluster-bench security e2b-suite other-release other-release-smoke demo ui-shots lint bench faults load clean

setup: apt storage venv vendor bytecode image

apt:
	@missing=""; for p in $(APT_PACKAGES); do \
	  dpkg-query -W -f='$${Status}' $$p 2>/dev/null | grep -q "install ok installed" || missing="$$missing $$p"; \
	done; \
	if [ -n "$$missing" ]; then \
	  echo "installing:$$missing"; \
	  SUDO=$$( [ "$$(id -u)" = 0 ] || echo sudo ); \
	  $$SUDO apt-get update -q && DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -q $$missing; \
	  if [[ "$$missing" == *docker-registry* ]] && [ -d /run/systemd/system ]; then \
	    $$SUDO systemctl disable --now docker-registry >/dev/null 2>&1 || true; \
	  fi; \
	fi

# forkpoint's data directory on a file system with reflinks (XFS on a loop device where
# it is not): checkpoints then cost what changed (tools/reflink-home.sh says how).
storage: apt
	tools/reflink-home.sh

$(VENV)/.installed: pyproject.toml
	test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[dev]'
	touch $@

venv: $(VENV)/.installed

# The page's terminal (xterm.js) from the npm registry, pinned and checked, into the package.
vendor: venv
	$(PY) -c 'from forkpoint.server.vendor import main; main()'

# Compiled once here: the environment may forbid writing bytecode (PYTHONDONTWRITEBYTECODE),
# and recompiling forkpoint's sources on every CLI call would cost more than the call.
bytecode: venv
	$(PY) -m compileall -q src >/dev/null

# default: forkpoint's own sessions (small); base: E2B's (python, pip, node, npm, curl, git).
image: apt venv storage
	$(FP) image build
	$(FP) image build base
	$(FP) image build code-interpreter-v1

test: setup
	$(PY) -m pytest -q -ra --durations=15 $(PYTEST_ARGS)

# The cluster on Ray alone (make test runs it too): a head and three nodes in network
# namespaces of their own, a real S3 server, the real ray (tests/cluster_net.py).
cluster-test: setup
	$(PY) -m pytest -q -ra tests/test_cluster.py tests/test_kubernetes_manifest.py

# What the cluster costs against one host (placement, transfer, fork ×12 spread vs packed).
cluster-bench: setup
	$(PY) tests/cluster_bench.py bench-out

# E2B's own SDK test suite, unmodified, where it lies (never copied here), run against a
# fresh gateway with the e2b version forkpoint pins; tests/e2b_suite_expected.txt lists
# the tests that cannot pass offline (and those of work not done yet), each with a reason.
E2B_SUITE ?= ../shared/e2b-sdk-tests
E2B_SUITE_VENV ?= $(or $(FORKPOINT_HOME),$(HOME)/.local/share/forkpoint)/e2b-suite-venv
e2b-suite: setup
	@test -d $(E2B_SUITE)/tests || { echo "no E2B suite at $(E2B_SUITE) (set E2B_SUITE)"; exit 2; }
	@pin=$$($(PY) -c 'import importlib.metadata as m; print(m.version("e2b"))'); \
	if [ "$$($(E2B_SUITE_VENV)/bin/python -c 'import importlib.metadata as m; print(m.version("e2b"))' 2>/dev/null)" != "$$pin" ]; then \
	  python3 -m venv $(E2B_SUITE_VENV) && $(E2B_SUITE_VENV)/bin/pip install -q --disable-pip-version-check \
	    "e2b==$$pin" pytest pytest-asyncio pytest-timeout python-dotenv pytest-dotenv attrs httpx; \
	fi
	$(PY) tests/e2b_suite.py $(E2B_SUITE) $(E2B_SUITE_VENV)/bin/python $(E2B_SUITE_ARGS)

# The hostile-guest suite's long variants (make test runs the short ones): a minute-long
# resource storm and an agent impostor that never answers.
security: setup
	FORKPOINT_LONG_ATTACKS=1 FORKPOINT_STORM_S=60 $(PY) -m pytest -q -ra \
	  tests/test_hostile_guest.py tests/test_hostile_agent.py

# The whole suite (`make test`) inside a root filesystem of the other supported Debian
# release, built with mmdebstrap and cached under $$FORKPOINT_HOME/cache; -smoke: only
# the VM smoke tier, for a quick look.
other-release: apt
	APT_PACKAGES="$(APT_PACKAGES)" tools/other-release.sh

other-release-smoke: apt
	APT_PACKAGES="$(APT_PACKAGES)" tools/other-release.sh --smoke

demo: setup
	$(FP) demo --out $(DEMO_OUT)

# The page's pictures in the README (docs/ui*.png), taken by its Playwright tests.
ui-shots: setup
	FORKPOINT_UI_SHOTS=docs $(PY) -m pytest -q tests/test_ui_vm.py

bench: setup
	FORKPOINT_MAX_SESSIONS=128 $(FP) bench --out bench-out

# The full fault campaign (docs/reliability.md; make test runs the reduced one) and the
# load test, each in its own scratch home beside $$FORKPOINT_HOME's images.
FAULTS_ARGS ?=
LOAD_ARGS ?=
faults: setup
	$(PY) tools/scratch_home.py faults -- $(PY) tests/faults_campaign.py --out faults-out $(FAULTS_ARGS)

load: setup
	$(PY) tools/scratch_home.py load -- $(PY) tests/load_test.py --out load-out $(LOAD_ARGS)

lint: venv
	$(VENV)/bin/ruff check src tests
	$(VENV)/bin/ruff format --check src tests
	$(VENV)/bin/mypy --strict src tests

clean:
	rm -rf $(VENV) $(DEMO_OUT) bench-out faults-out load-out
