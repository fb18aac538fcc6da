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
LIBDIR        ?= $(PREFIX)/lib
INCLUDEDIR    ?= $(PREFIX)/include
PKGCONFIGDIR  ?= $(LIBDIR)/pkgconfig
# libbgtask: the C library (libbgtask/), its ABI versioned by libbgtask/libbgtask.sym.
LIB_VERSION   := 0.1.0
LIB_SONAME    := libbgtask.so.0
LIB_BUILD     := build/libbgtask
CC            ?= cc
LIB_CFLAGS    ?= -O2 -g -Wall -Wextra -Werror
LIB_LDFLAGS   ?=
# Release binaries carry the Swift runtime, so they run where the toolchain is not.
RELEASE_FLAGS ?= -c release --static-swift-stdlib

.PHONY: all deps test-deps build release lib run check package-check fuzz sanitize soak bench install install-files install-lib deb clean

all: build

deps:
	scripts/install-deps

test-deps:
	scripts/install-deps --test

build: deps
	$(SWIFT) build

release: deps
	$(SWIFT) build $(RELEASE_FLAGS)

# libbgtask.so.0 (only bgtask_* exported, at version LIBBGTASK_0), its header and bgtask.pc.
lib: $(LIB_BUILD)/libbgtask.so.$(LIB_VERSION)

LIB_SOURCES := libbgtask/bgtask.c libbgtask/bgtask-io.c libbgtask/bgtask-state.c libbgtask/json.c
$(LIB_BUILD)/libbgtask.so.$(LIB_VERSION): $(LIB_SOURCES) libbgtask/bgtask.h libbgtask/bgtask-internal.h libbgtask/json.h libbgtask/libbgtask.sym
	mkdir -p $(LIB_BUILD)
	$(CC) -std=c11 $(LIB_CFLAGS) $(CPPFLAGS) -fPIC -fvisibility=hidden -shared -Wl,-soname,$(LIB_SONAME) \
		-Wl,--version-script=libbgtask/libbgtask.sym -Wl,-z,defs $(LIB_LDFLAGS) $(LDFLAGS) \
		-o $@ $(LIB_SOURCES) -lm
	ln -sf libbgtask.so.$(LIB_VERSION) $(LIB_BUILD)/$(LIB_SONAME)
	ln -sf $(LIB_SONAME) $(LIB_BUILD)/libbgtask.so

# The daemon in the foreground on $XDG_RUNTIME_DIR/bgtaskd/io.bgtaskd; Ctrl-C stops it.
# In another shell: export BGTASKD_SOCKET=$(SOCKET); .build/release/bgtaskctl status
run: release
	@echo "bgtaskd on $(SOCKET) (export BGTASKD_SOCKET=$(SOCKET) for bgtaskctl)"
	exec .build/release/bgtaskd --socket $(SOCKET)

# The benchmark (release build): every figure with its target, PASS or MISS; JSON in
# bench-results.json, and the table in README.md regenerated from it. Not in CI. Needs
# root and systemd-nspawn for the logind comparison, valgrind for the instruction count.
bench: release
	scripts/install-deps --bench
	.build/release/bgtaskd-bench --json bench-results.json
	scripts/bench-readme

# The release build is for the systemd tests, which install it into a container. Then the
# fuzz targets, FUZZ_SECONDS each.
FUZZ_SECONDS ?= 60
check: test-deps
	$(SWIFT) build --build-tests
	$(SWIFT) build $(RELEASE_FLAGS)
	$(MAKE) lib
	$(SWIFT) test --skip UnprivilegedFloodTests
	@# The floods measure root's latency: alone, not beside forty other suites on two cores.
	$(SWIFT) test --skip-build --filter UnprivilegedFloodTests
	$(MAKE) package-check
	scripts/fuzz $(FUZZ_SECONDS)

# The Debian packages built (make deb, lintian included) and installed in a real systemd in
# a container (Tests/systemd/package-test.sh). Outside `swift test`, whose lock on .build the
# package's own `swift build` would wait for.
package-check:
	@if [ "$$(id -u)" != 0 ] || ! command -v systemd-nspawn >/dev/null 2>&1; then \
		echo "package-check skipped: installing packages in a container needs root and systemd-nspawn"; \
	else \
		$(MAKE) deb && bash Tests/systemd/package-test.sh; \
	fi

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

install: release lib install-files install-lib

# The Debian packages (bgtaskd, libbgtask0, libbgtask-dev) into build/deb, with the Swift
# toolchain on PATH: dpkg-buildpackage -b -us -uc, then lintian on the result.
deb:
	scripts/install-deps --deb
	dpkg-buildpackage -b -us -uc
	rm -rf build/deb
	mkdir -p build/deb
	mv ../bgtaskd_$(LIB_VERSION)_*.deb ../bgtaskd-dbgsym_$(LIB_VERSION)_*.deb ../libbgtask0_$(LIB_VERSION)_*.deb \
		../libbgtask0-dbgsym_$(LIB_VERSION)_*.deb ../libbgtask-dev_$(LIB_VERSION)_*.deb \
		../bgtaskd_$(LIB_VERSION)_*.buildinfo ../bgtaskd_$(LIB_VERSION)_*.changes build/deb/
	lintian --fail-on error build/deb/bgtaskd_$(LIB_VERSION)_*.changes

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

install-lib: lib
	install -Dm644 $(LIB_BUILD)/libbgtask.so.$(LIB_VERSION) $(DESTDIR)$(LIBDIR)/libbgtask.so.$(LIB_VERSION)
	ln -sf libbgtask.so.$(LIB_VERSION) $(DESTDIR)$(LIBDIR)/$(LIB_SONAME)
	ln -sf $(LIB_SONAME) $(DESTDIR)$(LIBDIR)/libbgtask.so
	install -Dm644 libbgtask/bgtask.h $(DESTDIR)$(INCLUDEDIR)/bgtask.h
	install -d $(DESTDIR)$(PKGCONFIGDIR)
	sed 's|@prefix@|$(PREFIX)|; s|@includedir@|$(INCLUDEDIR)|; s|@libdir@|$(LIBDIR)|; s|@version@|$(LIB_VERSION)|' \
		libbgtask/bgtask.pc.in > $(DESTDIR)$(PKGCONFIGDIR)/bgtask.pc

clean:
	rm -rf .build build
