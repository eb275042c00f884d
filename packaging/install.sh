#!/bin/sh
# Install k3d and k3 with their systemd units and configuration.
#
#   packaging/install.sh [--prefix /usr/local] [--root DESTDIR] [--bin-dir DIR]
#
# Binaries come from DIR (default target/release; build them first: cargo build --release). Files land under
# DESTDIR (default /): PREFIX/bin/{k3d,k3}, /etc/systemd/system/k3d.{service,socket},
# /etc/k3d/k3d.toml (kept if it exists) and /var/lib/k3d/{models,sessions}. Only when installing
# into / does it create the `k3` group and the `k3d` system user and reload systemd; with
# --root it lays files only (packaging, tests).
set -eu

prefix=/usr/local
root=
bins=
while [ $# -gt 0 ]; do
    case "$1" in
        --prefix) prefix=${2:?--prefix needs a value}; shift 2 ;;
        --root) root=${2:?--root needs a value}; shift 2 ;;
        --bin-dir) bins=${2:?--bin-dir needs a value}; shift 2 ;;
        -h|--help) sed -n '2,11p' "$0"; exit 0 ;;
        *) echo "install.sh: unknown argument $1" >&2; exit 2 ;;
    esac
done
case "$prefix" in /*) ;; *) echo "install.sh: --prefix must be absolute" >&2; exit 2 ;; esac

here=$(cd "$(dirname "$0")" && pwd)
repo=$(dirname "$here")
bins=${bins:-$repo/target/release}
for b in k3d k3; do
    [ -x "$bins/$b" ] || { echo "install.sh: $bins/$b missing; run: cargo build --release" >&2; exit 1; }
done

say() { echo "install.sh: $*"; }
dest() { printf '%s%s' "$root" "$1"; }

install -d -m 0755 "$(dest "$prefix/bin")" "$(dest /etc/systemd/system)" "$(dest /etc/k3d)"
install -m 0755 "$bins/k3d" "$(dest "$prefix/bin/k3d")"
install -m 0755 "$bins/k3" "$(dest "$prefix/bin/k3")"
say "binaries in $(dest "$prefix/bin")"

# The units name /usr/local; follow --prefix.
sed "s#/usr/local/bin/#$prefix/bin/#g" "$here/k3d.service" > "$(dest /etc/systemd/system/k3d.service).tmp"
chmod 0644 "$(dest /etc/systemd/system/k3d.service).tmp"
mv "$(dest /etc/systemd/system/k3d.service).tmp" "$(dest /etc/systemd/system/k3d.service)"
install -m 0644 "$here/k3d.socket" "$(dest /etc/systemd/system/k3d.socket)"
say "units in $(dest /etc/systemd/system)"

if [ -e "$(dest /etc/k3d/k3d.toml)" ]; then
    say "keeping existing $(dest /etc/k3d/k3d.toml); the shipped one is k3d.toml.default"
    install -m 0644 "$here/k3d.toml" "$(dest /etc/k3d/k3d.toml.default)"
else
    install -m 0644 "$here/k3d.toml" "$(dest /etc/k3d/k3d.toml)"
fi

install -d -m 0755 "$(dest /var/lib/k3d)" "$(dest /var/lib/k3d/models)"
install -d -m 0750 "$(dest /var/lib/k3d/sessions)"

if [ -z "$root" ] || [ "$root" = / ]; then
    getent group k3 >/dev/null || groupadd --system k3
    getent passwd k3d >/dev/null ||
        useradd --system --gid k3 --home-dir /var/lib/k3d --no-create-home \
            --shell /usr/sbin/nologin --comment "Kimi K3 daemon" k3d
    chown k3d:k3 /var/lib/k3d/sessions
    say "user k3d and group k3 present; add users who may connect: usermod -aG k3 NAME"
    if command -v systemctl >/dev/null && [ -d /run/systemd/system ]; then
        systemctl daemon-reload
        say "next: put the model in /var/lib/k3d/models/kimi-k3, set ram_gb in /etc/k3d/k3d.toml, then: systemctl enable --now k3d.socket"
    fi
else
    say "files laid under $root (no users created, systemd not touched)"
fi
