/* Packed protobuf varints for int64 arrays: the hot loop of writing and reading tf.train.Example shards.
 *
 * Optional accelerator for model_contract.example_codec, which falls back to numpy when this extension is not
 * built (the results are byte-identical; tests compare both). Inputs are any contiguous buffer of
 * little-endian int64 (a numpy array); outputs are bytes (encode) or a bytearray of int64 (decode).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

static PyObject *encode_varints(PyObject *self, PyObject *arg) {
    Py_buffer view;
    if (PyObject_GetBuffer(arg, &view, PyBUF_C_CONTIGUOUS) < 0) return NULL;
    if (view.len % 8 != 0) {
        PyBuffer_Release(&view);
        PyErr_SetString(PyExc_ValueError, "encode_varints needs a buffer of int64 values");
        return NULL;
    }
    Py_ssize_t n = view.len / 8;
    const unsigned char *src = (const unsigned char *)view.buf;
    /* Encode into a scratch buffer, then copy the exact size once: allocating n * 10 bytes and shrinking the
       bytes object afterwards cost more than the encoding itself (measured: 8.6 us per 2048 values). */
    unsigned char stack_buf[32 * 1024];  /* 3,276 values: a 2048-token example without a heap allocation */
    unsigned char *buf = stack_buf;
    if (n * 10 > (Py_ssize_t)sizeof(stack_buf)) {
        buf = (unsigned char *)PyMem_Malloc(n * 10);
        if (buf == NULL) {
            PyBuffer_Release(&view);
            return PyErr_NoMemory();
        }
    }
    unsigned char *p = buf;
    for (Py_ssize_t i = 0; i < n; i++) {
        uint64_t v;
        memcpy(&v, src + 8 * i, 8);
        while (v >= 0x80) {
            *p++ = (unsigned char)(v | 0x80);
            v >>= 7;
        }
        *p++ = (unsigned char)v;
    }
    PyBuffer_Release(&view);
    PyObject *out = PyBytes_FromStringAndSize((const char *)buf, p - buf);
    if (buf != stack_buf) PyMem_Free(buf);
    return out;
}

static PyObject *decode_varints(PyObject *self, PyObject *arg) {
    Py_buffer view;
    if (PyObject_GetBuffer(arg, &view, PyBUF_SIMPLE) < 0) return NULL;
    const unsigned char *src = (const unsigned char *)view.buf;
    Py_ssize_t len = view.len, count = 0;
    for (Py_ssize_t i = 0; i < len; i++) count += (src[i] < 0x80);
    PyObject *out = PyByteArray_FromStringAndSize(NULL, count * 8);
    if (out == NULL) {
        PyBuffer_Release(&view);
        return NULL;
    }
    unsigned char *dst = (unsigned char *)PyByteArray_AS_STRING(out);
    Py_ssize_t pos = 0;
    for (Py_ssize_t k = 0; k < count; k++) {
        uint64_t v = 0;
        int shift = 0;
        for (;;) {
            unsigned char b = src[pos++];
            if (shift > 63) {
                Py_DECREF(out);
                PyBuffer_Release(&view);
                PyErr_SetString(PyExc_ValueError, "varint longer than 10 bytes");
                return NULL;
            }
            v |= (uint64_t)(b & 0x7F) << shift;
            shift += 7;
            if (b < 0x80) break;
        }
        memcpy(dst + 8 * k, &v, 8);
    }
    int trailing = pos != len;
    PyBuffer_Release(&view);
    if (trailing) {
        Py_DECREF(out);
        PyErr_SetString(PyExc_ValueError, "packed varint payload ends inside a varint");
        return NULL;
    }
    return out;
}

/* ------------------------------------------------------------------------------------- whole examples */
static inline Py_ssize_t varint_size(uint64_t v) {
    /* (index of the highest set bit * 9 + 73) / 64 is (bits + 6) / 7 for every v, 0 included (v | 1): no branch
       and no division, so packed_size's loop stays cheap on token ids of 1 to 3 bytes */
    return (Py_ssize_t)(((63 - __builtin_clzll(v | 1)) * 9 + 73) >> 6);
}

static inline unsigned char *put_varint(unsigned char *p, uint64_t v) {
    while (v >= 0x80) {
        *p++ = (unsigned char)(v | 0x80);
        v >>= 7;
    }
    *p++ = (unsigned char)v;
    return p;
}

#define MAX_FEATURES 16

/* Bytes of the packed varints of values[a:b] (int64, little-endian). */
static Py_ssize_t packed_size(const unsigned char *src, int64_t a, int64_t b) {
    Py_ssize_t size = 0;
    for (int64_t j = a; j < b; j++) {
        uint64_t v;
        memcpy(&v, src + 8 * j, 8);
        size += varint_size(v);
    }
    return size;
}

/* The packed varints of values[a:b], `packed` bytes (packed_size). Two shortcuts give the same bytes as
 * put_varint value by value: a column of one-byte values (segment ids) is a plain narrowing copy, and a value
 * below 2^28 is spread into 7-bit groups with its continuation bits in a few shifts and stored as one 4-byte
 * word, advancing by its size: no branch per byte (token ids take 1 to 3 bytes at random; a branch per byte
 * mispredicts). A word store writes up to 3 bytes past the value's end, which the next values overwrite, so it
 * is used only while at least 3 values follow (each takes a byte at least): it never writes past the column. */
static unsigned char *put_packed(unsigned char *p, const unsigned char *src, int64_t a, int64_t b,
                                 Py_ssize_t packed) {
    if (packed == b - a) {
        for (int64_t j = a; j < b; j++) {
            uint64_t v;
            memcpy(&v, src + 8 * j, 8);
            *p++ = (unsigned char)v;
        }
        return p;
    }
    int64_t j = a;
    for (; j < b - 3; j++) {
        uint64_t v;
        memcpy(&v, src + 8 * j, 8);
        if (v >= ((uint64_t)1 << 28)) {
            p = put_varint(p, v);
            continue;
        }
        uint32_t x = (uint32_t)v;
        Py_ssize_t n = varint_size(v); /* 1..4 */
        uint32_t w = (x & 0x7Fu) | ((x << 1) & 0x7F00u) | ((x << 2) & 0x7F0000u) | ((x << 3) & 0x7F000000u);
        w |= 0x808080u & ((1u << (8 * (n - 1))) - 1u); /* continuation bits on every byte but the last */
        p[0] = (unsigned char)w;
        p[1] = (unsigned char)(w >> 8);
        p[2] = (unsigned char)(w >> 16);
        p[3] = (unsigned char)(w >> 24);
        p += n;
    }
    for (; j < b; j++) {
        uint64_t v;
        memcpy(&v, src + 8 * j, 8);
        p = put_varint(p, v);
    }
    return p;
}

/* A Features map entry around `packed` bytes of varints: { key = 1; value = 2: Feature { int64_list = 3:
 * Int64List { value = 1, packed } } }; its size with its own tag and length. */
static inline Py_ssize_t entry_size(Py_ssize_t key_len, Py_ssize_t packed) {
    Py_ssize_t list_len = packed ? 1 + varint_size((uint64_t)packed) + packed : 0;
    Py_ssize_t feature_len = 1 + varint_size((uint64_t)list_len) + list_len;
    Py_ssize_t entry_len = key_len + 1 + varint_size((uint64_t)feature_len) + feature_len;
    return 1 + varint_size((uint64_t)entry_len) + entry_len;
}

/* Everything of a map entry before its `packed` bytes of varints (which the caller writes next). */
static unsigned char *put_entry_head(unsigned char *p, const Py_buffer *key, Py_ssize_t packed) {
    Py_ssize_t list_len = packed ? 1 + varint_size((uint64_t)packed) + packed : 0;
    Py_ssize_t feature_len = 1 + varint_size((uint64_t)list_len) + list_len;
    *p++ = 0x0a;
    p = put_varint(p, (uint64_t)(key->len + 1 + varint_size((uint64_t)feature_len) + feature_len));
    memcpy(p, key->buf, key->len);
    p += key->len;
    *p++ = 0x12;
    p = put_varint(p, (uint64_t)feature_len);
    *p++ = 0x1a;
    p = put_varint(p, (uint64_t)list_len);
    if (packed) {
        *p++ = 0x0a;
        p = put_varint(p, (uint64_t)packed);
    }
    return p;
}

static unsigned char *put_entry(unsigned char *p, const Py_buffer *key, const unsigned char *src, int64_t a, int64_t b,
                                Py_ssize_t packed) {
    p = put_entry_head(p, key, packed);
    return packed ? put_packed(p, src, a, b, packed) : p;
}

/* ------------------------------------------------------------------ columns derived from a block's pieces */
/* A packed block (transforms/shard/packing.py) has per token a position (distance from its piece's start) and a
 * segment id (its piece's number inside its example, from 1), both 0 on the padding after the last real token.
 * Both follow from the pieces' starts alone: `cuts`, rising offsets into the block's token stream, every example
 * start below `real` among them; `splits[e]` the first piece of example e. Framing them from the starts spares
 * the packer two int64 arrays per block and the framer a pass over each (same bytes as framing those arrays). */
enum { DERIVED_NONE = 0, DERIVED_POSITIONS = 1, DERIVED_SEGMENT_IDS = 2 };

typedef struct {
    int kind;
    const int64_t *cuts, *splits;
    int64_t ncuts, real, seq_len;
} Derived;

static inline int64_t piece_end(const Derived *d, int64_t j) { return j + 1 < d->ncuts ? d->cuts[j + 1] : d->real; }

static inline int64_t padding_of(const Derived *d, Py_ssize_t e) {
    int64_t start = e * d->seq_len, end = start + d->seq_len;
    return end > d->real ? end - (d->real > start ? d->real : start) : 0;
}

/* Bytes of the varints 0, 1, ..., len - 1. */
static inline int64_t ramp_size(int64_t len) {
    int64_t size = len;
    for (int64_t t = 128; t < len; t <<= 7) size += len - t;
    return size;
}

static Py_ssize_t derived_size(const Derived *d, Py_ssize_t e) {
    int64_t size = padding_of(d, e);
    for (int64_t j = d->splits[e]; j < d->splits[e + 1]; j++) {
        int64_t len = piece_end(d, j) - d->cuts[j];
        size += d->kind == DERIVED_POSITIONS ? ramp_size(len) : len * varint_size((uint64_t)(j - d->splits[e] + 1));
    }
    return (Py_ssize_t)size;
}

static unsigned char *put_derived(unsigned char *p, const Derived *d, Py_ssize_t e) {
    for (int64_t j = d->splits[e]; j < d->splits[e + 1]; j++) {
        int64_t len = piece_end(d, j) - d->cuts[j];
        if (d->kind == DERIVED_POSITIONS) {
            int64_t v = 0;
            for (; v < len && v < 128; v++) *p++ = (unsigned char)v;
            for (; v < len && v < 16384; v++, p += 2) {
                p[0] = (unsigned char)(v | 0x80);
                p[1] = (unsigned char)(v >> 7);
            }
            for (; v < len; v++) p = put_varint(p, (uint64_t)v);
        } else {
            uint64_t segment = (uint64_t)(j - d->splits[e] + 1);
            if (segment < 128) {
                memset(p, (int)segment, (size_t)len);
                p += len;
            } else {
                for (int64_t v = 0; v < len; v++) p = put_varint(p, segment);
            }
        }
    }
    int64_t pad = padding_of(d, e);
    memset(p, 0, (size_t)pad);
    return p + pad;
}

/* Reads (key_field, kind, cuts, splits, real, seq_len) into kb, cb, sb and d; -1 (nothing held) on error. */
static int get_derived_entry(PyObject *item, Py_ssize_t n, Py_buffer *kb, Py_buffer *cb, Py_buffer *sb, Derived *d) {
    PyObject *key, *cuts, *splits;
    long long real, seq_len;
    if (!PyArg_ParseTuple(item, "OiOOLL", &key, &d->kind, &cuts, &splits, &real, &seq_len)) return -1;
    if (PyObject_GetBuffer(key, kb, PyBUF_SIMPLE) < 0) return -1;
    if (PyObject_GetBuffer(cuts, cb, PyBUF_C_CONTIGUOUS) < 0) {
        PyBuffer_Release(kb);
        return -1;
    }
    if (PyObject_GetBuffer(splits, sb, PyBUF_C_CONTIGUOUS) < 0) {
        PyBuffer_Release(kb);
        PyBuffer_Release(cb);
        return -1;
    }
    d->cuts = (const int64_t *)cb->buf;
    d->splits = (const int64_t *)sb->buf;
    d->ncuts = cb->len / 8;
    d->real = real;
    d->seq_len = seq_len;
    /* Everything the loops rely on: every example has pieces, its first starting at the example's start, and the
     * starts rise, below `real`, which the examples hold. Lengths are then positive and indexes in range. */
    int bad = (d->kind != DERIVED_POSITIONS && d->kind != DERIVED_SEGMENT_IDS) || cb->len % 8 || sb->len != 8 * (n + 1)
              || seq_len < 1 || real < 1 || n < 1 || real > (int64_t)n * seq_len || d->splits[0] != 0
              || d->splits[n] != d->ncuts;
    for (Py_ssize_t e = 0; !bad && e < n; e++)
        bad = d->splits[e] >= d->splits[e + 1] || d->cuts[d->splits[e]] != e * seq_len;
    for (int64_t j = 0; !bad && j < d->ncuts; j++)
        bad = (j && d->cuts[j] <= d->cuts[j - 1]) || d->cuts[j] >= real;
    if (bad) {
        PyBuffer_Release(kb);
        PyBuffer_Release(cb);
        PyBuffer_Release(sb);
        PyErr_SetString(PyExc_ValueError, "a derived column needs kind 1 or 2, rising piece starts below real, "
                                          "every example starting a piece, and real within the examples");
        return -1;
    }
    return 0;
}

/* The (key_field, buffers...) entries of a call as a fast sequence of at most MAX_FEATURES; NULL on error. */
static PyObject *feature_entries(PyObject *arg, const char *what) {
    PyObject *seq = PySequence_Fast(arg, what);
    if (seq != NULL && PySequence_Fast_GET_SIZE(seq) > MAX_FEATURES) {
        Py_DECREF(seq);
        PyErr_SetString(PyExc_ValueError, "too many features");
        return NULL;
    }
    return seq;
}

/* The key field and int64 values buffers of one entry; -1 (and nothing held) on error. */
static int get_entry_buffers(PyObject *key, PyObject *values, Py_buffer *kb, Py_buffer *vb) {
    if (PyObject_GetBuffer(key, kb, PyBUF_SIMPLE) < 0) return -1;
    if (PyObject_GetBuffer(values, vb, PyBUF_C_CONTIGUOUS) < 0) {
        PyBuffer_Release(kb);
        return -1;
    }
    if (vb->len % 8 != 0) {
        PyBuffer_Release(kb);
        PyBuffer_Release(vb);
        PyErr_SetString(PyExc_ValueError, "values must be buffers of int64");
        return -1;
    }
    return 0;
}

/* encode_int64_example(((key_field, int64 buffer), ...)) -> bytes of a tf.train.Example.
 * `key_field` is the encoded map-entry key (tag 1, length, name) and entries come in the order to write
 * (sorted by name: example_codec.encode_example decides). Sizes are computed first, so every byte is written
 * once, and the GIL is released while encoding: packing threads (FnApiRunner multi_threading) run in parallel. */
static PyObject *encode_int64_example(PyObject *self, PyObject *arg) {
    PyObject *seq = feature_entries(arg, "encode_int64_example needs a sequence of (key_field, int64 buffer)");
    if (seq == NULL) return NULL;
    Py_ssize_t k = PySequence_Fast_GET_SIZE(seq);
    Py_buffer keys[MAX_FEATURES], vals[MAX_FEATURES];
    Py_ssize_t packed[MAX_FEATURES];
    Py_ssize_t got = 0, body = 0;
    PyObject *out = NULL;
    for (; got < k; got++) {
        PyObject *item = PySequence_Fast_GET_ITEM(seq, got);
        PyObject *key, *values;
        if (!PyTuple_Check(item) || !PyArg_ParseTuple(item, "OO", &key, &values)) {
            PyErr_SetString(PyExc_TypeError, "each entry must be a (key_field, int64 buffer) tuple");
            goto done;
        }
        if (get_entry_buffers(key, values, &keys[got], &vals[got]) < 0) goto done;
    }
    Py_BEGIN_ALLOW_THREADS
    for (Py_ssize_t i = 0; i < k; i++) {
        packed[i] = packed_size((const unsigned char *)vals[i].buf, 0, vals[i].len / 8);
        body += entry_size(keys[i].len, packed[i]);
    }
    Py_END_ALLOW_THREADS
    out = PyBytes_FromStringAndSize(NULL, 1 + varint_size((uint64_t)body) + body);
    if (out == NULL) goto done;
    unsigned char *p = (unsigned char *)PyBytes_AS_STRING(out);
    Py_BEGIN_ALLOW_THREADS
    *p++ = 0x0a;
    p = put_varint(p, (uint64_t)body);
    for (Py_ssize_t i = 0; i < k; i++)
        p = put_entry(p, &keys[i], (const unsigned char *)vals[i].buf, 0, vals[i].len / 8, packed[i]);
    Py_END_ALLOW_THREADS
done:
    for (Py_ssize_t i = 0; i < got; i++) {
        PyBuffer_Release(&keys[i]);
        PyBuffer_Release(&vals[i]);
    }
    Py_DECREF(seq);
    return out;
}

/* ------------------------------------------------------------------------------- framed blocks of examples */
/* CRC-32C (Castagnoli), as TFRecord framing needs: SSE4.2's crc32 instruction where the CPU has it, else a
 * byte-wise table (the same values; tests compare with google-crc32c). */
static uint32_t crc32c_table[256];

static void crc32c_init_table(void) {
    for (uint32_t i = 0; i < 256; i++) {
        uint32_t c = i;
        for (int k = 0; k < 8; k++) c = (c >> 1) ^ (0x82F63B78u & (0u - (c & 1u)));
        crc32c_table[i] = c;
    }
}

static uint32_t crc32c_table_update(uint32_t crc, const unsigned char *p, size_t n) {
    crc = ~crc;
    while (n--) crc = crc32c_table[(crc ^ *p++) & 0xFF] ^ (crc >> 8);
    return ~crc;
}

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
__attribute__((target("sse4.2"))) static uint32_t crc32c_hw_update(uint32_t crc, const unsigned char *p, size_t n) {
    uint64_t c = ~crc;
    for (; n >= 8; n -= 8, p += 8) {
        uint64_t word;
        memcpy(&word, p, 8);
        c = __builtin_ia32_crc32di(c, word);
    }
    uint32_t c32 = (uint32_t)c;
    while (n--) c32 = __builtin_ia32_crc32qi(c32, *p++);
    return ~c32;
}
static int crc32c_hw = 0;
#define CRC32C_DETECT() (crc32c_hw = __builtin_cpu_supports("sse4.2"))
#define CRC32C(p, n) (crc32c_hw ? crc32c_hw_update(0, (p), (n)) : crc32c_table_update(0, (p), (n)))
#else
#define CRC32C_DETECT() ((void)0)
#define CRC32C(p, n) crc32c_table_update(0, (p), (n))
#endif

static inline uint32_t masked_crc32c(const unsigned char *p, size_t n) {
    uint32_t crc = CRC32C(p, n);
    return ((crc >> 15) | (crc << 17)) + 0xA282EAD8u;
}

static inline unsigned char *put_le32(unsigned char *p, uint32_t v) {
    for (int i = 0; i < 4; i++) p[i] = (unsigned char)(v >> (8 * i));
    return p + 4;
}

/* An entry may also be a derived column, (key_field, kind, cuts, splits, real, seq_len): see Derived above.
 * frame_int64_examples(((key_field, int64 values, int64 splits), ...), n) -> bytes of n TFRecord records, each
 * a tf.train.Example laid out exactly as encode_int64_example writes it; example e's value of a feature is
 * values[splits[e]:splits[e + 1]]. One call per block of examples (transforms/shard/packing.py), all of its work
 * without the GIL: sizes first, then every byte written once, framed (length, masked CRC-32C of the length,
 * data, masked CRC-32C of the data) as tf.io.TFRecordWriter does. */
static PyObject *frame_int64_examples(PyObject *self, PyObject *args) {
    PyObject *arg;
    Py_ssize_t n;
    if (!PyArg_ParseTuple(args, "On", &arg, &n)) return NULL;
    if (n < 0) {
        PyErr_SetString(PyExc_ValueError, "the number of examples must not be negative");
        return NULL;
    }
    PyObject *seq = feature_entries(arg, "frame_int64_examples needs a sequence of (key_field, values, splits)");
    if (seq == NULL) return NULL;
    Py_ssize_t k = PySequence_Fast_GET_SIZE(seq);
    Py_buffer keys[MAX_FEATURES], vals[MAX_FEATURES], splits[MAX_FEATURES];
    Derived derived[MAX_FEATURES];
    Py_ssize_t got = 0;
    Py_ssize_t *sizes = NULL; /* per example and feature: packed bytes; then per example: Example bytes */
    PyObject *out = NULL;
    for (; got < k; got++) {
        PyObject *item = PySequence_Fast_GET_ITEM(seq, got);
        PyObject *key, *values, *bounds;
        derived[got].kind = DERIVED_NONE;
        if (PyTuple_Check(item) && PyTuple_GET_SIZE(item) == 6) {
            if (get_derived_entry(item, n, &keys[got], &vals[got], &splits[got], &derived[got]) < 0) goto done;
            continue;
        }
        if (!PyTuple_Check(item) || !PyArg_ParseTuple(item, "OOO", &key, &values, &bounds)) {
            PyErr_SetString(PyExc_TypeError, "each entry must be a (key_field, int64 values, int64 splits) tuple "
                                             "or a derived column (key_field, kind, cuts, splits, real, seq_len)");
            goto done;
        }
        if (get_entry_buffers(key, values, &keys[got], &vals[got]) < 0) goto done;
        if (PyObject_GetBuffer(bounds, &splits[got], PyBUF_C_CONTIGUOUS) < 0) {
            PyBuffer_Release(&keys[got]);
            PyBuffer_Release(&vals[got]);
            goto done;
        }
        const int64_t *b = (const int64_t *)splits[got].buf;
        int bad = splits[got].len != 8 * (n + 1) || b[0] != 0 || b[n] != vals[got].len / 8;
        for (Py_ssize_t e = 0; !bad && e < n; e++) bad = b[e] > b[e + 1];
        if (bad) {
            got++;
            PyErr_SetString(PyExc_ValueError, "splits must be n + 1 rising int64 offsets from 0 to the number of "
                                              "values");
            goto done;
        }
    }
    sizes = (Py_ssize_t *)PyMem_Malloc(sizeof(Py_ssize_t) * (size_t)(n * (k + 1) + 1));
    if (sizes == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    Py_ssize_t total = 0;
    Py_BEGIN_ALLOW_THREADS
    for (Py_ssize_t e = 0; e < n; e++) {
        Py_ssize_t body = 0;
        for (Py_ssize_t i = 0; i < k; i++) {
            const int64_t *b = (const int64_t *)splits[i].buf;
            Py_ssize_t size = derived[i].kind ? derived_size(&derived[i], e)
                                              : packed_size((const unsigned char *)vals[i].buf, b[e], b[e + 1]);
            sizes[e * (k + 1) + i] = size;
            body += entry_size(keys[i].len, size);
        }
        sizes[e * (k + 1) + k] = body;
        total += 8 + 4 + 1 + varint_size((uint64_t)body) + body + 4;
    }
    Py_END_ALLOW_THREADS
    out = PyBytes_FromStringAndSize(NULL, total);
    if (out == NULL) goto done;
    unsigned char *p = (unsigned char *)PyBytes_AS_STRING(out);
    Py_BEGIN_ALLOW_THREADS
    for (Py_ssize_t e = 0; e < n; e++) {
        Py_ssize_t body = sizes[e * (k + 1) + k];
        uint64_t length = (uint64_t)(1 + varint_size((uint64_t)body) + body);
        unsigned char *frame = p;
        for (int i = 0; i < 8; i++) p[i] = (unsigned char)(length >> (8 * i));
        p += 8;
        p = put_le32(p, masked_crc32c(frame, 8));
        unsigned char *data = p;
        *p++ = 0x0a;
        p = put_varint(p, (uint64_t)body);
        for (Py_ssize_t i = 0; i < k; i++) {
            const int64_t *b = (const int64_t *)splits[i].buf;
            Py_ssize_t size = sizes[e * (k + 1) + i];
            if (derived[i].kind) {
                p = put_entry_head(p, &keys[i], size);
                p = size ? put_derived(p, &derived[i], e) : p;
            } else {
                p = put_entry(p, &keys[i], (const unsigned char *)vals[i].buf, b[e], b[e + 1], size);
            }
        }
        p = put_le32(p, masked_crc32c(data, (size_t)(p - data)));
    }
    Py_END_ALLOW_THREADS
done:
    for (Py_ssize_t i = 0; i < got; i++) {
        PyBuffer_Release(&keys[i]);
        PyBuffer_Release(&vals[i]);
        PyBuffer_Release(&splits[i]);
    }
    PyMem_Free(sizes);
    Py_DECREF(seq);
    return out;
}

/* masked_crc32c(data, table=False): the framing checksum, by the instruction or (table=True, for tests) the table. */
static PyObject *masked_crc32c_py(PyObject *self, PyObject *args) {
    Py_buffer view;
    int table = 0;
    if (!PyArg_ParseTuple(args, "y*|p", &view, &table)) return NULL;
    uint32_t crc = table ? crc32c_table_update(0, (const unsigned char *)view.buf, (size_t)view.len)
                         : CRC32C((const unsigned char *)view.buf, (size_t)view.len);
    PyBuffer_Release(&view);
    return PyLong_FromUnsignedLong(((crc >> 15) | (crc << 17)) + 0xA282EAD8u);
}

static PyMethodDef methods[] = {
    {"encode_varints", encode_varints, METH_O, "int64 buffer -> packed varint bytes"},
    {"decode_varints", decode_varints, METH_O, "packed varint bytes -> bytearray of int64"},
    {"encode_int64_example", encode_int64_example, METH_O, "((key_field, int64 buffer), ...) -> Example bytes"},
    {"frame_int64_examples", frame_int64_examples, METH_VARARGS,
     "(((key_field, int64 values, int64 splits), ...), n) -> n framed TFRecord records of Examples"},
    {"masked_crc32c", masked_crc32c_py, METH_VARARGS, "(bytes, table=False) -> TFRecord's masked CRC-32C"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_varint", NULL, -1, methods};

PyMODINIT_FUNC PyInit__varint(void) {
    crc32c_init_table();
    CRC32C_DETECT();
    return PyModule_Create(&module);
}
