#!/usr/bin/env bash
# Builds kube-apiserver from k8s.io/kubernetes at a pinned version, once,
# into a cache folder outside the repository; later runs reuse the binary.
# The Kubernetes tests (test/kube) start it with Debian's etcd.
# Prints the binary's path on stdout.
set -euo pipefail

KUBE_VERSION=${KUBE_VERSION:-v1.37.2}
STAGING_VERSION=v0${KUBE_VERSION#v1}
CACHE=${SLUICE_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/sluice}
dir=$CACHE/kube-apiserver-$KUBE_VERSION
bin=$dir/kube-apiserver

if [[ -x $bin ]]; then
  echo "$bin"
  exit 0
fi

mkdir -p "$dir/src"
cd "$dir/src"
# k8s.io/kubernetes points its staging modules at ./staging; a module of our
# own replaces each of them with its published version.
mod=$(go mod download -json "k8s.io/kubernetes@$KUBE_VERSION" | python3 -c 'import sys,json;print(json.load(sys.stdin)["GoMod"])')
{
  echo 'module kas'
  echo 'go 1.26'
  echo "require k8s.io/kubernetes $KUBE_VERSION"
  echo 'replace ('
  grep -E '=> ./staging' "$mod" | awk -v v="$STAGING_VERSION" '{print "\t"$1" => "$1" "v}'
  echo ')'
} >go.mod
printf '//go:build tools\n\npackage kas\n\nimport _ "k8s.io/kubernetes/cmd/kube-apiserver"\n' >tools.go
echo "build-kube-apiserver: building kube-apiserver $KUBE_VERSION into $dir (about 10 minutes on 2 cores)" >&2
go mod tidy >&2
minor=${KUBE_VERSION#v1.}; minor=${minor%%.*}
go build -trimpath -o "$bin.tmp" \
  -ldflags "-s -w -X k8s.io/component-base/version.gitVersion=$KUBE_VERSION -X k8s.io/component-base/version.gitMajor=1 -X k8s.io/component-base/version.gitMinor=$minor" \
  k8s.io/kubernetes/cmd/kube-apiserver >&2
mv "$bin.tmp" "$bin"
echo "$bin"
