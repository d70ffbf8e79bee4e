# C types for heap.py (Cython pure mode; the .py is the definition, this file only types it).
cimport cython

cdef double INF


cdef class Entry:
    cdef public double key
    cdef public long long seq
    cdef public Py_ssize_t pos


cdef class Heap:
    cdef public list items
    cdef public double[:] keys
    cdef public long long[:] seqs
    cdef public Py_ssize_t n
    cdef public double first_key

    @cython.locals(n=cython.Py_ssize_t)
    cdef int push(self, Entry item) except -1
    @cython.locals(first=Entry)
    cdef Entry pop(self)
    @cython.locals(n=cython.Py_ssize_t, i=cython.Py_ssize_t, last=Entry)
    cdef int remove(self, Entry item) except -1
    cdef int place(self, Entry item) except -1
    @cython.locals(n=cython.Py_ssize_t, key=double, seq=cython.longlong, child=cython.Py_ssize_t,
                   parent=cython.Py_ssize_t)
    cdef int _settle(self, Entry item, Py_ssize_t i) except -1
    @cython.locals(moved=Entry)
    cdef int _move(self, Py_ssize_t source, Py_ssize_t to) except -1
    @cython.locals(size=cython.Py_ssize_t)
    cdef int _grow(self) except -1


cdef class Calendar:
    cdef public double[:] keys
    cdef public long long[:] seqs
    cdef public Py_ssize_t first
    cdef public bint known

    @cython.locals(first=cython.Py_ssize_t)
    cdef int plan(self, Py_ssize_t i, double key, long long seq) except -1
    cdef bint before(self, Py_ssize_t i, double key, long long seq) noexcept
    cdef int unplan(self, Py_ssize_t i) except -1
    @cython.locals(first=cython.Py_ssize_t, i=cython.Py_ssize_t)
    cdef Py_ssize_t first_place(self) except -2


cdef bint _before(double key, long long seq, double other_key, long long other_seq) noexcept
