/*
 * The one rule for names: nodes, devices, domains and QEMU ids (a device's
 * alias in a domain, a qdev id, a bus).  Every place that takes a name from
 * a peer, a config file, the command line or domain XML checks it here, so
 * a name one part accepts is one every other part accepts too (a device
 * that can be lent can be announced, borrowed and attached).
 *
 * All names are 1..VN_MAX_*_NAME characters of [A-Za-z0-9_.-], the set
 * that is safe in file names (the daemon makes run-dir files and sockets of
 * them), in the "host/name" device syntax and in JSON without escaping;
 * "." and ".." are refused as they name directories.  Kinds narrow it:
 *
 *   node     [a-z0-9][a-z0-9-]*: a host name (fabric socket names, no case
 *            folding question, no '.' or '_')
 *   device   the whole set
 *   domain   the whole set (libvirt allows more; we never need it)
 *   qdev id  a letter first (QEMU's id_wellformed())
 *   socket   the whole set, ending in ".sock": a socket's file name in
 *            run-dir (a path given to the daemon is checked by its last part)
 */
#ifndef VN_NAME_H
#define VN_NAME_H

#include <stdbool.h>

/* A node (host) name: a fabric socket DIR/NODE.sock, short like a host
 * name; the shm fabric's HELLO carries it in 32 bytes. */
#define VN_MAX_NODE_NAME 31
/* A device's name on its lender: 63 as a DNS label, and with a node name
 * "host/name" stays under 96 bytes. */
#define VN_MAX_DEVICE_NAME 63
/* A domain (VM) name; libvirt takes longer ones, but names become socket
 * file names in run-dir, and a UNIX socket path has 108 bytes. */
#define VN_MAX_DOMAIN_NAME 63
/* A QEMU id (the device's alias, a qdev id, a bus): QEMU has no limit;
 * ours keeps it a printable word of a line. */
#define VN_MAX_QDEV_ID 63
/* A socket's file name, ".sock" included: with run-dir it must fit the
 * 108 bytes of sun_path. */
#define VN_MAX_SOCKET_NAME 63

typedef enum VnNameKind {
    VN_NAME_NODE,
    VN_NAME_DEVICE,
    VN_NAME_DOMAIN,
    VN_NAME_QDEV_ID,
    VN_NAME_SOCKET,
    VN_NAME_LAST
} VnNameKind;

/* True when @s (may be NULL) is a valid name of @kind. */
bool vn_name_valid(VnNameKind kind, const char *s);

/* The rule for @kind in words, for error messages ("1-63 of [A-Za-z0-9_.-],
 * not . or .."); static. */
const char *vn_name_rule(VnNameKind kind);

/* "node", "device", "domain", "qdev id", "socket". */
const char *vn_name_kind_to_string(VnNameKind kind);

/* A list of names as an operator writes one, in a config file or on a
 * command line: separated by ',' or ';' (both, anywhere), blanks around
 * each ignored, empty entries dropped ("hostb; hostc;" is two).  Checks
 * nothing else; the caller bounds the count. */
char **vn_name_split_list(const char *text); /* g_strfreev() it */

#endif /* VN_NAME_H */
