#!/usr/bin/env bash
# Builds the memwatch OCI image without a registry or a daemon: buildah,
# FROM scratch, the memwatch binary already built on this host and the
# shared libraries it links (glibc's loader, libc, libm, libgcc_s; no shell,
# no package manager). Writes an OCI archive any runtime can load
# (`podman load`, `skopeo copy oci-archive:… docker://…`, `ctr import`).
#
# Usage: deploy/docker/build-oci.sh BINARY OUT.tar [TAG]
# (the Dockerfile beside it does the same from source where base images can
# be pulled; this machine kind reaches no image registry.)
set -euo pipefail
bin=$1 out=$2 tag=${3:-0.1.0}
[ -x "$bin" ] || { echo "build-oci: $bin is not an executable" >&2; exit 2; }
export STORAGE_DRIVER=${STORAGE_DRIVER:-vfs} BUILDAH_ISOLATION=chroot

ctr=$(buildah from --name "memwatch-build-$$" scratch)
trap 'buildah rm "$ctr" >/dev/null 2>&1 || true' EXIT

buildah copy --chmod 0755 "$ctr" "$bin" /usr/local/bin/memwatch >/dev/null
# The libraries the dynamic loader will look for, at the paths it looks.
# ldd prints `name => /path (addr)` for libraries, `/path (addr)` for the loader.
ldd "$bin" | awk '$2 == "=>" && $3 ~ /^\// {print $3} $1 ~ /^\// {print $1}' | while read -r lib; do
    buildah copy "$ctr" "$(readlink -f "$lib")" "$lib" >/dev/null
done

buildah config \
    --entrypoint '["/usr/local/bin/memwatch"]' \
    --cmd 'run' \
    --user 0:0 \
    --port 9750/tcp \
    --workingdir / \
    --label org.opencontainers.image.title=memwatch \
    --label org.opencontainers.image.version="$tag" \
    --label org.opencontainers.image.description="per-host memory watchdog (needs CAP_BPF, CAP_PERFMON)" \
    "$ctr"
rm -f "$out"
buildah commit --quiet --format oci --rm "$ctr" "oci-archive:$out:memwatch:$tag" >/dev/null
trap - EXIT
echo "build-oci: $out (memwatch:$tag, $(du -h "$out" | cut -f1))"
