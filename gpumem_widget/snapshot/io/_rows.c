/* A pickle reader for memory snapshots that turns trace entries into columns.
 *
 * CPython's unpickler builds a dict (and int objects) for every trace entry; at millions of
 * entries that is most of the time and memory a conversion takes. This reader runs the same
 * data-only subset of the pickle machine (protocols 2 to 5, no globals), building every object
 * the way the unpickler does, except:
 * - a dict given an 'action' key becomes a row of columns (ints, string ids, its frames list),
 *   and the list that holds such rows stays empty, named with their range;
 * - a list is built only when something needs it: until then it is a run of ids of its items,
 *   which is all a row needs of its frames list (the frame dicts are shared objects, built once);
 * - a short string is decoded once and shared (the unpickler makes one per occurrence).
 * Anything it does not read exactly as the unpickler would (another opcode, an entry reached
 * twice through the memo, a field of an unexpected type, a corrupt byte) raises `Unsupported`,
 * and the caller reads the file with the unpickler.
 *
 * The input is untrusted: every read is bounds-checked, the stacks and the memo are checked,
 * and nothing the data names is ever called.
 *
 * One file of about 1,100 lines, past the package's 600: it is one machine (the opcode loop,
 * its stack and memo, the row builder and the column table share its static state) compiled
 * as one extension module, `_rows`, by hatch_build.py.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#ifndef SOURCE_DIGEST
#define SOURCE_DIGEST "unknown"
#endif

static PyObject *Unsupported;
static PyObject *EMPTY_STR; /* an absent user_metadata or compile_context reads as '' */

/* -- values on the stack and in the memo ------------------------------------------------- */

enum { K_EMPTY = 0, K_OBJ, K_INT, K_ROW, K_LIST };

typedef struct {
    union {
        PyObject *o; /* owned reference (K_OBJ) */
        int64_t i; /* an int not made into an object yet (K_INT), a row number (K_ROW), a list's
                    * number (K_LIST) */
    };
    uint32_t kind;
    uint32_t slot; /* on the stack, a dict's memo slot + 1 (0: none), to hand it to its row */
} Val;

static void val_clear(Val *v) {
    if (v->kind == K_OBJ) Py_DECREF(v->o);
    v->kind = K_EMPTY;
}

/* -- the fields of a trace entry --------------------------------------------------------- */

enum {
    F_ACTION, F_ADDR, F_SIZE, F_STREAM, F_TIME_US, F_DEVICE_FREE, F_FRAMES, F_USER_METADATA,
    F_COMPILE_CONTEXT, N_FIELDS, F_OTHER = N_FIELDS, F_NOT_STR
};
static const char *FIELD_NAMES[N_FIELDS] = {
    "action", "addr", "size", "stream", "time_us", "device_free", "frames", "user_metadata",
    "compile_context",
};
#define N_INTS 5 /* F_ADDR .. F_DEVICE_FREE */
#define N_STRS 2 /* F_USER_METADATA, F_COMPILE_CONTEXT (and the action, kept apart) */

/* A growing array kept in a bytearray, handed to Python as it is (no copy). */
typedef struct {
    PyObject *bytes;
    char *data;
    size_t len, cap, item;
} Column;

/* Room for about as many items as the input can hold (see COLUMNS), so the columns are seldom
 * copied to grow; pages are touched only as items fill them. */
static int col_reserve(Column *c, size_t cap) {
    c->bytes = PyByteArray_FromStringAndSize(NULL, (Py_ssize_t)(cap * c->item));
    if (!c->bytes) return -1;
    c->data = PyByteArray_AS_STRING(c->bytes);
    c->cap = cap;
    return 0;
}

static int col_grow(Column *c) {
    size_t cap = c->cap * 2;
    if (PyByteArray_Resize(c->bytes, (Py_ssize_t)(cap * c->item)) < 0) return -1;
    c->data = PyByteArray_AS_STRING(c->bytes);
    c->cap = cap;
    return 0;
}

/* One value at the end of a column of its type (inlined: a row pushes a dozen). */
#define COL_PUSH(name, type)                                                                   \
    static inline int name(Column *c, type x) {                                                \
        if (c->len == c->cap && col_grow(c) < 0) return -1;                                   \
        ((type *)c->data)[c->len++] = x;                                                       \
        return 0;                                                                              \
    }
COL_PUSH(push_i64, int64_t)
COL_PUSH(push_i32, int32_t)
COL_PUSH(push_u16, uint16_t)

/* Strings interned by content, numbered in order of first appearance. */
typedef struct {
    PyObject *ids;   /* str -> int */
    PyObject *order; /* list of str */
} Strings;

/* The string a field had in the last row (owned), and its id: most rows repeat it. */
typedef struct {
    PyObject *str;
    int32_t id;
} Last;

static int32_t strings_lookup(Strings *s, PyObject *str) {
    PyObject *got = PyDict_GetItemWithError(s->ids, str);
    if (got) return (int32_t)PyLong_AsLong(got);
    if (PyErr_Occurred()) return -1;
    Py_ssize_t n = PyList_GET_SIZE(s->order);
    if (n >= INT32_MAX) return -1;
    PyObject *id = PyLong_FromSsize_t(n);
    if (!id) return -1;
    int bad = PyDict_SetItem(s->ids, str, id) < 0 || PyList_Append(s->order, str) < 0;
    Py_DECREF(id);
    return bad ? -1 : (int32_t)n;
}

static int32_t strings_id(Strings *s, Last *last, PyObject *str) {
    if (str == last->str) return last->id;
    int32_t id = strings_lookup(s, str);
    if (id >= 0) {
        Py_XSETREF(last->str, Py_NewRef(str));
        last->id = id;
    }
    return id;
}

/* Short strings by their UTF-8 bytes: each is decoded once and shared (the unpickler makes
 * one object per occurrence: a 'N/A' per entry, a million of them). */
#define SHORT_STR 64
typedef struct {
    uint64_t hash;
    const uint8_t *bytes; /* in the input, which outlives the table */
    Py_ssize_t len;
    PyObject *str; /* owned */
} StrSlot;

typedef struct {
    StrSlot *slots;
    size_t cap, n; /* cap: a power of two, at most half full */
} ShortStrings;

/* Objects by identity, numbered as first seen; `objects` holds them, so no address is reused
 * by another object while the reader runs. */
typedef struct {
    PyObject **keys;
    int32_t *ids;
    size_t cap; /* a power of two, at most half full */
    PyObject *objects;
} Objects;

/* A list as its items' ids (items[start:start + len]) until something needs the list itself
 * (obj, owned, from then on). `frames`: the frames list number rows know it by, -1 until a row
 * takes it as its frames; after that it may not change. */
typedef struct {
    int64_t start, len;
    PyObject *obj;
    int32_t frames;
} List;

/* A list the rows [start, end) were appended to. */
typedef struct {
    PyObject *list; /* owned */
    int64_t start, end;
} RowList;

#define MAX_ROW_LISTS 4096

typedef struct {
    const uint8_t *buf;
    Py_ssize_t len, pos;
    Py_ssize_t frame_end; /* where the current frame ends (protocol 4 and later) */

    Val *stack;
    Py_ssize_t sp, stack_cap;
    Py_ssize_t *marks;
    Py_ssize_t nmarks, marks_cap;

    Val *memo;
    Py_ssize_t memo_cap, memo_len; /* memo_len: filled slots, as the unpickler counts them */
    Py_ssize_t memo_hint;          /* its first size: a real pickle memoizes every 30 bytes or so */

    int64_t rows;
    Column ints[N_INTS];     /* int64 each */
    Column present;          /* uint16 each: which fields the row has */
    Column action;           /* int32 string ids */
    Column strs[N_STRS];     /* int32 string ids */
    Column frames;           /* int32: the row's frames list, -1 where it has none */
    Column frames_at, frames_len, frames_first; /* int64 each frames list: its items, its first row */
    Strings actions, texts;  /* the action names; user metadata and compile contexts */
    Last last[1 + N_STRS];   /* the action's, then the texts' */

    RowList *row_lists;
    Py_ssize_t n_row_lists, row_lists_cap;

    ShortStrings short_strs;
    Objects objs;
    Column items; /* int32 ids of the lists' items, as they were appended */
    List *lists;
    Py_ssize_t n_lists, lists_cap;
    int64_t copied; /* items copied for frames that were a tuple or a built list */

    struct { PyObject **keys; int8_t *fields; size_t cap, n; } key_fields; /* what each key is */

    PyObject *progress;
    Py_ssize_t next_report;
} Reader;

/* Every column: its name in the results, where it is in the Reader, its item size, and the
 * input bytes per item its first size allows for (a real entry takes 80 bytes or more, an item
 * of a list 2 or more). */
#define COLUMN(name, field, type, bytes_per) {name, offsetof(Reader, field), sizeof(type), bytes_per}
static const struct {
    const char *name;
    size_t at, item, bytes_per;
} COLUMNS[] = {
    COLUMN("addr", ints[0], int64_t, 96),
    COLUMN("size", ints[1], int64_t, 96),
    COLUMN("stream", ints[2], int64_t, 96),
    COLUMN("time_us", ints[3], int64_t, 96),
    COLUMN("device_free", ints[4], int64_t, 96),
    COLUMN("present", present, uint16_t, 96),
    COLUMN("action", action, int32_t, 96),
    COLUMN("user_metadata", strs[0], int32_t, 96),
    COLUMN("compile_context", strs[1], int32_t, 96),
    COLUMN("frames", frames, int32_t, 96),
    COLUMN("frames_at", frames_at, int64_t, 96),
    COLUMN("frames_len", frames_len, int64_t, 96),
    COLUMN("frames_first", frames_first, int64_t, 96),
    COLUMN("items", items, int32_t, 8),
};
#define N_COLUMNS (sizeof COLUMNS / sizeof *COLUMNS)

static Column *column(Reader *r, size_t k) {
    return (Column *)((char *)r + COLUMNS[k].at);
}

#define REPORT_EVERY (8 << 20)

static int unsupported(const char *why) {
    if (!PyErr_Occurred()) PyErr_SetString(Unsupported, why);
    return -1;
}

/* -- stack, marks, memo ------------------------------------------------------------------ */

static int stack_grow(Reader *r) {
    Py_ssize_t cap = r->stack_cap ? r->stack_cap * 2 : 256;
    Val *p = PyMem_RawRealloc(r->stack, cap * sizeof(Val));
    if (!p) {
        PyErr_NoMemory();
        return -1;
    }
    r->stack = p;
    r->stack_cap = cap;
    return 0;
}

/* Field by field: a whole Val stored and loaded back stalls the store buffer. */
static inline int push_val(Reader *r, uint32_t kind, PyObject *o, int64_t i) {
    if (r->sp == r->stack_cap && stack_grow(r) < 0) {
        if (kind == K_OBJ) Py_DECREF(o);
        return -1;
    }
    Val *v = &r->stack[r->sp++];
    if (kind == K_OBJ) v->o = o;
    else v->i = i;
    v->kind = kind;
    v->slot = 0;
    return 0;
}

static inline int push_obj(Reader *r, PyObject *o) {
    if (!o) return -1;
    return push_val(r, K_OBJ, o, 0);
}

static inline int push_int(Reader *r, int64_t i) {
    return push_val(r, K_INT, NULL, i);
}

static Py_ssize_t pop_mark(Reader *r) {
    if (r->nmarks == 0) return unsupported("no mark on the stack");
    Py_ssize_t m = r->marks[--r->nmarks];
    if (m > r->sp) return unsupported("a mark above the stack");
    return m;
}

static int push_mark(Reader *r) {
    if (r->nmarks == r->marks_cap) {
        Py_ssize_t cap = r->marks_cap ? r->marks_cap * 2 : 64;
        Py_ssize_t *p = PyMem_RawRealloc(r->marks, cap * sizeof(Py_ssize_t));
        if (!p) {
            PyErr_NoMemory();
            return -1;
        }
        r->marks = p;
        r->marks_cap = cap;
    }
    r->marks[r->nmarks++] = r->sp;
    return 0;
}

/* The value as an object (a new reference); a row cannot become one. */
static PyObject *list_object(Reader *r, List *l);

static PyObject *as_object(Reader *r, const Val *v) {
    if (v->kind == K_OBJ) {
        Py_INCREF(v->o);
        return v->o;
    }
    if (v->kind == K_INT) return PyLong_FromLongLong(v->i);
    if (v->kind == K_LIST) return Py_XNewRef(list_object(r, &r->lists[v->i]));
    unsupported(v->kind == K_ROW ? "a trace entry used as a value elsewhere" : "an empty value");
    return NULL;
}

/* The unpickler's slots grow on demand; an index far past the filled ones is refused here
 * rather than allocated (a real pickle numbers its slots in order). */
static int memo_put(Reader *r, Py_ssize_t idx) {
    if (r->sp == 0) return unsupported("memoizing an empty stack");
    if (idx < 0 || idx > r->memo_len + (1 << 20)) return unsupported("a memo index out of range");
    if (idx >= r->memo_cap) {
        Py_ssize_t cap = r->memo_cap ? r->memo_cap : r->memo_hint;
        while (cap <= idx) cap *= 2;
        Val *p = PyMem_RawRealloc(r->memo, cap * sizeof(Val));
        if (!p) {
            PyErr_NoMemory();
            return -1;
        }
        memset(p + r->memo_cap, 0, (cap - r->memo_cap) * sizeof(Val));
        r->memo = p;
        r->memo_cap = cap;
    }
    Val *slot = &r->memo[idx];
    if (slot->kind == K_EMPTY) r->memo_len++;
    else val_clear(slot);
    Val *top = &r->stack[r->sp - 1];
    *slot = *top;
    slot->slot = 0;
    if (slot->kind == K_OBJ) {
        Py_INCREF(slot->o);
        if (PyDict_CheckExact(top->o) && idx < UINT32_MAX) top->slot = (uint32_t)idx + 1;
    }
    return 0;
}

static int memo_get(Reader *r, Py_ssize_t idx) {
    if (idx < 0 || idx >= r->memo_cap || r->memo[idx].kind == K_EMPTY)
        return unsupported("a memo index never set");
    const Val *v = &r->memo[idx];
    if (v->kind == K_ROW) return unsupported("a trace entry referenced twice");
    if (v->kind == K_OBJ) return push_val(r, K_OBJ, Py_NewRef(v->o), 0);
    return push_val(r, v->kind, NULL, v->i);
}

/* -- objects and lists -------------------------------------------------------------------- */

static int objs_grow(Objects *t) {
    size_t cap = t->cap ? t->cap * 2 : 1024;
    PyObject **keys = PyMem_RawCalloc(cap, sizeof(PyObject *));
    int32_t *ids = PyMem_RawMalloc(cap * sizeof(int32_t));
    if (!keys || !ids) {
        PyMem_RawFree(keys);
        PyMem_RawFree(ids);
        PyErr_NoMemory();
        return -1;
    }
    for (size_t k = 0; k < t->cap; k++) {
        if (!t->keys[k]) continue;
        size_t h = ((uintptr_t)t->keys[k] >> 4) * 0x9E3779B97F4A7C15ull & (cap - 1);
        while (keys[h]) h = (h + 1) & (cap - 1);
        keys[h] = t->keys[k];
        ids[h] = t->ids[k];
    }
    PyMem_RawFree(t->keys);
    PyMem_RawFree(t->ids);
    t->keys = keys;
    t->ids = ids;
    t->cap = cap;
    return 0;
}

/* The id of object `o` (borrowed), numbering it if it is new. */
static int32_t obj_id(Reader *r, PyObject *o) {
    Objects *t = &r->objs;
    size_t h = ((uintptr_t)o >> 4) * 0x9E3779B97F4A7C15ull & (t->cap - 1);
    for (; t->keys[h]; h = (h + 1) & (t->cap - 1))
        if (t->keys[h] == o) return t->ids[h];
    Py_ssize_t n = PyList_GET_SIZE(t->objects);
    if (n >= INT32_MAX) return unsupported("too many objects");
    if (PyList_Append(t->objects, o) < 0) return -1;
    t->keys[h] = o;
    t->ids[h] = (int32_t)n;
    if ((size_t)n + 1 > t->cap / 2 && objs_grow(t) < 0) return -1;
    return (int32_t)n;
}

static int push_list(Reader *r) {
    if (r->n_lists == r->lists_cap) {
        Py_ssize_t cap = r->lists_cap ? r->lists_cap * 2 : 4096;
        List *p = PyMem_RawRealloc(r->lists, cap * sizeof(List));
        if (!p) {
            PyErr_NoMemory();
            return -1;
        }
        r->lists = p;
        r->lists_cap = cap;
    }
    List *l = &r->lists[r->n_lists];
    l->start = (int64_t)r->items.len;
    l->len = 0;
    l->obj = NULL;
    l->frames = -1;
    return push_val(r, K_LIST, NULL, r->n_lists++);
}

/* The list itself (borrowed), built from its items the first time it is needed. */
static PyObject *list_object(Reader *r, List *l) {
    if (l->obj) return l->obj;
    PyObject *obj = PyList_New((Py_ssize_t)l->len);
    if (!obj) return NULL;
    const int32_t *ids = (const int32_t *)r->items.data + l->start;
    for (int64_t k = 0; k < l->len; k++)
        PyList_SET_ITEM(obj, (Py_ssize_t)k, Py_NewRef(PyList_GET_ITEM(r->objs.objects, ids[k])));
    l->obj = obj;
    return obj;
}

/* -- reading bytes ------------------------------------------------------------------------ */

static inline const uint8_t *take(Reader *r, Py_ssize_t n) {
    if (n < 0 || r->len - r->pos < n) {
        unsupported("truncated");
        return NULL;
    }
    /* The unpickler reads a frame whole, then the file again: bytes that run past the end of
     * a frame are read as truncated. */
    if (r->pos < r->frame_end && r->frame_end - r->pos < n) {
        unsupported("an opcode across the end of a frame");
        return NULL;
    }
    const uint8_t *p = r->buf + r->pos;
    r->pos += n;
    return p;
}

static uint64_t le(const uint8_t *p, int n) {
    uint64_t x = 0;
    for (int k = n - 1; k >= 0; k--) x = (x << 8) | p[k];
    return x;
}

/* A little-endian two's complement int of n bytes, if it fits an int64. */
static int read_long(Reader *r, Py_ssize_t n) {
    const uint8_t *p = take(r, n);
    if (!p) return -1;
    if (n == 0) return push_int(r, 0);
    if (n > 8) return unsupported("an int wider than 64 bits");
    uint64_t x = le(p, (int)n);
    if (n < 8 && (p[n - 1] & 0x80)) x |= ~(uint64_t)0 << (8 * n); /* sign-extend */
    return push_int(r, (int64_t)x);
}

static int short_strs_grow(ShortStrings *t) {
    size_t cap = t->cap ? t->cap * 2 : 256;
    StrSlot *slots = PyMem_RawCalloc(cap, sizeof(StrSlot));
    if (!slots) {
        PyErr_NoMemory();
        return -1;
    }
    for (size_t k = 0; k < t->cap; k++) {
        if (!t->slots[k].str) continue;
        size_t h = t->slots[k].hash & (cap - 1);
        while (slots[h].str) h = (h + 1) & (cap - 1);
        slots[h] = t->slots[k];
    }
    PyMem_RawFree(t->slots);
    t->slots = slots;
    t->cap = cap;
    return 0;
}

/* The string of UTF-8 bytes p[:n] (a new reference), decoded as the unpickler decodes it. */
static PyObject *read_short_str(Reader *r, const uint8_t *p, Py_ssize_t n) {
    ShortStrings *t = &r->short_strs;
    uint64_t hash = 0xcbf29ce484222325ull; /* FNV-1a */
    for (Py_ssize_t k = 0; k < n; k++) hash = (hash ^ p[k]) * 0x100000001b3ull;
    size_t h = hash & (t->cap - 1);
    for (; t->slots[h].str; h = (h + 1) & (t->cap - 1)) {
        StrSlot *s = &t->slots[h];
        if (s->hash == hash && s->len == n && memcmp(s->bytes, p, (size_t)n) == 0)
            return Py_NewRef(s->str);
    }
    PyObject *str = PyUnicode_DecodeUTF8((const char *)p, n, "surrogatepass");
    if (!str) return NULL;
    t->slots[h] = (StrSlot){.hash = hash, .bytes = p, .len = n, .str = Py_NewRef(str)};
    if (++t->n > t->cap / 2 && short_strs_grow(t) < 0) {
        Py_DECREF(str);
        return NULL;
    }
    return str;
}

static int read_str(Reader *r, Py_ssize_t n) {
    const uint8_t *p = take(r, n);
    if (!p) return -1;
    if (n <= SHORT_STR) return push_obj(r, read_short_str(r, p, n));
    return push_obj(r, PyUnicode_DecodeUTF8((const char *)p, n, "surrogatepass"));
}

static int read_bytes(Reader *r, Py_ssize_t n) {
    const uint8_t *p = take(r, n);
    if (!p) return -1;
    return push_obj(r, PyBytes_FromStringAndSize((const char *)p, n));
}

static inline Py_ssize_t read_size(Reader *r, int n) {
    const uint8_t *p = take(r, n);
    if (!p) return -1;
    uint64_t x = le(p, n);
    if (x > (uint64_t)PY_SSIZE_T_MAX) return unsupported("a length out of range");
    return (Py_ssize_t)x;
}

/* -- rows --------------------------------------------------------------------------------- */

static int key_fields_grow(Reader *r) {
    size_t cap = r->key_fields.cap ? r->key_fields.cap * 2 : 64;
    PyObject **keys = PyMem_RawCalloc(cap, sizeof(PyObject *));
    int8_t *fields = PyMem_RawMalloc(cap);
    if (!keys || !fields) {
        PyMem_RawFree(keys);
        PyMem_RawFree(fields);
        PyErr_NoMemory();
        return -1;
    }
    for (size_t k = 0; k < r->key_fields.cap; k++) {
        PyObject *key = r->key_fields.keys[k];
        if (!key) continue;
        size_t h = ((uintptr_t)key >> 4) * 0x9E3779B97F4A7C15ull >> 40 & (cap - 1);
        while (keys[h]) h = (h + 1) & (cap - 1);
        keys[h] = key;
        fields[h] = r->key_fields.fields[k];
    }
    PyMem_RawFree(r->key_fields.keys);
    PyMem_RawFree(r->key_fields.fields);
    r->key_fields.keys = keys;
    r->key_fields.fields = fields;
    r->key_fields.cap = cap;
    return 0;
}

/* Which field a dict key names (F_OTHER: none; F_NOT_STR: not a string; -1: an error). Keys
 * are shared strings (interned or memoized), so each is compared with the names once; the
 * table holds them, so an address is never reused by another string meanwhile. */
static int field_of(Reader *r, const Val *key) {
    if (key->kind != K_OBJ || !PyUnicode_CheckExact(key->o)) return F_NOT_STR;
    PyObject *k = key->o;
    size_t mask = r->key_fields.cap - 1;
    size_t h = ((uintptr_t)k >> 4) * 0x9E3779B97F4A7C15ull >> 40 & mask;
    for (; r->key_fields.keys[h]; h = (h + 1) & mask)
        if (r->key_fields.keys[h] == k) return r->key_fields.fields[h];
    int field = F_OTHER;
    for (int f = 0; f < N_FIELDS; f++) {
        if (PyUnicode_CompareWithASCIIString(k, FIELD_NAMES[f]) == 0) {
            field = f;
            break;
        }
    }
    r->key_fields.keys[h] = Py_NewRef(k);
    r->key_fields.fields[h] = (int8_t)field;
    if (++r->key_fields.n > r->key_fields.cap / 2 && key_fields_grow(r) < 0) return -1;
    return field;
}

static int int_field(const Val *v, int64_t *out) {
    if (v->kind == K_INT) {
        *out = v->i;
        return 0;
    }
    if (v->kind == K_OBJ && PyLong_Check(v->o)) { /* True and False count as 1 and 0 */
        int overflow;
        long long x = PyLong_AsLongLongAndOverflow(v->o, &overflow);
        if (!overflow && !(x == -1 && PyErr_Occurred())) {
            *out = x;
            return 0;
        }
        PyErr_Clear();
    }
    return unsupported("a trace field that is not an int64");
}

/* A frames list numbered for rows: items[at:at + len], first taken by row `first`. */
static int32_t new_frames(Reader *r, int64_t at, int64_t len) {
    int64_t n = (int64_t)r->frames_at.len, first = r->rows;
    if (n >= INT32_MAX) return unsupported("too many frames lists");
    if (push_i64(&r->frames_at, at) < 0 || push_i64(&r->frames_len, len) < 0 ||
        push_i64(&r->frames_first, first) < 0)
        return PyErr_NoMemory(), -1;
    return (int32_t)n;
}

/* The number of the frames list `v` (a list, or a tuple, as the unpickler's path allows). A
 * list rows share through the memo keeps one number; a tuple or a list already built is
 * copied, at most as many items in all as the input has bytes (a tuple repeated through the
 * memo must not multiply). */
static int32_t frames_of(Reader *r, const Val *v) {
    if (v->kind == K_LIST) {
        List *l = &r->lists[v->i];
        if (l->frames >= 0) return l->frames;
        if (!l->obj) return l->frames = new_frames(r, l->start, l->len);
    } else if (v->kind != K_OBJ || !PyTuple_CheckExact(v->o)) {
        return unsupported("frames that are not a list");
    }
    PyObject *seq = v->kind == K_LIST ? r->lists[v->i].obj : v->o;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    r->copied += n;
    if (r->copied > r->len) return unsupported("frames repeated more than the input holds");
    int64_t at = (int64_t)r->items.len;
    for (Py_ssize_t k = 0; k < n; k++) {
        int32_t id = obj_id(r, PySequence_Fast_ITEMS(seq)[k]);
        if (id < 0) return -1;
        if (push_i32(&r->items, id) < 0) return -1;
    }
    int32_t frames = new_frames(r, at, n);
    if (v->kind == K_LIST && frames >= 0) r->lists[v->i].frames = frames;
    return frames;
}

/* SETITEMS's pairs [k0, v0, k1, v1, ...] as the next row; -1 if they are not one. */
static int make_row(Reader *r, Val *items, Py_ssize_t n) {
    int64_t ints[N_INTS] = {0};
    int32_t action = -1, strs[N_STRS] = {0, 0};
    int32_t frames = -1;
    uint16_t present = 0;
    for (Py_ssize_t k = 0; k < n; k += 2) {
        int f = field_of(r, &items[k]);
        Val *v = &items[k + 1];
        if (f < 0) return -1;
        if (v->kind == K_ROW) return unsupported("a trace entry inside another");
        if (f == F_NOT_STR && (items[k].kind == K_OBJ ? PyObject_Hash(items[k].o) == -1
                                                      : items[k].kind != K_INT))
            return unsupported("an unhashable key"); /* the unpickler fails on it */
        if (f >= N_FIELDS) continue; /* a key memory_viz does not read either */
        if (present & (1u << f)) return unsupported("a key given twice");
        present |= (uint16_t)(1u << f);
        if (f >= F_ADDR && f <= F_DEVICE_FREE) {
            if (int_field(v, &ints[f - F_ADDR]) < 0) return -1;
        } else if (f == F_FRAMES) {
            if ((frames = frames_of(r, v)) < 0) return -1;
        } else {
            if (v->kind != K_OBJ || !PyUnicode_CheckExact(v->o))
                return unsupported("a trace field that is not a string");
            int32_t id = f == F_ACTION
                             ? strings_id(&r->actions, &r->last[0], v->o)
                             : strings_id(&r->texts, &r->last[1 + f - F_USER_METADATA], v->o);
            if (id < 0) return unsupported("too many strings");
            if (f == F_ACTION) action = id;
            else strs[f - F_USER_METADATA] = id;
        }
    }
    if (!(present & (1u << F_SIZE))) return unsupported("an entry without a size");
    for (int f = 0; f < N_STRS; f++) {
        if (!(present & (1u << (F_USER_METADATA + f)))) {
            int32_t id = strings_id(&r->texts, &r->last[1 + f], EMPTY_STR);
            if (id < 0) return -1;
            strs[f] = id;
        }
    }
    for (int f = 0; f < N_INTS; f++)
        if (push_i64(&r->ints[f], ints[f]) < 0) return -1;
    if (push_u16(&r->present, present) < 0 || push_i32(&r->action, action) < 0 ||
        push_i32(&r->strs[0], strs[0]) < 0 || push_i32(&r->strs[1], strs[1]) < 0 ||
        push_i32(&r->frames, frames) < 0) {
        PyErr_NoMemory();
        return -1;
    }
    r->rows++;
    return 0;
}

/* Whether the pairs have an 'action' key (-1: an error). */
static int has_action(Reader *r, Val *items, Py_ssize_t n) {
    for (Py_ssize_t k = 0; k < n; k += 2) { /* torch writes it first */
        int f = field_of(r, &items[k]);
        if (f < 0) return -1;
        if (f == F_ACTION) return 1;
    }
    return 0;
}

static RowList *row_list_of(Reader *r, PyObject *list) {
    for (Py_ssize_t k = r->n_row_lists - 1; k >= 0; k--)
        if (r->row_lists[k].list == list) return &r->row_lists[k];
    return NULL;
}

/* -- building ----------------------------------------------------------------------------- */

static void drop(Reader *r, Py_ssize_t from) {
    while (r->sp > from) val_clear(&r->stack[--r->sp]);
}

/* stack[mark:] appended to the list at stack[mark - 1]: as ids while the list is a run of
 * ids at the end of `items` and they are objects; into the list itself otherwise. */
static int append_items(Reader *r, Py_ssize_t mark) {
    if (mark < 1) return unsupported("append without a list");
    Val *target = &r->stack[mark - 1];
    if (target->kind != K_LIST) return unsupported("append to something other than a list");
    List *l = &r->lists[target->i];
    if (l->frames >= 0) return unsupported("a frames list changed after an entry took it");
    Val *items = &r->stack[mark];
    Py_ssize_t n = r->sp - mark, nrows = 0, nobjs = 0;
    for (Py_ssize_t k = 0; k < n; k++) {
        nrows += items[k].kind == K_ROW;
        nobjs += items[k].kind == K_OBJ;
    }
    if (nrows) {
        if (nrows != n) return unsupported("a list of trace entries holding something else");
        PyObject *list = list_object(r, l);
        if (!list) return -1;
        RowList *rl = row_list_of(r, list);
        if (!rl) {
            if (PyList_GET_SIZE(list) != 0) return unsupported("trace entries after other items");
            if (r->n_row_lists == MAX_ROW_LISTS) return unsupported("too many lists of entries");
            if (r->n_row_lists == r->row_lists_cap) {
                Py_ssize_t cap = r->row_lists_cap ? r->row_lists_cap * 2 : 8;
                RowList *p = PyMem_RawRealloc(r->row_lists, cap * sizeof(RowList));
                if (!p) return PyErr_NoMemory(), -1;
                r->row_lists = p;
                r->row_lists_cap = cap;
            }
            rl = &r->row_lists[r->n_row_lists++];
            Py_INCREF(list);
            rl->list = list;
            rl->start = rl->end = items[0].i;
        }
        for (Py_ssize_t k = 0; k < n; k++) {
            if (items[k].i != rl->end) return unsupported("trace entries out of order");
            rl->end++;
        }
    } else if (!l->obj && nobjs == n && l->start + l->len == (int64_t)r->items.len) {
        for (Py_ssize_t k = 0; k < n; k++) {
            int32_t id = obj_id(r, items[k].o);
            if (id < 0) return -1;
            if (push_i32(&r->items, id) < 0) return -1;
        }
        l->len += n;
    } else if (n) {
        PyObject *list = list_object(r, l);
        if (!list) return -1;
        if (row_list_of(r, list)) return unsupported("a list of trace entries holding something else");
        for (Py_ssize_t k = 0; k < n; k++) {
            PyObject *o = as_object(r, &items[k]);
            if (!o) return -1;
            int bad = PyList_Append(list, o);
            Py_DECREF(o);
            if (bad) return -1;
        }
    }
    drop(r, mark);
    return 0;
}

/* stack[mark:] (key, value pairs) set in the dict at stack[mark - 1]; a fresh dict given an
 * 'action' becomes the next row instead. */
static int set_items(Reader *r, Py_ssize_t mark) {
    if (mark < 1) return unsupported("setitems without a dict");
    Py_ssize_t n = r->sp - mark;
    if (n % 2) return unsupported("an odd number of items for a dict");
    Val *target = &r->stack[mark - 1];
    if (target->kind != K_OBJ || !PyDict_CheckExact(target->o))
        return unsupported("setitems on something other than a dict");
    PyObject *dict = target->o;
    Val *items = &r->stack[mark];
    Py_ssize_t refs = Py_REFCNT(dict);
    Py_ssize_t at = (Py_ssize_t)target->slot - 1;
    int memoized = refs == 2 && at >= 0 && at < r->memo_cap && r->memo[at].kind == K_OBJ &&
                   r->memo[at].o == dict;
    int entry = n && PyDict_GET_SIZE(dict) == 0 && (refs == 1 || memoized)
                    ? has_action(r, items, n)
                    : 0;
    if (entry < 0) return -1;
    if (entry) {
        int64_t row = r->rows;
        if (make_row(r, items, n) < 0) return -1;
        if (memoized) {
            Val *slot = &r->memo[at];
            Py_DECREF(slot->o);
            slot->kind = K_ROW;
            slot->i = row;
        }
        Py_DECREF(dict);
        target->kind = K_ROW;
        target->i = row;
        drop(r, mark);
        return 0;
    }
    for (Py_ssize_t k = 0; k < n; k += 2) {
        PyObject *key = as_object(r, &items[k]);
        if (!key) return -1;
        PyObject *value = as_object(r, &items[k + 1]);
        if (!value) {
            Py_DECREF(key);
            return -1;
        }
        int bad = PyDict_SetItem(dict, key, value);
        Py_DECREF(key);
        Py_DECREF(value);
        if (bad) return -1;
    }
    drop(r, mark);
    return 0;
}

static int make_tuple(Reader *r, Py_ssize_t from) {
    if (from < 0 || from > r->sp) return unsupported("a tuple of more than the stack");
    Py_ssize_t n = r->sp - from;
    PyObject *t = PyTuple_New(n);
    if (!t) return -1;
    for (Py_ssize_t k = 0; k < n; k++) {
        PyObject *o = as_object(r, &r->stack[from + k]);
        if (!o) {
            Py_DECREF(t);
            return -1;
        }
        PyTuple_SET_ITEM(t, k, o);
    }
    drop(r, from);
    return push_obj(r, t);
}

static double be_double(const uint8_t *p) {
    uint64_t x = 0;
    for (int k = 0; k < 8; k++) x = (x << 8) | p[k];
    double d;
    memcpy(&d, &x, 8);
    return d;
}

/* -- the machine -------------------------------------------------------------------------- */

/* An opcode's argument: a little-endian size of `width` bytes, handed to `then`. */
static inline int sized(Reader *r, int width, int (*then)(Reader *, Py_ssize_t)) {
    Py_ssize_t n = read_size(r, width);
    return n < 0 ? -1 : then(r, n);
}

static int report(Reader *r) {
    if (r->pos < r->next_report) return 0;
    r->next_report = r->pos + REPORT_EVERY;
    if (PyErr_CheckSignals() < 0) return -1;
    if (r->progress == Py_None) return 0;
    PyObject *got = PyObject_CallFunction(r->progress, "nn", r->pos, r->len);
    Py_XDECREF(got);
    return got ? 0 : -1;
}

static PyObject *run(Reader *r) {
    for (;;) {
        if (report(r) < 0) return NULL;
        const uint8_t *p = take(r, 1);
        if (!p) return NULL;
        int ok = 0;
        Py_ssize_t n, m;
        switch (*p) {
        case 0x80: /* PROTO */
            if (!(p = take(r, 1))) return NULL;
            if (*p < 2 || *p > 5) return unsupported("a pickle protocol before 2"), NULL;
            break;
        case 0x95: /* FRAME: the whole input is at hand; as the unpickler, only check it is */
            if ((n = read_size(r, 8)) < 0) return NULL;
            if (r->len - r->pos < n) return unsupported("a frame longer than what follows"), NULL;
            if (r->pos < r->frame_end) return unsupported("a frame inside a frame"), NULL;
            r->frame_end = r->pos + n;
            break;
        case '.': /* STOP */
            if (r->sp != 1 || r->nmarks) return unsupported("a stack left over at the end"), NULL;
            if (r->pos != r->len) return unsupported("bytes after the end of the pickle"), NULL;
            return as_object(r, &r->stack[0]);
        case '(': ok = push_mark(r); break;
        case '0': /* POP */
            if (r->nmarks && r->marks[r->nmarks - 1] == r->sp) { r->nmarks--; break; }
            if (!r->sp) return unsupported("pop from an empty stack"), NULL;
            drop(r, r->sp - 1);
            break;
        case '1': /* POP_MARK */
            if ((m = pop_mark(r)) < 0) return NULL;
            drop(r, m);
            break;
        case '2': /* DUP */
            if (!r->sp || r->stack[r->sp - 1].kind == K_ROW) return unsupported("dup"), NULL;
            {
                const Val *v = &r->stack[r->sp - 1];
                ok = v->kind == K_OBJ ? push_val(r, K_OBJ, Py_NewRef(v->o), 0)
                                      : push_val(r, v->kind, NULL, v->i);
            }
            break;
        case '}': ok = push_obj(r, PyDict_New()); break;
        case ']': ok = push_list(r); break;
        case ')': ok = push_obj(r, PyTuple_New(0)); break;
        case 't': /* TUPLE */
            if ((m = pop_mark(r)) < 0) return NULL;
            ok = make_tuple(r, m);
            break;
        case 0x85: ok = make_tuple(r, r->sp - 1); break;
        case 0x86: ok = make_tuple(r, r->sp - 2); break;
        case 0x87: ok = make_tuple(r, r->sp - 3); break;
        case 'a': ok = append_items(r, r->sp - 1); break;
        case 'e':
            if ((m = pop_mark(r)) < 0) return NULL;
            ok = append_items(r, m);
            break;
        case 's': ok = r->sp >= 3 ? set_items(r, r->sp - 2) : unsupported("setitem"); break;
        case 'u':
            if ((m = pop_mark(r)) < 0) return NULL;
            ok = set_items(r, m);
            break;
        case 'N': ok = push_obj(r, Py_NewRef(Py_None)); break;
        case 0x88: ok = push_obj(r, Py_NewRef(Py_True)); break;
        case 0x89: ok = push_obj(r, Py_NewRef(Py_False)); break;
        case 'J': /* BININT */
            if (!(p = take(r, 4))) return NULL;
            ok = push_int(r, (int32_t)(uint32_t)le(p, 4));
            break;
        case 'K':
            if (!(p = take(r, 1))) return NULL;
            ok = push_int(r, p[0]);
            break;
        case 'M':
            if (!(p = take(r, 2))) return NULL;
            ok = push_int(r, (int64_t)le(p, 2));
            break;
        case 0x8a: /* LONG1 */
            if (!(p = take(r, 1))) return NULL;
            ok = read_long(r, p[0]);
            break;
        case 0x8b: /* LONG4: a signed length */
            if (!(p = take(r, 4))) return NULL;
            n = (int32_t)(uint32_t)le(p, 4);
            ok = n < 0 ? unsupported("a negative length") : read_long(r, n);
            break;
        case 'G': /* BINFLOAT */
            if (!(p = take(r, 8))) return NULL;
            ok = push_obj(r, PyFloat_FromDouble(be_double(p)));
            break;
        case 0x8c: ok = sized(r, 1, read_str); break;   /* SHORT_BINUNICODE */
        case 'X': ok = sized(r, 4, read_str); break;    /* BINUNICODE */
        case 0x8d: ok = sized(r, 8, read_str); break;   /* BINUNICODE8 */
        case 'C': ok = sized(r, 1, read_bytes); break;  /* SHORT_BINBYTES */
        case 'B': ok = sized(r, 4, read_bytes); break;  /* BINBYTES */
        case 0x8e: ok = sized(r, 8, read_bytes); break; /* BINBYTES8 */
        case 0x94: ok = memo_put(r, r->memo_len); break; /* MEMOIZE */
        case 'q': ok = sized(r, 1, memo_put); break;    /* BINPUT */
        case 'r': ok = sized(r, 4, memo_put); break;    /* LONG_BINPUT */
        case 'h': ok = sized(r, 1, memo_get); break;    /* BINGET */
        case 'j': ok = sized(r, 4, memo_get); break;    /* LONG_BINGET */
        default:
            PyErr_Format(Unsupported, "opcode 0x%02x at byte %zd", *p, r->pos - 1);
            return NULL;
        }
        if (ok < 0) return NULL;
    }
}

/* -- results ------------------------------------------------------------------------------ */

/* The column's bytearray, cut to its rows (a new reference). */
static PyObject *column_bytes(Column *c) {
    if (PyByteArray_Resize(c->bytes, (Py_ssize_t)(c->len * c->item)) < 0) return NULL;
    return Py_NewRef(c->bytes);
}

static int put(PyObject *d, const char *key, PyObject *value) { /* steals value */
    if (!value) return -1;
    int bad = PyDict_SetItemString(d, key, value);
    Py_DECREF(value);
    return bad;
}

static PyObject *results(Reader *r, PyObject *top) {
    int64_t covered = 0;
    for (Py_ssize_t k = 0; k < r->n_row_lists; k++)
        covered += r->row_lists[k].end - r->row_lists[k].start;
    PyObject *lists = NULL, *columns = NULL;
    if (covered != r->rows) {
        unsupported("a trace entry outside any list");
        goto fail;
    }
    if (!(lists = PyList_New(r->n_row_lists)) || !(columns = PyDict_New())) goto fail;
    for (Py_ssize_t k = 0; k < r->n_row_lists; k++) {
        RowList *rl = &r->row_lists[k];
        PyObject *t = Py_BuildValue("(OLL)", rl->list, (long long)rl->start, (long long)rl->end);
        if (!t) goto fail;
        PyList_SET_ITEM(lists, k, t);
    }
    for (size_t k = 0; k < N_COLUMNS; k++)
        if (put(columns, COLUMNS[k].name, column_bytes(column(r, k))) < 0) goto fail;
    if (put(columns, "objects", Py_NewRef(r->objs.objects)) < 0 ||
        put(columns, "action_names", Py_NewRef(r->actions.order)) < 0 ||
        put(columns, "texts", Py_NewRef(r->texts.order)) < 0)
        goto fail;
    return Py_BuildValue("(NNN)", top, lists, columns);
fail:
    Py_XDECREF(lists);
    Py_XDECREF(columns);
    Py_DECREF(top);
    return NULL;
}

static void reader_free(Reader *r) {
    drop(r, 0);
    PyMem_RawFree(r->stack);
    PyMem_RawFree(r->marks);
    for (Py_ssize_t k = 0; k < r->memo_cap; k++) val_clear(&r->memo[k]);
    PyMem_RawFree(r->memo);
    for (size_t k = 0; k < N_COLUMNS; k++) Py_XDECREF(column(r, k)->bytes);
    for (size_t k = 0; k < r->short_strs.cap; k++) Py_XDECREF(r->short_strs.slots[k].str);
    PyMem_RawFree(r->short_strs.slots);
    for (Py_ssize_t k = 0; k < r->n_lists; k++) Py_XDECREF(r->lists[k].obj);
    PyMem_RawFree(r->lists);
    PyMem_RawFree(r->objs.keys);
    PyMem_RawFree(r->objs.ids);
    Py_XDECREF(r->objs.objects);
    Strings *strs[] = {&r->actions, &r->texts};
    for (int k = 0; k < 2; k++) {
        Py_XDECREF(strs[k]->ids);
        Py_XDECREF(strs[k]->order);
    }
    for (int k = 0; k < 1 + N_STRS; k++) Py_XDECREF(r->last[k].str);
    for (Py_ssize_t k = 0; k < r->n_row_lists; k++) Py_DECREF(r->row_lists[k].list);
    PyMem_RawFree(r->row_lists);
    for (size_t k = 0; k < r->key_fields.cap; k++) Py_XDECREF(r->key_fields.keys[k]);
    PyMem_RawFree(r->key_fields.keys);
    PyMem_RawFree(r->key_fields.fields);
}

static PyObject *read_rows(PyObject *Py_UNUSED(self), PyObject *args, PyObject *kwargs) {
    static char *kwlist[] = {"data", "progress", NULL};
    Py_buffer view;
    PyObject *progress = Py_None;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "y*|O", kwlist, &view, &progress)) return NULL;
    Reader r;
    memset(&r, 0, sizeof r);
    r.buf = view.buf;
    r.len = view.len;
    r.progress = progress;
    r.memo_hint = view.len / 24 + 1024;
    r.objs.objects = PyList_New(0);
    r.actions.ids = PyDict_New();
    r.actions.order = PyList_New(0);
    r.texts.ids = PyDict_New();
    r.texts.order = PyList_New(0);
    PyObject *out = NULL;
    int reserved = 0;
    for (size_t k = 0; k < N_COLUMNS; k++) {
        column(&r, k)->item = COLUMNS[k].item;
        reserved |= col_reserve(column(&r, k), (size_t)view.len / COLUMNS[k].bytes_per + 1024);
    }
    if (reserved < 0 || objs_grow(&r.objs) < 0 || short_strs_grow(&r.short_strs) < 0 ||
        key_fields_grow(&r) < 0)
        PyErr_NoMemory();
    else if (r.objs.objects && r.actions.ids && r.actions.order && r.texts.ids && r.texts.order) {
        PyObject *top = run(&r);
        if (top) out = results(&r, top);
    }
    reader_free(&r);
    PyBuffer_Release(&view);
    return out;
}

static PyMethodDef methods[] = {
    {"read_rows", (PyCFunction)(void (*)(void))read_rows, METH_VARARGS | METH_KEYWORDS,
     "read_rows(data, progress=None) -> (top, [(list, start, end)], columns)"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_rows", NULL, -1, methods};

PyMODINIT_FUNC PyInit__rows(void) {
    PyObject *m = PyModule_Create(&module);
    if (!m) return NULL;
    EMPTY_STR = PyUnicode_FromString("");
    Unsupported = PyErr_NewException("gpumem_widget.snapshot._rows.Unsupported", PyExc_ValueError, NULL);
    if (!EMPTY_STR || !Unsupported || PyModule_AddObjectRef(m, "Unsupported", Unsupported) < 0 ||
        PyModule_AddStringConstant(m, "SOURCE_DIGEST", SOURCE_DIGEST) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
