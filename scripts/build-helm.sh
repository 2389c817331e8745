#!/usr/bin/env bash
# Builds the pinned Helm from its Go module, once, into a cache folder
# outside the repository. `make manifests` and the chart tests use it.
# Prints the binary's path on stdout.
set -euo pipefail

HELM_VERSION=${HELM_VERSION:-v4.3.2}
CACHE=${SLUICE_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/sluice}
dir=$CACHE/helm-$HELM_VERSION
if [[ ! -x $dir/helm ]]; then
  echo "build-helm: building helm $HELM_VERSION into $dir" >&2
  mkdir -p "$dir"
  # Outside any module, so that the repository's go.mod is not consulted.
  (cd / && GOBIN=$dir GOFLAGS=-buildvcs=false go install -trimpath -ldflags "-s -w" "helm.sh/helm/v4/cmd/helm@$HELM_VERSION") >&2
fi
echo "$dir/helm"
