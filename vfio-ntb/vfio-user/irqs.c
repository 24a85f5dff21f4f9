/*
 * Interrupt table configured by SET_IRQS (see irqs.h).
 */
#define G_LOG_DOMAIN "vfio-ntb.vfio-user"

#include "irqs.h"

#include "common/lock.h"
#include "common/peerfd.h"
#include "common/util.h"
#include "wire.h"

#include <errno.h>
#include <fcntl.h>
#include <linux/vfio.h>
#include <stdint.h>
#include <unistd.h>

/*
 * An assigned eventfd.  The table holds one reference; a signal takes
 * another under the lock and writes after dropping it, so the write (a
 * syscall) never runs under the lock, and a vector re-assigned or reset
 * meanwhile cannot close the fd (and let its number be reused) under the
 * signal: the last reference closes it.  @fd never changes.
 */
typedef struct Trigger {
    gint refs;
    int fd;
} Trigger;

typedef struct Vector {
    Trigger *trig; /* NULL: no eventfd */
    bool masked;
    bool pending;
} Vector;

/*
 * Threads: @n, @count and the @vec arrays are fixed at creation.  @lock
 * guards every Vector (trig, masked, pending); the socket thread changes
 * them (SET_IRQS, reset), a device's engine thread reads them to signal.
 * @signalled is atomic, counted after the write.
 */
struct VnIrqs {
    VnMutex lock;
    uint32_t n;
    uint32_t count[VN_MAX_IRQ_INDEXES];
    Vector *vec[VN_MAX_IRQ_INDEXES];
    uint64_t signalled;
};

static Trigger *trigger_new(int fd)
{
    Trigger *t = g_new(Trigger, 1);

    t->refs = 1;
    t->fd = fd;
    return t;
}

static void trigger_unref(Trigger *t)
{
    if (t != NULL && g_atomic_int_dec_and_test(&t->refs)) {
        vn_util_close_fd(&t->fd);
        g_free(t);
    }
}

/* Take @v's eventfd off it (the lock is held) into @dropped, whose
 * references the caller drops once the lock is released: the close(2) of
 * the last one runs outside it too, and an in-flight signal keeps the fd
 * open until it is done. */
static void vector_clear(Vector *v, GPtrArray *dropped)
{
    if (v->trig != NULL) {
        g_ptr_array_add(dropped, g_steal_pointer(&v->trig));
    }
    v->pending = false;
}

VnIrqs *vn_irqs_new(const uint32_t *counts, uint32_t n)
{
    VnIrqs *irqs = g_new0(VnIrqs, 1);

    vn_mutex_init(&irqs->lock);
    irqs->n = MIN(n, VN_MAX_IRQ_INDEXES);
    for (uint32_t i = 0; i < irqs->n; i++) {
        irqs->count[i] = MIN(counts[i], VN_MAX_IRQ_VECTORS);
        irqs->vec[i] = g_new0(Vector, irqs->count[i] ? irqs->count[i] : 1);
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
    vn_mutex_clear(&irqs->lock);
    g_free(irqs);
}

/* Decide whether @v fires (the lock is held): its eventfd with a reference
 * for the caller to write once the lock is dropped (deliver()), or NULL
 * when it has none or is masked (then it is pending). */
static Trigger *fire(Vector *v)
{
    if (v->trig == NULL) {
        return NULL;
    }
    if (v->masked) {
        v->pending = true;
        return NULL;
    }
    g_atomic_int_inc(&v->trig->refs);
    return v->trig;
}

/* Write @t's eventfd and drop the reference fire() took; the lock is NOT
 * held.  The fd is non-blocking (vn_peerfd_eventfd() at SET_IRQS): a
 * saturated counter (-EAGAIN) already holds more signals than the consumer
 * read, so this one is dropped; any other failure means the consumer is
 * gone.  The interrupt is lost either way. */
static bool deliver(VnIrqs *irqs, Trigger *t)
{
    bool ok;

    if (t == NULL) {
        return false;
    }
    ok = vn_peerfd_signal(t->fd) == 0;
    if (ok) {
        __atomic_add_fetch(&irqs->signalled, 1, __ATOMIC_RELAXED);
    }
    trigger_unref(t);
    return ok;
}

static int set_trigger(uint32_t data, Vector *vec, uint32_t count, const uint8_t *bools, int *fds,
                       unsigned nfds, GPtrArray *fired, GPtrArray *dropped)
{
    switch (data) {
    case VFIO_IRQ_SET_DATA_NONE:
        for (uint32_t i = 0; i < count; i++) {
            g_ptr_array_add(fired, fire(&vec[i]));
        }
        return 0;
    case VFIO_IRQ_SET_DATA_BOOL:
        for (uint32_t i = 0; i < count; i++) {
            if (bools[i]) {
                g_ptr_array_add(fired, fire(&vec[i]));
            }
        }
        return 0;
    default: /* DATA_EVENTFD: assign, or de-assign without fds */
        for (uint32_t i = 0; i < count; i++) {
            vector_clear(&vec[i], dropped);
            if (nfds != 0) {
                vec[i].trig = trigger_new(fds[i]);
                fds[i] = -1;
            }
        }
        return 0;
    }
}

static int set_mask(uint32_t data, bool mask, Vector *vec, uint32_t count, const uint8_t *bools,
                    GPtrArray *fired)
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
            g_ptr_array_add(fired, fire(&vec[i]));
        }
    }
    return 0;
}

int vn_irqs_set(VnIrqs *irqs, uint32_t flags, uint32_t index, uint32_t start, uint32_t count,
                const uint8_t *bools, int *fds, unsigned nfds)
{
    uint32_t data = flags & VFIO_IRQ_SET_DATA_TYPE_MASK;
    uint32_t action = flags & VFIO_IRQ_SET_ACTION_TYPE_MASK;
    g_autoptr(GPtrArray) fired = NULL;
    g_autoptr(GPtrArray) dropped = NULL;
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

    fired = g_ptr_array_new();
    dropped = g_ptr_array_new_with_free_func((GDestroyNotify)trigger_unref);
    vn_mutex_lock(&irqs->lock);
    if (count == 0) {
        /* linux/vfio.h: DATA_NONE|ACTION_TRIGGER with count 0 disables
         * the index; nothing else is meaningful without vectors. */
        if (data == VFIO_IRQ_SET_DATA_NONE && action == VFIO_IRQ_SET_ACTION_TRIGGER) {
            for (uint32_t v = 0; v < irqs->count[index]; v++) {
                vector_clear(&irqs->vec[index][v], dropped);
                irqs->vec[index][v].masked = false;
            }
            ret = 0;
        } else {
            ret = -EINVAL;
        }
    } else if (action == VFIO_IRQ_SET_ACTION_TRIGGER) {
        ret = set_trigger(data, &irqs->vec[index][start], count, bools, fds, nfds, fired, dropped);
    } else {
        ret = set_mask(data, action == VFIO_IRQ_SET_ACTION_MASK, &irqs->vec[index][start], count,
                       bools, fired);
    }
    vn_mutex_unlock(&irqs->lock);
    for (guint i = 0; i < fired->len; i++) {
        deliver(irqs, fired->pdata[i]);
    }
    return ret;
}

bool vn_irqs_signal(VnIrqs *irqs, uint32_t index, uint32_t vector)
{
    Trigger *t;

    if (index >= irqs->n || vector >= irqs->count[index]) {
        return false;
    }
    vn_mutex_lock(&irqs->lock);
    t = fire(&irqs->vec[index][vector]);
    vn_mutex_unlock(&irqs->lock);
    return deliver(irqs, t);
}

bool vn_irqs_enabled(VnIrqs *irqs, uint32_t index, uint32_t vector)
{
    bool ret;

    if (index >= irqs->n || vector >= irqs->count[index]) {
        return false;
    }
    vn_mutex_lock(&irqs->lock);
    ret = irqs->vec[index][vector].trig != NULL;
    vn_mutex_unlock(&irqs->lock);
    return ret;
}

int vn_irqs_fd_dup(VnIrqs *irqs, uint32_t index, uint32_t vector)
{
    int fd = -1;

    if (index >= irqs->n || vector >= irqs->count[index]) {
        return -1;
    }
    vn_mutex_lock(&irqs->lock);
    if (irqs->vec[index][vector].trig != NULL) {
        fd = fcntl(irqs->vec[index][vector].trig->fd, F_DUPFD_CLOEXEC, 0);
    }
    vn_mutex_unlock(&irqs->lock);
    return fd;
}

uint32_t vn_irqs_armed(VnIrqs *irqs)
{
    uint32_t n = 0;

    vn_mutex_lock(&irqs->lock);
    for (uint32_t i = 0; i < irqs->n; i++) {
        for (uint32_t v = 0; v < irqs->count[i]; v++) {
            n += irqs->vec[i][v].trig != NULL;
        }
    }
    vn_mutex_unlock(&irqs->lock);
    return n;
}

void vn_irqs_reset(VnIrqs *irqs)
{
    g_autoptr(GPtrArray) dropped = g_ptr_array_new_with_free_func((GDestroyNotify)trigger_unref);

    vn_mutex_lock(&irqs->lock);
    for (uint32_t i = 0; i < irqs->n; i++) {
        for (uint32_t v = 0; v < irqs->count[i]; v++) {
            vector_clear(&irqs->vec[i][v], dropped);
            irqs->vec[i][v].masked = false;
        }
    }
    vn_mutex_unlock(&irqs->lock);
}

uint64_t vn_irqs_signalled(VnIrqs *irqs)
{
    return __atomic_load_n(&irqs->signalled, __ATOMIC_RELAXED);
}
