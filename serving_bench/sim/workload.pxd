# C types for workload.py (Cython pure mode; the .py is the definition, this file only types it). Nothing is typed
# yet: compiled as it is, its per-request hooks (a way in, an answer, a phase done) cost less to call from the engine.
