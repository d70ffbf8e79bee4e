# C types for state.py (Cython pure mode; the .py is the definition, this file only types it).
cimport cython
from libc cimport math

from serving_bench.sim.device cimport Device

cdef int UNINIT, READY, SCHEDULED, EXECUTING
cdef double INF, DEFAULT_WAIT_S

ctypedef fused Number:
    double
    long long


cpdef double recent_mean(double mean, double value, double memory)


cdef class Piecewise:
    cdef public double[:] xs, ys
    cdef public Py_ssize_t n

    @cython.locals(last=cython.Py_ssize_t, i=cython.Py_ssize_t)
    cpdef double at(self, double x) except? -1.0


cdef class Payload:
    cdef public Py_ssize_t a, b
    cdef public list more
    cdef public long long items, nreq
    cdef public int state
    cdef public bint saturated
    cdef public double start

    cdef int take(self, Py_ssize_t a, Py_ssize_t n, long long items) except -1
    cdef int merge(self, Payload other) except -1
    cpdef list ranges(self)


cdef class Executed:
    cdef public double[:, :] rows
    cdef public Py_ssize_t n

    @cython.locals(n=cython.Py_ssize_t, rows=cython.double[:, :])
    cdef add(self, Py_ssize_t a, Py_ssize_t b, double t, long long items, int instance)


cdef class Clock:
    cpdef notify(self, int m)
    cpdef timer(self, int m, double t)
    cpdef device_changed(self, Device device)
    cpdef arrive(self, int m, double t, long long owner, long long items)
    cpdef release(self, int m, int instance, double t)
    cpdef call(self, double t, object fn)


cdef class ModelState:
    cdef public object spec
    cdef public int m
    cdef public bint dynamic
    cdef public long long max_batch, max_preferred_size, max_queue_size
    cdef public double delay_s, timeout_s
    cdef public tuple preferred
    cdef public double[:] t
    cdef public long long[:] owner, items, cum
    cdef public Py_ssize_t size
    cdef public bint all_ones, static, absorbing
    cdef public Py_ssize_t n_arr, head, pq_head, ui
    cdef public long long next_pref
    cdef public Payload cur
    cdef public list pqueue
    cdef public unsigned char[:] is_idle
    cdef public double[:] u, e
    cdef public const double[:] drift_z
    cdef public double drift_rho, drift_rest, drift_step
    cdef public int n_idle
    cdef public int slots
    cdef public object rng
    cdef public double timer_at
    cdef public object idle_since
    cdef public list rejected, timed_out, errors
    cdef public Executed executed
    cdef public double busy_s
    cdef public long long executions, executed_items
    cdef public double[:, :, :] inst_table
    cdef public double[:] inst_per_request, inst_gap, inst_free_at, inst_pickup, inst_memory, inst_recent_idle
    cdef public list inst_device, inst_kinds, inst_idle, inst_pickup_kind, picked

    cpdef follow_drift(self, object z, double step_s, double rho)
    cpdef refill(self)
    @cython.locals(arrived=cython.longlong, taken=cython.longlong)
    cpdef long long queued_items(self) except? -1
    cpdef admit_until(self, double now)
    @cython.locals(n=cython.Py_ssize_t)
    cpdef bint append(self, double t, long long owner, long long items) except -1
    @cython.locals(n=cython.Py_ssize_t, room=cython.Py_ssize_t)
    cdef _grow(self)
    cdef Py_ssize_t arrived_before(self, double now) except -1
    cdef Py_ssize_t arrived_until(self, double limit) except -1
    cpdef bint wake_predicate(self) except -1
    cpdef Py_ssize_t pqueue_len(self) except? -1
    @cython.locals(i=int)
    cdef int take_idle(self) except -1
    @cython.locals(n=cython.Py_ssize_t, cur=Payload, need=cython.longlong, reach=cython.longlong,
                   j=cython.longlong)
    cpdef Py_ssize_t waking_arrival(self) except? -2
    @cython.locals(t0=double, k=double, t=double)
    cpdef double idle_wake(self, double after) except? -1.0


@cython.locals(mid=cython.Py_ssize_t, bound=cython.Py_ssize_t, step=cython.Py_ssize_t)
cdef Py_ssize_t _bisect_right(double[:] times, double t, Py_ssize_t lo, Py_ssize_t hi) except -1

@cython.locals(mid=cython.Py_ssize_t, bound=cython.Py_ssize_t, step=cython.Py_ssize_t)
cdef Py_ssize_t _bisect_left(Number[:] values, Number x, Py_ssize_t lo, Py_ssize_t hi) except -1
