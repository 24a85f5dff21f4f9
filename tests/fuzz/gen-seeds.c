/*
 * Writes the fuzz targets' seeds (tests/fuzz/seeds/NAME/) with our own
 * encoders, so each seed is a valid input the target must take.  Run by
 * `make fuzz-seeds`; the output is committed.  The wire seeds predate it.
 */
#include "common/util.h"
#include "fabric/frame.h"
#include "fabric/ntb.h"
#include "fabric/shm.h"
#include "daemon/peers.h"
#include "lending/proto.h"
#include "libvirt/domxml.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *top;

static void put(const char *target, const char *name, const void *prefix, size_t plen,
                const void *data, size_t len)
{
    g_autofree char *dir = g_build_filename(top, target, NULL);
    g_autofree char *path = g_build_filename(dir, name, NULL);
    g_autoptr(GByteArray) b = g_byte_array_new();
    g_autoptr(GError) error = NULL;

    g_byte_array_append(b, prefix, (guint)plen);
    g_byte_array_append(b, data, (guint)len);
    if (g_mkdir_with_parents(dir, 0755) < 0 ||
        !g_file_set_contents(path, (const char *)b->data, b->len, &error)) {
        g_printerr("%s: %s\n", path, error ? error->message : g_strerror(errno));
        exit(1);
    }
}

/* A frame as the fabric sends it, newly allocated. */
static GByteArray *frame(uint16_t flags, uint32_t type, uint64_t id, int32_t err, const char *json,
                         const void *data, size_t len)
{
    GByteArray *f = g_byte_array_new();

    if (vn_fabric_frame_encode(f, flags, type, id, err, json, data, len) < 0) {
        abort();
    }
    return f;
}

static void frames(GPtrArray *all)
{
    VnProtoAttach a = { .device = "nvme0", .irq_mode = VN_IRQ_MODE_RELAY };
    g_autofree char *attach = vn_proto_attach_to_json(&a);
    uint32_t bit = 3;
    uint8_t bytes[8] = { 1, 2, 3, 4, 5, 6, 7, 8 };

    g_ptr_array_add(all, frame(VN_FABRIC_FLAG_REQUEST, VN_PROTO_ATTACH, 1, 0, attach, NULL, 0));
    g_ptr_array_add(
        all, frame(VN_FABRIC_FLAG_REPLY, VN_PROTO_REGION_RW, 2, 0, "{}", bytes, sizeof(bytes)));
    g_ptr_array_add(all, frame(VN_FABRIC_FLAG_REPLY | VN_FABRIC_FLAG_ERROR, VN_PROTO_DMA_MAP, 3,
                               EINVAL, NULL, NULL, 0));
    g_ptr_array_add(
        all, frame(VN_FABRIC_FLAG_EVENT, VN_FABRIC_TYPE_DOORBELL, 0, 0, NULL, &bit, sizeof(bit)));
}

static void record(GByteArray *out, const void *buf, size_t len)
{
    uint32_t prefix = GUINT32_TO_LE((uint32_t)len);

    g_byte_array_append(out, (const guint8 *)&prefix, sizeof(prefix));
    g_byte_array_append(out, buf, (guint)len);
}

static void gen_frame_shm(void)
{
    g_autoptr(GPtrArray) all = g_ptr_array_new_with_free_func((GDestroyNotify)g_byte_array_unref);
    VnShmHello h = { .magic = VN_SHM_HELLO_MAGIC, .version = VN_SHM_HELLO_VERSION };
    VnShmFetch fetch = {
        .hello = { .magic = VN_SHM_FETCH_MAGIC, .version = VN_SHM_HELLO_VERSION },
        .kind = VN_SHM_FETCH_SEGMENT,
        .id = 3,
    };
    VnShmFetchReply answer = { .magic = VN_SHM_FETCH_MAGIC, .size = 1 << 20 };
    g_autoptr(GByteArray) stream = g_byte_array_new();
    g_autoptr(GByteArray) with_fd = g_byte_array_new();
    g_autoptr(GByteArray) asked = g_byte_array_new();
    g_autoptr(GByteArray) answered = g_byte_array_new();
    const uint8_t all_at_once[4] = { 0, 0, 0, 0 }, in_records[4] = { 1, sizeof(h) + 4, 0x02, 0 };
    const uint8_t trickle[4] = { 0, 5, 0, 0 }, an_answer[4] = { 1, 0, 0x01, 1 };

    frames(all);
    for (guint i = 0; i < all->len; i++) {
        GByteArray *f = all->pdata[i];
        const VnFabricFrameHdr *hdr = (const VnFabricFrameHdr *)f->data;
        g_autofree char *name = g_strdup_printf("%s-%s", vn_fabric_kind_to_string(hdr->flags),
                                                hdr->type < VN_FABRIC_TYPE_RESERVED
                                                    ? vn_proto_type_to_string(hdr->type)
                                                    : vn_fabric_type_to_string(hdr->type));

        VnFabricFrame check;

        if (vn_fabric_frame_decode(f->data, f->len, &check) < 0) {
            abort();
        }
        put("frame", name, NULL, 0, f->data, f->len);
    }
    /* shm: a HELLO, then every frame; a HELLO and a frame that brings an
     * fd (refused), sent as a chunk of its own; a FETCH; an answer. */
    g_strlcpy(h.node, "hostb", sizeof(h.node));
    g_strlcpy(fetch.hello.node, "hostb", sizeof(fetch.hello.node));
    record(stream, &h, sizeof(h));
    record(with_fd, &h, sizeof(h));
    for (guint i = 0; i < all->len; i++) {
        GByteArray *f = all->pdata[i];

        record(stream, f->data, f->len);
        if (i == 0) {
            record(with_fd, f->data, f->len);
        }
    }
    record(asked, &fetch, sizeof(fetch));
    record(answered, &answer, sizeof(answer));
    put("shm", "hello-frames", all_at_once, 4, stream->data, stream->len);
    put("shm", "hello-frames-trickle", trickle, 4, stream->data, stream->len);
    put("shm", "hello-frame-fd", in_records, 4, with_fd->data, with_fd->len);
    put("shm", "hello-only", all_at_once, 4, stream->data, sizeof(h) + 4);
    put("shm", "fetch", all_at_once, 4, asked->data, asked->len);
    put("shm", "fetch-answer", an_answer, 4, answered->data, answered->len);
}

/* Takes @json. */
static void proto(uint8_t pick, const char *name, char *json)
{
    put("proto", name, &pick, 1, json, strlen(json));
    g_free(json);
}

static void gen_proto(void)
{
    VnProtoDevice d = { .flags = 3, .num_regions = 2, .num_irqs = 2 };
    VnProtoAttach a = { .device = "nvme0", .irq_mode = VN_IRQ_MODE_FD };
    VnProtoRegionRw rw = { .region = 0, .offset = 0x1000, .count = 4, .write = true };
    VnProtoDmaMap m = { .iova = 0x100000, .size = 0x200000, .segment = 9, .prot = 3 };
    VnProtoDmaUnmap u = { .iova = 0x100000, .size = 0x200000 };
    VnProtoSetIrqs s = { .flags = 0x24, .index = 2, .start = 0, .count = 4 };

    d.regions[0] = (VnProtoRegion){
        .size = 0x4000, .flags = 7, .nr_segments = 1, .segments = { 5 }, .nr_sparse = 1
    };
    d.regions[0].sparse[0].offset = 0x2000;
    d.regions[0].sparse[0].size = 0x2000;
    d.regions[1] = (VnProtoRegion){ .size = 256, .flags = 3 };
    d.irq_count[0] = 1;
    d.irq_flags[0] = 0xb;
    d.irq_count[1] = 32;
    d.irq_flags[1] = 0x9;
    /* The first byte picks the decoder, in fuzz_proto.c's order. */
    proto(0, "device", vn_proto_device_to_json(&d));
    proto(1, "reset", vn_proto_device_only_to_json("nvme0"));
    proto(2, "attach", vn_proto_attach_to_json(&a));
    proto(3, "region_rw", vn_proto_region_rw_to_json("nvme0", &rw));
    proto(4, "dma_map", vn_proto_dma_map_to_json("nvme0", &m));
    proto(5, "dma_unmap", vn_proto_dma_unmap_to_json("nvme0", &u));
    proto(6, "set_irqs", vn_proto_set_irqs_to_json("nvme0", &s));
}

/* Takes @json. */
static void peers(uint8_t pick, const char *name, char *json)
{
    put("peers", name, &pick, 1, json, strlen(json));
    g_free(json);
}

static void gen_peers(void)
{
    g_autofree VnPeersAnnounce *a = g_new0(VnPeersAnnounce, 1);
    VnPeersRequest r = { .lease = 42, .grace_ms = 5000 };

    g_strlcpy(a->node, "hosta", sizeof(a->node));
    a->n_devices = 2;
    g_strlcpy(a->devices[0].name, "nvme0", sizeof(a->devices[0].name));
    a->devices[0].lent = true;
    g_strlcpy(a->devices[0].borrower, "hostb", sizeof(a->devices[0].borrower));
    a->devices[0].lease = 7;
    g_strlcpy(a->devices[1].name, "gpu0", sizeof(a->devices[1].name));
    a->n_holds = 1;
    g_strlcpy(a->holds[0].lender, "hostc", sizeof(a->holds[0].lender));
    g_strlcpy(a->holds[0].name, "nic0", sizeof(a->holds[0].name));
    a->holds[0].lease = 12;
    g_strlcpy(r.device, "nvme0", sizeof(r.device));
    /* The first byte picks the decoder, in fuzz_peers.c's order. */
    peers(0, "announce", vn_peers_announce_to_json(a));
    peers(1, "borrow", vn_peers_request_to_json(VN_PEERS_BORROW, &r));
    peers(2, "return", vn_peers_request_to_json(VN_PEERS_RETURN, &r));
    peers(3, "revoke", vn_peers_request_to_json(VN_PEERS_REVOKE, &r));
}

/* A control request line as ntbctl sends it ({"execute", "arguments", "id"}). */
static void request(GString *out, const char *cmd, const char *arg, const char *value, int id)
{
    g_autoptr(JsonBuilder) b = json_builder_new();
    g_autoptr(JsonNode) root = NULL;
    g_autofree char *text = NULL;

    json_builder_begin_object(b);
    json_builder_set_member_name(b, "execute");
    json_builder_add_string_value(b, cmd);
    if (arg != NULL) {
        json_builder_set_member_name(b, "arguments");
        json_builder_begin_object(b);
        json_builder_set_member_name(b, arg);
        json_builder_add_string_value(b, value);
        json_builder_end_object(b);
    }
    json_builder_set_member_name(b, "id");
    json_builder_add_int_value(b, id);
    json_builder_end_object(b);
    root = json_builder_get_root(b);
    text = json_to_string(root, FALSE);
    g_string_append_printf(out, "%s\n", text);
}

static void gen_control(void)
{
    /* The first byte picks the chunk size; the commands are fuzz_control.c's fakes. */
    g_autoptr(GString) s = g_string_new("\x1f");
    g_autoptr(GString) t = g_string_new(NULL);

    request(s, "subscribe-events", NULL, NULL, 1);
    request(s, "query-status", NULL, NULL, 2);
    request(s, "echo", "device", "hosta/nvme0", 3);
    request(s, "fail", "desc", "no such lease", 4);
    request(s, "defer", "value", "later", 5);
    put("control", "session", NULL, 0, s->str, s->len);
    g_string_append_c(t, 0);
    for (int i = 0; i < 18; i++) {
        request(t, "defer", NULL, NULL, i);
    }
    put("control", "defer-many", NULL, 0, t->str, t->len);
}

static void gen_qmp(void)
{
    /* QEMU's side: greeting, qmp_capabilities' return, an event, device_del's return. */
    static const char session[] =
        "{\"QMP\": {\"version\": {\"qemu\": {\"micro\": 3, \"minor\": 1, \"major\": 11}, "
        "\"package\": \"Debian 1:11.1.3+ds-1\"}, \"capabilities\": [\"oob\"]}}\r\n"
        "{\"return\": {}}\r\n"
        "{\"timestamp\": {\"seconds\": 1764000000, \"microseconds\": 5}, \"event\": "
        "\"DEVICE_DELETED\", \"data\": {\"path\": \"/machine/peripheral/ntb1/virtio-backend\"}}\r\n"
        "{\"return\": {}}\r\n";
    static const char refused[] =
        "{\"QMP\": {\"version\": {}, \"capabilities\": []}}\r\n{\"return\": {}}\r\n"
        "{\"error\": {\"class\": \"DeviceNotFound\", \"desc\": \"Device 'ntb0' not found\"}}\r\n";

    put("qmp", "session", NULL, 0, session, strlen(session));
    put("qmp", "refused", NULL, 0, refused, strlen(refused));
}

static void gen_domxml(void)
{
    g_autofree char *snip =
        vn_domxml_snippets("hosta/nvme0", "ntb0", "/run/vfio-ntb/hosta-nvme0.sock", "pci.1");
    g_autofree char *xml = g_strdup_printf(
        "<domain type='qemu' xmlns:qemu='" VN_DOMXML_QEMU_NS "'>\n  <name>vm1</name>\n"
        "  <memory unit='KiB'>1048576</memory>\n%s\n  <devices><emulator>/usr/bin/qemu"
        "</emulator><controller type='pci' model='pcie-root-port'/></devices>\n</domain>\n",
        snip);
    static const char plain[] =
        "<domain type='kvm'><name>vm2</name><memory>524288</memory><devices/></domain>\n";

    g_autoptr(VnDomain) dom = vn_domxml_parse(xml, strlen(xml), NULL);

    if (dom == NULL || dom->devices->len != 1) {
        g_printerr("domxml seed refused:\n%s", xml);
        exit(1);
    }
    put("domxml", "borrower", NULL, 0, xml, strlen(xml));
    put("domxml", "no-devices", NULL, 0, plain, strlen(plain));
}

/* One record of the ntb backend's ring (fabric/ntb.h), padded. */
static void ntb_record(GByteArray *out, uint16_t kind, uint16_t flags, const void *buf,
                       uint32_t len)
{
    VnNtbRec rec = { .len = len, .kind = kind, .flags = flags };
    static const uint8_t zeros[8];

    g_byte_array_append(out, (const guint8 *)&rec, sizeof(rec));
    g_byte_array_append(out, buf, len);
    g_byte_array_append(out, zeros, (-len) & 7);
}

static void put_ntb(const char *name, GByteArray *ring)
{
    uint32_t claimed = ring->len;

    put("ntb", name, &claimed, sizeof(claimed), ring->data, ring->len);
}

/* ntb: a HELLO, every frame, a map of b's segment, an answer to a map b
 * never asked for, an unmap; and a frame in two pieces. */
static void gen_ntb(void)
{
    g_autoptr(GPtrArray) all = g_ptr_array_new_with_free_func((GDestroyNotify)g_byte_array_unref);
    g_autoptr(GByteArray) ring = g_byte_array_new();
    g_autoptr(GByteArray) pieces = g_byte_array_new();
    VnNtbHello hello = { .version = VN_NTB_VERSION, .node = "a" };
    VnNtbMap map = { .seq = 1, .id = 1 }, unmap = { .seq = 1, .id = 1 };
    VnNtbMapped mapped = { .seq = 9, .window = 1, .size = 4096 };
    GByteArray *f;

    frames(all);
    ntb_record(ring, VN_NTB_REC_HELLO, 0, &hello, sizeof(hello));
    for (guint i = 0; i < all->len; i++) {
        f = all->pdata[i];
        ntb_record(ring, VN_NTB_REC_FRAME, 0, f->data, f->len);
    }
    ntb_record(ring, VN_NTB_REC_MAP, 0, &map, sizeof(map));
    ntb_record(ring, VN_NTB_REC_MAPPED, 0, &mapped, sizeof(mapped));
    ntb_record(ring, VN_NTB_REC_UNMAP, 0, &unmap, sizeof(unmap));
    put_ntb("hello-frames-maps", ring);
    f = all->pdata[0];
    ntb_record(pieces, VN_NTB_REC_FRAME, VN_NTB_REC_MORE, f->data, 8);
    ntb_record(pieces, VN_NTB_REC_FRAME, 0, f->data + 8, f->len - 8);
    put_ntb("fragments", pieces);
}

int main(int argc, char **argv)
{
    top = argc > 1 ? argv[1] : "tests/fuzz/seeds";
    gen_frame_shm();
    gen_ntb();
    gen_proto();
    gen_peers();
    gen_control();
    gen_qmp();
    gen_domxml();
    return 0;
}
