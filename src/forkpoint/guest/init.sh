#!/bin/sh
# forkpoint-init: PID 1 of the guest (no systemd). Mounts the basics, brings up eth0,
# announces readiness on the console, runs the agent in a respawn loop, reaps zombies.
# /opt/forkpoint/sbin: busybox's ip, mount, ... for OCI images without them (theirs win).
export PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin:/opt/forkpoint/sbin
export HOME=/root LANG=C.UTF-8

is_mounted() {
    while read -r _dev mnt _rest; do
        [ "$mnt" = "$1" ] && return 0
    done </proc/mounts
    return 1
}

mount -t proc proc /proc 2>/dev/null
is_mounted /sys || mount -t sysfs sysfs /sys
# The initramfs moves its devtmpfs here; mount one only when booted without it.
is_mounted /dev || mount -t devtmpfs devtmpfs /dev
mkdir -p /dev/pts /dev/shm
is_mounted /dev/pts || mount -t devpts -o gid=5,mode=620,ptmxmode=666 devpts /dev/pts
is_mounted /dev/shm || mount -t tmpfs -o mode=1777,nosuid,nodev tmpfs /dev/shm
is_mounted /run || mount -t tmpfs -o mode=755,nosuid,nodev tmpfs /run
is_mounted /tmp || mount -t tmpfs -o mode=1777,nosuid,nodev tmpfs /tmp
exec </dev/console >/dev/console 2>&1

name=forkpoint
[ -s /etc/hostname ] && read -r name </etc/hostname
echo "$name" >/proc/sys/kernel/hostname

if [ -e /sys/class/net/eth0 ]; then
    ip link set lo up || true
    ip link set eth0 up || true
    ip addr add 10.0.2.15/24 dev eth0 || true
    ip route add default via 10.0.2.2 || true
else
    ip link set lo up 2>/dev/null || true
fi

root=unknown
while read -r dev mnt _rest; do
    [ "$mnt" = / ] && root=$dev
done </proc/mounts
echo "forkpoint: root $root"
# OCI images bring the agent's own Python (images/agent_python.py); Debian images use theirs.
python=python3
[ -x /opt/forkpoint/bin/python3 ] && python=/opt/forkpoint/bin/python3
echo "forkpoint: python3 $($python -V 2>&1)"
mkdir -p /var/log
# The restore contract (guest/restore.py): anyone may register to be told of a restore.
mkdir -p /run/forkpoint/notify && chmod 1777 /run/forkpoint/notify
[ -e /run/forkpoint/generation ] || echo 0 >/run/forkpoint/generation
echo "FORKPOINT-READY"

if [ -f /opt/forkpoint/forkpoint/guest/agent.py ]; then
    (
        while true; do
            PYTHONPATH=/opt/forkpoint $python -m forkpoint.guest.agent \
                >>/var/log/forkpoint-agent.log 2>&1 </dev/null
            sleep 0.2
        done
    ) &
else
    echo "forkpoint: no agent installed; idling"
    (while true; do sleep 3600; done) &
fi

# PID 1 adopts every orphan: keep waiting so none stays a zombie. The background loop
# never exits, so `wait` blocks and reaps whatever child exits meanwhile.
while true; do
    wait
    sleep 1
done
