# C types for batcher.py (Cython pure mode; the .py is the definition, this file only types it).
cimport cython

from serving_bench.sim.state cimport ModelState, Payload

cdef int UNINIT, READY, SCHEDULED, EXECUTING
cdef double EPS_S, TIMER_RESOLUTION_S
cdef long long NEVER


@cython.locals(h=cython.Py_ssize_t, timeout=double, limit=double, j=cython.Py_ssize_t)
cpdef Py_ssize_t expire(ModelState st, double now) except -1

@cython.locals(h=cython.Py_ssize_t, end=cython.Py_ssize_t, cur=Payload, p=cython.longlong, max_b=cython.longlong,
               max_p=cython.longlong, pref=tuple, best_items=cython.longlong, best_n=cython.longlong,
               send_now=bint, n_q=cython.longlong, k_fit=cython.longlong, x=cython.longlong, k=cython.longlong,
               i_c=cython.longlong, examined=cython.longlong, pending_n=cython.longlong,
               pending_items=cython.longlong, i=cython.Py_ssize_t, s=cython.longlong, delay=double,
               oldest=double, delay_exceeded=bint, total=cython.longlong, nxt=cython.longlong, wait=double,
               closest=double)
cpdef (double, long long, long long) get_dynamic_batch(ModelState st, double now) except *

@cython.locals(end=cython.Py_ssize_t, i=cython.Py_ssize_t, pref=tuple, cur=Payload, p=cython.longlong,
               n=cython.longlong, x=cython.longlong)
cpdef absorb(ModelState st, double now)

@cython.locals(x=cython.longlong)
cpdef long long next_size(tuple sizes, long long n) except? -1
