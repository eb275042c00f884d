#!/bin/sh
# PID 1 of a fresh PID+mount namespace (ops_packaging.rs): make every tree systemd or
# install.sh writes scratch, install the units for real, then become systemd.
#
#   boot.sh SCRATCH REPO BIN_DIR MODEL_DIR
#
# The filesystem is the host's; only mounts are private. So /etc, /var and /usr/local are
# overlays whose writes land in SCRATCH (the `k3` group and `k3d` user install.sh creates
# exist only there), and /run, /tmp are fresh tmpfs: a booting systemd empties /tmp
# (tmpfiles.d tmp.conf), which on a shared /tmp would delete other processes' files.
set -eu
s=$1 repo=$2 bins=$3 model=$4
mount --make-rprivate /
for d in /etc /var /usr/local; do
    n=$(echo "$d" | tr / _)
    mkdir -p "$s/up$n" "$s/work$n"
    mount -t overlay overlay -o "lowerdir=$d,upperdir=$s/up$n,workdir=$s/work$n" "$d"
done
# What the rest needs from the repository, staged inside the /usr/local overlay first: the
# repository (and the binaries, the model) may themselves lie under /tmp, which is hidden next.
stage=/usr/local/lib/k3-systemd-test
mkdir -p "$stage"
cp -r "$repo/packaging" "$stage/packaging"
cp -r "$bins" "$stage/bins"
cp -r "$model" "$stage/model"
mount -t tmpfs -o mode=0755 tmpfs /run
mount -t tmpfs -o mode=1777 tmpfs /tmp
# Units that would reach past the private mounts (kernel settings, modules, devices, files
# in /home): masked, the k3d units need none of them.
for u in systemd-tmpfiles-setup.service systemd-tmpfiles-setup-dev.service \
    systemd-tmpfiles-clean.timer systemd-sysctl.service systemd-modules-load.service \
    systemd-remount-fs.service systemd-binfmt.service systemd-udevd.service \
    systemd-udev-trigger.service; do
    ln -sf /dev/null "/etc/systemd/system/$u"
done
"$stage/packaging/install.sh" --bin-dir "$stage/bins"
cp -r "$stage/model" /var/lib/k3d/models/kimi-k3
# The test model is tiny; a budget the machine may not have would only slow the plan.
sed -i 's/^ram_gb = .*/ram_gb = 2/' /etc/k3d/k3d.toml
exec /lib/systemd/systemd --system --log-target=console
