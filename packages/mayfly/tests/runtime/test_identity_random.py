"""Ids draw the system's randomness in blocks: never repeated across threads, and never shared with a fork."""

from __future__ import annotations

import os
import threading

from mayfly.identity import Uuid7IdSource


def test_ids_from_many_threads_are_distinct_and_carry_random_bits() -> None:
    source = Uuid7IdSource()
    found: list[list[str]] = [[] for _ in range(8)]

    def make(into: list[str]) -> None:
        into.extend(source.new_id() for _ in range(2_000))

    threads = [threading.Thread(target=make, args=(into,)) for into in found]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    ids = [i for part in found for i in part]
    assert len(set(ids)) == len(ids) == 16_000
    assert len({i[-12:] for i in ids}) == len(ids)  # the random tail differs too, not just the counter


def test_a_forked_child_never_hands_out_its_parents_random_bytes() -> None:
    """The block left in the parent at a fork is dropped in the child, so their next ids' random bits differ."""
    source = Uuid7IdSource()
    source.new_id()  # the pool holds unused bytes now
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: write its next ids' random tails and leave at once
        os.close(read)
        os.write(write, "".join(source.new_id()[-12:] for _ in range(20)).encode())
        os._exit(0)
    os.close(write)
    with os.fdopen(read) as pipe:
        child = pipe.read()
    os.waitpid(pid, 0)
    parent = "".join(source.new_id()[-12:] for _ in range(20))
    assert len(child) == len(parent) == 240
    assert child != parent
