/*
 * Edits of a domain's persistent XML that keep it following the convention
 * of domxml.h: declare a borrowed device, or take a declaration out.  Used by
 * ntbctl's --config, so that a device moved by attach, detach or reassign is
 * where the domains' definitions say it is when they next start (a source
 * domain that still declared a device lent elsewhere could not start).
 *
 * Both read @xml as vn_domxml_parse() does (bounded, no DTD, no entities),
 * check it, change the tree and check the result again; the input is never
 * trusted to be ours.  Everything else in the domain is kept as it was.
 */
#ifndef VN_DOMEDIT_H
#define VN_DOMEDIT_H

#include <glib.h>
#include <stdbool.h>
#include <stddef.h>

/*
 * @xml with @device ("host/name") declared: a <vn:device name alias> in the
 * metadata (<metadata> and <vn:devices> made when missing) and the matching
 * "-device" pair in a <qemu:commandline> (qemu namespace declared on
 * <domain> when missing).  @bus may be NULL.  The domain must already have
 * the shared memfd memory backing (hot-plug needs it too).  True with *@out
 * NULL when the domain declares @device already (that declaration stays);
 * true with *@out newly allocated when it did not; refused, with @error,
 * when another device of the domain has @alias.
 */
bool vn_domedit_declare(const char *xml, size_t len, const char *device, const char *alias,
                        const char *socket, const char *bus, char **out, GError **error);

/*
 * @xml without @device's declaration: its <vn:device> (and the <vn:devices>
 * it leaves empty) and the "-device" pair whose id is its alias (and the
 * <qemu:commandline> it leaves empty).  True with *@out NULL when the domain
 * does not declare @device; true with *@out newly allocated when it did.
 */
bool vn_domedit_undeclare(const char *xml, size_t len, const char *device, char **out,
                          GError **error);

#endif /* VN_DOMEDIT_H */
