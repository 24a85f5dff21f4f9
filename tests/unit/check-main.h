/*
 * The main() every libcheck suite here shares.  Suites run forked, libcheck's
 * default (a crash is a failed test, not a lost run); CK_FORK=no in the
 * environment runs them in-process, for valgrind and gdb.
 */
#ifndef VN_CHECK_MAIN_H
#define VN_CHECK_MAIN_H

#include <check.h>

static inline int vn_check_main(Suite *suite)
{
    SRunner *sr = srunner_create(suite);
    int failed;

    srunner_run_all(sr, CK_NORMAL);
    failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed == 0 ? 0 : 1;
}

#endif /* VN_CHECK_MAIN_H */
