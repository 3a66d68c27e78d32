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
 * Anything it does not read exactly as the unpickler would (another opcode, an operation that
 * reaches below the topmost MARK, an entry reached twice through the memo, a list of entries
 * reachable from anywhere but its one place in 'device_traces', a field of an unexpected type,
 * a corrupt byte) raises `Unsupported`, and the caller reads the file with the unpickler; so
 * does a file shaped to make it need more memory than the unpickler (a stack, a memo or kept
 * ids beyond any snapshot's). A dict key of tuples nested too deep to hash (CPython's
 * `tuplehash` recurses on the C stack) raises `NestedTooDeeply`: the unpickler would crash.
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

/* Built for one CPython, or with -DPy_LIMITED_API=0x030B0000 for every CPython from 3.11 on
 * (the buffer protocol joined the limited API in 3.11); there the macros that reach into
 * objects are functions. */
#ifdef Py_LIMITED_API
#define LIST_SIZE(o) PyList_Size(o)
#define LIST_ITEM(o, k) PyList_GetItem(o, k)
#define LIST_SET(o, k, v) (void)PyList_SetItem(o, k, v) /* cannot fail: a new list */
#define TUPLE_SIZE(o) PyTuple_Size(o)
#define TUPLE_ITEM(o, k) PyTuple_GetItem(o, k)
#define TUPLE_SET(o, k, v) (void)PyTuple_SetItem(o, k, v)
#define DICT_SIZE(o) PyDict_Size(o)
#define BYTEARRAY_DATA(o) PyByteArray_AsString(o)
#else
#define LIST_SIZE(o) PyList_GET_SIZE(o)
#define LIST_ITEM(o, k) PyList_GET_ITEM(o, k)
#define LIST_SET(o, k, v) PyList_SET_ITEM(o, k, v)
#define TUPLE_SIZE(o) PyTuple_GET_SIZE(o)
#define TUPLE_ITEM(o, k) PyTuple_GET_ITEM(o, k)
#define TUPLE_SET(o, k, v) PyTuple_SET_ITEM(o, k, v)
#define DICT_SIZE(o) PyDict_GET_SIZE(o)
#define BYTEARRAY_DATA(o) PyByteArray_AS_STRING(o)
#endif

/* -- the reader's working arrays ---------------------------------------------------------- */

/* The stack, the memo, the lists and the tables are mapped apart from the heap (Linux): growing
 * one moves no bytes (mremap) and maps no more than it touches, and freeing one gives it back
 * whole. In the heap, their growth left holes, and freeing a block malloc had mapped raised its
 * mmap threshold, so that the unpickler reading a file the reader declined (or the conversion
 * after it) kept more of the heap than it would have alone: 1 to 19 MB on crafted 100 MB files
 * (issue 28). READER_HEAP (the sanitizer build) keeps them in the heap, where ASan sees them.
 * New bytes read as zeros either way. */
#if defined(__linux__) && !defined(READER_HEAP)
#include <sys/mman.h>
static void *region_resize(void *p, size_t old, size_t size) {
    void *q = p ? mremap(p, old, size, MREMAP_MAYMOVE)
                : mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    return q == MAP_FAILED ? NULL : q;
}
static void region_free(void *p, size_t size) {
    if (p) munmap(p, size);
}
#else
static void *region_resize(void *p, size_t old, size_t size) {
    char *q = PyMem_Realloc(p, size);
    if (q && size > old) memset(q + old, 0, size - old);
    return q;
}
static void region_free(void *p, size_t size) {
    (void)size;
    PyMem_Free(p);
}
#endif

/* Room for `cap` items of `item` bytes where `*p` has `old` (-1 and MemoryError if none). */
static int region_grow(void *p, size_t item, Py_ssize_t old, Py_ssize_t cap) {
    void *q = region_resize(*(void **)p, (size_t)old * item, (size_t)cap * item);
    if (!q) return PyErr_NoMemory(), -1;
    *(void **)p = q;
    return 0;
}

#ifndef SOURCE_DIGEST
#define SOURCE_DIGEST "unknown"
#endif

static PyObject *Unsupported;
static PyObject *NestedTooDeeply; /* a key the unpickler would crash hashing: refused outright */
static PyObject *EMPTY_STR; /* an absent user_metadata or compile_context reads as '' */

/* -- values on the stack and in the memo ------------------------------------------------- */

enum { K_EMPTY = 0, K_OBJ, K_INT, K_ROW, K_LIST };

typedef struct {
    union {
        PyObject *o; /* owned reference (K_OBJ) */
        int64_t i; /* an int not made into an object yet (K_INT), a row number (K_ROW), a list's
                    * number (K_LIST) */
    };
    uint32_t slot; /* a fresh dict's memo slot + 1 (0: none), to hand it to its row */
    uint8_t kind;
    /* A dict that nothing but this stack slot holds (and the memo slot `slot`, if that still
     * holds it and was never read): made by EMPTY_DICT, never DUP'd or read back from the memo.
     * Only such a dict may become a row, since no one else can see that it is not a dict. This
     * is tracked, not read from refcounts, so it holds on every CPython (immortal objects,
     * deferred refcounts) the same way. */
    uint8_t fresh;
} Val;

static void val_clear(Val *v) {
    if (v->kind == K_OBJ) Py_DECREF(v->o);
    v->kind = K_EMPTY;
}

/* A memo slot in one word, as the unpickler's (a crafted file of memo operations needs no more
 * memory here than there): 0 empty; an owned object (tag 0), a fresh dict's (M_FRESH: its
 * stack slot may still make it a row), a row's number (M_ROW), a list's number (M_LIST). */
typedef uintptr_t Memo;
enum { M_OBJ = 0, M_ROW = 1, M_LIST = 2, M_FRESH = 3 };
#define MEMO_TAG(m) ((unsigned)((m) & 3u))
#define MEMO_OBJ(m) ((PyObject *)((m) & ~(Memo)3))

static void memo_clear(Memo *m) {
    if (*m && (MEMO_TAG(*m) == M_OBJ || MEMO_TAG(*m) == M_FRESH)) Py_DECREF(MEMO_OBJ(*m));
    *m = 0;
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

/* Columns start small and double (a large bytearray grows by remapping, not copying): room
 * reserved from the file's size would let a crafted file ask for more than it holds. */
#define COLUMN_START 4096

static int col_reserve(Column *c, size_t cap) {
    c->bytes = PyByteArray_FromStringAndSize(NULL, (Py_ssize_t)(cap * c->item));
    if (!c->bytes) return -1;
    c->data = BYTEARRAY_DATA(c->bytes);
    c->cap = cap;
    return 0;
}

static int col_grow(Column *c) {
    size_t cap = c->cap * 2;
    if (cap * c->item > (size_t)PY_SSIZE_T_MAX) return PyErr_NoMemory(), -1;
    if (PyByteArray_Resize(c->bytes, (Py_ssize_t)(cap * c->item)) < 0) return -1;
    c->data = BYTEARRAY_DATA(c->bytes);
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
    Py_ssize_t n = LIST_SIZE(s->order);
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
        PyObject *old = last->str;
        last->str = Py_NewRef(str);
        Py_XDECREF(old);
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
 * takes it as its frames; after that it may not change. `uses`: how many times it was put in
 * something (a list, a tuple, a dict, an entry's frames, the result); `parent`: for a list of
 * rows, the list it was appended to, where that was its only use (-1: none). A list that holds
 * rows stays empty, so it must be reachable from its own place in `device_traces` alone.
 * `refs`: the stack and memo slots that name it; with none left, the record is given back for
 * the next list (`start` then links the records given back), unless it is `pinned`: it holds
 * rows, or is such a list's parent, which the end checks. */
typedef struct {
    int64_t start, len;
    PyObject *obj;
    int64_t uses, parent, refs;
    int32_t frames;
    uint8_t pinned, rows;
} List;

/* A list the rows [start, end) were appended to: lists[index]. */
typedef struct {
    PyObject *list; /* owned */
    int64_t start, end, index;
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

    Memo *memo;
    Py_ssize_t memo_cap, memo_len; /* memo_len: filled slots, as the unpickler counts them */

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
    int64_t free_lists; /* the first record given back (-1: none) */
    int dropped_unread; /* a list of dicts let go of before anything took it */
    int64_t copied; /* items copied for frames that were a tuple or a built list */
    int64_t wasted; /* ids of lists built since, left in `items` */

    struct { PyObject **keys; int8_t *fields; size_t cap, n; } key_fields; /* what each key is */
    /* The depth of each tuple holding a tuple (the rest are 1 deep): hashing one as a key
     * recurses once a level, in C, without a limit. */
    struct { PyObject **keys; uint32_t *depth; size_t cap, n; } nested;
    int top_fresh; /* at STOP: the result is a dict nothing inside it holds */

    PyObject *progress;
    Py_ssize_t next_report;
} Reader;

/* Every column: its name in the results, where it is in the Reader, its item size. */
#define COLUMN(name, field, type) {name, offsetof(Reader, field), sizeof(type)}
static const struct {
    const char *name;
    size_t at, item;
} COLUMNS[] = {
    COLUMN("addr", ints[0], int64_t),
    COLUMN("size", ints[1], int64_t),
    COLUMN("stream", ints[2], int64_t),
    COLUMN("time_us", ints[3], int64_t),
    COLUMN("device_free", ints[4], int64_t),
    COLUMN("present", present, uint16_t),
    COLUMN("action", action, int32_t),
    COLUMN("user_metadata", strs[0], int32_t),
    COLUMN("compile_context", strs[1], int32_t),
    COLUMN("frames", frames, int32_t),
    COLUMN("frames_at", frames_at, int64_t),
    COLUMN("frames_len", frames_len, int64_t),
    COLUMN("frames_first", frames_first, int64_t),
    COLUMN("items", items, int32_t),
};
#define N_COLUMNS (sizeof COLUMNS / sizeof *COLUMNS)

static Column *column(Reader *r, size_t k) {
    return (Column *)((char *)r + COLUMNS[k].at);
}

/* And the mapped pages read so far given back (c_reader): at most 64 kB of the file stays
 * mapped in, about what the unpickler buffers. */
#define REPORT_EVERY (1 << 16)

static int unsupported(const char *why) {
    if (!PyErr_Occurred()) PyErr_SetString(Unsupported, why);
    return -1;
}

/* -- stack, marks, memo ------------------------------------------------------------------ */

/* A stack or memo slot naming list `i` let go of. Records of lists no slot names are given back:
 * kept, a crafted file of many small lists needed 48 bytes a list more than the unpickler. */
static void list_unref(Reader *r, int64_t i) {
    List *l = &r->lists[i];
    if (--l->refs > 0 || l->pinned) return;
    /* Its dicts, numbered, stay in `objects` where the unpickler would free them: a pickle of
     * lists dropped unread (none that pickle writes) is left to the unpickler. */
    if (!l->obj && l->frames < 0 && l->len) r->dropped_unread = 1;
    if (l->obj) Py_CLEAR(l->obj);
    else if (l->frames < 0 && l->start + l->len == (int64_t)r->items.len) r->items.len = (size_t)l->start;
    else if (l->frames < 0) r->wasted += l->len;
    l->start = r->free_lists;
    r->free_lists = i;
}

static void memo_drop(Reader *r, Memo *m) {
    if (*m && MEMO_TAG(*m) == M_LIST) list_unref(r, (int64_t)(*m >> 2));
    memo_clear(m);
}

/* A real pickle's stack holds a batch of 1,000 items or pairs per open container, its marks one
 * per open container; deeper ones are crafted, and the unpickler reads them (in the memory they
 * ask for) rather than this reader. Likewise a memo fuller than one slot per 4 bytes read. */
#define MAX_STACK ((Py_ssize_t)1 << 16)
#define MEMO_SLACK ((Py_ssize_t)1 << 16)

static int stack_grow(Reader *r) {
    Py_ssize_t cap = r->stack_cap ? r->stack_cap * 2 : 256;
    if (cap > MAX_STACK) return unsupported("a stack deeper than a snapshot's");
    if (region_grow(&r->stack, sizeof(Val), r->stack_cap, cap) < 0) return -1;
    r->stack_cap = cap;
    return 0;
}

/* Field by field: a whole Val stored and loaded back stalls the store buffer. */
static inline int push_val(Reader *r, uint8_t kind, PyObject *o, int64_t i) {
    if (r->sp == r->stack_cap && stack_grow(r) < 0) {
        if (kind == K_OBJ) Py_DECREF(o);
        return -1;
    }
    Val *v = &r->stack[r->sp++];
    if (kind == K_OBJ) v->o = o;
    else v->i = i;
    v->kind = kind;
    v->fresh = 0;
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

/* The unpickler's fence: nothing takes items from below the topmost mark. */
static inline Py_ssize_t fence(const Reader *r) {
    return r->nmarks ? r->marks[r->nmarks - 1] : 0;
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
        if (cap > MAX_STACK) return unsupported("more marks than a snapshot's");
        if (region_grow(&r->marks, sizeof(Py_ssize_t), r->marks_cap, cap) < 0) return -1;
        r->marks_cap = cap;
    }
    r->marks[r->nmarks++] = r->sp;
    return 0;
}

/* The value as an object (a new reference); a row cannot become one. A list counts a use. */
static PyObject *list_object(Reader *r, List *l);

static PyObject *as_object(Reader *r, const Val *v) {
    if (v->kind == K_OBJ) {
        Py_INCREF(v->o);
        return v->o;
    }
    if (v->kind == K_INT) return PyLong_FromLongLong(v->i);
    if (v->kind == K_LIST) {
        List *l = &r->lists[v->i];
        l->uses++;
        l->parent = -1;
        return Py_XNewRef(list_object(r, l));
    }
    unsupported(v->kind == K_ROW ? "a trace entry used as a value elsewhere" : "an empty value");
    return NULL;
}

/* Whether the dict at stack slot `v` is fresh (see Val); its memo slot, if any, in *at. */
static int is_fresh(const Reader *r, const Val *v, Py_ssize_t *at) {
    *at = (Py_ssize_t)v->slot - 1;
    if (v->kind != K_OBJ || !v->fresh) return 0;
    return *at < 0 || (*at < r->memo_cap && r->memo[*at] == ((Memo)v->o | M_FRESH));
}

/* The unpickler's slots grow on demand; an index far past the filled ones is refused here
 * rather than allocated (a real pickle numbers its slots in order). */
static int memo_put(Reader *r, Py_ssize_t idx) {
    if (r->sp <= fence(r)) return unsupported("memoizing below a mark");
    if (idx < 0 || idx > r->memo_len + (1 << 20)) return unsupported("a memo index out of range");
    if (r->memo_len > r->pos / 4 + MEMO_SLACK) return unsupported("a memo fuller than a snapshot's");
    if (idx >= r->memo_cap) {
        Py_ssize_t cap = r->memo_cap ? r->memo_cap : 1024;
        while (cap <= idx) cap *= 2;
        if (region_grow(&r->memo, sizeof(Memo), r->memo_cap, cap) < 0) return -1;
        r->memo_cap = cap;
    }
    Val *top = &r->stack[r->sp - 1];
    if (top->kind == K_INT) { /* one int object, shared by every read of the slot */
        PyObject *o = PyLong_FromLongLong(top->i);
        if (!o) return -1;
        top->o = o;
        top->kind = K_OBJ;
    }
    Memo m;
    if (top->kind == K_OBJ) {
        m = (Memo)Py_NewRef(top->o);
        if (top->fresh) {
            if (top->slot || idx >= (Py_ssize_t)UINT32_MAX) top->fresh = 0; /* two slots */
            else {
                top->slot = (uint32_t)idx + 1;
                m |= M_FRESH;
            }
        }
    } else if (top->kind == K_ROW) {
        m = (Memo)top->i << 2 | M_ROW;
    } else {
        m = (Memo)top->i << 2 | M_LIST;
        r->lists[top->i].refs++;
    }
    Memo *slot = &r->memo[idx];
    if (*slot) memo_drop(r, slot);
    else r->memo_len++;
    *slot = m;
    return 0;
}

static int memo_get(Reader *r, Py_ssize_t idx) {
    if (idx < 0 || idx >= r->memo_cap || !r->memo[idx]) return unsupported("a memo index never set");
    Memo *m = &r->memo[idx];
    switch (MEMO_TAG(*m)) {
    case M_ROW: return unsupported("a trace entry referenced twice");
    case M_LIST:
        r->lists[*m >> 2].refs++;
        return push_val(r, K_LIST, NULL, (int64_t)(*m >> 2));
    case M_FRESH: *m &= ~(Memo)3; break; /* read back: no longer fresh */
    default: break;
    }
    return push_val(r, K_OBJ, Py_NewRef(MEMO_OBJ(*m)), 0);
}

/* -- objects and lists -------------------------------------------------------------------- */

/* The tables below that hold objects by identity (short strings, dict keys, nested tuples) keep
 * only what something else still holds: an entry no one else holds is let go of when its table
 * fills, and the table grows only if the entries still held fill half of it. Kept to the end,
 * they held every string and tuple a crafted file made and dropped, which the unpickler frees
 * at once (100 MB of popped tuples: gigabytes). An immortal object is never let go of. */
static int only_held_here(PyObject *o) {
    return Py_REFCNT(o) == 1;
}

/* A table's room for `live` entries: `first` for a new one, the same where they fill a quarter
 * of it at most (entries let go of made the room), else twice. */
static size_t table_cap(size_t cap, size_t live, size_t first) {
    if (!cap) return first;
    return live <= cap / 4 ? cap : cap * 2;
}

static int objs_grow(Objects *t) {
    size_t cap = t->cap ? t->cap * 2 : 1024;
    PyObject **keys = region_resize(NULL, 0, cap * sizeof(PyObject *));
    int32_t *ids = region_resize(NULL, 0, cap * sizeof(int32_t));
    if (!keys || !ids) {
        region_free(keys, cap * sizeof(PyObject *));
        region_free(ids, cap * sizeof(int32_t));
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
    region_free(t->keys, t->cap * sizeof(PyObject *));
    region_free(t->ids, t->cap * sizeof(int32_t));
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
    Py_ssize_t n = LIST_SIZE(t->objects);
    if (n >= INT32_MAX) return unsupported("too many objects");
    if (PyList_Append(t->objects, o) < 0) return -1;
    t->keys[h] = o;
    t->ids[h] = (int32_t)n;
    if ((size_t)n + 1 > t->cap / 2 && objs_grow(t) < 0) return -1;
    return (int32_t)n;
}

static int push_list(Reader *r) {
    int64_t i = r->free_lists;
    if (i >= 0) {
        r->free_lists = r->lists[i].start;
    } else {
        if (r->n_lists == r->lists_cap) {
            Py_ssize_t cap = r->lists_cap ? r->lists_cap * 2 : 4096;
            if (region_grow(&r->lists, sizeof(List), r->lists_cap, cap) < 0) return -1;
            r->lists_cap = cap;
        }
        i = r->n_lists++;
    }
    List *l = &r->lists[i];
    l->start = (int64_t)r->items.len;
    l->len = 0;
    l->obj = NULL;
    l->frames = -1;
    l->uses = 0;
    l->parent = -1;
    l->refs = 1;
    l->pinned = l->rows = 0;
    return push_val(r, K_LIST, NULL, i);
}

/* The list itself (borrowed), built from its items the first time it is needed. Its ids, if
 * they end `items` and no row took them as frames, are given back. */
static PyObject *list_object(Reader *r, List *l) {
    if (l->obj) return l->obj;
    PyObject *obj = PyList_New((Py_ssize_t)l->len);
    if (!obj) return NULL;
    const int32_t *ids = (const int32_t *)r->items.data + l->start;
    for (int64_t k = 0; k < l->len; k++)
        LIST_SET(obj, (Py_ssize_t)k, Py_NewRef(LIST_ITEM(r->objs.objects, ids[k])));
    l->obj = obj;
    if (l->frames < 0 && l->start + l->len == (int64_t)r->items.len) r->items.len = (size_t)l->start;
    else if (l->frames < 0) r->wasted += l->len;
    return obj;
}

/* The lists among `n` values built last to first, as the values are about to be taken as
 * objects: lists made one after another keep their ids one after another, so built from the
 * last each one's ids end `items` and are given back (built from the first, all but the last
 * would be left behind: 4 MB more than the unpickler on a crafted file of lists of lists). */
static int build_lists(Reader *r, const Val *v, Py_ssize_t n) {
    for (Py_ssize_t k = n - 1; k >= 0; k--)
        if (v[k].kind == K_LIST && !list_object(r, &r->lists[v[k].i])) return -1;
    return 0;
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
    size_t live = 0;
    for (size_t k = 0; k < t->cap; k++) live += t->slots[k].str && !only_held_here(t->slots[k].str);
    size_t cap = table_cap(t->cap, live, 256);
    StrSlot *slots = region_resize(NULL, 0, cap * sizeof(StrSlot));
    if (!slots) {
        PyErr_NoMemory();
        return -1;
    }
    for (size_t k = 0; k < t->cap; k++) {
        PyObject *str = t->slots[k].str;
        if (!str) continue;
        if (only_held_here(str)) {
            Py_DECREF(str);
            continue;
        }
        size_t h = t->slots[k].hash & (cap - 1);
        while (slots[h].str) h = (h + 1) & (cap - 1);
        slots[h] = t->slots[k];
    }
    region_free(t->slots, t->cap * sizeof(StrSlot));
    t->slots = slots;
    t->cap = cap;
    t->n = live;
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
    size_t live = 0;
    for (size_t k = 0; k < r->key_fields.cap; k++)
        live += r->key_fields.keys[k] && !only_held_here(r->key_fields.keys[k]);
    size_t cap = table_cap(r->key_fields.cap, live, 64);
    PyObject **keys = region_resize(NULL, 0, cap * sizeof(PyObject *));
    int8_t *fields = region_resize(NULL, 0, cap);
    if (!keys || !fields) {
        region_free(keys, cap * sizeof(PyObject *));
        region_free(fields, cap);
        PyErr_NoMemory();
        return -1;
    }
    for (size_t k = 0; k < r->key_fields.cap; k++) {
        PyObject *key = r->key_fields.keys[k];
        if (!key) continue;
        if (only_held_here(key)) {
            Py_DECREF(key);
            continue;
        }
        size_t h = ((uintptr_t)key >> 4) * 0x9E3779B97F4A7C15ull >> 40 & (cap - 1);
        while (keys[h]) h = (h + 1) & (cap - 1);
        keys[h] = key;
        fields[h] = r->key_fields.fields[k];
    }
    region_free(r->key_fields.keys, r->key_fields.cap * sizeof(PyObject *));
    region_free(r->key_fields.fields, r->key_fields.cap);
    r->key_fields.keys = keys;
    r->key_fields.fields = fields;
    r->key_fields.cap = cap;
    r->key_fields.n = live;
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

/* How deep a dict key may nest tuples: hashing one recurses once a level in C, unchecked, and
 * about 140,000 levels overflow the C stack (the unpickler dies there too). No snapshot holds a
 * tuple key of more than a few levels; a deeper one is refused with a reason. */
#define MAX_KEY_NESTING 10000

static int nested_grow(Reader *r) {
    size_t live = 0;
    for (size_t k = 0; k < r->nested.cap; k++)
        live += r->nested.keys[k] && !only_held_here(r->nested.keys[k]);
    size_t cap = table_cap(r->nested.cap, live, 64);
    PyObject **keys = region_resize(NULL, 0, cap * sizeof(PyObject *));
    uint32_t *depth = region_resize(NULL, 0, cap * sizeof(uint32_t));
    if (!keys || !depth) {
        region_free(keys, cap * sizeof(PyObject *));
        region_free(depth, cap * sizeof(uint32_t));
        PyErr_NoMemory();
        return -1;
    }
    for (size_t k = 0; k < r->nested.cap; k++) {
        PyObject *key = r->nested.keys[k];
        if (!key) continue;
        if (only_held_here(key)) {
            Py_DECREF(key);
            continue;
        }
        size_t h = ((uintptr_t)key >> 4) * 0x9E3779B97F4A7C15ull >> 40 & (cap - 1);
        while (keys[h]) h = (h + 1) & (cap - 1);
        keys[h] = key;
        depth[h] = r->nested.depth[k];
    }
    region_free(r->nested.keys, r->nested.cap * sizeof(PyObject *));
    region_free(r->nested.depth, r->nested.cap * sizeof(uint32_t));
    r->nested.keys = keys;
    r->nested.depth = depth;
    r->nested.cap = cap;
    r->nested.n = live;
    return 0;
}

/* How many tuples deep `o` is (0: not a tuple). */
static uint32_t depth_of(Reader *r, PyObject *o) {
    if (!PyTuple_CheckExact(o)) return 0;
    size_t mask = r->nested.cap - 1;
    size_t h = ((uintptr_t)o >> 4) * 0x9E3779B97F4A7C15ull >> 40 & mask;
    for (; r->nested.keys[h]; h = (h + 1) & mask)
        if (r->nested.keys[h] == o) return r->nested.depth[h];
    return 1;
}

/* Tuple `t` (borrowed), made of items as deep as `inner` at most; the table holds it, so its
 * address is not reused meanwhile. */
static int nested_add(Reader *r, PyObject *t, uint32_t inner) {
    if (inner == 0) return 0;
    size_t mask = r->nested.cap - 1;
    size_t h = ((uintptr_t)t >> 4) * 0x9E3779B97F4A7C15ull >> 40 & mask;
    while (r->nested.keys[h]) h = (h + 1) & mask;
    r->nested.keys[h] = Py_NewRef(t);
    r->nested.depth[h] = inner + 1;
    if (++r->nested.n > r->nested.cap / 2 && nested_grow(r) < 0) return -1;
    return 0;
}

/* Whether `key` may be hashed (-1 and NestedTooDeeply if not). */
static int key_hashable(Reader *r, PyObject *key) {
    if (depth_of(r, key) <= MAX_KEY_NESTING) return 0;
    PyErr_Format(NestedTooDeeply, "a dict key nested too deeply (tuples more than %d levels deep)",
                 MAX_KEY_NESTING);
    return -1;
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
        l->uses++;
        l->parent = -1;
        if (l->frames >= 0) return l->frames;
        if (!l->obj) return l->frames = new_frames(r, l->start, l->len);
    } else if (v->kind != K_OBJ || !PyTuple_CheckExact(v->o)) {
        return unsupported("frames that are not a list");
    }
    int tuple = v->kind == K_OBJ;
    PyObject *seq = tuple ? v->o : r->lists[v->i].obj;
    Py_ssize_t n = tuple ? TUPLE_SIZE(seq) : LIST_SIZE(seq);
    r->copied += n;
    if (r->copied > r->len) return unsupported("frames repeated more than the input holds");
    int64_t at = (int64_t)r->items.len;
    for (Py_ssize_t k = 0; k < n; k++) {
        int32_t id = obj_id(r, tuple ? TUPLE_ITEM(seq, k) : LIST_ITEM(seq, k));
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
        if (f == F_NOT_STR && items[k].kind == K_OBJ && key_hashable(r, items[k].o) < 0) return -1;
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
    while (r->sp > from) {
        Val *v = &r->stack[--r->sp];
        if (v->kind == K_LIST) list_unref(r, v->i);
        val_clear(v);
    }
}

/* A list longer than this is no frames list: it is built (ids and then the list would take
 * more memory than the unpickler's list alone). */
#define MAX_ID_RUN 65536
/* Lists built after their ids were kept leave those ids behind: past this many, lists are built
 * from the start, so ids and lists together never take much more than the lists alone. */
#define MAX_WASTED ((int64_t)1 << 20)

/* stack[mark:] appended to the list at stack[mark - 1]: as ids while the list is a short run
 * of ids at the end of `items` and they are dicts (frames, segments and blocks are lists of
 * dicts); into the list itself otherwise. A list of anything else is built at once: its items
 * numbered would cost the reader an id, a place in `objects` and in its table each, where the
 * unpickler's list costs a pointer (lists of lists: 3 MB more on a crafted 100 MB file). */
static int append_items(Reader *r, Py_ssize_t mark) {
    if (mark <= fence(r) || mark > r->sp) return unsupported("append across a mark");
    Val *target = &r->stack[mark - 1];
    if (target->kind != K_LIST) return unsupported("append to something other than a list");
    List *l = &r->lists[target->i];
    if (l->frames >= 0) return unsupported("a frames list changed after an entry took it");
    Val *items = &r->stack[mark];
    Py_ssize_t n = r->sp - mark, nrows = 0, ndicts = 0;
    for (Py_ssize_t k = 0; k < n; k++) {
        nrows += items[k].kind == K_ROW;
        ndicts += items[k].kind == K_OBJ && PyDict_CheckExact(items[k].o);
    }
    if (nrows) {
        if (nrows != n) return unsupported("a list of trace entries holding something else");
        PyObject *list = list_object(r, l);
        if (!list) return -1;
        RowList *rl = row_list_of(r, list);
        if (!rl) {
            if (LIST_SIZE(list) != 0) return unsupported("trace entries after other items");
            if (l->uses) return unsupported("trace entries added to a list already placed");
            if (r->n_row_lists == MAX_ROW_LISTS) return unsupported("too many lists of entries");
            if (r->n_row_lists == r->row_lists_cap) {
                Py_ssize_t cap = r->row_lists_cap ? r->row_lists_cap * 2 : 8;
                RowList *p = PyMem_Realloc(r->row_lists, (size_t)cap * sizeof(RowList));
                if (!p) return PyErr_NoMemory(), -1;
                r->row_lists = p;
                r->row_lists_cap = cap;
            }
            rl = &r->row_lists[r->n_row_lists++];
            Py_INCREF(list);
            rl->list = list;
            rl->start = rl->end = items[0].i;
            rl->index = target->i;
            l->pinned = l->rows = 1;
        }
        for (Py_ssize_t k = 0; k < n; k++) {
            if (items[k].i != rl->end) return unsupported("trace entries out of order");
            rl->end++;
        }
    } else if (!l->obj && ndicts == n && l->start + l->len == (int64_t)r->items.len &&
               l->len + n <= MAX_ID_RUN && r->wasted <= MAX_WASTED) {
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
        if (build_lists(r, items, n) < 0) return -1;
        PyObject *slice = PyList_New(n); /* added at once, as the unpickler adds them */
        if (!slice) return -1;
        for (Py_ssize_t k = 0; k < n; k++) {
            PyObject *o = as_object(r, &items[k]);
            if (!o) {
                Py_DECREF(slice);
                return -1;
            }
            if (items[k].kind == K_LIST && r->lists[items[k].i].rows &&
                r->lists[items[k].i].uses == 1) {
                r->lists[items[k].i].parent = target->i;
                l->pinned = 1;
            }
            LIST_SET(slice, k, o);
        }
        Py_ssize_t at = LIST_SIZE(list);
        int bad = PyList_SetSlice(list, at, at, slice);
        Py_DECREF(slice);
        if (bad) return -1;
    }
    drop(r, mark);
    return 0;
}

/* stack[mark:] (key, value pairs) set in the dict at stack[mark - 1]; a fresh dict given an
 * 'action' becomes the next row instead. */
static int set_items(Reader *r, Py_ssize_t mark) {
    if (mark <= fence(r) || mark > r->sp) return unsupported("setitems across a mark");
    Py_ssize_t n = r->sp - mark;
    if (n % 2) return unsupported("an odd number of items for a dict");
    Val *target = &r->stack[mark - 1];
    if (target->kind != K_OBJ || !PyDict_CheckExact(target->o))
        return unsupported("setitems on something other than a dict");
    PyObject *dict = target->o;
    Val *items = &r->stack[mark];
    Py_ssize_t at;
    int fresh = is_fresh(r, target, &at);
    int entry = n && fresh && DICT_SIZE(dict) == 0 ? has_action(r, items, n) : 0;
    if (entry < 0) return -1;
    if (entry) {
        int64_t row = r->rows;
        if (make_row(r, items, n) < 0) return -1;
        if (at >= 0) { /* the memo's reference becomes the row's number */
            Py_DECREF(dict);
            r->memo[at] = (Memo)row << 2 | M_ROW;
        }
        Py_DECREF(dict);
        target->kind = K_ROW;
        target->i = row;
        drop(r, mark);
        return 0;
    }
    if (build_lists(r, items, n) < 0) return -1;
    for (Py_ssize_t k = 0; k < n; k += 2) {
        if (items[k].kind == K_OBJ && key_hashable(r, items[k].o) < 0) return -1;
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
    if (from < fence(r) || from > r->sp) return unsupported("a tuple across a mark");
    Py_ssize_t n = r->sp - from;
    if (build_lists(r, &r->stack[from], n) < 0) return -1;
    PyObject *t = PyTuple_New(n);
    if (!t) return -1;
    uint32_t inner = 0;
    for (Py_ssize_t k = 0; k < n; k++) {
        PyObject *o = as_object(r, &r->stack[from + k]);
        if (!o) {
            Py_DECREF(t);
            return -1;
        }
        uint32_t d = depth_of(r, o);
        if (d > inner) inner = d;
        TUPLE_SET(t, k, o);
    }
    if (nested_add(r, t, inner) < 0) {
        Py_DECREF(t);
        return -1;
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
            r->top_fresh = is_fresh(r, &r->stack[0], &m);
            return as_object(r, &r->stack[0]);
        case '(': ok = push_mark(r); break;
        case '0': /* POP: the topmost mark, if nothing is above it */
            if (r->nmarks && r->marks[r->nmarks - 1] == r->sp) { r->nmarks--; break; }
            if (r->sp <= fence(r)) return unsupported("pop from an empty stack"), NULL;
            drop(r, r->sp - 1);
            break;
        case '1': /* POP_MARK */
            if ((m = pop_mark(r)) < 0) return NULL;
            drop(r, m);
            break;
        case '2': /* DUP */
            if (r->sp <= fence(r) || r->stack[r->sp - 1].kind == K_ROW)
                return unsupported("dup"), NULL;
            {
                Val *v = &r->stack[r->sp - 1];
                v->fresh = 0; /* held twice now */
                if (v->kind == K_LIST) r->lists[v->i].refs++;
                ok = v->kind == K_OBJ ? push_val(r, K_OBJ, Py_NewRef(v->o), 0)
                                      : push_val(r, v->kind, NULL, v->i);
            }
            break;
        case '}':
            if ((ok = push_obj(r, PyDict_New())) == 0) r->stack[r->sp - 1].fresh = 1;
            break;
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
        case 's': ok = set_items(r, r->sp - 2); break;
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
        if (r->dropped_unread) return unsupported("a list dropped before anything took it"), NULL;
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
    PyObject *lists = NULL, *columns = NULL, *parent = Py_None;
    if (covered != r->rows) {
        unsupported("a trace entry outside any list");
        goto fail;
    }
    /* Each list of rows is empty here: it must be reachable only through its one place in
     * one list (the caller checks that this is the result's 'device_traces'), which is
     * reachable only from there, in a result nothing inside it holds. */
    int64_t up = -1;
    for (Py_ssize_t k = 0; k < r->n_row_lists; k++) {
        const List *l = &r->lists[r->row_lists[k].index];
        if (l->uses != 1 || l->parent < 0 || (up >= 0 && l->parent != up)) {
            unsupported("a list of trace entries held elsewhere too");
            goto fail;
        }
        up = l->parent;
    }
    if (up >= 0) {
        if (r->lists[up].uses != 1 || !r->top_fresh || !r->lists[up].obj) {
            unsupported("the lists of trace entries held elsewhere too");
            goto fail;
        }
        parent = r->lists[up].obj;
    }
    if (!(lists = PyList_New(r->n_row_lists)) || !(columns = PyDict_New())) goto fail;
    for (Py_ssize_t k = 0; k < r->n_row_lists; k++) {
        RowList *rl = &r->row_lists[k];
        PyObject *t = Py_BuildValue("(OLL)", rl->list, (long long)rl->start, (long long)rl->end);
        if (!t) goto fail;
        LIST_SET(lists, k, t);
    }
    for (size_t k = 0; k < N_COLUMNS; k++)
        if (put(columns, COLUMNS[k].name, column_bytes(column(r, k))) < 0) goto fail;
    if (put(columns, "objects", Py_NewRef(r->objs.objects)) < 0 ||
        put(columns, "action_names", Py_NewRef(r->actions.order)) < 0 ||
        put(columns, "texts", Py_NewRef(r->texts.order)) < 0)
        goto fail;
    return Py_BuildValue("(NNNO)", top, lists, columns, parent);
fail:
    Py_XDECREF(lists);
    Py_XDECREF(columns);
    Py_DECREF(top);
    return NULL;
}

static void reader_free(Reader *r) {
    drop(r, 0);
    region_free(r->stack, (size_t)r->stack_cap * sizeof(Val));
    region_free(r->marks, (size_t)r->marks_cap * sizeof(Py_ssize_t));
    for (Py_ssize_t k = 0; k < r->memo_cap; k++) memo_drop(r, &r->memo[k]);
    region_free(r->memo, (size_t)r->memo_cap * sizeof(Memo));
    for (size_t k = 0; k < N_COLUMNS; k++) Py_XDECREF(column(r, k)->bytes);
    for (size_t k = 0; k < r->short_strs.cap; k++) Py_XDECREF(r->short_strs.slots[k].str);
    region_free(r->short_strs.slots, r->short_strs.cap * sizeof(StrSlot));
    for (Py_ssize_t k = 0; k < r->n_lists; k++) Py_XDECREF(r->lists[k].obj);
    region_free(r->lists, (size_t)r->lists_cap * sizeof(List));
    region_free(r->objs.keys, r->objs.cap * sizeof(PyObject *));
    region_free(r->objs.ids, r->objs.cap * sizeof(int32_t));
    Py_XDECREF(r->objs.objects);
    Strings *strs[] = {&r->actions, &r->texts};
    for (int k = 0; k < 2; k++) {
        Py_XDECREF(strs[k]->ids);
        Py_XDECREF(strs[k]->order);
    }
    for (int k = 0; k < 1 + N_STRS; k++) Py_XDECREF(r->last[k].str);
    for (Py_ssize_t k = 0; k < r->n_row_lists; k++) Py_DECREF(r->row_lists[k].list);
    PyMem_Free(r->row_lists);
    for (size_t k = 0; k < r->key_fields.cap; k++) Py_XDECREF(r->key_fields.keys[k]);
    region_free(r->key_fields.keys, r->key_fields.cap * sizeof(PyObject *));
    region_free(r->key_fields.fields, r->key_fields.cap);
    for (size_t k = 0; k < r->nested.cap; k++) Py_XDECREF(r->nested.keys[k]);
    region_free(r->nested.keys, r->nested.cap * sizeof(PyObject *));
    region_free(r->nested.depth, r->nested.cap * sizeof(uint32_t));
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
    r.free_lists = -1;
    r.objs.objects = PyList_New(0);
    r.actions.ids = PyDict_New();
    r.actions.order = PyList_New(0);
    r.texts.ids = PyDict_New();
    r.texts.order = PyList_New(0);
    PyObject *out = NULL;
    int reserved = 0;
    for (size_t k = 0; k < N_COLUMNS; k++) {
        column(&r, k)->item = COLUMNS[k].item;
        reserved |= col_reserve(column(&r, k), COLUMN_START);
    }
    if (reserved < 0 || objs_grow(&r.objs) < 0 || short_strs_grow(&r.short_strs) < 0 ||
        key_fields_grow(&r) < 0 || nested_grow(&r) < 0)
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
     "read_rows(data, progress=None) -> (top, [(list, start, end)], columns, traces)"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_rows", NULL, -1, methods, NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__rows(void) {
    PyObject *m = PyModule_Create(&module);
    if (!m) return NULL;
    EMPTY_STR = PyUnicode_FromString("");
    Unsupported = PyErr_NewException("gpumem_widget.snapshot.io._rows.Unsupported", PyExc_ValueError, NULL);
    NestedTooDeeply = PyErr_NewException("gpumem_widget.snapshot.io._rows.NestedTooDeeply",
                                         PyExc_ValueError, NULL);
    if (!EMPTY_STR || !Unsupported || !NestedTooDeeply ||
        PyModule_AddObjectRef(m, "Unsupported", Unsupported) < 0 ||
        PyModule_AddObjectRef(m, "NestedTooDeeply", NestedTooDeeply) < 0 ||
        PyModule_AddStringConstant(m, "SOURCE_DIGEST", SOURCE_DIGEST) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
