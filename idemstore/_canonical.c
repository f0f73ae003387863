/* The compiled fast path of idemstore.hashing: RFC 8785 (JCS) text of a plain JSON value.
 *
 * canonical_json(value) returns the UTF-8 bytes of the canonical form when the value is built
 * only of exact dict (exact str keys), list, tuple, str, int within +-2**53, finite float,
 * bool and None, nested at most 256 deep; for anything else (subclasses, other objects,
 * larger integers, NaN and infinities, lone surrogates, deeper nesting) it returns None and
 * idemstore.hashing's Python pass decides: the extension, the error and its path stay there.
 * So this file only has to be right on the plain domain, and is checked there byte for byte
 * against rfc8785 and against the Python pass (tests/test_hashing.py runs both).
 *
 * No Python code runs while a value is walked (no comparison, conversion or allocation hook
 * of a plain type calls back into Python), so the containers cannot change under the walk.
 */

#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* Deeper values go to the Python pass (whose own limit is 1000). Kept well under it: a level
 * costs this walk C stack, and a thread's stack can be small (128 KiB on musl). */
#define MAX_DEPTH 256
/* Integers of at most this magnitude are written as their digits (a double holds them). */
#define EXACT_INT (((long long)1) << 53)

enum { WRITTEN = 0, NOT_PLAIN = 1, FAILED = -1 };

typedef struct {
    char *data;
    Py_ssize_t length;
    Py_ssize_t capacity;
} Text;

static int
reserve(Text *text, Py_ssize_t more)
{
    if (text->length + more <= text->capacity) {
        return WRITTEN;
    }
    Py_ssize_t capacity = text->capacity * 2;
    while (capacity < text->length + more) {
        capacity *= 2;
    }
    char *data = PyMem_Realloc(text->data, (size_t)capacity);
    if (data == NULL) {
        PyErr_NoMemory();
        return FAILED;
    }
    text->data = data;
    text->capacity = capacity;
    return WRITTEN;
}

static int
append(Text *text, const char *bytes, Py_ssize_t count)
{
    if (reserve(text, count) < 0) {
        return FAILED;
    }
    memcpy(text->data + text->length, bytes, (size_t)count);
    text->length += count;
    return WRITTEN;
}

/* -- strings ------------------------------------------------------------------------------ */

static const char HEX[] = "0123456789abcdef";

/* Writes the escape JCS uses for an ASCII character that needs one; returns its length. */
static int
escape(char *out, Py_UCS4 c)
{
    out[0] = '\\';
    switch (c) {
    case '"': out[1] = '"'; return 2;
    case '\\': out[1] = '\\'; return 2;
    case '\b': out[1] = 'b'; return 2;
    case '\t': out[1] = 't'; return 2;
    case '\n': out[1] = 'n'; return 2;
    case '\f': out[1] = 'f'; return 2;
    case '\r': out[1] = 'r'; return 2;
    default:
        out[1] = 'u';
        out[2] = '0';
        out[3] = '0';
        out[4] = HEX[c >> 4];
        out[5] = HEX[c & 0xf];
        return 6;
    }
}

static inline int
needs_escape(Py_UCS4 c)
{
    return c < 0x20 || c == '"' || c == '\\';
}

static int
write_ascii(Text *text, const unsigned char *chars, Py_ssize_t count)
{
    /* Six bytes per character at worst, plus the quotes. */
    if (reserve(text, count * 6 + 2) < 0) {
        return FAILED;
    }
    char *out = text->data + text->length;
    *out++ = '"';
    Py_ssize_t start = 0;
    for (Py_ssize_t i = 0; i < count; i++) {
        if (needs_escape(chars[i])) {
            memcpy(out, chars + start, (size_t)(i - start));
            out += i - start;
            out += escape(out, chars[i]);
            start = i + 1;
        }
    }
    memcpy(out, chars + start, (size_t)(count - start));
    out += count - start;
    *out++ = '"';
    text->length = out - text->data;
    return WRITTEN;
}

/* Any str: UTF-8, escaping what JCS escapes. NOT_PLAIN on a lone surrogate. */
static int
write_str(Text *text, PyObject *string)
{
#if PY_VERSION_HEX < 0x030C0000
    if (PyUnicode_READY(string) < 0) {
        return FAILED;
    }
#endif
    Py_ssize_t count = PyUnicode_GET_LENGTH(string);
    if (PyUnicode_IS_ASCII(string)) {
        return write_ascii(text, PyUnicode_1BYTE_DATA(string), count);
    }
    int kind = PyUnicode_KIND(string);
    const void *data = PyUnicode_DATA(string);
    if (reserve(text, count * 6 + 2) < 0) {
        return FAILED;
    }
    char *out = text->data + text->length;
    *out++ = '"';
    for (Py_ssize_t i = 0; i < count; i++) {
        Py_UCS4 c = PyUnicode_READ(kind, data, i);
        if (c < 0x80) {
            if (needs_escape(c)) {
                out += escape(out, c);
            }
            else {
                *out++ = (char)c;
            }
        }
        else if (c < 0x800) {
            *out++ = (char)(0xc0 | (c >> 6));
            *out++ = (char)(0x80 | (c & 0x3f));
        }
        else if (c < 0x10000) {
            if (c >= 0xd800 && c <= 0xdfff) {
                return NOT_PLAIN;
            }
            *out++ = (char)(0xe0 | (c >> 12));
            *out++ = (char)(0x80 | ((c >> 6) & 0x3f));
            *out++ = (char)(0x80 | (c & 0x3f));
        }
        else {
            *out++ = (char)(0xf0 | (c >> 18));
            *out++ = (char)(0x80 | ((c >> 12) & 0x3f));
            *out++ = (char)(0x80 | ((c >> 6) & 0x3f));
            *out++ = (char)(0x80 | (c & 0x3f));
        }
    }
    *out++ = '"';
    text->length = out - text->data;
    return WRITTEN;
}

/* -- numbers ------------------------------------------------------------------------------ */

static int
write_int(Text *text, long long value)
{
    char digits[24];
    int count = snprintf(digits, sizeof digits, "%lld", value);
    return append(text, digits, count);
}

/* ECMAScript's Number.prototype.toString of a finite, non-zero double (RFC 8785 3.2.2.3),
 * laid out from the shortest round-tripping digits, which repr computes too. */
static int
write_double(Text *text, double value)
{
    char *shortest = PyOS_double_to_string(value, 'r', 0, 0, NULL);
    if (shortest == NULL) {
        return FAILED;
    }
    /* shortest is [-]digits[.digits][e(+|-)digits]: gather the significant digits and the
     * power n for which the value is 0.DIGITS * 10**n. */
    char digits[32];
    int k = 0;
    int n = 0;
    int before_point = 1;
    int negative = 0;
    const char *p = shortest;
    if (*p == '-') {
        negative = 1;
        p++;
    }
    for (; *p != '\0' && *p != 'e'; p++) {
        if (*p == '.') {
            before_point = 0;
        }
        else if (k == 0 && *p == '0') {
            if (!before_point) {
                n--; /* a leading zero after the point: 0.00DIGITS */
            }
        }
        else if (k < (int)sizeof digits) {
            digits[k++] = *p;
            if (before_point) {
                n++;
            }
        }
    }
    if (*p == 'e') {
        n += atoi(p + 1);
    }
    PyMem_Free(shortest);
    while (k > 1 && digits[k - 1] == '0') {
        k--;
    }

    char out[48];
    int length = 0;
    if (negative) {
        out[length++] = '-';
    }
    if (k <= n && n <= 21) {
        memcpy(out + length, digits, (size_t)k);
        length += k;
        memset(out + length, '0', (size_t)(n - k));
        length += n - k;
    }
    else if (0 < n && n <= 21) {
        memcpy(out + length, digits, (size_t)n);
        length += n;
        out[length++] = '.';
        memcpy(out + length, digits + n, (size_t)(k - n));
        length += k - n;
    }
    else if (-6 < n && n <= 0) {
        out[length++] = '0';
        out[length++] = '.';
        memset(out + length, '0', (size_t)-n);
        length += -n;
        memcpy(out + length, digits, (size_t)k);
        length += k;
    }
    else {
        out[length++] = digits[0];
        if (k > 1) {
            out[length++] = '.';
            memcpy(out + length, digits + 1, (size_t)(k - 1));
            length += k - 1;
        }
        int e = n - 1;
        length += snprintf(out + length, sizeof out - (size_t)length, "e%c%d",
                           e < 0 ? '-' : '+', e < 0 ? -e : e);
    }
    return append(text, out, length);
}

/* -- objects ------------------------------------------------------------------------------ */

/* A code point's rank in UTF-16 code-unit order: past U+FFFF the first unit is a high
 * surrogate, so U+E000-U+FFFF sort after every supplementary character (lone surrogates are
 * not plain). */
static inline Py_UCS4
utf16_rank(Py_UCS4 c)
{
    return c >= 0xe000 && c <= 0xffff ? c + 0x110000 : c;
}

static int
utf16_compare(const void *left_member, const void *right_member)
{
    PyObject *left = ((PyObject *const *)left_member)[0];
    PyObject *right = ((PyObject *const *)right_member)[0];
    Py_ssize_t left_length = PyUnicode_GET_LENGTH(left);
    Py_ssize_t right_length = PyUnicode_GET_LENGTH(right);
    Py_ssize_t shorter = left_length < right_length ? left_length : right_length;
    int left_kind = PyUnicode_KIND(left);
    int right_kind = PyUnicode_KIND(right);
    const void *left_data = PyUnicode_DATA(left);
    const void *right_data = PyUnicode_DATA(right);
    if (left_kind == PyUnicode_1BYTE_KIND && right_kind == PyUnicode_1BYTE_KIND) {
        int order = memcmp(left_data, right_data, (size_t)shorter);
        if (order != 0) {
            return order;
        }
    }
    else {
        for (Py_ssize_t i = 0; i < shorter; i++) {
            Py_UCS4 a = PyUnicode_READ(left_kind, left_data, i);
            Py_UCS4 b = PyUnicode_READ(right_kind, right_data, i);
            if (a != b) {
                return utf16_rank(a) < utf16_rank(b) ? -1 : 1;
            }
        }
    }
    return left_length < right_length ? -1 : left_length > right_length;
}

static int write_value(Text *text, PyObject *value, int depth);

/* Members are (key, value) pairs, sorted by key. */
static int
write_dict(Text *text, PyObject *dict, int depth)
{
    Py_ssize_t count = PyDict_GET_SIZE(dict);
    if (count == 0) {
        return append(text, "{}", 2);
    }
    /* On the heap, not the stack: see MAX_DEPTH. */
    PyObject **members = PyMem_Malloc(sizeof(PyObject *) * 2 * (size_t)count);
    if (members == NULL) {
        PyErr_NoMemory();
        return FAILED;
    }
    int status = WRITTEN;
    Py_ssize_t position = 0;
    PyObject *key;
    PyObject *item;
    Py_ssize_t i = 0;
    while (PyDict_Next(dict, &position, &key, &item)) {
        if (!PyUnicode_CheckExact(key)) {
            status = NOT_PLAIN;
            goto done;
        }
#if PY_VERSION_HEX < 0x030C0000
        /* 3.11 can still hold a legacy string whose compact form is not built yet. */
        if (PyUnicode_READY(key) < 0) {
            status = FAILED;
            goto done;
        }
#endif
        members[2 * i] = key;
        members[2 * i + 1] = item;
        i++;
    }
    if (count > 1) {
        qsort(members, (size_t)count, 2 * sizeof(PyObject *), utf16_compare);
    }
    for (i = 0; i < count; i++) {
        if ((status = append(text, i == 0 ? "{" : ",", 1)) != WRITTEN ||
            (status = write_str(text, members[2 * i])) != WRITTEN ||
            (status = append(text, ":", 1)) != WRITTEN ||
            (status = write_value(text, members[2 * i + 1], depth)) != WRITTEN) {
            goto done;
        }
    }
    status = append(text, "}", 1);
done:
    PyMem_Free(members);
    return status;
}

static int
write_items(Text *text, PyObject *const *items, Py_ssize_t count, int depth)
{
    if (count == 0) {
        return append(text, "[]", 2);
    }
    int status;
    for (Py_ssize_t i = 0; i < count; i++) {
        if ((status = append(text, i == 0 ? "[" : ",", 1)) != WRITTEN ||
            (status = write_value(text, items[i], depth)) != WRITTEN) {
            return status;
        }
    }
    return append(text, "]", 1);
}

static int
write_value(Text *text, PyObject *value, int depth)
{
    PyTypeObject *type = Py_TYPE(value);
    if (type == &PyUnicode_Type) {
        return write_str(text, value);
    }
    if (type == &PyFloat_Type) {
        double number = PyFloat_AS_DOUBLE(value);
        if (!isfinite(number)) {
            return NOT_PLAIN;
        }
        if (number == 0.0) {
            return append(text, "0", 1); /* -0 too */
        }
        return write_double(text, number);
    }
    if (type == &PyLong_Type) {
        int overflow;
        long long number = PyLong_AsLongLongAndOverflow(value, &overflow);
        if (overflow || number > EXACT_INT || number < -EXACT_INT) {
            return NOT_PLAIN;
        }
        if (number == -1 && PyErr_Occurred()) {
            return FAILED;
        }
        return write_int(text, number);
    }
    if (value == Py_True) {
        return append(text, "true", 4);
    }
    if (value == Py_False) {
        return append(text, "false", 5);
    }
    if (value == Py_None) {
        return append(text, "null", 4);
    }
    if (depth >= MAX_DEPTH) {
        return NOT_PLAIN;
    }
    if (type == &PyDict_Type) {
        return write_dict(text, value, depth + 1);
    }
    if (type == &PyList_Type) {
        return write_items(text, PySequence_Fast_ITEMS(value), PyList_GET_SIZE(value), depth + 1);
    }
    if (type == &PyTuple_Type) {
        return write_items(text, PySequence_Fast_ITEMS(value), PyTuple_GET_SIZE(value), depth + 1);
    }
    return NOT_PLAIN;
}

static PyObject *
canonical_json(PyObject *module, PyObject *value)
{
    (void)module;
    Text text = {PyMem_Malloc(256), 0, 256};
    if (text.data == NULL) {
        return PyErr_NoMemory();
    }
    int status = write_value(&text, value, 0);
    PyObject *result = NULL;
    if (status == WRITTEN) {
        result = PyBytes_FromStringAndSize(text.data, text.length);
    }
    else if (status == NOT_PLAIN) {
        result = Py_NewRef(Py_None);
    }
    PyMem_Free(text.data);
    return result;
}

static PyMethodDef methods[] = {
    {"canonical_json", canonical_json, METH_O,
     "The RFC 8785 bytes of a plain JSON value, or None for anything idemstore.hashing's "
     "Python pass must decide."},
    {NULL, NULL, 0, NULL},
};

static PyModuleDef_Slot slots[] = {
#ifdef Py_mod_multiple_interpreters
    {Py_mod_multiple_interpreters, Py_MOD_PER_INTERPRETER_GIL_SUPPORTED},
#endif
    {0, NULL},
};

static struct PyModuleDef module_definition = {
    PyModuleDef_HEAD_INIT,
    .m_name = "idemstore._canonical",
    .m_doc = "The compiled fast path of idemstore.hashing (optional; see that module).",
    .m_size = 0,
    .m_methods = methods,
    .m_slots = slots,
};

PyMODINIT_FUNC
PyInit__canonical(void)
{
    return PyModuleDef_Init(&module_definition);
}
