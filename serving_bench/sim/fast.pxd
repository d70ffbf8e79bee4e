# C types for fast.py (Cython pure mode; the .py is the definition, this file only types it).
cimport cython

from serving_bench.sim.core cimport Server
from serving_bench.sim.device cimport Device
from serving_bench.sim.heap cimport Calendar, Entry, Heap
from serving_bench.sim.state cimport Clock, ModelState

cdef int ARRIVE, FEED, RELEASE, CALL
cdef double INF


cdef class Event(Entry):
    cdef public int kind
    cdef public object target
    cdef public int index
    cdef public long long version, items


cdef class Agenda:
    cdef public Py_ssize_t[:] ring
    cdef public unsigned char[:] asked
    cdef public Py_ssize_t size, head, count

    @cython.locals(tail=cython.Py_ssize_t)
    cdef int add(self, Py_ssize_t i) except -1
    @cython.locals(i=cython.Py_ssize_t)
    cdef Py_ssize_t take(self) except -1


cdef class FastClock(Clock):
    cdef public double now
    cdef public Heap heap
    cdef public Calendar calendar
    cdef public long long seq
    cdef public int n_models
    cdef public Agenda late, dirty
    cdef public long long[:] wake_seq, wake_base
    cdef public list devices, versions
    cdef public Server server

    @cython.locals(event=Event)
    cdef push(self, double t, int kind, object target, int index, long long version=*, long long items=*)
    cdef plan(self, Event event, double t)
    cdef plan_place(self, Py_ssize_t i, double t)
    @cython.locals(device=Device)
    cdef replan(self, Py_ssize_t d)
    @cython.locals(st=ModelState, i=cython.Py_ssize_t, j=cython.Py_ssize_t, t=double, k=cython.Py_ssize_t,
                   seq=cython.longlong)
    cdef plan_wake(self, int m)


@cython.locals(clock=FastClock, server=Server, heap=Heap, calendar=Calendar, late=Agenda, dirty=Agenda, m=int,
               n_models=int, i=cython.Py_ssize_t, d=cython.Py_ssize_t, next_t=double, device=Device,
               planned=cython.longlong, t=double,
               kind=int, pos=cython.Py_ssize_t, event=Event, streams=list)
cpdef Server run_fast(object server_factory, int n_models, object feeds=*)
