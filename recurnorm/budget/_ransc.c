/* Interleaved rANS, compiled: the same bytes as rans.py's numpy reference, ~50x faster.
 *
 * The format is in docs/FORMAT.md (rans, lanes = W > 0). Lane i % W codes unit i;
 * 32-bit states in [2^16, 2^32), 16-bit renormalization words, tables of 2^prec.
 * The numpy implementation in rans.py is the specification and the fallback when
 * this module is not built; tests check that both give identical bytes and
 * accept or reject the same streams.
 *
 * Also the context search's exact-integer histograms (search.axis_histograms), its
 * k-means (cluster._kmeans, for one problem where every sum is an exact float32 integer),
 * the fields coding's split of float words (codecs.split_words) and its inverse, and the row
 * parents search's exact scoring of candidate rows (parents.find's offer).
 *
 * Only the Python C API and the buffer protocol: no numpy headers, so the module
 * builds wherever Python's headers and a C compiler are present. The GIL is
 * released while coding.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <math.h>
#include <stdint.h>
#ifdef __SSE2__
#include <emmintrin.h>
#endif
#include <stdlib.h>
#include <string.h>

#define RANS_L 65536u /* state lower bound */
#define MAX_PREC 16
#define MAX_NSYM 4096
#define MAX_K 256 /* contexts are uint8 ids */

/* Per context row: cumulative counts, and whether the row sums to exactly 2^prec. */
static void cumulate(const uint32_t *freq, Py_ssize_t k, Py_ssize_t nsym, uint32_t m,
                     uint32_t *cum, uint8_t *filled) {
    for (Py_ssize_t c = 0; c < k; c++) {
        uint64_t run = 0;
        for (Py_ssize_t s = 0; s < nsym; s++) {
            cum[c * nsym + s] = (uint32_t)run;
            run += freq[c * nsym + s];
        }
        filled[c] = run == m;
    }
}

static int get_buffer(PyObject *obj, Py_buffer *view, const char *what, int writable) {
    if (PyObject_GetBuffer(obj, view, writable ? PyBUF_WRITABLE | PyBUF_C_CONTIGUOUS : PyBUF_C_CONTIGUOUS) < 0) {
        PyErr_Format(PyExc_TypeError, "%s: expected a contiguous buffer", what);
        return -1;
    }
    return 0;
}

/* encode(sym: u16[n], ctx: u8[n] | None, freq: u32[k*nsym], nsym, prec, lanes) -> bytes */
static PyObject *ilv_encode(PyObject *Py_UNUSED(self), PyObject *args) {
    PyObject *sym_o, *ctx_o, *freq_o;
    int nsym_i, prec, lanes_i;
    if (!PyArg_ParseTuple(args, "OOOiii", &sym_o, &ctx_o, &freq_o, &nsym_i, &prec, &lanes_i)) return NULL;
    if (prec < 1 || prec > MAX_PREC || lanes_i < 1 || nsym_i < 1 || nsym_i > MAX_NSYM) {
        PyErr_SetString(PyExc_ValueError, "encode: prec, lanes or nsym out of range");
        return NULL;
    }
    Py_buffer sb, cb = {0}, fb;
    if (get_buffer(sym_o, &sb, "sym", 0) < 0) return NULL;
    if (get_buffer(freq_o, &fb, "freq", 0) < 0) { PyBuffer_Release(&sb); return NULL; }
    int has_ctx = ctx_o != Py_None;
    if (has_ctx && get_buffer(ctx_o, &cb, "ctx", 0) < 0) {
        PyBuffer_Release(&sb); PyBuffer_Release(&fb); return NULL;
    }
    PyObject *result = NULL;
    const Py_ssize_t n = sb.len / 2, nsym = nsym_i, lanes = lanes_i;
    const Py_ssize_t k = fb.len / 4 / nsym;
    const uint16_t *sym = sb.buf;
    const uint8_t *ctx = has_ctx ? cb.buf : NULL;
    const uint32_t *freq = fb.buf;
    const uint32_t m = 1u << prec;
    uint32_t *cum = NULL, *x = NULL;
    uint16_t *words = NULL;
    uint8_t filled[MAX_K];
    const char *err = NULL;
    if (k < 1 || k > MAX_K || fb.len != (Py_ssize_t)(4 * k * nsym) || (has_ctx && cb.len != n)) {
        err = "encode: buffer sizes disagree";
        goto done;
    }
    cum = malloc(sizeof(uint32_t) * k * nsym);
    x = malloc(sizeof(uint32_t) * lanes);
    /* At most one word per unit, and a spare slot in front: the branchless renormalization
     * below stores a word before it knows whether to keep it. Little-endian: the words are
     * written at the end of the result itself (moved down to the states and the result cut to
     * size after), so no second buffer's pages are touched and copied. */
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
    result = PyBytes_FromStringAndSize(NULL, 4 * lanes + 2 * (n + 1));
    if (result) words = (uint16_t *)(PyBytes_AS_STRING(result) + 4 * lanes);
#else
    words = malloc(sizeof(uint16_t) * (n + 1));
#endif
    if (!cum || !x || !words) { if (!PyErr_Occurred()) PyErr_NoMemory(); goto done; }
    cumulate(freq, k, nsym, m, cum, filled);
    Py_ssize_t steps = (n + lanes - 1) / lanes;
    uint16_t *const end = words + n + 1, *p = end; /* written backwards: the decoder reads forward */
    Py_BEGIN_ALLOW_THREADS
    for (Py_ssize_t j = 0; j < lanes; j++) x[j] = RANS_L;
    const uint32_t top = 32 - prec;
    for (Py_ssize_t t = steps - 1; t >= 0 && !err; t--) {
        Py_ssize_t lo = t * lanes, a = n - lo < lanes ? n - lo : lanes;
        /* Lanes in reverse, words written backwards: each step's words end up in lane order. */
        for (Py_ssize_t j = a - 1; j >= 0; j--) {
            Py_ssize_t i = lo + j;
            uint32_t c = ctx ? ctx[i] : 0;
            uint32_t s = sym[i];
            if (c >= (uint32_t)k || s >= (uint32_t)nsym) { err = "encode: symbol or context out of range"; break; }
            uint32_t f = freq[c * nsym + s];
            if (f == 0 || !filled[c]) { err = "encode: symbol has zero frequency or its row does not sum to 2**prec"; break; }
            uint32_t xs = x[j];
            /* Renormalize without a branch (whether a word goes out is a coin toss to the
             * predictor): store the low word, keep it only if the state overflows. */
            const uint32_t emit = (xs >> top) >= f;
            p[-1] = (uint16_t)xs;
            p -= emit;
            xs >>= emit << 4;
            x[j] = (xs / f) * m + xs % f + cum[c * nsym + s];
        }
    }
    Py_END_ALLOW_THREADS
    if (err) goto done;
    Py_ssize_t nw = end - p;
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
    memmove(words, p, 2 * nw);
    words = NULL; /* (the result's: not freed) */
    if (_PyBytes_Resize(&result, 4 * lanes + 2 * nw) < 0) goto done;
    uint8_t *out = (uint8_t *)PyBytes_AS_STRING(result);
#else
    result = PyBytes_FromStringAndSize(NULL, 4 * lanes + 2 * nw);
    if (!result) goto done;
    uint8_t *out = (uint8_t *)PyBytes_AS_STRING(result);
    for (Py_ssize_t i = 0; i < nw; i++) { out[4 * lanes + 2 * i] = p[i] & 0xFF; out[4 * lanes + 2 * i + 1] = p[i] >> 8; }
#endif
    for (Py_ssize_t j = 0; j < lanes; j++) { /* little-endian u32 states, then u16 words */
        out[4 * j] = x[j] & 0xFF; out[4 * j + 1] = (x[j] >> 8) & 0xFF;
        out[4 * j + 2] = (x[j] >> 16) & 0xFF; out[4 * j + 3] = x[j] >> 24;
    }
done:
    if (err && !PyErr_Occurred()) PyErr_SetString(PyExc_ValueError, err);
    if (PyErr_Occurred()) Py_CLEAR(result);
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
    words = NULL; /* (the result's, or never allocated) */
#endif
    free(cum); free(x); free(words);
    PyBuffer_Release(&sb); PyBuffer_Release(&fb);
    if (has_ctx) PyBuffer_Release(&cb);
    return result;
}

/* decode(data: bytes, ctx: u8[n] | None, freq: u32[k*nsym], nsym, prec, lanes, out: u16[n]) -> None
 * Raises ValueError on any inconsistency (the wrapper turns it into ArtifactError). */
static PyObject *ilv_decode(PyObject *Py_UNUSED(self), PyObject *args) {
    PyObject *data_o, *ctx_o, *freq_o, *out_o;
    int nsym_i, prec, lanes_i;
    if (!PyArg_ParseTuple(args, "OOOiiiO", &data_o, &ctx_o, &freq_o, &nsym_i, &prec, &lanes_i, &out_o))
        return NULL;
    if (prec < 1 || prec > MAX_PREC || lanes_i < 1 || nsym_i < 1 || nsym_i > MAX_NSYM) {
        PyErr_SetString(PyExc_ValueError, "decode: prec, lanes or nsym out of range");
        return NULL;
    }
    Py_buffer db, cb = {0}, fb, ob;
    if (get_buffer(data_o, &db, "data", 0) < 0) return NULL;
    if (get_buffer(freq_o, &fb, "freq", 0) < 0) { PyBuffer_Release(&db); return NULL; }
    if (get_buffer(out_o, &ob, "out", 1) < 0) { PyBuffer_Release(&db); PyBuffer_Release(&fb); return NULL; }
    int has_ctx = ctx_o != Py_None;
    if (has_ctx && get_buffer(ctx_o, &cb, "ctx", 0) < 0) {
        PyBuffer_Release(&db); PyBuffer_Release(&fb); PyBuffer_Release(&ob); return NULL;
    }
    const Py_ssize_t n = ob.len / 2, nsym = nsym_i, lanes = lanes_i;
    const Py_ssize_t k = fb.len / 4 / nsym;
    const uint8_t *data = db.buf, *ctx = has_ctx ? cb.buf : NULL;
    const uint32_t *freq = fb.buf;
    uint16_t *out = ob.buf;
    const uint32_t m = 1u << prec, mask = m - 1;
    uint32_t *cum = NULL, *x = NULL, *ef = NULL;
    void *lut = NULL;
    uint16_t *words = NULL;
    uint64_t *fc = NULL;
    uint8_t filled[MAX_K];
    const char *err = NULL;
    if (k < 1 || k > MAX_K || fb.len != (Py_ssize_t)(4 * k * nsym) || (has_ctx && cb.len != n)) {
        err = "decode: buffer sizes disagree";
        goto done;
    }
    if (db.len < 4 * lanes || db.len % 2) { err = "interleaved rans stream does not fit its lanes"; goto done; }
    cum = malloc(sizeof(uint32_t) * k * nsym);
    ef = malloc(sizeof(uint32_t) * k * nsym);
    x = malloc(sizeof(uint32_t) * lanes);
    if (!cum || !ef || !x) { PyErr_NoMemory(); goto done; }
    cumulate(freq, k, nsym, m, cum, filled);
    uint8_t present[MAX_K] = {0};
    Py_ssize_t n_present = 0;
    if (ctx) {
        /* (ids past k: refused while decoding); the scan ends once every context is seen */
        for (Py_ssize_t i = 0, seen = 0; i < n && seen < k; i++)
            if (!present[ctx[i]]) { present[ctx[i]] = 1; seen += ctx[i] < k; }
    } else {
        present[0] = n > 0;
    }
    for (Py_ssize_t c = 0; c < k; c++) {
        n_present += present[c];
        if (present[c] && !filled[c]) { err = "rans table does not sum to 2**prec"; goto done; }
        memcpy(ef + c * nsym, freq + c * nsym, sizeof(uint32_t) * nsym);
        if (!filled[c]) { /* never selected by a valid stream: any valid table, as the reference */
            for (Py_ssize_t s = 0; s < nsym; s++) { ef[c * nsym + s] = s ? 0 : m; cum[c * nsym + s] = s ? m : 0; }
        }
    }
    /* Slot -> symbol by a lookup table when building it is cheap next to the stream, else by
     * binary search over the cumulative counts (small streams with fine tables). */
    int use_lut = (uint64_t)n_present * m <= 2 * (uint64_t)n + 4096;
    const Py_ssize_t nwords = (db.len - 4 * lanes) / 2;
    /* A byte a slot where the alphabet fits (half the cache), and the words in a padded copy: a
     * lane reads its next word whether it needs it or not (whether it does is a coin toss to
     * the branch predictor), and a step reads at most `lanes` words past the last. */
    const int lut_bytes = nsym <= 256 ? 1 : 2;
    words = malloc(sizeof(uint16_t) * (nwords + lanes));
    fc = malloc(sizeof(uint64_t) * k * nsym);
    if (!fc) { PyErr_NoMemory(); goto done; }
    for (Py_ssize_t i = 0; i < k * nsym; i++) fc[i] = ef[i] | (uint64_t)cum[i] << 32;
    if (use_lut) lut = malloc((size_t)lut_bytes * k * m);
    if (!words || (use_lut && !lut)) { PyErr_NoMemory(); goto done; }
    uint8_t *const lut8 = lut;
    uint16_t *const lut16 = lut;
    for (Py_ssize_t c = 0; use_lut && c < k; c++) {
        if (!present[c]) continue; /* never indexed */
        for (Py_ssize_t s = 0; s < nsym; s++) {
            uint32_t c0 = cum[c * nsym + s], f = ef[c * nsym + s];
            if (lut_bytes == 1) memset(lut8 + c * m + c0, (int)s, f);
            else for (uint32_t q = c0; q < c0 + f; q++) lut16[c * m + q] = (uint16_t)s;
        }
    }
    Py_BEGIN_ALLOW_THREADS
    for (Py_ssize_t j = 0; j < lanes; j++)
        x[j] = (uint32_t)data[4 * j] | (uint32_t)data[4 * j + 1] << 8 | (uint32_t)data[4 * j + 2] << 16
               | (uint32_t)data[4 * j + 3] << 24;
    for (Py_ssize_t i = 0; i < nwords; i++) words[i] = (uint16_t)(data[4 * lanes + 2 * i] | data[4 * lanes + 2 * i + 1] << 8);
    memset(words + nwords, 0, sizeof(uint16_t) * lanes);
    Py_ssize_t pos = 0;
    const Py_ssize_t steps = (n + lanes - 1) / lanes;
#define DECODE_LOOP(CTX, LOOKUP)                                                                   \
    for (Py_ssize_t t = 0; t < steps && !err; t++) {                                               \
        const Py_ssize_t lo = t * lanes, a = n - lo < lanes ? n - lo : lanes;                      \
        const uint8_t *const cx = ctx ? ctx + lo : NULL;                                           \
        (void)cx; /* (unread where there are no contexts) */                                       \
        uint16_t *const o = out + lo;                                                              \
        for (Py_ssize_t j = 0; j < a; j++) {                                                       \
            const uint32_t c = CTX;                                                                \
            if (c >= (uint32_t)k) { err = "rans context id out of range"; break; }                 \
            uint32_t xs = x[j], slot = xs & mask, sym;                                             \
            LOOKUP;                                                                                \
            o[j] = (uint16_t)sym;                                                                  \
            /* its frequency, and its cumulative count above; wraps on hostile states, as the      \
             * reference does: the end checks catch it */                                          \
            const uint64_t e = fc[c * nsym + sym];                                                 \
            xs = (uint32_t)e * (xs >> prec) + slot - (uint32_t)(e >> 32);                          \
            /* renormalize without a branch: shift in the next word only where the state fell */   \
            const uint32_t need = xs < RANS_L;                                                     \
            x[j] = xs << (need << 4) | (words[pos] & (0u - need));                                 \
            pos += need;                                                                           \
        }                                                                                          \
        if (pos > nwords) err = "interleaved rans stream ends early";                              \
    }
    /* One loop a slot-to-symbol lookup and a context source, so that none tests which per symbol. */
    if (use_lut && lut_bytes == 1 && ctx) {
        DECODE_LOOP(cx[j], sym = lut8[c * m + slot])
    } else if (use_lut && lut_bytes == 1) {
        DECODE_LOOP(0, sym = lut8[slot])
    } else if (use_lut) {
        DECODE_LOOP(ctx ? cx[j] : 0, sym = lut16[c * m + slot])
    } else { /* the last symbol whose cumulative count is <= slot */
        DECODE_LOOP(ctx ? cx[j] : 0, uint32_t lo_s = 0; uint32_t hi_s = (uint32_t)nsym;          \
                    while (hi_s - lo_s > 1) {                                                      \
                        uint32_t mid = (lo_s + hi_s) >> 1;                                         \
                        if ((uint32_t)(fc[c * nsym + mid] >> 32) <= slot) lo_s = mid; else hi_s = mid; \
                    } sym = lo_s)
    }
#undef DECODE_LOOP
    if (!err) {
        int ok = pos == nwords;
        for (Py_ssize_t j = 0; j < lanes; j++) ok &= x[j] == RANS_L;
        if (!ok) err = "interleaved rans stream does not end where it should";
    }
    Py_END_ALLOW_THREADS
done:
    if (err && !PyErr_Occurred()) PyErr_SetString(PyExc_ValueError, err);
    free(cum); free(x); free(lut); free(ef); free(words); free(fc);
    PyBuffer_Release(&db); PyBuffer_Release(&fb); PyBuffer_Release(&ob);
    if (has_ctx) PyBuffer_Release(&cb);
    if (PyErr_Occurred()) return NULL;
    Py_RETURN_NONE;
}

/* histograms(sym: u16[>= rows*cols], rows, cols, nsym, axis, stride, out: f32[items*nsym]) -> None
 * Adds the symbol counts of each row (axis 0; every stride-th column) or column (axis 1;
 * every stride-th row) of sym viewed as [rows, cols] to out. Integer counts held exactly in
 * float32 (below 2^24), so equal to search.axis_histograms, the numpy reference. */
static PyObject *histograms(PyObject *Py_UNUSED(self), PyObject *args) {
    PyObject *sym_o, *out_o;
    Py_ssize_t rows, cols, stride;
    int nsym, axis;
    if (!PyArg_ParseTuple(args, "OnniinO", &sym_o, &rows, &cols, &nsym, &axis, &stride, &out_o)) return NULL;
    if (rows < 0 || cols < 0 || stride < 1 || nsym < 1 || nsym > MAX_NSYM || (axis != 0 && axis != 1)) {
        PyErr_SetString(PyExc_ValueError, "histograms: arguments out of range");
        return NULL;
    }
    Py_buffer sb, ob;
    if (get_buffer(sym_o, &sb, "sym", 0) < 0) return NULL;
    if (get_buffer(out_o, &ob, "out", 1) < 0) { PyBuffer_Release(&sb); return NULL; }
    const Py_ssize_t items = axis == 0 ? rows : cols;
    const char *err = NULL;
    if ((cols && rows > sb.len / 2 / cols) || items > ob.len / 4 / nsym || ob.len != (Py_ssize_t)(4 * items * nsym))
        err = "histograms: buffer sizes disagree"; /* (divisions first: no overflow) */
    const uint16_t *sym = sb.buf;
    float *out = ob.buf;
    if (!err) {
        Py_BEGIN_ALLOW_THREADS
        Py_ssize_t r = 0;
        /* Rows two at a time: a row's counts of one symbol are a chain of dependent adds, and two
         * rows' chains run side by side (1.4x quicker on all-MiniLM-L6-v2's float heads). */
        for (; axis == 0 && r + 2 <= rows && !err; r += 2) {
            const uint16_t *a = sym + r * cols, *b = a + cols;
            float *o = out + r * nsym, *p = o + nsym;
            for (Py_ssize_t c = 0; c < cols; c += stride) {
                if (a[c] >= (uint16_t)nsym || b[c] >= (uint16_t)nsym) {
                    err = "histograms: symbol out of range";
                    break;
                }
                o[a[c]] += 1.0f;
                p[b[c]] += 1.0f;
            }
        }
        for (; r < rows && !err; r += axis == 0 ? 1 : stride) {
            const uint16_t *row = sym + r * cols;
            float *o = axis == 0 ? out + r * nsym : out;
            const Py_ssize_t step = axis == 0 ? stride : 1, jump = axis == 0 ? 0 : nsym;
            for (Py_ssize_t c = 0; c < cols; c += step) {
                if (row[c] >= (uint16_t)nsym) { err = "histograms: symbol out of range"; break; }
                o[c * jump + row[c]] += 1.0f;
            }
        }
        Py_END_ALLOW_THREADS
    }
    if (err) PyErr_SetString(PyExc_ValueError, err);
    PyBuffer_Release(&sb); PyBuffer_Release(&ob);
    if (err) return NULL;
    Py_RETURN_NONE;
}

/* counts(sym: u16[n], ctx: u8[n] | None, nsym, k, out: i64[k*nsym]) -> None
 * Adds the count of each (context, symbol) pair to out: the encoder's exact tables in one
 * pass, where numpy would build an int64 index of ctx * nsym + sym and bincount it. */
static PyObject *counts(PyObject *Py_UNUSED(self), PyObject *args) {
    PyObject *sym_o, *ctx_o, *out_o;
    int nsym, k;
    if (!PyArg_ParseTuple(args, "OOiiO", &sym_o, &ctx_o, &nsym, &k, &out_o)) return NULL;
    if (nsym < 1 || nsym > MAX_NSYM || k < 1 || k > MAX_K) {
        PyErr_SetString(PyExc_ValueError, "counts: nsym or k out of range");
        return NULL;
    }
    Py_buffer sb, cb = {0}, ob;
    if (get_buffer(sym_o, &sb, "sym", 0) < 0) return NULL;
    int has_ctx = ctx_o != Py_None;
    if (has_ctx && get_buffer(ctx_o, &cb, "ctx", 0) < 0) { PyBuffer_Release(&sb); return NULL; }
    if (get_buffer(out_o, &ob, "out", 1) < 0) {
        PyBuffer_Release(&sb);
        if (has_ctx) PyBuffer_Release(&cb);
        return NULL;
    }
    const Py_ssize_t n = sb.len / 2;
    const char *err = NULL;
    if (ob.len != (Py_ssize_t)(8 * (Py_ssize_t)k * nsym) || (has_ctx && cb.len != n))
        err = "counts: buffer sizes disagree";
    const uint16_t *sym = sb.buf;
    const uint8_t *ctx = has_ctx ? cb.buf : NULL;
    int64_t *out = ob.buf;
    uint32_t *bank = !err && !ctx && n < (Py_ssize_t)UINT32_MAX ? calloc(4 * (size_t)nsym, sizeof(uint32_t)) : NULL;
    if (bank) {
        /* One context: four banks of counts, so that runs of one symbol are four chains of
         * increments, not one (1.4x quicker on float heads) */
        Py_BEGIN_ALLOW_THREADS
        Py_ssize_t i = 0;
        for (; i + 4 <= n; i += 4) {
            if (sym[i] >= nsym || sym[i + 1] >= nsym || sym[i + 2] >= nsym || sym[i + 3] >= nsym) break;
            bank[sym[i]]++; bank[nsym + sym[i + 1]]++; bank[2 * nsym + sym[i + 2]]++; bank[3 * nsym + sym[i + 3]]++;
        }
        for (; i < n && !err; i++) {
            if (sym[i] >= (uint16_t)nsym) err = "counts: symbol or context out of range";
            else bank[sym[i]]++;
        }
        for (Py_ssize_t s = 0; s < nsym && !err; s++)
            out[s] += (int64_t)bank[s] + bank[nsym + s] + bank[2 * nsym + s] + bank[3 * nsym + s];
        Py_END_ALLOW_THREADS
        free(bank);
    } else if (!err) {
        Py_BEGIN_ALLOW_THREADS
        for (Py_ssize_t i = 0; i < n; i++) {
            uint32_t c = ctx ? ctx[i] : 0;
            if (sym[i] >= (uint16_t)nsym || c >= (uint32_t)k) { err = "counts: symbol or context out of range"; break; }
            out[c * (uint32_t)nsym + sym[i]]++;
        }
        Py_END_ALLOW_THREADS
    }
    if (err) PyErr_SetString(PyExc_ValueError, err);
    PyBuffer_Release(&sb); PyBuffer_Release(&ob);
    if (has_ctx) PyBuffer_Release(&cb);
    if (err) return NULL;
    Py_RETURN_NONE;
}

/* ----------------------------------------------------------------- k-means
 * kmeans(hist: f32[items*nsym], items, nsym, ks: i64[S], iters, sample_items, bins,
 *        length_scale, prior, out: i64[S*items]) -> bool
 * cluster._kmeans for one problem, step for step (coarse bins, spread-ranked start, k-means
 * on a strided sample by integer code lengths, every item assigned, classes renumbered by
 * first appearance). The reference's float32 sums are exact when every count total stays
 * under 2^24; otherwise this returns False, writes nothing, and the caller runs numpy. */
/* rank[i]: item i's place in the order of (key, i), by a stable radix sort of the keys' bits, 11
 * a pass (keys are floats >= 0, whose bits order as they do): what a sort comparing (key, index)
 * pairs gives, without a comparison call each. */
static int rank_by_key(const float *key, Py_ssize_t n, Py_ssize_t *rank) {
    uint32_t *a = malloc(sizeof(uint32_t) * n), *b = malloc(sizeof(uint32_t) * n), k; /* (items < 2^32) */
    Py_ssize_t *count = malloc(sizeof(Py_ssize_t) * 2048);
    if (!a || !b || !count) { free(a); free(b); free(count); return -1; }
    for (Py_ssize_t i = 0; i < n; i++) a[i] = (uint32_t)i;
    for (int shift = 0; shift < 32; shift += 11) {
        memset(count, 0, sizeof(Py_ssize_t) * 2048);
        for (Py_ssize_t i = 0; i < n; i++) { memcpy(&k, key + a[i], 4); count[k >> shift & 2047]++; }
        for (Py_ssize_t d = 0, run = 0; d < 2048; d++) { const Py_ssize_t c = count[d]; count[d] = run; run += c; }
        for (Py_ssize_t i = 0; i < n; i++) { memcpy(&k, key + a[i], 4); b[count[k >> shift & 2047]++] = a[i]; }
        uint32_t *t = a; a = b; b = t;
    }
    for (Py_ssize_t r = 0; r < n; r++) rank[a[r]] = r;
    free(a); free(b); free(count);
    return 0;
}

#define EXACT_F32 16777216.0 /* 2^24 */

/* Code lengths of every class of every slot from the class members' coarse counts, into
 * LT[b * Cp + class] (classes padded to Cp, a multiple of 4, with zero lengths). Counts and
 * lengths are integers: exact in double, as the reference's float64 sums. */
static void code_lengths(const double *X, Py_ssize_t ns, Py_ssize_t B, const int64_t *ids, const int64_t *ks,
                         Py_ssize_t S, double scale, double prior, double *sums, double *LT, Py_ssize_t Cp) {
    Py_ssize_t base = 0;
    memset(LT, 0, sizeof(double) * B * Cp);
    for (Py_ssize_t s = 0; s < S; s++) {
        memset(sums, 0, sizeof(double) * ks[s] * B);
        for (Py_ssize_t j = 0; j < ns; j++) {
            double *row = sums + ids[s * ns + j] * B;
            for (Py_ssize_t b = 0; b < B; b++) row[b] += X[j * B + b];
        }
        for (int64_t c = 0; c < ks[s]; c++) {
            const double *row = sums + c * B;
            double tot = 0;
            for (Py_ssize_t b = 0; b < B; b++) tot += row[b] + prior;
            for (Py_ssize_t b = 0; b < B; b++) LT[b * Cp + base + c] = rint(-log2((row[b] + prior) / tot) * scale);
        }
        base += ks[s];
    }
}

/* Each item's cheapest class in every slot (the lowest index on ties). Costs are sums of
 * integer products below 2^53, exact in double in any order: four classes accumulate side
 * by side in registers (the compiler vectorizes them). */
static void assign_items(const double *X, Py_ssize_t n, Py_ssize_t B, const double *LT, Py_ssize_t Cp,
                         const int64_t *ks, Py_ssize_t S, double *cost, int64_t *out) {
    for (Py_ssize_t i = 0; i < n; i++) {
        const double *x = X + i * B;
        for (Py_ssize_t c0 = 0; c0 < Cp; c0 += 4) {
            double acc[4] = {0, 0, 0, 0};
            for (Py_ssize_t b = 0; b < B; b++)
                for (int u = 0; u < 4; u++) acc[u] += LT[b * Cp + c0 + u] * x[b];
            for (int u = 0; u < 4; u++) cost[c0 + u] = acc[u];
        }
        Py_ssize_t base = 0;
        for (Py_ssize_t s = 0; s < S; s++) {
            int64_t arg = 0;
            for (int64_t c = 1; c < ks[s]; c++)
                if (cost[base + c] < cost[base + arg]) arg = c;
            out[s * n + i] = arg;
            base += ks[s];
        }
    }
}

static int kmeans_run(const float *hist, Py_ssize_t n, Py_ssize_t nsym, const int64_t *ks, Py_ssize_t S, int iters,
                      Py_ssize_t sample_items, Py_ssize_t bins, double scale, double prior, int64_t *out) {
    int ok = 0;
    Py_ssize_t C = 0, B;
    for (Py_ssize_t s = 0; s < S; s++) C += ks[s];
    const Py_ssize_t Cp = (C + 3) / 4 * 4;
    const Py_ssize_t step = n / sample_items > 1 ? n / sample_items : 1, ns = (n + step - 1) / step;
    float *colf = calloc(nsym, sizeof(float)), *distf = malloc(sizeof(float) * nsym);
    double *X = calloc(n * bins, sizeof(double)), *XS = calloc(ns * bins, sizeof(double));
    double *LT = calloc(Cp * bins, sizeof(double)), *sums = calloc(C * bins, sizeof(double));
    double *cost = malloc(sizeof(double) * Cp);
    float *key = malloc(sizeof(float) * n);
    Py_ssize_t *edge = malloc(sizeof(Py_ssize_t) * (bins + 1));
    Py_ssize_t *rank = malloc(sizeof(Py_ssize_t) * n);
    int64_t *start = malloc(sizeof(int64_t) * S * n), *ids = malloc(sizeof(int64_t) * S * ns);
    int64_t *next = malloc(sizeof(int64_t) * S * ns), *label = malloc(sizeof(int64_t) * C);
    if (!colf || !distf || !X || !XS || !LT || !sums || !cost || !key || !edge || !rank || !start ||
        !ids || !next || !label) {
        ok = -1;
        goto done;
    }
    /* Counts (integers) are added in float32 by the reference: exact while the total
     * stays under 2^24, and then these float sums are exact too (and vectorize). */
    for (Py_ssize_t i = 0; i < n; i++)
        for (Py_ssize_t v = 0; v < nsym; v++) colf[v] += hist[i * nsym + v];
    double total_f = 0;
    for (Py_ssize_t v = 0; v < nsym; v++) total_f += colf[v];
    if (!(total_f < EXACT_F32)) goto done;
    const double total = total_f;
    /* coarse bins: runs of adjacent symbols of about equal mass (cluster.coarse_bins) */
    Py_ssize_t nb = 0;
    if (nsym <= bins) {
        for (Py_ssize_t v = 0; v < nsym; v++) edge[nb++] = v;
    } else {
        edge[nb++] = 0;
        for (Py_ssize_t j = 1; j < bins; j++) {
            const double target = total * (double)j / (double)bins;
            double mass = 0; /* integer sums of exact float counts: exact */
            Py_ssize_t cut = 0;
            while (cut < nsym && mass + colf[cut] <= target) mass += colf[cut++];
            if (cut > edge[nb - 1] && cut < nsym) edge[nb++] = cut;
        }
    }
    B = nb;
    edge[nb] = nsym;
    /* spread-ranked start (cluster.spread_order): spread around the global mode, float32.
     * Sums of integer products in eight float lanes: exact while under 2^24, and a sum that
     * reaches 2^24 (where the reference would round: declined) still reads as >= 2^24. */
    Py_ssize_t mode = 0;
    for (Py_ssize_t v = 1; v < nsym; v++)
        if (colf[v] > colf[mode]) mode = v;
    for (Py_ssize_t v = 0; v < nsym; v++) distf[v] = (float)(v > mode ? v - mode : mode - v);
    for (Py_ssize_t i = 0; i < n; i++) {
        const float *h = hist + i * nsym;
        float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
        Py_ssize_t v = 0;
        for (; v + 8 <= nsym; v += 8)
            for (int u = 0; u < 8; u++) acc[u] += h[v + u] * distf[v + u];
        for (; v < nsym; v++) acc[0] += h[v] * distf[v];
        const double num = (double)acc[0] + acc[1] + acc[2] + acc[3] + acc[4] + acc[5] + acc[6] + acc[7];
        if (num >= EXACT_F32) goto done;
        double tot = 0;
        for (Py_ssize_t b = 0; b < B; b++) {
            float run[8] = {0, 0, 0, 0, 0, 0, 0, 0};
            for (v = edge[b]; v + 8 <= edge[b + 1]; v += 8)
                for (int u = 0; u < 8; u++) run[u] += h[v + u];
            for (; v < edge[b + 1]; v++) run[0] += h[v];
            X[i * B + b] = (double)run[0] + run[1] + run[2] + run[3] + run[4] + run[5] + run[6] + run[7];
            tot += X[i * B + b];
        }
        key[i] = (float)num / (tot > 1 ? (float)tot : 1.0f);
    }
    if (rank_by_key(key, n, rank) < 0) { ok = -1; goto done; }
    for (Py_ssize_t s = 0; s < S; s++)
        for (Py_ssize_t i = 0; i < n; i++) start[s * n + i] = (int64_t)rank[i] * ks[s] / n;
    for (Py_ssize_t j = 0; j < ns; j++) {
        memcpy(XS + j * B, X + j * step * B, sizeof(double) * B);
        for (Py_ssize_t s = 0; s < S; s++) ids[s * ns + j] = start[s * n + j * step];
    }
    int have_lengths = 0;
    for (int it = 0; it < iters; it++) {
        code_lengths(XS, ns, B, ids, ks, S, scale, prior, sums, LT, Cp);
        have_lengths = 1;
        assign_items(XS, ns, B, LT, Cp, ks, S, cost, next);
        if (!memcmp(next, ids, sizeof(int64_t) * S * ns)) break;
        memcpy(ids, next, sizeof(int64_t) * S * ns);
    }
    if (ns == n) memcpy(out, ids, sizeof(int64_t) * S * n);
    else if (!have_lengths) memcpy(out, start, sizeof(int64_t) * S * n);
    else assign_items(X, n, B, LT, Cp, ks, S, cost, out);
    for (Py_ssize_t s = 0; s < S; s++) { /* classes renumbered by first appearance (cluster._relabel) */
        int64_t seen = 0;
        for (int64_t c = 0; c < ks[s]; c++) label[c] = -1;
        for (Py_ssize_t i = 0; i < n; i++) {
            int64_t *o = out + s * n + i;
            if (label[*o] < 0) label[*o] = seen++;
            *o = label[*o];
        }
    }
    ok = 1;
done:
    free(colf); free(distf); free(X); free(XS); free(LT); free(sums); free(cost); free(key);
    free(edge); free(rank); free(start); free(ids); free(next); free(label);
    return ok;
}

static PyObject *kmeans(PyObject *Py_UNUSED(self), PyObject *args) {
    PyObject *hist_o, *ks_o, *out_o;
    Py_ssize_t n, nsym, sample_items, bins;
    int iters;
    double scale, prior;
    if (!PyArg_ParseTuple(args, "OnnOinnddO", &hist_o, &n, &nsym, &ks_o, &iters, &sample_items, &bins, &scale,
                          &prior, &out_o))
        return NULL;
    if (n < 1 || nsym < 1 || nsym > MAX_NSYM || sample_items < 1 || bins < 1 || iters < 0) {
        PyErr_SetString(PyExc_ValueError, "kmeans: arguments out of range");
        return NULL;
    }
    Py_buffer hb, kb, ob;
    if (get_buffer(hist_o, &hb, "hist", 0) < 0) return NULL;
    if (get_buffer(ks_o, &kb, "ks", 0) < 0) { PyBuffer_Release(&hb); return NULL; }
    if (get_buffer(out_o, &ob, "out", 1) < 0) { PyBuffer_Release(&hb); PyBuffer_Release(&kb); return NULL; }
    const Py_ssize_t S = kb.len / 8;
    const int64_t *ks = kb.buf;
    const char *err = NULL;
    if (hb.len / 4 / nsym != n || hb.len != 4 * n * nsym || ob.len != 8 * S * n || S < 1)
        err = "kmeans: buffer sizes disagree";
    for (Py_ssize_t s = 0; s < S && !err; s++)
        if (ks[s] < 1 || ks[s] > MAX_K) err = "kmeans: class count out of range";
    int ok = 0;
    if (!err) {
        Py_BEGIN_ALLOW_THREADS
        ok = kmeans_run(hb.buf, n, nsym, ks, S, iters, sample_items, bins, scale, prior, ob.buf);
        Py_END_ALLOW_THREADS
        if (ok < 0) err = "kmeans: out of memory";
    }
    if (err) PyErr_SetString(ok < 0 ? PyExc_MemoryError : PyExc_ValueError, err);
    PyBuffer_Release(&hb); PyBuffer_Release(&kb); PyBuffer_Release(&ob);
    if (err) return NULL;
    return PyBool_FromLong(ok);
}

/* class_sums(hist: f32[items*nsym] counts, items, nsym, ids: i64[S*items], ks: i64[S], out: f32[sum(ks)*nsym]) -> bool
 * Sums of the item histograms in each class of S clusterings (cluster.class_sums_all): equal
 * to the reference's float32 sums while the total stays under 2^24; past it, False (out
 * undefined) and the caller runs numpy. */
static PyObject *class_sums(PyObject *Py_UNUSED(self), PyObject *args) {
    PyObject *hist_o, *ids_o, *ks_o, *out_o;
    Py_ssize_t n, nsym;
    if (!PyArg_ParseTuple(args, "OnnOOO", &hist_o, &n, &nsym, &ids_o, &ks_o, &out_o)) return NULL;
    if (n < 0 || nsym < 1 || nsym > MAX_NSYM) {
        PyErr_SetString(PyExc_ValueError, "class_sums: arguments out of range");
        return NULL;
    }
    Py_buffer hb, ib, kb, ob;
    if (get_buffer(hist_o, &hb, "hist", 0) < 0) return NULL;
    if (get_buffer(ids_o, &ib, "ids", 0) < 0) { PyBuffer_Release(&hb); return NULL; }
    if (get_buffer(ks_o, &kb, "ks", 0) < 0) { PyBuffer_Release(&hb); PyBuffer_Release(&ib); return NULL; }
    if (get_buffer(out_o, &ob, "out", 1) < 0) {
        PyBuffer_Release(&hb); PyBuffer_Release(&ib); PyBuffer_Release(&kb);
        return NULL;
    }
    const Py_ssize_t S = kb.len / 8;
    const int64_t *ks = kb.buf, *ids = ib.buf;
    const float *hist = hb.buf;
    float *out = ob.buf;
    Py_ssize_t C = 0;
    const char *err = NULL;
    for (Py_ssize_t s = 0; s < S && !err; s++) {
        if (ks[s] < 1 || ks[s] > MAX_K) err = "class_sums: class count out of range";
        C += ks[s];
    }
    if (!err && (hb.len != 4 * n * nsym || ib.len != 8 * S * n || ob.len != 4 * C * nsym))
        err = "class_sums: buffer sizes disagree";
    for (Py_ssize_t s = 0; s < S && !err; s++)
        for (Py_ssize_t i = 0; i < n; i++)
            if (ids[s * n + i] < 0 || ids[s * n + i] >= ks[s]) { err = "class_sums: class id out of range"; break; }
    int exact = 0;
    if (!err) {
        /* Float sums of integer counts (they vectorize): exact while the total is under 2^24,
         * which the first clustering's sums then tell exactly (else out is left undefined). */
        memset(out, 0, sizeof(float) * C * nsym);
        for (Py_ssize_t i = 0; i < n; i++) { /* every clustering while the item's counts are in cache */
            const float *h = hist + i * nsym;
            for (Py_ssize_t s = 0, base = 0; s < S; base += ks[s++]) {
                float *row = out + (base + ids[s * n + i]) * nsym;
                for (Py_ssize_t v = 0; v < nsym; v++) row[v] += h[v];
            }
        }
        double total = 0;
        for (Py_ssize_t j = 0; j < ks[0] * nsym; j++) total += out[j];
        exact = total < EXACT_F32;
    }
    if (err) PyErr_SetString(PyExc_ValueError, err);
    PyBuffer_Release(&hb); PyBuffer_Release(&ib); PyBuffer_Release(&kb); PyBuffer_Release(&ob);
    if (err) return NULL;
    return PyBool_FromLong(exact);
}

/* Float words as fields (codecs.Fields; the layout is in docs/FORMAT.md): the head is the
 * exponent above the h top mantissa bits (bits lowbits..width-2, lowbits = m - h); the tail
 * holds q = lowbits / 8 byte planes of the low bits (n bytes each), then r = lowbits % 8 bit
 * planes of bits 8q.. and the sign's plane (ceil(n / 8) bytes each, first word in the top bit,
 * as numpy's packbits). One pass each way: the numpy spelling in codecs.py made ~10. */
typedef struct { Py_buffer words, head, tail; Py_ssize_t n, isz, q, r, c; int lowbits; } fields_io;

static int fields_open(PyObject *args, fields_io *f, int splitting) {
    PyObject *w_o, *h_o, *t_o;
    int isz, m, h;
    if (!PyArg_ParseTuple(args, "OiiiOO", &w_o, &isz, &m, &h, &h_o, &t_o)) return -1;
    if ((isz != 2 && isz != 4) || h < 0 || m < h || m > 8 * isz - 2) {
        PyErr_SetString(PyExc_ValueError, "fields: word size, mantissa or head bits out of range");
        return -1;
    }
    if (get_buffer(w_o, &f->words, "words", !splitting) < 0) return -1;
    if (get_buffer(h_o, &f->head, "head", splitting) < 0) { PyBuffer_Release(&f->words); return -1; }
    if (get_buffer(t_o, &f->tail, "tail", splitting) < 0) {
        PyBuffer_Release(&f->words); PyBuffer_Release(&f->head); return -1;
    }
    f->isz = isz; f->n = f->words.len / isz; f->lowbits = m - h;
    f->q = f->lowbits / 8; f->r = f->lowbits % 8; f->c = (f->n + 7) / 8;
    if (f->words.len % isz || f->head.len != 2 * f->n || f->tail.len != f->q * f->n + (f->r + 1) * f->c) {
        PyBuffer_Release(&f->words); PyBuffer_Release(&f->head); PyBuffer_Release(&f->tail);
        PyErr_SetString(PyExc_ValueError, "fields: buffer sizes disagree");
        return -1;
    }
    return 0;
}

static void fields_close(fields_io *f) {
    PyBuffer_Release(&f->words); PyBuffer_Release(&f->head); PyBuffer_Release(&f->tail);
}

/* Words 8b.. of a block (zeros past n): a fixed trip count the compiler unrolls. */
static inline int load_block(const uint8_t *restrict w, Py_ssize_t b, Py_ssize_t n, Py_ssize_t isz, uint32_t v[8]) {
    const Py_ssize_t i0 = 8 * b, a = n - i0 < 8 ? n - i0 : 8;
    if (a == 8 && isz == 2) {
        for (int e = 0; e < 8; e++) v[e] = (uint32_t)w[2 * (i0 + e)] | (uint32_t)w[2 * (i0 + e) + 1] << 8;
    } else if (a == 8) {
        for (int e = 0; e < 8; e++) {
            const uint8_t *p = w + 4 * (i0 + e);
            v[e] = (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
        }
    } else {
        for (int e = 0; e < 8; e++) {
            v[e] = 0;
            for (Py_ssize_t k = 0; e < a && k < isz; k++) v[e] |= (uint32_t)w[isz * (i0 + e) + k] << 8 * k;
        }
    }
    return (int)a;
}

/* Eight words at a time: byte e of a uint64 holds word e's bits, and one multiply gathers bit
 * 0 of every byte into a packbits byte (byte e to bit 7 - e; the partial products never
 * overlap, so no carries), or SPREAD undoes it. */
#define LOW_BITS 0x0101010101010101ull
#define GATHER 0x8040201008040201ull
static uint64_t SPREAD[256];
#define FIELD_BLOCK 4096 /* words per block of the field loops below (a multiple of 8) */

static void spread_init(void) {
    for (int b = 0; b < 256; b++) {
        uint64_t v = 0;
        for (int e = 0; e < 8; e++) v |= (uint64_t)(b >> (7 - e) & 1) << 8 * e;
        SPREAD[b] = v;
    }
}

/* fields_split(words, itemsize, m, h, head: u16[n] out, tail: u8[...] out) -> None */
static PyObject *fields_split(PyObject *Py_UNUSED(self), PyObject *args) {
    fields_io f;
    if (fields_open(args, &f, 1) < 0) return NULL;
    const uint8_t *restrict w = f.words.buf;
    uint16_t *restrict head = f.head.buf;
    uint8_t *restrict tail = f.tail.buf, *restrict bits = tail + f.q * f.n;
    const Py_ssize_t n = f.n, isz = f.isz, q = f.q, r = f.r, c = f.c;
    const int lb = f.lowbits, top = 8 * (int)isz - 1;
    const uint32_t hmask = (1u << (top - lb)) - 1;
    Py_BEGIN_ALLOW_THREADS
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
    /* Little-endian words, read as such: a simple loop a field over a block that stays in cache
     * (they vectorize; 2-3x quicker than the loop below, which ends the last block). */
    uint8_t lowb[FIELD_BLOCK], signb[FIELD_BLOCK];
    const Py_ssize_t full = (uintptr_t)w % isz ? 0 : n / 8 * 8; /* (aligned words only) */
    for (Py_ssize_t i0 = 0; i0 < full; i0 += FIELD_BLOCK) {
        const Py_ssize_t len = full - i0 < FIELD_BLOCK ? full - i0 : FIELD_BLOCK;
#define SPLIT_FIELDS(T)                                                                             \
        const T *restrict x = (const T *)w + i0;                                                    \
        for (Py_ssize_t i = 0; i < len; i++) head[i0 + i] = (uint16_t)(x[i] >> lb & hmask);         \
        for (Py_ssize_t j = 0; j < q; j++)                                                          \
            for (Py_ssize_t i = 0; i < len; i++) tail[j * n + i0 + i] = (uint8_t)(x[i] >> 8 * j);   \
        /* bits 8q.. and the sign a byte a word (narrowing loops that vectorize), read back eight \
         * words at a time as uint64 */                                                             \
        for (Py_ssize_t i = 0; i < len; i++) {                                                      \
            lowb[i] = (uint8_t)(x[i] >> 8 * q);                                                     \
            signb[i] = (uint8_t)(x[i] >> top);                                                      \
        }                                                                                           \
        for (Py_ssize_t b = 0; b < len / 8; b++) {                                                  \
            uint64_t low, sign;                                                                     \
            memcpy(&low, lowb + 8 * b, 8);                                                          \
            memcpy(&sign, signb + 8 * b, 8);                                                        \
            for (Py_ssize_t j = 0; j < r; j++)                                                      \
                bits[j * c + i0 / 8 + b] = (uint8_t)(((low >> j & LOW_BITS) * GATHER) >> 56);       \
            bits[r * c + i0 / 8 + b] = (uint8_t)((sign * GATHER) >> 56);                            \
        }
        if (isz == 2) {
            SPLIT_FIELDS(uint16_t)
        } else {
            SPLIT_FIELDS(uint32_t)
        }
#undef SPLIT_FIELDS
    }
    for (Py_ssize_t b = full / 8; b < c; b++) {
#else
    for (Py_ssize_t b = 0; b < c; b++) {
#endif
        uint32_t v[8];
        const int a = load_block(w, b, n, isz, v);
        uint64_t low = 0, sign = 0; /* byte e: word 8b + e's bits 8q.., its sign */
        for (int e = 0; e < 8; e++) {
            low |= (uint64_t)(v[e] >> 8 * q & 0xFF) << 8 * e;
            sign |= (uint64_t)(v[e] >> top) << 8 * e;
        }
        for (int e = 0; e < a; e++) head[8 * b + e] = (uint16_t)(v[e] >> lb & hmask);
        for (Py_ssize_t j = 0; j < q; j++)
            for (int e = 0; e < a; e++) tail[j * n + 8 * b + e] = (uint8_t)(v[e] >> 8 * j);
        for (Py_ssize_t j = 0; j < r; j++) bits[j * c + b] = (uint8_t)(((low >> j & LOW_BITS) * GATHER) >> 56);
        bits[r * c + b] = (uint8_t)((sign * GATHER) >> 56);
    }
    Py_END_ALLOW_THREADS
    fields_close(&f);
    Py_RETURN_NONE;
}

/* One block of fields_join: a words from head, the byte planes (tail, n apart) and the bit
 * planes' bytes (bits, c apart); returns the OR of the heads. Inlined with a = 8 for full
 * blocks, so that every loop has a fixed trip count. */
static inline __attribute__((always_inline)) uint32_t join_block(
    uint8_t *restrict w, const uint16_t *restrict head, const uint8_t *restrict tail, const uint8_t *restrict bits,
    const int a, Py_ssize_t n, Py_ssize_t c, Py_ssize_t isz, Py_ssize_t q, Py_ssize_t r, int lb, int top) {
    uint64_t low = 0; /* byte e: word e's bits 8q.. (r of them), then its sign */
    for (Py_ssize_t j = 0; j < r; j++) low |= SPREAD[bits[j * c]] << j;
    const uint64_t sign = SPREAD[bits[r * c]];
    uint32_t v[8], over = 0;
    for (int e = 0; e < a; e++) {
        v[e] = (uint32_t)head[e] << lb | (uint32_t)(low >> 8 * e & 0xFF) << 8 * q | (uint32_t)(sign >> 8 * e & 1) << top;
        over |= head[e];
    }
    for (Py_ssize_t j = 0; j < q; j++)
        for (int e = 0; e < a; e++) v[e] |= (uint32_t)tail[j * n + e] << 8 * j;
    if (isz == 2) {
        for (int e = 0; e < a; e++) { w[2 * e] = (uint8_t)v[e]; w[2 * e + 1] = (uint8_t)(v[e] >> 8); }
    } else {
        for (int e = 0; e < a; e++) {
            w[4 * e] = (uint8_t)v[e]; w[4 * e + 1] = (uint8_t)(v[e] >> 8);
            w[4 * e + 2] = (uint8_t)(v[e] >> 16); w[4 * e + 3] = (uint8_t)(v[e] >> 24);
        }
    }
    return over;
}

/* fields_join(words out, itemsize, m, h, head: u16[n], tail) -> None; ValueError where a head
 * reaches the sign bit or a bit plane's padding is not zero. */
static PyObject *fields_join(PyObject *Py_UNUSED(self), PyObject *args) {
    fields_io f;
    if (fields_open(args, &f, 0) < 0) return NULL;
    uint8_t *restrict w = f.words.buf;
    const uint16_t *restrict head = f.head.buf;
    const uint8_t *restrict tail = f.tail.buf, *restrict bits = tail + f.q * f.n;
    const Py_ssize_t n = f.n, isz = f.isz, q = f.q, r = f.r, c = f.c;
    const int lb = f.lowbits, top = 8 * (int)isz - 1;
    const char *err = NULL;
    Py_BEGIN_ALLOW_THREADS
    uint32_t over = 0;
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
    /* Little-endian words, stored as such: a simple loop a field over a block that stays in
     * cache (they vectorize; 2-3x quicker than join_block), the last partial block below. */
    uint8_t lowb[FIELD_BLOCK], signb[FIELD_BLOCK];
    const Py_ssize_t full = (uintptr_t)w % isz ? 0 : n / 8 * 8; /* (aligned words only) */
    for (Py_ssize_t i0 = 0; i0 < full; i0 += FIELD_BLOCK) {
        const Py_ssize_t len = full - i0 < FIELD_BLOCK ? full - i0 : FIELD_BLOCK;
#define JOIN_FIELDS(T)                                                                              \
        T *restrict v = (T *)w + i0;                                                                \
        /* each bit plane's byte spread to eight words' bytes, written as uint64 (byte e: word e), \
         * then one loop over the words that vectorizes */                                          \
        for (Py_ssize_t b = 0; b < len / 8; b++) {                                                  \
            uint64_t low = 0;                                                                       \
            for (Py_ssize_t j = 0; j < r; j++) low |= SPREAD[bits[j * c + i0 / 8 + b]] << j;        \
            const uint64_t sign = SPREAD[bits[r * c + i0 / 8 + b]];                                 \
            memcpy(lowb + 8 * b, &low, 8);                                                          \
            memcpy(signb + 8 * b, &sign, 8);                                                        \
        }                                                                                           \
        for (Py_ssize_t i = 0; i < len; i++) {                                                      \
            v[i] = (T)((T)head[i0 + i] << lb | (T)lowb[i] << 8 * q | (T)signb[i] << top);           \
            over |= head[i0 + i];                                                                   \
        }                                                                                           \
        for (Py_ssize_t j = 0; j < q; j++)                                                          \
            for (Py_ssize_t i = 0; i < len; i++) v[i] |= (T)((T)tail[j * n + i0 + i] << 8 * j);
        if (isz == 2) {
            JOIN_FIELDS(uint16_t)
        } else {
            JOIN_FIELDS(uint32_t)
        }
#undef JOIN_FIELDS
    }
    for (Py_ssize_t b = full / 8; b < c; b++) {
#else
    for (Py_ssize_t b = 0; b < c; b++) {
#endif
        const Py_ssize_t i0 = 8 * b;
        if (n - i0 >= 8) over |= join_block(w + isz * i0, head + i0, tail + i0, bits + b, 8, n, c, isz, q, r, lb, top);
        else over |= join_block(w + isz * i0, head + i0, tail + i0, bits + b, (int)(n - i0), n, c, isz, q, r, lb, top);
    }
    over >>= top - lb; /* (an OR of heads: any head with a bit at or past the sign's) */
    if (over) err = "fields exponent out of range";
    const uint8_t pad = n % 8 ? (uint8_t)(0xFF >> (n % 8)) : 0;
    for (Py_ssize_t j = 0; j <= r && !err && c; j++)
        if (bits[j * c + c - 1] & pad) err = "fields bit plane padding is not zero";
    Py_END_ALLOW_THREADS
    fields_close(&f);
    if (err) { PyErr_SetString(PyExc_ValueError, err); return NULL; }
    Py_RETURN_NONE;
}

/* top_counts(words, itemsize, shift, out: i64[2^bits]) -> None
 * Adds to out the count of each value of (word >> shift) & (2^bits - 1) over little-endian words
 * of itemsize bytes: the fields coding's counts of exponents and top mantissa bits in one pass,
 * with no shifted copy of the words (four banks of counts, as counts() for one context). */
static PyObject *top_counts(PyObject *Py_UNUSED(self), PyObject *args) {
    PyObject *w_o, *out_o;
    int isz, shift;
    if (!PyArg_ParseTuple(args, "OiiO", &w_o, &isz, &shift, &out_o)) return NULL;
    if ((isz != 2 && isz != 4) || shift < 0 || shift >= 8 * isz) {
        PyErr_SetString(PyExc_ValueError, "top_counts: word size or shift out of range");
        return NULL;
    }
    Py_buffer wb, ob;
    if (get_buffer(w_o, &wb, "words", 0) < 0) return NULL;
    if (get_buffer(out_o, &ob, "out", 1) < 0) { PyBuffer_Release(&wb); return NULL; }
    const Py_ssize_t n = wb.len / isz, nb = ob.len / 8;
    const char *err = NULL;
    if (wb.len % isz || nb < 1 || nb > 65536 || (nb & (nb - 1)) || ob.len % 8) err = "top_counts: buffer sizes disagree";
    uint32_t *bank = err ? NULL : calloc(4 * (size_t)nb, sizeof(uint32_t));
    if (!err && (!bank || n >= (Py_ssize_t)UINT32_MAX)) err = "top_counts: out of memory or too many words";
    if (!err) {
        const uint8_t *w = wb.buf;
        const uint32_t mask = (uint32_t)nb - 1;
        int64_t *out = ob.buf;
        Py_BEGIN_ALLOW_THREADS
#define WORD(i) (isz == 2 ? (uint32_t)w[2 * (i)] | (uint32_t)w[2 * (i) + 1] << 8                   \
                          : (uint32_t)w[4 * (i)] | (uint32_t)w[4 * (i) + 1] << 8 |                    \
                                (uint32_t)w[4 * (i) + 2] << 16 | (uint32_t)w[4 * (i) + 3] << 24)
        Py_ssize_t i = 0;
        for (; i + 4 <= n; i += 4) {
            bank[WORD(i) >> shift & mask]++; bank[nb + (WORD(i + 1) >> shift & mask)]++;
            bank[2 * nb + (WORD(i + 2) >> shift & mask)]++; bank[3 * nb + (WORD(i + 3) >> shift & mask)]++;
        }
        for (; i < n; i++) bank[WORD(i) >> shift & mask]++;
#undef WORD
        for (Py_ssize_t v = 0; v < nb; v++) out[v] += (int64_t)bank[v] + bank[nb + v] + bank[2 * nb + v] + bank[3 * nb + v];
        Py_END_ALLOW_THREADS
    }
    free(bank);
    if (err) PyErr_SetString(PyExc_ValueError, err);
    PyBuffer_Release(&wb); PyBuffer_Release(&ob);
    if (err) return NULL;
    Py_RETURN_NONE;
}

/* ----------------------------------------------------------------- row parents */
#define AHEAD 4 /* row pairs read ahead */
#if defined(__GNUC__)
#define PREFETCH(p) __builtin_prefetch(p)
#else
#define PREFETCH(p) ((void)(p))
#endif

/* Which cand[j] np.argmax picks of |row[j]| * (j < lo), the row of nc floats masked after lo:
 * the first maximum, or the first NaN. Non-negative floats order as their bits do, so the
 * first largest of row[:lo] is an integer max, kept in four lanes beside where each lane first
 * met it (the compiler vectorizes them; the first of the lanes' firsts wins). Bits from
 * 0x7f800000 up are a NaN or an infinity (which the mask turns into a NaN) anywhere in the row:
 * then the reference's values are computed as it does. */
static Py_ssize_t masked_argmax(const float *row, Py_ssize_t lo, Py_ssize_t nc) {
    uint32_t top[4] = {0, 0, 0, 0}, at[4] = {0, 0, 0, 0}, tail = 0, w;
    Py_ssize_t t = 0, j = nc;
    for (; t + 4 <= lo; t += 4)
        for (int u = 0; u < 4; u++) {
            memcpy(&w, row + t + u, 4);
            w &= 0x7fffffffu;
            at[u] = w > top[u] ? (uint32_t)(t + u) : at[u];
            top[u] = w > top[u] ? w : top[u];
        }
    for (; t < lo; t++) {
        memcpy(&w, row + t, 4);
        w &= 0x7fffffffu;
        at[0] = w > top[0] ? (uint32_t)t : at[0];
        top[0] = w > top[0] ? w : top[0];
    }
    for (; t < nc; t++) {
        memcpy(&w, row + t, 4);
        tail = (w & 0x7fffffffu) > tail ? w & 0x7fffffffu : tail;
    }
    uint32_t most = top[0];
    for (int u = 1; u < 4; u++) most = top[u] > most ? top[u] : most;
    for (int u = 0; u < 4; u++) /* (all zero, or lo = 0: every lane says 0) */
        if (top[u] == most && at[u] < (uint32_t)j) j = at[u];
    if (most >= 0x7f800000u || tail >= 0x7f800000u) {
        float best = -1;
        for (t = 0; t < nc; t++) {
            float v = fabsf(row[t]) * (float)(t < lo);
            if (isnan(v)) return t;
            if (v > best) { best = v; j = t; }
        }
    }
    return j;
}

/* The dot product of two int8 rows in int32 arithmetic that wraps, as numpy's int32 sum
 * would (wrapping sums agree in any order). SSE2: 16 codes a step, widened to int16, then
 * multiplied and added in pairs (pmaddwd; the product of two int8 fits in int16). */
static uint32_t row_dot(const int8_t *x, const int8_t *y, Py_ssize_t n) {
    uint32_t d = 0;
    Py_ssize_t t = 0;
#ifdef __SSE2__
    __m128i acc = _mm_setzero_si128();
    for (; t + 16 <= n; t += 16) {
        __m128i a = _mm_loadu_si128((const __m128i *)(x + t)), b = _mm_loadu_si128((const __m128i *)(y + t));
        __m128i alo = _mm_srai_epi16(_mm_unpacklo_epi8(a, a), 8), ahi = _mm_srai_epi16(_mm_unpackhi_epi8(a, a), 8);
        __m128i blo = _mm_srai_epi16(_mm_unpacklo_epi8(b, b), 8), bhi = _mm_srai_epi16(_mm_unpackhi_epi8(b, b), 8);
        acc = _mm_add_epi32(acc, _mm_add_epi32(_mm_madd_epi16(alo, blo), _mm_madd_epi16(ahi, bhi)));
    }
    uint32_t lane[4];
    _mm_storeu_si128((__m128i *)lane, acc);
    d = lane[0] + lane[1] + lane[2] + lane[3];
#endif
    for (; t < n; t++) d += (uint32_t)((int32_t)x[t] * y[t]);
    return d;
}

/* offer(codes: i8[rows*cols], q: i64[nq], cand: i64[nc], sketched: f32[nq*nc] | None,
 *       norm: f32[rows], score: f32[rows], parent: i64[rows], dot: i32[rows]) -> None
 * parents.find's offer, step for step: row q[i] takes candidate cand[i] (sketched None; nc = nq)
 * or, with sketched, np.argmax's choice of cand[j] by |sketched[i, j]| * (cand[j] < q[i])
 * (cand ascending, as find's cluster members are, else ValueError); then, where
 * float32(d)^2 / norm[c] beats score[q[i]] and c < q[i], with d the exact dot product of the
 * two rows of codes, it writes score, parent and dot. The rows q must differ (as the reference
 * needs: its scatter would keep one of them). The reference gathers both rows as int16 copies;
 * here each row's candidate is picked first, then the pairs' products are summed reading a
 * few pairs ahead (the rows lie scattered over the tensor: their cache misses took the time). */
static PyObject *offer(PyObject *Py_UNUSED(self), PyObject *args) {
    PyObject *o[8];
    if (!PyArg_ParseTuple(args, "OOOOOOOO", &o[0], &o[1], &o[2], &o[3], &o[4], &o[5], &o[6], &o[7])) return NULL;
    static const char *what[8] = {"codes", "q", "cand", "sketched", "norm", "score", "parent", "dot"};
    Py_buffer b[8] = {{0}};
    int got = 0;
    for (; got < 8; got++) {
        if (got == 3 && o[3] == Py_None) continue;
        if (get_buffer(o[got], &b[got], what[got], got >= 5) < 0) break;
    }
    const char *err = NULL;
    Py_ssize_t rows = b[4].len / 4, nq = b[1].len / 8, nc = b[2].len / 8;
    Py_ssize_t cols = rows ? b[0].len / rows : 0;
    int ranked = o[3] != Py_None;
    int64_t *pick = NULL; /* each row's candidate */
    if (got < 8)
        err = ""; /* (the buffer error is set) */
    else if (cols * rows != b[0].len || b[5].len != 4 * rows || b[6].len != 8 * rows || b[7].len != 4 * rows ||
             (ranked ? b[3].len != 4 * nq * nc || (nq && !nc) : nc != nq))
        err = "offer: buffer sizes disagree";
    for (Py_ssize_t t = 1; !err && ranked && t < nc; t++)
        if (((const int64_t *)b[2].buf)[t - 1] > ((const int64_t *)b[2].buf)[t])
            err = "offer: ranked candidates must be ascending";
    if (!err && !(pick = malloc(sizeof(int64_t) * (nq ? nq : 1)))) {
        PyErr_NoMemory();
        err = "";
    }
    if (!err) {
        const int8_t *codes = b[0].buf;
        const int64_t *q = b[1].buf, *cand = b[2].buf;
        const float *sk = ranked ? b[3].buf : NULL, *norm = b[4].buf;
        float *score = b[5].buf;
        int64_t *parent = b[6].buf;
        int32_t *dot = b[7].buf;
        Py_BEGIN_ALLOW_THREADS
        Py_ssize_t lo = 0; /* ranked: how many candidates come before row q[i] */
        for (Py_ssize_t i = 0; i < nq; i++) {
            if (ranked && i && q[i] < q[i - 1]) lo = 0; /* (rows ascending, as find's are: lo only grows) */
            while (ranked && lo < nc && cand[lo] < q[i]) lo++;
            pick[i] = ranked ? cand[masked_argmax(sk + i * nc, lo, nc)] : cand[i];
        }
        for (Py_ssize_t i = 0; i < nq; i++) {
            int64_t r = q[i], c = pick[i];
            if (r < 0 || r >= rows || c < 0 || c >= rows) { err = "offer: row index out of range"; break; }
            if (i + AHEAD < nq && q[i + AHEAD] >= 0 && q[i + AHEAD] < rows && pick[i + AHEAD] >= 0 &&
                pick[i + AHEAD] < rows)
                for (Py_ssize_t t = 0; t < cols; t += 64) {
                    PREFETCH(codes + q[i + AHEAD] * cols + t);
                    PREFETCH(codes + pick[i + AHEAD] * cols + t);
                }
            uint32_t d = row_dot(codes + r * cols, codes + c * cols, cols);
            float f = (float)(int32_t)d;
            float s = f * f;
            s = s / norm[c];
            if (s > score[r] && c < r) { score[r] = s; parent[r] = c; dot[r] = (int32_t)d; }
        }
        Py_END_ALLOW_THREADS
    }
    free(pick);
    if (err && *err) PyErr_SetString(PyExc_ValueError, err);
    for (int t = 0; t < got; t++)
        if (b[t].obj) PyBuffer_Release(&b[t]);
    if (err) return NULL;
    Py_RETURN_NONE;
}

static PyMethodDef methods[] = {
    {"counts", counts, METH_VARARGS, "Counts of (context, symbol) pairs added to out (i64): (sym u16, ctx u8|None, nsym, k, out)."},
    {"encode", ilv_encode, METH_VARARGS, "Interleaved rANS encode: (sym u16, ctx u8|None, freq u32, nsym, prec, lanes) -> bytes."},
    {"decode", ilv_decode, METH_VARARGS, "Interleaved rANS decode into out (u16): (data, ctx u8|None, freq u32, nsym, prec, lanes, out)."},
    {"class_sums", class_sums, METH_VARARGS, "Class sums of item histograms into out (f32): (hist f32, items, nsym, ids i64, ks i64, out) -> False past float32's exact integers."},
    {"kmeans", kmeans, METH_VARARGS, "cluster._kmeans for one problem into out (i64): (hist f32, items, nsym, ks i64, iters, sample_items, bins, length_scale, prior, out) -> False where float32 sums would not be exact."},
    {"histograms", histograms, METH_VARARGS, "Per-row or per-column symbol counts added to out (f32): (sym u16, rows, cols, nsym, axis, stride, out)."},
    {"fields_split", fields_split, METH_VARARGS, "Float words into a fields head (u16) and tail: (words, itemsize, m, h, head out, tail out)."},
    {"top_counts", top_counts, METH_VARARGS, "Counts of (word >> shift) & (len(out) - 1) added to out (i64): (words, itemsize, shift, out)."},
    {"offer", offer, METH_VARARGS, "parents.find's offer into score, parent, dot: (codes i8, q i64, cand i64, sketched f32|None, norm f32, score f32, parent i64, dot i32)."},
    {"fields_join", fields_join, METH_VARARGS, "Float words from a fields head and tail: (words out, itemsize, m, h, head u16, tail)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_ransc", "Compiled interleaved rANS kernels and search histograms.", -1, methods, NULL, NULL, NULL, NULL};

PyMODINIT_FUNC PyInit__ransc(void) {
    spread_init();
    return PyModule_Create(&module);
}
