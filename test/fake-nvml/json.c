/*
 * Recursive-descent JSON reader; see json.h for what it accepts.
 */
#include "json.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define JSON_MAX_DEPTH 64

typedef struct {
    const char *start;
    const char *cur;
    const char *end;
    char *error;
    size_t error_size;
    int failed;
} json_parser;

static void parser_fail(json_parser *ps, const char *what)
{
    unsigned line = 1, column = 1;
    const char *p;

    if (ps->failed)
        return;
    ps->failed = 1;
    for (p = ps->start; p < ps->cur && p < ps->end; p++) {
        if (*p == '\n') {
            line++;
            column = 1;
        } else {
            column++;
        }
    }
    if (ps->error && ps->error_size > 0) {
        if (ps->cur >= ps->end)
            snprintf(ps->error, ps->error_size, "malformed JSON at end of input (line %u column %u): %s",
                     line, column, what);
        else
            snprintf(ps->error, ps->error_size, "malformed JSON at line %u column %u: %s", line, column, what);
    }
}

static void skip_space(json_parser *ps)
{
    while (ps->cur < ps->end && (*ps->cur == ' ' || *ps->cur == '\t' || *ps->cur == '\n' || *ps->cur == '\r'))
        ps->cur++;
}

static json_value *new_value(json_parser *ps, json_type type)
{
    json_value *v = calloc(1, sizeof *v);

    if (!v) {
        parser_fail(ps, "out of memory");
        return NULL;
    }
    v->type = type;
    return v;
}

/* A growable byte buffer for string contents. */
typedef struct {
    char *data;
    size_t len;
    size_t cap;
} byte_buffer;

static int buffer_push(byte_buffer *b, char c)
{
    if (b->len + 1 >= b->cap) {
        size_t cap = b->cap ? b->cap * 2 : 32;
        char *data = realloc(b->data, cap);

        if (!data)
            return -1;
        b->data = data;
        b->cap = cap;
    }
    b->data[b->len++] = c;
    b->data[b->len] = '\0';
    return 0;
}

static int buffer_push_utf8(byte_buffer *b, unsigned long cp)
{
    int rc = 0;

    if (cp < 0x80) {
        rc |= buffer_push(b, (char)cp);
    } else if (cp < 0x800) {
        rc |= buffer_push(b, (char)(0xC0 | (cp >> 6)));
        rc |= buffer_push(b, (char)(0x80 | (cp & 0x3F)));
    } else if (cp < 0x10000) {
        rc |= buffer_push(b, (char)(0xE0 | (cp >> 12)));
        rc |= buffer_push(b, (char)(0x80 | ((cp >> 6) & 0x3F)));
        rc |= buffer_push(b, (char)(0x80 | (cp & 0x3F)));
    } else {
        rc |= buffer_push(b, (char)(0xF0 | (cp >> 18)));
        rc |= buffer_push(b, (char)(0x80 | ((cp >> 12) & 0x3F)));
        rc |= buffer_push(b, (char)(0x80 | ((cp >> 6) & 0x3F)));
        rc |= buffer_push(b, (char)(0x80 | (cp & 0x3F)));
    }
    return rc;
}

static int hex_value(char c)
{
    if (c >= '0' && c <= '9')
        return c - '0';
    if (c >= 'a' && c <= 'f')
        return c - 'a' + 10;
    if (c >= 'A' && c <= 'F')
        return c - 'A' + 10;
    return -1;
}

/* Reads the four hex digits of a \u escape (ps->cur is on the first digit). */
static int read_hex4(json_parser *ps, unsigned long *out)
{
    unsigned long v = 0;
    int i;

    if (ps->end - ps->cur < 4) {
        ps->cur = ps->end;
        parser_fail(ps, "truncated \\u escape");
        return -1;
    }
    for (i = 0; i < 4; i++) {
        int h = hex_value(ps->cur[i]);

        if (h < 0) {
            ps->cur += i;
            parser_fail(ps, "bad hex digit in \\u escape");
            return -1;
        }
        v = (v << 4) | (unsigned long)h;
    }
    ps->cur += 4;
    *out = v;
    return 0;
}

/* Parses a string; ps->cur is on the opening quote. Returns a malloc'd NUL-terminated copy. */
static char *parse_string_raw(json_parser *ps)
{
    byte_buffer b = { NULL, 0, 0 };

    ps->cur++; /* opening quote */
    if (buffer_push(&b, 'x') < 0)
        goto oom;
    b.len = 0;
    b.data[0] = '\0';
    for (;;) {
        unsigned char c;

        if (ps->cur >= ps->end) {
            parser_fail(ps, "unterminated string");
            goto fail;
        }
        c = (unsigned char)*ps->cur;
        if (c == '"') {
            ps->cur++;
            return b.data;
        }
        if (c < 0x20) {
            parser_fail(ps, "control character in string (escape it)");
            goto fail;
        }
        if (c != '\\') {
            if (buffer_push(&b, (char)c) < 0)
                goto oom;
            ps->cur++;
            continue;
        }
        ps->cur++;
        if (ps->cur >= ps->end) {
            parser_fail(ps, "unterminated escape");
            goto fail;
        }
        c = (unsigned char)*ps->cur;
        ps->cur++;
        switch (c) {
        case '"': if (buffer_push(&b, '"') < 0) goto oom; break;
        case '\\': if (buffer_push(&b, '\\') < 0) goto oom; break;
        case '/': if (buffer_push(&b, '/') < 0) goto oom; break;
        case 'b': if (buffer_push(&b, '\b') < 0) goto oom; break;
        case 'f': if (buffer_push(&b, '\f') < 0) goto oom; break;
        case 'n': if (buffer_push(&b, '\n') < 0) goto oom; break;
        case 'r': if (buffer_push(&b, '\r') < 0) goto oom; break;
        case 't': if (buffer_push(&b, '\t') < 0) goto oom; break;
        case 'u': {
            unsigned long cp;

            if (read_hex4(ps, &cp) < 0)
                goto fail;
            if (cp >= 0xD800 && cp <= 0xDBFF) {
                unsigned long low;

                if (ps->end - ps->cur < 2 || ps->cur[0] != '\\' || ps->cur[1] != 'u') {
                    parser_fail(ps, "high surrogate not followed by a low surrogate");
                    goto fail;
                }
                ps->cur += 2;
                if (read_hex4(ps, &low) < 0)
                    goto fail;
                if (low < 0xDC00 || low > 0xDFFF) {
                    parser_fail(ps, "high surrogate not followed by a low surrogate");
                    goto fail;
                }
                cp = 0x10000 + ((cp - 0xD800) << 10) + (low - 0xDC00);
            } else if (cp >= 0xDC00 && cp <= 0xDFFF) {
                parser_fail(ps, "lone low surrogate");
                goto fail;
            } else if (cp == 0) {
                parser_fail(ps, "\\u0000 is not supported");
                goto fail;
            }
            if (buffer_push_utf8(&b, cp) < 0)
                goto oom;
            break;
        }
        default:
            ps->cur--;
            parser_fail(ps, "unknown escape in string");
            goto fail;
        }
    }
oom:
    parser_fail(ps, "out of memory");
fail:
    free(b.data);
    return NULL;
}

static int is_digit(char c)
{
    return c >= '0' && c <= '9';
}

static json_value *parse_number(json_parser *ps)
{
    const char *begin = ps->cur;
    const char *p = ps->cur;
    int integral = 1;
    char text[80];
    size_t len;
    json_value *v;

    if (p < ps->end && *p == '-')
        p++;
    if (p >= ps->end || !is_digit(*p)) {
        ps->cur = p;
        parser_fail(ps, "expected a digit");
        return NULL;
    }
    if (*p == '0') {
        p++;
    } else {
        while (p < ps->end && is_digit(*p))
            p++;
    }
    if (p < ps->end && *p == '.') {
        integral = 0;
        p++;
        if (p >= ps->end || !is_digit(*p)) {
            ps->cur = p;
            parser_fail(ps, "expected a digit after the decimal point");
            return NULL;
        }
        while (p < ps->end && is_digit(*p))
            p++;
    }
    if (p < ps->end && (*p == 'e' || *p == 'E')) {
        integral = 0;
        p++;
        if (p < ps->end && (*p == '+' || *p == '-'))
            p++;
        if (p >= ps->end || !is_digit(*p)) {
            ps->cur = p;
            parser_fail(ps, "expected a digit in the exponent");
            return NULL;
        }
        while (p < ps->end && is_digit(*p))
            p++;
    }
    len = (size_t)(p - begin);
    if (len >= sizeof text) {
        parser_fail(ps, "number too long");
        return NULL;
    }
    memcpy(text, begin, len);
    text[len] = '\0';
    v = new_value(ps, JSON_NUMBER);
    if (!v)
        return NULL;
    v->number = strtod(text, NULL);
    if (integral) {
        long long ll;

        errno = 0;
        ll = strtoll(text, NULL, 10);
        if (errno == 0) {
            v->is_integer = 1;
            v->integer = ll;
        }
    }
    ps->cur = p;
    return v;
}

static int match_word(json_parser *ps, const char *word)
{
    size_t n = strlen(word);

    if ((size_t)(ps->end - ps->cur) < n || memcmp(ps->cur, word, n) != 0)
        return 0;
    ps->cur += n;
    return 1;
}

static int append_item(json_parser *ps, json_value *container, size_t *cap, json_value *item, char *key)
{
    if (container->count == *cap) {
        size_t ncap = *cap ? *cap * 2 : 8;
        json_value **items = realloc(container->items, ncap * sizeof *items);

        if (!items) {
            parser_fail(ps, "out of memory");
            return -1;
        }
        container->items = items;
        if (container->type == JSON_OBJECT) {
            char **keys = realloc(container->keys, ncap * sizeof *keys);

            if (!keys) {
                parser_fail(ps, "out of memory");
                return -1;
            }
            container->keys = keys;
        }
        *cap = ncap;
    }
    container->items[container->count] = item;
    if (container->type == JSON_OBJECT)
        container->keys[container->count] = key;
    container->count++;
    return 0;
}

static json_value *parse_value(json_parser *ps, int depth);

static json_value *parse_array(json_parser *ps, int depth)
{
    json_value *v = new_value(ps, JSON_ARRAY);
    size_t cap = 0;

    if (!v)
        return NULL;
    ps->cur++; /* '[' */
    skip_space(ps);
    if (ps->cur < ps->end && *ps->cur == ']') {
        ps->cur++;
        return v;
    }
    for (;;) {
        json_value *item = parse_value(ps, depth + 1);

        if (!item)
            goto fail;
        if (append_item(ps, v, &cap, item, NULL) < 0) {
            json_free(item);
            goto fail;
        }
        skip_space(ps);
        if (ps->cur < ps->end && *ps->cur == ',') {
            ps->cur++;
            continue;
        }
        if (ps->cur < ps->end && *ps->cur == ']') {
            ps->cur++;
            return v;
        }
        parser_fail(ps, "expected ',' or ']' in array");
        goto fail;
    }
fail:
    json_free(v);
    return NULL;
}

static json_value *parse_object(json_parser *ps, int depth)
{
    json_value *v = new_value(ps, JSON_OBJECT);
    size_t cap = 0;

    if (!v)
        return NULL;
    ps->cur++; /* '{' */
    skip_space(ps);
    if (ps->cur < ps->end && *ps->cur == '}') {
        ps->cur++;
        return v;
    }
    for (;;) {
        const char *key_at;
        char *key;
        json_value *item;
        size_t i;

        skip_space(ps);
        if (ps->cur >= ps->end || *ps->cur != '"') {
            parser_fail(ps, "expected a string key in object");
            goto fail;
        }
        key_at = ps->cur;
        key = parse_string_raw(ps);
        if (!key)
            goto fail;
        for (i = 0; i < v->count; i++) {
            if (strcmp(v->keys[i], key) == 0) {
                char what[160];

                ps->cur = key_at;
                snprintf(what, sizeof what, "duplicate key \"%.100s\"", key);
                parser_fail(ps, what);
                free(key);
                goto fail;
            }
        }
        skip_space(ps);
        if (ps->cur >= ps->end || *ps->cur != ':') {
            parser_fail(ps, "expected ':' after object key");
            free(key);
            goto fail;
        }
        ps->cur++;
        item = parse_value(ps, depth + 1);
        if (!item) {
            free(key);
            goto fail;
        }
        if (append_item(ps, v, &cap, item, key) < 0) {
            json_free(item);
            free(key);
            goto fail;
        }
        skip_space(ps);
        if (ps->cur < ps->end && *ps->cur == ',') {
            ps->cur++;
            continue;
        }
        if (ps->cur < ps->end && *ps->cur == '}') {
            ps->cur++;
            return v;
        }
        parser_fail(ps, "expected ',' or '}' in object");
        goto fail;
    }
fail:
    json_free(v);
    return NULL;
}

static json_value *parse_value(json_parser *ps, int depth)
{
    json_value *v;

    if (depth > JSON_MAX_DEPTH) {
        parser_fail(ps, "nesting too deep");
        return NULL;
    }
    skip_space(ps);
    if (ps->cur >= ps->end) {
        parser_fail(ps, "unexpected end of input, expected a value");
        return NULL;
    }
    switch (*ps->cur) {
    case '{':
        return parse_object(ps, depth);
    case '[':
        return parse_array(ps, depth);
    case '"': {
        char *s = parse_string_raw(ps);

        if (!s)
            return NULL;
        v = new_value(ps, JSON_STRING);
        if (!v) {
            free(s);
            return NULL;
        }
        v->string = s;
        return v;
    }
    case 't':
        if (match_word(ps, "true")) {
            v = new_value(ps, JSON_BOOL);
            if (v)
                v->boolean = 1;
            return v;
        }
        break;
    case 'f':
        if (match_word(ps, "false"))
            return new_value(ps, JSON_BOOL);
        break;
    case 'n':
        if (match_word(ps, "null"))
            return new_value(ps, JSON_NULL);
        break;
    default:
        if (*ps->cur == '-' || is_digit(*ps->cur))
            return parse_number(ps);
        break;
    }
    parser_fail(ps, "unexpected character, expected a value");
    return NULL;
}

json_value *json_parse(const char *text, size_t length, char *error, size_t error_size)
{
    json_parser ps;
    json_value *root;

    ps.start = text;
    ps.cur = text;
    ps.end = text + length;
    ps.error = error;
    ps.error_size = error_size;
    ps.failed = 0;
    if (error && error_size > 0)
        error[0] = '\0';
    /* A UTF-8 byte order mark is tolerated at the very start. */
    if (length >= 3 && (unsigned char)text[0] == 0xEF && (unsigned char)text[1] == 0xBB &&
        (unsigned char)text[2] == 0xBF)
        ps.cur += 3;
    root = parse_value(&ps, 0);
    if (!root)
        return NULL;
    skip_space(&ps);
    if (ps.cur != ps.end) {
        parser_fail(&ps, "unexpected data after the JSON value");
        json_free(root);
        return NULL;
    }
    return root;
}

void json_free(json_value *value)
{
    size_t i;

    if (!value)
        return;
    for (i = 0; i < value->count; i++) {
        json_free(value->items[i]);
        if (value->keys)
            free(value->keys[i]);
    }
    free(value->items);
    free(value->keys);
    free(value->string);
    free(value);
}

const json_value *json_object_get(const json_value *object, const char *key)
{
    size_t i;

    if (!object || object->type != JSON_OBJECT)
        return NULL;
    for (i = 0; i < object->count; i++) {
        if (strcmp(object->keys[i], key) == 0)
            return object->items[i];
    }
    return NULL;
}

const char *json_type_name(json_type type)
{
    switch (type) {
    case JSON_NULL: return "null";
    case JSON_BOOL: return "boolean";
    case JSON_NUMBER: return "number";
    case JSON_STRING: return "string";
    case JSON_ARRAY: return "array";
    case JSON_OBJECT: return "object";
    }
    return "unknown";
}
