/*
 * A fake sysfs/procfs tree for unit tests of code that reads them
 * (pcibind, identity): files and links under a temporary root.
 */
#ifndef VN_FAKE_SYSFS_H
#define VN_FAKE_SYSFS_H

#include <check.h>
#include <glib.h>
#include <glib/gstdio.h>
#include <stdlib.h>
#include <unistd.h>

/* The tree's root, made by fake_root(). */
static char *root;

/* A new temporary root. */
static inline char *fake_root(const char *tag)
{
    g_autofree char *tmpl = g_strdup_printf("vn-%s-XXXXXX", tag);

    return g_dir_make_tmp(tmpl, NULL);
}

/* @root/@rel holds @text (directories made as needed). */
static inline void fake_put(const char *rel, const char *text)
{
    g_autofree char *path = g_build_filename(root, rel, NULL);
    g_autofree char *dir = g_path_get_dirname(path);

    ck_assert_int_eq(g_mkdir_with_parents(dir, 0700), 0);
    ck_assert(g_file_set_contents(path, text, -1, NULL));
}

/* @root/@rel is a symbolic link to @target. */
static inline void fake_link(const char *rel, const char *target)
{
    g_autofree char *path = g_build_filename(root, rel, NULL);
    g_autofree char *dir = g_path_get_dirname(path);

    ck_assert_int_eq(g_mkdir_with_parents(dir, 0700), 0);
    ck_assert_int_eq(symlink(target, path), 0);
}

/* The whole tree goes. */
static inline void fake_remove(void)
{
    g_autofree char *cmd = g_strdup_printf("rm -rf '%s'", root);

    ck_assert_int_eq(system(cmd), 0);
    g_clear_pointer(&root, g_free);
}

#endif /* VN_FAKE_SYSFS_H */
