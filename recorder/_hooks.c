/* Compiled bodies of the recorder's hottest hooks (recorder/hooks.py, and the scheduler's
 * add_request / _free_request in recorder/scheduler.py).
 *
 * Why: inside the real engine the recorder's cost is its hooks' code running cold between model
 * forwards; as C calls the same work costs the scheduler markedly less CPU (docs/transparency.md,
 * "Fifth pass").
 *
 * NOTE: invariants
 * - each body stages exactly the entries its Python twin stages, in the same order
 *   (tests/test_compiled_hooks.py compares whole traces, compiled against Python);
 * - any call shape or state the body does not handle (keyword arguments, soft claims to defer,
 *   claims in force, pins or deferrals at an admission, a refused request, a block without a
 *   hash, a request declaring a claim, tenant or release) is handed to the Python twin unchanged, so the C code covers only the usual case;
 * - vLLM's own call is made exactly once and its result or exception is returned unchanged; a
 *   failure of the recording part is reported through the scheduler's ``kvc_failed`` and
 *   cleared, never raised into vLLM;
 * - the pool's request context (``kvc_request_id``) and the index's ``kvc_sink`` are restored
 *   even when vLLM raises.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stddef.h>
#include <time.h>

enum kind {
    K_POP, K_GET_NEW_BLOCKS, K_FREE_BLOCKS, K_CACHE_FULL_BLOCKS, K_ALLOCATE_SLOTS, K_FREE,
    K_ADD_REQUEST, K_FREE_REQUEST, K_KINDS
};
static const char *const KIND_NAMES[K_KINDS] = {
    "pop", "get_new_blocks", "free_blocks", "cache_full_blocks", "allocate_slots", "free",
    "add_request", "_free_request"};

/* interned attribute names and constant strings */
static PyObject *s_kvc_sink, *s_kvc_pool, *s_kvc_lost_now, *s_kvc_request_id, *s_kvc_arbiter,
    *s_has_soft_claims, *s_watched, *s_cached_block_hash_to_block, *s_kvc_report_lost,
    *s_kvc_stage, *s_kvc_sched, *s_block_id, *s_kvc_null_id, *s_status,
    *s_kvc_admission_states, *s_request_id, *s_allocation, *s_block_evicted,
    *s_block_allocated, *s_block_freed, *s_block_cached, *s_block_hit, *s_request_admitted,
    *s_kvc_hash, *s_kvc_reuse_denied, *s_block_hashes, *s_kvc_record_cached, *s_kvc_to_refuse,
    *s_pins, *s_deferrals, *s_num_tokens, *s_block_size, *s_get_num_free_blocks,
    *s_admitted_fields, *s_kvc_pending_admission, *s_kvc_admitted_cached_tokens, *s_blocks,
    *s_kvc_admitted, *s_num_new_computed_tokens, *s_new_computed_blocks, *s_kvc_compiled,
    *s_requests, *s_sampling_params, *s_extra_args, *s_kvc_policy, *s_deny_reuse,
    *s_num_prompt_tokens, *s_request_arrived, *s_kvc_on_arrival, *s_request_finished,
    *s_get_finished_reason, *s_num_output_tokens, *s_kvc_tenants, *s_forget, *s_discard,
    *s_pop, *s_tenant, *s_claim_id, *s_finish_reason, *s_num_cached_tokens, *s_reason,
    *s_kvc_reason_text, *s_kvc_refusal_reason;
/* the staged layouts (hooks.py's _EVICTED, _ALLOCATED, _FREED, _CACHED, _HIT), set by
 * ``configure`` */
static PyObject *l_evicted, *l_allocated, *l_freed, *l_cached, *l_hit;

typedef struct {
    PyObject_HEAD
    vectorcallfunc vectorcall;
    int kind;
    PyObject *base;  /* vLLM's function (called with self first) */
    PyObject *py;    /* the Python twin in hooks.py (same signature) */
} Hook;

static PyObject *now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);  /* NOTE: time.monotonic_ns's clock on Linux */
    return PyLong_FromLongLong((long long)ts.tv_sec * 1000000000LL + ts.tv_nsec);
}

static PyObject *to_python(Hook *h, PyObject *const *args, size_t nargsf, PyObject *kwnames) {
    return PyObject_Vectorcall(h->py, args, PyVectorcall_NARGS(nargsf), kwnames);
}

/* Report the pending exception of a recording part through ``sched.kvc_failed`` and clear it;
 * ``sched`` is the scheduler itself, or NULL: ``holder.kvc_sched``. */
static void report(PyObject *holder, PyObject *sched, const char *hook) {
    PyObject *type, *value, *tb;
    PyErr_Fetch(&type, &value, &tb);
    PyErr_NormalizeException(&type, &value, &tb);
    if (sched != NULL) Py_INCREF(sched);
    else if (holder != NULL) sched = PyObject_GetAttr(holder, s_kvc_sched);
    if (sched != NULL && value != NULL) {
        PyObject *r = PyObject_CallMethod(sched, "kvc_failed", "sO", hook, value);
        Py_XDECREF(r);
    }
    Py_XDECREF(sched);
    Py_XDECREF(type);
    Py_XDECREF(value);
    Py_XDECREF(tb);
    PyErr_Clear();  /* NOTE: nothing may escape into vLLM */
}

static void failed(PyObject *holder, const char *hook) { report(holder, NULL, hook); }

/* setattr that keeps a pending exception (vLLM's) intact. */
static void restore_attr(PyObject *obj, PyObject *name, PyObject *value) {
    PyObject *type, *exc, *tb;
    PyErr_Fetch(&type, &exc, &tb);
    if (PyObject_SetAttr(obj, name, value) < 0) PyErr_Clear();
    PyErr_Restore(type, exc, tb);
}

static int call_stage(PyObject *pool, PyObject *entry) {
    PyObject *stage = PyObject_GetAttr(pool, s_kvc_stage);
    if (stage == NULL) return -1;
    PyObject *r = PyObject_CallOneArg(stage, entry);
    Py_DECREF(stage);
    if (r == NULL) return -1;
    Py_DECREF(r);
    return 0;
}

/* (event, n, now, layout, *scalars, *column, *column...): the flat entry EventBuffer.stage
 * takes; each column is a list or tuple of exactly n values. */
static PyObject *entry(PyObject *event, PyObject *layout, PyObject *const *scalars,
                       Py_ssize_t nscalars, PyObject *const *columns, Py_ssize_t ncolumns,
                       Py_ssize_t n) {
    PyObject *t = PyTuple_New(4 + nscalars + ncolumns * n);
    if (t == NULL) return NULL;
    PyObject *count = PyLong_FromSsize_t(n), *ts = now_ns();
    if (count == NULL || ts == NULL) {
        Py_XDECREF(count);
        Py_XDECREF(ts);
        Py_DECREF(t);
        return NULL;
    }
    Py_INCREF(event);
    PyTuple_SET_ITEM(t, 0, event);
    PyTuple_SET_ITEM(t, 1, count);
    PyTuple_SET_ITEM(t, 2, ts);
    Py_INCREF(layout);
    PyTuple_SET_ITEM(t, 3, layout);
    Py_ssize_t at = 4;
    for (Py_ssize_t i = 0; i < nscalars; i++, at++) {
        Py_INCREF(scalars[i]);
        PyTuple_SET_ITEM(t, at, scalars[i]);
    }
    for (Py_ssize_t c = 0; c < ncolumns; c++) {
        PyObject *col = columns[c];  /* a list or tuple of exactly n items */
        for (Py_ssize_t i = 0; i < n; i++, at++) {
            PyObject *v = PySequence_Fast_GET_ITEM(col, i);
            Py_INCREF(v);
            PyTuple_SET_ITEM(t, at, v);
        }
    }
    return t;
}

/* Build ``entry(...)`` and stage it on ``holder.kvc_stage``; 0, or -1 with an exception. */
static int stage_entry(PyObject *holder, PyObject *event, PyObject *layout,
                       PyObject *const *scalars, Py_ssize_t nscalars, PyObject *const *columns,
                       Py_ssize_t ncolumns, Py_ssize_t n) {
    PyObject *e = entry(event, layout, scalars, nscalars, columns, ncolumns, n);
    if (e == NULL) return -1;
    int r = call_stage(holder, e);
    Py_DECREF(e);
    return r;
}

/* The block ids of a list of blocks, the null block's left out; a new list. */
static PyObject *block_ids(PyObject *blocks, PyObject *null_id) {
    Py_ssize_t n = PyList_GET_SIZE(blocks);
    PyObject *ids = PyList_New(0);
    if (ids == NULL) return NULL;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *id = PyObject_GetAttr(PyList_GET_ITEM(blocks, i), s_block_id);
        if (id == NULL) goto error;
        int is_null = null_id != NULL ? PyObject_RichCompareBool(id, null_id, Py_EQ) : 0;
        if (is_null < 0 || (!is_null && PyList_Append(ids, id) < 0)) {
            Py_DECREF(id);
            goto error;
        }
        Py_DECREF(id);
    }
    return ids;
error:
    Py_DECREF(ids);
    return NULL;
}

static int truthy_attr(PyObject *obj, PyObject *name) {
    PyObject *v = PyObject_GetAttr(obj, name);
    if (v == NULL) return -1;
    int r = PyObject_IsTrue(v);
    Py_DECREF(v);
    return r;
}

/* ---- RecordingHashIndex.pop ---------------------------------------------------------- */
static PyObject *hook_pop(Hook *h, PyObject *const *args, size_t nargsf, PyObject *kwnames) {
    if (kwnames != NULL || PyVectorcall_NARGS(nargsf) != 3)
        return to_python(h, args, nargsf, kwnames);
    PyObject *self = args[0], *key = args[1], *bid = args[2];
    PyObject *block = PyObject_Vectorcall(h->base, args, 3, NULL);
    if (block == NULL || block == Py_None) return block;
    PyObject *sink = PyObject_GetAttr(self, s_kvc_sink);
    if (sink == NULL) goto fail;
    int ok = 0;
    if (sink == Py_None) {
        PyObject *pool = PyObject_GetAttr(self, s_kvc_pool);
        PyObject *r = pool ? PyObject_CallMethodObjArgs(pool, s_kvc_lost_now, bid, key, NULL)
                           : NULL;
        Py_XDECREF(pool);
        ok = r != NULL;
        Py_XDECREF(r);
    } else if (sink == Py_False) {
        ok = 1;
    } else if (PyTuple_CheckExact(sink) && PyTuple_GET_SIZE(sink) == 2
               && PyList_CheckExact(PyTuple_GET_ITEM(sink, 0))
               && PyList_CheckExact(PyTuple_GET_ITEM(sink, 1))) {
        ok = PyList_Append(PyTuple_GET_ITEM(sink, 0), bid) == 0
             && PyList_Append(PyTuple_GET_ITEM(sink, 1), key) == 0;
    } else {
        PyErr_SetString(PyExc_TypeError, "kvc_sink is not (list, list)");
    }
    Py_DECREF(sink);
    if (ok) return block;
fail:;
    PyObject *type, *exc, *tb;  /* NOTE: no attribute lookup with an exception pending */
    PyErr_Fetch(&type, &exc, &tb);
    PyObject *pool = PyObject_GetAttr(self, s_kvc_pool);
    PyErr_Clear();
    PyErr_Restore(type, exc, tb);
    failed(pool, "pop");
    Py_XDECREF(pool);
    return block;
}

/* ---- RecordingBlockPool.kvc_report_lost, the no-claims case ------------------------------ */
static int report_lost(PyObject *pool, PyObject *ids, PyObject *keys, PyObject *cause,
                       PyObject *request_id) {
    PyObject *arbiter = PyObject_GetAttr(pool, s_kvc_arbiter);
    if (arbiter == NULL) return -1;
    int watched = truthy_attr(arbiter, s_watched);
    Py_DECREF(arbiter);
    if (watched < 0) return -1;
    if (watched) {  /* claims in force: the Python twin also tells the arbiter */
        PyObject *r = PyObject_CallMethodObjArgs(pool, s_kvc_report_lost, ids, keys, cause,
                                                 request_id, NULL);
        Py_XDECREF(r);
        return r == NULL ? -1 : 0;
    }
    PyObject *scalars[2] = {cause, request_id};
    PyObject *columns[2] = {ids, keys};
    return stage_entry(pool, s_block_evicted, l_evicted, scalars, 2, columns, 2,
                       PyList_GET_SIZE(ids));
}

/* ---- RecordingBlockPool.get_new_blocks --------------------------------------------------- */
static PyObject *hook_get_new_blocks(Hook *h, PyObject *const *args, size_t nargsf,
                                     PyObject *kwnames) {
    if (kwnames != NULL || PyVectorcall_NARGS(nargsf) != 2)
        return to_python(h, args, nargsf, kwnames);
    PyObject *self = args[0];
    PyObject *arbiter = PyObject_GetAttr(self, s_kvc_arbiter);
    int soft = arbiter ? truthy_attr(arbiter, s_has_soft_claims) : -1;
    Py_XDECREF(arbiter);
    if (soft != 0) {  /* soft claims to defer (or an odd pool): the Python twin */
        PyErr_Clear();
        return to_python(h, args, nargsf, kwnames);
    }
    PyObject *index = PyObject_GetAttr(self, s_cached_block_hash_to_block);
    if (index == NULL) return NULL;  /* vLLM's own call would fail the same way */
    PyObject *ids = PyList_New(0), *keys = PyList_New(0);
    PyObject *sink = (ids && keys) ? PyTuple_Pack(2, ids, keys) : NULL;
    if (sink == NULL || PyObject_SetAttr(index, s_kvc_sink, sink) < 0) {
        Py_XDECREF(sink);
        Py_XDECREF(ids);
        Py_XDECREF(keys);
        Py_DECREF(index);
        PyErr_Clear();
        return to_python(h, args, nargsf, kwnames);
    }
    Py_DECREF(sink);
    PyObject *blocks = PyObject_Vectorcall(h->base, args, 2, NULL);
    restore_attr(index, s_kvc_sink, Py_None);
    Py_DECREF(index);
    if (blocks != NULL) {
        PyObject *rid = PyObject_GetAttr(self, s_kvc_request_id);
        int ok = rid != NULL;
        if (ok && PyList_GET_SIZE(ids) > 0)
            ok = report_lost(self, ids, keys, s_allocation, rid) == 0;
        if (ok && PyList_CheckExact(blocks) && PyList_GET_SIZE(blocks) > 0) {
            PyObject *bids = block_ids(blocks, NULL);
            ok = bids != NULL && stage_entry(self, s_block_allocated, l_allocated, &rid, 1,
                                             &bids, 1, PyList_GET_SIZE(bids)) == 0;
            Py_XDECREF(bids);
        } else if (ok && !PyList_CheckExact(blocks)) {
            PyErr_SetString(PyExc_TypeError, "get_new_blocks returned no list");
            ok = 0;
        }
        Py_XDECREF(rid);
        if (!ok) failed(self, "get_new_blocks");
    }
    Py_DECREF(ids);
    Py_DECREF(keys);
    return blocks;
}

/* ---- RecordingBlockPool.free_blocks ------------------------------------------------------ */
static PyObject *hook_free_blocks(Hook *h, PyObject *const *args, size_t nargsf,
                                  PyObject *kwnames) {
    if (kwnames != NULL || PyVectorcall_NARGS(nargsf) != 2)
        return to_python(h, args, nargsf, kwnames);
    PyObject *self = args[0];
    PyObject *blocks = args[1];
    if (PyList_CheckExact(blocks)) {
        Py_INCREF(blocks);
    } else {
        blocks = PySequence_List(blocks);  /* vLLM may pass any iterable: consume it once */
        if (blocks == NULL) return NULL;
    }
    PyObject *call[2] = {self, blocks};
    PyObject *r = PyObject_Vectorcall(h->base, call, 2, NULL);
    if (r != NULL) {
        PyObject *null = PyObject_GetAttr(self, s_kvc_null_id);
        PyObject *ids = null ? block_ids(blocks, null) : NULL;
        int ok = ids != NULL;
        if (ok && PyList_GET_SIZE(ids) > 0) {
            PyObject *rid = PyObject_GetAttr(self, s_kvc_request_id);
            ok = rid != NULL && stage_entry(self, s_block_freed, l_freed, &rid, 1, &ids, 1,
                                            PyList_GET_SIZE(ids)) == 0;
            Py_XDECREF(rid);
        }
        Py_XDECREF(ids);
        Py_XDECREF(null);
        if (!ok) failed(self, "free_blocks");
    }
    Py_DECREF(blocks);
    return r;
}

/* ---- RecordingKVCacheManager.allocate_slots (a running request) and .free ----------------- */
static PyObject *with_request(Hook *h, PyObject *const *args, size_t nargsf, PyObject *kwnames,
                              int keep_previous) {
    PyObject *self = args[0], *request = args[1];
    PyObject *pool = PyObject_GetAttr(self, s_kvc_pool);
    if (pool == NULL) {
        PyErr_Clear();
        return to_python(h, args, nargsf, kwnames);
    }
    PyObject *previous = keep_previous ? PyObject_GetAttr(pool, s_kvc_request_id) : Py_None;
    PyObject *rid = previous ? PyObject_GetAttr(request, s_request_id) : NULL;
    if (rid == NULL || PyObject_SetAttr(pool, s_kvc_request_id, rid) < 0) {
        Py_XDECREF(rid);
        if (keep_previous) Py_XDECREF(previous);
        Py_DECREF(pool);
        PyErr_Clear();
        return to_python(h, args, nargsf, kwnames);
    }
    Py_DECREF(rid);
    PyObject *r = PyObject_Vectorcall(h->base, args, PyVectorcall_NARGS(nargsf), kwnames);
    restore_attr(pool, s_kvc_request_id, previous);
    if (keep_previous) Py_DECREF(previous);
    Py_DECREF(pool);
    return r;
}

static PyObject *admission(Hook *h, PyObject *const *args, size_t nargsf, PyObject *kwnames);

static PyObject *hook_allocate_slots(Hook *h, PyObject *const *args, size_t nargsf,
                                     PyObject *kwnames) {
    if (PyVectorcall_NARGS(nargsf) < 2) return to_python(h, args, nargsf, kwnames);
    PyObject *status = PyObject_GetAttr(args[1], s_status);
    PyObject *states = status ? PyObject_GetAttr(args[0], s_kvc_admission_states) : NULL;
    int admitting = states ? PySequence_Contains(states, status) : -1;
    Py_XDECREF(status);
    Py_XDECREF(states);
    if (admitting < 0) {  /* an odd request: the Python twin */
        PyErr_Clear();
        return to_python(h, args, nargsf, kwnames);
    }
    if (admitting) return admission(h, args, nargsf, kwnames);
    /* NOTE: as the Python twin: vLLM never nests allocate_slots in another request's
     * context, so the context is simply cleared afterwards */
    return with_request(h, args, nargsf, kwnames, 0);
}

static PyObject *hook_free(Hook *h, PyObject *const *args, size_t nargsf, PyObject *kwnames) {
    if (kwnames != NULL || PyVectorcall_NARGS(nargsf) != 2)
        return to_python(h, args, nargsf, kwnames);
    return with_request(h, args, nargsf, kwnames, 1);
}

/* The block hashes (``pool.kvc_hash``) of a list of blocks; a new list. */
static PyObject *block_hashes(PyObject *pool, PyObject *blocks) {
    PyObject *get = PyObject_GetAttr(pool, s_kvc_hash);
    if (get == NULL) return NULL;
    Py_ssize_t n = PyList_GET_SIZE(blocks);
    PyObject *out = PyList_New(n);
    for (Py_ssize_t i = 0; out != NULL && i < n; i++) {
        PyObject *h = PyObject_CallOneArg(get, PyList_GET_ITEM(blocks, i));
        if (h == NULL) Py_CLEAR(out);
        else PyList_SET_ITEM(out, i, h);
    }
    Py_DECREF(get);
    return out;
}

/* 1: every key is a true value (no None, as all(keys)); 0: not; -1: error. */
static int all_true(PyObject *keys) {
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(keys); i++) {
        int t = PyObject_IsTrue(PyList_GET_ITEM(keys, i));
        if (t <= 0) return t;
    }
    return 1;
}

/* 1: the null block's id is among ``ids``; 0: not; -1: error. */
static int holds_null(PyObject *pool, PyObject *ids) {
    PyObject *null = PyObject_GetAttr(pool, s_kvc_null_id);
    if (null == NULL) return -1;
    int r = PySequence_Contains(ids, null);
    Py_DECREF(null);
    return r;
}

/* ---- RecordingBlockPool.cache_full_blocks (+ kvc_record_cached's usual case) -------------- */
static int record_cached(PyObject *self, PyObject *request, PyObject *new, PyObject *before,
                         PyObject *first_obj, Py_ssize_t first) {
    PyObject *arbiter = PyObject_GetAttr(self, s_kvc_arbiter);
    int watched = arbiter ? truthy_attr(arbiter, s_watched) : -1;
    Py_XDECREF(arbiter);
    if (watched < 0) return -1;
    Py_ssize_t n = PyList_GET_SIZE(new), last = first + n;
    PyObject *hashes = NULL, *keys = NULL, *ids = NULL, *parents = NULL, *positions = NULL,
             *rid = NULL;
    int usual = !watched, r = -1;
    if (usual) {
        hashes = PyObject_GetAttr(request, s_block_hashes);
        keys = hashes ? block_hashes(self, new) : NULL;
        ids = keys ? block_ids(new, NULL) : NULL;
        if (ids == NULL) goto done;
        usual = PyList_CheckExact(hashes) && PyList_GET_SIZE(hashes) >= last;
        for (Py_ssize_t i = 0; usual && i < n; i++)
            usual = PyList_GET_ITEM(before, i) == Py_None;
        int t = usual ? all_true(keys) : 0;
        if (t < 0) goto done;
        t = t ? holds_null(self, ids) : 1;
        if (t < 0) goto done;
        usual = !t;
    }
    if (!usual) {  /* claims in force, a block that kept or lacks a hash, the null block */
        PyObject *res = PyObject_CallMethodObjArgs(self, s_kvc_record_cached, request, new,
                                                   before, first_obj, NULL);
        Py_XDECREF(res);
        r = res == NULL ? -1 : 0;
        goto done;
    }
    parents = PyList_New(n);
    positions = PyList_New(n);
    if (parents == NULL || positions == NULL) goto done;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *parent = first + i > 0 ? PyList_GET_ITEM(hashes, first + i - 1) : Py_None;
        Py_INCREF(parent);
        PyList_SET_ITEM(parents, i, parent);
        PyObject *pos = PyLong_FromSsize_t(first + i);
        if (pos == NULL) goto done;
        PyList_SET_ITEM(positions, i, pos);
    }
    rid = PyObject_GetAttr(request, s_request_id);
    PyObject *columns[4] = {ids, keys, parents, positions};
    r = rid ? stage_entry(self, s_block_cached, l_cached, &rid, 1, columns, 4, n) : -1;
done:
    Py_XDECREF(hashes);
    Py_XDECREF(keys);
    Py_XDECREF(ids);
    Py_XDECREF(parents);
    Py_XDECREF(positions);
    Py_XDECREF(rid);
    return r;
}

static PyObject *hook_cache_full_blocks(Hook *h, PyObject *const *args, size_t nargsf,
                                        PyObject *kwnames) {
    Py_ssize_t nargs = PyVectorcall_NARGS(nargsf);
    if (kwnames != NULL || nargs < 7 || nargs > 8 || !PyList_CheckExact(args[2])
        || !PyLong_CheckExact(args[3]) || !PyLong_CheckExact(args[4]))
        return to_python(h, args, nargsf, kwnames);
    PyObject *self = args[0], *request = args[1], *blocks = args[2];
    Py_ssize_t first = PyLong_AsSsize_t(args[3]), full = PyLong_AsSsize_t(args[4]);
    if (PyErr_Occurred()) {
        PyErr_Clear();
        return to_python(h, args, nargsf, kwnames);
    }
    if (first >= full) Py_RETURN_NONE;  /* as vLLM: nothing to cache */
    PyObject *denied = PyObject_GetAttr(self, s_kvc_reuse_denied);
    int skip = denied ? PyObject_IsTrue(denied) : -1;
    if (skip > 0) {
        PyObject *rid = PyObject_GetAttr(request, s_request_id);
        skip = rid ? PySequence_Contains(denied, rid) : -1;
        Py_XDECREF(rid);
    }
    Py_XDECREF(denied);
    if (skip < 0) {
        PyErr_Clear();
        return to_python(h, args, nargsf, kwnames);
    }
    if (skip) Py_RETURN_NONE;  /* write no-admit: this request's blocks never become reusable */
    PyObject *new = PyList_GetSlice(blocks, first, full);
    PyObject *before = new ? block_hashes(self, new) : NULL;
    PyObject *index = before ? PyObject_GetAttr(self, s_cached_block_hash_to_block) : NULL;
    if (index == NULL || PyObject_SetAttr(index, s_kvc_sink, Py_False) < 0) {
        Py_XDECREF(new);
        Py_XDECREF(before);
        Py_XDECREF(index);
        PyErr_Clear();
        return to_python(h, args, nargsf, kwnames);
    }
    /* NOTE: a partial block's hash promoted to a full one is not a loss (kvc_sink False) */
    PyObject *r = PyObject_Vectorcall(h->base, args, nargs, NULL);
    restore_attr(index, s_kvc_sink, Py_None);
    Py_DECREF(index);
    if (r != NULL && record_cached(self, request, new, before, args[3], first) < 0)
        failed(self, "cache_full_blocks");
    Py_DECREF(new);
    Py_DECREF(before);
    return r;
}

/* ---- admission: KVClaimsMixin.kvc_admit (nothing pinned, nobody deferred) ------------------ */
static int admit_fast(PyObject *self, PyObject *sched, PyObject *arbiter, PyObject *request,
                      PyObject *rid) {
    PyObject *num = PyObject_GetAttr(request, s_num_tokens);
    PyObject *size = num ? PyObject_GetAttr(sched, s_block_size) : NULL;
    long long n = num ? PyLong_AsLongLong(num) : -1, bs = size ? PyLong_AsLongLong(size) : -1;
    Py_XDECREF(num);
    Py_XDECREF(size);
    if (PyErr_Occurred()) return -1;
    if (bs <= 0 || n < 0) {
        PyErr_SetString(PyExc_ValueError, "block_size or num_tokens out of range");
        return -1;
    }
    PyObject *pool = PyObject_GetAttr(self, s_kvc_pool);
    PyObject *free = pool ? PyObject_CallMethodNoArgs(pool, s_get_num_free_blocks) : NULL;
    PyObject *required = free ? PyLong_FromLongLong((n + bs - 1) / bs) : NULL;
    PyObject *fields = required ? PyObject_CallMethodObjArgs(arbiter, s_admitted_fields, rid,
                                                             required, free, NULL) : NULL;
    int r = fields != NULL ? PyObject_SetAttr(sched, s_kvc_pending_admission, fields) : -1;
    Py_XDECREF(pool);
    Py_XDECREF(free);
    Py_XDECREF(required);
    Py_XDECREF(fields);
    return r;
}

/* ``name`` among the keyword arguments of a vectorcall (borrowed), or NULL. */
static PyObject *keyword(PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames,
                         PyObject *name) {
    if (kwnames == NULL) return NULL;
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(kwnames); i++) {
        PyObject *k = PyTuple_GET_ITEM(kwnames, i);
        if (k == name || PyUnicode_Compare(k, name) == 0) return args[nargs + i];
    }
    return NULL;
}

/* ---- admission: KVClaimsMixin.kvc_admitted (request_admitted, cached tokens, block_hit) ---- */
static int admitted(PyObject *self, PyObject *sched, PyObject *request, PyObject *rid,
                    PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames) {
    /* args[3:] are what vLLM passed after num_new_tokens (the twin's ``args``) */
    PyObject *tokens = keyword(args, nargs, kwnames, s_num_new_computed_tokens);
    if (tokens == NULL) tokens = nargs > 3 ? args[3] : Py_None;
    PyObject *computed = keyword(args, nargs, kwnames, s_new_computed_blocks);
    if (computed == NULL) computed = nargs > 4 ? args[4] : Py_None;
    PyObject *pool = NULL, *hits = NULL, *keys = NULL, *ids = NULL, *e = NULL, *pos = NULL;
    int r = -1;
    pool = PyObject_GetAttr(self, s_kvc_pool);
    if (pool == NULL) goto done;
    if (computed != Py_None) {
        PyObject *groups = PyObject_GetAttr(computed, s_blocks);
        if (groups == NULL) {  /* as getattr(..., "blocks", None) */
            if (!PyErr_ExceptionMatches(PyExc_AttributeError)) goto done;
            PyErr_Clear();
        } else {
            int t = PyObject_IsTrue(groups);
            PyObject *g0 = t > 0 ? PySequence_GetItem(groups, 0) : NULL;
            Py_DECREF(groups);
            if (t < 0 || (t > 0 && g0 == NULL)) goto done;
            hits = g0 ? PySequence_List(g0) : NULL;
            Py_XDECREF(g0);
            if (t > 0 && hits == NULL) goto done;
        }
    }
    if (hits != NULL && PyList_GET_SIZE(hits) > 0) {
        keys = block_hashes(pool, hits);
        ids = keys ? block_ids(hits, NULL) : NULL;
        if (ids == NULL) goto done;
        int t = all_true(keys);
        t = t > 0 ? holds_null(pool, ids) : (t == 0 ? 1 : -1);
        if (t < 0) goto done;
        PyObject *arbiter = PyObject_GetAttr(sched, s_kvc_arbiter);
        int watched = arbiter ? truthy_attr(arbiter, s_watched) : -1;
        Py_XDECREF(arbiter);
        if (watched < 0) goto done;
        if (t || watched) {  /* a hit without a hash, the null block, claims: the twin */
            PyObject *rest = PyTuple_New(nargs - 3);
            PyObject *kw = rest ? PyDict_New() : NULL;
            for (Py_ssize_t i = 3; kw != NULL && i < nargs; i++) {
                Py_INCREF(args[i]);
                PyTuple_SET_ITEM(rest, i - 3, args[i]);
            }
            for (Py_ssize_t i = 0; kw != NULL && kwnames && i < PyTuple_GET_SIZE(kwnames); i++)
                if (PyDict_SetItem(kw, PyTuple_GET_ITEM(kwnames, i), args[nargs + i]) < 0)
                    Py_CLEAR(kw);
            PyObject *res = kw ? PyObject_CallMethodObjArgs(sched, s_kvc_admitted, request,
                                                            rest, kw, NULL) : NULL;
            Py_XDECREF(rest);
            Py_XDECREF(kw);
            Py_XDECREF(res);
            r = res == NULL ? -1 : 0;
            goto done;
        }
    }
    PyObject *pending = PyObject_GetAttr(sched, s_kvc_pending_admission);
    if (pending == NULL) goto done;
    PyObject *one = PyLong_FromLong(1), *ts = now_ns();
    /* (event, 1, ts, fields): the single-event form; the decision's dict is staged as is */
    e = one && ts ? PyTuple_Pack(4, s_request_admitted, one, ts, pending) : NULL;
    Py_XDECREF(one);
    Py_XDECREF(ts);
    Py_DECREF(pending);
    if (e == NULL || call_stage(sched, e) < 0) goto done;
    Py_CLEAR(e);
    /* int(tokens or 0) */
    int t = PyObject_IsTrue(tokens);
    PyObject *cached = t > 0 ? PyNumber_Long(tokens) : t == 0 ? PyLong_FromLong(0) : NULL;
    PyObject *book = cached ? PyObject_GetAttr(sched, s_kvc_admitted_cached_tokens) : NULL;
    int ok = book != NULL && PyObject_SetItem(book, rid, cached) == 0;
    Py_XDECREF(cached);
    Py_XDECREF(book);
    if (!ok) goto done;
    if (keys == NULL) {
        r = 0;
        goto done;
    }
    Py_ssize_t n = PyList_GET_SIZE(ids);
    pos = PyList_New(n);
    for (Py_ssize_t i = 0; pos != NULL && i < n; i++) {
        PyObject *p = PyLong_FromSsize_t(i);
        if (p == NULL) Py_CLEAR(pos);
        else PyList_SET_ITEM(pos, i, p);
    }
    PyObject *columns[3] = {ids, keys, pos};
    r = pos ? stage_entry(sched, s_block_hit, l_hit, &rid, 1, columns, 3, n) : -1;
done:
    Py_XDECREF(pool);
    Py_XDECREF(hits);
    Py_XDECREF(keys);
    Py_XDECREF(ids);
    Py_XDECREF(pos);
    Py_XDECREF(e);
    return r;
}

/* ---- RecordingKVCacheManager.kvc_allocate_admitting, the usual case ------------------------ */
static PyObject *admission(Hook *h, PyObject *const *args, size_t nargsf, PyObject *kwnames) {
    Py_ssize_t nargs = PyVectorcall_NARGS(nargsf);
    PyObject *self = args[0], *request = args[1];
    PyObject *sched = PyObject_GetAttr(self, s_kvc_sched);
    PyObject *rid = sched ? PyObject_GetAttr(request, s_request_id) : NULL;
    PyObject *refuse = rid ? PyObject_GetAttr(sched, s_kvc_to_refuse) : NULL;
    PyObject *arbiter = refuse ? PyObject_GetAttr(sched, s_kvc_arbiter) : NULL;
    PyObject *pool = arbiter ? PyObject_GetAttr(self, s_kvc_pool) : NULL;
    PyObject *previous = pool ? PyObject_GetAttr(pool, s_kvc_request_id) : NULL;
    int usual = previous != NULL;
    if (usual) {  /* not to be refused, nothing pinned, nobody deferred */
        int t = PySequence_Contains(refuse, rid);
        int pins = t == 0 ? truthy_attr(arbiter, s_pins) : -1;
        int deferrals = pins == 0 ? truthy_attr(arbiter, s_deferrals) : -1;
        usual = deferrals == 0;
    }
    PyObject *result = NULL;
    if (!usual) {
        PyErr_Clear();
        result = to_python(h, args, nargsf, kwnames);
        goto done;
    }
    if (admit_fast(self, sched, arbiter, request, rid) < 0) {
        /* as the twin: fail open, vLLM decides alone; never another request's decision */
        failed(self, "kvc_admit");
        PyObject *pending = Py_BuildValue("{sO}", "request_id", rid);
        if (pending == NULL || PyObject_SetAttr(sched, s_kvc_pending_admission, pending) < 0)
            PyErr_Clear();
        Py_XDECREF(pending);
    }
    if (PyObject_SetAttr(pool, s_kvc_request_id, rid) < 0) PyErr_Clear();
    result = PyObject_Vectorcall(h->base, args, nargs, kwnames);
    restore_attr(pool, s_kvc_request_id, previous);
    if (result != NULL && result != Py_None
        && admitted(self, sched, request, rid, args, nargs, kwnames) < 0)
        failed(self, "kvc_admitted");
done:
    Py_XDECREF(sched);
    Py_XDECREF(rid);
    Py_XDECREF(refuse);
    Py_XDECREF(arbiter);
    Py_XDECREF(pool);
    Py_XDECREF(previous);
    return result;
}

/* ---- KVClaimsMixin.add_request / kvc_on_arrival (the usual request) ----------------------- */
/* A new dict from alternating (interned name, value) pairs; values are borrowed. */
static PyObject *fields(PyObject *const *pairs, Py_ssize_t n) {
    PyObject *d = PyDict_New();
    for (Py_ssize_t i = 0; d != NULL && i < n; i++)
        if (PyDict_SetItem(d, pairs[2 * i], pairs[2 * i + 1]) < 0) Py_CLEAR(d);
    return d;
}

/* Stage (event, 1, now, fields): the single-event form. Steals ``f``. */
static int stage_one(PyObject *holder, PyObject *event, PyObject *f) {
    if (f == NULL) return -1;
    PyObject *one = PyLong_FromLong(1), *ts = now_ns();
    PyObject *e = one && ts ? PyTuple_Pack(4, event, one, ts, f) : NULL;
    Py_XDECREF(one);
    Py_XDECREF(ts);
    Py_DECREF(f);
    int r = e != NULL ? call_stage(holder, e) : -1;
    Py_XDECREF(e);
    return r;
}

static int arrival(PyObject *self, PyObject *request, PyObject *rid) {
    PyObject *params = PyObject_GetAttr(request, s_sampling_params);
    if (params == NULL) return -1;
    PyObject *extra = NULL;
    if (params != Py_None) {  /* as getattr(params, "extra_args", None) */
        extra = PyObject_GetAttr(params, s_extra_args);
        if (extra == NULL && PyErr_ExceptionMatches(PyExc_AttributeError)) PyErr_Clear();
        else if (extra == NULL) {
            Py_DECREF(params);
            return -1;
        }
    }
    Py_DECREF(params);
    int t = extra != NULL ? PyObject_IsTrue(extra) : 0;
    Py_XDECREF(extra);
    if (t == 0) {
        PyObject *policy = PyObject_GetAttr(self, s_kvc_policy);
        t = policy ? truthy_attr(policy, s_deny_reuse) : -1;
        Py_XDECREF(policy);
    }
    if (t < 0) return -1;
    if (t) {  /* a claim, tenant, release or reuse denial: the Python twin */
        PyObject *r = PyObject_CallMethodObjArgs(self, s_kvc_on_arrival, request, NULL);
        Py_XDECREF(r);
        return r == NULL ? -1 : 0;
    }
    PyObject *prompt = PyObject_GetAttr(request, s_num_prompt_tokens);
    if (prompt == NULL) return -1;
    PyObject *pairs[8] = {s_request_id, rid, s_tenant, Py_None, s_num_prompt_tokens, prompt,
                          s_claim_id, Py_None};
    int r = stage_one(self, s_request_arrived, fields(pairs, 4));
    Py_DECREF(prompt);
    return r;
}

static PyObject *hook_add_request(Hook *h, PyObject *const *args, size_t nargsf,
                                  PyObject *kwnames) {
    if (kwnames != NULL || PyVectorcall_NARGS(nargsf) != 2)
        return to_python(h, args, nargsf, kwnames);
    PyObject *self = args[0], *request = args[1];
    /* NOTE: kvc_compiled is set with kvc_ready, at the end of kvc_setup, and never cleared */
    int on = truthy_attr(self, s_kvc_compiled);
    PyObject *rid = on > 0 ? PyObject_GetAttr(request, s_request_id) : NULL;
    PyObject *known = rid ? PyObject_GetAttr(self, s_requests) : NULL;
    int seen = known ? PySequence_Contains(known, rid) : -1;
    Py_XDECREF(known);
    if (seen < 0) {  /* a scheduler without the recorder (or an odd request): the twin */
        Py_XDECREF(rid);
        PyErr_Clear();
        return to_python(h, args, nargsf, kwnames);
    }
    if (!seen && arrival(self, request, rid) < 0) report(NULL, self, "kvc_on_arrival");
    Py_DECREF(rid);
    return PyObject_Vectorcall(h->base, args, 2, NULL);
}

/* ---- KVClaimsMixin._free_request / kvc_on_finish ------------------------------------------ */
static int finish(PyObject *self, PyObject *request) {
    PyObject *rid = PyObject_GetAttr(request, s_request_id);
    PyObject *reason = rid ? PyObject_CallMethodNoArgs(request, s_get_finished_reason) : NULL;
    PyObject *text = NULL, *cached = NULL, *output = NULL, *why = NULL;
    int r = -1;
    PyObject *texts = reason ? PyObject_GetAttr(self, s_kvc_reason_text) : NULL;
    if (texts == NULL) goto done;
    /* str(reason), cached per reason in the dict the Python twin shares */
    text = PyDict_CheckExact(texts) ? PyDict_GetItemWithError(texts, reason) : NULL;
    if (!PyDict_CheckExact(texts)) PyErr_SetString(PyExc_TypeError, "kvc_reason_text");
    if (text != NULL) {
        Py_INCREF(text);
    } else if (!PyErr_Occurred()) {
        text = reason == Py_None ? Py_NewRef(Py_None) : PyObject_Str(reason);
        if (text != NULL && text != Py_None && PyDict_SetItem(texts, reason, text) < 0)
            Py_CLEAR(text);
    }
    Py_DECREF(texts);
    if (text == NULL) goto done;
    PyObject *book = PyObject_GetAttr(self, s_kvc_admitted_cached_tokens);
    PyObject *zero = book ? PyLong_FromLong(0) : NULL;
    cached = zero ? PyObject_CallMethodObjArgs(book, s_pop, rid, zero, NULL) : NULL;
    Py_XDECREF(book);
    Py_XDECREF(zero);
    output = cached ? PyObject_GetAttr(request, s_num_output_tokens) : NULL;
    PyObject *refuse = output ? PyObject_GetAttr(self, s_kvc_to_refuse) : NULL;
    int refused = refuse ? PySequence_Contains(refuse, rid) : -1;
    Py_XDECREF(refuse);
    why = refused > 0 ? PyObject_GetAttr(self, s_kvc_refusal_reason)
                      : refused == 0 ? Py_NewRef(Py_None) : NULL;
    if (why == NULL) goto done;
    PyObject *pairs[10] = {s_request_id, rid, s_finish_reason, text, s_num_cached_tokens, cached,
                           s_num_output_tokens, output, s_reason, why};
    if (stage_one(self, s_request_finished, fields(pairs, 5)) < 0) goto done;
    /* the bookkeeping of kvc_on_finish: reuse denial, tenant, the arbiter's per-request state */
    PyObject *denied = PyObject_GetAttr(self, s_kvc_reuse_denied);
    int t = denied ? PyObject_IsTrue(denied) : -1;
    PyObject *res = t > 0 ? PyObject_CallMethodObjArgs(denied, s_discard, rid, NULL) : NULL;
    Py_XDECREF(denied);
    Py_XDECREF(res);
    if (t < 0 || (t > 0 && res == NULL)) goto done;
    PyObject *tenants = PyObject_GetAttr(self, s_kvc_tenants);
    t = tenants ? PyObject_IsTrue(tenants) : -1;
    res = t > 0 ? PyObject_CallMethodObjArgs(tenants, s_pop, rid, Py_None, NULL) : NULL;
    Py_XDECREF(tenants);
    Py_XDECREF(res);
    if (t < 0 || (t > 0 && res == NULL)) goto done;
    PyObject *arbiter = PyObject_GetAttr(self, s_kvc_arbiter);
    res = arbiter ? PyObject_CallMethodObjArgs(arbiter, s_forget, rid, NULL) : NULL;
    Py_XDECREF(arbiter);
    Py_XDECREF(res);
    r = res == NULL ? -1 : 0;
done:
    Py_XDECREF(rid);
    Py_XDECREF(reason);
    Py_XDECREF(text);
    Py_XDECREF(cached);
    Py_XDECREF(output);
    Py_XDECREF(why);
    return r;
}

static PyObject *hook_free_request(Hook *h, PyObject *const *args, size_t nargsf,
                                   PyObject *kwnames) {
    if (PyVectorcall_NARGS(nargsf) < 2) return to_python(h, args, nargsf, kwnames);
    int on = truthy_attr(args[0], s_kvc_compiled);
    if (on <= 0) {
        PyErr_Clear();
        return to_python(h, args, nargsf, kwnames);
    }
    if (finish(args[0], args[1]) < 0) report(NULL, args[0], "kvc_on_finish");
    return PyObject_Vectorcall(h->base, args, PyVectorcall_NARGS(nargsf), kwnames);
}

static const vectorcallfunc BODIES[K_KINDS] = {
    (vectorcallfunc)hook_pop, (vectorcallfunc)hook_get_new_blocks,
    (vectorcallfunc)hook_free_blocks, (vectorcallfunc)hook_cache_full_blocks,
    (vectorcallfunc)hook_allocate_slots, (vectorcallfunc)hook_free,
    (vectorcallfunc)hook_add_request, (vectorcallfunc)hook_free_request};

/* ---- the Hook type: a method-like descriptor --------------------------------------------- */
static PyObject *Hook_new(PyTypeObject *type, PyObject *a, PyObject *kw) {
    const char *name;
    PyObject *base, *py;
    static char *kwlist[] = {"name", "base", "python", NULL};
    if (!PyArg_ParseTupleAndKeywords(a, kw, "sOO:Hook", kwlist, &name, &base, &py)) return NULL;
    int kind = -1;
    for (int k = 0; k < K_KINDS; k++)
        if (strcmp(name, KIND_NAMES[k]) == 0) kind = k;
    if (kind < 0) {
        PyErr_Format(PyExc_ValueError, "no compiled hook named %s", name);
        return NULL;
    }
    if (l_evicted == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "configure() the staged layouts first");
        return NULL;
    }
    if (!PyCallable_Check(base) || !PyCallable_Check(py)) {
        PyErr_SetString(PyExc_TypeError, "base and python must be callable");
        return NULL;
    }
    Hook *h = PyObject_GC_New(Hook, type);
    if (h == NULL) return NULL;
    h->vectorcall = BODIES[kind];
    h->kind = kind;
    Py_INCREF(base);
    h->base = base;
    Py_INCREF(py);
    h->py = py;
    PyObject_GC_Track(h);
    return (PyObject *)h;
}

static int Hook_traverse(Hook *h, visitproc visit, void *arg) {
    Py_VISIT(h->base);
    Py_VISIT(h->py);
    return 0;
}

static int Hook_clear(Hook *h) {
    Py_CLEAR(h->base);
    Py_CLEAR(h->py);
    return 0;
}

static void Hook_dealloc(Hook *h) {
    PyObject_GC_UnTrack(h);
    Hook_clear(h);
    Py_TYPE(h)->tp_free((PyObject *)h);
}

static PyObject *Hook_get(PyObject *self, PyObject *obj, PyObject *type) {
    if (obj == NULL || obj == Py_None) {
        Py_INCREF(self);
        return self;
    }
    return PyMethod_New(self, obj);
}

static PyObject *Hook_repr(Hook *h) {
    return PyUnicode_FromFormat("<compiled kvclaims hook %s>", KIND_NAMES[h->kind]);
}

static PyObject *Hook_name(Hook *h, void *closure) {
    return PyUnicode_FromString(KIND_NAMES[h->kind]);
}

static PyObject *Hook_python(Hook *h, void *closure) {
    Py_INCREF(h->py);
    return h->py;
}

static PyGetSetDef Hook_getset[] = {
    {"__name__", (getter)Hook_name, NULL, "the hooked method's name", NULL},
    {"__wrapped__", (getter)Hook_python, NULL, "the Python twin in hooks.py", NULL},
    {NULL}};

static PyTypeObject HookType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "kvclaims.recorder._hooks.Hook",
    .tp_basicsize = sizeof(Hook),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_HAVE_VECTORCALL
                | Py_TPFLAGS_METHOD_DESCRIPTOR,
    .tp_doc = "Hook(name, base, python): a compiled hook body bound like a method",
    .tp_new = Hook_new,
    .tp_dealloc = (destructor)Hook_dealloc,
    .tp_traverse = (traverseproc)Hook_traverse,
    .tp_clear = (inquiry)Hook_clear,
    .tp_descr_get = Hook_get,
    .tp_call = PyVectorcall_Call,
    .tp_vectorcall_offset = offsetof(Hook, vectorcall),
    .tp_repr = (reprfunc)Hook_repr,
    .tp_getset = Hook_getset,
};

static PyObject *configure(PyObject *mod, PyObject *args) {
    PyObject *evicted, *allocated, *freed, *cached, *hit;
    if (!PyArg_ParseTuple(args, "OOOOO:configure", &evicted, &allocated, &freed, &cached, &hit))
        return NULL;
    Py_INCREF(evicted);
    Py_XSETREF(l_evicted, evicted);
    Py_INCREF(allocated);
    Py_XSETREF(l_allocated, allocated);
    Py_INCREF(freed);
    Py_XSETREF(l_freed, freed);
    Py_INCREF(cached);
    Py_XSETREF(l_cached, cached);
    Py_INCREF(hit);
    Py_XSETREF(l_hit, hit);
    Py_RETURN_NONE;
}

static PyMethodDef methods[] = {
    {"configure", configure, METH_VARARGS,
     "configure(evicted, allocated, freed, cached, hit): the staged layouts of those events"},
    {NULL}};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_hooks", "Compiled bodies of the recorder's hottest hooks.", -1,
    methods};

#define INTERN(var, text) if ((var = PyUnicode_InternFromString(text)) == NULL) return NULL

PyMODINIT_FUNC PyInit__hooks(void) {
    INTERN(s_kvc_sink, "kvc_sink");
    INTERN(s_kvc_pool, "kvc_pool");
    INTERN(s_kvc_lost_now, "kvc_lost_now");
    INTERN(s_kvc_request_id, "kvc_request_id");
    INTERN(s_kvc_arbiter, "kvc_arbiter");
    INTERN(s_has_soft_claims, "has_soft_claims");
    INTERN(s_watched, "watched");
    INTERN(s_cached_block_hash_to_block, "cached_block_hash_to_block");
    INTERN(s_kvc_report_lost, "kvc_report_lost");
    INTERN(s_kvc_stage, "kvc_stage");
    INTERN(s_kvc_sched, "kvc_sched");
    INTERN(s_block_id, "block_id");
    INTERN(s_kvc_null_id, "kvc_null_id");
    INTERN(s_status, "status");
    INTERN(s_kvc_admission_states, "kvc_admission_states");
    INTERN(s_request_id, "request_id");
    INTERN(s_allocation, "allocation");
    INTERN(s_block_evicted, "block_evicted");
    INTERN(s_block_allocated, "block_allocated");
    INTERN(s_block_freed, "block_freed");
    INTERN(s_block_cached, "block_cached");
    INTERN(s_block_hit, "block_hit");
    INTERN(s_request_admitted, "request_admitted");
    INTERN(s_kvc_hash, "kvc_hash");
    INTERN(s_kvc_reuse_denied, "kvc_reuse_denied");
    INTERN(s_block_hashes, "block_hashes");
    INTERN(s_kvc_record_cached, "kvc_record_cached");
    INTERN(s_kvc_to_refuse, "kvc_to_refuse");
    INTERN(s_pins, "pins");
    INTERN(s_deferrals, "deferrals");
    INTERN(s_num_tokens, "num_tokens");
    INTERN(s_block_size, "block_size");
    INTERN(s_get_num_free_blocks, "get_num_free_blocks");
    INTERN(s_admitted_fields, "admitted_fields");
    INTERN(s_kvc_pending_admission, "kvc_pending_admission");
    INTERN(s_kvc_admitted_cached_tokens, "kvc_admitted_cached_tokens");
    INTERN(s_blocks, "blocks");
    INTERN(s_kvc_admitted, "kvc_admitted");
    INTERN(s_num_new_computed_tokens, "num_new_computed_tokens");
    INTERN(s_new_computed_blocks, "new_computed_blocks");
    INTERN(s_kvc_compiled, "kvc_compiled");
    INTERN(s_requests, "requests");
    INTERN(s_sampling_params, "sampling_params");
    INTERN(s_extra_args, "extra_args");
    INTERN(s_kvc_policy, "kvc_policy");
    INTERN(s_deny_reuse, "deny_reuse");
    INTERN(s_num_prompt_tokens, "num_prompt_tokens");
    INTERN(s_request_arrived, "request_arrived");
    INTERN(s_kvc_on_arrival, "kvc_on_arrival");
    INTERN(s_request_finished, "request_finished");
    INTERN(s_get_finished_reason, "get_finished_reason");
    INTERN(s_num_output_tokens, "num_output_tokens");
    INTERN(s_kvc_tenants, "kvc_tenants");
    INTERN(s_forget, "forget");
    INTERN(s_discard, "discard");
    INTERN(s_pop, "pop");
    INTERN(s_tenant, "tenant");
    INTERN(s_claim_id, "claim_id");
    INTERN(s_finish_reason, "finish_reason");
    INTERN(s_num_cached_tokens, "num_cached_tokens");
    INTERN(s_reason, "reason");
    INTERN(s_kvc_reason_text, "kvc_reason_text");
    INTERN(s_kvc_refusal_reason, "kvc_refusal_reason");
    if (PyType_Ready(&HookType) < 0) return NULL;
    PyObject *m = PyModule_Create(&module);
    if (m == NULL) return NULL;
    Py_INCREF(&HookType);
    if (PyModule_AddObject(m, "Hook", (PyObject *)&HookType) < 0) {
        Py_DECREF(&HookType);
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
