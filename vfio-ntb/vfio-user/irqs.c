/*
 * Interrupt table configured by SET_IRQS (see irqs.h).
 */
#define G_LOG_DOMAIN "vfio-ntb.vfio-user"

#include "irqs.h"

#include "common/util.h"
#include "wire.h"

#include <errno.h>
#include <linux/vfio.h>
#include <stdint.h>
#include <unistd.h>

typedef struct Vector {
    int fd;
    bool masked;
    bool pending;
} Vector;

struct VnIrqs {
    GMutex lock;
    uint32_t n;
    uint32_t count[VN_MAX_IRQ_INDEXES];
    Vector *vec[VN_MAX_IRQ_INDEXES];
    uint64_t signalled;
};

VnIrqs *vn_irqs_new(const uint32_t *counts, uint32_t n)
{
    VnIrqs *irqs = g_new0(VnIrqs, 1);

    g_mutex_init(&irqs->lock);
    irqs->n = MIN(n, VN_MAX_IRQ_INDEXES);
    for (uint32_t i = 0; i < irqs->n; i++) {
        irqs->count[i] = MIN(counts[i], VN_MAX_IRQ_VECTORS);
        irqs->vec[i] = g_new0(Vector, irqs->count[i] ? irqs->count[i] : 1);
        for (uint32_t v = 0; v < irqs->count[i]; v++) {
            irqs->vec[i][v].fd = -1;
        }
    }
    return irqs;
}

void vn_irqs_free(VnIrqs *irqs)
{
    if (irqs == NULL) {
        return;
    }
    vn_irqs_reset(irqs);
    for (uint32_t i = 0; i < irqs->n; i++) {
        g_free(irqs->vec[i]);
    }
    g_mutex_clear(&irqs->lock);
    g_free(irqs);
}

/* Write the eventfd of @v; the lock is held. */
static bool fire(VnIrqs *irqs, Vector *v)
{
    uint64_t one = 1;

    if (v->fd < 0) {
        return false;
    }
    if (v->masked) {
        v->pending = true;
        return false;
    }
    /* An eventfd write only fails when the counter would overflow, which
     * means the consumer is gone; the interrupt is lost either way. */
    if (write(v->fd, &one, sizeof(one)) != sizeof(one)) {
        return false;
    }
    irqs->signalled++;
    return true;
}

static int set_trigger(VnIrqs *irqs, uint32_t data, Vector *vec, uint32_t count,
                       const uint8_t *bools, int *fds, unsigned nfds)
{
    switch (data) {
    case VFIO_IRQ_SET_DATA_NONE:
        for (uint32_t i = 0; i < count; i++) {
            fire(irqs, &vec[i]);
        }
        return 0;
    case VFIO_IRQ_SET_DATA_BOOL:
        for (uint32_t i = 0; i < count; i++) {
            if (bools[i]) {
                fire(irqs, &vec[i]);
            }
        }
        return 0;
    default: /* DATA_EVENTFD: assign, or de-assign without fds */
        for (uint32_t i = 0; i < count; i++) {
            vn_util_close_fd(&vec[i].fd);
            vec[i].pending = false;
            if (nfds != 0) {
                vec[i].fd = fds[i];
                fds[i] = -1;
            }
        }
        return 0;
    }
}

static int set_mask(VnIrqs *irqs, uint32_t data, bool mask, Vector *vec,
                    uint32_t count, const uint8_t *bools)
{
    if (data == VFIO_IRQ_SET_DATA_EVENTFD) {
        /* linux/vfio.h allows an unmask eventfd for INTx resampling; a
         * vfio-user device has no level-triggered line to resample. */
        return -ENOTSUP;
    }
    for (uint32_t i = 0; i < count; i++) {
        if (data == VFIO_IRQ_SET_DATA_BOOL && !bools[i]) {
            continue;
        }
        vec[i].masked = mask;
        if (!mask && vec[i].pending) {
            vec[i].pending = false;
            fire(irqs, &vec[i]);
        }
    }
    return 0;
}

int vn_irqs_set(VnIrqs *irqs, uint32_t flags, uint32_t index, uint32_t start,
                uint32_t count, const uint8_t *bools, int *fds, unsigned nfds)
{
    uint32_t data = flags & VFIO_IRQ_SET_DATA_TYPE_MASK;
    uint32_t action = flags & VFIO_IRQ_SET_ACTION_TYPE_MASK;
    int ret;

    if (index >= irqs->n) {
        return -EINVAL;
    }
    if ((uint64_t)start + count > irqs->count[index]) {
        return -EINVAL;
    }
    if (data == VFIO_IRQ_SET_DATA_EVENTFD && nfds != 0 && nfds != count) {
        return -EINVAL;
    }

    g_mutex_lock(&irqs->lock);
    if (count == 0) {
        /* linux/vfio.h: DATA_NONE|ACTION_TRIGGER with count 0 disables
         * the index; nothing else is meaningful without vectors. */
        if (data == VFIO_IRQ_SET_DATA_NONE && action == VFIO_IRQ_SET_ACTION_TRIGGER) {
            for (uint32_t v = 0; v < irqs->count[index]; v++) {
                vn_util_close_fd(&irqs->vec[index][v].fd);
                irqs->vec[index][v].pending = false;
                irqs->vec[index][v].masked = false;
            }
            ret = 0;
        } else {
            ret = -EINVAL;
        }
    } else if (action == VFIO_IRQ_SET_ACTION_TRIGGER) {
        ret = set_trigger(irqs, data, &irqs->vec[index][start], count, bools, fds, nfds);
    } else {
        ret = set_mask(irqs, data, action == VFIO_IRQ_SET_ACTION_MASK,
                       &irqs->vec[index][start], count, bools);
    }
    g_mutex_unlock(&irqs->lock);
    return ret;
}

bool vn_irqs_signal(VnIrqs *irqs, uint32_t index, uint32_t vector)
{
    bool ret = false;

    if (index >= irqs->n || vector >= irqs->count[index]) {
        return false;
    }
    g_mutex_lock(&irqs->lock);
    ret = fire(irqs, &irqs->vec[index][vector]);
    g_mutex_unlock(&irqs->lock);
    return ret;
}

bool vn_irqs_enabled(VnIrqs *irqs, uint32_t index, uint32_t vector)
{
    bool ret;

    if (index >= irqs->n || vector >= irqs->count[index]) {
        return false;
    }
    g_mutex_lock(&irqs->lock);
    ret = irqs->vec[index][vector].fd >= 0;
    g_mutex_unlock(&irqs->lock);
    return ret;
}

void vn_irqs_reset(VnIrqs *irqs)
{
    g_mutex_lock(&irqs->lock);
    for (uint32_t i = 0; i < irqs->n; i++) {
        for (uint32_t v = 0; v < irqs->count[i]; v++) {
            vn_util_close_fd(&irqs->vec[i][v].fd);
            irqs->vec[i][v].masked = false;
            irqs->vec[i][v].pending = false;
        }
    }
    g_mutex_unlock(&irqs->lock);
}

uint64_t vn_irqs_signalled(VnIrqs *irqs)
{
    uint64_t n;

    g_mutex_lock(&irqs->lock);
    n = irqs->signalled;
    g_mutex_unlock(&irqs->lock);
    return n;
}
