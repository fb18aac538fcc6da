# bgtaskd — the two commands:
#   make run     build and run the daemon on the per-user socket, default configuration
#   make check   build and run the whole test suite
# Both install what they need (scripts/install-deps) first.

SWIFT       ?= swift
RUNTIME_DIR ?= $(or $(XDG_RUNTIME_DIR),/run/user/$(shell id -u))
SOCKET      ?= $(RUNTIME_DIR)/bgtaskd/io.bgtaskd

.PHONY: all deps test-deps build release run check clean

all: build

deps:
	scripts/install-deps

test-deps:
	scripts/install-deps --test

build: deps
	$(SWIFT) build

release: deps
	$(SWIFT) build -c release

# The daemon in the foreground on $XDG_RUNTIME_DIR/bgtaskd/io.bgtaskd; Ctrl-C stops it.
# In another shell: export BGTASKD_SOCKET=$(SOCKET); .build/release/bgtaskctl status
run: release
	@echo "bgtaskd on $(SOCKET) (export BGTASKD_SOCKET=$(SOCKET) for bgtaskctl)"
	exec .build/release/bgtaskd --socket $(SOCKET)

check: test-deps
	$(SWIFT) build --build-tests
	$(SWIFT) test

clean:
	rm -rf .build
