# `make test` is what CI runs: it installs what the tests need, then checks
# that the generated Protobuf code is current, runs vet, staticcheck, the
# race-enabled tests of both modules (and the huge-page table without the
# race detector), and a short fuzz pass of every fuzz
# target.

GO            ?= go
GOBIN         ?= $(shell $(GO) env GOPATH)/bin
FUZZTIME      ?= 20s
STATICCHECK   := honnef.co/go/tools/cmd/staticcheck@v0.8.2
BENCHSTAT     := golang.org/x/perf/cmd/benchstat@v0.0.0-20260908200009-22c9c6c9d4da
# `make generate` regenerates flow/flowpb from proto/ byte for byte with
# exactly these versions (protoc from Debian 12's protobuf-compiler and
# libprotobuf-dev). Tests use the committed code and need none of them.
PROTOC_VERSION     := 3.21.12
PROTOC_GEN_GO      := google.golang.org/protobuf/cmd/protoc-gen-go@v1.36.12
PROTOC_GEN_GO_GRPC := google.golang.org/grpc/cmd/protoc-gen-go-grpc@v1.6.0
# Interop tests fail, rather than skip, when a peer program is missing.
export SLUICE_REQUIRE_PEERS ?= 1

# The Kubernetes tests (test/kube), the S3 sink's tests (versitygw) and
# `make manifests` use these, built once from their Go modules into
# $(SLUICE_CACHE) by scripts/build-*.sh.
KUBE_VERSION  := v1.37.2
VERSITYGW_VERSION := v1.8.0
HELM_VERSION  := v4.3.2
SLUICE_CACHE  ?= $(HOME)/.cache/sluice
export SLUICE_CACHE
HELM          := $(SLUICE_CACHE)/helm-$(HELM_VERSION)/helm

# The release is the chart's appVersion, and nothing else: `make image`
# stamps the binary with it and names the image as the chart's default
# image (sluice:v<appVersion>; the image's index carries the normalized
# name docker.io/library/sluice:v<appVersion> that kubelet looks for).
VERSION       := $(shell sed -n 's/^appVersion: *"*\([^"]*\)"* *$$/\1/p' deploy/helm/sluice/Chart.yaml)
IMAGE_REF     := sluice:v$(VERSION)
STATIC_BINARY := bin/sluice-linux-static

.PHONY: cluster-test cluster-up cluster-down test deps vet staticcheck unit interop fuzz bench bench-reference soak build generate generate-check manifests manifests-check image ui ui-check ui-screenshots

test: deps ui-check generate-check manifests-check vet staticcheck unit interop cluster-test fuzz

deps:
	./scripts/install-deps.sh
	KUBE_VERSION=$(KUBE_VERSION) ./scripts/build-kube.sh >/dev/null
	HELM_VERSION=$(HELM_VERSION) ./scripts/build-helm.sh >/dev/null
	VERSITYGW_VERSION=$(VERSITYGW_VERSION) ./scripts/build-versitygw.sh >/dev/null

build:
	$(GO) build -o bin/sluice ./cmd/sluice

vet:
	@test -z "$$(gofmt -l $$(git ls-files '*.go'))" || { echo "gofmt needed:"; gofmt -l $$(git ls-files '*.go'); exit 1; }
	$(GO) vet ./...
	cd interop && $(GO) vet ./...

staticcheck:
	$(GO) install $(STATICCHECK)
	$(GOBIN)/staticcheck ./...
	cd interop && $(GOBIN)/staticcheck ./...

# 20m: the Kubernetes tests build the sluice binary first. The image test
# takes the static binary `make image` built (SLUICE_STATIC_BINARY) rather
# than compiling it again with flags no other build shares.
unit: image
	SLUICE_STATIC_BINARY=$(CURDIR)/$(STATIC_BINARY) $(GO) test -race -timeout 20m ./...
	# Without the race detector too where the code differs: the flow table
	# is mapped in huge pages only then (package internal/bigmem).
	$(GO) test -count=1 ./aggregate ./internal/bigmem

interop:
	cd interop && $(GO) test -race ./...

# The real-cluster tests (test/cluster): scripts/local-cluster.sh brings up
# a single-node Kubernetes cluster (kubelet, containerd, CNI, kube-proxy)
# with the image `make image` writes, the tests `helm install` the chart
# and drive a workload, and the cluster is taken down. On their own, after
# the other tests: they change the machine's network while they run.
cluster-test:
	SLUICE_CLUSTER_TESTS=1 $(GO) test -race -count=1 -timeout 30m ./test/cluster

# A cluster to try a change on by hand (docs/development.md).
cluster-up:
	./scripts/local-cluster.sh up
cluster-down:
	./scripts/local-cluster.sh down

fuzz:
	FUZZTIME=$(FUZZTIME) ./scripts/fuzz.sh

# The soak (fault scenario 8, not part of `make test`, which runs it for
# 10 s at 20,000 records/s): a Proxy-mode aggregator at a steady rate,
# heap, goroutines and file descriptors sampled, every record counted.
# The table goes to soak.txt; see docs/reliability.md.
SOAK_DURATION ?= 10m
SOAK_RATE     ?= 100000
soak:
	SLUICE_SOAK_DURATION=$(SOAK_DURATION) SLUICE_SOAK_RATE=$(SOAK_RATE) SLUICE_SOAK_REPORT=$(CURDIR)/soak.txt \
		$(GO) test -count=1 -run '^TestSoak$$' -timeout 60m -v ./test/fault

# Benchmarks against go-ipfix, in one run; see docs/performance.md.
bench:
	$(GO) install $(BENCHSTAT)
	cd interop && $(GO) test -run='^$$' -bench=. -benchmem -count=6 | tee ../bench.txt
	$(GOBIN)/benchstat bench.txt

# The race of whole processes against the reference's flow-aggregator
# (not part of `make test`): builds the reference from the fetched snapshot
# (scripts/build-reference-aggregator.sh, cached in $(SLUICE_CACHE)) and
# sluice, then bench/race runs both against the kube-apiserver `make deps`
# built, in interleaved rounds. Needs root (the reference runs under
# `unshare -m`) and free ports 4739, 14739 and 10348. The table goes to
# bench-reference.txt, the runs as benchmark lines to
# bench-reference-runs.txt; see docs/performance.md.
RACE_FLOWS    ?= 100k,1M,3M
RACE_ROUNDS   ?= 2
RACE_ARGS     ?=
bench-reference:
	./scripts/build-reference-aggregator.sh >/dev/null
	$(GO) build -o bin/sluice ./cmd/sluice
	$(GO) build -o bin/race ./bench/race
	$(GO) install $(BENCHSTAT)
	bin/race -reference "$$(./scripts/build-reference-aggregator.sh)" -sluice bin/sluice \
		-rounds $(RACE_ROUNDS) -flows $(RACE_FLOWS) -bench-out bench-reference-runs.txt $(RACE_ARGS) >bench-reference.txt \
		|| { cat bench-reference.txt; exit 1; }
	$(GOBIN)/benchstat -col /impl bench-reference-runs.txt >>bench-reference.txt
	cat bench-reference.txt

generate:
	@protoc --version 2>/dev/null | grep -qx 'libprotoc $(PROTOC_VERSION)' || { echo "generate: need protoc $(PROTOC_VERSION) (apt-get install protobuf-compiler libprotobuf-dev)"; exit 1; }
	$(GO) install $(PROTOC_GEN_GO)
	$(GO) install $(PROTOC_GEN_GO_GRPC)
	PATH="$(GOBIN):$$PATH" protoc -I . -I /usr/include \
		--go_out=. --go_opt=module=sluice --go-grpc_out=. --go-grpc_opt=module=sluice \
		proto/flow/v1alpha1/*.proto

# generate-check fails when the committed flow/flowpb differs from what
# `make generate` makes of proto/: a .proto edited without regenerating, or
# generated code edited by hand. Files it would add count too.
generate-check: generate
	@git diff --exit-code --stat -- flow/flowpb || { echo "generate-check: flow/flowpb is not what 'make generate' makes; run it and commit the result"; exit 1; }
	@test -z "$$(git ls-files --others --exclude-standard -- flow/flowpb)" || { echo "generate-check: 'make generate' made files that are not committed:"; git ls-files --others --exclude-standard -- flow/flowpb; exit 1; }

# `make ui` rebuilds the web UI's bundle (ui/dist, embedded in the binary
# and committed, so that `go build` needs no Node) from ui/web with the
# locked npm packages. The build is deterministic: fixed file names, no
# source maps.
ui:
	cd ui/web && npm ci --no-audit --no-fund && npm run build

# ui-check fails when the committed bundle is not what `make ui` makes of
# ui/web: sources edited without rebuilding, or the bundle edited by hand.
ui-check: ui
	@git diff --exit-code --stat -- ui/dist || { echo "ui-check: ui/dist is not what 'make ui' makes of ui/web; run it and commit the result"; exit 1; }
	@test -z "$$(git ls-files --others --exclude-standard -- ui/dist)" || { echo "ui-check: 'make ui' made files that are not committed:"; git ls-files --others --exclude-standard -- ui/dist; exit 1; }

# The screenshots docs/ui.md shows, taken by the browser tests against a
# running demo (the tests alone save them under the temporary directory).
ui-screenshots:
	SLUICE_UI_SCREENSHOTS=$(CURDIR)/docs/ui $(GO) test -count=1 -run 'TestUIInBrowser' ./cmd/sluice

# deploy/sluice.yaml is the chart rendered with its default values (plus
# its Namespace), for `kubectl apply -f` without Helm.
manifests:
	@HELM_VERSION=$(HELM_VERSION) ./scripts/build-helm.sh >/dev/null
	{ echo "# Generated by 'make manifests' from deploy/helm/sluice with its default values; do not edit."; \
	  $(HELM) template flow-aggregator deploy/helm/sluice --namespace flow-aggregator --set createNamespace=true; } >deploy/sluice.yaml.tmp
	mv deploy/sluice.yaml.tmp deploy/sluice.yaml

# manifests-check fails when deploy/sluice.yaml is not what `make manifests`
# makes of the chart.
manifests-check: manifests
	@git diff --exit-code --stat -- deploy/sluice.yaml || { echo "manifests-check: deploy/sluice.yaml is stale; run 'make manifests' and commit it"; exit 1; }
	@test -z "$$(git ls-files --others --exclude-standard -- deploy/sluice.yaml)" || { echo "manifests-check: deploy/sluice.yaml is not committed"; exit 1; }

# The container image as an OCI layout tar, built without a container
# daemon or registry: bin/sluice-image.tar (see Dockerfile for the same
# image with a builder).
image:
	CGO_ENABLED=0 $(GO) build -trimpath -ldflags "-s -w -X main.version=$(VERSION)" -o $(STATIC_BINARY) ./cmd/sluice
	$(GO) run ./cmd/sluice-image -binary $(STATIC_BINARY) -o bin/sluice-image.tar -ref $(IMAGE_REF)
