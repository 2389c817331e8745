#!/usr/bin/env bash
# Builds the reference's flow-aggregator (antrea-io/antrea cmd/flow-aggregator) from the
# snapshot fetched under /work/.mirror, for the process-level race (make bench-reference).
#
# The module proxy refuses antrea.io/libOpenflow, antrea.io/ofnet and the reference's
# lumberjack fork. The aggregator needs none of them, so in a scratch copy of the tree:
#   - pkg/agent/types gets its own two stand-in types for pkg/ovs/openflow's Protocol and
#     GroupIDType (the only things it takes from that package), written below;
#   - go.mod drops the two OpenFlow modules and the lumberjack replace (upstream
#     gopkg.in/natefinch/lumberjack.v2 is used).
# Version ldflags are set, because the reference's API server panics on version "UNKNOWN".
#
# Output: ~/.cache/sluice/reference-<short commit>/flow-aggregator (+ build.info).
# Idempotent: a finished build for the same commit and patch is reused.
#
# Env: REFERENCE_GIT_DIR (bare git dir of the snapshot), REFERENCE_REV (default HEAD),
#      SLUICE_CACHE (default ~/.cache/sluice).
set -euo pipefail

die() { echo "build-reference-aggregator: $*" >&2; exit 1; }

git_dir=${REFERENCE_GIT_DIR:-/work/.mirror/antrea-io+antrea/repo}
rev=${REFERENCE_REV:-HEAD}
cache=${SLUICE_CACHE:-$HOME/.cache/sluice}

[ -d "$git_dir" ] || die "no snapshot at $git_dir (fetch github:antrea-io/antrea first, or set REFERENCE_GIT_DIR)"
command -v go >/dev/null || die "go not on PATH"
commit=$(git --git-dir="$git_dir" rev-parse --verify "$rev^{commit}" 2>/dev/null) || die "no commit $rev in $git_dir"
short=${commit:0:9}
out="$cache/reference-$short"
bin="$out/flow-aggregator"
# Bump when the patch below changes, so an old build is not reused.
patch_version=1

if [ -x "$bin" ] && [ -f "$out/build.info" ] && grep -qx "patch=$patch_version" "$out/build.info"; then
	echo "$bin"
	exit 0
fi

mkdir -p "$out"
src="$out/src"
rm -rf "$src"
mkdir -p "$src"
git --git-dir="$git_dir" archive "$commit" | tar -x -C "$src" || die "extracting $commit failed"
cd "$src"

[ -f cmd/flow-aggregator/main.go ] || die "snapshot $short has no cmd/flow-aggregator"

# 1. pkg/agent/types: local stand-ins for the two pkg/ovs/openflow types.
types=pkg/agent/types
grep -q 'antrea.io/antrea/v2/pkg/ovs/openflow"' $types/*.go || die "$types no longer imports pkg/ovs/openflow; the patch needs review"
cat > $types/zz_openflow_standins.go <<'GO'
package types

// Stand-ins for the two pkg/ovs/openflow types this package uses, so that building the
// flow aggregator does not pull in the OpenFlow libraries (added by sluice's
// scripts/build-reference-aggregator.sh; not part of the reference).

// OFProtocol stands in for openflow.Protocol.
type OFProtocol string

// OFGroupIDType stands in for openflow.GroupIDType.
type OFGroupIDType uint32
GO
for f in $types/*.go; do
	case $f in *_test.go) continue ;; esac
	grep -q 'pkg/ovs/openflow"' "$f" || continue
	sed -i -E \
		-e '/^[[:space:]]*(binding |openflow )?"antrea.io\/antrea\/v2\/pkg\/ovs\/openflow"$/d' \
		-e 's/\b(binding|openflow)\.Protocol\b/OFProtocol/g' \
		-e 's/\b(binding|openflow)\.GroupIDType\b/OFGroupIDType/g' \
		"$f"
	if grep -qE '\b(binding|openflow)\.' "$f"; then
		die "$f uses more of pkg/ovs/openflow than Protocol and GroupIDType: $(grep -nE '\b(binding|openflow)\.' "$f" | head -3)"
	fi
done
# The package's tests use more of openflow; they are not built here.
rm -f $types/*_test.go

# 2. go.mod: no OpenFlow modules, upstream lumberjack.
go mod edit \
	-droprequire antrea.io/libOpenflow \
	-droprequire antrea.io/ofnet \
	-dropreplace gopkg.in/natefinch/lumberjack.v2

# 3. Build with version ldflags.
version=$(head -n1 VERSION 2>/dev/null || echo v0.0.0)
ldflags="-s -w -X antrea.io/antrea/v2/pkg/version.Version=$version -X antrea.io/antrea/v2/pkg/version.GitSHA=$short -X antrea.io/antrea/v2/pkg/version.GitTreeState=dirty -X antrea.io/antrea/v2/pkg/version.ReleaseStatus=unreleased"
echo "build-reference-aggregator: building flow-aggregator $version ($short) in $src" >&2
GOFLAGS="${GOFLAGS:+$GOFLAGS }-mod=mod" go build -o "$bin.tmp" -ldflags "$ldflags" ./cmd/flow-aggregator \
	|| die "go build of cmd/flow-aggregator failed (see above)"
mv "$bin.tmp" "$bin"
{
	echo "commit=$commit"
	echo "version=$version"
	echo "go=$(go version)"
	echo "patch=$patch_version"
	echo "built=$(date -u +%Y-%m-%dT%H:%M:%SZ)"
} > "$out/build.info"
echo "$bin"
