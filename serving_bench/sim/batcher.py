"""Triton's dynamic batcher's decisions on one model's queue, as ``DynamicBatchScheduler`` (core r23+, bundled in
tritonserver 2.51) makes them: which queued requests time out (:func:`expire`), what ``GetDynamicBatch`` takes or how
long it waits (:func:`get_dynamic_batch`), and the bulk replay of the arrivals a busy model's batcher only absorbs
(:func:`absorb`). Functions of a :class:`~serving_bench.sim.state.ModelState`; the server (``core.py``) runs the
batcher thread on them and acts on what they decide (the rules are listed in ``core.py``'s docstring).
"""

from __future__ import annotations

from serving_bench.sim.state import PAYLOAD_STATES, ModelState, Payload

UNINIT, READY, SCHEDULED, EXECUTING = PAYLOAD_STATES
EPS_S = 1e-9  # clock comparisons tolerate 1 ns (Triton's clock resolution)
TIMER_RESOLUTION_S = 1e-6
NEVER = 1 << 62  # Triton waits in whole microseconds; a wait below 1 us is no wait


def expire(st: ModelState, now: float) -> int:
    """Drop the queued requests whose queue timeout has passed (they are at the head: one timeout per model) into
    ``st.timed_out``; returns the first of them (``st.head`` after is one past the last; ``st.head`` when none)."""
    h = st.head
    timeout = st.timeout_s
    if timeout <= 0.0:
        return h
    limit = now - timeout + EPS_S
    if h < st.n_arr and st.t[h] <= limit:
        j = st.arrived_until(limit)
        st.timed_out.append((h, j, now))
        st.head = j
    return h


def get_dynamic_batch(st: ModelState, now: float) -> tuple[float, int, int]:
    """Triton's ``GetDynamicBatch`` on a queue already cleared of expired requests (:func:`expire`): (wait seconds
    or 0 to send, requests to move, their items)."""
    h, end = st.head, st.n_arr
    if h >= end:
        return 0.0, 0, 0
    cur = st.cur
    p = cur.items
    max_b, max_p, pref = st.max_batch, st.max_preferred_size, st.preferred
    best_items = best_n = 0
    send_now = False
    if st.all_ones:
        n_q = end - h
        # requests taken while they fit max_batch (the first one always)
        k_fit = min(n_q, max_b - p) if p + n_q > 0 else 0
        if p == 0:
            k_fit = max(k_fit, 1)
        send_now = k_fit < n_q
        for x in pref:  # the largest preferred total reachable
            k = x - p
            if 1 <= k <= k_fit:
                best_items = best_n = k
        # first examined request whose addition crosses the largest preferred size
        i_c = max(max_p - p, 0)
        examined = min(n_q, k_fit + 1)
        if (p > 0 or i_c >= 1) and i_c < examined:
            cur.saturated = True
            if best_n == 0:  # the crossing marks the pending size before it (a second crossing if that is 0)
                if i_c > 0:
                    best_items = best_n = i_c
                elif 1 < examined:
                    best_items = best_n = 1
        pending_n = k_fit
        pending_items = k_fit
    else:
        pending_items = pending_n = 0
        i = h
        while i < end:
            s = st.items[i]
            if p + pending_n != 0:
                if p + pending_items + s > max_p and best_items == 0:
                    best_items, best_n = pending_items, pending_n
                    cur.saturated = True
                if p + pending_items + s > max_b:
                    send_now = True
                    break
            pending_items += s
            pending_n += 1
            i += 1
            if p + pending_items in pref:
                best_items, best_n = pending_items, pending_n
    delay = st.delay_s
    oldest = st.t[h]
    delay_exceeded = delay != 0.0 and now - oldest >= delay - EPS_S
    if best_items != 0 and not delay_exceeded:
        if delay == 0.0:
            cur.saturated = True
        return 0.0, best_n, best_items
    if pending_n == 0:
        return 0.0, 0, 0
    if send_now or p + pending_items >= max_p:
        cur.saturated = True
        return 0.0, pending_n, pending_items
    if delay_exceeded or delay == 0.0:
        return 0.0, pending_n, pending_items
    total = pending_items + p
    nxt = next_size(pref, total)
    if nxt == 0 and pref:
        nxt = pref[0]
    # size_t in Triton: a next preferred size below the payload underflows, and arrivals never wake the batcher
    st.next_pref = (nxt - p if nxt >= p else NEVER) if nxt else 0
    if not cur.saturated and p != 0 and p not in pref:
        return 0.0, pending_n, pending_items
    wait = delay - (now - oldest)
    if st.timeout_s > 0.0:
        closest = oldest + st.timeout_s
        wait = min(closest - now, wait) if now <= closest else TIMER_RESOLUTION_S
    if wait < TIMER_RESOLUTION_S:
        return 0.0, pending_n, pending_items
    return wait, 0, 0


def absorb(st: ModelState, now: float) -> None:
    """Replay, in bulk, the steps the arrivals since the last step (strictly before ``now``) would each have
    taken: exactly what the server's batcher loop does for one request of 1 item with delay 0 and no idle instance."""
    st.absorbing = False
    end = st.arrived_before(now)
    i = st.head
    pref = st.preferred
    while i < end:
        cur = st.cur
        if cur.saturated or cur.state == EXECUTING:
            st.cur = cur = Payload()
        if st.pqueue_len() >= st.slots:
            break
        p = cur.items
        if p == 0:
            n = 1
            cur.start = st.t[i]
            cur.saturated = 1 in pref
        else:
            x = next_size(pref, p)  # the payload is below the largest preferred size
            n = min(x - p, end - i)
            cur.saturated = p + n == x
        cur.take(i, n, n)
        i += n
        if cur.state == UNINIT:
            cur.state = SCHEDULED
            st.pqueue.append(cur)
    st.head = i


def next_size(sizes: tuple, n: int) -> int:
    """The first of ``sizes`` (ascending) above ``n``; 0 when none is."""
    for x in sizes:
        if x > n:
            return x
    return 0
