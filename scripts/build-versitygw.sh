#!/usr/bin/env bash
# Builds the versitygw S3 gateway from its Go module at a pinned version,
# once, into a cache folder outside the repository; later runs reuse the
# binary. The S3 sink's tests (sink/s3) start it with its posix backend on
# a private directory. Prints the binary's path on stdout.
set -euo pipefail

VERSITYGW_VERSION=${VERSITYGW_VERSION:-v1.8.0}
CACHE=${SLUICE_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/sluice}
dir=$CACHE/versitygw-$VERSITYGW_VERSION
bin=$dir/versitygw

if [[ -x $bin ]]; then
  echo "$bin"
  exit 0
fi

mkdir -p "$dir"
echo "build-versitygw: building versitygw $VERSITYGW_VERSION into $dir (a few minutes on 2 cores)" >&2
# go install module@version builds with the module's own go.mod and
# go.sum; cgo is off (the RDMA and cuObject parts are not linked).
tmp=$(mktemp -d "$dir/gobin.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
CGO_ENABLED=0 GOBIN=$tmp go install -trimpath -ldflags "-s -w" \
  "github.com/versity/versitygw/cmd/versitygw@$VERSITYGW_VERSION" >&2
mv "$tmp/versitygw" "$bin"
echo "$bin"
