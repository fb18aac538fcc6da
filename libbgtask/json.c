/* SPDX-License-Identifier: Apache-2.0 */
#define _GNU_SOURCE
#include "json.h"

#include <errno.h>
#include <locale.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#define MAX_DEPTH 64

/* JSON numbers are read in the C locale, whatever the app set with setlocale(): under
 * de_DE.UTF-8 strtod stops at the '.' of 5.0 (every GTK or Qt app sets its locale). Made once,
 * never freed; two threads racing to make it may each make one, and one is kept. */
static locale_t c_locale(void) {
    static locale_t made;
    locale_t current = __atomic_load_n(&made, __ATOMIC_ACQUIRE);
    if (current) return current;
    locale_t fresh = newlocale(LC_ALL_MASK, "C", (locale_t)0);
    if (!fresh) return (locale_t)0;
    locale_t expected = (locale_t)0;
    if (!__atomic_compare_exchange_n(&made, &expected, fresh, false, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE)) {
        freelocale(fresh);
        return expected;
    }
    return fresh;
}

typedef struct {
    const char *text;
    size_t length, at;
} parser;

static void skip_space(parser *p) {
    while (p->at < p->length && (p->text[p->at] == ' ' || p->text[p->at] == '\t' || p->text[p->at] == '\n' ||
                                 p->text[p->at] == '\r'))
        p->at++;
}

static int hex4(parser *p, unsigned *out) {
    if (p->length - p->at < 4) return -EBADMSG;
    unsigned value = 0;
    for (int i = 0; i < 4; i++) {
        char c = p->text[p->at++];
        value <<= 4;
        if (c >= '0' && c <= '9') value |= (unsigned)(c - '0');
        else if (c >= 'a' && c <= 'f') value |= (unsigned)(c - 'a' + 10);
        else if (c >= 'A' && c <= 'F') value |= (unsigned)(c - 'A' + 10);
        else return -EBADMSG;
    }
    *out = value;
    return 0;
}

static size_t put_utf8(char *out, unsigned scalar) {
    if (scalar < 0x80) { out[0] = (char)scalar; return 1; }
    if (scalar < 0x800) { out[0] = (char)(0xC0 | scalar >> 6); out[1] = (char)(0x80 | (scalar & 0x3F)); return 2; }
    if (scalar < 0x10000) {
        out[0] = (char)(0xE0 | scalar >> 12); out[1] = (char)(0x80 | ((scalar >> 6) & 0x3F));
        out[2] = (char)(0x80 | (scalar & 0x3F));
        return 3;
    }
    out[0] = (char)(0xF0 | scalar >> 18); out[1] = (char)(0x80 | ((scalar >> 12) & 0x3F));
    out[2] = (char)(0x80 | ((scalar >> 6) & 0x3F)); out[3] = (char)(0x80 | (scalar & 0x3F));
    return 4;
}

/* At the opening quote; the unescaped text is at most as long as the escaped one. */
static int parse_string(parser *p, char **out) {
    p->at++;
    size_t start = p->at, end = start;
    while (end < p->length && p->text[end] != '"') end += p->text[end] == '\\' ? 2 : 1;
    if (end >= p->length) return -EBADMSG;
    char *s = malloc(end - start + 1);
    if (!s) return -ENOMEM;
    size_t n = 0;
    while (p->at < end) {
        unsigned char c = (unsigned char)p->text[p->at++];
        if (c < 0x20) { free(s); return -EBADMSG; }
        if (c != '\\') { s[n++] = (char)c; continue; }
        char e = p->text[p->at++];
        unsigned scalar;
        switch (e) {
        case '"': case '\\': case '/': s[n++] = e; break;
        case 'b': s[n++] = '\b'; break;
        case 'f': s[n++] = '\f'; break;
        case 'n': s[n++] = '\n'; break;
        case 'r': s[n++] = '\r'; break;
        case 't': s[n++] = '\t'; break;
        case 'u':
            if (hex4(p, &scalar) < 0) { free(s); return -EBADMSG; }
            if (scalar >= 0xD800 && scalar < 0xDC00) {
                unsigned low;
                if (p->length - p->at < 6 || p->text[p->at] != '\\' || p->text[p->at + 1] != 'u') { free(s); return -EBADMSG; }
                p->at += 2;
                if (hex4(p, &low) < 0 || low < 0xDC00 || low >= 0xE000) { free(s); return -EBADMSG; }
                scalar = 0x10000 + ((scalar - 0xD800) << 10) + (low - 0xDC00);
            } else if (scalar >= 0xDC00 && scalar < 0xE000) {
                free(s);
                return -EBADMSG;
            }
            if (scalar == 0) { free(s); return -EBADMSG; }  /* no NUL inside a C string */
            n += put_utf8(s + n, scalar);
            break;
        default: free(s); return -EBADMSG;
        }
    }
    p->at = end + 1;
    s[n] = 0;
    *out = s;
    return 0;
}

static int parse_value(parser *p, json_value *v, int depth);

static int grow(void **items, size_t size, size_t count, size_t *capacity) {
    if (count < *capacity) return 0;
    size_t next = *capacity ? *capacity * 2 : 4;
    void *grown = realloc(*items, next * size);
    if (!grown) return -ENOMEM;
    *items = grown;
    *capacity = next;
    return 0;
}

static int parse_value(parser *p, json_value *v, int depth) {
    memset(v, 0, sizeof(*v));
    if (depth > MAX_DEPTH) return -EBADMSG;
    skip_space(p);
    if (p->at >= p->length) return -EBADMSG;
    size_t start = p->at;
    char c = p->text[p->at];
    int r = 0;
    if (c == '{' || c == '[') {
        bool object = c == '{';
        size_t capacity = 0, key_capacity = 0;
        v->type = object ? JSON_OBJECT : JSON_ARRAY;
        p->at++;
        skip_space(p);
        if (p->at < p->length && p->text[p->at] == (object ? '}' : ']')) {
            p->at++;
        } else {
            for (;;) {
                skip_space(p);
                if (object) {
                    if (p->at >= p->length || p->text[p->at] != '"') return -EBADMSG;
                    if ((r = grow((void **)&v->keys, sizeof(char *), v->count, &key_capacity)) < 0) return r;
                    if ((r = parse_string(p, &v->keys[v->count])) < 0) return r;
                    skip_space(p);
                    if (p->at >= p->length || p->text[p->at] != ':') { free(v->keys[v->count]); return -EBADMSG; }
                    p->at++;
                }
                if ((r = grow((void **)&v->items, sizeof(json_value), v->count, &capacity)) < 0) {
                    if (object) free(v->keys[v->count]);
                    return r;
                }
                r = parse_value(p, &v->items[v->count], depth + 1);
                v->count++;  /* counted even when it failed: json_free frees what it holds */
                if (r < 0) return r;
                skip_space(p);
                if (p->at >= p->length) return -EBADMSG;
                char next = p->text[p->at++];
                if (next == ',') continue;
                if (next == (object ? '}' : ']')) break;
                return -EBADMSG;
            }
        }
    } else if (c == '"') {
        v->type = JSON_STRING;
        if ((r = parse_string(p, &v->string)) < 0) return r;
    } else if (p->length - p->at >= 4 && memcmp(p->text + p->at, "true", 4) == 0) {
        v->type = JSON_BOOL; v->boolean = true; p->at += 4;
    } else if (p->length - p->at >= 5 && memcmp(p->text + p->at, "false", 5) == 0) {
        v->type = JSON_BOOL; p->at += 5;
    } else if (p->length - p->at >= 4 && memcmp(p->text + p->at, "null", 4) == 0) {
        v->type = JSON_NULL; p->at += 4;
    } else if (c == '-' || (c >= '0' && c <= '9')) {
        char digits[64];
        size_t n = 0;
        while (p->at < p->length && n < sizeof(digits) - 1 && p->text[p->at] && strchr("+-.eE0123456789", p->text[p->at]))
            digits[n++] = p->text[p->at++];
        digits[n] = 0;
        char *end;
        v->type = JSON_NUMBER;
        locale_t c = c_locale();
        if (!c) return -ENOMEM;
        v->number = strtod_l(digits, &end, c);
        if (*end || !isfinite(v->number)) return -EBADMSG;
    } else {
        return -EBADMSG;
    }
    v->text = p->text + start;
    v->text_length = p->at - start;
    return 0;
}

int json_parse(const char *text, size_t length, json_value *out) {
    parser p = {text, length, 0};
    int r = parse_value(&p, out, 0);
    if (r == 0) {
        skip_space(&p);
        if (p.at != p.length) r = -EBADMSG;
    }
    if (r < 0) json_free(out);
    return r;
}

void json_free(json_value *v) {
    if (!v) return;
    free(v->string);
    for (size_t i = 0; i < v->count; i++) {
        if (v->items) json_free(&v->items[i]);
        if (v->keys) free(v->keys[i]);
    }
    free(v->items);
    free(v->keys);
    memset(v, 0, sizeof(*v));
}

const json_value *json_get(const json_value *object, const char *key) {
    if (!object || object->type != JSON_OBJECT) return NULL;
    for (size_t i = 0; i < object->count; i++)
        if (strcmp(object->keys[i], key) == 0) return &object->items[i];
    return NULL;
}

bool json_get_string(const json_value *object, const char *key, const char **out) {
    const json_value *v = json_get(object, key);
    if (!v || v->type != JSON_STRING) return false;
    *out = v->string;
    return true;
}

bool json_get_number(const json_value *object, const char *key, double *out) {
    const json_value *v = json_get(object, key);
    if (!v || v->type != JSON_NUMBER) return false;
    *out = v->number;
    return true;
}

bool json_get_id(const json_value *object, const char *key, uint64_t *out) {
    double number;
    if (!json_get_number(object, key, &number) || number < 1 || number > 9007199254740992.0 || number != floor(number))
        return false;
    *out = (uint64_t)number;
    return true;
}

int json_append_raw(char **buffer, size_t *length, size_t *capacity, const char *s, size_t n) {
    if (*length + n + 1 > *capacity) {
        size_t next = *capacity ? *capacity : 256;
        while (next < *length + n + 1) next *= 2;
        char *grown = realloc(*buffer, next);
        if (!grown) return -ENOMEM;
        *buffer = grown;
        *capacity = next;
    }
    memcpy(*buffer + *length, s, n);
    *length += n;
    (*buffer)[*length] = 0;
    return 0;
}

int json_append_string(char **buffer, size_t *length, size_t *capacity, const char *s) {
    int r = json_append_raw(buffer, length, capacity, "\"", 1);
    for (const unsigned char *c = (const unsigned char *)s; r == 0 && *c; c++) {
        char escaped[8];
        if (*c == '"' || *c == '\\') {
            escaped[0] = '\\'; escaped[1] = (char)*c;
            r = json_append_raw(buffer, length, capacity, escaped, 2);
        } else if (*c < 0x20 || *c == 0x7F) {
            static const char hex[] = "0123456789abcdef";
            memcpy(escaped, "\\u00", 4);
            escaped[4] = hex[*c >> 4]; escaped[5] = hex[*c & 15];
            r = json_append_raw(buffer, length, capacity, escaped, 6);
        } else {
            r = json_append_raw(buffer, length, capacity, (const char *)c, 1);
        }
    }
    return r < 0 ? r : json_append_raw(buffer, length, capacity, "\"", 1);
}
