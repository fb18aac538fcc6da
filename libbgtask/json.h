/* SPDX-License-Identifier: Apache-2.0 */
/* A small JSON reader for bgtaskd's replies (internal to libbgtask). */
#ifndef BGTASK_JSON_H
#define BGTASK_JSON_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef enum { JSON_NULL, JSON_BOOL, JSON_NUMBER, JSON_STRING, JSON_ARRAY, JSON_OBJECT } json_type;

typedef struct json_value {
    json_type type;
    /* The value's own text in the parsed message (for passing an object on verbatim). */
    const char *text;
    size_t text_length;
    bool boolean;
    double number;
    char *string;                 /* JSON_STRING: unescaped, NUL-terminated */
    struct json_value *items;     /* JSON_ARRAY: count items; JSON_OBJECT: count values */
    char **keys;                  /* JSON_OBJECT: count keys */
    size_t count;
} json_value;

/* Parses `length` bytes; returns 0, -EBADMSG (not JSON, or nested deeper than 64), -ENOMEM. */
int json_parse(const char *text, size_t length, json_value *out);
void json_free(json_value *value);
/* The member `key` of an object, or NULL. */
const json_value *json_get(const json_value *object, const char *key);
/* Typed lookups: false when the member is missing or of another type. */
bool json_get_string(const json_value *object, const char *key, const char **out);
bool json_get_number(const json_value *object, const char *key, double *out);
bool json_get_id(const json_value *object, const char *key, uint64_t *out);

/* Appends `s` as a JSON string (quoted, escaped) to a growing buffer; -ENOMEM on failure. */
int json_append_string(char **buffer, size_t *length, size_t *capacity, const char *s);
int json_append_raw(char **buffer, size_t *length, size_t *capacity, const char *s, size_t n);

#endif
