# C types for machine.py (Cython pure mode; the .py is the definition, this file only types it).
cimport cython

from serving_bench.sim.device cimport Device, Kind
from serving_bench.sim.state cimport Clock

cdef double INF


cdef class Machine:
    cdef public object spec, core_wait
    cdef public Clock clock
    cdef public dict devices
    cdef public long long job_seq

    cdef _add_job(self, Device dev, double now, double work, Kind kind, object payload, int m, int instance)

    @cython.locals(w=double)
    cpdef start_phase(self, Device dev, object kind, double work, object payload, double now, double u=*,
                      double quiet=*)

    cpdef double wait_for_core(self, Device dev, double u, double quiet=*) except? -1.0

    cpdef _run_phase(self, Device dev, object kind, double work, object payload, double now)
