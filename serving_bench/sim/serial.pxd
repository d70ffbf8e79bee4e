# C types for serial.py (Cython pure mode; the .py is the definition, this file only types it).
cimport cython

cdef Py_ssize_t GF_JOBS, GF_KINDS  # EXACT_STATES stays a Python name (the tests read it)


cpdef double capacity(double n, double alpha, double sigma, double kappa)


cdef class Serial:
    cdef public long long[::1] counts
    cdef public double[::1] demands, rates, prefix, moments, queue, kind_queue, weights
    cdef public Py_ssize_t size, most_jobs
    cdef public bint curved
    cdef public double alpha, sigma, kappa

    cpdef reserve(self, Py_ssize_t size)

    @cython.locals(weight=double, k=cython.Py_ssize_t)
    cpdef set_curve(self, double alpha, double sigma, double kappa)

    @cython.locals(limit=cython.Py_ssize_t, states=cython.Py_ssize_t, jobs=cython.Py_ssize_t,
                   last=cython.Py_ssize_t, tame=bint, c=cython.Py_ssize_t)
    cpdef solve(self, Py_ssize_t kinds)

    @cython.locals(at=cython.Py_ssize_t, degree=cython.Py_ssize_t, c=cython.Py_ssize_t, d=double, rest=double,
                   n=cython.Py_ssize_t, start=cython.Py_ssize_t, source=cython.Py_ssize_t, k=cython.Py_ssize_t,
                   _=cython.Py_ssize_t, factorial=double, a=cython.Py_ssize_t, j=cython.Py_ssize_t, h=double,
                   total=double)
    cdef int _product(self, Py_ssize_t last, Py_ssize_t jobs) except -1

    @cython.locals(queue=cython.double[::1], index=cython.Py_ssize_t, total=double, rest=cython.Py_ssize_t,
                   stride=cython.Py_ssize_t, c=cython.Py_ssize_t, d=double, radix=cython.Py_ssize_t,
                   m=cython.Py_ssize_t, response=double)
    cdef int _mean_value(self, Py_ssize_t kinds, Py_ssize_t states) except -1

    @cython.locals(queue=cython.double[::1], total=double, change=double, c=cython.Py_ssize_t, d=double,
                   n=cython.longlong, response=double, rate=double, q=double, _=cython.Py_ssize_t, seen=double)
    cdef int _schweitzer(self, Py_ssize_t kinds) except -1


@cython.locals(solver=Serial, c=cython.Py_ssize_t)
cpdef list serial_rates(list counts, list demands, tuple curve=*)
