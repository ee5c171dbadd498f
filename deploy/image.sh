#!/usr/bin/env bash
# Builds the default image: busybox (static) for the tools, bash with its libraries for the
# shell session, a minimal /etc. Output: a read-only rootfs tree at $1 (built beside it, then
# renamed into place, so a half-built image is never seen).
set -euo pipefail
dest=${1:?usage: image.sh DEST}
[ -x "$dest/bin/bash" ] && exit 0

log() { echo "forkpoint setup: $*" >&2; }
work=$(mktemp -d "${dest%/*}/.image.XXXXXX")
trap 'rm -rf "$work"' EXIT
log "building the default image at $dest"
mkdir -p "$work/debs" "$work/root"
pkgs=(busybox-static bash libc6 libtinfo6)
if ! (cd "$work/debs" && apt-get download -qq "${pkgs[@]}" 2>/dev/null); then
  apt-get update -qq
  (cd "$work/debs" && apt-get download -qq "${pkgs[@]}")
fi
chown -R root:root "$work/debs"
for deb in "$work"/debs/*.deb; do dpkg -x "$deb" "$work/root"; done
root=$work/root
rm -rf "$root/usr/share/doc" "$root/usr/share/man" "$root/usr/share/info" "$root/usr/share/locale" \
  "$root/usr/share/lintian" "$root/usr/lib/x86_64-linux-gnu/gconv"
busybox=$root/bin/busybox
for applet in $("$busybox" --list-full); do
  [ -e "$root/$applet" ] || [ -L "$root/$applet" ] || { mkdir -p "$root/$(dirname "$applet")"; ln -s /bin/busybox "$root/$applet"; }
done
mkdir -p "$root"/{etc,root,tmp,home,proc,dev,var/tmp,run,srv,opt,usr/local/bin}
chmod 1777 "$root/tmp" "$root/var/tmp"
chmod 700 "$root/root"
cat > "$root/etc/passwd" <<PW
root:x:0:0:root:/root:/bin/bash
nobody:x:65534:65534:nobody:/nonexistent:/bin/sh
PW
printf 'root:x:0:\nnogroup:x:65534:\n' > "$root/etc/group"
printf '127.0.0.1 localhost\n::1 localhost\n' > "$root/etc/hosts"
printf 'hosts: files dns\n' > "$root/etc/nsswitch.conf"
printf 'PS1="\\u@\\h:\\w\\$ "\n' > "$root/root/.bashrc"
mv "$root" "$dest"
log "default image ready ($(du -sh "$dest" | cut -f1))"
