"""run_encode: prompt encodings of concurrent sub-agents run one at a time on one worker thread, in
submission order, off the asyncio loop; a forked child (a DataLoader worker) gets its own worker."""

import asyncio
import multiprocessing as mp
import threading
import time

from paravt.models import tokenize as TK


def _work(tag, log):
    log.append(("start", tag, threading.current_thread().name))
    time.sleep(0.02)
    log.append(("end", tag, threading.current_thread().name))
    return tag


def test_encodings_run_one_at_a_time_in_submission_order_off_the_loop():
    log: list = []

    async def go():
        loop_thread = threading.current_thread().name
        out = await asyncio.gather(*[TK.run_encode(_work, i, log) for i in range(4)])
        return out, loop_thread

    out, loop_thread = asyncio.run(go())
    assert out == [0, 1, 2, 3]
    assert [(e[0], e[1]) for e in log] == [(w, i) for i in range(4) for w in ("start", "end")]  # never overlapping
    assert all(e[2].startswith("paravt-encode") and e[2] != loop_thread for e in log)


def _child():
    return asyncio.run(TK.run_encode(lambda: threading.current_thread().name))


def test_a_forked_child_gets_its_own_encode_worker():
    asyncio.run(TK.run_encode(lambda: None))  # the parent's worker thread exists before the fork
    with mp.get_context("fork").Pool(1) as pool:
        name = pool.apply_async(_child).get(timeout=60)  # without the at-fork reset: waits forever on the parent's thread
    assert name.startswith("paravt-encode")
