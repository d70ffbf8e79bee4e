# C types for workload.py (Cython pure mode; the .py is the definition, this file only types it): the per-request
# hooks (a way in, an answer, a phase done) read and write the run's arrays through typed views.
cimport cython

from serving_bench.sim.core cimport Server
from serving_bench.sim.device cimport Device
from serving_bench.sim.state cimport recent_mean


cdef class Workload:
    cdef public object spec, kinds, model, items, closed, clock
    cdef public Py_ssize_t n
    cdef public object u_dispatch, u_overhead, u_wait, u_step, sent_s, since_s, quiet_s, overhead_s, client_done_s
    cdef public object dispatch_work_s, stream_of, drift_z
    cdef public list errors, ensembles, step_of, feeds, streams, overhead_grid, ensemble_extra, request_kind, way_in
    cdef public list way_out
    cdef public dict sources, dispatch_grid, concurrency
    cdef public set hosted, dynamic
    cdef public Server server
    cdef public Device host
    cdef public double last_send_s, duration_s, quiet_memory, recent_quiet_s
    cdef public bint open_loop, waits
    cdef public double[:] sent_v, since_v, quiet_v, overhead_v, client_done_v, work_in_v
    cdef public double[:, :] wait_v, step_v
    cdef public long long[:] stream_v, hosted_in_v, hosted_out_v, ensemble_v, items_v
    cdef public unsigned char[:] batching_v

    @cython.locals(rid=cython.Py_ssize_t, m=cython.longlong, reached=double)
    cpdef _send(self, Py_ssize_t s, double t)
    cdef long long _items(self, long long m, Py_ssize_t rid) except? -1
    @cython.locals(work=double)
    cpdef _way_in(self, long long m, Py_ssize_t rid, double t, long long items)
    @cython.locals(stream=cython.Py_ssize_t, e=cython.longlong, m=cython.longlong)
    cpdef _arrive(self, Py_ssize_t rid, double now)
    @cython.locals(stream=cython.Py_ssize_t, overhead=double, m=cython.longlong)
    cdef _answered(self, Py_ssize_t rid, double now)
    @cython.locals(rid=cython.Py_ssize_t)
    cpdef on_phase(self, object payload, double now)
    cpdef on_done(self, long long owner, double now)
    cpdef on_failed(self, long long owner, double now, str outcome)
    cpdef _model_feed(self, int m, Py_ssize_t rid, double t, long long items)
    cpdef _ensemble_feed(self, int e, Py_ssize_t rid, double t, long long items)
    cpdef ensemble_arrival(self, int e, Py_ssize_t rid, double t, long long items)
    @cython.locals(at=double, rid=cython.Py_ssize_t)
    cdef _issue(self, Py_ssize_t slot, int step, double t)
