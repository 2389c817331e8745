# `make test` is what CI runs: it installs what the tests need, then runs
# vet, staticcheck, the race-enabled tests of both modules, and a short
# fuzz pass of every fuzz target.

GO            ?= go
GOBIN         ?= $(shell $(GO) env GOPATH)/bin
FUZZTIME      ?= 20s
STATICCHECK   := honnef.co/go/tools/cmd/staticcheck@v0.8.2
BENCHSTAT     := golang.org/x/perf/cmd/benchstat@v0.0.0-20260908200009-22c9c6c9d4da
# Interop tests fail, rather than skip, when a peer program is missing.
export SLUICE_REQUIRE_PEERS ?= 1

.PHONY: test deps vet staticcheck unit interop fuzz bench build

test: deps vet staticcheck unit interop fuzz

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
