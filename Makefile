# `make test` is what CI runs: it installs what the tests need, then checks
# that the generated Protobuf code is current, runs vet, staticcheck, the
# race-enabled tests of both modules, and a short fuzz pass of every fuzz
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

.PHONY: test deps vet staticcheck unit interop fuzz bench build generate generate-check

test: deps generate-check vet staticcheck unit interop fuzz

deps:
	./scripts/install-deps.sh

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

unit:
	$(GO) test -race ./...

interop:
	cd interop && $(GO) test -race ./...

fuzz:
	FUZZTIME=$(FUZZTIME) ./scripts/fuzz.sh

# Benchmarks against go-ipfix, in one run; see docs/performance.md.
bench:
	$(GO) install $(BENCHSTAT)
	cd interop && $(GO) test -run='^$$' -bench=. -benchmem -count=6 | tee ../bench.txt
	$(GOBIN)/benchstat bench.txt

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
