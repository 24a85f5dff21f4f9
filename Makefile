# vfio-ntb: one plain Makefile.  `make check` installs dependencies, configures, builds, prepares
# the testbed and runs every test; `make demo` shows a guest using a device served by vfio-ntb.

.DEFAULT_GOAL := all

-include config.mak

# config.mak is remade (dependencies installed first) when missing; make then restarts.
config.mak: configure scripts/install-deps
	scripts/install-deps
	./configure $(CONFIGURE_FLAGS)

# The build directory; the sanitizer and coverage builds use their own (check-asan etc.).
B ?= build
# Extra compiler and linker flags of those builds.
SAN_CFLAGS ?=
SAN_LDFLAGS ?=
PYTHON ?= /usr/bin/python3
INC = -Ivfio-ntb -I. -I$(B)/trace
ALL_CFLAGS = $(CFLAGS) $(SAN_CFLAGS) $(INC) $(GLIB_CFLAGS) $(XML_CFLAGS) $(LIBVIRT_CFLAGS) \
	$(PCI_CFLAGS) $(SYSTEMD_CFLAGS) $(SECCOMP_CFLAGS)

# ntbctl's own files (its formatting and `top`, which check_top drives, and the control
# client in vfio-ntb/client/ are in the library).
NTBCTL_SRCS := $(filter-out vfio-ntb/ctl/ntbctl-top.c,$(wildcard vfio-ntb/ctl/ntbctl*.c))
LIB_SRCS := $(wildcard vfio-ntb/common/*.c) $(wildcard vfio-ntb/vfio-user/*.c) \
	$(wildcard vfio-ntb/fabric/*.c) $(filter-out vfio-ntb/lending/worker.c,$(wildcard vfio-ntb/lending/*.c)) \
	$(filter-out vfio-ntb/borrower/worker.c,$(wildcard vfio-ntb/borrower/*.c)) \
	$(filter-out vfio-ntb/daemon/vfio-ntbd.c,$(wildcard vfio-ntb/daemon/*.c)) \
	$(wildcard vfio-ntb/client/*.c) $(filter-out $(NTBCTL_SRCS),$(wildcard vfio-ntb/ctl/*.c))
SIMDEV_SRCS := $(filter-out vfio-ntb/simdev/simdev.c vfio-ntb/simdev/ntbsim.c,\
	$(wildcard vfio-ntb/simdev/*.c))
# libvirt integration (libxml2, libvirt): only ntbctl, the hook and their tests link it.
VIRT_SRCS := $(filter-out vfio-ntb/libvirt/hook.c,$(wildcard vfio-ntb/libvirt/*.c))
VIRT_OBJS := $(VIRT_SRCS:%.c=$(B)/%.o)
# Trace points: scripts/tracetool makes $(B)/trace/trace-DIR.h from each directory's
# trace-events (rewriting only what changed) and the table of all of them.
TRACE_EVENTS := $(wildcard vfio-ntb/*/trace-events)
TRACE_STAMP = $(B)/trace/.stamp
LIB_OBJS = $(LIB_SRCS:%.c=$(B)/%.o) $(B)/trace/trace-table.o
SIMDEV_OBJS := $(SIMDEV_SRCS:%.c=$(B)/%.o)
UNIT_SRCS := $(wildcard tests/unit/check_*.c)
UNIT_BINS := $(UNIT_SRCS:tests/unit/%.c=$(B)/tests/%)
BENCH_SRCS := $(wildcard bench/*.c)
BENCH_BINS := $(BENCH_SRCS:bench/%.c=$(B)/bench/%)
PROGS := $(B)/vfio-ntb-simdev $(B)/vfio-ntb-ntbsim $(B)/vfio-ntbd $(B)/vfio-ntb-borrower $(B)/vfio-ntb-lender $(B)/ntbctl \
	$(B)/vfio-ntb-libvirt-hook

.PHONY: lint circles format format-check modules install-modules install-dkms all check check-fast check-unit check-e2e check-asan check-tsan asan-build tsan-build coverage install clean demo testbed testbed-stock qemu bench fuzz fuzz-run fuzz-seeds distclean

all: $(PROGS) $(UNIT_BINS) $(BENCH_BINS) $(B)/kmod-selftest

# Each compile also writes which headers it read (-MMD, a .d beside its output; -MP: a
# header removed later is no error), so a changed header rebuilds only what includes it.
DEPFLAGS = -MMD -MP
-include $(wildcard $(B)/*.d $(B)/*/*.d $(B)/*/*/*.d $(B)/*/*/*/*.d $(B)/*/*/*/*/*.d)

$(TRACE_STAMP): $(TRACE_EVENTS) scripts/tracetool
	@mkdir -p $(dir $@)
	$(PYTHON) scripts/tracetool $(B)/trace $(TRACE_EVENTS)
	@touch $@

$(B)/trace/trace-table.c: $(TRACE_STAMP) ;

$(B)/trace/trace-table.o: $(TRACE_STAMP) config.mak
	$(CC) $(ALL_CFLAGS) $(DEPFLAGS) -c -o $@ $(B)/trace/trace-table.c

$(B)/%.o: %.c config.mak | $(TRACE_STAMP)
	@mkdir -p $(dir $@)
	$(CC) $(ALL_CFLAGS) $(DEPFLAGS) -c -o $@ $<

$(B)/libvfio-ntb.a: $(LIB_OBJS)
	@rm -f $@
	ar rcs $@ $^

$(B)/libsimdev.a: $(SIMDEV_OBJS)
	@rm -f $@
	ar rcs $@ $^

$(B)/libvn-libvirt.a: $(VIRT_OBJS)
	@rm -f $@
	ar rcs $@ $^

$(B)/vfio-ntb-simdev: $(B)/vfio-ntb/simdev/simdev.o $(B)/libsimdev.a $(B)/libvfio-ntb.a
	$(CC) $(LDFLAGS) $(SAN_LDFLAGS) -o $@ $^ $(GLIB_LIBS) $(PCI_LIBS)

$(B)/vfio-ntb-ntbsim: $(B)/vfio-ntb/simdev/ntbsim.o $(B)/libsimdev.a $(B)/libvfio-ntb.a
	$(CC) $(LDFLAGS) $(SAN_LDFLAGS) -o $@ $^ $(GLIB_LIBS) $(PCI_LIBS)

# Only the borrower worker links libseccomp (its sandbox, borrower/sandbox.h).
$(B)/vfio-ntb-borrower: $(B)/vfio-ntb/borrower/worker.o $(B)/libvfio-ntb.a
	$(CC) $(LDFLAGS) $(SAN_LDFLAGS) -o $@ $^ $(GLIB_LIBS) $(PCI_LIBS) $(SECCOMP_LIBS)

$(B)/vfio-ntb-lender: $(B)/vfio-ntb/lending/worker.o $(B)/libvfio-ntb.a
	$(CC) $(LDFLAGS) $(SAN_LDFLAGS) -o $@ $^ $(GLIB_LIBS) $(PCI_LIBS)

# Only vfio-ntbd links libsystemd (sd_notify, for Type=notify).
$(B)/vfio-ntbd: $(B)/vfio-ntb/daemon/vfio-ntbd.o $(B)/libvfio-ntb.a
	$(CC) $(LDFLAGS) $(SAN_LDFLAGS) -o $@ $^ $(GLIB_LIBS) $(PCI_LIBS) $(SYSTEMD_LIBS)

$(B)/ntbctl: $(NTBCTL_SRCS:%.c=$(B)/%.o) $(B)/libvn-libvirt.a \
		$(B)/libvfio-ntb.a
	$(CC) $(LDFLAGS) $(SAN_LDFLAGS) -o $@ $^ $(GLIB_LIBS) $(PCI_LIBS) $(XML_LIBS) $(LIBVIRT_LIBS)

# libvirt's qemu hook: talks to vfio-ntbd only (never to libvirt), so no libvirt library.
$(B)/vfio-ntb-libvirt-hook: $(B)/vfio-ntb/libvirt/hook.o $(B)/libvn-libvirt.a $(B)/libvfio-ntb.a
	$(CC) $(LDFLAGS) $(SAN_LDFLAGS) -o $@ $^ $(GLIB_LIBS) $(PCI_LIBS) $(XML_LIBS)

$(B)/tests/%: tests/unit/%.c $(B)/libsimdev.a $(B)/libvn-libvirt.a $(B)/libvfio-ntb.a \
		| $(TRACE_STAMP)
	@mkdir -p $(dir $@)
	$(CC) $(ALL_CFLAGS) $(DEPFLAGS) $(CHECK_CFLAGS) -DVN_SOURCE_DIR='"$(CURDIR)"' $(LDFLAGS) $(SAN_LDFLAGS) -o $@ $< \
		$(B)/libsimdev.a $(B)/libvn-libvirt.a $(B)/libvfio-ntb.a $(GLIB_LIBS) $(PCI_LIBS) $(XML_LIBS) \
		$(SECCOMP_LIBS) $(CHECK_LIBS)

# The kernel module's own suite (tests/kmod/), run in a VM by tests/e2e/test_kmod.py: plain
# libc, no GLib, so it runs wherever the module does.  kselftest.c is its harness; the other
# files hold its cases (kmod-selftest.c: main).
KMOD_SELFTEST_SRCS := tests/kmod/kmod-selftest.c tests/kmod/kselftest.c \
	tests/kmod/kmod-refusals.c tests/kmod/kmod-span.c tests/kmod/kmod-bar.c \
	tests/kmod/kmod-races.c tests/kmod/kmod-trigger.c tests/kmod/kmod-keep.c
KMOD_SELFTEST_OBJS := $(KMOD_SELFTEST_SRCS:%.c=$(B)/%.o)

$(B)/tests/kmod/%.o: tests/kmod/%.c config.mak
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) $(SAN_CFLAGS) -Ivfio-ntb -pthread $(DEPFLAGS) -c -o $@ $<

$(B)/kmod-selftest: $(KMOD_SELFTEST_OBJS)
	$(CC) $(LDFLAGS) $(SAN_LDFLAGS) -pthread -o $@ $(KMOD_SELFTEST_OBJS)

$(B)/bench/%: bench/%.c $(B)/libsimdev.a $(B)/libvfio-ntb.a | $(TRACE_STAMP)
	@mkdir -p $(dir $@)
	$(CC) $(ALL_CFLAGS) $(DEPFLAGS) $(LDFLAGS) $(SAN_LDFLAGS) -o $@ $< $(B)/libsimdev.a $(B)/libvfio-ntb.a $(GLIB_LIBS) $(PCI_LIBS)

# libFuzzer targets, one per decoder a peer reaches: tests/fuzz/fuzz_NAME.c with its seeds in
# tests/fuzz/seeds/NAME/.  Each links a clang-built copy (build/fuzz/obj/) of the sources it
# needs, listed below.  clang's libFuzzer: Debian's libclang-rt-14-dev.
FUZZ_CC ?= clang
# -Werror: a fuzzer built from a call the compiler warned about (an integer passed as a
# pointer) crashes instead of fuzzing.  gcc's dialect, which the tree is written in, is not
# clang's to warn about (a VFIO struct with a flexible array inside one of ours).
FUZZ_CFLAGS = -g -O1 -Werror -Wno-gnu-variable-sized-type-not-at-end -fsanitize=address,undefined -fno-sanitize-recover=all -D_GNU_SOURCE \
	$(INC) $(GLIB_CFLAGS) $(XML_CFLAGS)
FUZZ_NAMES := wire frame shm ntb proto peers control qmp domxml epf
FUZZ_BINS := $(FUZZ_NAMES:%=$(B)/fuzz/fuzz_%)
fuzz_objs = $(patsubst %.c,$(B)/fuzz/obj/%.o,$(1))
FUZZ_COMMON = $(wildcard vfio-ntb/common/*.c) $(B)/trace/trace-table.c
FUZZ_FABRIC = $(wildcard vfio-ntb/fabric/*.c) $(FUZZ_COMMON)

$(B)/fuzz/fuzz_wire: $(call fuzz_objs,vfio-ntb/vfio-user/wire.c $(FUZZ_COMMON))
$(B)/fuzz/fuzz_frame: $(call fuzz_objs,vfio-ntb/fabric/frame.c $(FUZZ_COMMON))
$(B)/fuzz/fuzz_shm: $(call fuzz_objs,$(FUZZ_FABRIC))
$(B)/fuzz/fuzz_ntb: $(call fuzz_objs,$(FUZZ_FABRIC))
$(B)/fuzz/fuzz_proto: $(call fuzz_objs,vfio-ntb/lending/proto.c $(FUZZ_COMMON))
$(B)/fuzz/fuzz_peers: $(call fuzz_objs,vfio-ntb/daemon/peers.c vfio-ntb/daemon/identity.c \
	vfio-ntb/lending/pcibind.c \
	vfio-ntb/lending/backend-vfio.c vfio-ntb/lending/backend-type1.c $(FUZZ_COMMON))
$(B)/fuzz/fuzz_control: $(call fuzz_objs,vfio-ntb/daemon/control.c $(FUZZ_COMMON))
$(B)/fuzz/fuzz_qmp: $(call fuzz_objs,vfio-ntb/daemon/qmp.c $(FUZZ_COMMON))
$(B)/fuzz/fuzz_epf: $(call fuzz_objs,vfio-ntb/simdev/epf.c $(FUZZ_COMMON))
$(B)/fuzz/fuzz_domxml: $(call fuzz_objs,vfio-ntb/libvirt/domxml.c vfio-ntb/client/ctl-client.c \
	$(FUZZ_FABRIC))

$(B)/fuzz/obj/%.o: %.c config.mak | $(TRACE_STAMP)
	@mkdir -p $(dir $@)
	$(FUZZ_CC) $(FUZZ_CFLAGS) $(DEPFLAGS) -fsanitize=fuzzer-no-link -c -o $@ $<

$(B)/fuzz/fuzz_%: tests/fuzz/fuzz_%.c config.mak | $(TRACE_STAMP)
	@mkdir -p $(dir $@)
	$(FUZZ_CC) $(FUZZ_CFLAGS) $(DEPFLAGS) -fsanitize=fuzzer -o $@ $(filter %.c %.o,$^) \
		$(GLIB_LIBS) $(PCI_LIBS) $(XML_LIBS)

fuzz: $(FUZZ_BINS)

# The seeds come from our own encoders; rerun after a format change and commit the output.
fuzz-seeds: $(B)/fuzz/gen-seeds
	$(B)/fuzz/gen-seeds tests/fuzz/seeds

$(B)/fuzz/gen-seeds: tests/fuzz/gen-seeds.c $(B)/libvn-libvirt.a $(B)/libvfio-ntb.a
	$(CC) $(ALL_CFLAGS) $(LDFLAGS) $(SAN_LDFLAGS) -o $@ $< $(B)/libvn-libvirt.a $(B)/libvfio-ntb.a \
		$(GLIB_LIBS) $(PCI_LIBS) $(XML_LIBS)

# A bounded run of every target (FUZZ_SECONDS each; corpora in build/fuzz/NAME/corpus).
fuzz-run: fuzz
	@$(PYTHON) tests/run-checks --fuzz $(FUZZ_BINS)

# Stock Debian QEMU, the guest and libvirtd (what the demo needs), plus for the tests the
# patched QEMU (qemu-patches/, about 15 minutes the first time); cached under /var/cache/vfio-ntb.
testbed-stock:
	scripts/testbed-qemu >/dev/null
	scripts/testbed-guest >/dev/null
	scripts/testbed-libvirt >/dev/null

testbed: testbed-stock qemu

qemu:
	scripts/build-qemu >/dev/null

# Linux's NTB modules (core, hardware drivers, test clients) for the running kernel when its
# headers are installed, else for the test guest's kernel; prints where they are.
modules:
	@scripts/build-ntb-modules

# Those modules (and ours, vfio_ntb) into /lib/modules/RELEASE/updates/vfio-ntb, which the
# kernel prefers, then depmod: what DKMS would do, for one kernel (docs/ntb.md says how to
# redo it after a kernel upgrade).  KERNEL_RELEASE picks another kernel than the default.
install-modules:
	@d=$$(scripts/build-ntb-modules $(if $(KERNEL_RELEASE),--release $(KERNEL_RELEASE))) && \
	rel=$$(cat "$$d/release") && \
	install -d "$(DESTDIR)/lib/modules/$$rel/updates/vfio-ntb" && \
	install -m 0644 "$$d"/*.ko "$(DESTDIR)/lib/modules/$$rel/updates/vfio-ntb/" && \
	if [ -z "$(DESTDIR)" ]; then depmod -a "$$rel"; fi && \
	echo "installed $$(ls "$$d"/*.ko | wc -l) modules for $$rel"

check-unit: all circles
	@$(PYTHON) tests/run-checks --unit $(UNIT_BINS)

# The edit loop: the unit suites and a short run of each fuzzer (FUZZ_SECONDS, default 2),
# no guests and no sanitizer builds; `make check` is everything.
check-fast: all fuzz
	@FUZZ_SECONDS=$${FUZZ_SECONDS:-2} $(PYTHON) tests/run-checks --unit $(UNIT_BINS) \
		--fuzz $(FUZZ_BINS)

check-e2e: all testbed
	@$(PYTHON) tests/run-checks --e2e

# The unit suites again under AddressSanitizer + UBSan, leaks checked, and the suites whose code
# runs on more than one thread (the simulated device's engine, the DMA and irq tables it shares
# with the server) under ThreadSanitizer; each build in a directory of its own.
ASAN_B := build/asan
TSAN_B := build/tsan
ASAN_FLAGS := -O1 -fsanitize=address,undefined -fno-sanitize-recover=all -fno-omit-frame-pointer
# -Wno-tsan: the one fence TSan cannot model (simdev/nvme.c) orders a completion's bytes for
# the guest, in another process, not anything between our threads.
TSAN_FLAGS := -O1 -fsanitize=thread -Wno-tsan
TSAN_SUITES := check_engine check_nvme check_nvme_io check_server check_fabric
ASAN_UNIT_BINS = $(UNIT_SRCS:tests/unit/%.c=$(ASAN_B)/tests/%)
TSAN_UNIT_BINS = $(TSAN_SUITES:%=$(TSAN_B)/tests/%)

asan-build:
	@$(MAKE) --no-print-directory B=$(ASAN_B) SAN_CFLAGS="$(ASAN_FLAGS)" \
		SAN_LDFLAGS="-fsanitize=address,undefined" $(PROGS:$(B)/%=$(ASAN_B)/%) $(ASAN_UNIT_BINS)

tsan-build:
	@$(MAKE) --no-print-directory B=$(TSAN_B) SAN_CFLAGS="$(TSAN_FLAGS)" \
		SAN_LDFLAGS="-fsanitize=thread" $(TSAN_UNIT_BINS)

check-asan: asan-build
	@$(PYTHON) tests/run-checks --asan $(ASAN_UNIT_BINS)

check-tsan: tsan-build
	@$(PYTHON) tests/run-checks --tsan $(TSAN_UNIT_BINS)

# Line coverage of the unit suites, per directory (gcov; build/cov is a build of its own).
COV_B := build/cov
COV_UNIT_BINS = $(UNIT_SRCS:tests/unit/%.c=$(COV_B)/tests/%)

coverage:
	@find $(COV_B) -name '*.gcda' -delete 2>/dev/null || true
	@$(MAKE) --no-print-directory B=$(COV_B) SAN_CFLAGS="-O0 --coverage" SAN_LDFLAGS="--coverage" \
		$(PROGS:$(B)/%=$(COV_B)/%) $(COV_UNIT_BINS)
	@$(PYTHON) tests/run-checks --unit $(COV_UNIT_BINS) | tail -n 1
	@$(PYTHON) tests/coverage-report $(COV_B)

# Every shell script (the scripts, configure, the test guests' init, ntbctl's bash
# completion: a "shell=bash" directive in it), clean under Debian's shellcheck: notes as well
# as warnings fail it.  (The kernel module is checked by its own build, -Werror, against the
# kernel's headers.)
SHELL_SCRIPTS := configure $(shell grep -l '^\#!/bin/sh' scripts/*) tests/guest/init \
	tests/lender-host/init libvirt-hooks/qemu.d/vfio-ntb completion/ntbctl \
	vfio-ntb/kmod/dkms/dkms-prepare debian/vfio-ntb.postinst debian/vfio-ntb-dkms.postinst \
	debian/vfio-ntb-dkms.prerm
# The C tree through cppcheck (Debian's 2.10): warnings, performance and portability, zero
# findings; each suppression is in the code, with its reason.  GLib's declaration macros
# are given empty, cppcheck knowing nothing of them.
CPPCHECK_FLAGS := --quiet --error-exitcode=1 --inline-suppr --std=c11 \
	--enable=warning,performance,portability --library=gtk \
	--suppress=missingIncludeSystem -D_GNU_SOURCE -D__linux__ $(INC) \
	'-DG_DEFINE_AUTOPTR_CLEANUP_FUNC(a,b)=' '-DG_DEFINE_AUTO_CLEANUP_CLEAR_FUNC(a,b)=' \
	'-DG_STATIC_ASSERT(x)=' '-DG_DEFINE_QUARK(a,b)='
CPPCHECK_DIRS := $(filter-out vfio-ntb/kmod,$(wildcard vfio-ntb/*))

# Every C file but the kernel modules' (vfio-ntb/kmod/, tests/kmod/ntb_*.c: the kernel's style)
# as .clang-format lays it out (Debian's clang-format 14); `make format` rewrites them so.
FORMAT_FILES = $(filter-out vfio-ntb/kmod/%,$(wildcard vfio-ntb/*/*.[ch])) \
	$(wildcard tests/unit/*.[ch] tests/fuzz/*.[ch] bench/*.[ch] tests/guest/*.c) \
	$(filter-out tests/kmod/ntb_%,$(wildcard tests/kmod/*.[ch]))

format-check:
	@clang-format --dry-run -Werror $(FORMAT_FILES) && echo "format-check: $(words $(FORMAT_FILES)) files as .clang-format lays them out"

format:
	clang-format -i $(FORMAT_FILES)

lint: format-check $(TRACE_STAMP)
	shellcheck $(SHELL_SCRIPTS)
	cppcheck $(CPPCHECK_FLAGS) -j2 $(CPPCHECK_DIRS)

# No circle between the files of a directory (a calls b, b calls back into a, maybe through
# others): scripts/check-circles reads the objects' symbols (nm).  The directories below have
# none; in fabric/, the ntb backend's link (ntb.c), its maps (ntb-map.c), its routes
# (ntb-route.c) and its restarts (ntb-resume.c) call each other (`scripts/check-circles
# build/vfio-ntb/fabric` shows it), so those four are left out.
# The objects are named from the sources there are, so one that a removed file left behind
# is not read.
CIRCLE_DIRS := daemon vfio-user common client ctl simdev libvirt borrower lending fabric
CIRCLE_SKIP := vfio-ntb/fabric/ntb.c vfio-ntb/fabric/ntb-map.c vfio-ntb/fabric/ntb-route.c \
	vfio-ntb/fabric/ntb-resume.c
CIRCLE_OBJS = $(patsubst %.c,$(B)/%.o,$(filter-out $(CIRCLE_SKIP), \
	$(foreach d,$(CIRCLE_DIRS),$(wildcard vfio-ntb/$(d)/*.c))))

circles: $(CIRCLE_OBJS)
	@$(PYTHON) scripts/check-circles $(CIRCLE_OBJS)

# Unit tests (plain, ASan + UBSan, TSan), the fuzzers' bounded runs and the end-to-end tests;
# ends with "N passed, N failed".  The lint comes first.
check: lint all circles asan-build tsan-build testbed fuzz
	@$(PYTHON) tests/run-checks --unit $(UNIT_BINS) --asan $(ASAN_UNIT_BINS) \
		--tsan $(TSAN_UNIT_BINS) --fuzz $(FUZZ_BINS) --e2e

bench: all testbed
	@$(PYTHON) bench/run-bench

demo: all testbed-stock
	@$(PYTHON) tests/e2e/demo.py

# Where `make install` puts things (PREFIX from configure; DESTDIR stages them).  The daemon in
# sbin, the operator's CLI and the test tools in bin, the workers it starts (and libvirt's
# hook binary) in LIBEXECDIR, which configure compiles into vfio-ntbd (config.h).
BINDIR ?= $(PREFIX)/bin
SBINDIR ?= $(PREFIX)/sbin
LIBEXECDIR ?= $(PREFIX)/libexec/vfio-ntb
INCLUDEDIR ?= $(PREFIX)/include
MANDIR ?= $(PREFIX)/share/man
BASHCOMPDIR ?= $(PREFIX)/share/bash-completion/completions
# systemd's unit and tmpfiles.d directories (systemd also reads them under /usr/local/lib).
SYSTEMDUNITDIR ?= $(PREFIX)/lib/systemd/system
TMPFILESDIR ?= $(PREFIX)/lib/tmpfiles.d
DOCDIR ?= $(PREFIX)/share/doc/vfio-ntb
# The unit's drop-ins for hardware features (systemd/dropins/: VFIO, managed binding, NTB
# ports), which an admin links into vfio-ntbd.service.d where the config needs them.
DROPINDIR ?= $(PREFIX)/share/vfio-ntb/systemd
# The daemon's config (vfio-ntbd.conf, the template unit's INSTANCE.conf) is the admin's: install
# makes the directory, never a file in it, and uninstall leaves what the admin put there.
SYSCONFDIR ?= /etc
# libvirt's hooks directory; the drop-in runs the hook binary from libexec.
LIBVIRT_HOOKDIR ?= /etc/libvirt/hooks

SBIN_PROGS := vfio-ntbd
BIN_PROGS := ntbctl vfio-ntb-simdev vfio-ntb-ntbsim
LIBEXEC_PROGS := vfio-ntb-borrower vfio-ntb-lender vfio-ntb-libvirt-hook
BIN_SCRIPTS := scripts/vfio-ntb-rebalance
# Every unit (vfio-ntbd.service, the template vfio-ntbd@.service), man page and the completion
# script the tree has.
UNITS := $(wildcard systemd/*.service)
MANPAGES := $(wildcard docs/man/*.[1-8])
DROPINS := $(wildcard systemd/dropins/*.conf)
# The guides, beside the examples (README.md, docs/*.md).
GUIDES := README.md $(wildcard docs/*.md)
COMPLETION := $(wildcard completion/ntbctl)
# Each installed file, DESTDIR-less, for uninstall; the directories only we use, deepest first.
INSTALLED = $(SBIN_PROGS:%=$(SBINDIR)/%) $(BIN_PROGS:%=$(BINDIR)/%) \
	$(BIN_SCRIPTS:scripts/%=$(BINDIR)/%) $(LIBEXEC_PROGS:%=$(LIBEXECDIR)/%) \
	$(LIBVIRT_HOOKDIR)/qemu.d/vfio-ntb $(UNITS:systemd/%=$(SYSTEMDUNITDIR)/%) \
	$(TMPFILESDIR)/vfio-ntb.conf $(DOCDIR)/examples/vfio-ntbd.conf.example \
	$(DOCDIR)/examples/vfio-ntb-alerts.yml $(DROPINS:systemd/dropins/%=$(DROPINDIR)/%) \
	$(addprefix $(DOCDIR)/,$(notdir $(GUIDES))) \
	$(INCLUDEDIR)/vfio-ntb/vfio_ntb_uapi.h $(COMPLETION:completion/%=$(BASHCOMPDIR)/%) \
	$(foreach m,$(MANPAGES),$(MANDIR)/man$(subst .,,$(suffix $(m)))/$(notdir $(m)))
OWN_DIRS = $(LIBEXECDIR) $(DOCDIR)/examples $(DOCDIR) $(INCLUDEDIR)/vfio-ntb $(SYSCONFDIR)/vfio-ntb \
	$(DROPINDIR) $(dir $(DROPINDIR))

.PHONY: progs uninstall deb
progs: $(PROGS)

install: $(PROGS)
	@grep -qx '#define VN_LIBEXECDIR "$(LIBEXECDIR)"' config.h || { \
		echo "install: vfio-ntbd was built to run its workers from" \
			"$$(sed -n 's/^#define VN_LIBEXECDIR //p' config.h), not $(LIBEXECDIR):" \
			"./configure --prefix=$(PREFIX) and make again" >&2; exit 1; }
	install -d $(DESTDIR)$(SBINDIR) $(DESTDIR)$(BINDIR) $(DESTDIR)$(LIBEXECDIR) \
		$(DESTDIR)$(LIBVIRT_HOOKDIR)/qemu.d $(DESTDIR)$(SYSTEMDUNITDIR) $(DESTDIR)$(TMPFILESDIR) \
		$(DESTDIR)$(DOCDIR)/examples $(DESTDIR)$(INCLUDEDIR)/vfio-ntb $(DESTDIR)$(SYSCONFDIR)/vfio-ntb \
		$(DESTDIR)$(DROPINDIR)
	install -m 0755 $(SBIN_PROGS:%=$(B)/%) $(DESTDIR)$(SBINDIR)/
	install -m 0755 $(BIN_PROGS:%=$(B)/%) $(BIN_SCRIPTS) $(DESTDIR)$(BINDIR)/
	install -m 0755 $(LIBEXEC_PROGS:%=$(B)/%) $(DESTDIR)$(LIBEXECDIR)/
	sed 's|@HOOK@|$(LIBEXECDIR)/vfio-ntb-libvirt-hook|' libvirt-hooks/qemu.d/vfio-ntb \
		>$(DESTDIR)$(LIBVIRT_HOOKDIR)/qemu.d/vfio-ntb
	chmod 0755 $(DESTDIR)$(LIBVIRT_HOOKDIR)/qemu.d/vfio-ntb
	for u in $(UNITS); do \
		sed 's|/usr/s\{0,1\}bin/vfio-ntbd|$(SBINDIR)/vfio-ntbd|g' "$$u" \
			>"$(DESTDIR)$(SYSTEMDUNITDIR)/$${u#systemd/}" && \
		chmod 0644 "$(DESTDIR)$(SYSTEMDUNITDIR)/$${u#systemd/}" || exit 1; \
	done
	install -m 0644 systemd/vfio-ntb.tmpfiles $(DESTDIR)$(TMPFILESDIR)/vfio-ntb.conf
	install -m 0644 systemd/vfio-ntbd.conf.example systemd/vfio-ntb-alerts.yml \
		$(DESTDIR)$(DOCDIR)/examples/
	install -m 0644 $(DROPINS) $(DESTDIR)$(DROPINDIR)/
	install -m 0644 $(GUIDES) $(DESTDIR)$(DOCDIR)/
	install -m 0644 vfio-ntb/kmod/vfio_ntb_uapi.h $(DESTDIR)$(INCLUDEDIR)/vfio-ntb/
	for m in $(MANPAGES); do \
		d="$(DESTDIR)$(MANDIR)/man$${m##*.}" && install -d "$$d" && \
		install -m 0644 "$$m" "$$d/" || exit 1; \
	done
	$(if $(COMPLETION),install -d $(DESTDIR)$(BASHCOMPDIR) && \
		install -m 0644 $(COMPLETION) $(DESTDIR)$(BASHCOMPDIR)/)

# The DKMS source tree the vfio-ntb-dkms package ships (/usr/src/vfio-ntb-VERSION): vfio_ntb's
# source and what DKMS needs to build it with Linux's NTB drivers for each kernel (docs/ntb.md).
DKMS_VERSION = $(shell sed -n 's/^\#define VN_VERSION "\(.*\)"$$/\1/p' config.h)
DKMS_DIR = $(DESTDIR)$(PREFIX)/src/vfio-ntb-$(DKMS_VERSION)
install-dkms:
	install -d $(DKMS_DIR)/vfio_ntb
	install -m 0644 vfio-ntb/kmod/Kbuild vfio-ntb/kmod/*.c vfio-ntb/kmod/*.h $(DKMS_DIR)/vfio_ntb/
	install -m 0644 vfio-ntb/kmod/dkms/Kbuild $(DKMS_DIR)/
	install -m 0755 vfio-ntb/kmod/dkms/dkms-prepare $(DKMS_DIR)/
	sed 's/@VERSION@/$(DKMS_VERSION)/' vfio-ntb/kmod/dkms/dkms.conf.in >$(DKMS_DIR)/dkms.conf

# (install: the units' /usr/sbin/vfio-ntbd, or /usr/bin/ as they once said, becomes SBINDIR's.)

# What install put, and the directories only vfio-ntb uses when nothing else is left in them
# (an admin's config in SYSCONFDIR/vfio-ntb stays, and so does its directory).
uninstall:
	rm -f $(addprefix $(DESTDIR),$(INSTALLED))
	for d in $(addprefix $(DESTDIR),$(OWN_DIRS)); do \
		if [ -d "$$d" ]; then rmdir --ignore-fail-on-non-empty "$$d"; fi; \
	done

# The Debian packages (debian/), built by dpkg-buildpackage from a copy of the tree in
# $(DEB_DIR) (its clean step would empty build/ and remove config.mak here; not under build/,
# whose *.d files this Makefile includes): the files git
# knows (committed or not) and the untracked ones it does not ignore, else all but the
# build's.  The .debs land here, in the top directory (the -dbgsym ones stay in $(DEB_DIR));
# lintian must find no error (its warnings are printed).  DEB_JOBS: dpkg-buildpackage's -J.
DEB_DIR ?= build-deb
DEB_JOBS ?= auto
LINTIAN ?= lintian

deb:
	rm -rf $(DEB_DIR) && mkdir -p $(DEB_DIR)/vfio-ntb
	if git rev-parse --is-inside-work-tree >/dev/null 2>&1; then \
		git ls-files -z --cached --others --exclude-standard | \
			tar --null -T - --ignore-failed-read -cf -; \
	else \
		tar --exclude=./build --exclude='./$(B)' --exclude='./$(DEB_DIR)' --exclude=./config.mak --exclude=./config.h \
			--exclude='./*.deb' --exclude=./.git -cf - .; \
	fi | tar -xf - -C $(DEB_DIR)/vfio-ntb
	cd $(DEB_DIR)/vfio-ntb && dpkg-buildpackage -us -uc -b -J$(DEB_JOBS)
	rm -f vfio-ntb_*.deb vfio-ntb-*_*.deb
	for f in $(DEB_DIR)/*.deb; do \
		case $$f in *-dbgsym_*) ;; *) cp "$$f" . && echo "deb: $${f##*/}" ;; esac; \
	done
	$(LINTIAN) --fail-on error $(DEB_DIR)/*.changes

clean:
	rm -rf $(B) $(DEB_DIR)

distclean: clean
	rm -f config.mak config.h
