#!/usr/bin/env bash
# Run the test suite (or any command) inside a root filesystem of the OTHER supported
# Debian release: bookworm on a trixie host, trixie on a bookworm host.
#
# The root is built once with mmdebstrap and cached under the host's $FORKPOINT_HOME
# (cache/rootfs-<suite>-<hash>); it has its own venv and its own forkpoint home (with
# its own guest image), both inside it, so they are cached with it. It is entered with a
# private mount and pid namespace + pivot_root, not chroot: passt and the image build
# (mmdebstrap) need a real mount namespace, and the pid namespace ends every VM started
# inside when the run ends. The repository is copied in (tracked and untracked files,
# as git lists them): nothing inside writes into the checkout.
#
# usage: tools/other-release.sh [--smoke | COMMAND...]   (root)
#        no argument: `make test` inside, the whole suite, as a newcomer runs it;
#        --smoke: only the VM smoke tier (pytest -m smoke), about a minute warm.
# env:   APT_PACKAGES (from the Makefile), FORKPOINT_HOME, OTHER_SUITE (override)
set -euo pipefail

# Bump when the way the root is built changes in a way the package list does not show.
ROOT_LAYOUT=1

if [ "${1:-}" = "--in-namespace" ]; then
  # Step 2, as pid 1 of new mount + pid namespaces: mount, pivot_root, run step 3.
  root=$2
  shift 2
  mount --bind "$root" "$root"
  mount -t proc proc "$root/proc"
  mount -t sysfs sysfs "$root/sys"
  # The host's cgroup mounts, so the cgroup limits are tested in this release too.
  if mountpoint -q /sys/fs/cgroup; then mount --rbind /sys/fs/cgroup "$root/sys/fs/cgroup"; fi
  mount --rbind /dev "$root/dev" # /dev/kvm, /dev/net/tun, /dev/pts, /dev/shm
  mount -t tmpfs -o mode=1777 tmpfs "$root/tmp" # as on Debian 13: /tmp is RAM-backed
  mount -t tmpfs -o mode=755 tmpfs "$root/run"
  cat /etc/resolv.conf >"$root/etc/resolv.conf"
  # Trust what the host trusts (pip and apt may sit behind a TLS-inspecting proxy).
  mount --bind -o ro /etc/ssl/certs/ca-certificates.crt "$root/etc/ssl/certs/ca-certificates.crt"
  mkdir -p "$root/.old-root"
  cd "$root"
  pivot_root . .old-root
  # A clean environment, but the host's proxy settings still apply, and its CA bundle is
  # the one every client trusts (httpx would otherwise use certifi's, which lacks a
  # TLS-inspecting proxy's CA).
  proxy_env=$(env | grep -iE '^(https?|no)_proxy=' || true)
  exec chroot . /usr/bin/env -i HOME=/root LANG=C.UTF-8 TERM="${TERM:-dumb}" $proxy_env \
    SSL_CERT_FILE=/etc/ssl/certs/ca-certificates.crt \
    PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    /bin/bash -c 'umount -l /.old-root && rmdir /.old-root && exec "$@"' inner "$@"
fi

if [ "$(id -u)" != 0 ]; then
  echo "other-release smoke: needs root (mmdebstrap, mount namespaces)" >&2
  exit 2
fi

repo=$(cd "$(dirname "$0")/.." && pwd)
host_suite=$(. /etc/os-release && echo "${VERSION_CODENAME:-bookworm}")
if [ -n "${OTHER_SUITE:-}" ]; then
  suite=$OTHER_SUITE
elif [ "$host_suite" = bookworm ]; then
  suite=trixie
else
  suite=bookworm
fi
packages=$(echo ${APT_PACKAGES:?set by the Makefile} python3-venv make ca-certificates \
  debian-archive-keyring procps | tr ' ' '\n' | sort -u | tr '\n' ' ')
home=${FORKPOINT_HOME:-$HOME/.local/share/forkpoint}
key=$(printf '%s\n' "$ROOT_LAYOUT" "$suite" $packages | sha256sum | cut -c1-12)
root=$home/cache/rootfs-$suite-$key

if [ ! -e "$root/.complete" ]; then
  echo "other-release: building a $suite root filesystem (cached in $root)"
  mkdir -p "$home/cache"
  rm -rf "$root" "$root.tmp"
  # Older roots of this suite are superseded (their namespaces ended with their runs).
  rm -rf "$home/cache/rootfs-$suite-"*
  mmdebstrap --quiet --variant=apt --skip=cleanup/apt/lists \
    --include="$(echo $packages | tr ' ' ',')" \
    "$suite" "$root.tmp" "deb http://deb.debian.org/debian $suite main"
  touch "$root.tmp/.complete"
  mv "$root.tmp" "$root"
fi

# A fresh copy of the checkout in the root, with what git lists (no venv, no caches).
rm -rf "$root/root/forkpoint"
mkdir -p "$root/root/forkpoint"
(
  cd "$repo"
  git ls-files -z --cached --others --exclude-standard |
    while IFS= read -r -d '' f; do [ -e "$f" ] && printf '%s\0' "$f"; done |
    tar --null -T - -cf -
) | tar -C "$root/root/forkpoint" -xf -

if [ $# -eq 0 ] || [ "$1" = --smoke ]; then
  tier=${1:-}
  set -- /bin/bash -c '
    set -euo pipefail
    cd /root/forkpoint
    # apt lists age; the guest image build asks apt for the kernel package.
    if [ -z "$(find /var/lib/apt/lists -maxdepth 1 -name "*Packages*" -mmin -1440)" ]; then
      apt-get update -qq
    fi
    echo "other-release ($(. /etc/os-release && echo "$PRETTY_NAME"), Python $(python3 -V | cut -d" " -f2), $(qemu-system-x86_64 --version | head -1)):"
    if [ "$1" = --smoke ]; then
      make -s VENV=/root/venv setup
      /root/venv/bin/python -m pytest -q -ra -p no:cacheprovider -m smoke
    else
      # The cluster scenario (Ray nodes in network namespaces, ≈ 3 min) runs on the host
      # release only: the same Ray wheel on both, and CI has 90 minutes (it passed here
      # when last run on both, 2026-12-07).
      make -s VENV=/root/venv test PYTEST_ARGS="-p no:cacheprovider --ignore=tests/test_cluster.py"
    fi
  ' other-release "$tier"
fi

started=$(date +%s)
status=0
unshare --mount --pid --fork --propagation private -- "$0" --in-namespace "$root" "$@" || status=$?
# The run shares the host's network namespace, so its egress rules went into the host's
# `inet forkpoint` table, written by this release's nft: Debian 12's nft 1.0.6 crashes
# reading what Debian 13's 1.1 wrote. The table goes with the run's VMs (this release's
# nft deletes it); the host's next session makes it anew.
chroot "$root" nft delete table inet forkpoint 2>/dev/null || true
echo "other-release ($suite): finished in $(($(date +%s) - started)) s, exit $status"
exit $status
