# vfio-ntb: one plain Makefile.  `make check` installs dependencies, configures, builds, prepares
# the testbed and runs every test; `make demo` shows a guest using a device served by vfio-ntb.

.DEFAULT_GOAL := all

-include config.mak

# config.mak is remade (dependencies installed first) when missing; make then restarts.
config.mak: configure scripts/install-deps
	scripts/install-deps
	./configure $(CONFIGURE_FLAGS)

B := build
PYTHON ?= /usr/bin/python3
INC := -Ivfio-ntb -I.
ALL_CFLAGS = $(CFLAGS) $(INC) $(GLIB_CFLAGS) $(XML_CFLAGS) $(LIBVIRT_CFLAGS)

LIB_SRCS := $(wildcard vfio-ntb/common/*.c) $(wildcard vfio-ntb/vfio-user/*.c) \
	$(wildcard vfio-ntb/fabric/*.c) $(wildcard vfio-ntb/lending/*.c) $(filter-out vfio-ntb/borrower/worker.c,$(wildcard vfio-ntb/borrower/*.c)) \
	$(filter-out vfio-ntb/daemon/vfio-ntbd.c,$(wildcard vfio-ntb/daemon/*.c)) \
	$(filter-out vfio-ntb/ctl/ntbctl.c vfio-ntb/ctl/ntbctl-virt.c,$(wildcard vfio-ntb/ctl/*.c))
SIMDEV_SRCS := $(filter-out vfio-ntb/simdev/simdev.c,$(wildcard vfio-ntb/simdev/*.c))
# libvirt integration (libxml2, libvirt): only ntbctl, the hook and their tests link it.
VIRT_SRCS := $(filter-out vfio-ntb/libvirt/hook.c,$(wildcard vfio-ntb/libvirt/*.c))
VIRT_OBJS := $(VIRT_SRCS:%.c=$(B)/%.o)
LIB_OBJS := $(LIB_SRCS:%.c=$(B)/%.o)
SIMDEV_OBJS := $(SIMDEV_SRCS:%.c=$(B)/%.o)
UNIT_SRCS := $(wildcard tests/unit/check_*.c)
UNIT_BINS := $(UNIT_SRCS:tests/unit/%.c=$(B)/tests/%)
BENCH_SRCS := $(wildcard bench/*.c)
BENCH_BINS := $(BENCH_SRCS:bench/%.c=$(B)/bench/%)
PROGS := $(B)/vfio-ntb-simdev $(B)/vfio-ntbd $(B)/vfio-ntb-borrower $(B)/ntbctl \
	$(B)/vfio-ntb-libvirt-hook

.PHONY: all check check-unit check-e2e install clean demo testbed testbed-stock qemu bench fuzz fuzz-run distclean

all: $(PROGS) $(UNIT_BINS) $(BENCH_BINS)

$(B)/%.o: %.c config.mak $(wildcard vfio-ntb/*/*.h)
	@mkdir -p $(dir $@)
	$(CC) $(ALL_CFLAGS) -c -o $@ $<

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
	$(CC) $(LDFLAGS) -o $@ $^ $(GLIB_LIBS)

$(B)/vfio-ntb-borrower: $(B)/vfio-ntb/borrower/worker.o $(B)/libvfio-ntb.a
	$(CC) $(LDFLAGS) -o $@ $^ $(GLIB_LIBS)

$(B)/vfio-ntbd: $(B)/vfio-ntb/daemon/vfio-ntbd.o $(B)/libvfio-ntb.a
	$(CC) $(LDFLAGS) -o $@ $^ $(GLIB_LIBS)

$(B)/ntbctl: $(B)/vfio-ntb/ctl/ntbctl.o $(B)/vfio-ntb/ctl/ntbctl-virt.o $(B)/libvn-libvirt.a \
		$(B)/libvfio-ntb.a
	$(CC) $(LDFLAGS) -o $@ $^ $(GLIB_LIBS) $(XML_LIBS) $(LIBVIRT_LIBS)

# libvirt's qemu hook: talks to vfio-ntbd only (never to libvirt), so no libvirt library.
$(B)/vfio-ntb-libvirt-hook: $(B)/vfio-ntb/libvirt/hook.o $(B)/libvn-libvirt.a $(B)/libvfio-ntb.a
	$(CC) $(LDFLAGS) -o $@ $^ $(GLIB_LIBS) $(XML_LIBS)

$(B)/tests/%: tests/unit/%.c $(wildcard tests/unit/*.h) $(B)/libsimdev.a $(B)/libvn-libvirt.a \
		$(B)/libvfio-ntb.a
	@mkdir -p $(dir $@)
	$(CC) $(ALL_CFLAGS) $(CHECK_CFLAGS) -DVN_SOURCE_DIR='"$(CURDIR)"' $(LDFLAGS) -o $@ $< \
		$(B)/libsimdev.a $(B)/libvn-libvirt.a $(B)/libvfio-ntb.a $(GLIB_LIBS) $(XML_LIBS) \
		$(CHECK_LIBS)

$(B)/bench/%: bench/%.c $(wildcard bench/*.h) $(B)/libsimdev.a $(B)/libvfio-ntb.a
	@mkdir -p $(dir $@)
	$(CC) $(ALL_CFLAGS) $(LDFLAGS) -o $@ $< $(B)/libsimdev.a $(B)/libvfio-ntb.a $(GLIB_LIBS)

# The decoder fuzzer needs clang's libFuzzer (Debian: libclang-rt-14-dev).
FUZZ_CC ?= clang
FUZZ_SRCS := vfio-ntb/vfio-user/wire.c vfio-ntb/common/util.c
$(B)/fuzz/fuzz_wire: tests/fuzz/fuzz_wire.c $(FUZZ_SRCS) config.mak
	@mkdir -p $(dir $@)
	$(FUZZ_CC) -g -O1 -fsanitize=fuzzer,address,undefined -D_GNU_SOURCE $(INC) \
		$(GLIB_CFLAGS) -o $@ tests/fuzz/fuzz_wire.c $(FUZZ_SRCS) $(GLIB_LIBS)

fuzz: $(B)/fuzz/fuzz_wire

# A bounded run (CI): FUZZ_SECONDS of libFuzzer on the wire decoder.
FUZZ_SECONDS ?= 30
fuzz-run: $(B)/fuzz/fuzz_wire
	@mkdir -p $(B)/fuzz/corpus
	$(B)/fuzz/fuzz_wire -max_total_time=$(FUZZ_SECONDS) -max_len=8192 \
		$(B)/fuzz/corpus tests/fuzz/seeds >$(B)/fuzz/last.log 2>&1 \
		|| { tail -n 40 $(B)/fuzz/last.log; exit 1; }
	@grep -E '^(#[0-9]+.*DONE|Done)' $(B)/fuzz/last.log | tail -n 1

# Stock Debian QEMU, the guest and libvirtd (what the demo needs), plus for the tests the
# patched QEMU (qemu-patches/, about 15 minutes the first time); cached under /var/cache/vfio-ntb.
testbed-stock:
	scripts/testbed-qemu >/dev/null
	scripts/testbed-guest >/dev/null
	scripts/testbed-libvirt >/dev/null

testbed: testbed-stock qemu

qemu:
	scripts/build-qemu >/dev/null

check-unit: all
	@$(PYTHON) tests/run-checks --unit $(UNIT_BINS)

check-e2e: all testbed
	@$(PYTHON) tests/run-checks --e2e

# Unit tests, the fuzzer's bounded run and the end-to-end tests; ends with "N passed, N failed".
check: all testbed fuzz
	@$(PYTHON) tests/run-checks --unit $(UNIT_BINS) --fuzz $(B)/fuzz/fuzz_wire --e2e

bench: all testbed
	@$(PYTHON) bench/run-bench

demo: all testbed-stock
	@$(PYTHON) tests/e2e/demo.py

# systemd's unit and tmpfiles.d directories (systemd also reads them under /usr/local/lib).
SYSTEMDUNITDIR ?= $(PREFIX)/lib/systemd/system
TMPFILESDIR ?= $(PREFIX)/lib/tmpfiles.d
DOCDIR ?= $(PREFIX)/share/doc/vfio-ntb

# libvirt's hooks directory; the drop-in runs the hook binary from libexec.
LIBVIRT_HOOKDIR ?= /etc/libvirt/hooks
LIBEXECDIR ?= $(PREFIX)/libexec/vfio-ntb

install: $(PROGS)
	install -d $(DESTDIR)$(PREFIX)/bin $(DESTDIR)$(LIBEXECDIR) $(DESTDIR)$(LIBVIRT_HOOKDIR)/qemu.d
	install -m 0755 $(filter-out $(B)/vfio-ntb-libvirt-hook,$(PROGS)) $(DESTDIR)$(PREFIX)/bin/
	install -m 0755 $(B)/vfio-ntb-libvirt-hook $(DESTDIR)$(LIBEXECDIR)/
	sed 's|@HOOK@|$(LIBEXECDIR)/vfio-ntb-libvirt-hook|' libvirt-hooks/qemu.d/vfio-ntb \
		>$(DESTDIR)$(LIBVIRT_HOOKDIR)/qemu.d/vfio-ntb
	chmod 0755 $(DESTDIR)$(LIBVIRT_HOOKDIR)/qemu.d/vfio-ntb
	install -m 0755 scripts/vfio-ntb-rebalance $(DESTDIR)$(PREFIX)/bin/
	install -d $(DESTDIR)$(SYSTEMDUNITDIR) $(DESTDIR)$(TMPFILESDIR) $(DESTDIR)$(DOCDIR)
	sed 's|^ExecStart=/usr/bin/|ExecStart=$(PREFIX)/bin/|' systemd/vfio-ntbd.service \
		>$(DESTDIR)$(SYSTEMDUNITDIR)/vfio-ntbd.service
	chmod 0644 $(DESTDIR)$(SYSTEMDUNITDIR)/vfio-ntbd.service
	install -m 0644 systemd/vfio-ntb.tmpfiles $(DESTDIR)$(TMPFILESDIR)/vfio-ntb.conf
	install -m 0644 systemd/vfio-ntbd.conf.example $(DESTDIR)$(DOCDIR)/

clean:
	rm -rf $(B)

distclean: clean
	rm -f config.mak config.h
