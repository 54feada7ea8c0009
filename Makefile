# The README's two commands: `make demo` and `make test`. Both install what
# they need (Debian packages through apt-get when root, Go modules).
GO        ?= go
RACE_PKGS  = ./uct/... ./internal/...
export GOFLAGS ?=

.PHONY: all deps deps-vm build vet test test-host test-vm demo bench clean

all: build

deps:
	@scripts/deps.sh go

deps-vm:
	@scripts/deps.sh vm

build: deps
	$(GO) build ./...
	CGO_ENABLED=0 $(GO) build ./...

vet: deps
	$(GO) vet ./...

# Host suite (race detector on everything concurrent), then the Soft-RoCE VM suite.
test: deps-vm vet test-host test-vm

test-host:
	CGO_ENABLED=0 $(GO) build ./...
	$(GO) test -race -timeout 20m ./...

test-vm:
	@if [ -x scripts/vm-test.sh ]; then scripts/vm-test.sh; else echo "test-vm: no VM suite yet"; fi

demo: deps
	@scripts/demo.sh

bench: deps
	$(GO) test -run '^$$' -bench . -benchtime 2s ./uct/... ./rdmanet/...

clean:
	rm -rf bin *.test
