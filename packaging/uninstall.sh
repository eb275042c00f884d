#!/bin/sh
# Remove what install.sh installed.
#
#   packaging/uninstall.sh [--prefix /usr/local] [--root DESTDIR] [--purge]
#
# Stops and disables the units (when run on /), removes binaries, units, completions and man pages. The configuration,
# models and sessions under /etc/k3d and /var/lib/k3d are kept unless --purge is given; the
# `k3d` user and `k3` group are removed only with --purge on /.
set -eu

prefix=/usr/local
root=
purge=no
while [ $# -gt 0 ]; do
    case "$1" in
        --prefix) prefix=${2:?--prefix needs a value}; shift 2 ;;
        --root) root=${2:?--root needs a value}; shift 2 ;;
        --purge) purge=yes; shift ;;
        -h|--help) sed -n '2,8p' "$0"; exit 0 ;;
        *) echo "uninstall.sh: unknown argument $1" >&2; exit 2 ;;
    esac
done
dest() { printf '%s%s' "$root" "$1"; }
on_root=no
if [ -z "$root" ] || [ "$root" = / ]; then on_root=yes; fi

if [ $on_root = yes ] && command -v systemctl >/dev/null && [ -d /run/systemd/system ]; then
    systemctl disable --now k3d.socket k3d.service 2>/dev/null || true
fi
share=$(dest "$prefix/share")
rm -f "$(dest "$prefix/bin/k3d")" "$(dest "$prefix/bin/k3")" \
    "$(dest /etc/systemd/system/k3d.service)" "$(dest /etc/systemd/system/k3d.socket)" \
    "$share/bash-completion/completions/k3" "$share/bash-completion/completions/k3d" \
    "$share/zsh/site-functions/_k3" "$share/zsh/site-functions/_k3d" \
    "$share/fish/vendor_completions.d/k3.fish" "$share/fish/vendor_completions.d/k3d.fish" \
    "$share/man/man1/"k3.1 "$share/man/man1/"k3-*.1 "$share/man/man1/"k3d.1 "$share/man/man1/"k3d-*.1
if [ $on_root = yes ] && command -v systemctl >/dev/null && [ -d /run/systemd/system ]; then
    systemctl daemon-reload
fi
if [ $purge = yes ]; then
    rm -rf "$(dest /etc/k3d)" "$(dest /var/lib/k3d)"
    if [ $on_root = yes ]; then
        getent passwd k3d >/dev/null && userdel k3d
        getent group k3 >/dev/null && groupdel k3
    fi
    echo "uninstall.sh: removed binaries, units, configuration, models and sessions"
else
    echo "uninstall.sh: removed binaries and units; kept $(dest /etc/k3d) and $(dest /var/lib/k3d) (use --purge to remove them)"
fi
