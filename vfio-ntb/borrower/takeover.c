/*
 * A borrower worker's death, unseen by its QEMU.  QEMU cannot reconnect to a vfio-user
 * server, so the worker keeps with its daemon (fabric/host.h's KEEP, daemon/keep.h) what
 * the next worker needs to serve the same QEMU: its listening socket, QEMU's connection,
 * the eventfds it holds for QEMU, and its state -- what it set up for QEMU that is not
 * the lender's to remember (the DMA mappings and the guest-memory segments behind them,
 * the interrupt routes and doorbell bits, the mediated Interrupt Line and ROM BAR).  The
 * data path never goes through the worker: the lender's device keeps reaching the VM's
 * memory through the daemon's port, the VM its BARs, and its interrupts keep arriving
 * meanwhile.  The daemon starts the next worker with all of it (daemon/takeover.c), and
 * vn_borrower_take_over() puts it back.
 *
 * The state is JSON: "caps" (QEMU's VERSION: max_msg_fds, max_data_xfer_size, pgsizes,
 * max_dma_maps), "segments" ([dev, ino, id]), "mappings" ([iova, size, prot, segment]),
 * "lingering" ([iova] of those QEMU unmapped: dma.c), "routes" ([index, vector, id]),
 * "relay" ([index, vector, bit]), "int_line", "rom_bar".
 * It is a dead process's word: everything in it is checked again here.
 */
#define G_LOG_DOMAIN "vfio-ntb.borrower"

#include "borrower-int.h"

#include "common/json.h"
#include "common/peerfd.h"
#include "common/util.h"
#include "fabric/host.h"

#include <errno.h>
#include <fcntl.h>
#include <gio/gio.h>
#include <inttypes.h>
#include <json-glib/json-glib.h>
#include <linux/vfio.h>
#include <string.h>
#include <unistd.h>

/* What the daemon keeps under which key (fabric/host.h). */
#define KEY_LISTEN VN_HOST_KEEP_LISTEN
#define KEY_CLIENT VN_HOST_KEEP_CLIENT
#define KEY_IRQ_FIRST VN_HOST_KEEP_IRQ_FIRST
#define KEY_IRQ(index, vector) VN_HOST_KEEP_IRQ(index, vector)
#define KEY_IRQ_LAST KEY_IRQ(VN_MAX_IRQ_INDEXES - 1, VN_MAX_IRQ_VECTORS - 1)
G_STATIC_ASSERT(VN_MAX_IRQ_VECTORS <= 0x1000);

/* The handoff the daemon gives the worker that takes over (at most this long): the state as
 * a JSON string (each byte at most 2 once escaped: the state is ASCII JSON) and the fds. */
#define VN_BORROWER_MAX_HANDOFF (2u * VN_HOST_MAX_KEPT_STATE + 8192u)

/* ---- what is kept ------------------------------------------------------ */

static void add_row(JsonBuilder *jb, const uint64_t *v, unsigned n)
{
    json_builder_begin_array(jb);
    for (unsigned i = 0; i < n; i++) {
        json_builder_add_int_value(jb, (gint64)v[i]); /* read back bit for bit */
    }
    json_builder_end_array(jb);
}

/* ---- the rows that change with every DMA message ----------------------- */

static JsonNode *row_new(const uint64_t *v, unsigned n)
{
    JsonArray *a = json_array_sized_new(n);
    JsonNode *node = json_node_alloc();

    for (unsigned i = 0; i < n; i++) {
        json_array_add_int_element(a, (gint64)v[i]); /* read back bit for bit */
    }
    json_node_init_array(node, a);
    json_array_unref(a);
    return node;
}

/* Take @row out of @rows (looked for from the end when @recent: a mapping goes soon after
 * it came; lingering ones go oldest first). */
static void row_remove(JsonArray *rows, JsonNode **row, bool recent)
{
    guint n = json_array_get_length(rows);

    for (guint k = 0; k < n && *row != NULL; k++) {
        guint i = recent ? n - 1 - k : k;

        if (json_array_get_element(rows, i) == *row) {
            json_array_remove_element(rows, i);
            *row = NULL;
        }
    }
}

void vn_borrower_state_lingers(VnBorrower *b, VnBorrowerMapping *m, bool lingers)
{
    if (lingers && m->kept_linger == NULL) {
        if (b->kept_lingering == NULL) {
            b->kept_lingering = json_array_new();
        }
        m->kept_linger = row_new(&m->iova, 1);
        json_array_add_element(b->kept_lingering, m->kept_linger);
    } else if (!lingers && m->kept_linger != NULL) {
        row_remove(b->kept_lingering, &m->kept_linger, false);
    }
}

void vn_borrower_state_listed(VnBorrower *b, VnBorrowerMapping *m)
{
    if (b->kept_mappings == NULL) {
        b->kept_mappings = json_array_new();
    }
    m->kept_row = row_new((uint64_t[]){ m->iova, m->size, m->prot, m->seg->id }, 4);
    json_array_add_element(b->kept_mappings, m->kept_row);
    vn_borrower_state_lingers(b, m, m->lingering);
}

void vn_borrower_state_unlisted(VnBorrower *b, VnBorrowerMapping *m)
{
    vn_borrower_state_lingers(b, m, false);
    if (m->kept_row != NULL) {
        row_remove(b->kept_mappings, &m->kept_row, true);
    }
}

void vn_borrower_state_clear(VnBorrower *b)
{
    g_clear_pointer(&b->kept_mappings, json_array_unref);
    g_clear_pointer(&b->kept_lingering, json_array_unref);
}

/* The rows of @rows (NULL: none) as the next member's value: shared, not copied. */
static void add_rows(JsonBuilder *jb, JsonArray *rows)
{
    g_autoptr(JsonArray) none = rows == NULL ? json_array_new() : NULL;
    JsonNode *node = json_node_alloc();

    json_node_init_array(node, rows != NULL ? rows : none);
    json_builder_add_value(jb, node); /* the builder's now; the array is ours still */
}

static char *state_json(VnBorrower *b, size_t *len)
{
    g_autoptr(JsonBuilder) jb = json_builder_new();
    g_autoptr(JsonNode) root = NULL;
    const VnWireCaps *c = vn_server_caps(b->server);
    uint64_t caps[] = { c->max_msg_fds, c->max_data_xfer_size, c->pgsizes, c->max_dma_maps };
    gsize n = 0;
    char *s;

    json_builder_begin_object(jb);
    json_builder_set_member_name(jb, "caps");
    add_row(jb, caps, G_N_ELEMENTS(caps));
    json_builder_set_member_name(jb, "segments");
    json_builder_begin_array(jb);
    for (GList *l = b->segments; l != NULL; l = l->next) {
        VnBorrowerSegment *seg = l->data;

        add_row(jb, (uint64_t[]){ seg->dev, seg->ino, seg->id }, 3);
    }
    json_builder_end_array(jb);
    json_builder_set_member_name(jb, "mappings");
    add_rows(jb, b->kept_mappings);
    /* Of those, the ones QEMU unmapped (they linger at the lender): the successor must not
     * tell QEMU's table of them, and must still unmap them in time. */
    json_builder_set_member_name(jb, "lingering");
    add_rows(jb, b->kept_lingering);
    json_builder_set_member_name(jb, "routes");
    json_builder_begin_array(jb);
    for (uint32_t i = 0; i < VN_MAX_IRQ_INDEXES; i++) {
        for (uint32_t v = 0; b->routes[i] != NULL && v < b->info.irq_count[i]; v++) {
            if (b->routes[i][v] != 0) {
                add_row(jb, (uint64_t[]){ i, v, b->routes[i][v] }, 3);
            }
        }
    }
    json_builder_end_array(jb);
    json_builder_set_member_name(jb, "relay");
    json_builder_begin_array(jb);
    for (uint32_t i = 0; i < VN_BORROWER_RELAY_INDEXES; i++) {
        for (uint32_t v = 0; v < VN_PROTO_RELAY_VECTORS; v++) {
            if (b->relay_bit[i][v] != 0) {
                add_row(jb, (uint64_t[]){ i, v, b->relay_bit[i][v] - 1u }, 3);
            }
        }
    }
    json_builder_end_array(jb);
    json_builder_set_member_name(jb, "int_line");
    json_builder_add_int_value(jb, b->med.int_line);
    json_builder_set_member_name(jb, "rom_bar");
    json_builder_add_int_value(jb, b->med.rom_bar);
    json_builder_end_object(jb);
    root = json_builder_get_root(jb);
    s = json_to_string(root, FALSE);
    n = strlen(s);
    *len = n;
    return s;
}

void vn_borrower_keep_state(VnBorrower *b, bool force)
{
    size_t len = 0;
    g_autofree char *s = NULL;
    g_autoptr(GBytes) now = NULL;

    if (b->server == NULL) {
        return; /* still starting: nothing to keep yet */
    }
    s = state_json(b, &len);
    now = g_bytes_new_take(g_steal_pointer(&s), len);
    if (!force && b->kept != NULL && g_bytes_equal(now, b->kept)) {
        return;
    }
    if (len > VN_HOST_MAX_KEPT_STATE) {
        /* A successor with a stale state would undo the wrong mappings: none, then (the
         * daemon ends the attachment if we die). */
        if (b->kept == NULL || g_bytes_get_size(b->kept) <= VN_HOST_MAX_KEPT_STATE) {
            g_warning("borrower %s: %zu bytes of state are more than the daemon keeps; "
                      "this worker cannot be replaced under its QEMU",
                      b->device, len);
        }
        vn_host_forget(b->fab, 0, 0);
    } else {
        vn_host_keep(b->fab, 0, -1, g_bytes_get_data(now, NULL), len);
    }
    g_clear_pointer(&b->kept, g_bytes_unref);
    b->kept = g_steal_pointer(&now);
}

void vn_borrower_keep_sockets(VnBorrower *b)
{
    int client;

    if (b->server == NULL) {
        return;
    }
    vn_host_keep(b->fab, KEY_LISTEN, vn_server_listen_fd(b->server), NULL, 0);
    client = vn_server_client_fd(b->server);
    if (client >= 0) {
        vn_host_keep(b->fab, KEY_CLIENT, client, NULL, 0);
    }
}

void vn_borrower_keep_irqs(VnBorrower *b, uint32_t index, uint32_t start, uint32_t count)
{
    uint32_t end;

    if (b->server == NULL || index >= b->info.num_irqs) {
        return;
    }
    end = count == 0 ? b->info.irq_count[index] : MIN(start + count, b->info.irq_count[index]);
    if (end <= start) {
        return;
    }
    /* One FORGET for the range, then what is armed in it (the daemon takes them in order):
     * an MSI-X index of 2048 vectors is not 2048 records. */
    vn_host_forget(b->fab, KEY_IRQ(index, start), KEY_IRQ(index, end - 1));
    for (uint32_t v = start; v < end; v++) {
        int fd = vn_irqs_fd_dup(vn_server_irqs(b->server), index, v);

        if (fd >= 0) {
            vn_host_keep(b->fab, KEY_IRQ(index, v), fd, NULL, 0);
            close(fd);
        }
    }
}

void vn_borrower_keep_client_gone(VnBorrower *b)
{
    vn_host_forget(b->fab, KEY_CLIENT, KEY_CLIENT);
    vn_host_forget(b->fab, KEY_IRQ_FIRST, KEY_IRQ_LAST);
    vn_borrower_keep_state(b, false);
}

static void relay_ring_all(VnBorrower *b);

void vn_borrower_kept_again(void *opaque)
{
    VnBorrower *b = opaque;

    vn_borrower_keep_sockets(b);
    for (uint32_t i = 0; i < b->info.num_irqs; i++) {
        if (i == VFIO_PCI_REQ_IRQ_INDEX ||
            (b->mode == VN_IRQ_MODE_RELAY && i < VN_BORROWER_RELAY_INDEXES)) {
            vn_borrower_keep_irqs(b, i, 0, 0);
        }
    }
    vn_borrower_keep_state(b, true);
    vn_borrower_p2p_again(b);
    /* Our daemon was away: the doorbells it would have passed us meanwhile are lost. */
    relay_ring_all(b);
}

/* ---- what is put back -------------------------------------------------- */

/* @node as @n numbers, each at most @max[k] (NULL: any); false with @error naming @name
 * and @i. */
static bool numbers(JsonNode *node, const char *name, guint i, uint64_t *v, unsigned n,
                    const uint64_t *max, GError **error)
{
    JsonArray *r = node != NULL && JSON_NODE_HOLDS_ARRAY(node) ? json_node_get_array(node) : NULL;

    if (r == NULL || json_array_get_length(r) != n) {
        g_set_error(error, G_IO_ERROR, G_IO_ERROR_INVALID_DATA, "%s %u: not %u numbers", name, i,
                    n);
        return false;
    }
    for (unsigned k = 0; k < n; k++) {
        JsonNode *e = json_array_get_element(r, k);

        if (!JSON_NODE_HOLDS_VALUE(e) || json_node_get_value_type(e) != G_TYPE_INT64) {
            g_set_error(error, G_IO_ERROR, G_IO_ERROR_INVALID_DATA, "%s %u: not %u numbers", name,
                        i, n);
            return false;
        }
        v[k] = (uint64_t)json_node_get_int(e);
        if (max != NULL && v[k] > max[k]) {
            g_set_error(error, G_IO_ERROR, G_IO_ERROR_INVALID_DATA,
                        "%s %u: %" PRIu64 " is out of range", name, i, v[k]);
            return false;
        }
    }
    return true;
}

/* Row @i of @a. */
static bool row(JsonArray *a, guint i, const char *name, uint64_t *v, unsigned n,
                const uint64_t *max, GError **error)
{
    return numbers(json_array_get_element(a, i), name, i, v, n, max, error);
}

/* Array @name of @o (absent: empty), at most @max rows. */
static JsonArray *rows(JsonObject *o, const char *name, guint max, GError **error)
{
    JsonNode *node = json_object_get_member(o, name);
    JsonArray *a;

    if (node == NULL) {
        return NULL;
    }
    a = JSON_NODE_HOLDS_ARRAY(node) ? json_node_get_array(node) : NULL;
    if (a == NULL || json_array_get_length(a) > max) {
        g_set_error(error, G_IO_ERROR, G_IO_ERROR_INVALID_DATA, "\"%s\" is no array of at most %u",
                    name, max);
    }
    return a;
}

static VnBorrowerSegment *segment_of(VnBorrower *b, uint64_t id)
{
    for (GList *l = b->segments; l != NULL; l = l->next) {
        if (((VnBorrowerSegment *)l->data)->id == id) {
            return l->data;
        }
    }
    return NULL;
}

static bool restore_dma(VnBorrower *b, JsonObject *st, GArray *seg_ids, GError **error)
{
    g_autoptr(GHashTable) lingering =
        g_hash_table_new_full(g_int64_hash, g_int64_equal, g_free, NULL);
    /* Every mapping, lingering ones too, in a table of its own: it refuses overlaps and bad
     * ranges among all of them (the server's gets only those QEMU still has mapped). */
    g_autoptr(VnDma) all = vn_dma_new();
    JsonArray *a = rows(st, "segments", VN_MAX_DMA_MAPS, error);
    uint64_t v[4];

    for (guint i = 0; a != NULL && *error == NULL && i < json_array_get_length(a); i++) {
        VnBorrowerSegment *seg;

        if (!row(a, i, "segment", v, 3, NULL, error)) {
            return false;
        }
        if (v[2] == 0 || segment_of(b, v[2]) != NULL) {
            g_set_error(error, G_IO_ERROR, G_IO_ERROR_INVALID_DATA, "segment %u: id %" PRIu64, i,
                        v[2]);
            return false;
        }
        seg = g_new0(VnBorrowerSegment, 1);
        *seg = (VnBorrowerSegment){ .dev = (dev_t)v[0], .ino = (ino_t)v[1], .id = v[2] };
        b->segments = g_list_prepend(b->segments, seg);
        g_array_append_val(seg_ids, v[2]);
    }
    a = *error == NULL ? rows(st, "lingering", VN_BORROWER_MAX_LINGERING, error) : NULL;
    for (guint i = 0; a != NULL && *error == NULL && i < json_array_get_length(a); i++) {
        if (!row(a, i, "lingering", v, 1, NULL, error)) {
            return false;
        }
        g_hash_table_add(lingering, g_memdup2(&v[0], sizeof(v[0])));
    }
    a = *error == NULL ? rows(st, "mappings", VN_MAX_DMA_MAPS, error) : NULL;
    for (guint i = 0; a != NULL && *error == NULL && i < json_array_get_length(a); i++) {
        VnBorrowerMapping *m;
        VnBorrowerSegment *seg;
        bool lingers;
        int ret;

        if (!row(a, i, "mapping", v, 4, NULL, error)) {
            return false;
        }
        seg = segment_of(b, v[3]);
        lingers = g_hash_table_contains(lingering, &v[0]);
        /* In the server's table too (without the memory: the lender reaches it, not we),
         * so that QEMU's unmap finds it.  One QEMU unmapped is not: QEMU may map its range
         * again. */
        ret = seg == NULL ? -ENOENT : vn_dma_map(all, v[0], v[1], 0, (uint32_t)v[2], -1);
        if (ret == 0 && !lingers) {
            ret = vn_dma_map(vn_server_dma(b->server), v[0], v[1], 0, (uint32_t)v[2], -1);
        }
        if (ret < 0) {
            g_set_error(error, G_IO_ERROR, G_IO_ERROR_INVALID_DATA,
                        "mapping %u (iova 0x%" PRIx64 "): %s", i, v[0], g_strerror(-ret));
            return false;
        }
        m = g_new0(VnBorrowerMapping, 1);
        /* A lingering one's time starts once served (vn_borrower_dma_taken_over). */
        *m = (VnBorrowerMapping){ .iova = v[0],
                                  .size = v[1],
                                  .prot = (uint32_t)v[2],
                                  .seg = seg,
                                  .confirmed = true,
                                  .lingering = lingers };
        seg->refs++;
        b->mappings = g_list_prepend(b->mappings, m);
        vn_borrower_state_listed(b, m);
    }
    return *error == NULL;
}

static bool restore_irqs(VnBorrower *b, JsonObject *st, GArray *route_ids, uint64_t *doorbells,
                         GError **error)
{
    JsonArray *a = rows(st, "routes", VN_MAX_IRQ_INDEXES * VN_MAX_IRQ_VECTORS, error);
    const uint64_t relay_max[] = { VN_BORROWER_RELAY_INDEXES - 1, VN_PROTO_RELAY_VECTORS - 1,
                                   VN_FABRIC_MAX_DOORBELLS - 1 };
    uint64_t v[3];

    for (guint i = 0; a != NULL && *error == NULL && i < json_array_get_length(a); i++) {
        if (!row(a, i, "route", v, 3, NULL, error)) {
            return false;
        }
        if (v[0] >= b->info.num_irqs || v[1] >= b->info.irq_count[v[0]] || v[2] == 0) {
            g_set_error(error, G_IO_ERROR, G_IO_ERROR_INVALID_DATA,
                        "route %u: the device has no vector %" PRIu64 " of index %" PRIu64, i, v[1],
                        v[0]);
            return false;
        }
        if (b->routes[v[0]] == NULL) {
            b->routes[v[0]] = g_new0(uint64_t, b->info.irq_count[v[0]]);
        }
        b->routes[v[0]][v[1]] = v[2];
        g_array_append_val(route_ids, v[2]);
    }
    a = *error == NULL ? rows(st, "relay", VN_FABRIC_MAX_DOORBELLS, error) : NULL;
    for (guint i = 0; a != NULL && *error == NULL && i < json_array_get_length(a); i++) {
        if (!row(a, i, "relay", v, 3, relay_max, error)) {
            return false;
        }
        if (b->mode != VN_IRQ_MODE_RELAY || b->doorbell_of[v[2]].used) {
            g_set_error(error, G_IO_ERROR, G_IO_ERROR_INVALID_DATA, "relay %u: bit %" PRIu64, i,
                        v[2]);
            return false;
        }
        b->relay_bit[v[0]][v[1]] = (uint8_t)(v[2] + 1);
        b->doorbell_of[v[2]].used = true;
        b->doorbell_of[v[2]].index = (uint8_t)v[0];
        b->doorbell_of[v[2]].vector = (uint8_t)v[1];
        *doorbells |= UINT64_C(1) << v[2];
    }
    return *error == NULL;
}

/* The eventfds QEMU gave the dead worker, into the server's table again. */
static bool restore_eventfds(VnBorrower *b, GHashTable *fds, GError **error)
{
    GHashTableIter it;
    gpointer key, value;

    g_hash_table_iter_init(&it, fds);
    while (g_hash_table_iter_next(&it, &key, &value)) {
        uint64_t k = *(uint64_t *)key;
        int fd = GPOINTER_TO_INT(value);
        uint32_t index = (uint32_t)((k - KEY_IRQ_FIRST) >> 12),
                 vector = (k - KEY_IRQ_FIRST) & 0xfff;

        if (k < KEY_IRQ_FIRST || k > KEY_IRQ_LAST) {
            continue;
        }
        if (vn_peerfd_eventfd(fd) < 0 ||
            vn_irqs_set(vn_server_irqs(b->server),
                        VFIO_IRQ_SET_DATA_EVENTFD | VFIO_IRQ_SET_ACTION_TRIGGER, index, vector, 1,
                        NULL, &fd, 1) < 0) {
            g_set_error(error, G_IO_ERROR, G_IO_ERROR_INVALID_DATA,
                        "the eventfd of vector %u of index %u cannot be put back", vector, index);
            return false;
        }
        /* The server's table owns it now: out of ours without closing it. */
        g_hash_table_iter_steal(&it);
        g_free(key);
    }
    return true;
}

bool vn_borrower_restore(VnBorrower *b, JsonObject *st, GHashTable *fds, GError **error)
{
    g_autoptr(GArray) seg_ids = g_array_new(FALSE, FALSE, sizeof(uint64_t));
    g_autoptr(GArray) route_ids = g_array_new(FALSE, FALSE, sizeof(uint64_t));
    uint64_t doorbells = 0;

    if (!restore_dma(b, st, seg_ids, error) || !restore_irqs(b, st, route_ids, &doorbells, error) ||
        !restore_eventfds(b, fds, error)) {
        g_prefix_error(error, "borrower %s: the state to take over: ", b->device);
        return false;
    }
    b->med.int_line = (uint8_t)json_object_get_int_member_with_default(st, "int_line", 0);
    b->med.rom_bar = (uint32_t)json_object_get_int_member_with_default(st, "rom_bar", 0);
    if (!vn_host_take_over(b->fab, b->lender, (uint64_t *)(void *)seg_ids->data, seg_ids->len,
                           (uint64_t *)(void *)route_ids->data, route_ids->len, doorbells)) {
        g_set_error(error, G_IO_ERROR, G_IO_ERROR_INVALID_DATA,
                    "borrower %s: the state to take over names a segment or route twice",
                    b->device);
        return false;
    }
    return true;
}

/* Relayed interrupts reach the VM through us and our daemon: a doorbell rung while no worker
 * was there (or into the dead one's socket), or while our daemon restarted, is lost.  Each relayed vector is signalled once, so the guest's
 * driver looks at what it may have missed; one interrupt too many is nothing to it. */
static void relay_ring_all(VnBorrower *b)
{
    unsigned rung = 0;

    for (uint32_t bit = 0; bit < VN_FABRIC_MAX_DOORBELLS; bit++) {
        if (b->doorbell_of[bit].used) {
            rung += vn_irqs_signal(vn_server_irqs(b->server), b->doorbell_of[bit].index,
                                   b->doorbell_of[bit].vector);
        }
    }
    if (rung > 0) {
        g_info("borrower %s: %u relayed vectors signalled once (a doorbell may have come while "
               "no worker was there)",
               b->device, rung);
    }
}

/* ---- the handoff -------------------------------------------------------- */

static void close_value(gpointer fd)
{
    close(GPOINTER_TO_INT(fd));
}

/* The daemon's handoff: {"state": the dead worker's, "fds": {"KEY": FD, ...}}, where each
 * FD was given us open (checked).  The fds table: key -> fd, closed when freed. */
static JsonObject *handoff_read(int fd, GHashTable **fds, GError **error)
{
    g_autofree char *text = g_malloc(VN_BORROWER_MAX_HANDOFF + 1);
    g_autoptr(JsonObject) o = NULL;
    JsonObject *map;
    JsonNode *node;
    GList *members;
    size_t len = 0;
    ssize_t n;

    while (len < VN_BORROWER_MAX_HANDOFF &&
           (n = pread(fd, text + len, VN_BORROWER_MAX_HANDOFF - len, (off_t)len)) > 0) {
        len += (size_t)n;
    }
    text[len] = '\0';
    o = vn_json_parse_object(text, (gssize)len, VN_BORROWER_MAX_HANDOFF, error);
    if (o == NULL) {
        return NULL;
    }
    node = json_object_get_member(o, "fds");
    map = node != NULL && JSON_NODE_HOLDS_OBJECT(node) ? json_node_get_object(node) : NULL;
    if (json_object_get_string_member_with_default(o, "state", NULL) == NULL || map == NULL) {
        g_set_error(error, G_IO_ERROR, G_IO_ERROR_INVALID_DATA, "no state or no fds");
        return NULL;
    }
    *fds = g_hash_table_new_full(g_int64_hash, g_int64_equal, g_free, close_value);
    members = json_object_get_members(map);
    for (GList *m = members; m != NULL; m = m->next) {
        guint64 key = 0;
        gint64 num = json_object_get_int_member_with_default(map, m->data, -1);
        uint64_t *boxed;

        if (!g_ascii_string_to_unsigned(m->data, 10, 1, UINT64_MAX, &key, NULL) || num < 3 ||
            num > INT_MAX || fcntl((int)num, F_GETFD) < 0) {
            g_set_error(error, G_IO_ERROR, G_IO_ERROR_INVALID_DATA, "fd \"%.20s\" is not open",
                        (char *)m->data);
            g_list_free(members);
            g_clear_pointer(fds, g_hash_table_unref);
            return NULL;
        }
        fcntl((int)num, F_SETFD, FD_CLOEXEC);
        boxed = g_new(uint64_t, 1);
        *boxed = key;
        g_hash_table_replace(*fds, boxed, GINT_TO_POINTER((int)num));
    }
    g_list_free(members);
    return g_steal_pointer(&o);
}

/* The fd under @key, now the caller's (-1: none). */
static int take_fd(GHashTable *fds, uint64_t key)
{
    gpointer boxed, value;

    if (!g_hash_table_steal_extended(fds, &key, &boxed, &value)) {
        return -1;
    }
    g_free(boxed);
    return GPOINTER_TO_INT(value);
}

bool vn_borrower_handoff_read(int fd, const char *device, VnBorrowerHandoff *h, GError **error)
{
    g_autoptr(JsonObject) handoff = handoff_read(fd, &h->fds, error);

    *h = (VnBorrowerHandoff){ .fds = h->fds, .listen_fd = -1, .client_fd = -1 };
    vn_util_close_fd(&fd);
    if (handoff == NULL) {
        g_prefix_error(error, "borrower %s: the handoff: ", device);
        return false;
    }
    h->state = vn_json_parse_object(json_object_get_string_member(handoff, "state"), -1,
                                    VN_HOST_MAX_KEPT_STATE, error);
    if (h->state == NULL) {
        g_prefix_error(error, "borrower %s: the state to take over: ", device);
        return false;
    }
    vn_wire_parse_caps(NULL, &h->caps, NULL);
    if (json_object_has_member(h->state, "caps")) {
        uint64_t v[4];

        if (!numbers(json_object_get_member(h->state, "caps"), "caps", 0, v, 4, NULL, error)) {
            g_prefix_error(error, "borrower %s: the state to take over: ", device);
            return false;
        }
        h->caps = (VnWireCaps){
            .max_msg_fds = v[0], .max_data_xfer_size = v[1], .pgsizes = v[2], .max_dma_maps = v[3]
        };
    }
    h->listen_fd = take_fd(h->fds, KEY_LISTEN);
    h->client_fd = take_fd(h->fds, KEY_CLIENT);
    return true;
}

void vn_borrower_handoff_clear(VnBorrowerHandoff *h)
{
    g_clear_pointer(&h->state, json_object_unref);
    g_clear_pointer(&h->fds, g_hash_table_unref);
    vn_util_close_fd(&h->listen_fd);
    vn_util_close_fd(&h->client_fd);
}
