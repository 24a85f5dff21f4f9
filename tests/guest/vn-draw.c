/*
 * vn-draw: draw a known picture on a display through its DRM driver, as a compositor would.
 *
 * Runs in the test guest (static, no libdrm: the kernel's DRM uAPI only).  It takes the first
 * connected connector, sets its preferred mode on a CRTC it can drive with a dumb buffer
 * (XRGB8888), fills that buffer with four horizontal bands (red, green, blue, white, top to
 * bottom; the last band takes the rows height/4 leaves over), prints
 *
 *     w=WIDTH h=HEIGHT driver=NAME
 *
 * on stdout and holds the picture (stays DRM master) for the seconds its argument says, so the
 * host can compare what the device shows with it.  Exit 0 when the mode was set, else 1 with
 * the reason on stderr.
 *
 * Why not fbdev: Debian's 6.1 kernel defers fbcon's takeover, so /dev/fb0 may exist with no
 * mode ever committed; a write there then reaches a buffer nothing scans out.  SETCRTC commits
 * the mode, which is what makes the driver program the device (bochs: the dispi registers).
 *
 * Usage: vn-draw [HOLD_SECONDS] [CARD]   (defaults: 30, /dev/dri/card0)
 */
#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <drm.h>
#include <drm_mode.h>

/* Bounds on what the driver reports (a display device has a handful of each). */
#define MAX_IDS 32
#define MAX_MODES 256

static const uint32_t BANDS[4] = { 0x00ff0000, 0x0000ff00, 0x000000ff, 0x00ffffff };

static int fail(const char *what)
{
    fprintf(stderr, "vn-draw: %s: %s\n", what, strerror(errno));
    return 1;
}

static int drm_ioctl(int fd, unsigned long req, void *arg)
{
    int r;

    do {
        r = ioctl(fd, req, arg);
    } while (r < 0 && (errno == EINTR || errno == EAGAIN));
    return r;
}

/* The connector's modes; the preferred one (or the first) in *mode.  0, or -1. */
static int connector_mode(int fd, uint32_t id, struct drm_mode_get_connector *conn,
                          struct drm_mode_modeinfo *mode, uint32_t *encoders)
{
    static struct drm_mode_modeinfo modes[MAX_MODES];

    memset(conn, 0, sizeof(*conn));
    conn->connector_id = id;
    if (drm_ioctl(fd, DRM_IOCTL_MODE_GETCONNECTOR, conn) < 0) {
        return -1;
    }
    if (conn->connection != 1 || conn->count_modes == 0) { /* 1: connected */
        return -1;
    }
    if (conn->count_modes > MAX_MODES) {
        conn->count_modes = MAX_MODES;
    }
    if (conn->count_encoders > MAX_IDS) {
        conn->count_encoders = MAX_IDS;
    }
    conn->count_props = 0;
    conn->modes_ptr = (uintptr_t)modes;
    conn->encoders_ptr = (uintptr_t)encoders;
    if (drm_ioctl(fd, DRM_IOCTL_MODE_GETCONNECTOR, conn) < 0 || conn->count_modes == 0) {
        return -1;
    }
    *mode = modes[0];
    for (uint32_t i = 0; i < conn->count_modes && i < MAX_MODES; i++) {
        if (modes[i].type & DRM_MODE_TYPE_PREFERRED) {
            *mode = modes[i];
            break;
        }
    }
    return 0;
}

/* A CRTC the connector's encoders can drive: index into crtcs, or -1. */
static int pick_crtc(int fd, const struct drm_mode_get_connector *conn, const uint32_t *encoders,
                     uint32_t ncrtcs)
{
    for (uint32_t i = 0; i < conn->count_encoders && i < MAX_IDS; i++) {
        struct drm_mode_get_encoder enc = { .encoder_id = encoders[i] };

        if (drm_ioctl(fd, DRM_IOCTL_MODE_GETENCODER, &enc) < 0) {
            continue;
        }
        for (uint32_t c = 0; c < ncrtcs && c < MAX_IDS; c++) {
            if (enc.possible_crtcs & (1u << c)) {
                return (int)c;
            }
        }
    }
    return -1;
}

static void fill_bands(uint8_t *fb, uint32_t w, uint32_t h, uint32_t pitch)
{
    uint32_t band = h / 4 ? h / 4 : 1;

    for (uint32_t y = 0; y < h; y++) {
        uint32_t *row = (uint32_t *)(fb + (size_t)y * pitch);
        uint32_t px = BANDS[y / band < 4 ? y / band : 3];

        for (uint32_t x = 0; x < w; x++) {
            row[x] = px;
        }
    }
}

int main(int argc, char **argv)
{
    unsigned hold = argc > 1 ? (unsigned)strtoul(argv[1], NULL, 10) : 30;
    const char *card = argc > 2 ? argv[2] : "/dev/dri/card0";
    uint32_t connectors[MAX_IDS], crtcs[MAX_IDS], encoders[MAX_IDS];
    char driver[64] = "";
    struct drm_version ver = { .name = driver, .name_len = sizeof(driver) - 1 };
    struct drm_mode_card_res res = { 0 };
    struct drm_mode_get_connector conn;
    struct drm_mode_modeinfo mode;
    int fd, crtc = -1;

    fd = open(card, O_RDWR | O_CLOEXEC);
    if (fd < 0) {
        return fail(card);
    }
    if (drm_ioctl(fd, DRM_IOCTL_VERSION, &ver) < 0) {
        return fail("DRM_IOCTL_VERSION");
    }
    if (drm_ioctl(fd, DRM_IOCTL_MODE_GETRESOURCES, &res) < 0) {
        return fail("GETRESOURCES");
    }
    if (res.count_connectors > MAX_IDS || res.count_crtcs > MAX_IDS) {
        fprintf(stderr, "vn-draw: %u connectors, %u crtcs: more than %d\n", res.count_connectors,
                res.count_crtcs, MAX_IDS);
        return 1;
    }
    res.count_fbs = res.count_encoders = 0;
    res.connector_id_ptr = (uintptr_t)connectors;
    res.crtc_id_ptr = (uintptr_t)crtcs;
    if (drm_ioctl(fd, DRM_IOCTL_MODE_GETRESOURCES, &res) < 0) {
        return fail("GETRESOURCES");
    }
    for (uint32_t i = 0; i < res.count_connectors && i < MAX_IDS && crtc < 0; i++) {
        if (connector_mode(fd, connectors[i], &conn, &mode, encoders) == 0) {
            crtc = pick_crtc(fd, &conn, encoders, res.count_crtcs);
        }
    }
    if (crtc < 0) {
        fprintf(stderr, "vn-draw: %s: no connected connector with a mode and a CRTC\n", card);
        return 1;
    }

    struct drm_mode_create_dumb dumb = { .width = mode.hdisplay,
                                         .height = mode.vdisplay,
                                         .bpp = 32 };
    if (drm_ioctl(fd, DRM_IOCTL_MODE_CREATE_DUMB, &dumb) < 0) {
        return fail("CREATE_DUMB");
    }
    struct drm_mode_fb_cmd fb = { .width = mode.hdisplay,
                                  .height = mode.vdisplay,
                                  .pitch = dumb.pitch,
                                  .bpp = 32,
                                  .depth = 24,
                                  .handle = dumb.handle };
    if (drm_ioctl(fd, DRM_IOCTL_MODE_ADDFB, &fb) < 0) {
        return fail("ADDFB");
    }
    /* Scan it out first: the driver then places the buffer in the device's memory, so the
     * bands below are written straight into it. */
    struct drm_mode_crtc set = { .crtc_id = crtcs[crtc],
                                 .fb_id = fb.fb_id,
                                 .set_connectors_ptr = (uintptr_t)&conn.connector_id,
                                 .count_connectors = 1,
                                 .mode = mode,
                                 .mode_valid = 1 };
    if (drm_ioctl(fd, DRM_IOCTL_MODE_SETCRTC, &set) < 0) {
        return fail("SETCRTC");
    }
    struct drm_mode_map_dumb map = { .handle = dumb.handle };
    if (drm_ioctl(fd, DRM_IOCTL_MODE_MAP_DUMB, &map) < 0) {
        return fail("MAP_DUMB");
    }
    uint8_t *pixels =
        mmap(NULL, dumb.size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, (off_t)map.offset);
    if (pixels == MAP_FAILED) {
        return fail("mmap");
    }
    fill_bands(pixels, mode.hdisplay, mode.vdisplay, dumb.pitch);
    /* Drivers that track damage want to be told; the others answer ENOSYS. */
    struct drm_mode_fb_dirty_cmd dirty = { .fb_id = fb.fb_id };
    (void)drm_ioctl(fd, DRM_IOCTL_MODE_DIRTYFB, &dirty);

    printf("w=%u h=%u driver=%s\n", mode.hdisplay, mode.vdisplay, driver);
    fflush(stdout);
    sleep(hold);
    return 0;
}
