# C types for heap.py (Cython pure mode; the .py is the definition, this file only types it).
cimport cython

cdef double INF


cdef class Entry:
    cdef public double key
    cdef public long long seq
    cdef public Py_ssize_t pos


cdef class Heap:
    cdef public list items
    cdef public Py_ssize_t n
    cdef public double first_key

    @cython.locals(n=cython.Py_ssize_t)
    cdef void push(self, Entry item)
    @cython.locals(first=Entry)
    cdef Entry pop(self)
    @cython.locals(items=list, last=Entry, i=cython.Py_ssize_t)
    cdef void remove(self, Entry item)
    cdef void place(self, Entry item)
    @cython.locals(first=Entry)
    cdef void _first(self)

    @cython.locals(items=list, i=cython.Py_ssize_t, parent=cython.Py_ssize_t, above=Entry)
    cdef void _up(self, Entry item)

    @cython.locals(items=list, n=cython.Py_ssize_t, i=cython.Py_ssize_t, child=cython.Py_ssize_t, below=Entry)
    cdef void _down(self, Entry item)


cdef bint _before(Entry a, Entry b) noexcept
