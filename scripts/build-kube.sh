#!/usr/bin/env bash
# Builds the Kubernetes binaries the tests run, from k8s.io/kubernetes at a
# pinned version, once, into a cache folder outside the repository; later
# runs reuse them. One `go build` makes all of them, so the packages they
# share are compiled once. The API-server tests (test/kube) need
# kube-apiserver; the real-cluster tests (test/cluster,
# scripts/local-cluster.sh) need the rest.
# Prints the folder holding the binaries on stdout.
set -euo pipefail

KUBE_VERSION=${KUBE_VERSION:-v1.37.2}
STAGING_VERSION=v0${KUBE_VERSION#v1}
CACHE=${SLUICE_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/sluice}
dir=$CACHE/kube-$KUBE_VERSION
cmds=(kube-apiserver kube-controller-manager kube-scheduler kubelet kube-proxy kubectl)

missing=0
for c in "${cmds[@]}"; do [[ -x $dir/bin/$c ]] || missing=1; done
if ((missing == 0)); then
  echo "$dir/bin"
  exit 0
fi

mkdir -p "$dir/src"
cd "$dir/src"
# k8s.io/kubernetes points its staging modules at ./staging; a module of our
# own replaces each of them with its published version.
mod=$(go mod download -json "k8s.io/kubernetes@$KUBE_VERSION" | python3 -c 'import sys,json;print(json.load(sys.stdin)["GoMod"])')
{
  echo 'module kubebuild'
  echo 'go 1.26'
  echo "require k8s.io/kubernetes $KUBE_VERSION"
  echo 'replace ('
  grep -E '=> ./staging' "$mod" | awk -v v="$STAGING_VERSION" '{print "\t"$1" => "$1" "v}'
  echo ')'
} >go.mod
{
  printf '//go:build tools\n\npackage kubebuild\n\nimport (\n'
  for c in "${cmds[@]}"; do printf '\t_ "k8s.io/kubernetes/cmd/%s"\n' "$c"; done
  printf ')\n'
} >tools.go
echo "build-kube: building ${cmds[*]} $KUBE_VERSION into $dir/bin (about 7 minutes on 2 cores with an empty Go cache)" >&2
go mod tidy >&2
minor=${KUBE_VERSION#v1.}; minor=${minor%%.*}
pkgs=()
for c in "${cmds[@]}"; do pkgs+=("k8s.io/kubernetes/cmd/$c"); done
rm -rf "$dir/bin.tmp"
mkdir -p "$dir/bin.tmp"
go build -trimpath -o "$dir/bin.tmp/" \
  -ldflags "-s -w -X k8s.io/component-base/version.gitVersion=$KUBE_VERSION -X k8s.io/component-base/version.gitMajor=1 -X k8s.io/component-base/version.gitMinor=$minor" \
  "${pkgs[@]}" >&2
rm -rf "$dir/bin"
mv "$dir/bin.tmp" "$dir/bin"
echo "$dir/bin"
