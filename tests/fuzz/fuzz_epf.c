/*
 * libFuzzer target for the simulated NTB's model (simdev/epf.c): what two guests can do to
 * it through their NTB functions, in any order: accesses of any size and offset to the
 * control BAR, the doorbells and the window, hosts coming and going, resets.  Nothing may
 * crash or read outside what it was given, a DMA stays inside the peer's memory (the fake
 * below refuses anything else, as the DMA table does), and interrupts stay within the
 * vectors a port configured.
 *
 * Input: a sequence of 12-byte operations: op, port, size, pad, offset (u32), value (u32).
 */
#include "simdev/epf.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define MEM_SIZE 8192u

typedef struct Fake {
    uint8_t *mem[2];
} Fake;

static void fake_signal(void *opaque, unsigned port, uint32_t vector)
{
    if (port > 1 || vector >= VN_EPF_MAX_VECTORS) {
        abort();
    }
}

static int fake_read(void *opaque, unsigned port, uint64_t addr, void *buf, uint32_t len)
{
    Fake *f = opaque;

    if (port > 1 || len > VN_EPF_MAX_ACCESS) {
        abort();
    }
    if (addr > MEM_SIZE || len > MEM_SIZE - addr) {
        return -14;
    }
    memcpy(buf, f->mem[port] + addr, len);
    return 0;
}

static int fake_write(void *opaque, unsigned port, uint64_t addr, const void *buf, uint32_t len)
{
    Fake *f = opaque;

    if (port > 1 || len > VN_EPF_MAX_ACCESS) {
        abort();
    }
    if (addr > MEM_SIZE || len > MEM_SIZE - addr) {
        return -14;
    }
    memcpy(f->mem[port] + addr, buf, len);
    return 0;
}

static const VnEpfOps ops = {
    .signal = fake_signal,
    .dma_read = fake_read,
    .dma_write = fake_write,
};

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    /* Exact-size heap memory, so ASan sees any access past a host's memory. */
    Fake f = { { malloc(MEM_SIZE), malloc(MEM_SIZE) } };
    static const uint64_t sizes[2] = { 1u << 16, 1u << 16 };
    VnEpf *epf = vn_epf_new(sizes, 2, &ops, &f, NULL);

    memset(f.mem[0], 0, MEM_SIZE);
    memset(f.mem[1], 0, MEM_SIZE);
    vn_epf_set_connected(epf, 0, true);
    vn_epf_set_connected(epf, 1, true);
    for (size_t at = 0; at + 12 <= size; at += 12) {
        const uint8_t *p = data + at;
        unsigned port = p[1] & 1;
        uint32_t len = p[2] % 12, off, value;
        uint8_t buf[16];

        memcpy(&off, p + 4, 4);
        memcpy(&value, p + 8, 4);
        memset(buf, 0, sizeof(buf));
        memcpy(buf, &value, 4);
        /* Offsets near the BARs mostly, now and then anywhere. */
        if (!(p[3] & 0x80)) {
            off %= 0x12000;
        }
        switch (p[0] % 9) {
        case 0:
            (void)vn_epf_ctrl_read(epf, port, off, buf, len);
            break;
        case 1:
            (void)vn_epf_ctrl_write(epf, port, off, buf, len);
            break;
        case 2:
            (void)vn_epf_db_write(epf, port, off, buf, len);
            break;
        case 3:
            (void)vn_epf_db_read(epf, port, off, buf, len);
            break;
        case 4:
            (void)vn_epf_window_read(epf, port, (p[3] >> 1) & 3, off, buf, len);
            break;
        case 5:
            (void)vn_epf_window_write(epf, port, (p[3] >> 1) & 3, off, buf, len);
            break;
        case 6:
            vn_epf_set_connected(epf, port, p[3] & 1);
            break;
        case 7:
            vn_epf_reset(epf, port);
            break;
        default: {
            /* A whole command, as ntb_hw_epf sends one: argument, then command. */
            uint32_t arg = value, cmd = p[3] % 8;

            (void)vn_epf_ctrl_write(epf, port, VN_EPF_REG_ARGUMENT, &arg, 4);
            (void)vn_epf_ctrl_write(epf, port, VN_EPF_REG_COMMAND, &cmd, 4);
            break;
        }
        }
    }
    vn_epf_free(epf);
    free(f.mem[0]);
    free(f.mem[1]);
    return 0;
}
