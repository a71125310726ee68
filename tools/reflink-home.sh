#!/usr/bin/env bash
# Put forkpoint's data directory on a file system with reflinks (XFS), so a checkpoint's
# RAM file is a clone of the previous one plus the pages written since: its disk and its
# time follow what changed, not the memory in use (docs/architecture.md, "Checkpoints that
# cost what changed"). Idempotent; run by `make setup`.
#
# Already on XFS (reflink=1) or btrfs: nothing to do. Otherwise, as root: an XFS image
# beside the directory (<dir>.xfs, sparse, the size of the file system it lives on), on a
# loop device with direct I/O (no second page cache), mounted over the directory with
# online discard (what forkpoint deletes is given back to the host file system). The
# directory's current content moves into it once. forkpoint mounts the image again by
# itself after a reboot (forkpoint/storage.py). Not root: left as it is (checkpoints copy
# the RAM in use; said once by forkpoint).
# env: FORKPOINT_HOME (default ~/.local/share/forkpoint)
set -euo pipefail

dir=${FORKPOINT_HOME:-$HOME/.local/share/forkpoint}
image="$dir.xfs"
mkdir -p "$dir"

reflinks() {
  local probe="$dir/.reflink-probe.$$"
  head -c 4096 /dev/zero >"$probe"
  if cp --reflink=always "$probe" "$probe.clone" 2>/dev/null; then
    rm -f "$probe" "$probe.clone"
    return 0
  fi
  rm -f "$probe" "$probe.clone"
  return 1
}

attach() {  # the image mounted over $1 (through the loop device $loop)
  loop=$(losetup --direct-io=on --find --show "$image")
  mount -o discard,noatime "$loop" "$1"
}

# XFS unshares a reflinked file in 128 KiB pieces by default: a guest page written
# would cost 32 on disk. One block each, inherited by every file made below.
page_sized_cow() {
  [ "$(stat -f -c %T "$dir")" = xfs ] && command -v xfs_io >/dev/null || return 0
  find "$dir" -maxdepth 3 -type d -name checkpoints -exec xfs_io -c "cowextsize 4096" {} \;
  xfs_io -c "cowextsize 4096" "$dir"
}

if mountpoint -q "$dir" || reflinks; then
  page_sized_cow
  exit 0
fi
if [ "$(id -u)" != 0 ]; then
  echo "forkpoint: $dir has no reflinks and this is not root: checkpoints copy the RAM in use"
  exit 0
fi
if [ ! -f "$image" ]; then
  if pgrep -f "qemu-system.*$dir" >/dev/null; then
    echo "forkpoint: VMs run from $dir; remove them before moving it onto XFS" >&2
    exit 1
  fi
  echo "forkpoint: moving $dir onto XFS with reflinks ($image)"
  size=$(df --output=size -B1 "$(dirname "$dir")" | tail -1)
  truncate -s "$size" "$image.tmp"
  mkfs.xfs -q -m reflink=1 "$image.tmp"
  staging=$(mktemp -d)
  image="$image.tmp" attach "$staging"
  shopt -s dotglob nullglob
  entries=("$dir"/*)
  if [ ${#entries[@]} -gt 0 ]; then
    mv "${entries[@]}" "$staging"/
  fi
  umount "$staging"
  losetup -d "$loop"
  rmdir "$staging"
  mv "$image.tmp" "$image"
fi
attach "$dir"
page_sized_cow
