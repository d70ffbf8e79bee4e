# C types for device.py (Cython pure mode; the .py is the definition, this file only types it).
cimport cython

from serving_bench.sim.heap cimport Entry, Heap
from serving_bench.sim.serial cimport Serial


cdef int SOFT, NONE, SERIAL


cdef class Law:
    cdef public str name
    cdef public int form
    cdef public double capacity, eta, power, scale, queue, alpha, sigma, kappa
    @cython.locals(solver=Serial)
    cpdef Serial solver(self)
    cpdef double stretch(self, double demand) except? -1.0
    cpdef double speedup(self, double k, double demand) except? -1.0


cdef class Kind:
    cdef public object key
    cdef public int model, batch
    cdef public double demand, phi
    cdef public object curve


cdef class Job(Entry):
    cdef public double work
    cdef public Kind kind
    cdef public object payload
    cdef public int model, instance
    cdef public double start
    cdef public bint long


cdef class _Running:
    cdef public Kind kind
    cdef public double virtual, rate
    cdef public Heap heap


cdef double INF, DONE_TOLERANCE_S


cdef class Device:
    cdef public str name
    cdef public int index
    cdef public Law law
    cdef public bint overrides
    cdef public dict pairs, running, executions
    cdef public list active
    cdef public double last, busy_s, next, demand, long_s, long_demand, gate
    cdef public list waiting
    cdef public Py_ssize_t waiting_head
    cdef public long long version
    cdef public bint dirty
    cdef public int jobs
    cdef public Serial serial

    @cython.locals(dt=double, r=_Running)
    cdef int _advance(self, double now) except -1

    @cython.locals(stretch=double, nxt=double, t=double, rate=double, r=_Running, kind=Kind, override=dict,
                   serial=Serial, i=cython.Py_ssize_t)
    cdef int _rerate(self, double now) except -1

    cdef dict _override(self)

    @cython.locals(job=Job)
    cpdef add(self, double now, double work, Kind kind, long long seq, object payload, int model, int instance)

    @cython.locals(kind=Kind, r=_Running)
    cdef int _run(self, Job job) except -1

    cpdef flush(self, double now)

    @cython.locals(nxt=double)
    cpdef double next_completion(self, double now) except? -1.0

    @cython.locals(done=list, r=_Running, heap=Heap, limit=double, job=Job, kind=Kind, c=int, active=list,
                   kept=cython.Py_ssize_t, waiting=list)
    cpdef list pop_finished(self, double now)
