# C types for core.py (Cython pure mode; the .py is the definition, this file only types it).
cimport cython
from libc cimport math

from serving_bench.sim.device cimport Device, Job, Kind
from serving_bench.sim.state cimport Clock, Executed, ModelState, Payload, Piecewise, recent_mean

cdef int UNINIT, READY, SCHEDULED, EXECUTING
cdef double EPS_S, TIMER_RESOLUTION_S, INF, SQRT_HALF
cdef long long NEVER


cdef class Server:
    cdef public object spec, on_done, on_failed, on_phase, core_wait
    cdef public bint report_all, lazy
    cdef public Clock clock
    cdef public list models
    cdef public dict devices
    cdef public long long job_seq

    @cython.locals(st=ModelState)
    cpdef step(self, int m, double now)

    @cython.locals(p=Payload, i=cython.Py_ssize_t)
    cdef _direct(self, ModelState st, double now)

    @cython.locals(p=Payload, f=Payload)
    cdef _dispatch(self, ModelState st, double now)

    @cython.locals(pickup=double, dev=Device)
    cdef _take(self, ModelState st, Payload p, int instance, double now)

    @cython.locals(picked=list, k=cython.Py_ssize_t, p=Payload, instance=int)
    cdef _start_picked(self, ModelState st, double now)

    @cython.locals(items=cython.longlong, ui=cython.Py_ssize_t, u=double, last=cython.Py_ssize_t, x=double,
                   i=cython.Py_ssize_t, lo=double, hi=double, work=double, per_request=double, dev=Device,
                   idle=Piecewise, zi=cython.Py_ssize_t, idle_s=double)
    cdef _start(self, ModelState st, Payload p, int instance, double now)

    @cython.locals(done=list, job=Job, m=int, instance=int, st=ModelState, p=Payload, more=list,
                   k=cython.Py_ssize_t, gap=double)
    cpdef complete(self, Device dev, double now)

    @cython.locals(w=double)
    cpdef start_phase(self, Device dev, object kind, double work, object payload, double now, double u=*,
                      double quiet=*)

    cpdef double wait_for_core(self, Device dev, double u, double quiet=*) except? -1.0

    cpdef _run_phase(self, Device dev, object kind, double work, object payload, double now)

    @cython.locals(st=ModelState)
    cpdef arrive(self, int m, double now, long long owner, long long items)

    @cython.locals(st=ModelState)
    cpdef release(self, int m, int instance, double now)

    @cython.locals(timer=double, cur=Payload, wait=double, n=cython.longlong, items=cython.longlong,
                   a=cython.Py_ssize_t)
    cdef _batcher_loop(self, ModelState st, double now)

    @cython.locals(end=cython.Py_ssize_t, i=cython.Py_ssize_t, pref=tuple, cur=Payload, p=cython.longlong,
                   n=cython.longlong, x=cython.longlong)
    cdef _absorb(self, ModelState st, double now)

    cdef idle_arrival(self, ModelState st)

    @cython.locals(timeout=double, h=cython.Py_ssize_t, end=cython.Py_ssize_t, limit=double, j=cython.Py_ssize_t,
                   k=cython.Py_ssize_t, o=cython.longlong)
    cdef _expire(self, ModelState st, double now)

    @cython.locals(h=cython.Py_ssize_t, end=cython.Py_ssize_t, cur=Payload, p=cython.longlong, max_b=cython.longlong,
                   max_p=cython.longlong, pref=tuple, best_items=cython.longlong, best_n=cython.longlong,
                   send_now=bint, n_q=cython.longlong, k_fit=cython.longlong, x=cython.longlong, k=cython.longlong,
                   i_c=cython.longlong, examined=cython.longlong, pending_n=cython.longlong,
                   pending_items=cython.longlong, i=cython.Py_ssize_t, s=cython.longlong, delay=double,
                   oldest=double, delay_exceeded=bint, total=cython.longlong, nxt=cython.longlong, wait=double,
                   closest=double)
    cdef (double, long long, long long) _get_dynamic_batch(self, ModelState st, double now) except *

    @cython.locals(ranges=list, k=cython.Py_ssize_t, i=cython.Py_ssize_t, o=cython.longlong)
    cdef _report_done(self, ModelState st, Payload p, double now)


@cython.locals(x=cython.longlong)
cdef long long _next_size(tuple sizes, long long n) except? -1
