# bgtaskd — the two commands:
#   make run     build and run the daemon on the per-user socket, default configuration
#   make check   build and run the whole test suite
# Both install what they need (scripts/install-deps) first.

SWIFT       ?= swift
RUNTIME_DIR ?= $(or $(XDG_RUNTIME_DIR),/run/user/$(shell id -u))
SOCKET      ?= $(RUNTIME_DIR)/bgtaskd/io.bgtaskd

# make install [PREFIX=/usr/local] [DESTDIR=]
PREFIX        ?= /usr/local
BINDIR        ?= $(PREFIX)/bin
SBINDIR       ?= $(PREFIX)/sbin
SYSCONFDIR    ?= /etc
DATADIR       ?= $(PREFIX)/share
MANDIR        ?= $(DATADIR)/man
UNITDIR       ?= $(PREFIX)/lib/systemd/system
USERUNITDIR   ?= $(PREFIX)/lib/systemd/user
COMPLETIONDIR ?= $(DATADIR)/bash-completion/completions
# Release binaries carry the Swift runtime, so they run where the toolchain is not.
RELEASE_FLAGS ?= -c release --static-swift-stdlib

.PHONY: all deps test-deps build release run check fuzz sanitize soak bench install install-files clean

all: build

deps:
	scripts/install-deps

test-deps:
	scripts/install-deps --test

build: deps
	$(SWIFT) build

release: deps
	$(SWIFT) build $(RELEASE_FLAGS)

# The daemon in the foreground on $XDG_RUNTIME_DIR/bgtaskd/io.bgtaskd; Ctrl-C stops it.
# In another shell: export BGTASKD_SOCKET=$(SOCKET); .build/release/bgtaskctl status
run: release
	@echo "bgtaskd on $(SOCKET) (export BGTASKD_SOCKET=$(SOCKET) for bgtaskctl)"
	exec .build/release/bgtaskd --socket $(SOCKET)

# The benchmark (release build): a table on stdout, JSON in bench-results.json. Not in CI.
bench: release
	.build/release/bgtaskd-bench --json bench-results.json

# The release build is for the systemd tests, which install it into a container. Then the
# fuzz targets, FUZZ_SECONDS each.
FUZZ_SECONDS ?= 60
check: test-deps
	$(SWIFT) build --build-tests
	$(SWIFT) build $(RELEASE_FLAGS)
	$(SWIFT) test
	scripts/fuzz $(FUZZ_SECONDS)

# libFuzzer on the Varlink decoder and the configuration parser: make fuzz FUZZ_SECONDS=3600
fuzz:
	scripts/fuzz $(FUZZ_SECONDS)

# The whole suite (daemon and tools included) under AddressSanitizer, then ThreadSanitizer,
# each in its own build directory. Not in CI: about ten minutes.
sanitize: test-deps
	scripts/sanitize address thread

# Thousands of apps going back and forth for SOAK_SECONDS (default 600) against the release
# daemon: memory and descriptors must stay flat. Not in CI.
SOAK_SECONDS ?= 600
soak: release
	.build/release/bgtaskd-bench --soak $(SOAK_SECONDS)

install: release install-files

# Copies what `release` built; the systemd tests call it directly.
install-files:
	install -Dm755 .build/release/bgtaskd $(DESTDIR)$(SBINDIR)/bgtaskd
	install -Dm755 .build/release/bgtaskctl $(DESTDIR)$(BINDIR)/bgtaskctl
	install -Dm644 systemd/bgtaskd.socket $(DESTDIR)$(UNITDIR)/bgtaskd.socket
	install -Dm644 systemd/user/bgtaskd.socket $(DESTDIR)$(USERUNITDIR)/bgtaskd.socket
	install -d $(DESTDIR)$(UNITDIR) $(DESTDIR)$(USERUNITDIR)
	sed 's|@SBINDIR@|$(SBINDIR)|g; s|@BINDIR@|$(BINDIR)|g' systemd/bgtaskd.service.in > $(DESTDIR)$(UNITDIR)/bgtaskd.service
	sed 's|@SBINDIR@|$(SBINDIR)|g; s|@BINDIR@|$(BINDIR)|g' systemd/user/bgtaskd.service.in > $(DESTDIR)$(USERUNITDIR)/bgtaskd.service
	chmod 644 $(DESTDIR)$(UNITDIR)/bgtaskd.service $(DESTDIR)$(USERUNITDIR)/bgtaskd.service
	@# An existing configuration is the administrator's: never overwrite it.
	[ -e $(DESTDIR)$(SYSCONFDIR)/bgtaskd/bgtaskd.conf ] || \
		install -Dm644 config/bgtaskd.conf $(DESTDIR)$(SYSCONFDIR)/bgtaskd/bgtaskd.conf
	install -d $(DESTDIR)$(SYSCONFDIR)/bgtaskd/bgtaskd.conf.d $(DESTDIR)$(SYSCONFDIR)/bgtaskd/policy.d
	install -Dm644 config/example.policy $(DESTDIR)$(DATADIR)/bgtaskd/example.policy
	install -Dm644 Sources/BGTaskDaemon/io.bgtaskd.varlink $(DESTDIR)$(DATADIR)/bgtaskd/io.bgtaskd.varlink
	install -Dm644 man/bgtaskd.8 $(DESTDIR)$(MANDIR)/man8/bgtaskd.8
	install -Dm644 man/bgtaskctl.1 $(DESTDIR)$(MANDIR)/man1/bgtaskctl.1
	install -Dm644 man/bgtaskd.conf.5 $(DESTDIR)$(MANDIR)/man5/bgtaskd.conf.5
	install -Dm644 completion/bgtaskctl.bash $(DESTDIR)$(COMPLETIONDIR)/bgtaskctl

clean:
	rm -rf .build
