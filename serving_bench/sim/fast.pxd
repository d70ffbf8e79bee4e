# C types for fast.py (Cython pure mode; the .py is the definition, this file only types it).
cimport cython

cdef int DEVICE, TIMER, WAKE, ARRIVE, FEED, RELEASE, CALL
cdef double INF

from serving_bench.sim.core cimport Clock, ModelState, Server
from serving_bench.sim.device cimport Device
from serving_bench.sim.heap cimport Entry, Heap


cdef class Event(Entry):
    cdef public int kind
    cdef public object target
    cdef public int index
    cdef public long long version, items


cdef class Agenda:
    cdef public list ring, asked
    cdef public Py_ssize_t head, count

    @cython.locals(tail=cython.Py_ssize_t)
    cdef int add(self, Py_ssize_t i) except -1
    @cython.locals(i=cython.Py_ssize_t)
    cdef Py_ssize_t take(self) except -1


cdef class FastClock(Clock):
    cdef public double now
    cdef public Heap heap
    cdef public long long seq
    cdef public Agenda late, dirty
    cdef public list timers, wakes, wake_seqs, devices, completions
    cdef public Server server

    @cython.locals(event=Event)
    cdef Event event(self, int kind, object target, int index, long long version=*, long long items=*)
    cdef push(self, double t, int kind, object target, int index, long long version=*, long long items=*)
    cdef plan(self, Event event, double t)
    @cython.locals(device=Device, event=Event)
    cdef replan(self, Py_ssize_t d)
    @cython.locals(st=ModelState, j=cython.Py_ssize_t, t=double, event=Event, seqs=list, seq=cython.longlong)
    cdef plan_wake(self, int m)


@cython.locals(clock=FastClock, server=Server, heap=Heap, late=Agenda, dirty=Agenda, m=int, device=Device,
               t=double, kind=int, pos=cython.Py_ssize_t, event=Event, streams=list)
cpdef Server run_fast(object server_factory, int n_models, object feeds=*)
