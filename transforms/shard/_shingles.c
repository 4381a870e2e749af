/* Word-shingle window hashes and one-permutation signatures: the hot path of `pileprep shard --near-dedup`.
 *
 * Optional accelerator for transforms/shard/near_dedup/ (shingling.py, minhash.py), which falls back to numpy when this extension is not
 * built; the values are bit-identical (tests/unit/shard/test_near_dedup_c.py compares both on fuzzed text).
 *
 * windows(texts, n) -> (bytes, bytes): for each text, the 64-bit hash of every n-word window of its normalised
 *   words, in text order, repeats kept (near_dedup/shingling.py `_ascii_words` + `_window_hashes`), all texts' windows
 *   concatenated (little-endian uint64), and one int64 count per text. Only ASCII texts are read here (`\w` is
 *   [0-9A-Za-z_] and lower case is A-Z -> a-z for them); a non-ASCII text gets the count -1 and its shingles
 *   come from the Python path (Unicode lower() and \w), so no Unicode rule is reimplemented here.
 * oph(windows, counts, k, salt, donors) -> bytes: (texts, k) uint32 one-permutation signatures with optimal
 *   densification (near_dedup/minhash.py `oph_signatures`); a bin's minimum is the same over a multiset as over its set,
 *   so the windows need not be sorted or unique. A count of 0 gives all-0xFFFFFFFF.
 * band_keys(sigs, bands, rows) -> bytes: (texts, bands) uint64 (near_dedup/minhash.py `band_keys`).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

#define GOLDEN 0x9E3779B97F4A7C15ULL
#define FNV_PRIME 0x100000001B3ULL
#define N_POWERS 1024 /* near_dedup._POWERS: a word's bytes past the 1024th share the last power */

static uint64_t powers[N_POWERS];
static unsigned char is_word[256];
static uint64_t lower_plus_1[256];

static inline uint64_t mix(uint64_t x) {
    x ^= x >> 30;
    x *= 0xBF58476D1CE4E5B9ULL;
    x ^= x >> 27;
    x *= 0x94D049BB133111EBULL;
    return x ^ (x >> 31);
}

typedef struct {
    uint64_t *data;
    Py_ssize_t len, cap;
} vec_u64;

static int vec_reserve(vec_u64 *v, Py_ssize_t extra) {
    if (v->len + extra <= v->cap) return 0;
    Py_ssize_t cap = v->cap ? v->cap : 4096;
    while (cap < v->len + extra) cap *= 2;
    uint64_t *p = (uint64_t *)PyMem_RawRealloc(v->data, (size_t)cap * sizeof(uint64_t));
    if (p == NULL) return -1;
    v->data = p;
    v->cap = cap;
    return 0;
}

/* The word hashes of one ASCII text appended to `words` (near_dedup/shingling.py `_ascii_words`); -1 when out of memory. */
static int text_words(const unsigned char *s, Py_ssize_t len, vec_u64 *words) {
    Py_ssize_t i = 0;
    while (i < len) {
        while (i < len && !is_word[s[i]]) i++;
        if (i >= len) break;
        uint64_t h = 0;
        Py_ssize_t start = i, stop = len - i > N_POWERS ? i + N_POWERS : len;
        while (i < stop && is_word[s[i]]) {
            h += lower_plus_1[s[i]] * powers[i - start];
            i++;
        }
        while (i < len && is_word[s[i]]) { /* past the power table: the last power (still a fixed hash) */
            h += lower_plus_1[s[i]] * powers[N_POWERS - 1];
            i++;
        }
        if (vec_reserve(words, 1) < 0) return -1;
        words->data[words->len++] = mix(h ^ ((uint64_t)(i - start) << 48));
    }
    return 0;
}

/* The hash of one window of `n` word hashes (near_dedup/shingling.py `_window_hashes`): h = n, then per word
   h = mix(h * golden + w). */
static inline uint64_t window_hash(const uint64_t *w, Py_ssize_t n) {
    uint64_t h = (uint64_t)n;
    for (Py_ssize_t k = 0; k < n; k++) h = mix(h * GOLDEN + w[k]);
    return h;
}

/* The window hashes of one ASCII text appended to `out`; returns how many, or -1 when out of memory. The words
   are hashed first, then every window from that array (independent iterations, which the CPU overlaps). A text
   of fewer than n words (but at least one) is one window of all of them. */
static Py_ssize_t text_windows(const unsigned char *s, Py_ssize_t len, int n, vec_u64 *words, vec_u64 *out) {
    words->len = 0;
    if (text_words(s, len, words) < 0) return -1;
    Py_ssize_t w = words->len;
    if (w == 0) return 0;
    Py_ssize_t count = w >= n ? w - n + 1 : 1, width = w >= n ? n : w;
    if (vec_reserve(out, count) < 0) return -1;
    for (Py_ssize_t i = 0; i < count; i++) out->data[out->len + i] = window_hash(words->data + i, width);
    out->len += count;
    return count;
}

static PyObject *windows(PyObject *Py_UNUSED(self), PyObject *args) {
    PyObject *texts;
    int n;
    if (!PyArg_ParseTuple(args, "O!i", &PyList_Type, &texts, &n)) return NULL;
    if (n < 1) {
        PyErr_SetString(PyExc_ValueError, "windows: n must be at least 1");
        return NULL;
    }
    Py_ssize_t count = PyList_GET_SIZE(texts);
    PyObject **held = PyMem_Malloc((count ? count : 1) * sizeof(PyObject *));
    PyObject *counts = PyBytes_FromStringAndSize(NULL, count * 8);
    if (held == NULL || counts == NULL) {
        PyMem_Free(held);
        Py_XDECREF(counts);
        return PyErr_NoMemory();
    }
    for (Py_ssize_t t = 0; t < count; t++) {
        PyObject *s = PyList_GET_ITEM(texts, t);
        if (!PyUnicode_Check(s)) {
            for (Py_ssize_t u = 0; u < t; u++) Py_DECREF(held[u]);
            PyMem_Free(held);
            Py_DECREF(counts);
            PyErr_SetString(PyExc_TypeError, "windows: texts must be a list of str");
            return NULL;
        }
#if PY_VERSION_HEX < 0x030C0000
        if (PyUnicode_READY(s) < 0) {
            for (Py_ssize_t u = 0; u < t; u++) Py_DECREF(held[u]);
            PyMem_Free(held);
            Py_DECREF(counts);
            return NULL;
        }
#endif
        Py_INCREF(s);
        held[t] = s;
    }
    int64_t *cnt = (int64_t *)PyBytes_AS_STRING(counts);
    vec_u64 out = {NULL, 0, 0}, words = {NULL, 0, 0};
    int failed = 0;
    Py_BEGIN_ALLOW_THREADS
    for (Py_ssize_t t = 0; t < count && !failed; t++) {
        PyObject *s = held[t];
        if (!PyUnicode_IS_ASCII(s)) {
            cnt[t] = -1; /* the Python path (Unicode rules) */
            continue;
        }
        Py_ssize_t got = text_windows(PyUnicode_1BYTE_DATA(s), PyUnicode_GET_LENGTH(s), n, &words, &out);
        if (got < 0) failed = 1;
        cnt[t] = got;
    }
    Py_END_ALLOW_THREADS
    PyMem_RawFree(words.data);
    for (Py_ssize_t t = 0; t < count; t++) Py_DECREF(held[t]);
    PyMem_Free(held);
    if (failed) {
        PyMem_RawFree(out.data);
        Py_DECREF(counts);
        return PyErr_NoMemory();
    }
    PyObject *flat = PyBytes_FromStringAndSize((const char *)out.data, out.len * 8);
    PyMem_RawFree(out.data);
    if (flat == NULL) {
        Py_DECREF(counts);
        return NULL;
    }
    return Py_BuildValue("(NN)", flat, counts);
}

static PyObject *oph(PyObject *Py_UNUSED(self), PyObject *args) {
    Py_buffer wv, cv, dv;
    int k;
    unsigned long long salt;
    if (!PyArg_ParseTuple(args, "y*y*iKy*", &wv, &cv, &k, &salt, &dv)) return NULL;
    PyObject *result = NULL;
    Py_ssize_t docs = cv.len / 8, attempts = k > 0 ? dv.len / 8 / k : 0;
    const uint64_t *w = (const uint64_t *)wv.buf;
    const int64_t *cnt = (const int64_t *)cv.buf, *donors = (const int64_t *)dv.buf;
    if (k < 1 || wv.len % 8 || cv.len % 8 || dv.len != (Py_ssize_t)attempts * k * 8) {
        PyErr_SetString(PyExc_ValueError, "oph: bad buffer sizes");
        goto done;
    }
    Py_ssize_t total = 0;
    for (Py_ssize_t d = 0; d < docs; d++) {
        if (cnt[d] < 0) {
            PyErr_SetString(PyExc_ValueError, "oph: negative count");
            goto done;
        }
        total += cnt[d];
    }
    if (total != wv.len / 8) {
        PyErr_SetString(PyExc_ValueError, "oph: counts do not sum to the windows");
        goto done;
    }
    for (Py_ssize_t i = 0; i < attempts * k; i++) {
        if (donors[i] < 0 || donors[i] >= k) {
            PyErr_SetString(PyExc_ValueError, "oph: donor bin out of range");
            goto done;
        }
    }
    result = PyBytes_FromStringAndSize(NULL, docs * k * 4);
    uint32_t *bins = PyMem_Malloc(k * sizeof(uint32_t));
    unsigned char *filled = PyMem_Malloc(k);
    if (result == NULL || bins == NULL || filled == NULL) {
        Py_CLEAR(result);
        PyMem_Free(bins);
        PyMem_Free(filled);
        if (!PyErr_Occurred()) PyErr_NoMemory();
        goto done;
    }
    uint32_t *sig = (uint32_t *)PyBytes_AS_STRING(result);
    Py_BEGIN_ALLOW_THREADS
    const uint64_t *p = w;
    for (Py_ssize_t d = 0; d < docs; d++, sig += k) {
        Py_ssize_t m = cnt[d];
        if (m == 0) {
            for (int b = 0; b < k; b++) sig[b] = 0xFFFFFFFFu;
            continue;
        }
        memset(filled, 0, k);
        for (Py_ssize_t i = 0; i < m; i++) {
            uint64_t h = mix(p[i] ^ salt);
            int slot = (int)(((h >> 32) * (uint64_t)k) >> 32);
            uint32_t v = (uint32_t)h;
            if (!filled[slot] || v < bins[slot]) {
                bins[slot] = v;
                filled[slot] = 1;
            }
        }
        p += m;
        for (int b = 0; b < k; b++) {
            if (filled[b]) {
                sig[b] = bins[b];
                continue;
            }
            int found = 0;
            for (Py_ssize_t a = 0; a < attempts; a++) {
                int64_t src = donors[a * k + b];
                if (filled[src]) {
                    sig[b] = bins[src];
                    found = 1;
                    break;
                }
            }
            for (int j = 1; !found && j < k; j++) { /* rare: the next filled bin after b, wrapping */
                int src = (b + j) % k;
                if (filled[src]) {
                    sig[b] = bins[src];
                    found = 1;
                }
            }
        }
    }
    Py_END_ALLOW_THREADS
    PyMem_Free(bins);
    PyMem_Free(filled);
done:
    PyBuffer_Release(&wv);
    PyBuffer_Release(&cv);
    PyBuffer_Release(&dv);
    return result;
}

static PyObject *band_keys(PyObject *Py_UNUSED(self), PyObject *args) {
    Py_buffer sv;
    int bands, rows;
    if (!PyArg_ParseTuple(args, "y*ii", &sv, &bands, &rows)) return NULL;
    PyObject *result = NULL;
    Py_ssize_t width = (Py_ssize_t)bands * rows;
    if (bands < 1 || rows < 1 || sv.len % (width * 4)) {
        PyErr_SetString(PyExc_ValueError, "band_keys: bad buffer size");
        goto done;
    }
    Py_ssize_t docs = sv.len / (width * 4);
    result = PyBytes_FromStringAndSize(NULL, docs * bands * 8);
    if (result == NULL) goto done;
    const uint32_t *sig = (const uint32_t *)sv.buf;
    uint64_t *out = (uint64_t *)PyBytes_AS_STRING(result);
    for (Py_ssize_t d = 0; d < docs; d++, sig += width) {
        for (int b = 0; b < bands; b++) {
            uint64_t h = (uint64_t)(b + 1);
            for (int j = 0; j < rows; j++) h = mix(h * GOLDEN + sig[b * rows + j]);
            *out++ = h;
        }
    }
done:
    PyBuffer_Release(&sv);
    return result;
}

static PyMethodDef methods[] = {
    {"windows", windows, METH_VARARGS, "(texts: list[str], n) -> (window hashes uint64, counts int64; -1: not ASCII)"},
    {"oph", oph, METH_VARARGS, "(windows, counts, k, salt, donors int64 [attempts, k]) -> uint32 [texts, k]"},
    {"band_keys", band_keys, METH_VARARGS, "(signatures uint32 [texts, bands * rows], bands, rows) -> uint64"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_shingles", NULL, -1, methods, NULL, NULL, NULL, NULL};

PyMODINIT_FUNC PyInit__shingles(void) {
    powers[0] = 1;
    for (int i = 1; i < N_POWERS; i++) powers[i] = powers[i - 1] * FNV_PRIME;
    for (int c = 0; c < 256; c++) {
        is_word[c] = (c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_';
        lower_plus_1[c] = (uint64_t)((c >= 'A' && c <= 'Z') ? c + 32 : c) + 1;
    }
    return PyModule_Create(&module);
}
