/*
 * A small JSON reader for the fake NVML's configuration file.
 *
 * It accepts RFC 8259 JSON (objects, arrays, strings with every escape,
 * numbers, true/false/null) and builds a tree. It refuses duplicate keys in an
 * object and the \u0000 escape (the tree stores NUL-terminated strings), and it
 * limits nesting to 64 levels. Everything here is hidden from the library's
 * exported symbol table: only nvml* names leave the shared object.
 */
#ifndef FAKE_NVML_JSON_H
#define FAKE_NVML_JSON_H

#include <stddef.h>

#pragma GCC visibility push(hidden)

typedef enum {
    JSON_NULL,
    JSON_BOOL,
    JSON_NUMBER,
    JSON_STRING,
    JSON_ARRAY,
    JSON_OBJECT
} json_type;

typedef struct json_value json_value;

struct json_value {
    json_type type;
    int boolean;          /* JSON_BOOL */
    double number;        /* JSON_NUMBER */
    int is_integer;       /* JSON_NUMBER written without fraction or exponent, fits a long long */
    long long integer;    /* JSON_NUMBER when is_integer */
    char *string;         /* JSON_STRING: NUL-terminated UTF-8 */
    size_t count;         /* JSON_ARRAY, JSON_OBJECT: number of members */
    json_value **items;   /* JSON_ARRAY, JSON_OBJECT: the members, in file order */
    char **keys;          /* JSON_OBJECT: keys[i] names items[i] */
};

/* Parses text[0..length). On failure returns NULL and writes a one-line
 * description (with line and column) into error. */
json_value *json_parse(const char *text, size_t length, char *error, size_t error_size);

void json_free(json_value *value);

/* The member named key of an object, or NULL (also NULL when object is not an object). */
const json_value *json_object_get(const json_value *object, const char *key);

/* "null", "boolean", "number", "string", "array" or "object". */
const char *json_type_name(json_type type);

#pragma GCC visibility pop

#endif
