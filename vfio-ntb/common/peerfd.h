/*
 * File descriptors that peers hand us (QEMU, a device server, another node
 * of the fabric): what each kind must be before we write to it or map it.
 *
 * Every check is made once, where the fd is received (SET_IRQS, DMA_MAP, a
 * window map, a segment export), never per interrupt or per access; the
 * receiver refuses the message with -EINVAL (or a GError) naming the fault.
 *
 * - Interrupt fds must be eventfds: anything else (a pipe, a socket, a FIFO)
 *   could block the thread that signals it, and with it the device.  The
 *   check makes the fd O_NONBLOCK, so a signal never waits even when the
 *   peer saturated the counter itself.  This changes the peer's open file
 *   description too; QEMU creates its eventfds non-blocking already.
 * - Memory fds must be memfds sealed against shrinking (F_SEAL_SHRINK) whose
 *   size covers what is mapped: a file that shrinks under a mapping turns
 *   every access past its new end into a SIGBUS in whoever touches it (the
 *   device engine, a window's user).  A plain or /dev/shm file (QEMU's
 *   memory-backend-file) is refused for that reason even when its size is
 *   right today: nothing stops its owner truncating it tomorrow.  QEMU's
 *   memory-backend-memfd seals (seal=on) by default; our own exporters make
 *   their memfds with vn_peerfd_memfd_new().
 *
 * Threads: none of it keeps state; callable from any thread.
 */
#ifndef VN_PEERFD_H
#define VN_PEERFD_H

#include <stdbool.h>
#include <stdint.h>

/*
 * 0 when @fd is an eventfd, which is now O_NONBLOCK; -EINVAL when it is any
 * other file, or -errno when it cannot be inspected (a closed fd: -EBADF).
 * The kind is read from /proc/self/fd (an eventfd's link is
 * "anon_inode:[eventfd]"); fstat cannot tell it from a timerfd or an epoll
 * fd, which share the same anonymous inode.
 */
int vn_peerfd_eventfd(int fd);

/*
 * Signal an eventfd checked by vn_peerfd_eventfd(): 0, or -EAGAIN when its
 * counter is saturated (the consumer has that many unread signals; this one
 * is dropped, as the interrupt it stands for is implied), or -errno.
 */
int vn_peerfd_signal(int fd);
/* Read a non-blocking eventfd to clear it: its count, or 0 when it was not
 * signalled (or cannot be read). */
uint64_t vn_peerfd_drain(int fd);

/*
 * 0 when [@offset, @offset + @size) of @fd may be mapped: @fd is a memfd
 * sealed with F_SEAL_SHRINK and at least @offset + @size bytes long.
 * Otherwise -EINVAL (-errno when it cannot be inspected), and *@why (when
 * not NULL) is a static phrase naming the fault, for the refusal message.
 */
int vn_peerfd_memory(int fd, uint64_t offset, uint64_t size, const char **why);

/*
 * 0 when [@offset, @offset + @size) of @fd may be mapped as a device's
 * memory: @fd is a VFIO device fd (the type1 group interface's anonymous
 * inode "[vfio-device]") and the range lies in one of its regions that VFIO
 * lets be mapped.  Otherwise -EINVAL (-errno when it cannot be inspected),
 * with *@why as for vn_peerfd_memory().  The regions are read with
 * VFIO_DEVICE_GET_INFO and _GET_REGION_INFO, which change nothing.
 *
 * Such a mapping is not memory: VFIO makes an access fault (SIGBUS) while
 * the device's memory decoding is off or it is being reset, so whoever
 * checked it hands it on (to QEMU, which maps a BAR only while the guest
 * lets it decode) and never touches it itself.
 */
int vn_peerfd_device_memory(int fd, uint64_t offset, uint64_t size, const char **why);

/*
 * What a memory window may map: vn_peerfd_memory(), or else
 * vn_peerfd_device_memory() for a VFIO device fd, or an outbound window of
 * our NTB module's device (/dev/vfio-ntb/NAME, which checks each mmap
 * itself); both set *@device.
 */
int vn_peerfd_window(int fd, uint64_t offset, uint64_t size, bool *device, const char **why);

/*
 * Whether two of our fds are one open file (kcmp(2) KCMP_FILE): 1, 0, or
 * -errno when the kernel cannot tell.  Two fds a peer passed for what
 * should be one memory (a BAR cut into several windows) are checked so,
 * since device fds share one anonymous inode and fstat() cannot tell them
 * apart.
 */
int vn_peerfd_same_file(int a, int b);

/*
 * A memfd of @size bytes (close-on-exec), sealed against shrinking, growing
 * and further sealing: the memory our own exporters hand to peers, which
 * vn_peerfd_memory() accepts.  Returns the fd, or -errno.
 */
int vn_peerfd_memfd_new(const char *name, uint64_t size);

#endif /* VN_PEERFD_H */
