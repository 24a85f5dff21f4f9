/*
 * Unit tests of vfio-ntbd's configuration file (vfio-ntb/daemon/conf.c): what
 * an operator writes is read as written, defaults are what conf.h says, and
 * every mistake is refused with a message that names it.
 */
#include "daemon/conf.h"

#include "check-main.h"

#include <check.h>
#include <sys/stat.h>
#include <glib/gstdio.h>
#include <string.h>

#define NODE "[node]\nname = hosta\nfabric-dir = /run/vfio-ntb/fabric\n"

static VnConfig *parse_ok(const char *text)
{
    g_autoptr(GError) error = NULL;
    VnConfig *c = vn_conf_parse(text, &error);

    ck_assert_msg(c != NULL, "%s\n%s", error != NULL ? error->message : "", text);
    return c;
}

/* ---- accepted ----------------------------------------------------------- */

/* The example configuration we install parses, as it reads. */
START_TEST(test_shipped_example)
{
    g_autofree char *path =
        g_build_filename(VN_SOURCE_DIR, "systemd", "vfio-ntbd.conf.example", NULL);
    g_autoptr(GError) error = NULL;
    g_autoptr(VnConfig) c = vn_conf_load(path, &error);
    VnLendConf *l;

    ck_assert_msg(c != NULL, "%s", error != NULL ? error->message : "");
    ck_assert_str_eq(c->node, "hosta");
    ck_assert_str_eq(c->state_dir, "/var/lib/vfio-ntb");
    ck_assert_uint_eq(c->lends->len, 1);
    l = g_ptr_array_index(c->lends, 0);
    ck_assert_str_eq(l->name, "nvme0");
    ck_assert(!l->runtime);
    ck_assert(vn_lend_conf_allows(l, "hostb"));
    ck_assert(vn_lend_conf_allows(l, "hostc"));
    ck_assert(!vn_lend_conf_allows(l, "hostd"));
}
END_TEST

START_TEST(test_defaults)
{
    g_autoptr(VnConfig) c = parse_ok(NODE);

    ck_assert_str_eq(c->fabric, "shm");
    ck_assert_str_eq(c->control_socket, "/run/vfio-ntb/control.sock");
    ck_assert_str_eq(c->run_dir, "/run/vfio-ntb");
    ck_assert_ptr_null(c->state_dir);
    ck_assert_ptr_null(c->stats_file);
    ck_assert_uint_eq(c->lease_timeout_ms, 10000);
    ck_assert_int_eq(c->dma_unmap_linger_ms, -1); /* the workers' own */
    ck_assert_str_eq(g_hash_table_lookup(c->fabric_params, "dir"), "/run/vfio-ntb/fabric");
    ck_assert_uint_eq(c->lends->len, 0);
    ck_assert_uint_eq(c->borrows->len, 0);
}
END_TEST

START_TEST(test_everything)
{
    g_autoptr(VnConfig) c =
        parse_ok("# a comment\n" NODE "lease-timeout-ms = 3000\nrun-dir = /srv/vn\n"
                 "dma-unmap-linger-ms = 0\n"
                 "[fabric]\nmax-windows = 8\n"
                 "[lend gpu.0]\nsocket = /run/g.sock\nallow = *\n"
                 "[lend nvme0]\nsocket = /run/n.sock\nallow = hostb ; hostc\n"
                 "[borrow disk]\nlender = hostz\ndevice = nvme9\nsocket = /run/vm.sock\n"
                 "irq-mode = relay\ndomain = vm7\np2p = yes\n"
                 "[borrow nvme1]\nlender = hostz\nsocket = /run/vm2.sock\n");
    VnBorrowConf *b;
    VnLendConf *any = NULL, *some = NULL;

    ck_assert_uint_eq(c->lease_timeout_ms, 3000);
    ck_assert_int_eq(c->dma_unmap_linger_ms, 0);
    ck_assert_str_eq(c->run_dir, "/srv/vn");
    ck_assert_str_eq(g_hash_table_lookup(c->fabric_params, "max-windows"), "8");
    ck_assert_uint_eq(c->lends->len, 2);
    for (guint i = 0; i < c->lends->len; i++) {
        VnLendConf *l = g_ptr_array_index(c->lends, i);

        *(strcmp(l->name, "gpu.0") == 0 ? &any : &some) = l;
    }
    ck_assert(vn_lend_conf_allows(any, "anyone"));
    ck_assert(vn_lend_conf_allows(some, "hostc")); /* spaces around ';' stripped */
    ck_assert(!vn_lend_conf_allows(some, "hostd"));
    ck_assert_uint_eq(c->borrows->len, 2);
    b = g_ptr_array_index(c->borrows, 0);
    ck_assert_str_eq(b->device, strcmp(b->name, "disk") == 0 ? "nvme9" : "nvme1");
    b = g_ptr_array_index(c->borrows, strcmp(b->name, "disk") == 0 ? 0 : 1);
    ck_assert_int_eq(b->irq_mode, VN_IRQ_MODE_RELAY);
    ck_assert_str_eq(b->lender, "hostz");
    ck_assert_str_eq(b->domain, "vm7");
    ck_assert(b->p2p);
    b = g_ptr_array_index(c->borrows, strcmp(b->name, "disk") == 0 ? 1 : 0);
    ck_assert_str_eq(b->domain, "nvme1"); /* its own by default, composed with nothing */
    ck_assert(!b->p2p);
}
END_TEST

/* ---- refused -------------------------------------------------------------- */

/* 111 bytes: more than sun_path holds. */
#define LONG_SOCK                                              \
    "/run/xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx" \
    "xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx.sock"

static const struct {
    const char *text;
    const char *why; /* in the error message */
} bad[] = {
    { "", "[node] is required" },
    { "[node]\nfabric-dir = /f\n", "\"name\" is required" },
    { "[node]\nname = hosta\n", "\"fabric-dir\" is required" },
    { NODE "colour = blue\n", "unknown key \"colour\"" },
    { NODE "[lend]\nsocket = /s\nallow = *\n", "unknown group [lend]" },
    { NODE "[lend a b]\nsocket = /s\nallow = *\n", "[lend a b]: the device name must be" },
    /* Names become file names: "." and ".." could be lent but never borrowed. */
    { NODE "[lend ..]\nsocket = /s\nallow = *\n", "[lend ..]: the device name must be" },
    { NODE "[lend .]\nsocket = /s\nallow = *\n", "[lend .]: the device name must be" },
    { NODE "[borrow ..]\nlender = hostz\nsocket = /s\n", "[borrow ..]: the device name" },
    { NODE "[borrow b]\nlender = hostz\nsocket = /s\ndevice = ..\n", "device \"..\" must be" },
    { NODE "[lender x]\n", "unknown group" },
    { "[node]\nname = Host_A\nfabric-dir = /f\n", "must be 1-31 of [a-z0-9-]" },
    { NODE "lease-timeout-ms = 0\n", "lease-timeout-ms must be 100..86400000" },
    { NODE "dma-unmap-linger-ms = 1001\n", "dma-unmap-linger-ms must be 0..1000" },
    { NODE "dma-unmap-linger-ms = -1\n", "dma-unmap-linger-ms must be 0..1000" },
    { NODE "lease-timeout-ms = soon\n", "lease-timeout-ms must be" },
    { NODE "lease-timeout-ms = 99999999999\n", "lease-timeout-ms must be" },
    { "[node]\nname = hosta\nfabric-dir = fabric\n",
      "fabric-dir \"fabric\" must be an absolute path" },
    { NODE "run-dir = run\n", "run-dir \"run\" must be an absolute path" },
    { NODE "state-dir = ./state\n", "state-dir \"./state\" must be an absolute path" },
    { NODE "stats-file = s.json\n", "stats-file" },
    { NODE "control-socket = c.sock\n", "control-socket must be an absolute path" },
    { NODE "control-socket = " LONG_SOCK "\n", "at most 107 bytes" },
    { NODE "[lend n]\nallow = *\n", "\"socket\" (a vfio-user server's) or \"pci\"" },
    { NODE "[lend n]\nsocket = /s\n", "\"allow\" is required" },
    { NODE "[lend n]\nsocket = /s\nallow = hostb;Bad Node\n", "\"Bad Node\" is not a node name" },
    { NODE "[lend n]\nsocket = s.sock\nallow = *\n", "[lend n]: the device server's socket" },
    { NODE "[lend n]\nsocket = " LONG_SOCK "\nallow = *\n", "at most 107 bytes" },
    { NODE "[lend n]\nsocket = /s\nallow = *\nmode = fast\n", "unknown key \"mode\"" },
    { NODE "[borrow b]\nsocket = /s\n", "\"lender\" is required" },
    { NODE "[borrow b]\nlender = hostz\n", "\"socket\" is required" },
    { NODE "[borrow b]\nlender = Host Z\nsocket = /s\n", "lender \"Host Z\" is not a node name" },
    { NODE "[borrow b]\nlender = hostz\nsocket = vm.sock\n", "socket must be an absolute path" },
    { NODE "[borrow b]\nlender = hostz\nsocket = /s\ndevice = a/b\n", "device \"a/b\" must be" },
    { NODE "[borrow b]\nlender = hostz\nsocket = /s\nirq-mode = msi\n",
      "irq-mode must be fd or relay, not \"msi\"" },
    { NODE "[borrow b]\nlender = hostz\nsocket = /s\np2p = maybe\n", "p2p = \"maybe\": yes or no" },
    { NODE "[borrow b]\nlender = hostz\nsocket = /s\ndomain = ../vm\n",
      "domain \"../vm\" must be" },
    { "[node]\nname = hosta\nfabric = ntb\nfabric-dir = /f\n[fabric]\nports = /dev/vfio-ntb/x\n",
      "fabric-dir is the shm fabric's; the ntb fabric has none" },
    { "[node\nname = x\n", "" }, /* GKeyFile's own message */
};

/* An NTB's node: its ports are the fabric's parameters, and there is no directory. */
START_TEST(test_ntb_fabric)
{
    g_autoptr(GError) error = NULL;
    g_autoptr(VnConfig) c = vn_conf_parse("[node]\nname = hosta\nfabric = ntb\n"
                                          "[fabric]\nports = /dev/vfio-ntb/0000:00:05.0=hostb\n",
                                          &error);

    ck_assert_msg(c != NULL, "%s", error ? error->message : "");
    ck_assert_str_eq(c->fabric, "ntb");
    ck_assert_str_eq(g_hash_table_lookup(c->fabric_params, "ports"),
                     "/dev/vfio-ntb/0000:00:05.0=hostb");
    ck_assert(!g_hash_table_contains(c->fabric_params, "dir"));
}
END_TEST

/* The QEMU user is whoever the config names (a user of every Debian host here). */
START_TEST(test_qemu_user)
{
    g_autoptr(GError) error = NULL;
    g_autoptr(VnConfig) c = vn_conf_parse(NODE "qemu-user = nobody\n", &error);

    ck_assert_msg(c != NULL, "%s", error ? error->message : "");
    ck_assert_str_eq(c->qemu_user, "nobody");
    ck_assert_uint_eq(c->qemu_uid, 65534);
}
END_TEST

START_TEST(test_refused)
{
    g_autoptr(GError) error = NULL;
    g_autoptr(VnConfig) c = vn_conf_parse(bad[_i].text, &error);

    ck_assert_msg(c == NULL, "accepted:\n%s", bad[_i].text);
    ck_assert_ptr_nonnull(error);
    ck_assert_msg(strstr(error->message, bad[_i].why) != NULL, "%s\nsays: %s", bad[_i].text,
                  error->message);
}
END_TEST

/*
 * What GKeyFile lets pass, and what only opening the fabric found before:
 * each refused, naming its line (NODE is lines 1-3) and the value.
 */
static const struct {
    const char *text;
    unsigned line;
    const char *why;
} holes[] = {
    /* GKeyFile keeps the last: this started "hosty". */
    { NODE "name = hosty\n", 4, "name = \"hosty\": \"name\" again (first at line 2)" },
    { NODE "[lend n]\nsocket = /s\nallow = *\n[lend n]\nsocket = /t\nallow = hostb\n", 7,
      "[lend n] again (first at line 4)" },
    { NODE "[lend n]\nsocket = /s\nallow = *\nallow = hostb\n", 7,
      "[lend n] allow = \"hostb\": \"allow\" again (first at line 6)" },
    /* It overrode fabric-dir. */
    { NODE "[fabric]\ndir = /elsewhere\n", 5,
      "[fabric] dir = \"/elsewhere\": the shm fabric's directory is [node] fabric-dir" },
    /* Part of the value, which nothing else checks here. */
    { NODE "stats-file = /run/h.stats # counters\n", 4,
      "stats-file = \"/run/h.stats # counters\": a comment after a value (\"# counters\")" },
    { NODE "[lend n]\nsocket = /run/s.sock\t# the server\nallow = *\n", 5,
      "a comment after a value" },
    { NODE "[lend n]\nsocket = /run/s.sock\nallow = # nobody yet\n", 6, "a comment after a value" },
    /* [fabric]: the backend's checks, without opening it (exit 1 before). */
    { NODE "[fabric]\nmax-windows = 0\n", 5, "[fabric] max-windows = \"0\": shm fabric" },
    { NODE "[fabric]\nmax-window-size = 5000\n", 5, "5000 is not a power of two" },
    { NODE "[fabric]\nmax-window-size = 4096\nwindow-align = 8192\n", 6,
      "[fabric] window-align = \"8192\"" },
    { NODE "[fabric]\ncolour = blue\n", 5, "unknown parameter \"colour\"" },
    { NODE "[fabric]\nrequest-timeout-ms = 0\n", 5, "[fabric] request-timeout-ms = \"0\"" },
    { "[node]\nname = hosta\nfabric = ntb\n[fabric]\nports = /dev/sda\n", 5,
      "not /dev/vfio-ntb/NAME" },
    { "[node]\nname = hosta\nfabric = ntb\n[fabric]\nports = pair:x/0\nring-size = 1000\n", 6,
      "[fabric] ring-size = \"1000\"" },
    { "[node]\nname = hosta\nfabric = ntb\n[fabric]\nports = pair:x/0=Host B\n", 5,
      "\"Host B\" is not a node name" },
    { "[node]\nname = hosta\nfabric = ntb\n[fabric]\nports = pair:x/0=hostb,pair:y/1\n", 5,
      "\"pair:y/1\" must name the node cabled to it (PORT=NODE)" },
    { "[node]\nname = hosta\nfabric = ntb\n", 1, "\"ports\" must list 1 to" },
    { "[node]\nname = hosta\nfabric = infiniband\n", 3,
      "fabric = \"infiniband\": no fabric backend" },
    /* Lines GKeyFile refuses without saying where. */
    { "name = hosta\n" NODE, 1, "\"name = hosta\" comes before any [group]" },
    { NODE "[lend n\n", 4, "\"[lend n\" is not a [group] header" },
    { NODE "socket /run/s.sock\n", 4, "is not \"key = value\"" },
    { NODE "log-level = loud\n", 4, "log-level = \"loud\": error, warning, notice, info or debug" },
    { NODE "qemu-user = no-such-user-here\n", 4,
      "qemu-user = \"no-such-user-here\": no such user on this host" },
    { NODE "qemu-user = root\n", 4, "qemu-user = \"root\": root's sockets are the default" },
    { NODE "worker-user = root\n", 4, "worker-user = \"root\": uid 0 keeps every capability" },
    { NODE "[fabric]\ndoorbell-rate = 5\n", 5, "[fabric] doorbell-rate = \"5\"" },
    { "[node]\nname = hosta\nfabric = ntb\n[fabric]\nports = pair:x/0=hostb\n"
      "key-file = /nonexistent/link.keys\n",
      6, "[fabric] key-file = \"/nonexistent/link.keys\": ntb fabric: key-file" },
};

START_TEST(test_holes)
{
    g_autoptr(GError) error = NULL;
    g_autoptr(VnConfig) c = vn_conf_parse(holes[_i].text, &error);
    g_autofree char *at = g_strdup_printf("line %u: ", holes[_i].line);

    ck_assert_msg(c == NULL, "accepted:\n%s", holes[_i].text);
    ck_assert_msg(strstr(error->message, holes[_i].why) != NULL, "%s\nsays: %s", holes[_i].text,
                  error->message);
    ck_assert_msg(g_str_has_prefix(error->message, at), "%s\nsays: %s (not at %s)", holes[_i].text,
                  error->message, at);
}
END_TEST

/* From a file, a message starts FILE:LINE, as a compiler's does. */
START_TEST(test_file_line)
{
    g_autofree char *dir = g_dir_make_tmp("vn-conf-XXXXXX", NULL);
    g_autofree char *path = g_build_filename(dir, "bad.conf", NULL);
    g_autofree char *want = g_strdup_printf("%s:4: [node] name = \"hosty\"", path);
    g_autoptr(GError) error = NULL;
    VnConfig *c;

    ck_assert(g_file_set_contents(path, NODE "name = hosty\n", -1, NULL));
    c = vn_conf_load(path, &error);
    ck_assert_ptr_null(c);
    ck_assert_msg(g_str_has_prefix(error->message, want), "%s", error->message);
    g_clear_error(&error);
    ck_assert(g_file_set_contents(path, NODE "\n[fabric]\nmax-windows = 999\n", -1, NULL));
    ck_assert_ptr_null(vn_conf_load(path, &error));
    g_free(want);
    want = g_strdup_printf("%s:6: [fabric] max-windows = \"999\"", path);
    ck_assert_msg(g_str_has_prefix(error->message, want), "%s", error->message);
    g_unlink(path);
    g_rmdir(dir);
}
END_TEST

/* Only a regular file of at most 1 MiB is read: a FIFO (no writer: reading
 * it would block), /dev/zero (endless) and a file over the bound are
 * refused, each at once and with what is wrong. */
START_TEST(test_file_bounded)
{
    g_autofree char *dir = g_dir_make_tmp("vn-conf-XXXXXX", NULL);
    g_autofree char *fifo = g_build_filename(dir, "fifo.conf", NULL);
    g_autofree char *big = g_build_filename(dir, "big.conf", NULL);
    g_autofree char *text = g_strnfill(1024 * 1024 + 1, '#');
    const char *paths[] = { fifo, "/dev/zero", big };

    ck_assert_int_eq(mkfifo(fifo, 0600), 0);
    ck_assert(g_file_set_contents(big, text, -1, NULL));
    for (size_t i = 0; i < G_N_ELEMENTS(paths); i++) {
        g_autoptr(GError) error = NULL;

        ck_assert_ptr_null(vn_conf_load(paths[i], &error));
        ck_assert_msg(strstr(error->message, "1 MiB") != NULL, "%s", error->message);
    }
    g_unlink(fifo);
    g_unlink(big);
    g_rmdir(dir);
}
END_TEST

/* Checking the fabric's parameters opens nothing: a fabric directory that
 * does not exist is not made, an NTB port that does not exist is fine. */
START_TEST(test_check_touches_nothing)
{
    g_autofree char *dir = g_dir_make_tmp("vn-conf-XXXXXX", NULL);
    g_autofree char *fab = g_build_filename(dir, "fabric", NULL);
    g_autofree char *text =
        g_strdup_printf("[node]\nname = hosta\nfabric-dir = %s\nlog-level = info\n"
                        "[fabric]\nmax-windows = 4\n"
                        "[lend n]\nsocket = /run/a#b.sock\nallow = *\n",
                        fab);
    g_autoptr(GError) error = NULL;
    g_autoptr(VnConfig) c = vn_conf_parse(text, &error);

    ck_assert_msg(c != NULL, "%s", error ? error->message : "");
    ck_assert(!g_file_test(fab, G_FILE_TEST_EXISTS));
    ck_assert_int_eq(c->log_level, VN_LOG_INFO);
    ck_assert(c->log_level_set);
    /* a '#' inside a word is text */
    ck_assert_str_eq(((VnLendConf *)c->lends->pdata[0])->socket, "/run/a#b.sock");
    g_rmdir(dir);
}
END_TEST

/* A config of more devices than a daemon serves is refused, not truncated. */
START_TEST(test_too_many_devices)
{
    g_autoptr(GString) text = g_string_new(NODE);
    g_autoptr(GError) error = NULL;
    g_autoptr(VnConfig) c = NULL;

    for (int i = 0; i <= VN_CONF_MAX_DEVICES; i++) {
        g_string_append_printf(text, "[lend d%d]\nsocket = /run/d%d.sock\nallow = *\n", i, i);
    }
    c = vn_conf_parse(text->str, &error);
    ck_assert_ptr_null(c);
    ck_assert_ptr_nonnull(strstr(error->message, "more than 64 devices"));
}
END_TEST

/* An access list is bounded like one given at run time. */
START_TEST(test_long_access_list)
{
    g_autoptr(GString) text = g_string_new(NODE "[lend n]\nsocket = /s\nallow = ");
    g_autoptr(GError) error = NULL;
    g_autoptr(VnConfig) c = NULL;

    for (int i = 0; i <= VN_CONF_MAX_ALLOW; i++) {
        g_string_append_printf(text, "host%d;", i);
    }
    g_string_append_c(text, '\n');
    c = vn_conf_parse(text->str, &error);
    ck_assert_ptr_null(c);
    ck_assert_ptr_nonnull(strstr(error->message, "1-256 nodes"));
}
END_TEST

/* A device added at run time: the same rules. */
START_TEST(test_runtime_lend)
{
    const char *ok[] = { "hostb", NULL };
    const char *none[] = { NULL };
    g_autoptr(GError) error = NULL;
    VnLendConf *l = vn_conf_lend_new("nvme0", "/run/n.sock", NULL, ok, &error);

    ck_assert_ptr_nonnull(l);
    ck_assert(l->runtime);
    ck_assert(vn_lend_conf_allows(l, "hostb"));
    vn_conf_lend_free(l);
    ck_assert_ptr_null(vn_conf_lend_new("nv me0", "/run/n.sock", NULL, ok, NULL));
    ck_assert_ptr_null(vn_conf_lend_new("nvme0", "n.sock", NULL, ok, NULL));
    ck_assert_ptr_null(vn_conf_lend_new("nvme0", "/run/n.sock", NULL, none, NULL));
}
END_TEST

/* A PCI function of this host is lent through VFIO: `pci = DDDD:BB:DD.F`,
 * instead of a socket, never with one. */
START_TEST(test_lend_pci)
{
    g_autoptr(GError) error = NULL;
    VnConfig *c = vn_conf_parse("[node]\nname = hosta\nfabric = shm\nfabric-dir = /f\n"
                                "[lend gpu0]\npci = 0000:3b:00.1\nallow = hostb\n",
                                &error);
    const char *ok[] = { "hostb", NULL };
    const char *malformed[] = { "3b:00.1",      "0000:3B:00.1", "0000:3b:00.8",
                                "0000:3b:20.0", "0000-3b-00.1", "0000:3b:00.10" };
    VnLendConf *l;

    ck_assert_msg(c != NULL, "%s", error ? error->message : "");
    l = c->lends->pdata[0];
    ck_assert_str_eq(l->pci, "0000:3b:00.1");
    ck_assert_ptr_null(l->socket);
    ck_assert_str_eq(vn_conf_lend_backend(l), "vfio");
    ck_assert_str_eq(vn_conf_lend_where(l), "0000:3b:00.1");
    vn_conf_free(c);
    for (size_t i = 0; i < G_N_ELEMENTS(malformed); i++) {
        ck_assert_msg(vn_conf_lend_new("gpu0", NULL, malformed[i], ok, &error) == NULL, "%s",
                      malformed[i]);
        ck_assert_ptr_nonnull(strstr(error->message, "not a PCI address"));
        g_clear_error(&error);
    }
    ck_assert_ptr_null(vn_conf_lend_new("gpu0", "/run/g.sock", "0000:3b:00.1", ok, &error));
    ck_assert_ptr_nonnull(strstr(error->message, "not both"));
    g_clear_error(&error);
    ck_assert_ptr_null(vn_conf_parse("[node]\nname = hosta\nfabric = shm\nfabric-dir = /f\n"
                                     "[lend gpu0]\nallow = hostb\n",
                                     &error));
    ck_assert_ptr_nonnull(strstr(error->message, "\"pci\""));
}
END_TEST

/* managed = yes|no on a PCI function; anything else, or on a device
 * server's device, refused naming the key. */
START_TEST(test_lend_managed)
{
    static const char head[] = "[node]\nname = hosta\nfabric = shm\nfabric-dir = /f\n";
    g_autoptr(GError) error = NULL;
    g_autofree char *yes = g_strconcat(head,
                                       "[lend nvme1]\npci = 0000:3b:00.0\nmanaged = yes\n"
                                       "allow = *\n",
                                       NULL);
    g_autofree char *no = g_strconcat(head,
                                      "[lend nvme1]\npci = 0000:3b:00.0\nmanaged = no\n"
                                      "allow = *\n",
                                      NULL);
    g_autofree char *maybe = g_strconcat(head,
                                         "[lend nvme1]\npci = 0000:3b:00.0\n"
                                         "managed = maybe\nallow = *\n",
                                         NULL);
    g_autofree char *sock = g_strconcat(head,
                                        "[lend nvme1]\nsocket = /run/d.sock\n"
                                        "managed = yes\nallow = *\n",
                                        NULL);
    VnConfig *c = vn_conf_parse(yes, &error);

    ck_assert_msg(c != NULL, "%s", error ? error->message : "");
    ck_assert(((VnLendConf *)c->lends->pdata[0])->managed);
    vn_conf_free(c);
    c = vn_conf_parse(no, &error);
    ck_assert_msg(c != NULL, "%s", error ? error->message : "");
    ck_assert(!((VnLendConf *)c->lends->pdata[0])->managed);
    vn_conf_free(c);
    ck_assert_ptr_null(vn_conf_parse(maybe, &error));
    ck_assert_ptr_nonnull(strstr(error->message, "managed = \"maybe\": yes or no"));
    g_clear_error(&error);
    ck_assert_ptr_null(vn_conf_parse(sock, &error));
    ck_assert_ptr_nonnull(strstr(error->message, "[lend nvme1]: managed = yes is for a PCI"));
}
END_TEST

/* sriov-vfs = N on a physical function; a count out of range, a device
 * server's device, or VF names beyond the name rule refused. */
START_TEST(test_lend_sriov)
{
    static const char head[] = "[node]\nname = hosta\nfabric = shm\nfabric-dir = /f\n";
    static const struct {
        const char *section;
        const char *why;
    } refused[] = {
        { "[lend nic0]\npci = 0000:3b:00.0\nsriov-vfs = 0\nallow = *\n", "1-32 virtual" },
        { "[lend nic0]\npci = 0000:3b:00.0\nsriov-vfs = 33\nallow = *\n", "1-32 virtual" },
        { "[lend nic0]\npci = 0000:3b:00.0\nsriov-vfs = two\nallow = *\n", "1-32 virtual" },
        { "[lend nic0]\nsocket = /run/n.sock\nsriov-vfs = 2\nallow = *\n", "physical function" },
        /* a 60-byte name is one; NAME-vf1 (64) is not */
        { "[lend nic000000000000000000000000000000000000000000000000000000000]\n"
          "pci = 0000:3b:00.0\nsriov-vfs = 2\nallow = *\n",
          "device names" },
    };
    g_autoptr(GError) error = NULL;
    g_autofree char *ok = g_strconcat(head,
                                      "[lend nic0]\npci = 0000:3b:00.0\nsriov-vfs = 4\n"
                                      "allow = hostb;hostc\n",
                                      NULL);
    VnConfig *c = vn_conf_parse(ok, &error);

    ck_assert_msg(c != NULL, "%s", error ? error->message : "");
    ck_assert_uint_eq(((VnLendConf *)c->lends->pdata[0])->sriov_vfs, 4);
    vn_conf_free(c);
    for (size_t i = 0; i < G_N_ELEMENTS(refused); i++) {
        g_autofree char *text = g_strconcat(head, refused[i].section, NULL);

        ck_assert_ptr_null(vn_conf_parse(text, &error));
        ck_assert_msg(strstr(error->message, refused[i].why) != NULL, "%s", error->message);
        g_clear_error(&error);
    }
}
END_TEST

static Suite *conf_suite(void)
{
    Suite *s = suite_create("conf");
    TCase *tc;

    tc = tcase_create("accepted");
    tcase_add_test(tc, test_shipped_example);
    tcase_add_test(tc, test_defaults);
    tcase_add_test(tc, test_everything);
    tcase_add_test(tc, test_lend_managed);
    tcase_add_test(tc, test_lend_sriov);
    tcase_add_test(tc, test_runtime_lend);
    tcase_add_test(tc, test_lend_pci);
    tcase_add_test(tc, test_ntb_fabric);
    tcase_add_test(tc, test_qemu_user);
    tcase_add_test(tc, test_check_touches_nothing);
    suite_add_tcase(s, tc);

    tc = tcase_create("refused");
    tcase_add_loop_test(tc, test_refused, 0, G_N_ELEMENTS(bad));
    tcase_add_test(tc, test_too_many_devices);
    tcase_add_test(tc, test_long_access_list);
    suite_add_tcase(s, tc);

    tc = tcase_create("holes");
    tcase_add_loop_test(tc, test_holes, 0, G_N_ELEMENTS(holes));
    tcase_add_test(tc, test_file_line);
    tcase_add_test(tc, test_file_bounded);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    return vn_check_main(conf_suite());
}
