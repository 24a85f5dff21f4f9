/*
 * ntbctl's aligned tables: a header row, then cells row after row; columns
 * as wide as their widest cell (in characters), VN_CTL_TABLE_GAP blanks
 * apart, the last column not padded (no trailing blanks).  Pure: the text
 * goes to a GString, so tests compare it.
 */
#ifndef VN_CTL_TABLE_H
#define VN_CTL_TABLE_H

#include <glib.h>

/* Blanks between two columns. */
#define VN_CTL_TABLE_GAP 2

typedef struct VnCtlTable VnCtlTable;

/* @header: @ncols column names (copied). */
VnCtlTable *vn_ctl_table_new(guint ncols, const char *const *header);
void vn_ctl_table_free(VnCtlTable *t);
G_DEFINE_AUTOPTR_CLEANUP_FUNC(VnCtlTable, vn_ctl_table_free)

/* Append one cell, taking @text (rows fill left to right). */
void vn_ctl_table_add(VnCtlTable *t, char *text);
void vn_ctl_table_render(GString *out, const VnCtlTable *t);

#endif /* VN_CTL_TABLE_H */
