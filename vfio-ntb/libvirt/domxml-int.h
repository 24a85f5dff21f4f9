/*
 * What domxml.c shares with domedit.c: the one safe way to read a domain's
 * XML with libxml2, and the pieces both write or look for.
 */
#ifndef VN_DOMXML_INT_H
#define VN_DOMXML_INT_H

#include "libvirt/domxml.h"

#include <libxml/tree.h>

G_DEFINE_AUTOPTR_CLEANUP_FUNC(xmlDoc, xmlFreeDoc)

/*
 * @xml as a libxml2 document: size bounded, no network, no DTD, entities
 * neither loaded nor expanded (a <!DOCTYPE> is refused).  NULL with @error
 * as vn_domxml_parse() sets it.
 */
xmlDoc *vn_domxml_read(const char *xml, size_t len, GError **error);

/* vn_domxml_parse() of a document read with vn_domxml_read() (which stays
 * the caller's, unchanged). */
VnDomain *vn_domxml_parse_doc(xmlDoc *doc, GError **error);

/* An element called @name in namespace @ns (NULL: in none). */
bool vn_domxml_is_element(const xmlNode *n, const char *ns, const char *name);

/* The JSON -device argument that plugs a borrowed device into QEMU
 * (vfio-user-pci, id @alias, on @bus if not NULL); newly allocated. */
char *vn_domxml_device_arg(const char *alias, const char *socket, const char *bus);

#endif /* VN_DOMXML_INT_H */
