/*
 * ntbctl's aligned tables (table.h).
 */
#include "ctl/table.h"

struct VnCtlTable {
    guint ncols;
    GPtrArray *cells; /* char *, row-major; the header is row 0 */
};

VnCtlTable *vn_ctl_table_new(guint ncols, const char *const *header)
{
    VnCtlTable *t = g_new0(VnCtlTable, 1);

    t->ncols = ncols;
    t->cells = g_ptr_array_new_with_free_func(g_free);
    for (guint i = 0; i < ncols; i++) {
        g_ptr_array_add(t->cells, g_strdup(header[i]));
    }
    return t;
}

void vn_ctl_table_free(VnCtlTable *t)
{
    if (t == NULL) {
        return;
    }
    g_ptr_array_unref(t->cells);
    g_free(t);
}

void vn_ctl_table_add(VnCtlTable *t, char *text)
{
    g_ptr_array_add(t->cells, text);
}

void vn_ctl_table_render(GString *out, const VnCtlTable *t)
{
    g_autofree glong *width = g_new0(glong, t->ncols);

    for (guint i = 0; i < t->cells->len; i++) {
        glong w = g_utf8_strlen(t->cells->pdata[i], -1);

        width[i % t->ncols] = MAX(width[i % t->ncols], w);
    }
    for (guint i = 0; i < t->cells->len; i++) {
        guint col = i % t->ncols;
        const char *text = t->cells->pdata[i];

        g_string_append(out, text);
        if (col + 1 == t->ncols) {
            g_string_append_c(out, '\n');
        } else {
            glong pad = width[col] - g_utf8_strlen(text, -1) + VN_CTL_TABLE_GAP;

            g_string_append_printf(out, "%*s", (int)pad, "");
        }
    }
}
