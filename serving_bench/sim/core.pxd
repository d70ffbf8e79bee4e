# C types for core.py (Cython pure mode; the .py is the definition, this file only types it).
cimport cython
from libc cimport math

from serving_bench.sim.batcher cimport absorb, expire, get_dynamic_batch
from serving_bench.sim.device cimport Device, Job, Kind
from serving_bench.sim.machine cimport Machine
from serving_bench.sim.state cimport Clock, Executed, ModelState, Payload, Piecewise, recent_mean

cdef int UNINIT, READY, SCHEDULED, EXECUTING
cdef double INF, SQRT_HALF


cdef class Server(Machine):
    cdef public object on_done, on_failed, on_phase
    cdef public bint report_all, lazy
    cdef public list models

    @cython.locals(st=ModelState)
    cpdef step(self, int m, double now)

    @cython.locals(p=Payload, i=cython.Py_ssize_t)
    cdef _direct(self, ModelState st, double now)

    @cython.locals(p=Payload, f=Payload)
    cdef _dispatch(self, ModelState st, double now)

    @cython.locals(pickup=double)
    cdef _take(self, ModelState st, Payload p, int instance, double now)

    @cython.locals(picked=list, k=cython.Py_ssize_t, p=Payload, instance=int)
    cdef _start_picked(self, ModelState st, double now)

    @cython.locals(items=cython.longlong, ui=cython.Py_ssize_t, u=double, last=cython.Py_ssize_t, x=double,
                   i=cython.Py_ssize_t, lo=double, hi=double, work=double, per_request=double, idle=Piecewise,
                   zi=cython.Py_ssize_t, idle_s=double)
    cdef _start(self, ModelState st, Payload p, int instance, double now)

    @cython.locals(done=list, job=Job, m=int, instance=int, st=ModelState, p=Payload, more=list,
                   k=cython.Py_ssize_t, gap=double)
    cpdef complete(self, Device dev, double now)

    @cython.locals(st=ModelState)
    cpdef arrive(self, int m, double now, long long owner, long long items)

    @cython.locals(st=ModelState)
    cpdef release(self, int m, int instance, double now)

    @cython.locals(timer=double, cur=Payload, wait=double, n=cython.longlong, items=cython.longlong,
                   a=cython.Py_ssize_t)
    cdef _batcher_loop(self, ModelState st, double now)

    cdef idle_arrival(self, ModelState st)

    @cython.locals(h=cython.Py_ssize_t, k=cython.Py_ssize_t, o=cython.longlong)
    cdef _expire(self, ModelState st, double now)

    @cython.locals(ranges=list, k=cython.Py_ssize_t, i=cython.Py_ssize_t, o=cython.longlong)
    cdef _report_done(self, ModelState st, Payload p, double now)

