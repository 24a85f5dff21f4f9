/*
 * Unit tests of the one bounded JSON parse (vfio-ntb/common/json.c): nesting
 * at VN_MAX_JSON_DEPTH is accepted, one level more is refused before the
 * parser runs, and so is a text longer than the caller's bound; a 64 KiB
 * line of "[" is refused on a 64 KiB thread stack, where json-glib's own
 * recursive parser overflows it.
 */
#include "common/json.h"

#include "check-main.h"

#include <check.h>
#include <gio/gio.h>
#include <malloc.h>
#include <pthread.h>
#include <string.h>

/* @n levels of @open ... @close around "1". */
static char *nest(unsigned n, char open, char close)
{
    GString *s = g_string_new(NULL);

    for (unsigned i = 0; i < n; i++) {
        g_string_append(s, open == '{' ? "{\"k\":" : "[");
    }
    g_string_append_c(s, '1');
    for (unsigned i = 0; i < n; i++) {
        g_string_append_c(s, close);
    }
    return g_string_free(s, FALSE);
}

/* ---- depth -------------------------------------------------------------- */

static const struct {
    const char *name;
    unsigned levels;
    char open, close;
    bool ok;
} depths[] = {
    { "arrays at the limit", VN_MAX_JSON_DEPTH, '[', ']', true },
    { "arrays one over", VN_MAX_JSON_DEPTH + 1, '[', ']', false },
    { "objects at the limit", VN_MAX_JSON_DEPTH, '{', '}', true },
    { "objects one over", VN_MAX_JSON_DEPTH + 1, '{', '}', false },
    { "one level", 1, '[', ']', true },
    { "far over", 100000, '[', ']', false },
};

START_TEST(test_depth)
{
    g_autofree char *text = nest(depths[_i].levels, depths[_i].open, depths[_i].close);
    g_autoptr(GError) error = NULL;
    g_autoptr(JsonNode) root = vn_json_parse(text, -1, strlen(text), &error);

    if (depths[_i].ok) {
        ck_assert_msg(root != NULL, "%s: %s", depths[_i].name, error ? error->message : "");
    } else {
        ck_assert_msg(root == NULL, "%s: accepted", depths[_i].name);
        ck_assert(g_error_matches(error, G_IO_ERROR, G_IO_ERROR_MESSAGE_TOO_LARGE));
        ck_assert_ptr_nonnull(strstr(error->message, "nested deeper than 32"));
    }
}
END_TEST

/* Depth counts objects and arrays, not brackets inside strings (escaped
 * quotes included); closing brackets first do not buy extra levels. */
START_TEST(test_depth_scan)
{
    static const char ok[] = "{\"a\":[{\"b\":\"[[[[[[\\\"[[[\"}]}";
    static const char deep[] = "[[[[[";
    static const char sneaky[] = "]]]][[[[[";

    ck_assert_int_eq(vn_json_shape(ok, strlen(ok), 3), VN_JSON_ONE);
    ck_assert_int_eq(vn_json_shape(ok, strlen(ok), 2), VN_JSON_TOO_DEEP);
    ck_assert_int_eq(vn_json_shape(deep, strlen(deep), 5), VN_JSON_ONE); /* unclosed */
    ck_assert_int_eq(vn_json_shape(deep, strlen(deep), 4), VN_JSON_TOO_DEEP);
    ck_assert_int_eq(vn_json_shape(sneaky, strlen(sneaky), 4), VN_JSON_NOT_ONE);
}
END_TEST

/* What JSON does not allow never reaches json-glib, whose scanner reads it otherwise (the
 * proto fuzzer's text below made it parse a second value after the first and leak it). */
START_TEST(test_not_json)
{
    static const char fuzzed[] = "{\"iova\":0,\"size\":8,/a\"\020,/\"all\":false}[]}";
    static const char control[] = "{\"a\":\"\001\"}";
    static const char fine[] = "{\"a\":[1.5e-3,-2,true,false,null,\"\\u0001 \xc3\xa9\"]}";
    g_autoptr(GError) error = NULL;

    ck_assert_int_eq(vn_json_shape(fuzzed, strlen(fuzzed), 4), VN_JSON_NOT_JSON);
    ck_assert_int_eq(vn_json_shape(control, strlen(control), 4), VN_JSON_NOT_JSON);
    ck_assert_int_eq(vn_json_shape(fine, strlen(fine), 4), VN_JSON_ONE);
    ck_assert_ptr_null(vn_json_parse(fuzzed, -1, 4096, &error));
    ck_assert_ptr_nonnull(strstr(error->message, "not JSON"));
    g_clear_error(&error);
    g_autoptr(JsonNode) root = vn_json_parse(fine, -1, 4096, &error);
    ck_assert_msg(root != NULL, "%s", error ? error->message : "");
}
END_TEST

/* ---- length and shape ---------------------------------------------------- */

START_TEST(test_length_bound)
{
    static const char text[] = "{\"n\":1}"; /* 7 bytes */
    g_autoptr(GError) error = NULL;
    g_autoptr(JsonNode) at = vn_json_parse(text, -1, 7, NULL);
    g_autoptr(JsonNode) over = vn_json_parse(text, -1, 6, &error);
    g_autoptr(JsonNode) prefix = vn_json_parse("[1]trailing", 3, 3, NULL);

    ck_assert_ptr_nonnull(at);
    ck_assert_ptr_null(over);
    ck_assert(g_error_matches(error, G_IO_ERROR, G_IO_ERROR_MESSAGE_TOO_LARGE));
    /* With a length, only that many bytes are the text. */
    ck_assert_ptr_nonnull(prefix);
    ck_assert(JSON_NODE_HOLDS_ARRAY(prefix));
}
END_TEST

START_TEST(test_shapes)
{
    g_autoptr(GError) e1 = NULL, e2 = NULL, e3 = NULL, e4 = NULL, e5 = NULL;
    g_autoptr(JsonObject) o = vn_json_parse_object("{\"a\":\"b\"}", -1, 64, NULL);

    ck_assert_ptr_nonnull(o);
    ck_assert_str_eq(json_object_get_string_member(o, "a"), "b");
    ck_assert_ptr_null(vn_json_parse_object("[1]", -1, 64, &e1));
    ck_assert(g_error_matches(e1, G_IO_ERROR, G_IO_ERROR_INVALID_DATA));
    ck_assert_ptr_null(vn_json_parse_object("", -1, 64, &e2));
    ck_assert(g_error_matches(e2, G_IO_ERROR, G_IO_ERROR_INVALID_DATA));
    ck_assert_ptr_null(vn_json_parse(NULL, -1, 64, &e3));
    ck_assert(g_error_matches(e3, G_IO_ERROR, G_IO_ERROR_INVALID_DATA));
    ck_assert_ptr_null(vn_json_parse_object("{\"a\":", -1, 64, &e4));
    ck_assert_ptr_nonnull(e4);
    ck_assert(e4->domain == JSON_PARSER_ERROR);
    /* A refusal before parsing stays one for the object form too. */
    ck_assert_ptr_null(vn_json_parse_object("[[[[", -1, 2, &e5));
    ck_assert(g_error_matches(e5, G_IO_ERROR, G_IO_ERROR_MESSAGE_TOO_LARGE));
}
END_TEST

/* One object or array and only whitespace after it; the rest is refused
 * before json-glib sees it. */
static const struct {
    const char *text;
    bool ok;
} json_load[] = {
    { "{}", true },
    { " \n[1, {\"a\": \"}\"}]\r\n", true },
    { "{\"a\":\"x\\\"}\"}", true },
    { "{} x", false },
    { "{\"a\":1}{\"b\":2}", false },
    { "[1] [2]", false },
    { "7{}", false },
    { "\"s\"", false },
    { "", false },
};

START_TEST(test_json_load)
{
    g_autoptr(GError) error = NULL;
    g_autoptr(JsonNode) root = vn_json_parse(json_load[_i].text, -1, 4096, &error);
    bool ok = root != NULL;

    ck_assert_msg(ok == json_load[_i].ok, "%s: %s", json_load[_i].text,
                  error != NULL ? error->message : "accepted");
    ck_assert(ok == (error == NULL));
}
END_TEST

/* Found by the proto, control and QMP fuzz targets: json-glib 1.6 leaks
 * what it parsed when text follows the value; refused, nothing stays. */
START_TEST(test_json_load_trailing_frees)
{
    enum { WARMUP = 100, ROUNDS = 2000 };
    size_t before = 0;

    for (int i = 0; i < WARMUP + ROUNDS; i++) {
        ck_assert_ptr_null(vn_json_parse("{\"a\":{\"b\":[1,2]}} {\"c\":3}", -1, 4096, NULL));
        if (i == WARMUP) {
            before = mallinfo2().uordblks;
        }
    }
    ck_assert_msg(mallinfo2().uordblks < before + 64 * 1024,
                  "%zu bytes more in use after %d refusals", mallinfo2().uordblks - before, ROUNDS);
}
END_TEST

/* ---- a small stack -------------------------------------------------------- */

/* A daemon thread's stack, small on purpose: json-glib 1.6 takes about 115
 * bytes per level, so ~550 levels overflow it. */
#define SMALL_STACK (64 * 1024)
#define LINE_LEN (64 * 1024)

typedef struct Parse {
    const char *text;
    bool refused;
    bool done;
} Parse;

static void *parse_on_small_stack(void *data)
{
    Parse *p = data;
    g_autoptr(GError) error = NULL;
    JsonNode *root = vn_json_parse(p->text, -1, LINE_LEN, &error);

    p->refused = root == NULL && g_error_matches(error, G_IO_ERROR, G_IO_ERROR_MESSAGE_TOO_LARGE);
    if (root != NULL) {
        json_node_unref(root);
    }
    p->done = true;
    return NULL;
}

START_TEST(test_deep_line_small_stack)
{
    g_autofree char *line = g_malloc(LINE_LEN + 1);
    Parse p = { .text = line };
    pthread_attr_t attr;
    pthread_t t;

    memset(line, '[', LINE_LEN);
    line[LINE_LEN] = '\0';
    ck_assert_int_eq(pthread_attr_init(&attr), 0);
    ck_assert_int_eq(pthread_attr_setstacksize(&attr, SMALL_STACK), 0);
    /* A stack overflow there is a SIGSEGV of this forked test: a failure. */
    ck_assert_int_eq(pthread_create(&t, &attr, parse_on_small_stack, &p), 0);
    ck_assert_int_eq(pthread_join(t, NULL), 0);
    pthread_attr_destroy(&attr);
    ck_assert(p.done);
    ck_assert(p.refused);
}
END_TEST

static Suite *json_suite(void)
{
    Suite *s = suite_create("json");
    TCase *tc;

    tc = tcase_create("depth");
    tcase_add_loop_test(tc, test_depth, 0, G_N_ELEMENTS(depths));
    tcase_add_test(tc, test_depth_scan);
    tcase_add_test(tc, test_not_json);
    tcase_add_test(tc, test_deep_line_small_stack);
    suite_add_tcase(s, tc);

    tc = tcase_create("bounds");
    tcase_add_test(tc, test_length_bound);
    tcase_add_test(tc, test_shapes);
    tcase_add_loop_test(tc, test_json_load, 0, G_N_ELEMENTS(json_load));
    tcase_add_test(tc, test_json_load_trailing_frees);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    return vn_check_main(json_suite());
}
