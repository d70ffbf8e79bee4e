# cython: boundscheck=False, wraparound=False, initializedcheck=False
# (compiled without index checks: every index used here is below its array's length by construction)
"""Law ``serial``'s rates: a device that runs its jobs' kernels one at a time (a GPU), solved for each set of
running jobs (:mod:`serving_bench.sim.device` asks at every change of the set).

A job's solo second is ``1 - d`` of its own (the host launching kernels: never waits) and ``d`` on the device,
finely interleaved; the device is processor-shared among the kernels in flight. That is a closed product-form
network (an infinite server and a processor-sharing one, any service distribution). With ``n`` the running jobs
(``n_c`` of kind ``c``, demand ``d_c``), a job of kind ``c`` runs at ``H(n - e_c) / H(n)`` solo seconds per second,

    H(n) = sum_k k! [z^k] prod_j (1 - d_j + d_j z)        (the product over the running jobs j),

the network's normalising constant less its factors that cancel in the ratio. A lone job keeps its solo speed, two
jobs slow each other by ``1 + d_a d_b`` below the device's capacity, ``k`` identical ones saturate at ``1 / d``
jobs' worth. Kinds of demand 0 run at 1.

Products before and moments after each kind give every ``H`` of a set of ``N`` jobs of ``K`` kinds in ``O(N^2 + K N)``
operations, all of positive terms (no cancellation); the
mean-value analysis over the set's sub-populations (``R_c(m) = d_c (1 + Q(m - e_c))``, ``X_c(m) = m_c / (1 - d_c +
R_c(m))``, ``Q(m) = sum_c X_c(m) R_c(m)``, a rate ``1 / (1 - d_c + R_c(n))``) gives the same rates to rounding at
``O(K prod_c (n_c + 1))``, and is kept where the product is not safe in floating point: more than :data:`GF_JOBS`
jobs, or a demand above 1. Above :data:`EXACT_STATES` sub-populations the rates are Schweitzer's approximation (the
fixed point with a job seeing ``(n_c - 1) / n_c`` of its own kind's queue).

**Kernels that overlap** (laws ``overlap``, ``overlap_sat``, ``overlap_usl``: :meth:`Serial.set_curve`): the device
is a load-dependent station instead, serving ``n`` kernels in flight at ``c(n)`` kernels' worth of speed (``c(n) = 1``:
law ``serial``). The network stays product-form; only the weight of ``k`` jobs at the device changes, from ``k!`` to
``F(k) = k! / (c(1) ... c(k))``:

    H(n) = sum_k F(k) [z^k] prod_j (1 - d_j + d_j z)

so the same products and moments solve it (the moments start at ``F`` instead of the factorials). Demands are taken
at most 1 (a GPU's busy share above 1 is the measurement's noise). Sets of more jobs than :data:`GF_JOBS` (or than
the weights stay finite for), or of more than :data:`EXACT_STATES` sub-populations, take Schweitzer's approximation, a
job that finds ``m - 1`` kernels in flight served at ``c(m) / m`` of its speed.
"""

from __future__ import annotations

from array import array

EXACT_STATES = 4096  # sets of up to this many sub-populations are solved exactly, larger ones approximated
GF_JOBS = 128  # the polynomial product solves sets of up to this many jobs (H <= N!: no overflow below 171)
GF_KINDS = 12  # kinds of demand > 0 in an exactly solved set, at most (2 ** 12 = EXACT_STATES sub-populations)


def _doubles(n: int) -> array:
    return array("d", bytes(8 * n))


def capacity(n: float, alpha: float, sigma: float, kappa: float) -> float:
    """Kernels' worth of speed of a device with ``n`` kernels in flight (``n`` >= 1): ``n ** alpha / (1 + sigma
    (n - 1) + kappa n (n - 1))`` (alpha 1, sigma and kappa 0: every kernel at full speed; alpha 0 or sigma 1: one
    kernel's worth, law ``serial``)."""
    return n ** alpha / (1.0 + sigma * (n - 1.0) + kappa * n * (n - 1.0))


class Serial:
    """One device's solver: the running kinds' job ``counts`` and ``demands`` in, their ``rates`` out (:meth:`solve`),
    for up to ``size`` kinds (:meth:`reserve` grows it); scratch space kept between solves."""

    __slots__ = ("counts", "demands", "rates", "size", "prefix", "moments", "queue", "kind_queue", "curved", "weights",
                 "most_jobs", "alpha", "sigma", "kappa")

    def __init__(self, size: int = 8):
        self.size = 0
        self.reserve(size)
        self.prefix = _doubles((GF_KINDS + 1) * (GF_JOBS + 1))  # _product's polynomials, one after another
        self.moments = _doubles(GF_JOBS + 1)  # _product's moments
        self.queue = _doubles(EXACT_STATES)  # mean-value analysis: Q(m) by the mixed-radix index of m
        self.curved = False  # law serial (c = 1) unless set_curve is called
        self.weights = _doubles(GF_JOBS + 1)  # F(k) of a curved device
        self.most_jobs = GF_JOBS  # ... up to this k, all finite
        self.alpha, self.sigma, self.kappa = 0.0, 0.0, 0.0

    def set_curve(self, alpha: float, sigma: float, kappa: float) -> None:
        """Kernels overlap: the device serves ``n`` in flight at :func:`capacity` ``(n, alpha, sigma, kappa)``."""
        self.curved = True
        self.alpha, self.sigma, self.kappa = alpha, sigma, kappa
        weight = 1.0
        self.weights[0] = weight
        self.most_jobs = GF_JOBS
        for k in range(1, GF_JOBS + 1):
            weight *= k / capacity(k, alpha, sigma, kappa)
            self.weights[k] = weight
            if weight > 1e300 and self.most_jobs == GF_JOBS:
                self.most_jobs = k - 1

    def reserve(self, size: int) -> None:
        """Room for at least ``size`` kinds."""
        if size > self.size:
            self.size = max(size, 2 * self.size)
            self.counts = array("q", bytes(8 * self.size))
            self.demands = _doubles(self.size)
            self.rates = _doubles(self.size)
            self.kind_queue = _doubles(self.size)  # Schweitzer's queue per kind

    def solve(self, kinds: int) -> None:
        """Set ``rates[c]`` for the first ``kinds`` kinds from their ``counts`` and ``demands``."""
        limit = EXACT_STATES
        states = 1
        jobs = 0
        last = 0  # the last kind with jobs and demand
        tame = True
        for c in range(kinds):
            self.rates[c] = 1.0
            if self.demands[c] > 0.0 and self.counts[c]:
                jobs += self.counts[c]
                last = c
                tame = tame and self.demands[c] <= 1.0
                if states <= limit:
                    states *= self.counts[c] + 1
        if states == 1:
            return
        if self.curved:  # no mean-value analysis for a load-dependent device: the product, else Schweitzer's
            if jobs <= self.most_jobs and states <= limit:
                self._product(last, jobs)
            else:
                self._schweitzer(kinds)
        elif states > limit:
            self._schweitzer(kinds)
        elif jobs <= GF_JOBS and tame:
            self._product(last, jobs)
        else:
            self._mean_value(kinds, states)

    def _product(self, last: int, jobs: int) -> None:
        """The rates as ratios of ``H`` (the module docstring's formula), ``jobs`` running in the kinds up to
        ``last`` (the last with jobs and demand). Forward, the coefficients ``p`` of the product over the kinds
        before each kind; backward, the moments ``M_a = sum_b (a + b)! s_b`` of the product ``s`` over the kinds
        after it (the empty product's: ``a!``; times ``1 - d + d z``: ``M_a <- (1 - d) M_a + d M_(a+1)``). ``H``
        less one job of kind ``c`` is ``sum_a p_a M_a`` once ``c``'s other jobs are applied to ``M``; with the last
        one too, ``M_0`` is ``H`` of the kinds from ``c`` on."""
        at = 0  # where the product over the kinds before c starts in prefix
        degree = 0  # its degree: the jobs before c
        self.prefix[0] = 1.0
        for c in range(last):
            d = self.demands[c]
            if self.curved and d > 1.0:
                d = 1.0
            rest = 1.0 - d
            n = self.counts[c]
            if d <= 0.0 or not n:
                continue
            start = at + degree + 1  # the product up to c, after it: the one before, times (1 - d + d z) n times
            source = at
            for _ in range(n):
                degree += 1
                self.prefix[start + degree] = d * self.prefix[source + degree - 1]
                for k in range(degree - 1, 0, -1):
                    self.prefix[start + k] = rest * self.prefix[source + k] + d * self.prefix[source + k - 1]
                self.prefix[start] = rest * self.prefix[source]
                source = start
            at = start
        at += degree + 1  # where the product up to the last kind would be (not needed)
        degree += self.counts[last]
        if self.curved:
            for a in range(jobs + 1):
                self.moments[a] = self.weights[a]
        else:
            factorial = 1.0
            for a in range(jobs + 1):
                self.moments[a] = factorial
                factorial *= a + 1
        for c in range(last, -1, -1):
            d = self.demands[c]
            if self.curved and d > 1.0:
                d = 1.0
            rest = 1.0 - d
            n = self.counts[c]
            if d <= 0.0 or not n:
                continue
            degree -= n
            at -= degree + 1
            for j in range(n):
                if j == n - 1:  # c's other jobs applied: H less one of c's
                    h = 0.0
                    for a in range(degree + 1):
                        h += self.prefix[at + a] * self.moments[a]
                    self.rates[c] = h
                for a in range(degree + n - j):
                    self.moments[a] = rest * self.moments[a] + d * self.moments[a + 1]
        total = self.moments[0]
        for c in range(last + 1):
            if self.demands[c] > 0.0 and self.counts[c]:
                self.rates[c] /= total

    def _mean_value(self, kinds: int, states: int) -> None:
        """The rates by exact mean-value analysis over the ``states`` sub-populations of the running set."""
        queue = self.queue
        queue[0] = 0.0
        for index in range(1, states):
            total = 0.0
            rest = index  # index's mixed-radix digits, kind by kind
            stride = 1
            for c in range(kinds):
                d = self.demands[c]
                if d <= 0.0:
                    continue
                radix = self.counts[c] + 1
                m = rest % radix
                rest //= radix
                if m:
                    response = d * (1.0 + queue[index - stride])
                    total += m * response / (1.0 - d + response)
                    if index == states - 1:
                        self.rates[c] = 1.0 / (1.0 - d + response)
                stride *= radix
            queue[index] = total

    def _schweitzer(self, kinds: int) -> None:
        """The rates by Schweitzer's fixed point (for populations too large to solve exactly)."""
        queue = self.kind_queue
        for c in range(kinds):
            queue[c] = self.counts[c] * self.demands[c]
        for _ in range(500):
            total = 0.0
            for c in range(kinds):
                total += queue[c]
            change = 0.0
            for c in range(kinds):
                d = self.demands[c]
                n = self.counts[c]
                if d <= 0.0 or not n:
                    continue
                if self.curved:  # the kernels it finds and itself, served at c(m) kernels' worth
                    d = min(d, 1.0)
                    seen = 1.0 + total - queue[c] / n
                    response = d * seen / capacity(seen, self.alpha, self.sigma, self.kappa)
                else:
                    response = d * (1.0 + total - queue[c] / n)
                rate = 1.0 / (1.0 - d + response)
                q = n * rate * response
                change = max(change, abs(q - queue[c]))
                queue[c] = q
                self.rates[c] = rate
            if change < 1e-12:
                break


def serial_rates(counts: list, demands: list, curve: tuple | None = None) -> list:
    """Per kind, the rate (solo seconds of work per second) of each of its ``counts[c]`` running jobs of demand
    ``demands[c]`` on a device that runs kernels one at a time (the module docstring), or whose kernels overlap as
    ``curve`` says (``(alpha, sigma, kappa)`` of :func:`capacity`)."""
    solver = Serial(len(counts))
    if curve is not None:
        solver.set_curve(curve[0], curve[1], curve[2])
    for c in range(len(counts)):
        solver.counts[c] = counts[c]
        solver.demands[c] = demands[c]
    solver.solve(len(counts))
    return list(solver.rates[:len(counts)])
